"""Calibrate the cost model's price of a Cast: the step time one more Cast adds inside a model.

Usage::

    python bench/calibrate_casts.py                                   # efficientnetb0/inference
    python bench/calibrate_casts.py --graph resnet50/inference --count 24 --rounds 15
    python bench/calibrate_casts.py --graph efficientnetb0@224/inference --batch 8 --weights trained

A Cast the planner inserts sits on the data path of a real graph, between ops that the
executor may run in parallel with others.  Its cost there is not the cost of a Cast in a
chain of Casts (where every op waits for the previous one), so this script measures it in
situ.  It takes a corpus graph in float32 and makes two variants that each insert round
trips -- ``Cast(x, bfloat16)`` then ``Cast(.., float32)``, which Grappler cannot remove (the
round trip rounds) -- on ``--count`` tensors of the data path: the *small* variant on the
smallest float tensors of the graph (a squeeze-excite block's [batch, 1, 1, C]), which prices
the fixed cost per Cast, and the *large* variant on the largest, which adds the cost per
element.  The three graphs are timed round-robin (``--rounds`` rounds of ``--iters`` steps,
medians), and it prints

* ``overhead``: (small - float32) / Casts inserted, the cost model's ``op_overhead``;
* ``per element``: ((large - float32) / Casts - overhead) / mean elements per Cast, to compare
  with the cost model's ``(4 + 2) / bandwidth``.

Each variant is traced once to check that every inserted Cast ran.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import bench  # noqa: E402  (Runner: a session as users run one)
import corpus  # noqa: E402
import models  # noqa: E402  (bench/models.py: the benchmark's larger models)
from amp_rewrite.graph.shapes import check_variable_shapes, graph_shapes  # noqa: E402
from amp_rewrite.graph.tensor_names import node_name  # noqa: E402

FLOAT = tf.float32.as_datatype_enum
PREFIX = "calibrate_cast"


def _candidates(graph_def, fetches, variables=None) -> list[tuple[int, str]]:
    """(elements, tensor) for the float32 output 0 of every node on the data path (computed
    from a placeholder, so Grappler cannot fold it) with a static shape, read by at least one
    node and not fetched.  ``variables`` maps a training graph's resource placeholders to
    their values, whose shapes size what is computed from the weights."""
    known = check_variable_shapes(graph_def, {k: v.shape for k, v in (variables or {}).items()})
    shapes = graph_shapes(graph_def, known)
    scratch = tf.Graph()
    with scratch.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    # Output 0's dtype, not the op's T: ShapeN(T=float) returns int32.
    out_dtype = {op.name: op.outputs[0].dtype for op in scratch.get_operations() if op.outputs}
    consumers: dict[str, list[str]] = {}
    for nd in graph_def.node:
        for t in nd.input:
            if not t.startswith("^"):
                consumers.setdefault(node_name(t), []).append(nd.name)
    # Everything downstream of a placeholder, in one sweep.
    data_path = {nd.name for nd in graph_def.node if nd.op == "Placeholder"}
    todo = list(data_path)
    while todo:
        for c in consumers.get(todo.pop(), ()):
            if c not in data_path:
                data_path.add(c)
                todo.append(c)
    out = []
    for nd in graph_def.node:
        if (nd.op in ("Const", "Placeholder", "Identity") or nd.name in fetches or nd.name not in consumers
                or nd.name not in data_path):
            continue
        if out_dtype.get(nd.name) != tf.float32:
            continue
        shape = (shapes.get(nd.name) or (None,))[0]
        if shape is None or any(d is None for d in shape):
            continue
        out.append((int(np.prod(shape)) if shape else 1, nd.name))
    return sorted(out)


def with_round_trips(graph_def, names: list[str], dtype: tf.DType = tf.bfloat16):
    """A copy of ``graph_def`` with a round trip through ``dtype`` on output 0 of each of
    ``names``, read by every former consumer.  Pure."""
    out = type(graph_def)()
    out.CopyFrom(graph_def)
    wrapped = set(names)
    for nd in out.node:
        for i, text in enumerate(nd.input):
            if text.startswith("^"):
                continue
            name, _, port = text.partition(":")
            if name in wrapped and port in ("", "0"):
                nd.input[i] = f"{PREFIX}/{name}/high"
    for k, name in enumerate(names):
        low = dtype.as_datatype_enum
        for suffix, src, dst, inp in (("low", FLOAT, low, name), ("high", low, FLOAT, f"{PREFIX}/{name}/low")):
            cast = out.node.add(name=f"{PREFIX}/{name}/{suffix}", op="Cast", input=[inp])
            cast.attr["SrcT"].type = src
            cast.attr["DstT"].type = dst
            cast.attr["Truncate"].b = False
    return out


def _casts_run(runner) -> int:
    meta = tf.compat.v1.RunMetadata()
    runner.sess.run(runner.fetches, runner.feeds, options=tf.compat.v1.RunOptions(
        trace_level=tf.compat.v1.RunOptions.FULL_TRACE), run_metadata=meta)
    return sum(1 for dev in meta.step_stats.dev_stats for ns in dev.node_stats
               if ns.node_name.startswith(PREFIX + "/"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graph", default="efficientnetb0/inference", help="a corpus item")
    ap.add_argument("--count", type=int, default=16, help="round trips per variant (2 Casts each)")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--iters", type=int, default=10, help="steps per timing sample")
    models.add_model_options(ap)
    args = ap.parse_args(argv)
    models.apply_model_options(args)

    item = corpus.build(models.resolve_items([args.graph])[0])
    gd = item.graph_def
    cands = _candidates(gd, set(item.fetches), item.variables)
    if len(cands) < 2 * args.count:
        raise SystemExit(f"{args.graph} has only {len(cands)} candidate tensors")
    picks = {"small": cands[:args.count], "large": cands[-args.count:]}
    graphs = {"float32": gd, **{k: with_round_trips(gd, [n for _, n in v]) for k, v in picks.items()}}
    runners = {k: bench.Runner(g, item) for k, g in graphs.items()}
    # Grappler may fold or prune a few (a training step's shape-only branches): divide by the
    # Casts that ran, as the trace counts them.
    ran = {k: _casts_run(runners[k]) for k in picks}
    for k, n in ran.items():
        if n == 0:
            raise SystemExit(f"{k}: none of the inserted Casts ran")
        if n != 2 * args.count:
            print(f"{k}: {n} of {2 * args.count} inserted Casts ran; the prices are per Cast that ran")
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(args.rounds):
        for k, r in runners.items():
            times[k].append(min(r.step() for _ in range(args.iters)) * 1e9)
    med = {k: statistics.median(v) for k, v in times.items()}
    overhead = (med["small"] - med["float32"]) / ran["small"]
    large_elems = statistics.fmean(n for n, _ in picks["large"])
    per_cast_large = (med["large"] - med["float32"]) / ran["large"]
    print(f"{args.graph}: step float32 {med['float32'] / 1e6:.3f} ms; +{ran['small']} Casts on small tensors "
          f"(mean {statistics.fmean(n for n, _ in picks['small']):.0f} elements) "
          f"{med['small'] / 1e6:.3f} ms; +{ran['large']} on large ({large_elems:.0f} elements) {med['large'] / 1e6:.3f} ms")
    print(f"overhead per Cast: {overhead / 1e3:.2f} us")
    print(f"per Cast on large tensors: {per_cast_large / 1e3:.2f} us; "
          f"per element beyond the overhead: {(per_cast_large - overhead) / large_elems:.3f} ns")
    for r in runners.values():
        r.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
