"""Every node's op, dtype and reason in our default-profile plan of a GPU benchmark workload's
training step, traced here as on a GPU (``gpu_bench.ours_step``'s path, no GPU needed), as
JSON: the record ``plan_diff.py`` compares between two checkouts.

Usage (from a checkout's root; run it in a worktree of another commit for that commit's plan)::

    python bench/cpu_runs/2026-11-27-identity/plan_dump.py bert_base-train-b32 OUT.json
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..", "..")
sys.path[:0] = [os.path.join(ROOT, "bench"), ROOT]

import gpu_bench  # noqa: E402


def main(workload: str, out: str) -> None:
    with gpu_bench.keras_as_on_a_gpu():
        function, args, _ = gpu_bench._our_step_function(  # noqa: SLF001
            workload, lists="default", target="gpu:9.0", precision="float16", jit_compile="auto", options_json="")
        runner = function._runner(function.get_concrete_function(*args))  # noqa: SLF001
    nodes = {f"{graph}/{name}" if graph else name: [d.op, d.dtype, d.reason]
             for graph, plan in sorted(runner.result.plans.items()) for name, d in plan.nodes.items()}
    with open(out, "w") as f:
        json.dump({"workload": workload, "casts_to_low": runner.result.report["casts_to_low"],
                   "casts_to_high": runner.result.report["casts_to_high"], "nodes": nodes}, f, sort_keys=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
