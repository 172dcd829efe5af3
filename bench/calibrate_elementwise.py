"""Calibrate the cost model's element-wise table: each op's time in float32 and in low precision.

Usage::

    python bench/calibrate_elementwise.py                      # every op, 16k and 262k elements
    python bench/calibrate_elementwise.py --ops Erfc,Sigmoid --sizes 65536 --precision float16

For each op it builds two graphs (TensorFlow 1 sessions with Grappler on and every
mixed-precision pass off, as the benchmark runs graphs) that apply the op to ``--copies``
independent variables of the given dtype, and reads the op's own time from TensorFlow's step
stats (``RunOptions.FULL_TRACE``), so that neither the session's overhead nor the fetch is
counted.  Float32 and low precision are sampled alternately, ``--rounds`` times; medians.

It prints, per op, the float32 time against the cost model's memory-bound estimate for this
device class (``elements read and written * 4 bytes / bandwidth``) and the low/float32 ratio:
the two numbers :data:`amp_rewrite.plan.cost_model.DEVICE_COSTS` keeps per op in its
``elementwise`` table (geometric mean over the sizes).  On this repository's benchmark CPU
(AMD EPYC, AVX512-BF16, no AMX) transcendental functions and most gradient kernels run 1.5-6x
slower in bfloat16 than in float32 (the ISA converts bf16 but has no bf16 arithmetic, and
Eigen's kernels are not vectorized for it), while plain arithmetic is within about 20%.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from amp_rewrite.autotune import session_config  # noqa: E402

#: Unary ops (argument name ``x`` or ``features``).
UNARY = ("Erfc", "Erf", "Tanh", "Sigmoid", "Exp", "Log", "Softplus", "Rsqrt", "Sqrt", "Relu", "Neg",
         "Square", "Abs", "Relu6", "Elu", "Selu", "LeakyRelu", "Reciprocal", "Sin")
FEATURES = ("Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "Softplus")
BINARY = ("AddV2", "Mul", "Sub", "SquaredDifference", "Maximum", "Minimum", "RealDiv", "Pow", "BiasAdd")
#: Gradient ops taking (gradients, <the named forward tensor>).
GRAD_FEATURES = {"ReluGrad": "features", "Relu6Grad": "features", "EluGrad": "outputs",
                 "SeluGrad": "outputs", "LeakyReluGrad": "features", "SoftplusGrad": "features"}
#: Gradient ops taking (y, dy).
GRAD_Y = ("SigmoidGrad", "TanhGrad", "RsqrtGrad", "SqrtGrad", "ReciprocalGrad")
ALL_OPS = UNARY + BINARY + tuple(GRAD_FEATURES) + GRAD_Y
COLS = 64


def _apply(op: str, x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    raw = getattr(tf.raw_ops, op)
    if op in UNARY:
        return raw(features=x) if op in FEATURES else raw(x=x)
    if op in GRAD_FEATURES:
        return raw(gradients=y, **{GRAD_FEATURES[op]: x})
    if op in GRAD_Y:
        return raw(y=x, dy=y)
    if op == "BiasAdd":
        return raw(value=x, bias=y[0])
    return raw(x=x, y=y)


def _tensors_touched(op: str) -> int:
    """Tensors of the full size an op reads and writes (BiasAdd's bias is negligible)."""
    return 2 if op in UNARY or op == "BiasAdd" else 3


class _Graph:
    """``copies`` independent applications of ``op`` to variables of ``dtype``."""

    def __init__(self, op: str, dtype: tf.DType, elements: int, copies: int) -> None:
        graph = tf.Graph()
        rng = np.random.RandomState(0)
        with graph.as_default():
            fetches = []
            for _ in range(copies):
                # Positive inputs, so that Log, Sqrt, Rsqrt and Pow stay finite.
                a = (np.abs(rng.standard_normal((elements // COLS, COLS))) + 0.1).astype(np.float32)
                b = rng.standard_normal((elements // COLS, COLS)).astype(np.float32)
                x = tf.Variable(tf.cast(a, dtype)).read_value()
                y = tf.Variable(tf.cast(b, dtype)).read_value()
                # A scalar of each result is fetched: the op must run, and the fetch is tiny.
                fetches.append(tf.reduce_max(_apply(op, x, y)[:1, :1]))
            init = tf.compat.v1.global_variables_initializer()
        self.sess = tf.compat.v1.Session(graph=graph, config=session_config())
        self.sess.run(init)
        self.sess.run(fetches)  # warm-up
        self.fetches = fetches
        self.op = op

    def op_micros(self) -> float:
        """Mean time of one application of the op in one traced step (microseconds)."""
        meta = tf.compat.v1.RunMetadata()
        self.sess.run(self.fetches, options=tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE), run_metadata=meta)
        total, count = 0, 0
        # oneDNN may run the op under its own name (_MklRelu, _MklNativeX).
        labels = tuple(f"= {prefix}{self.op}(" for prefix in ("", "_Mkl", "_MklNative"))
        for dev in meta.step_stats.dev_stats:
            for ns in dev.node_stats:
                if any(label in ns.timeline_label for label in labels):
                    total += ns.op_end_rel_micros - ns.op_start_rel_micros
                    count += 1
        if not count:
            raise RuntimeError(f"{self.op} did not run (pruned?)")
        return total / count


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", default=",".join(ALL_OPS))
    ap.add_argument("--sizes", default="16384,262144", help="elements per tensor, comma-separated")
    ap.add_argument("--precision", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--class", dest="cls", default="cpu-avx512-bf16",
                    help="cost-model device class whose bandwidth the memory-bound estimate uses")
    args = ap.parse_args(argv)

    from amp_rewrite.plan.cost_model import DEVICE_COSTS

    bandwidth = DEVICE_COSTS[args.cls].bandwidth
    low = tf.dtypes.as_dtype(args.precision)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"{'op':18s}" + "".join(f"  {'n=' + str(n):>10s} f32 us  low us  f32/est  low/f32" for n in sizes)
          + "   geo-mean f32/est  low/f32")
    for op in args.ops.split(","):
        cells, f32_est, ratios = [], [], []
        for n in sizes:
            graphs = {"float32": _Graph(op, tf.float32, n, args.copies), "low": _Graph(op, low, n, args.copies)}
            times: dict[str, list[float]] = {k: [] for k in graphs}
            for _ in range(args.rounds):
                for k, g in graphs.items():
                    times[k].append(g.op_micros())
            for g in graphs.values():
                g.sess.close()
            hi, lo = statistics.median(times["float32"]), statistics.median(times["low"])
            estimate = _tensors_touched(op) * n * 4 / bandwidth / 1e3
            f32_est.append(hi / estimate)
            ratios.append(lo / hi)
            cells.append(f"  {'':>10s} {hi:6.1f}  {lo:6.1f}  {hi / estimate:7.2f}  {lo / hi:7.2f}")
        geo = (math.exp(statistics.fmean(map(math.log, f32_est))), math.exp(statistics.fmean(map(math.log, ratios))))
        print(f"{op:18s}" + "".join(cells) + f"   {geo[0]:16.2f}  {geo[1]:7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
