"""Does a device class price what was measured?  Per model, the cost model's float32 and
low-precision sums against the measured ones, from ``calibrate_in_place.py --dump`` files.

Usage::

    python bench/calibrate_in_place.py --items resnet50@224/inference --batch 8 --dump big.json
    python bench/check_cost_model.py small.json big.json            # the class the planner uses here
    python bench/check_cost_model.py big.json --class cpu-avx512-bf16 --by-op

Every node of a dump ran in bfloat16 in TensorFlow's own rewrite (which converts every op it
can), so each dump item compares, node by node, what the planner weighs: the float32 time of
the nodes it may convert and their time converted.  Casts are not in it (the rewrite's own
Casts have no float32 counterpart); ``calibrate_casts.py`` measures those.  Per item it prints
the summed measured and modelled float32 ms, the same in bfloat16, and the low/float32 ratio
measured and modelled; ``--by-op`` breaks the sums down per op.  Nothing is run: this reads
the dumps and prices their shapes, so a change to a class can be checked against every
calibration run kept in ``bench/cpu_runs/`` in seconds.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import sys
from typing import Any, Iterable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..")]

from amp_rewrite.plan.cost_model import DEVICE_COSTS, DeviceCosts, node_cost  # noqa: E402

__all__ = ["priced_rows", "summarize", "main"]


def _shape(s: Any) -> tuple | None:
    return None if s is None else tuple(s)


def priced_rows(rows: Iterable[dict], costs: DeviceCosts) -> list[dict]:
    """Each dump row (needs ``in_shapes``/``out_shapes``) with the model's ``high_us`` and
    ``low_us`` for it on ``costs``.  Pure: the rows are copied."""
    out = []
    for row in rows:
        if "in_shapes" not in row:
            raise ValueError("this dump has no shapes: record it again with calibrate_in_place.py --dump")
        priced = node_cost(row["op"], [_shape(s) for s in row["in_shapes"]], [_shape(s) for s in row["out_shapes"]],
                           2, costs, constant_weights=bool(row.get("constant_weights")))
        out.append({**row, "high_us": priced.high / 1e3, "low_us": priced.low / 1e3})
    return out


def summarize(rows: Iterable[dict], key: str = "item") -> dict[str, dict[str, float]]:
    """Sums per ``key`` (``item`` or ``op``) of measured and modelled float32 and bfloat16 us."""
    acc: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    for row in rows:
        a = acc[f"{row['item']} b{row['batch']}" if key == "item" else row[key]]
        a["f32"] += row["f32_us"]
        a["bf16"] += row["bf16_us"]
        a["high"] += row["high_us"]
        a["low"] += row["low_us"]
        a["nodes"] += 1
    return {k: dict(v) for k, v in acc.items()}


def _print(title: str, sums: dict[str, dict[str, float]], min_us: float = 0.0) -> None:
    print(f"{title:42s} {'nodes':>5s} {'f32 ms':>8s} {'model':>8s} {'bf16 ms':>8s} {'model':>8s}"
          f" {'ratio':>6s} {'model':>6s} {'off':>5s}")
    for name, s in sorted(sums.items(), key=lambda kv: -kv[1]["f32"]):
        if s["f32"] < min_us:
            continue
        measured, modelled = s["bf16"] / max(s["f32"], 1e-9), s["low"] / max(s["high"], 1e-9)
        off = f"{modelled / measured - 1:+5.0%}" if measured > 0 and modelled > 0 else "    -"
        print(f"{name:42s} {int(s['nodes']):5d} {s['f32'] / 1e3:8.2f} {s['high'] / 1e3:8.2f} {s['bf16'] / 1e3:8.2f}"
              f" {s['low'] / 1e3:8.2f} {measured:6.2f} {modelled:6.2f} {off}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dumps", nargs="+", help="calibrate_in_place.py --dump files (.json, or .json.gz)")
    ap.add_argument("--class", dest="cls", default="cpu-avx512-bf16", choices=sorted(DEVICE_COSTS))
    ap.add_argument("--by-op", action="store_true", help="also per op, over all the dumps")
    ap.add_argument("--min-us", type=float, default=1000.0, help="per op: leave out ops with less float32 time")
    args = ap.parse_args(argv)
    costs = DEVICE_COSTS[args.cls]
    rows: list[dict] = []
    for path in args.dumps:
        with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
            rows.extend(priced_rows(json.load(f), costs))
    _print("item", summarize(rows))
    if args.by_op:
        print()
        _print("op", summarize(rows, "op"), args.min_us)
    return 0


if __name__ == "__main__":
    sys.exit(main())
