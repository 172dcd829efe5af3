"""Counts of a corpus plan for a GPU 8.0, with the default profile: nodes whose type
attribute (``T``, ``dtype`` or ``DstT``) is the low precision, Casts, fenced norms' nodes
(the report's ``normalized``) and reductions cleared as copies (``identity``).

The code that rewrites is the checkout's this script is run from (its root on ``sys.path``),
so the same file run from a worktree of another commit counts that commit's plans.

Usage (from a checkout's root)::

    python bench/cpu_runs/2026-11-27-bf16-gpu/plan_counts.py [--precision=float16] bert_like/training ...
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.getcwd()
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), os.path.join(ROOT, "bench")]

import amp_rewrite  # noqa: E402
from models import corpus, register  # noqa: E402

LOW_ENUM = {"float16": 19, "bfloat16": 14}  # DataType DT_HALF / DT_BFLOAT16


def counts(item_name: str, precision: str) -> dict[str, int]:
    item = corpus.build(item_name)
    result = amp_rewrite.rewrite_graph_def(item.graph_def, target="gpu:8.0", precision=precision,
                                           fetches=item.fetches, lists="default", use_env=False)
    low = LOW_ENUM[precision]
    return {
        "low_nodes": sum(1 for n in result.graph_def.node
                         if any(v.type == low for k, v in n.attr.items() if k in ("T", "dtype", "DstT"))),
        "casts": sum(1 for n in result.graph_def.node if n.op == "Cast"),
        "normalized": len(result.report.get("normalized", {})),
        "identity": len(result.report.get("identity", {})),
    }


if __name__ == "__main__":
    register()
    args = sys.argv[1:]
    precision = "bfloat16"
    if args and args[0].startswith("--precision="):
        precision = args.pop(0).split("=", 1)[1]
    for name in args:
        print(json.dumps({"item": name, "precision": precision, **counts(name, precision)}), flush=True)
