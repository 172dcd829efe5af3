"""Which part of a thin optimal plan fails to pay: the optimal bfloat16 plan for this CPU's
class, and the same planner with one kind of convolution kept float32 (denied), timed against
float32 and float32 again (the A/A control), interleaved, the rounds spread over three fresh
processes (``bench.ab_plans``), with each plan's estimated ratio beside.

Variants: ``optimal``; ``no_backprop_input`` (``Conv2DBackpropInput`` denied);
``forward_only`` (both convolution gradients denied: only forward convolutions and what
the planner pairs with them convert).

Usage (from the repository root; nothing else running)::

    python bench/cpu_runs/2026-11-27-overlap/ab_ablation.py densenet121/training ab_ablation.json
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
sys.path[:0] = [os.path.join(ROOT, "bench"), ROOT]

import bench  # noqa: E402
from models import corpus, register, resolve_items  # noqa: E402

VARIANTS = {"optimal": (), "no_backprop_input": ("Conv2DBackpropInput",),
            "forward_only": ("Conv2DBackpropInput", "Conv2DBackpropFilter")}


def main(name: str, out_path: str, rounds: int = 24) -> None:
    register()
    item = corpus.build(resolve_items([name])[0])
    plans, summaries = {}, {}
    for label, denied in VARIANTS.items():
        result = bench.optimal_bf16_for_this_cpu(item, price_step=True, add={"deny": list(denied)} if denied else None)
        plans[label] = result.graph_def
        summaries[label] = bench.plan_summary(result)
    estimated = bench.estimated_ratios(item, plans)
    print(json.dumps({"summaries": summaries, "estimated": estimated}), flush=True)
    out = {"item": name, "summaries": summaries, "estimated": estimated, **bench.ab_plans(item, plans, repeats=rounds)}
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:4]))
