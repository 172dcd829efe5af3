"""Loop-invariant Casts hoisted out of loop bodies, against left in them, side by side.

Usage::

    python bench/loop_hoist.py [--rounds 9] [--calls 5] [--out DIR] [--small]
                               [--target cpu --precision bfloat16] [--only decode-b1,...]

A Cast the rewrite puts in a loop body runs every iteration; ``amp_rewrite.loop_hoist`` moves
those whose input is the same every iteration (a weight read from a variable) before the
loop.  This times, in one process, round robin with the order rotated every round:

* ``float32``: the step as traced (``tf.function``);
* ``unhoisted``: ``amp_rewrite.function`` with the default lists but ``[loops]`` turned off,
  i.e. the Casts where TensorFlow's pass puts them;
* ``hoisted`` and ``hoisted_again``: ``amp_rewrite.function`` with the default lists, as
  shipped (the A/A pair);
* ``optimal``: ``amp_rewrite.function`` with the optimal profile (which hoists, and whose
  planner prices a hoisted Cast once per loop).

Workloads (by default bfloat16 on this CPU, ``target="cpu"``; on a GPU ``--target auto
--precision float16``, the ``loops`` stage of ``bench/gpu_session.sh``; ``lstm-train`` is a
loop only where Keras does not use cuDNN's LSTM, so on a GPU only the decoders mean anything):

* ``lstm-train``: a training step of two stacked Keras LSTMs (Keras builds a loop of its cell
  on a CPU, reading both weight matrices every time step);
* ``decode-b1`` / ``decode-b8``: greedy generation of ``--tokens`` tokens by a two-layer
  recurrent decoder in a ``tf.while_loop`` (an embedding, two dense layers, a vocabulary
  projection and an argmax per step), the weights read from variables inside the loop.

Per variant: the median over rounds of each round's median call time, the ratio to
``unhoisted``, the A/A gap, the Casts left per iteration, and whether ``hoisted`` and
``unhoisted`` computed bitwise the same outputs (they must: the same Casts, made once).
Writes ``results.json`` and ``results.md`` to ``--out``.  ``--small`` is the reduced form the
test suite runs (tiny sizes, two rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

NO_HOIST = """schema_version = 1
name = "no-hoist"
extends = "default"
[loops]
hoist_invariant_casts = false
reason = "bench/loop_hoist.py: the Casts where TensorFlow's pass puts them"
"""

VARIANTS = ("float32", "unhoisted", "hoisted", "hoisted_again", "optimal")


#: Where the rewritten variants plan for (``--target``, ``--precision``).
TARGET = {"target": "cpu", "precision": "bfloat16"}


def lstm_train(size: dict[str, int], variant: str, no_hoist: str) -> tuple[Callable[[], Any], Any]:
    """A Keras LSTM training step as ``variant`` (see module doc); returns (call, function)."""
    import keras
    import numpy as np
    import tensorflow as tf

    import amp_rewrite

    keras.utils.set_random_seed(0)
    inp = keras.Input((size["seq"],), dtype="int32")
    h = keras.layers.Embedding(1000, size["units"])(inp)
    h = keras.layers.LSTM(size["units"], return_sequences=True)(h)
    h = keras.layers.LSTM(size["units"])(h)
    model = keras.Model(inp, keras.layers.Dense(10)(h))
    opt = keras.optimizers.SGD(0.01)
    lossf = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = lossf(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    fn = _wrap(step, variant, no_hoist)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.integers(0, 1000, (size["batch"], size["seq"])).astype("int32"))
    y = tf.constant(rng.integers(0, 10, (size["batch"],)).astype("int32"))
    return (lambda: fn(x, y)), fn, (x, y)


def decode(size: dict[str, int], variant: str, no_hoist: str) -> tuple[Callable[[], Any], Any]:
    """Greedy decoding in a ``tf.while_loop`` as ``variant``; returns (call, function)."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(1)
    d, vocab = size["units"], size["vocab"]

    def var(*shape: int) -> Any:
        return tf.Variable(rng.normal(0, 1 / np.sqrt(shape[0]), shape).astype("float32"))

    emb, w1, w2, out = var(vocab, d), var(2 * d, d), var(2 * d, d), var(d, vocab)
    b1, b2 = tf.Variable(np.zeros(d, "float32")), tf.Variable(np.zeros(d, "float32"))

    def generate(first: Any) -> Any:
        batch = tf.shape(first)[0]
        h1 = tf.zeros([batch, d])
        h2 = tf.zeros([batch, d])
        tokens = tf.TensorArray(tf.int32, size=size["tokens"])

        def body(i: Any, tok: Any, h1: Any, h2: Any, tokens: Any) -> Any:
            x = tf.gather(emb, tok)
            h1 = tf.tanh(tf.matmul(tf.concat([x, h1], 1), w1) + b1)
            h2 = tf.tanh(tf.matmul(tf.concat([h1, h2], 1), w2) + b2)
            tok = tf.argmax(tf.matmul(h2, out), axis=1, output_type=tf.int32)
            return i + 1, tok, h1, h2, tokens.write(i, tok)

        _, _, _, h2, tokens = tf.while_loop(lambda i, *_: i < size["tokens"], body,
                                            (0, first, h1, h2, tokens))
        return tokens.stack(), h2

    fn = _wrap(generate, variant, no_hoist)
    first = tf.constant(rng.integers(0, vocab, (size["batch"],)).astype("int32"))
    return (lambda: fn(first)), fn, (first,)


def _wrap(step: Callable[..., Any], variant: str, no_hoist: str) -> Any:
    import tensorflow as tf

    import amp_rewrite

    if variant == "float32":
        return tf.function(step)
    extra = ({"lists_file": no_hoist} if variant == "unhoisted" else {"lists": "optimal"} if variant == "optimal"
             else {})
    return amp_rewrite.function(step, **TARGET, **extra)


def loop_casts(fn: Any, args: tuple[Any, ...], lists_file: str | None) -> tuple[int, int]:
    """(Casts left in the bodies of the main graph's loops, Casts hoisted) when the graph ``fn``
    (a ``tf.function``) traces for ``args`` is rewritten as the bench's variants are."""
    import amp_rewrite

    concrete = fn.get_concrete_function(*args)
    result = amp_rewrite.rewrite_graph_def(concrete.graph.as_graph_def(), **TARGET, lists_file=lists_file,
                                           fetches=[t.name for t in concrete.outputs])
    gd = result.graph_def
    bodies = {n.attr["body"].func.name for n in gd.node if n.op in ("While", "StatelessWhile")}
    in_bodies = sum(1 for f in gd.library.function if f.signature.name in bodies
                    for n in f.node_def if n.op == "Cast")
    return in_bodies, len(result.report.get("hoisted_casts", ()))


WORKLOADS: dict[str, tuple[Callable[..., Any], dict[str, int], dict[str, int]]] = {
    "lstm-train": (lstm_train, {"units": 512, "seq": 32, "batch": 32}, {"units": 16, "seq": 4, "batch": 2}),
    "decode-b1": (decode, {"units": 1024, "vocab": 8192, "tokens": 32, "batch": 1},
                  {"units": 16, "vocab": 32, "tokens": 3, "batch": 1}),
    "decode-b8": (decode, {"units": 1024, "vocab": 8192, "tokens": 32, "batch": 8},
                  {"units": 16, "vocab": 32, "tokens": 3, "batch": 2}),
}


def run(rounds: int, calls: int, small: bool, only: list[str] | None = None) -> dict[str, Any]:
    """Time every workload's variants round robin; returns the results (see module doc)."""
    import numpy as np

    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(NO_HOIST)
        no_hoist = f.name
    results: dict[str, Any] = {}
    try:
        for name, (build, full, reduced) in WORKLOADS.items():
            if only and name not in only:
                continue
            size = reduced if small else full
            calls_of = {v: build(size, v, no_hoist) for v in VARIANTS}
            outputs = {v: c() for v, (c, _, _) in calls_of.items()}  # trace, rewrite, warm up
            for c, _, _ in calls_of.values():
                c()
            times: dict[str, list[float]] = {v: [] for v in VARIANTS}
            for r in range(rounds):
                order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
                for v in order:
                    call = calls_of[v][0]
                    samples = []
                    for _ in range(calls):
                        t0 = time.perf_counter()
                        out = call()
                        np.asarray(out[0] if isinstance(out, tuple) else out)  # waits for it
                        samples.append(time.perf_counter() - t0)
                    times[v].append(statistics.median(samples))
            med = {v: statistics.median(ts) * 1e3 for v, ts in times.items()}
            _, f32_fn, f32_args = calls_of["float32"]
            unhoisted = loop_casts(f32_fn, f32_args, no_hoist)
            hoisted = loop_casts(f32_fn, f32_args, None)
            same = _same(outputs["hoisted"], outputs["unhoisted"]) if name.startswith("decode") else None
            results[name] = {
                "size": size,
                "ms": {v: round(m, 3) for v, m in med.items()},
                "hoisted_vs_unhoisted": round(med["hoisted"] / med["unhoisted"], 3),
                "unhoisted_vs_float32": round(med["unhoisted"] / med["float32"], 3),
                "hoisted_vs_float32": round(med["hoisted"] / med["float32"], 3),
                "optimal_vs_float32": round(med["optimal"] / med["float32"], 3),
                "aa_gap": round(abs(med["hoisted_again"] / med["hoisted"] - 1), 3),
                "casts_left_in_forward_bodies": {"unhoisted": unhoisted[0], "hoisted": hoisted[0]},
                "casts_hoisted": hoisted[1],
                "decoded_tokens_bitwise_equal": same,
            }
            print(name, json.dumps(results[name]), flush=True)
    finally:
        os.unlink(no_hoist)
    return results


def _same(a: Any, b: Any) -> bool:
    import numpy as np

    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b))


def write(results: dict[str, Any], out: str, args: argparse.Namespace) -> None:
    import tensorflow as tf

    os.makedirs(out, exist_ok=True)
    gpus = [d.name for d in tf.config.list_physical_devices("GPU")]
    meta = {"date": time.strftime("%Y-%m-%d"), "tensorflow": tf.__version__, "machine": platform.processor()
            or platform.machine(), "cpus": os.cpu_count(), "gpus": gpus, "rounds": args.rounds, "calls": args.calls,
            **TARGET, "cuda": tf.sysconfig.get_build_info().get("cuda_version"),
            "cudnn": tf.sysconfig.get_build_info().get("cudnn_version")}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1, sort_keys=True)
    where = ", ".join(meta["gpus"]) or f"{meta['cpus']} CPUs"
    lines = [f"# Loop-invariant Casts: hoisted against left in the loop ({meta['date']}, TF {meta['tensorflow']}, "
             f"{where}, target {meta['target']}, {meta['precision']})", "",
             f"{args.rounds} rounds of {args.calls} calls, variants round robin; ms per call, median of the rounds' "
             "medians.", "",
             "| workload | float32 | unhoisted | hoisted | hoisted/unhoisted | A/A gap | optimal | Casts in the loop "
             "bodies (unhoisted → hoisted) | same output |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        ms = r["ms"]
        left = r["casts_left_in_forward_bodies"]
        lines.append(f"| {name} {r['size']} | {ms['float32']:.2f} | {ms['unhoisted']:.2f} | {ms['hoisted']:.2f} | "
                     f"**{r['hoisted_vs_unhoisted']:.3f}** | {r['aa_gap']:.3f} | {ms['optimal']:.2f} | "
                     f"{left['unhoisted']} → "
                     f"{left['hoisted']} | {r['decoded_tokens_bitwise_equal']} |")
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--only", default="", help="comma-separated workloads")
    parser.add_argument("--target", default="cpu", help="what the rewritten variants plan for (auto: this machine)")
    parser.add_argument("--precision", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--out", default=os.path.join(HERE, "cpu_runs", time.strftime("%Y-%m-%d") + "-loop-hoist"))
    args = parser.parse_args(argv)
    TARGET.update(target=args.target, precision=args.precision)
    results = run(args.rounds, args.calls, args.small, [w for w in args.only.split(",") if w] or None)
    write(results, args.out, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
