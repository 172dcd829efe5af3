"""Calibrate the GPU cost classes in place: every node's own time inside real steps, set against
the cost model's estimate of the same node.

Issue 22 asks for the GPU classes what ``bench/calibrate_in_place.py`` did for this
repository's CPU: each node's time inside real models, float32 (TF32 on and off) against
float16, at the sizes people train at.  ``bench/gpu_profile.py --nodes`` records those times
on the GPU (every kernel the GPU ran for a TensorFlow node, from the profiler's trace); this
script needs no GPU.  It traces each profiled variant's step here as the benchmark builds it
(:func:`gpu_bench.variant_graph_def`), prices every node with the variant's device class
(:func:`amp_rewrite.estimate_node_times`: Hopper with TF32 for ``float32``, without for
``float32_strict``, the low-precision run's nodes in the type they run in), matches the
measured nodes by name, and prints:

* **coverage**: per variant, the step's wall time, the GPU's busy time, the measured time of
  all nodes and of those matched to the graph, and the model's estimate of the matched ones;
* **float32 time / estimate** per op (dense ops per size band): the ``scale`` a class's
  ``dense`` bands keep, and the compute factor of ``elementwise``;
* **low / float32 time** per op, over the nodes that ran in float32 in the float32 variant and
  in low precision in the low one (same name): the ratio ``elementwise`` and the dense bands
  keep;
* **Casts**: a least-squares line through the low variant's Casts, time = fixed + per element
  (``cast_in_place``), next to the class's own price;
* **small kernels**: the median time of element-wise nodes below 4096 elements, the floor
  every kernel pays (``kernel_overhead``).

Usage (the profile from the lent GPU; see CONTRIBUTING.md)::

    python bench/calibrate_gpu_in_place.py nodes.json [--capability 9.0] [--out table.md] [--json out.json]
    python bench/calibrate_gpu_in_place.py cpu_nodes.json --target cpu --precision bfloat16   # CPU smoke

Only variants without XLA count (under XLA a node has no kernel of its own).  Sums, not medians
of per-node ratios, because the planner adds node times: the large nodes are what matter.
Pure reading of the profile; writes only ``--out``/``--json``.
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
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), HERE]

#: Prefixes the runtime puts before a node's name: our rewritten step is imported under
#: ``amp_rewrite/`` (``amp_rewrite.training.tf_function``).
NAME_PREFIXES = ("amp_rewrite/",)
#: Upper ends of the dense size bands (multiply-add flops), as the CPU class's.
BAND_EDGES = (5e6, 2e7, 2e8)
#: Element-wise nodes at most this large time the per-kernel floor, not bandwidth.
SMALL_ELEMENTS = 4096
#: The fit's element-wise nodes move at least this many elements (inputs and outputs: 8 MB of
#: float32, 1.9 us at 4.3 TB/s): below, the kernel's fixed time dominates, which the fit takes
#: off every node (the small kernels' median) and the step estimate charges apart.
FIT_ELEMENTS = 2_000_000


@dataclasses.dataclass(frozen=True)
class Matched:
    """One measured node matched to its priced node."""

    variant: str
    name: str
    op: str
    kind: str
    precision: str
    estimated_ms: float  #: the node's price in the step estimate, its kernel's fixed time included
    measured_ms: float
    elements: int  #: output elements, 0 where a shape was unknown
    flops: float
    fixed_ms: float = 0.0  #: the part of ``estimated_ms`` that is the kernel's fixed time


def _band(flops: float) -> str:
    for edge in BAND_EDGES:
        if flops < edge:
            return f"<{edge / 1e6:g}M"
    return f">={BAND_EDGES[-1] / 1e6:g}M"


def strip_prefix(name: str) -> str:
    """A measured node's name as the traced graph has it.  Pure."""
    for prefix in NAME_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def dense_flops(graph_def: Any, shapes: Any, target: str, precision: str,
                fetches: Any = None) -> dict[str, float]:
    """Multiply-add flops of every dense node of the main graph that runs (for the size bands)."""
    import amp_rewrite
    from amp_rewrite.plan.cost_model import DENSE_OPS

    per = amp_rewrite.estimate_node_times(graph_def, target=target, precision=precision,
                                          variable_shapes=shapes, costs=_flop_counter(), fetches=fetches)
    # The counter class prices a dense op at exactly its flops (1 flop/ns, nothing else); a
    # function's node counts once per run of it, as its measured time does.
    out: dict[str, float] = {}
    for graph in sorted(per, key=lambda g: g != ""):
        for name, t in per[graph].items():
            if t.op in DENSE_OPS:
                out.setdefault(name, t.ns)
    return out


def _flop_counter() -> Any:
    """A device class under which a dense op's estimate is its flops in ns."""
    from amp_rewrite.plan.cost_model import DeviceCosts

    return DeviceCosts("flops", 1.0, 1.0, math.inf, 0.5, 1.0, 0.0, 1, 1.0)


def match(profile_nodes: dict[str, dict[str, Any]], priced: dict[str, dict[str, Any]], variant: str,
          flops: dict[str, float]) -> tuple[list[Matched], float]:
    """The measured nodes of one variant matched by name to the priced nodes of its graph
    (any function of it), and the measured ms that matched nothing.  Pure."""
    by_name: dict[str, Any] = {}
    for graph in sorted(priced, key=lambda g: g != ""):  # the main graph's node wins a name clash
        for name, t in priced[graph].items():
            by_name.setdefault(name, t)
            for alias in getattr(t, "aliases", ()):  # a layout Transpose: any name Grappler gave it
                by_name.setdefault(alias, t)
    out: list[Matched] = []
    unmatched = 0.0
    for raw, rec in profile_nodes.items():
        name = strip_prefix(raw)
        t = by_name.get(name)
        if t is None and raw.endswith(":" + str(rec.get("op"))):  # "name:Type" (a name two ops had)
            name = strip_prefix(raw[: -len(str(rec["op"])) - 1])
            t = by_name.get(name)
        if t is None:
            unmatched += rec["ms"]
            continue
        # The estimate as the step prices the node: its time and its kernel's fixed time.
        out.append(Matched(variant, name, t.op, t.kind, t.precision, (t.ns + t.fixed_ns) / 1e6, rec["ms"],
                           t.elements if t.known_shape else 0, flops.get(name, 0.0), t.fixed_ns / 1e6))
    return out, unmatched


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else math.nan


def per_op_scale(rows: list[Matched]) -> list[dict[str, Any]]:
    """Per op (dense ops per band): nodes, measured ms, estimated ms, measured / estimated."""
    groups: dict[str, list[Matched]] = collections.defaultdict(list)
    for r in rows:
        key = f"{r.op} {_band(r.flops)}" if r.kind == "dense" else r.op
        groups[key].append(r)
    table = [{"op": k, "nodes": len(v), "measured_ms": sum(r.measured_ms for r in v),
              "estimated_ms": sum(r.estimated_ms for r in v)} for k, v in groups.items()]
    for row in table:
        row["measured_over_estimate"] = _ratio(row["measured_ms"], row["estimated_ms"])
    return sorted(table, key=lambda r: -r["measured_ms"])


def low_over_float32(f32: list[Matched], low: list[Matched]) -> list[dict[str, Any]]:
    """Per op (dense ops per band), over nodes float32 in ``f32`` and low precision in ``low``
    (same name): summed low time over summed float32 time.  Pure."""
    base = {r.name: r for r in f32 if r.precision == "float32"}
    groups: dict[str, list[tuple[Matched, Matched]]] = collections.defaultdict(list)
    for r in low:
        b = base.get(r.name)
        if b is None or r.precision != "low" or r.kind == "cast":
            continue
        key = f"{r.op} {_band(b.flops)}" if r.kind == "dense" else r.op
        groups[key].append((b, r))
    table = [{"op": k, "nodes": len(v), "float32_ms": sum(b.measured_ms for b, _ in v),
              "low_ms": sum(r.measured_ms for _, r in v)} for k, v in groups.items()]
    for row in table:
        row["low_over_float32"] = _ratio(row["low_ms"], row["float32_ms"])
    return sorted(table, key=lambda r: -r["float32_ms"])


def cast_line(rows: list[Matched]) -> dict[str, Any] | None:
    """Least-squares ``measured ms = fixed + per_element * elements`` over the Casts of
    ``rows`` whose shape is known (in us and ns), with the model's own estimate summed beside.  ``None`` with fewer
    than two Casts of different sizes.  Pure."""
    casts = [r for r in rows if r.kind == "cast" and r.elements > 0]  # 0: shape unknown
    sizes = {r.elements for r in casts}
    if len(casts) < 2 or len(sizes) < 2:
        return None
    n = len(casts)
    mx = sum(r.elements for r in casts) / n
    my = sum(r.measured_ms for r in casts) / n
    sxx = sum((r.elements - mx) ** 2 for r in casts)
    slope = sum((r.elements - mx) * (r.measured_ms - my) for r in casts) / sxx
    return {"casts": n, "fixed_us": 1e3 * (my - slope * mx), "ns_per_element": 1e6 * slope,
            "measured_ms": sum(r.measured_ms for r in casts), "estimated_ms": sum(r.estimated_ms for r in casts)}


def small_kernel_floor(rows: list[Matched]) -> dict[str, Any] | None:
    """The median measured time (us) of element-wise nodes of at most :data:`SMALL_ELEMENTS`
    elements: what a kernel costs whatever it does.  Pure."""
    small = [r.measured_ms for r in rows if r.kind == "elementwise" and 0 < r.elements <= SMALL_ELEMENTS]
    return {"nodes": len(small), "median_us": 1e3 * statistics.median(small)} if small else None


def bare_class(costs: Any, bandwidth: float | None = None) -> Any:
    """``costs`` without its measured tables (every element-wise op at its memory-bound time,
    every dense op at its roofline, a Cast at its bytes' time), at ``bandwidth`` where given:
    the prices :func:`fit_tables` divides the measured times by.  Pure."""
    return dataclasses.replace(costs, elementwise={}, large_elementwise={}, dense={}, low_elementwise=1.0,
                               cast_traffic=1.0, cast_in_place=None,
                               bandwidth=bandwidth if bandwidth is not None else costs.bandwidth)


def calibrate(profile: dict[str, Any], *, target: str, precision: str,
              low_variants: tuple[str, ...], bare: bool = False, bandwidth: float | None = None) -> dict[str, Any]:
    """Every workload of ``profile`` (``gpu_profile.py --nodes`` JSON): the tables of the module
    docstring.  Traces the variants' graphs here.  ``bare``: each node priced by
    :func:`bare_class` (the fit's denominators), else by the class as it is (a check of its
    tables), at ``bandwidth`` where given (the profiled GPU's)."""
    from amp_rewrite.plan.cost_model import costs_for

    import amp_rewrite
    import gpu_bench

    for name, extra in (profile.get("extra_variants") or {}).items():
        if name not in gpu_bench.EXTRA_VARIANTS:
            gpu_bench.define_extra_variant(f"{name}={extra['base']}:{json.dumps(extra['options'])}")
    out: dict[str, Any] = {"target": target, "precision": precision, "workloads": {}}
    for workload, recs in profile["workloads"].items():
        rows: dict[str, list[Matched]] = {}
        coverage = {}
        for variant, rec in recs.items():
            if "nodes" not in rec or rec.get("xla"):
                continue
            gd, shapes, compiled, fetches = gpu_bench.variant_graph_def(workload, variant, target=target,
                                                                        precision=precision)
            if compiled:
                continue
            tgt, costs = gpu_bench.variant_target_and_costs(variant, target, precision)
            if bare or bandwidth is not None:
                costs = costs or costs_for(tgt.devices[0], precision)
                costs = bare_class(costs, bandwidth) if bare else dataclasses.replace(costs, bandwidth=bandwidth)
            priced = amp_rewrite.estimate_node_times(gd, target=tgt, precision=precision, variable_shapes=shapes,
                                                     costs=costs, fetches=fetches)
            flops = dense_flops(gd, shapes, target, precision, fetches)
            matched, unmatched = match(rec["nodes"], priced, variant, flops)
            rows[variant] = matched
            coverage[variant] = {
                "wall_ms": rec.get("wall_ms"), "device_busy_ms": rec.get("device_busy_ms"),
                "node_source": rec.get("node_source"),
                "measured_ms": sum(v["ms"] for v in rec["nodes"].values()),
                "matched_ms": sum(r.measured_ms for r in matched), "unmatched_ms": unmatched,
                "estimated_matched_ms": sum(r.estimated_ms for r in matched), "matched_nodes": len(matched),
            }
        result: dict[str, Any] = {"coverage": coverage, "scale": {}, "low_over_float32": {}, "casts": {},
                                  "small_kernels": {}}
        for variant, matched in rows.items():
            result["scale"][variant] = per_op_scale([r for r in matched if r.kind != "cast"])
            result["small_kernels"][variant] = small_kernel_floor(matched)
        for variant in low_variants:
            if variant in rows and "float32" in rows:
                result["low_over_float32"][variant] = low_over_float32(rows["float32"], rows[variant])
                result["casts"][variant] = cast_line(rows[variant])
        result["rows"] = rows
        out["workloads"][workload] = result
    return out


def fit_tables(result: dict[str, Any], *, bandwidth: float, low_variant: str = "ours_default",
               min_elements: int = FIT_ELEMENTS) -> dict[str, Any]:
    """The device class's tables from a :func:`calibrate` result priced ``bare`` at
    ``bandwidth``, pooled over its workloads (sums, as the planner adds node times):

    * ``elementwise``: per op, over nodes whose bare price moves at least ``min_elements``
      float32 elements (small ones time the per-kernel floor), the float32 nodes of
      ``float32`` and of ``low_variant`` (those it left float32, in its layout): measured
      time over the memory-bound time (the float32 factor); and over the nodes that
      ``low_variant`` converted, their time there over the same nodes' float32 time in
      ``float32`` (the low ratio, ``None`` where it converted none);
    * ``dense``: per dense op, the float32 nodes' time over their roofline (the band's scale)
      and the converted ones' time over float32's (its ratio);

    every measured time less its run's small kernels' median (:func:`small_kernel_floor`): the
    fixed time of a kernel, which the step estimate charges apart (``kernel_overhead``);
    * ``casts``: ``low_variant``'s Casts, the median of those of at most
      :data:`SMALL_ELEMENTS` elements (the fixed time) and the rest's time per element beyond
      it over their bytes' memory-bound time (the traffic factor).

    Pure."""
    sums: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    small_casts: list[float] = []
    big_casts: list[Matched] = []
    for r in result["workloads"].values():
        rows = r["rows"]
        floor = {v: (small_kernel_floor(matched) or {"median_us": 0.0})["median_us"] / 1e3
                 for v, matched in rows.items()}
        base = {m.name: m for m in rows.get("float32", [])}
        for variant, matched in rows.items():
            if variant not in ("float32", low_variant):  # TF32 off, or another rewrite
                continue
            for m in matched:
                own = m.estimated_ms - m.fixed_ms
                if m.kind == "cast" and variant == low_variant and m.elements > 0:
                    (small_casts.append(m.measured_ms) if m.elements <= SMALL_ELEMENTS else big_casts.append(m))
                    continue
                if m.kind not in ("elementwise", "dense"):
                    continue
                if m.kind == "elementwise" and own * 1e6 * bandwidth / 4 < min_elements:
                    continue
                if m.precision == "float32":
                    acc = sums[(m.kind, m.op)]
                    acc[0] += m.measured_ms - floor[variant]
                    acc[1] += own
                    acc[2] += 1
                elif variant == low_variant and m.name in base and base[m.name].precision == "float32":
                    acc = sums[(m.kind + "-low", m.op)]
                    acc[0] += m.measured_ms - floor[variant]
                    acc[1] += base[m.name].measured_ms - floor["float32"]
                    acc[2] += 1
    tables: dict[str, Any] = {"bandwidth": bandwidth, "elementwise": {}, "dense": {}, "casts": None}
    for (kind, op), (measured, priced, n) in sorted(sums.items()):
        if kind not in ("elementwise", "dense"):
            continue
        low = sums.get((kind + "-low", op))
        tables[kind][op] = {"nodes": n, "measured_ms": measured, "scale": _ratio(measured, priced),
                            "low_nodes": low[2] if low else 0,
                            "low_ratio": _ratio(low[0], low[1]) if low else None}
    pooled = [acc for (kind, _), acc in sums.items() if kind == "elementwise-low"]
    tables["elementwise_low_pooled"] = _ratio(sum(a[0] for a in pooled), sum(a[1] for a in pooled)) if pooled else None
    if small_casts and big_casts:
        fixed = statistics.median(small_casts)
        per_element = sum(m.measured_ms - fixed for m in big_casts) / sum(m.elements for m in big_casts)
        tables["casts"] = {"casts": len(small_casts) + len(big_casts), "fixed_us": 1e3 * fixed,
                           "ns_per_element": 1e6 * per_element,
                           "traffic": 1e6 * per_element / (6 / bandwidth)}
    return tables


def fit_markdown(tables: dict[str, Any]) -> str:
    """:func:`fit_tables`'s result as the tables :mod:`amp_rewrite.plan.cost_model` keeps.  Pure."""
    lines = [f"# Fitted GPU tables (bare prices at {tables['bandwidth']:g} bytes/ns)", "",
             "| kind | op | nodes | measured ms (less the kernel floor) | float32 scale | converted nodes | low / float32 |",
             "|---|---|---|---|---|---|---|"]
    for kind in ("elementwise", "dense"):
        for op, t in sorted(tables[kind].items(), key=lambda kv: -kv[1]["measured_ms"]):
            lines.append(f"| {kind} | {op} | {t['nodes']} | {t['measured_ms']:.2f} | {_f(t['scale'], '.2f')} | "
                         f"{t['low_nodes']} | {_f(t['low_ratio'], '.2f')} |")
    if tables.get("elementwise_low_pooled") is not None:
        lines += ["", f"Every converted element-wise node pooled: low / float32 {tables['elementwise_low_pooled']:.2f}"]
    c = tables["casts"]
    if c:
        lines += ["", f"Casts ({c['casts']}): {c['fixed_us']:.2f} us + {c['ns_per_element']:.5f} ns/element "
                      f"({c['traffic']:.2f}x the memory-bound time of 6 bytes per element)"]
    return "\n".join(lines) + "\n"


def _f(x: Any, fmt: str = ".3f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def _op_table(title: str, columns: tuple[str, str, str], rows: list[tuple[dict[str, Any], float, float, float]]
              ) -> list[str]:
    """A titled per-op table: op, nodes, two times (ms) and their ratio.  Pure."""
    out = ["", title, "", f"| op | nodes | {' | '.join(columns)} |", "|---|---|---|---|---|"]
    return out + [f"| {t['op']} | {t['nodes']} | {a:.3f} | {b:.3f} | {_f(ratio, '.2f')} |" for t, a, b, ratio in rows]


def markdown(result: dict[str, Any], top: int = 20) -> str:
    """The tables of :func:`calibrate`'s result.  Pure."""
    lines = [f"# Per-node calibration ({result['target']}, {result['precision']})", ""]
    for workload, r in result["workloads"].items():
        lines += [f"## {workload}", "", "| variant | wall ms | busy ms | nodes measured ms | matched ms | "
                  "unmatched ms | estimated (matched) ms | matched nodes | source |", "|---|---|---|---|---|---|---|---|---|"]
        for v, c in r["coverage"].items():
            lines.append(f"| {v} | {_f(c['wall_ms'], '.2f')} | {_f(c['device_busy_ms'], '.2f')} | "
                         f"{c['measured_ms']:.2f} | {c['matched_ms']:.2f} | {c['unmatched_ms']:.2f} | "
                         f"{c['estimated_matched_ms']:.2f} | {c['matched_nodes']} | {c['node_source']} |")
        for v, table in r["scale"].items():
            lines += _op_table(f"**{v}: measured / estimated, per op** (largest first)",
                               ("measured ms", "estimated ms", "ratio"),
                               [(t, t["measured_ms"], t["estimated_ms"], t["measured_over_estimate"]) for t in table[:top]])
            floor = r["small_kernels"].get(v)
            if floor:
                lines += ["", f"small element-wise kernels: median {floor['median_us']:.1f} us over {floor['nodes']} nodes"]
        for v, table in r["low_over_float32"].items():
            lines += _op_table(f"**{v}: low / float32 time, per op** (nodes float32 in `float32`, low here)",
                               ("float32 ms", "low ms", "low / float32"),
                               [(t, t["float32_ms"], t["low_ms"], t["low_over_float32"]) for t in table[:top]])
            c = r["casts"].get(v)
            if c:
                lines += ["", f"Casts ({c['casts']}): {c['fixed_us']:.1f} us + {c['ns_per_element']:.4f} ns/element "
                              f"(measured {c['measured_ms']:.2f} ms, estimated {c['estimated_ms']:.2f} ms)"]
        lines.append("")
    return "\n".join(lines) + "\n"


def _class_bandwidth(target: str, precision: str) -> float:
    import amp_rewrite
    from amp_rewrite.plan.cost_model import costs_for

    return costs_for(amp_rewrite.resolve_target(target).devices[0], precision).bandwidth


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("profile", help="gpu_profile.py --nodes JSON (.json.gz read as gzip)")
    p.add_argument("--capability", default="9.0", help="compute capability of the profiled GPU (default 9.0)")
    p.add_argument("--target", help="price with this target instead of gpu:<capability> (cpu for the smoke run)")
    p.add_argument("--precision", default=None, help="default: the profile's")
    p.add_argument("--low-variants", default="ours_default,ours_tensorflow,ours_optimal,tf_amp",
                   help="variants whose low-precision nodes are set against float32's")
    p.add_argument("--bandwidth", type=float, help="the profiled GPU's memory bandwidth (bytes/ns; the H200's: 4300)")
    p.add_argument("--fit", action="store_true",
                   help="price every node without the class's tables and print the tables the profile implies")
    p.add_argument("--out", help="markdown file")
    p.add_argument("--json", help="JSON file")
    args = p.parse_args(argv)
    with (gzip.open(args.profile, "rt") if args.profile.endswith(".gz") else open(args.profile)) as f:
        profile = json.load(f)
    target = args.target or f"gpu:{args.capability}"
    precision = args.precision or profile.get("precision", "float16")
    result = calibrate(profile, target=target, precision=precision, low_variants=tuple(args.low_variants.split(",")),
                       bare=args.fit, bandwidth=args.bandwidth)
    text = markdown(result)
    if args.fit:
        bandwidth = args.bandwidth or _class_bandwidth(target, precision)
        text = fit_markdown(fit_tables(result, bandwidth=bandwidth)) + "\n" + text
    for r in result["workloads"].values():
        r.pop("rows")  # the matched nodes: for the fit, not the JSON
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
