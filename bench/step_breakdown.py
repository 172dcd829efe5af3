"""Where a step's time goes, per op: measured (step stats) against the cost model, float32 and
a rewrite side by side.

Usage::

    python bench/step_breakdown.py --item mobilenetv2@128/training --batch 8
    python bench/step_breakdown.py --item efficientnetb0@224/inference --batch 8 --rewrite tensorflow

Runs the float32 graph and a rewrite (``optimal``: ``lists="optimal"`` planned for this CPU's
class; ``tensorflow``: TensorFlow's own oneDNN bfloat16 pass) with ``RunOptions.FULL_TRACE``,
sums every kernel's own time per op (oneDNN's kernel names mapped back to the op: a fused
convolution counts as its convolution), and sets the sums against
:func:`amp_rewrite.estimate_node_times` of the same graphs.  The rows are sorted by how much
the rewrite changed an op's time, measured or estimated, so the ops that decide the step come
first.  Kernel sums are not the step's wall time (the executor overlaps branches), and a fused
kernel's time goes to its head op; it is what shows which op's estimate is off.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), HERE]

import tensorflow as tf  # noqa: E402

import amp_rewrite  # noqa: E402
import bench  # noqa: E402
from models import add_model_options, apply_model_options, corpus, resolve_items  # noqa: E402

__all__ = ["kernel_op", "measured_by_op", "estimated_by_op", "main"]

#: oneDNN's kernels under the op they run (after the _Mkl/_MklNative prefix is dropped).  A
#: fused swish goes to its Sigmoid, the node the cost model prices it on.
_KERNEL_OPS = {"FusedConv2D": "Conv2D", "PadWithConv2D": "Conv2D", "PadWithFusedConv2D": "Conv2D",
               "FusedMatMul": "MatMul", "FusedDepthwiseConv2dNative": "DepthwiseConv2dNative", "Swish": "Sigmoid"}


def kernel_op(kernel: str) -> str:
    """The op a step-stats kernel name stands for: ``_MklNativeFusedConv2D`` -> ``Conv2D``."""
    name = kernel.replace("_MklNative", "").replace("_Mkl", "")
    return _KERNEL_OPS.get(name, name)


def measured_by_op(graph_def, item, rounds: int) -> dict[str, float]:
    """Median over ``rounds`` traced steps of each op's summed kernel time (ms)."""
    runner = bench.Runner(graph_def, item)
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    per: dict[str, list[float]] = collections.defaultdict(list)
    try:
        for _ in range(rounds):
            meta = tf.compat.v1.RunMetadata()
            runner.sess.run(runner.fetches, runner.feeds, options=options, run_metadata=meta)
            acc: dict[str, float] = collections.defaultdict(float)
            for dev in meta.step_stats.dev_stats:
                for ns in dev.node_stats:
                    acc[kernel_op(bench.kernel_name(ns) or ns.node_name)] += (ns.op_end_rel_micros
                                                                              - ns.op_start_rel_micros) / 1e3
            for op, ms in acc.items():
                per[op].append(ms)
    finally:
        runner.close()
    return {op: statistics.median(v) for op, v in per.items()}


def estimated_by_op(graph_def, shapes, fetches) -> dict[str, float]:
    """The cost model's time per op (ms) for this CPU's class, every graph of the step (what
    ``fetches`` need)."""
    nodes = amp_rewrite.estimate_node_times(graph_def, target=bench.this_cpu_target(), precision="bfloat16",
                                           variable_shapes=shapes, fetches=fetches)
    acc: dict[str, float] = collections.defaultdict(float)
    for graph in nodes.values():
        for node in graph.values():
            acc[node.op] += node.ns / 1e6
    return dict(acc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--item", required=True, help="a corpus item, or model@side/kind")
    add_model_options(ap, weights="trained")
    ap.add_argument("--rewrite", choices=("optimal", "tensorflow"), default="optimal")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", type=int, default=25)
    args = ap.parse_args(argv)
    apply_model_options(args)
    item = corpus.build(resolve_items([args.item])[0])
    gd, fetches = item.graph_def, list(item.fetches)
    shapes = bench.variable_shapes(item)
    if args.rewrite == "tensorflow":
        from tf_oracle import tf_amp_rewrite

        rewritten = tf_amp_rewrite(gd, fetches, mode="bf16")
    else:
        rewritten = bench.optimal_bf16_for_this_cpu(item).graph_def
    f, o = measured_by_op(gd, item, args.rounds), measured_by_op(rewritten, item, args.rounds)
    ef, eo = estimated_by_op(gd, shapes, fetches), estimated_by_op(rewritten, shapes, fetches)
    ops = sorted(set(f) | set(o) | set(ef) | set(eo),
                 key=lambda k: -(abs(o.get(k, 0) - f.get(k, 0)) + abs(eo.get(k, 0) - ef.get(k, 0))))
    print(f"{args.item} batch {args.batch}, float32 against {args.rewrite} (ms per step; kernel sums, medians of "
          f"{args.rounds} traced steps)")
    print(f"{'op':36s} {'float32':>8s} {'model':>8s} {args.rewrite:>9s} {'model':>8s} {'change':>8s} {'model':>8s}")
    for op in ops[:args.rows]:
        print(f"{op:36s} {f.get(op, 0):8.2f} {ef.get(op, 0):8.2f} {o.get(op, 0):9.2f} {eo.get(op, 0):8.2f}"
              f" {o.get(op, 0) - f.get(op, 0):+8.2f} {eo.get(op, 0) - ef.get(op, 0):+8.2f}")
    print(f"{'total':36s} {sum(f.values()):8.1f} {sum(ef.values()):8.1f} {sum(o.values()):9.1f}"
          f" {sum(eo.values()):8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
