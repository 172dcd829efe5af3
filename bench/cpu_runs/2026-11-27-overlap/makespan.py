"""Does the executor's concurrency hide a plan's gains?  A whole step on this CPU is not the sum
of its nodes' in-place times: TensorFlow's executor runs ready nodes on two inter-op threads,
so a step of 2404 us of kernel time took 1430 (the transformer's training step,
``../2026-11-27-headline/cal_matmul.txt``).  A node off the critical path can get faster
without the step getting faster.

For each graph named, this prices every node of the float32 graph and of a rewrite (the
optimal plan for this CPU's class, and TensorFlow's oneDNN bfloat16 rewrite) with the CPU
class (``amp_rewrite.estimate_node_times``), then schedules the graph's nodes on ``W``
workers in the executor's way -- a node becomes ready when all its inputs (data and control)
are done, and a free worker takes the earliest ready node (ties by graph order) -- and prints
both ratios to float32: the sum (what the planner and ``estimate_step_time`` use) and the
makespan.  Nodes the model does not price take no time.  Main graph only.

Usage (from the repository root)::

    python bench/cpu_runs/2026-11-27-overlap/makespan.py densenet121/training inceptionv3/training
"""

from __future__ import annotations

import heapq
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..", "..")
sys.path[:0] = [os.path.join(ROOT, "bench"), ROOT]

import amp_rewrite  # noqa: E402
import bench  # noqa: E402
from models import corpus, resolve_items, register  # noqa: E402


def node_ns(item, graph_def) -> dict[str, float]:
    """Each main-graph node's estimated ns (fixed time included) for this CPU's class."""
    per = amp_rewrite.estimate_node_times(graph_def, target=bench.this_cpu_target(), precision="bfloat16",
                                          variable_shapes=bench.variable_shapes(item))
    return {name: t.ns + t.fixed_ns for name, t in per.get("", {}).items()}


def makespan(graph_def, times: dict[str, float], workers: int) -> float:
    """The finish time of the last node when ``workers`` run the graph's nodes as the executor
    does (see the module docstring).  Pure."""
    order = {n.name: i for i, n in enumerate(graph_def.node)}
    preds: dict[str, set[str]] = {n.name: set() for n in graph_def.node}
    succs: dict[str, list[str]] = {n.name: [] for n in graph_def.node}
    for n in graph_def.node:
        for inp in n.input:
            src = inp.lstrip("^").split(":")[0]
            if src in preds and src not in preds[n.name]:
                preds[n.name].add(src)
                succs[src].append(n.name)
    waiting = {name: len(p) for name, p in preds.items()}
    ready = [(order[name], name) for name, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    events: list[tuple[float, int, str]] = []  # (finish, order, node) of running nodes
    now, idle = 0.0, workers
    while ready or events:
        while ready and idle:
            _, name = heapq.heappop(ready)
            heapq.heappush(events, (now + times.get(name, 0.0), order[name], name))
            idle -= 1
        now, _, name = heapq.heappop(events)
        idle += 1
        for s in succs[name]:
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(ready, (order[s], s))
    return now


def main(names: list[str]) -> None:
    register()
    for name in resolve_items(names):
        item = corpus.build(name)
        plans = bench.bf16_rewrites(item)
        f32 = node_ns(item, item.graph_def)
        row = {"name": name, "f32_sum_ms": sum(f32.values()) / 1e6}
        spans = {w: makespan(item.graph_def, f32, w) for w in (1, 2)}
        row["f32_makespan2_ms"] = spans[2] / 1e6
        for label in ("ours_opt_bf16", "tf_bf16"):
            gd = plans[label]
            t = node_ns(item, gd)
            row[f"{label}_sum"] = round(sum(t.values()) / sum(f32.values()), 3)
            row[f"{label}_makespan2"] = round(makespan(gd, t, 2) / spans[2], 3)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
