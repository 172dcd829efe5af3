"""The optimal planner at the sizes people run, on this CPU: measured against estimated.

Usage::

    python bench/sizes_check.py --items resnet50@224/inference,mobilenetv2@224/inference --batch 8
    python bench/sizes_check.py --items resnet50@128/training --batch 8 --rounds 7 --iters 2 --out DIR

The benchmark corpus (``bench.py``) runs batch 2 at 64x64 so that it fits in minutes on two
cores, and the CPU class was calibrated there.  This checks the class where it was not: per
item (``model@side/kind``, see ``models.resized``), the float32 graph, TensorFlow's own
oneDNN bfloat16 rewrite and ours (``lists="optimal"`` planned for this CPU's class,
``bench.optimal_bf16_for_this_cpu``) are timed side by side (round robin over three sets of
fresh sessions, float32 twice for the A/A gap, ``bench.interleaved_step_times``), and each
rewrite's ratio to float32 is set against the cost model's estimate of the same two graphs
(``estimate_step_time``; ours from the rewrite's own ``price_step``).  Writes ``sizes.json`` and ``sizes.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), HERE]

import bench  # noqa: E402
from models import add_model_options, apply_model_options, corpus, resolve_items  # noqa: E402

__all__ = ["check_item", "markdown", "main"]


def check_item(name: str, rounds: int, iters: int, sessions: int = 3) -> dict[str, Any]:
    """One item: its plans, estimates and interleaved step times (see the module docstring)."""
    from tf_oracle import tf_amp_rewrite

    item = corpus.build(name)
    gd, fetches = item.graph_def, list(item.fetches)
    t0 = time.perf_counter()
    ours = bench.optimal_bf16_for_this_cpu(item, price_step=True)
    rewrite_s = time.perf_counter() - t0
    tf_bf16 = tf_amp_rewrite(gd, fetches, mode="bf16")

    def estimate(graph_def) -> float:
        return bench.estimated_step_ns(item, graph_def)

    if ours.step_estimates is not None:
        f32_ns, ours_ns = ours.step_estimates.given.total_ns, ours.step_estimates.rewritten.total_ns
    else:  # its pricing failed (a WARNING said so): price both apart
        f32_ns, ours_ns = estimate(gd), estimate(ours.graph_def)
    graphs = {"float32": gd, "float32_again": gd, "tensorflow": tf_bf16, "optimal": ours.graph_def}
    times, done = bench.interleaved_step_times(graphs, item, repeats=rounds, iters=iters, sessions=sessions)
    summary = bench.plan_summary(ours)
    return {
        "item": name, "batch": corpus.BATCH, "weights": "init" if corpus.PREPARE_MODEL is None else "trained",
        "rounds": done, "rewrite_s": rewrite_s,
        "ms": {k: v * 1e3 for k, v in times.items()},
        "measured": {k: v / times["float32"] for k, v in times.items()},
        "estimated": {"tensorflow": estimate(tf_bf16) / f32_ns, "optimal": ours_ns / f32_ns},
        "estimated_float32_ms": f32_ns / 1e6,
        "optimal_low_nodes": summary["low_nodes"], "optimal_casts": summary["casts"],
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    """A table of :func:`check_item` results: step times, ratios measured and estimated."""
    lines = ["| item | batch | float32 ms (A/A gap) | TF bf16: measured / estimated | "
             "optimal: measured / estimated | optimal converted, Casts | rounds |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        m, e = r["measured"], r["estimated"]
        gap = abs(m["float32_again"] - 1)
        lines.append(f"| {r['item']} | {r['batch']} | {r['ms']['float32']:.1f} ({gap:.1%}) "
                     f"| {m['tensorflow']:.3f} / {e['tensorflow']:.3f} | {m['optimal']:.3f} / {e['optimal']:.3f} "
                     f"| {r['optimal_low_nodes']}, {r['optimal_casts']} | {r['rounds']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", required=True, help="model@side/kind items, comma-separated")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--iters", type=int, default=3, help="steps per timing sample")
    ap.add_argument("--sessions", type=int, default=3)
    ap.add_argument("--out", default=".")
    add_model_options(ap, batch=8, weights="trained")
    args = ap.parse_args(argv)
    apply_model_options(args)
    rows = []
    for name in resolve_items(args.items.split(",")):
        rows.append(check_item(name, args.rounds, args.iters, args.sessions))
        r = rows[-1]
        print(f"{name} b{args.batch}: measured {({k: round(v, 3) for k, v in r['measured'].items()})}, "
              f"estimated {({k: round(v, 3) for k, v in r['estimated'].items()})}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "sizes.json"), "w") as f:
        json.dump({"machine": bench.machine_info(), "rows": rows}, f, indent=1, default=str)
    with open(os.path.join(args.out, "sizes.md"), "w") as f:
        f.write(markdown(rows))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
