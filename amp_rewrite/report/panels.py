"""Panels of a rewrite: one per graph that changed (:func:`panels_for`), each box coloured
by its plan's decision, inserted Casts marked, function arguments and results drawn as
boundary boxes, titled by the signatures that run it.  Pure."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..graph import dtypes as dt
from ..graph.tensor_names import parse_function_input, parse_graph_input
from .boxes import DEFAULT_MAX_NODES, DrawNode, Panel, _middle
from .collapse import collapse
from .drawable import DrawableResult

__all__ = ["panels_for"]


def _node_kind(plan: Any, name: str) -> tuple[str, str, str]:
    """``(kind, dtype name, reason)`` of a node from its plan (``plan`` may be ``None``)."""
    if plan is None:
        return "unchanged", "", "function left unchanged"
    nd = plan.nodes.get(name)
    if nd is None:
        return "unchanged", "", plan.skipped or "not painted"
    kind = {"allow": "allow", "deny": "deny", "infer": "infer", "clear": "clear"}.get(nd.color, "unchanged")
    return kind, dt.name(nd.dtype) if nd.dtype else "", nd.reason


def _input_node(text: str, is_function: bool) -> str | None:
    """The node an input string reads (``None`` if it is malformed)."""
    try:
        return parse_function_input(text).node if is_function else parse_graph_input(text).node
    except ValueError:
        return None


def _graph_panel(title: str, node_defs: Sequence[Any], plan: Any, casts: Mapping[str, tuple[str, str]],
                 args: Sequence[str] = (), rets: Mapping[str, str] | None = None) -> Panel:
    """A panel for the main graph (``rets is None``) or a function body."""
    is_function = rets is not None
    nodes: list[DrawNode] = []
    for a in args:
        nodes.append(DrawNode(a, _middle(a), "argument", "io", f"{a}\nfunction argument"))
    known = set(args) | {n.name for n in node_defs}
    edges: list[tuple[str, str, bool]] = []
    for nd in node_defs:
        if nd.name in casts:
            dtype, source = casts[nd.name]
            kind, sub = "cast", f"Cast \u2192 {dtype}"
            detail = f"inserted by amp_rewrite: casts {source} to {dtype}"
            # The generated name ends in "-CastToBf16-0-AutoMixedPrecision"; what it
            # reads says more.
            nodes.append(DrawNode(nd.name, _middle(source), sub, kind, f"{nd.name}\n{detail}"))
        else:
            kind, dtype, reason = _node_kind(plan, nd.name)
            sub = nd.op + (f" \u00b7 {dtype}" if dtype else "")
            nodes.append(DrawNode(nd.name, _middle(nd.name), sub, kind, f"{nd.name}\n{nd.op}\n{kind}: {reason}"))
        for text in nd.input:
            src = _input_node(text, is_function)
            if src is not None and src in known:
                edges.append((src, nd.name, text.startswith("^")))
    for out_name, text in (rets or {}).items():
        rid = f"{out_name} (result)"
        nodes.append(DrawNode(rid, _middle(out_name), "result", "io", f"{out_name}\nfunction result"))
        src = _input_node(text, True)
        if src is not None and src in known:
            edges.append((src, rid, False))
    return Panel(title, tuple(nodes), tuple(edges))


def _casts_of(section: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """``{cast name: (dtype, tensor it reads)}`` from a report section."""
    return {c["name"]: (c["dtype"], c["source"]) for c in section.get("casts", ())}


def _titled(panel: Panel, keys: Sequence[str]) -> Panel:
    """``panel`` titled by the signature keys that run it (unchanged without any).  Pure."""
    if not keys:
        return panel
    title = ("signature " if len(keys) == 1 else "signatures ") + ", ".join(keys)
    return Panel(title, panel.nodes, panel.edges, panel.note, panel.title, tuple(keys))


def panels_for(result: DrawableResult, *, title: str = "graph", which: str = "changed",
               max_nodes: int = DEFAULT_MAX_NODES,
               signatures: Mapping[str, Sequence[str]] | None = None) -> list[Panel]:
    """Panels for one rewritten GraphDef.  ``which="changed"`` draws the main graph and the
    functions that have a converted node or a Cast (the main graph alone if nothing changed);
    ``which="all"`` draws every graph.  Pure.

    ``signatures`` maps each signature key to the graphs it runs (function names, ``""``
    for the main graph).  A panel then is titled by the keys that run it (its graph name
    becomes the subtitle), and panels come in the order of their first key; graphs no
    signature runs follow."""
    report = result.report
    gd = result.graph_def
    runs: dict[str, list[str]] = {}
    for key in sorted(signatures or {}):
        for graph in (signatures or {})[key]:
            runs.setdefault(graph, []).append(key)
    out: list[Panel] = []
    functions = report.get("functions", {})
    changed = {n for n, s in functions.items() if s["converted_nodes"] or s["casts_to_low"] or s["casts_to_high"]}
    main_changed = report["casts"] or any(d["color"] == "allow" for d in report["nodes"].values())
    if which == "all" or main_changed or not changed:
        main = _graph_panel(f"{title}: main graph", gd.node, result.plans.get(""), _casts_of(report))
        out.append(_titled(collapse(main, max_nodes), runs.get("", ())))
    for fdef in sorted(gd.library.function, key=lambda f: f.signature.name):
        name = fdef.signature.name
        if which != "all" and name not in changed:
            continue
        section = functions.get(name, {})
        args = [a.name for a in fdef.signature.input_arg]
        rets = {o.name: fdef.ret[o.name] for o in fdef.signature.output_arg if o.name in fdef.ret}
        panel = _graph_panel(f"{title}: function {name}", fdef.node_def, result.plans.get(name),
                             _casts_of(section), args, rets)
        out.append(_titled(collapse(panel, max_nodes), runs.get(name, ())))
    # Stable sort: panels a signature runs first, by key; the rest keep their order.
    return sorted(out, key=lambda p: (not p.signatures, p.signatures[:1]))
