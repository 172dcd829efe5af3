"""The optimal bfloat16 plan of a thin training step against float32 and float32 again, with the
rounds spread over many fresh processes (one set of sessions each), few rounds per process:
``ab_ablation.py`` found four byte-identical float32 graphs of DenseNet121's training step
1.00, 1.04, 1.06 and 1.10 apart in 24 rounds over three processes, so a session's own speed,
not the graph, set those ratios; more sessions average it out.

Usage (from the repository root; nothing else running)::

    python bench/cpu_runs/2026-11-27-overlap/ab_many_sessions.py densenet121/training OUT.json [PROCESSES] [ROUNDS] [BATCH]
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


def main(name: str, out_path: str, processes: int = 12, rounds: int = 24, batch: int = 0) -> None:
    register()
    if batch:
        set_batch(batch)
    item = corpus.build(resolve_items([name])[0])
    result = bench.optimal_bf16_for_this_cpu(item, price_step=True)
    out = {"item": name, "batch": corpus.BATCH, "optimal": bench.plan_summary(result),
           **bench.ab_plans(item, {"optimal": result.graph_def}, repeats=rounds, processes=processes)}
    # Per process, the plan against the mean of the two float32 sessions of that process.
    out["optimal_vs_both_float32_by_process"] = [
        p["optimal"] / ((p["float32"] + p["float32_again"]) / 2) for p in out["measured_by_process"]]
    out["median_optimal_vs_both_float32"] = statistics.median(out["optimal_vs_both_float32_by_process"])
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:6]))
