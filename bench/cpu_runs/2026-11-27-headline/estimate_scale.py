"""The CPU class's absolute scale: each corpus graph's float32 step as estimated and as
measured in a ``bench.py`` run, with the kernel counts, and a least-squares fit of
``measured = a + b * estimated + c * kernels``.

Usage (from the repository root, after ``python bench/bench.py --out RUN``)::

    python bench/cpu_runs/2026-11-27-headline/estimate_scale.py RUN/results.json scale.jsonl

For each graph of the run it prices the float32 graph and TensorFlow's bfloat16 rewrite
(``amp_rewrite.estimate_node_times`` for this CPU's class, the item's variable shapes), and
writes one JSON line: the measured ms, the estimated ms, the priced nodes (kernels), and for
the rewrite its low-precision dense ops and Casts.  Then it prints the fit.  Plans nothing,
times nothing; builds every item once (about 5 minutes for the corpus).
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
sys.path[:0] = [os.path.join(ROOT, "bench"), ROOT]

import numpy as np  # noqa: E402

import amp_rewrite  # noqa: E402
import bench  # noqa: E402
from models import corpus, register  # noqa: E402
from tf_oracle import tf_amp_rewrite  # noqa: E402


def priced(graph_def, item) -> dict[str, float]:
    """Estimated ms, priced nodes, low-precision dense ops and Casts of one graph."""
    per = amp_rewrite.estimate_node_times(graph_def, target=bench.this_cpu_target(), precision="bfloat16",
                                          variable_shapes=bench.variable_shapes(item))
    nodes = [t for graph in per.values() for t in graph.values()]
    return {"est_ms": sum(t.ns + t.fixed_ns for t in nodes) / 1e6, "kernels": len(nodes),
            "dense_low": sum(1 for t in nodes if t.kind == "dense" and t.precision == "low"),
            "casts": sum(1 for t in nodes if t.kind == "cast")}


def main(results_path: str, out_path: str) -> None:
    register()
    with open(results_path) as f:
        run = json.load(f)
    rows = []
    with open(out_path, "w") as out:
        for g in run["graphs"]:
            item = corpus.build(g["name"])
            row = {"name": g["name"], "f32_ms": g["step_s"]["float32"] * 1e3, "f32": priced(item.graph_def, item),
                   "tf": priced(tf_amp_rewrite(item.graph_def, list(item.fetches), mode="bf16"), item)}
            if g["step_s"].get("tf_bf16"):
                row["tf_ms"] = g["step_s"]["tf_bf16"] * 1e3
            rows.append(row)
            out.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    a = np.array([[1.0, r["f32"]["est_ms"], r["f32"]["kernels"] / 1000] for r in rows])
    y = np.array([r["f32_ms"] for r in rows])
    coef = np.linalg.lstsq(a, y, rcond=None)[0]
    print(f"measured ms = {coef[0]:.3f} + {coef[1]:.3f} * estimated ms + {coef[2]:.3f} ms per 1000 kernels")
    for r, p in zip(rows, a @ coef):
        print(f"{r['name']:26s} measured {r['f32_ms']:8.2f}  estimated {r['f32']['est_ms']:8.2f}  fit {p:8.2f}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
