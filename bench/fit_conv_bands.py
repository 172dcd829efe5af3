"""Fit a CPU class's convolution bands to in-place calibration dumps, and check the fit on
dumps it did not see.

A band (:class:`amp_rewrite.plan.cost_model.DenseBand`) prices the convolutions of one op in
one range of flops -- and, for the skinny tiers, under a number of output positions times
batch (:func:`~amp_rewrite.plan.cost_model.conv_positions`), with variable or constant
weights -- as float32 time over the roofline (``scale``) and bfloat16 time over float32 time
net of the class's fixed re-layout (``ratio``).  Both are fitted as ratios of sums over a
group's nodes, so that a group's modelled total equals its measured total: the planner weighs
totals (what converting saves against what the Casts cost), and a per-node mean would let a
hundred 20-us convolutions outvote one of 10 ms.

Groups: each op of :data:`OPS`, each flops range of :data:`FLOPS_EDGES`, each tier of
:data:`POSITION_TIERS`, and variable or constant weights (only the forward convolution has
constant ones: frozen inference graphs).  A group of fewer than ``--min-nodes`` nodes is not
given a band of its own: a skinny tier falls back to its range's wide band, and a wide band
of one kind of weights to the band pooled over both.  A range with no data keeps the class's
bands, as do the ranges not asked for (``--ranges``), every other op, and every other field.

Usage::

    python bench/fit_conv_bands.py DUMP [DUMP ...]              # the fitted bands, as Python
    python bench/fit_conv_bands.py DUMP [DUMP ...] --holdout model   # each model's items priced
                                                                     # by bands fitted on the others

``--holdout`` (``dump`` or ``model``) prints, per held-out dump or model and per item, the
measured float32 and bfloat16 sums of the convolutions and what the class as it is and the
refitted bands model for them, so a refit is judged on data it was not fitted to (by model:
on models it has never seen).  Nothing is run; the dumps are read.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gzip
import json
import math
import os
import statistics
import sys
from types import MappingProxyType
from typing import Iterable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..")]

from amp_rewrite.plan.cost_model import (DEVICE_COSTS, DenseBand, DeviceCosts,  # noqa: E402
                                         conv_positions, node_cost)

__all__ = ["OPS", "FLOPS_EDGES", "POSITION_TIERS", "CLASS_DUMPS", "group_sums", "fit_bands", "refitted", "load"]

OPS = ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter")
#: Upper ends of the flops ranges, as the class's bands have them.
FLOPS_EDGES = (5e6, 2e7, 2e8, math.inf)
#: Upper ends of the output-positions tiers; ``math.inf`` is the wide tier.
POSITION_TIERS = (16, 64, math.inf)
#: Ops whose forward dense kernel may see constant weights (the others are gradients).
FORWARD = ("Conv2D",)
#: The dumps the cpu-avx512-bf16 class's 5-200 Mflop convolution bands were fitted on
#: (``--ranges 2e7,2e8``), in ``bench/cpu_runs/``: a refit with a new dump adds it here.
CLASS_DUMPS = tuple(os.path.join(HERE, "cpu_runs", d) for d in (
    "2026-11-27-sizes/cal_b2.json.gz", "2026-11-27-sizes/cal_inf224.json.gz", "2026-11-27-sizes/cal_tr128.json.gz",
    "2026-11-27-skinny/cal_inf224_b1.json.gz", "2026-11-27-wide/cal_b2_more.json.gz",
    "2026-11-27-wide/cal_b8_more.json.gz"))


def load(paths: Iterable[str]) -> list[dict]:
    """The rows of ``calibrate_in_place.py --dump`` files, each tagged with its file's name."""
    rows = []
    for path in paths:
        with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
            rows.extend({**r, "dump": os.path.basename(path)} for r in json.load(f))
    return rows


def group_sums(rows: Iterable[dict], costs: DeviceCosts) -> dict[tuple, list[float]]:
    """Per (op, constant weights, flops edge, positions tier): [nodes, measured float32 us,
    measured bfloat16 us net of the fixed re-layout, roofline us]."""
    roofline = dataclasses.replace(costs, dense=MappingProxyType({}))
    acc: dict[tuple, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for r in rows:
        if r["op"] not in OPS or r["f32_us"] <= 0:
            continue
        ins = [tuple(s) if s else None for s in r["in_shapes"]]
        outs = [tuple(s) if s else None for s in r["out_shapes"]]
        constant = bool(r.get("constant_weights")) and r["op"] in FORWARD
        roof = node_cost(r["op"], ins, outs, 2, roofline, constant_weights=constant)
        pos = conv_positions(r["op"], ins, outs)
        tier = math.inf if pos is None else next(t for t in POSITION_TIERS if pos < t)
        edge = next(e for e in FLOPS_EDGES if roof.flops < e)
        fixed = 0.0 if constant else costs.low_dense_overhead / 1e3
        a = acc[(r["op"], constant, edge, tier)]
        a[0] += 1
        a[1] += r["f32_us"]
        a[2] += r["bf16_us"] - fixed
        a[3] += roof.high / 1e3
    return acc


def _band(sums: list[float], edge: float, tier: float = math.inf, constant: bool | None = None) -> DenseBand:
    n, f32, low, roof = sums
    return DenseBand(edge, round(f32 / roof, 2), round(low / f32, 2), below_positions=tier,
                     constant_weights=constant)


def _pooled(*groups: list[float] | None) -> list[float]:
    out = [0, 0.0, 0.0, 0.0]
    for g in groups:
        if g:
            out = [a + b for a, b in zip(out, g)]
    return out


def fit_bands(rows: Iterable[dict], costs: DeviceCosts, min_nodes: int = 6,
              ranges: Iterable[float] = FLOPS_EDGES, skinny: bool = True) -> dict[str, tuple[DenseBand, ...]]:
    """Per op of :data:`OPS`, the bands fitted to ``rows`` (module docstring), in the order
    :func:`~amp_rewrite.plan.cost_model.dense_band` reads them.  Only the flops ranges whose
    upper ends are in ``ranges`` are refitted; the others keep ``costs``' bands.  ``skinny``:
    fit positions tiers too (else one band per range and kind of weights).  Pure."""
    acc = group_sums(rows, costs)
    ranges = set(ranges)
    tiers = POSITION_TIERS[:-1] if skinny else ()
    fitted: dict[str, tuple[DenseBand, ...]] = {}
    for op in OPS:
        bands: list[DenseBand] = []
        kinds = (False, True) if op in FORWARD else (False,)
        for edge in FLOPS_EDGES:
            if edge not in ranges or not any(acc.get((op, k, edge, t)) for k in kinds for t in POSITION_TIERS):
                # Not asked for, or no data in it: the class's own bands for this range.
                bands.extend(b for b in costs.dense.get(op, ()) if b.below_flops == edge)
                continue
            own = {(k, t): acc[(op, k, edge, t)] for k in kinds for t in tiers
                   if (op, k, edge, t) in acc and acc[(op, k, edge, t)][0] >= min_nodes}
            # The wide band of a kind of weights: the nodes no skinny tier took.
            rest = {k: _pooled(*(acc.get((op, k, edge, t)) for t in POSITION_TIERS if (k, t) not in own))
                    for k in kinds}
            split = len(kinds) > 1 and all(rest[k][0] >= min_nodes for k in kinds)
            for k in kinds:
                for t in tiers:
                    if (k, t) in own:
                        bands.append(_band(own[(k, t)], edge, t, k if len(kinds) > 1 else None))
                if split:
                    bands.append(_band(rest[k], edge, math.inf, k))
            if not split:
                both = _pooled(*rest.values())
                if both[0]:
                    bands.append(_band(both, edge))
        if bands and bands[-1].below_flops != math.inf:
            bands[-1] = bands[-1]._replace(below_flops=math.inf)
        fitted[op] = tuple(bands)
    return fitted


def refitted(costs: DeviceCosts, bands: dict[str, tuple[DenseBand, ...]]) -> DeviceCosts:
    """``costs`` with the convolution bands replaced by ``bands`` (``_FusedConv2D`` shares
    Conv2D's).  Pure."""
    dense = dict(costs.dense)
    dense.update(bands)
    if "Conv2D" in bands:
        dense["_FusedConv2D"] = bands["Conv2D"]
    return dataclasses.replace(costs, dense=MappingProxyType(dense))


def _conv_sums(rows: Iterable[dict], costs: DeviceCosts) -> dict[str, list[float]]:
    """Per item: measured float32 and bfloat16 us of the convolutions, and ``costs``' model."""
    acc: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for r in rows:
        if r["op"] not in OPS or r["f32_us"] <= 0:  # as the fit: a node with no measured time
            continue
        c = node_cost(r["op"], [tuple(s) if s else None for s in r["in_shapes"]],
                      [tuple(s) if s else None for s in r["out_shapes"]], 2, costs,
                      constant_weights=bool(r.get("constant_weights")))
        a = acc[f"{r['item']} b{r['batch']}"]
        a[0] += r["f32_us"]
        a[1] += r["bf16_us"]
        a[2] += c.high / 1e3
        a[3] += c.low / 1e3
    return acc


def _print_bands(bands: dict[str, tuple[DenseBand, ...]]) -> None:
    for op, bs in bands.items():
        print(f"{op}:")
        for b in bs:
            extra = "" if b.below_positions == math.inf else f", below_positions={b.below_positions:g}"
            extra += "" if b.constant_weights is None else f", constant_weights={b.constant_weights}"
            print(f"    DenseBand({b.below_flops:g}, {b.scale}, {b.ratio}{extra}),")


def _model(row: dict) -> str:
    """The model of a dump row's item (``resnet50@224/inference`` -> ``resnet50``)."""
    return row["item"].split("/", 1)[0].split("@", 1)[0]


def holdout(rows: list[dict], costs: DeviceCosts, by: str = "dump", **fit: object) -> None:
    """Print, per dump (``by="dump"``) or model (``"model"``), each item's convolution sums
    against the class as it is and against bands fitted on the other dumps or models; and the
    errors of the modelled saving (float32 - bfloat16): summed over the items, and per item
    over its float32 time (the median and the largest), which the large items do not
    dominate."""
    key = _model if by == "model" else (lambda r: r["dump"])
    groups = sorted({key(r) for r in rows})
    print(f"{'item':38s} {'f32 ms':>7s} {'now':>7s} {'refit':>7s} {'saved':>7s} {'now':>7s} {'refit':>7s}")
    err = {"now": 0.0, "refit": 0.0}
    rel = {"now": [], "refit": []}
    for d in groups:
        held = [r for r in rows if key(r) == d]
        cls = refitted(costs, fit_bands([r for r in rows if key(r) != d], costs, **fit))
        print(f"-- {d} (bands fitted on the other {len(groups) - 1} {by}s)")
        now, new = _conv_sums(held, costs), _conv_sums(held, cls)
        for item in sorted(now, key=lambda k: -now[k][0]):
            f32, bf16, nh, nl = now[item]
            _, _, rh, rl = new[item]
            saved = f32 - bf16
            err["now"] += abs(nh - nl - saved)
            err["refit"] += abs(rh - rl - saved)
            rel["now"].append(abs(nh - nl - saved) / f32)
            rel["refit"].append(abs(rh - rl - saved) / f32)
            print(f"{item:38s} {f32 / 1e3:7.2f} {nh / 1e3:7.2f} {rh / 1e3:7.2f} {saved / 1e3:7.2f}"
                  f" {(nh - nl) / 1e3:7.2f} {(rh - rl) / 1e3:7.2f}")
    print(f"summed |modelled - measured saving|: class as it is {err['now'] / 1e3:.1f} ms, "
          f"refitted on the others {err['refit'] / 1e3:.1f} ms")
    print(f"median of the same per item, over the item's float32 time: class as it is "
          f"{statistics.median(rel['now']):.1%}, refitted {statistics.median(rel['refit']):.1%}; "
          f"largest {max(rel['now']):.1%} and {max(rel['refit']):.1%}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dumps", nargs="+", help="calibrate_in_place.py --dump files (.json, or .json.gz)")
    ap.add_argument("--class", dest="cls", default="cpu-avx512-bf16", choices=sorted(DEVICE_COSTS))
    ap.add_argument("--min-nodes", type=int, default=6, help="the fewest nodes a group needs for a band of its own")
    ap.add_argument("--ranges", default="all",
                    help="upper flops ends of the ranges to refit, e.g. 2e7,2e8 (default: all); "
                         "the others keep the class's bands")
    ap.add_argument("--no-skinny", action="store_true", help="no positions tiers in the refitted ranges")
    ap.add_argument("--holdout", choices=("dump", "model"),
                    help="price each dump (or each model's items) with bands fitted on the other dumps (models)")
    args = ap.parse_args(argv)
    costs = DEVICE_COSTS[args.cls]
    rows = load(args.dumps)
    fit = dict(min_nodes=args.min_nodes, skinny=not args.no_skinny,
               ranges=FLOPS_EDGES if args.ranges == "all" else [float(x) for x in args.ranges.split(",")])
    if args.holdout:
        holdout(rows, costs, by=args.holdout, **fit)
    else:
        _print_bands(fit_bands(rows, costs, **fit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
