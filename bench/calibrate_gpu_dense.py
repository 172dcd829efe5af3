"""Calibrate the GPU classes' dense rates: every distinct MatMul/convolution of real training
steps, timed alone on the GPU in float32 (TF32 on and off) and in float16.

Usage (on the lent GPU; see CONTRIBUTING.md)::

    python bench/calibrate_gpu_dense.py --workloads resnet50-train-b64,bert_base-train-b32 \\
        --out $OUT/dense.json
    python bench/calibrate_gpu_dense.py --reduced --out /tmp/dense.json     # CPU smoke run

Issue 22 asks for the GPU cost classes to be calibrated on the GPU at the sizes people train
at.  The step's element-wise work is priced from bandwidth (and fused under XLA); what the
model cannot know from a datasheet is how much of the GEMM/convolution rate a model's own
shapes reach, in TF32 and in float16.  This script traces each workload's Keras training step
here or there (no step runs), collects every dense op with its static input shapes and
attributes, groups identical ones, and times each distinct one inside a ``tf.function`` loop
(its result reduced to a scalar, so only the op's kernels are timed; ``--xla`` compiles the
loop, so XLA's own kernels and no per-iteration launch gaps are timed), ``--repeats`` times
round robin over the precisions, taking medians.  For each op it records the cost model's flop
count and the class's roofline estimate (:func:`amp_rewrite.plan.cost_model.node_cost`), and
per op type and size band it sums, weighted by how often the op occurs in the step:

* ``tf32_over_roofline``: measured TF32 time over the class's float32 estimate at full rate
  (what ``dense_efficiency`` or a :class:`~amp_rewrite.plan.cost_model.DenseBand` scale would be);
* ``f16_over_tf32`` and ``f16_over_fp32``: the low-precision ratio against TensorFlow's default
  float32 and against strict FP32 (the band ratio).

Numbers depend on the GPU, the libraries and their heuristics: the JSON records the device and
the date.  On a CPU (``--reduced``) the same code runs on tiny shapes, so CI keeps it working.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import json
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), HERE]

#: Size bands (multiply-add flops) for the per-op sums: the CPU table's, then larger ones.
BANDS = (5e6, 2e7, 2e8, 2e9, float("inf"))


def traced_step_graph(workload: str, capability: str) -> Any:
    """The traced (float32) Keras training step of a ``gpu_bench`` workload.  Runs no step."""
    import gpu_bench

    graph, _ = gpu_bench.trace_step(workload, lists="default", target=f"gpu:{capability}",
                                    precision="float16", jit_compile=False)
    return graph


def dense_ops(graph: Any) -> list[dict[str, Any]]:
    """Every dense op of ``graph`` (the cost model's ``DENSE_OPS``) with fully known input
    shapes: its type, input shapes and dtypes, the static values of its integer inputs (a
    convolution gradient's sizes) and its non-type attributes.  Pure."""
    import tensorflow as tf

    from amp_rewrite.plan.cost_model import DENSE_OPS

    found = []
    for op in graph.get_operations():
        if op.type not in DENSE_OPS or op.type.startswith("_"):
            continue
        inputs = []
        # An argument that is a list (Einsum's ``inputs``) takes its ``number_attr`` tensors.
        arg_of = [a for a in op.op_def.input_arg
                  for _ in range(op.get_attr(a.number_attr) if a.number_attr else 1)]
        for arg, t in zip(arg_of, op.inputs):
            value = tf.get_static_value(t) if t.dtype.is_integer else None
            if value is None and t.dtype.is_integer and arg.name.endswith("_sizes"):
                value = op.outputs[0].shape  # a convolution gradient's sizes: its output's shape
                if not value.is_fully_defined():
                    break
                value = value.as_list()
            elif t.dtype.is_integer and value is None:
                break
            if value is None and (t.shape.rank is None or not t.shape.is_fully_defined()):
                break
            inputs.append({"name": arg.name, "shape": t.shape.as_list(), "dtype": t.dtype.name,
                           "value": value.tolist() if hasattr(value, "tolist") else value,
                           "list": bool(arg.number_attr)})
        else:
            inferred = {a.number_attr for a in op.op_def.input_arg if a.number_attr}
            attrs = {a.name: op.get_attr(a.name) for a in op.op_def.attr
                     if a.type not in ("type", "list(type)") and a.name not in inferred}
            attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}
            found.append({"op": op.type, "inputs": inputs, "attrs": attrs,
                          "output": op.outputs[0].shape.as_list()})
    return found


def signature(d: dict[str, Any]) -> str:
    """A key for identical dense ops (same type, shapes, static inputs and attributes).  Pure."""
    return json.dumps({k: d[k] for k in ("op", "inputs", "attrs")}, sort_keys=True, default=str)


def op_costs(d: dict[str, Any], costs: Any) -> tuple[float, float]:
    """The op's multiply-add flops and the class's float32 estimate (ns).  Pure."""
    from amp_rewrite.plan.cost_model import node_cost

    floats = [tuple(i["shape"]) for i in d["inputs"] if i["value"] is None]
    nc = node_cost(d["op"], floats, [tuple(d["output"])], 2, costs)
    return nc.flops, nc.high


def make_loop(d: dict[str, Any], dtype: str, *, iters: int, device: str, xla: bool) -> Any:
    """A ``tf.function`` running one dense op ``iters`` times in ``dtype`` on ``device`` (inputs
    random and already there; each run's first element is summed, so only a scalar comes back
    and no run can be skipped)."""
    import numpy as np
    import tensorflow as tf

    fn = getattr(tf.raw_ops, d["op"])
    rng = np.random.default_rng(0)
    with tf.device(device):
        tensors: list[tuple[str, bool, Any]] = []
        for i in d["inputs"]:
            if i["value"] is not None:
                value = tf.constant(i["value"], dtype=i["dtype"])
            else:
                value = tf.Variable(tf.cast(rng.standard_normal(i["shape"]).astype(np.float32) * 0.1, dtype))
            tensors.append((i["name"], i.get("list", False), value))

    def arguments() -> dict[str, Any]:
        args: dict[str, Any] = {}
        for name, is_list, value in tensors:
            value = tf.convert_to_tensor(value)
            if is_list:
                args.setdefault(name, []).append(value)
            else:
                args[name] = value
        return args

    @tf.function(jit_compile=xla)
    def loop() -> Any:
        acc = tf.zeros([], tf.float32)
        for _ in tf.range(iters):
            acc += tf.cast(tf.reshape(fn(**arguments(), **d["attrs"]), [-1])[0], tf.float32)
        return acc

    return loop


def time_loop(loop: Any, *, tf32: bool, iters: int) -> float:
    """Milliseconds per run of the op in ``loop`` with TF32 on or off (a warm-up call first:
    tracing, the libraries' autotuning and JIT stay out of the time)."""
    import tensorflow as tf

    tf.config.experimental.enable_tensor_float_32_execution(tf32)
    try:
        loop().numpy()
        start = time.perf_counter()
        loop().numpy()
        return 1e3 * (time.perf_counter() - start) / iters
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(True)


def band_of(flops: float) -> float:
    return next(b for b in BANDS if flops < b)


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per op type and size band: the count-weighted sums of the measured times and of the
    class's estimate, and their ratios.  Pure."""
    groups: dict[tuple[str, float], dict[str, float]] = collections.defaultdict(collections.Counter)
    for r in rows:
        g = groups[(r["op"], band_of(r["flops"]))]
        for key in ("tf32_ms", "fp32_ms", "low_ms", "estimate_ms"):
            g[key] += r["count"] * r[key]
        g["ops"] += r["count"]
    out = []
    for (op, band), g in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        out.append({"op": op, "below_flops": band, "ops": int(g["ops"]),
                    "tf32_over_roofline": g["tf32_ms"] / g["estimate_ms"] if g["estimate_ms"] else None,
                    "f16_over_tf32": g["low_ms"] / g["tf32_ms"] if g["tf32_ms"] else None,
                    "f16_over_fp32": g["low_ms"] / g["fp32_ms"] if g["fp32_ms"] else None})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="resnet50-train-b64,bert_base-train-b32")
    p.add_argument("--capability", default="9.0", help="the GPU class whose roofline is compared")
    p.add_argument("--precision", default="float16", choices=("float16", "bfloat16"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iters", type=int, default=20, help="runs of the op per timing")
    p.add_argument("--time-budget", type=float, default=None, help="seconds: stop timing new ops after this")
    p.add_argument("--xla", action="store_true", help="compile each timing loop with XLA (its own kernels)")
    p.add_argument("--reduced", action="store_true", help="CPU smoke run: the tiny CNN, 1 repeat")
    p.add_argument("--out", required=True, help="JSON file")
    args = p.parse_args(argv)
    import tensorflow as tf

    from amp_rewrite.plan.cost_model import gpu_costs
    from amp_rewrite.plan.targets import Device

    started = time.monotonic()
    gpu = bool(tf.config.list_physical_devices("GPU"))
    device = "/GPU:0" if gpu else "/CPU:0"
    workloads = ["small_cnn-train-b8"] if args.reduced else args.workloads.split(",")
    repeats, iters = (1, 2) if args.reduced else (args.repeats, args.iters)
    major, minor = (int(v) for v in args.capability.split("."))
    costs = gpu_costs(Device("GPU", 0, (major, minor)))
    # The roofline at the class's full rates: what a measured time is compared with.
    full_rate = dataclasses.replace(costs, dense_efficiency=1.0)
    counted: dict[str, dict[str, Any]] = {}
    for wl in workloads:
        for d in dense_ops(traced_step_graph(wl, args.capability)):
            entry = counted.setdefault(signature(d), {**d, "count": 0, "workloads": []})
            entry["count"] += 1
            if wl not in entry["workloads"]:
                entry["workloads"].append(wl)
    rows, skipped = [], []
    for key, d in sorted(counted.items(), key=lambda kv: -op_costs(kv[1], full_rate)[0]):
        if args.time_budget and time.monotonic() - started > args.time_budget:
            skipped.append(d["op"])
            continue
        f32 = make_loop(d, "float32", iters=iters, device=device, xla=args.xla)
        low = make_loop(d, args.precision, iters=iters, device=device, xla=args.xla)
        times: dict[str, list[float]] = {"tf32": [], "fp32": [], "low": []}
        for _ in range(repeats):  # round robin over the three, so a slow spell hits all alike
            times["tf32"].append(time_loop(f32, tf32=True, iters=iters))
            times["fp32"].append(time_loop(f32, tf32=False, iters=iters))
            times["low"].append(time_loop(low, tf32=True, iters=iters))
        flops, estimate = op_costs(d, full_rate)
        rows.append({**d, "flops": flops, "estimate_ms": estimate / 1e6,
                     **{f"{k}_ms": statistics.median(v) for k, v in times.items()}})
        print(f"{d['op']:24s} x{d['count']:3d} {flops / 1e9:8.3f} Gflop  tf32 {rows[-1]['tf32_ms']:.3f} ms  "
              f"fp32 {rows[-1]['fp32_ms']:.3f}  {args.precision} {rows[-1]['low_ms']:.3f}", flush=True)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "tensorflow": tf.__version__, "device": device,
        "gpus": [tf.config.experimental.get_device_details(g) for g in tf.config.list_physical_devices("GPU")],
        "class": costs.name, "precision": args.precision, "workloads": workloads, "xla": args.xla,
        "repeats": repeats, "iters": iters, "ops": rows, "not_timed": skipped,
        "summary": summarize(rows),
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    for s in result["summary"]:
        print(f"{s['op']:28s} < {s['below_flops']:.0e}  n={s['ops']:4d}  tf32/roofline "
              f"{s['tf32_over_roofline'] or float('nan'):.2f}  f16/tf32 {s['f16_over_tf32'] or float('nan'):.2f}  "
              f"f16/fp32 {s['f16_over_fp32'] or float('nan'):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
