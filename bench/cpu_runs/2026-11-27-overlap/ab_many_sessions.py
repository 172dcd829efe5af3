"""The optimal bfloat16 plan of a thin training step against float32 and float32 again, with the
rounds spread over many fresh processes (one set of sessions each), few rounds per process:
``ab_ablation.py`` found four byte-identical float32 graphs of DenseNet121's training step
1.00, 1.04, 1.06 and 1.10 apart in 24 rounds over three processes, so a session's own speed,
not the graph, set those ratios; more sessions average it out.

Usage (from the repository root; nothing else running)::

    python bench/cpu_runs/2026-11-27-overlap/ab_many_sessions.py densenet121/training OUT.json [PROCESSES] [ROUNDS] [BATCH] [--part all|backward|forward|input-gradients]
"""

from __future__ import annotations

import json
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
sys.path[:0] = [os.path.join(ROOT, "bench"), ROOT]

import bench  # noqa: E402
from models import corpus, register, resolve_items, set_batch  # noqa: E402


#: ``--part backward``: the forward pass (every node outside ``gradient_tape/``, the scope
#: TensorFlow names a GradientTape's gradients with) kept float32, so that only the gradients
#: may convert; ``forward`` the other way round; ``input-gradients``: as ``backward``, and the
#: filter gradients (``Conv2DBackpropFilter``) kept float32 too.
PARTS = ("all", "backward", "forward", "input-gradients")


def main(name: str, out_path: str, processes: int = 12, rounds: int = 24, batch: int = 0, part: str = "all") -> None:
    register()
    if batch:
        set_batch(batch)
    item = corpus.build(resolve_items([name])[0])
    is_grad = {n.name: n.name.startswith("gradient_tape/") for n in item.graph_def.node}
    keep = ({n for n, g in is_grad.items() if not g} if part in ("backward", "input-gradients") else
            {n for n, g in is_grad.items() if g} if part == "forward" else None)
    if part == "input-gradients":
        keep |= {n.name for n in item.graph_def.node if n.op == "Conv2DBackpropFilter"}
    result = bench.optimal_bf16_for_this_cpu(item, price_step=True, keep_float32=keep)
    out = {"item": name, "batch": corpus.BATCH, "part": part, "optimal": bench.plan_summary(result),
           **bench.ab_plans(item, {"optimal": result.graph_def}, repeats=rounds, processes=processes)}
    # Per process, the plan against the mean of the two float32 sessions of that process.
    out["optimal_vs_both_float32_by_process"] = [
        p["optimal"] / ((p["float32"] + p["float32_again"]) / 2) for p in out["measured_by_process"]]
    out["median_optimal_vs_both_float32"] = statistics.median(out["optimal_vs_both_float32_by_process"])
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    part = args.pop(args.index("--part") + 1) if "--part" in args else "all"
    if "--part" in args:
        args.remove("--part")
    if part not in PARTS:
        raise SystemExit(f"--part must be one of {', '.join(PARTS)}")
    main(args[0], args[1], *(int(a) for a in args[2:5]), part=part)
