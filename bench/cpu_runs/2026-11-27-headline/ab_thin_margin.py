"""The two batch-2 training steps whose optimal bfloat16 plans are estimated 4-7% faster than
float32 but did not gain in the headline run (densenet121/training, inceptionv3/training):
float32, the optimal plan, TensorFlow's bfloat16 rewrite and float32 again, interleaved, with
the rounds spread over three fresh processes (``bench.ab_plans``).

Usage (from the repository root; nothing else running)::

    python bench/cpu_runs/2026-11-27-headline/ab_thin_margin.py ab_thin_margin.json

Writes each item's plan summary (converted nodes, Casts, estimated ratio) and its A/B.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
sys.path[:0] = [os.path.join(ROOT, "bench"), ROOT]

import bench  # noqa: E402
from models import corpus, register  # noqa: E402
from tf_oracle import tf_amp_rewrite  # noqa: E402

ITEMS = ("densenet121/training", "inceptionv3/training")


def main(out_path: str, rounds: int = 24) -> None:
    register()
    results = {}
    for name in ITEMS:
        item = corpus.build(name)
        optimal = bench.optimal_bf16_for_this_cpu(item, price_step=True)
        plans = {"optimal": optimal.graph_def,
                 "tensorflow": tf_amp_rewrite(item.graph_def, list(item.fetches), mode="bf16")}
        results[name] = {"optimal": bench.plan_summary(optimal), **bench.ab_plans(item, plans, repeats=rounds)}
        print(name, json.dumps(results[name]), flush=True)
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
