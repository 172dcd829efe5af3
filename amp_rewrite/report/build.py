"""The rewrite report: a plain, JSON-serializable dict that explains every decision.

Layout::

    {
      "target": "gpu:8.0", "precision": "float16", "lists": "default", "level": "DEFAULT",
      "total_nodes": 120,          # nodes of the main graph and of every rewritten function
      "converted_nodes": 40,       # nodes with at least one type attribute converted
      "converted_attrs": 44,       # (node, type attribute) pairs converted
      "casts_to_low": 6, "casts_to_high": 3,
      "skipped": null,             # or why nothing was done
      "unknown_ops": {"MyOp": 2},
      "skipped_functions": {"f": "reason"},
      "nodes": {name: {"op", "color", "dtype", "reason", "attrs": {attr: {...}}}},
      "casts": [{"name", "source", "dtype", "consumers"}],
      "placement": {...},          # optimal planner only: estimated cost of float32, greedy
                                   # and optimal colourings, and what the min cut changed
      "normalized": {name: reason},  # a normalization's apply nodes the rule changed: low (optimal, "low") or fenced
      "bounded": {name: proof},    # deny-list nodes inferred: input proven in range
      "identity": {name: proof},   # deny-list reductions cleared: they reduce no element
      "functions": {fname: {"total_nodes", ..., "nodes", "casts"}},
      "precision_reason": "requested",  # added by rewrite_graph_def
      "excluded": {pattern: 3}     # only with exclude=: nodes each pattern matched
    }

The full schema, and the model report around it, is ``amp_rewrite/report_schema.json``
(documented in ``docs/report.md``).

``color`` is ``allow`` (runs in low precision), ``deny`` (kept float32 by a deny rule),
``infer`` / ``clear`` (on that list, left float32), or ``none`` (on no list / not float).
"""

from __future__ import annotations

from itertools import islice
from operator import itemgetter
from typing import Any, Mapping

from ..graph import dtypes as dt
from ..plan.painter import NodeDecisions, Plan
from ..graph.io import ImportedGraph
from ..rewrite import RewriteStats
from ..plan.targets import Target

__all__ = ["build_report"]


def _graph_section(plan: Plan, stats: RewriteStats, total: int) -> dict[str, Any]:
    converted_nodes = set(map(itemgetter(0), stats.converted))
    folded = set(stats.folded)
    if isinstance(plan.nodes, NodeDecisions):
        nodes = _node_entries(plan.nodes, folded, plan.target_dtype)
    else:
        nodes = {}
        for name, nd in plan.nodes.items():
            attrs = [(ta, d.color, d.dtype, d.reason, d.source) for ta, d in nd.attrs.items()]
            nodes[name] = _node_entry(nd.op, nd.color, nd.dtype, nd.reason, attrs, name in folded,
                                      plan.target_dtype)
    dtype_names = _DtypeNames()
    casts = [
        {"name": c.name, "source": f"{c.source}:{c.port}", "dtype": dtype_names[c.dst_dtype],
         "consumers": list(c.consumers)}
        for c in stats.casts
    ]
    to_high = sum(1 for c in stats.casts if c.dst_dtype == dt.FLOAT)
    return {
        "total_nodes": total,
        "converted_nodes": len(converted_nodes),
        "converted_attrs": len(stats.converted),
        "casts_to_low": len(stats.casts) - to_high,
        "casts_to_high": to_high,
        "skipped": plan.skipped,
        "nodes": nodes,
        "casts": casts,
        **({"placement": plan.placement.as_dict()} if plan.placement is not None else {}),
        **({"normalized": dict(plan.normalized)} if plan.normalized else {}),
        **({"bounded": dict(plan.bounded)} if plan.bounded else {}),
        **({"identity": dict(plan.identity)} if plan.identity else {}),
    }


class _DtypeNames(dict):
    """``dt.name``, memoized: the report names a dtype for every node and cast."""

    def __missing__(self, dtype: int) -> str:
        self[dtype] = name = dt.name(dtype)
        return name


def _node_entry(
    op: str, color: str, dtype: int, reason: str,
    attrs: list[tuple[Any, str, int, str, str | None]], folded: bool, target_dtype: int,
) -> dict[str, Any]:
    """The report entry of one node from its summary and its attributes' decisions
    ``(type attr, color, dtype, reason, deny source)``."""
    dtype_name = dt.name
    entry: dict[str, Any] = {
        "op": op,
        "color": color,
        "dtype": dtype_name(dtype),
        "reason": reason,
    }
    if len(attrs) > 1:
        entry["attrs"] = {
            str(ta): {"color": a_color, "dtype": dtype_name(a_dtype), "reason": a_reason}
            for ta, a_color, a_dtype, a_reason, _ in attrs
        }
    for _, _, _, _, source in attrs:
        if source:
            entry["deny_source"] = source
            break
    if folded:
        # The rewrite folded a Cast -> Cast chain: this Cast now reads the low-precision
        # tensor itself, so its SrcT changed although the painting left it alone.
        why = f"reads the {dt.name(target_dtype)} tensor directly (Cast chain folded)"
        entry["attrs"] = {**entry.get("attrs", {str(ta): {"color": a_color, "dtype": dtype_name(a_dtype),
                                                             "reason": a_reason}
                                                   for ta, a_color, a_dtype, a_reason, _ in attrs}),
                          "SrcT": {"color": "allow", "dtype": dt.name(target_dtype), "reason": why}}
        entry.update(color="allow", dtype=dt.name(target_dtype), reason=f"SrcT {why}")
    return entry


def _node_entries(decisions: NodeDecisions, folded: set[str], target_dtype: int) -> dict[str, Any]:
    """The report entries of every node of a plan, from the plan's flat per-vertex lists.

    Equal to calling :func:`_node_entry` per node, but a node with one type attribute (most
    of them) is written straight from its vertex: its summary is that vertex's decision and
    it lists no attrs.  Graphs have up to millions of nodes.
    """
    order, ops, start, vattr, vcolor, vdtype, vreason, vsource = decisions.columns()
    dtype_names = _DtypeNames()
    nodes: dict[str, Any] = {}
    for i, (name, op, v, end) in enumerate(zip(order, ops, start, islice(start, 1, None))):
        if end - v == 1 and name not in folded:
            entry = {"op": op, "color": vcolor[v], "dtype": dtype_names[vdtype[v]],
                     "reason": vreason[v]}
            source = vsource[v]
            if source:
                entry["deny_source"] = source
        else:
            color, dtype, reason = decisions.summary(i)
            attrs = [(vattr[u], vcolor[u], vdtype[u], vreason[u], vsource[u]) for u in range(v, end)]
            entry = _node_entry(op, color, dtype, reason, attrs, name in folded, target_dtype)
        nodes[name] = entry
    return nodes


#: Low-precision dtype names, for telling an already rewritten graph.
_LOW_NAMES = ("float16", "bfloat16")


def nothing_converted_reason(plans: Mapping[str, Plan], precision: str, where: str) -> str:
    """The true reason a rewrite converted nothing, from the decisions on the allow-list ops
    (``category == "allow"``) of every plan.  Pure.

    In order of precedence: there is no allow-list op on an eligible device; the allow-list
    ops already run in low precision (a rewritten model); the user excluded or fetched them;
    the cost model kept them float32 (with the first of its reasons, which carries its
    estimate); otherwise the decision of the first one.
    """
    counts = {"already": 0, "preserved": 0, "cost": 0, "other": 0}
    first: dict[str, str] = {}
    total = 0
    for plan in plans.values():
        for decision in plan.nodes.values():
            if decision.category != "allow":
                continue
            reason = decision.reason
            if "is not eligible" in reason or "is not in the op registry" in reason:
                continue  # not on an eligible device: nothing to convert there
            total += 1
            if dt.name(decision.dtype) in _LOW_NAMES or (
                    reason.startswith("type ") and any(low in reason for low in _LOW_NAMES)):
                kind = "already"
            elif reason.startswith("preserved"):
                kind = "preserved"
            elif "kept float32" in reason:
                kind = "cost"
            else:
                kind = "other"
            counts[kind] += 1
            first.setdefault(kind, reason)
    if total == 0:
        return f"no allow-list op found on an eligible device ({where})"
    if counts["already"] and counts["already"] >= total - counts["preserved"]:
        return (f"already rewritten: {counts['already']} allow-list op(s) already run in low "
                "precision")
    if counts["preserved"] == total:
        return (f"all {total} allow-list op(s) are excluded or fetched by the user "
                "(--exclude / --fetch / fetches=)")
    if counts["cost"]:
        return (f"the cost model kept {counts['cost']} of {total} allow-list op(s) float32 "
                f"({first['cost']})")
    return f"{total} allow-list op(s) not converted ({next(iter(first.values()))})"


def build_report(
    imported: ImportedGraph,
    plans: Mapping[str, Plan],
    stats: Mapping[str, RewriteStats],
    *,
    target: Target,
    precision: str,
    lists: Any,
    level: str,
    skipped_functions: Mapping[str, str],
) -> dict[str, Any]:
    """Assemble the report for one :func:`~amp_rewrite.api.rewrite_graph_def` call.  Pure."""
    main_total = sum(1 for _, d in imported.graph.nodes(data=True) if d["proto"] is not None)
    main = _graph_section(plans[""], stats[""], main_total)
    functions = {}
    for fname in sorted(plans):
        if not fname:
            continue
        fg = imported.functions[fname]
        total = sum(1 for _, d in fg.nodes(data=True) if d["proto"] is not None)
        functions[fname] = _graph_section(plans[fname], stats[fname], total)
    sections = [main, *functions.values()]
    unknown: dict[str, int] = {}
    for plan in plans.values():
        for op, count in plan.unknown_ops.items():
            unknown[op] = unknown.get(op, 0) + count
    converted = sum(s["converted_attrs"] for s in sections)
    skipped = plans[""].skipped
    if skipped is None and converted == 0 and not any(p.renames for p in plans.values()):
        skipped = nothing_converted_reason(plans, precision, target.description)
    return {
        "target": target.description,
        "precision": precision,
        "lists": getattr(lists, "profile", str(lists)),
        "level": level,
        "total_nodes": sum(s["total_nodes"] for s in sections),
        "converted_nodes": sum(s["converted_nodes"] for s in sections),
        "converted_attrs": converted,
        "casts_to_low": sum(s["casts_to_low"] for s in sections),
        "casts_to_high": sum(s["casts_to_high"] for s in sections),
        "skipped": skipped,
        "unknown_ops": dict(sorted(unknown.items())),
        "skipped_functions": dict(sorted(skipped_functions.items())),
        "nodes": main["nodes"],
        "casts": main["casts"],
        **{k: main[k] for k in ("placement", "normalized", "bounded", "identity") if k in main},
        "functions": functions,
    }
