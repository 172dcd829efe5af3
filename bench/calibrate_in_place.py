"""Calibrate the cost model in place: every op's time inside real models, float32 against bfloat16.

Usage::

    python bench/calibrate_in_place.py                                  # the default models
    python bench/calibrate_in_place.py --items efficientnetb0/inference --rounds 15
    python bench/calibrate_in_place.py --items resnet50@224/inference --batch 8   # sizes people run

``calibrate_elementwise.py`` times one op at a time on fresh tensors; inside a model the same
kernels behave differently (other tensors compete for the caches, Grappler fuses Conv2D with
its bias and activation, the executor overlaps branches), and the planner ranks colourings of
whole models.  This script runs each corpus item twice, as the float32 graph and as
TensorFlow's own oneDNN bfloat16 rewrite (which converts every op it can), alternately for
``--rounds`` rounds with ``RunOptions.FULL_TRACE``, and reads every node's own time from the
step stats.  Nodes are matched by name; a node the remapper fused (Conv2D + BiasAdd + Relu is
named after its last op) is charged to the dense op at its head.  Only nodes that ran in
bfloat16 in the rewritten graph count.

Per op (and per size band, for dense ops: a small convolution gains far less than a large
one), it prints the summed float32 time over the cost model's float32 estimate for the same
nodes (:func:`amp_rewrite.plan.cost_model.node_cost`, with the device class given by ``--class``,
its per-op tables set aside) and the summed bfloat16 time over the summed float32 time, also
net of the class's weight re-layout (``low_dense_overhead``, which the model adds apart, to
dense ops whose weights are not constant).  Sums, not medians of per-node ratios, because the
planner adds node times: the large nodes are the ones that matter.  These are the numbers
:data:`amp_rewrite.plan.cost_model.DEVICE_COSTS` keeps per op (``dense``, whose bands and ratio
are the "net" column, and ``elementwise``).  ``--dump`` writes every node's times, to
check a table against single models.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import statistics
import sys
from dataclasses import replace
from types import MappingProxyType

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), HERE]

import tensorflow as tf  # noqa: E402

import bench  # noqa: E402  (Runner: a session as users run one)
from amp_rewrite.plan.cost_model import DENSE_OPS, DEVICE_COSTS, X86_BF16_DENSE, elements, node_cost  # noqa: E402
from amp_rewrite.graph.shapes import check_variable_shapes, graph_shapes  # noqa: E402
from amp_rewrite.graph.tensor_names import parse_graph_input  # noqa: E402
from models import add_model_options, apply_model_options, corpus, resolve_items  # noqa: E402

DEFAULT_ITEMS = tuple(f"{model}/{kind}" for model in ("efficientnetb0", "mobilenetv2", "resnet50",
                                                        "densenet121", "inceptionv3", "vgg16", "bert_like")
                      for kind in ("inference", "training"))
#: Upper ends of the dense ops' size bands (multiply-add flops): the cost model's own.
#: (The skinny convolutions' bands share their size ranges' edges: each edge once.)
BAND_EDGES = tuple(sorted({band.below_flops for band in X86_BF16_DENSE["Conv2D"][:-1]}))
_FUSED_DENSE = re.compile(r"Conv|MatMul|Depthwise")


def _dense_head(name: str, ops: dict[str, str], first_input: dict[str, str]) -> str | None:
    """The dense op a fused node named ``name`` starts from (``name`` itself if dense)."""
    for _ in range(4):
        if ops.get(name) in DENSE_OPS:
            return name
        name = first_input.get(name, "")
    return None


def _band(flops: float) -> str:
    """The size band of a dense op, by the bounds of the cost model's ``DenseBand`` entries."""
    for edge in BAND_EDGES:
        if flops < edge:
            return f"<{edge / 1e6:g}M"
    return f">={BAND_EDGES[-1] / 1e6:g}M"


def _constant_weights(name: str, op: str, ops: dict[str, str], inputs: dict[str, list]) -> bool:
    """Whether dense node ``name``'s weights are a constant (a frozen graph's), laid out once.

    A filter gradient computes changing weights; otherwise the filter (input 1) is followed
    through identities to a ``Const``.
    """
    if "BackpropFilter" in op or len(inputs.get(name, ())) < 2:
        return False
    src = inputs[name][1].node
    for _ in range(4):
        if ops.get(src) == "Const":
            return True
        if ops.get(src) not in ("Identity", "Snapshot") or not inputs.get(src):
            return False
        src = inputs[src][0].node
    return False


def node_times(graph_def, item, rounds: int,
               sessions: int = 3) -> dict[str, tuple[list[float], list[float], int, str]]:
    """Per node of ``graph_def``: float32 times, bfloat16 times (us, one per round), the
    dtype enum the node produced in the bfloat16 run and the kernel that ran it there.

    The rounds are spread over ``sessions`` pairs of fresh sessions: a session's speed stays
    with it for its whole life (see ``bench.interleaved_step_times``), so one pair would put
    that pair's luck into every node's ratio."""
    from tf_oracle import tf_amp_rewrite

    variants = {"f32": graph_def, "bf16": tf_amp_rewrite(graph_def, list(item.fetches), mode="bf16")}
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    times: dict[str, dict[str, list[float]]] = {k: collections.defaultdict(list) for k in variants}
    dtypes: dict[str, int] = {}
    kernels: dict[str, str] = {}
    per_session = math.ceil(rounds / max(sessions, 1))
    done = 0
    while done < rounds:
        runners = {k: bench.Runner(v, item) for k, v in variants.items()}
        try:
            for _ in range(min(per_session, rounds - done)):
                for k, r in runners.items():
                    meta = tf.compat.v1.RunMetadata()
                    r.sess.run(r.fetches, r.feeds, options=options, run_metadata=meta)
                    for dev in meta.step_stats.dev_stats:
                        for ns in dev.node_stats:
                            times[k][ns.node_name].append(ns.op_end_rel_micros - ns.op_start_rel_micros)
                            if k == "bf16" and ns.output:
                                dtypes[ns.node_name] = ns.output[0].tensor_description.dtype
                                kernels[ns.node_name] = bench.kernel_name(ns)
                done += 1
        finally:
            for r in runners.values():
                r.close()
    return {n: (times["f32"][n], times["bf16"][n], dtypes.get(n, 0), kernels.get(n, ""))
            for n in times["f32"] if n in times["bf16"]}


def calibrate(items: list[str], cls: str, rounds: int,
              rows: list[dict] | None = None, sessions: int = 3) -> dict[tuple[str, str], list[float]]:
    """Per (op, band): [measured float32 us, modelled float32 us, measured bfloat16 us, nodes,
    measured bfloat16 us net of the class's ``low_dense_overhead``].

    With ``rows``, also appends one dict per node that ran in bfloat16 (item, batch, node, op, flops,
    modelled float32 us, measured float32 and bfloat16 us, the elements it reads and writes, the
    shapes of its inputs and outputs,
    and for dense ops whether its weights are constant).
    """
    # The class's roofline alone: its measured tables (the large tensors' too) set aside.
    bare = replace(DEVICE_COSTS[cls], elementwise=MappingProxyType({}), dense=MappingProxyType({}),
                   large_elementwise=MappingProxyType({}))
    overhead_us = bare.low_dense_overhead / 1e3
    acc: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0, 0.0])
    for name in items:
        item = corpus.build(name)
        gd = item.graph_def
        known = check_variable_shapes(gd, {k: v.shape for k, v in item.variables.items()})
        shapes = graph_shapes(gd, known)
        ops = {n.name: n.op for n in gd.node}
        inputs = {n.name: [parse_graph_input(i) for i in n.input if not i.startswith("^")] for n in gd.node}
        first = {n: ins[0].node for n, ins in inputs.items() if ins}
        print(f"== {name}", flush=True)
        for node, (t32, t16, dtype, kernel) in node_times(gd, item, rounds, sessions).items():
            if dtype != tf.bfloat16.as_datatype_enum or node not in ops:
                continue
            head, op = node, ops[node]
            if op not in DENSE_OPS and _FUSED_DENSE.search(kernel):
                # The remapper's fusion, named after its last op: charge the dense op.
                head = _dense_head(node, ops, first) or node
                op = ops[head]
            elif kernel == "_MklSwish":
                op = "_Swish"  # x * sigmoid(x), fused: priced apart from a lone Sigmoid
            ins = [shapes.get(r.node, ())[r.port] if r.port < len(shapes.get(r.node, ())) else None
                   for r in inputs[head]]
            outs = list(shapes.get(head, ()))
            priced = node_cost(op, ins, outs, 2, bare)
            model = priced.high / 1e3
            band, fixed = "", 0.0
            if op in DENSE_OPS:
                band = _band(priced.flops) + (" mis" if priced.misaligned else "")
                constant = _constant_weights(head, op, ops, inputs)
                # The model adds the re-layout of changing weights apart from the ratio.
                fixed = 0.0 if constant else overhead_us
            a = acc[(op, band)]
            a[0] += statistics.median(t32)
            a[1] += model
            a[2] += statistics.median(t16)
            a[3] += 1
            a[4] += statistics.median(t16) - fixed
            if rows is not None:
                rows.append({"item": name, "batch": corpus.BATCH, "node": head, "op": op, "flops": priced.flops,
                             "model_us": model,
                             "f32_us": statistics.median(t32), "bf16_us": statistics.median(t16),
                             "elements": sum(elements(s) for s in (*ins, *outs)),
                             "in_shapes": ins, "out_shapes": outs,
                             "constant_weights": constant if op in DENSE_OPS else None})
    return acc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", default=",".join(DEFAULT_ITEMS), help="corpus items, comma-separated")
    ap.add_argument("--class", dest="cls", default="cpu-avx512-bf16", choices=sorted(DEVICE_COSTS))
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--sessions", type=int, default=3, help="pairs of fresh sessions the rounds are spread over")
    ap.add_argument("--min-us", type=float, default=300.0, help="leave out ops with less float32 time")
    ap.add_argument("--dump", metavar="JSON", help="also write every node's times here")
    # The class's batch-2 tables were measured with Keras's initial weights.
    add_model_options(ap, weights="init")
    args = ap.parse_args(argv)
    apply_model_options(args)
    rows: list[dict] = []
    acc = calibrate(resolve_items(args.items.split(",")), args.cls, args.rounds, rows, args.sessions)
    if args.dump:
        with open(args.dump, "w") as f:
            json.dump(rows, f, indent=0, sort_keys=True)
    print(f"{'op':40s} {'flops':11s} {'nodes':>5s} {'f32 us':>8s} {'f32/model':>9s} {'bf16/f32':>8s}"
          f" {'net':>5s}")
    for (op, band), (t32, model, t16, count, net) in sorted(acc.items(), key=lambda kv: -kv[1][0]):
        if t32 < args.min_us:
            continue
        print(f"{op:40s} {band:11s} {count:5d} {t32:8.0f} {t32 / max(model, 1e-9):9.2f} {t16 / t32:8.2f}"
              f" {net / t32:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
