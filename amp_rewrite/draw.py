"""Pictures of a rewrite: SVG, HTML and Graphviz DOT drawings, and TensorBoard event files.

A drawing shows the *rewritten* graph with every node coloured by its decision (allow,
infer, deny, clear, unchanged), inserted Casts marked, and function arguments/results drawn
as boundary nodes.  One panel is drawn per graph that changed: the main graph and each
function of the library with a converted node or a Cast (a TF2 SavedModel's work happens in
its functions).  A panel with more than ``max_nodes`` nodes is collapsed by name scope: scopes
are opened from the top, largest first, while the drawing stays within ``max_nodes`` boxes
(:func:`collapse`), and each closed box shows how many of its nodes got each decision.

The layout is a simple layered one computed here (no graphviz binary needed): cycles are
broken by reversing DFS back edges, layers come from longest paths (sources pulled down to
just above their first consumer), and nodes in a layer are ordered by a few barycentre
sweeps.  Everything is deterministic: the same rewrite gives the same bytes.

Node names come from untrusted files, so every piece of text is escaped for its format
(XML/HTML escaping plus removal of characters XML forbids; DOT string escaping), and the HTML
page carries a Content-Security-Policy that allows no scripts.

TensorBoard: :func:`tensorboard_files` gives ``before/`` and ``after/`` event files (the
GraphDef before and after, the after graph's nodes annotated with an ``_amp_rewrite`` attr
holding their decision), which TensorBoard's graph dashboard opens as two runs.
"""

from __future__ import annotations

import html
import logging
import os
import re
import tempfile
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Literal, Mapping, Sequence

from . import dtypes as dt
from .errors import AmpRewriteError
from .tensor_names import parse_function_input, parse_graph_input

if TYPE_CHECKING:  # pragma: no cover
    from .api import RewriteResult
    from .saved_model import ModelRewrite

__all__ = [
    "DrawNode",
    "Panel",
    "KINDS",
    "panels_for",
    "to_svg",
    "to_html",
    "to_dot",
    "graph_format",
    "render_file",
    "tensorboard_files",
]

log = logging.getLogger(__name__)

Kind = Literal["allow", "infer", "deny", "clear", "unchanged", "cast", "io", "group"]

#: Fill colour and legend text per decision kind, in legend order.
KINDS: dict[str, tuple[str, str]] = {
    "allow": ("#66bb6a", "allow: runs in low precision"),
    "infer": ("#ffe082", "infer: on the infer list, kept float32"),
    "deny": ("#ef5350", "deny: kept float32 by a deny rule"),
    "clear": ("#90caf9", "clear: on the clear list, kept float32"),
    "unchanged": ("#eeeeee", "unchanged: on no list, or not float"),
    "cast": ("#ba68c8", "Cast inserted by the rewrite"),
    "io": ("#ffffff", "function argument / result"),
}

DEFAULT_MAX_NODES = 150
_W, _H, _GAP_X, _GAP_Y, _MARGIN = 172, 40, 22, 38, 16
_LABEL_CHARS = 26
_MAX_ROW = 12  # boxes per line before a layer wraps


@dataclass(frozen=True)
class DrawNode:
    """One box: a node, a function boundary, or (``kind="group"``) a collapsed name scope.

    ``counts`` gives, for a group, how many member nodes got each kind.
    """

    id: str
    label: str
    sublabel: str
    kind: str
    detail: str
    counts: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Panel:
    """One graph to draw: boxes, edges ``(src, dst, is_control)`` and a note."""

    title: str
    nodes: tuple[DrawNode, ...]
    edges: tuple[tuple[str, str, bool], ...]
    note: str = ""


# ------------------------------------------------------------------------------ building


def _node_kind(plan: Any, name: str) -> tuple[str, str, str]:
    """``(kind, dtype name, reason)`` of a node from its plan (``plan`` may be ``None``)."""
    if plan is None:
        return "unchanged", "", "function left unchanged"
    nd = plan.nodes.get(name)
    if nd is None:
        return "unchanged", "", plan.skipped or "not painted"
    kind = {"allow": "allow", "deny": "deny", "infer": "infer", "clear": "clear"}.get(nd.color, "unchanged")
    return kind, dt.name(nd.dtype) if nd.dtype else "", nd.reason


def _short(name: str) -> str:
    """The end of a name (its most specific part), shortened to fit a box."""
    return name if len(name) <= _LABEL_CHARS else "\u2026" + name[-(_LABEL_CHARS - 1):]


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
        nodes.append(DrawNode(a, _short(a), "argument", "io", f"{a}\nfunction argument"))
    known = set(args) | {n.name for n in node_defs}
    edges: list[tuple[str, str, bool]] = []
    for nd in node_defs:
        if nd.name in casts:
            dtype, source = casts[nd.name]
            kind, sub = "cast", f"Cast \u2192 {dtype}"
            detail = f"inserted by amp_rewrite: casts {source} to {dtype}"
            # The generated name ends in "-CastToBf16-0-AutoMixedPrecision"; what it
            # reads says more.
            nodes.append(DrawNode(nd.name, _short(source), sub, kind, f"{nd.name}\n{detail}"))
        else:
            kind, dtype, reason = _node_kind(plan, nd.name)
            sub = nd.op + (f" \u00b7 {dtype}" if dtype else "")
            nodes.append(DrawNode(nd.name, _short(nd.name), sub, kind, f"{nd.name}\n{nd.op}\n{kind}: {reason}"))
        for text in nd.input:
            src = _input_node(text, is_function)
            if src is not None and src in known:
                edges.append((src, nd.name, text.startswith("^")))
    for out_name, text in (rets or {}).items():
        rid = f"{out_name} (result)"
        nodes.append(DrawNode(rid, _short(out_name), "result", "io", f"{out_name}\nfunction result"))
        src = _input_node(text, True)
        if src is not None and src in known:
            edges.append((src, rid, False))
    return Panel(title, tuple(nodes), tuple(edges))


def _scope_key(name: str, depth: int) -> str | None:
    parts = name.split("/")
    return "/".join(parts[:depth]) + "/" if len(parts) > depth else None


def _key_at(n: DrawNode, depth: int) -> str:
    """The box ``n`` belongs to when scopes are cut at ``depth``: ``"a/b/ (scope)"``, the
    node's own id, or (at depth 1) the group of all function arguments or results."""
    if n.kind == "io":
        if depth > 1:
            return n.id
        return " (arguments)" if n.sublabel == "argument" else " (results)"
    key = _scope_key(n.id, depth)
    return f"{key} (scope)" if key else n.id


def _cut(nodes: Sequence[DrawNode], max_nodes: int) -> dict[str, str]:
    """Choose boxes: start from top-level scopes and keep opening the largest box whose
    children still fit in ``max_nodes`` boxes.  Returns ``{node id: box id}``.  Pure."""
    depth: dict[str, int] = {}
    boxes: dict[str, list[DrawNode]] = {}
    for n in nodes:
        key = _key_at(n, 1)
        boxes.setdefault(key, []).append(n)
        depth[key] = 1
    def open_one(limit: int) -> bool:
        for key in sorted((k for k, m in boxes.items() if len(m) > 1 or m[0].id != k),
                          key=lambda k: (-len(boxes[k]), k)):
            children: dict[str, list[DrawNode]] = {}
            for n in boxes[key]:
                children.setdefault(_key_at(n, depth[key] + 1), []).append(n)
            if len(boxes) - 1 + len(children) <= limit:
                del boxes[key]
                for child, ms in children.items():
                    boxes[child] = ms
                    depth[child] = depth[key] + 1
                return True
        return False

    while open_one(max_nodes):
        pass
    # Keras names one scope per layer under a single model scope: opening it gives more
    # boxes than the budget, but a handful of boxes would hide everything.  Allow one
    # bigger step then.
    if len(boxes) < max_nodes // 4 and open_one(4 * max_nodes):
        while open_one(max(max_nodes, len(boxes))):
            pass
    return {n.id: key for key, ms in boxes.items() for n in ms}


def collapse(panel: Panel, max_nodes: int = DEFAULT_MAX_NODES) -> Panel:
    """Collapse ``panel`` by name scope when it has more than ``max_nodes`` boxes.  Pure.

    Top-level scopes are opened one by one, largest first, for as long as the drawing stays
    within ``max_nodes`` boxes; each box left closed shows how many of its nodes got each
    decision."""
    if len(panel.nodes) <= max_nodes:
        return panel
    owner = _cut(panel.nodes, max_nodes)
    members: dict[str, list[DrawNode]] = {}
    for n in panel.nodes:
        members.setdefault(owner[n.id], []).append(n)
    nodes = []
    for gid, group in members.items():
        if len(group) == 1 and group[0].id == gid:
            nodes.append(group[0])
            continue
        counts = Counter(m.kind for m in group)
        ordered = tuple((k, counts[k]) for k in KINDS if counts[k])
        summary = ", ".join(f"{c} {k}" for k, c in ordered)
        name = gid.rsplit(" (", 1)[0].strip() or gid.strip(" ()")
        nodes.append(DrawNode(gid, _short(name), f"{len(group)} nodes", "group",
                              f"{name}\n{len(group)} nodes: {summary}", ordered))
    seen = set()
    edges = []
    for u, v, control in panel.edges:
        a, b = owner[u], owner[v]
        if a != b and (a, b) not in seen:
            seen.add((a, b))
            edges.append((a, b, control))
    note = f"{len(panel.nodes)} nodes collapsed by name scope into {len(nodes)} boxes"
    return Panel(panel.title, tuple(nodes), tuple(edges), note)


def _casts_of(section: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """``{cast name: (dtype, tensor it reads)}`` from a report section."""
    return {c["name"]: (c["dtype"], c["source"]) for c in section.get("casts", ())}


def panels_for(result: "RewriteResult", *, title: str = "graph", which: str = "changed",
               max_nodes: int = DEFAULT_MAX_NODES) -> list[Panel]:
    """Panels for one rewritten GraphDef.  ``which="changed"`` draws the main graph and the
    functions that have a converted node or a Cast (the main graph alone if nothing changed);
    ``which="all"`` draws every graph.  Pure."""
    report = result.report
    gd = result.graph_def
    out = []
    functions = report.get("functions", {})
    changed = {n for n, s in functions.items() if s["converted_nodes"] or s["casts_to_low"] or s["casts_to_high"]}
    main_changed = report["casts"] or any(d["color"] == "allow" for d in report["nodes"].values())
    if which == "all" or main_changed or not changed:
        main = _graph_panel(f"{title}: main graph", gd.node, result.plans.get(""), _casts_of(report))
        out.append(collapse(main, max_nodes))
    for fdef in sorted(gd.library.function, key=lambda f: f.signature.name):
        name = fdef.signature.name
        if which != "all" and name not in changed:
            continue
        section = functions.get(name, {})
        args = [a.name for a in fdef.signature.input_arg]
        rets = {o.name: fdef.ret[o.name] for o in fdef.signature.output_arg if o.name in fdef.ret}
        panel = _graph_panel(f"{title}: function {name}", fdef.node_def, result.plans.get(name),
                             _casts_of(section), args, rets)
        out.append(collapse(panel, max_nodes))
    return out


# ------------------------------------------------------------------------------ layout


@dataclass(frozen=True)
class _Layout:
    pos: dict[str, tuple[float, float]]
    width: float
    height: float


def _layout(panel: Panel) -> _Layout:
    """Layered layout: boxes on rows, edges pointing down where the graph allows.  Pure."""
    ids = [n.id for n in panel.nodes]
    index = {n: i for i, n in enumerate(ids)}
    succ: dict[int, list[int]] = {i: [] for i in range(len(ids))}
    for src_id, dst_id, _ in panel.edges:
        a, b = index[src_id], index[dst_id]
        if a != b and b not in succ[a]:
            succ[a].append(b)
    # Break cycles: drop DFS back edges (iterative DFS in node order).
    state = [0] * len(ids)  # 0 new, 1 on stack, 2 done
    dag: dict[int, list[int]] = {i: [] for i in succ}
    for root in range(len(ids)):
        if state[root]:
            continue
        stack = [(root, iter(succ[root]))]
        state[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
            elif state[nxt] == 0:
                dag[node].append(nxt)
                state[nxt] = 1
                stack.append((nxt, iter(succ[nxt])))
            elif state[nxt] == 2:
                dag[node].append(nxt)
    pred: dict[int, list[int]] = {i: [] for i in dag}
    for u, vs in dag.items():
        for v in vs:
            pred[v].append(u)
    # Longest-path layering in a stable topological order.
    indeg = {i: len(pred[i]) for i in dag}
    ready = deque(sorted(i for i, d in indeg.items() if d == 0))
    topo: list[int] = []
    while ready:
        u = ready.popleft()
        topo.append(u)
        for v in dag[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    layer = dict.fromkeys(dag, 0)
    for u in topo:
        for v in dag[u]:
            layer[v] = max(layer[v], layer[u] + 1)
    # Pull sources (constants, variables) down next to their first consumer.
    for u in topo:
        if not pred[u] and dag[u]:
            layer[u] = max(0, min(layer[v] for v in dag[u]) - 1)
    rows: dict[int, list[int]] = {}
    for i in range(len(ids)):
        rows.setdefault(layer[i], []).append(i)
    order = {i: k for row in rows.values() for k, i in enumerate(row)}
    levels = sorted(rows)
    for sweep in range(4):
        downward = sweep % 2 == 0
        for lv in (levels if downward else reversed(levels)):
            row = rows[lv]
            nbrs = pred if downward else dag

            def bary(i: int, nbrs: dict[int, list[int]] = nbrs) -> float:
                # Mean position of the neighbours in the layer just swept.
                ns = [order[n] for n in nbrs[i]]
                return sum(ns) / len(ns) if ns else float(order[i])

            row.sort(key=lambda i: (bary(i), order[i]))
            for k, i in enumerate(row):
                order[i] = k
    # A wide layer (dozens of constants) wraps onto several lines so the drawing stays
    # readable; the lines of one layer are drawn closer together.
    lines = [(lv, row[k:k + _MAX_ROW]) for lv in levels for k in range(0, len(rows[lv]) or 1, _MAX_ROW)
             for row in (rows[lv],)]
    widest = max((len(r) for _, r in lines), default=1)
    width = widest * (_W + _GAP_X) - _GAP_X + 2 * _MARGIN
    pos = {}
    y = float(_MARGIN)
    for n, (lv, row) in enumerate(lines):
        if n and lines[n - 1][0] != lv:
            y += _GAP_Y
        offset = (width - (len(row) * (_W + _GAP_X) - _GAP_X)) / 2
        for k, i in enumerate(row):
            pos[ids[i]] = (offset + k * (_W + _GAP_X), y)
        y += _H + _GAP_Y / 3
    height = y - _GAP_Y / 3 + _MARGIN
    return _Layout(pos, max(width, 2 * _MARGIN + _W), max(height, 2 * _MARGIN + _H))


# ------------------------------------------------------------------------------ SVG / HTML

_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff\ufffe\uffff]")


def _esc(text: str) -> str:
    """Escape for XML/HTML text and attributes; characters XML forbids become U+FFFD."""
    return html.escape(_XML_BAD.sub("\ufffd", text), quote=True)


_STYLE = (
    "text{font-family:Helvetica,Arial,sans-serif;font-size:11px;fill:#212121}"
    ".sub{font-size:9.5px;fill:#424242}.title{font-size:14px;font-weight:bold}"
    ".note{font-size:11px;fill:#616161}.edge{fill:none;stroke:#9e9e9e;stroke-width:1.2}"
    ".control{stroke-dasharray:4 3}rect.box{stroke:#616161;stroke-width:1}"
    "rect.cast{stroke:#6a1b9a;stroke-width:2}rect.group{stroke:#37474f;stroke-width:1.5}"
)


def _legend_svg(y: float) -> tuple[str, float]:
    parts = []
    x = float(_MARGIN)
    for color, text in KINDS.values():
        parts.append(f'<rect x="{x}" y="{y}" width="14" height="14" fill="{color}" stroke="#616161"/>'
                     f'<text x="{x + 19}" y="{y + 11}">{_esc(text)}</text>')
        x += 24 + 6.2 * len(text)
    return "".join(parts), x


def _panel_svg(panel: Panel, top: float) -> tuple[str, float, float]:
    """SVG elements of one panel starting at ``top``; returns (markup, width, height)."""
    lay = _layout(panel)
    y0 = top + 24 + (16 if panel.note else 0)
    out = [f'<text class="title" x="{_MARGIN}" y="{top + 16}">{_esc(panel.title)}</text>']
    if panel.note:
        out.append(f'<text class="note" x="{_MARGIN}" y="{top + 32}">{_esc(panel.note)}</text>')
    for u, v, control in panel.edges:
        if u not in lay.pos or v not in lay.pos:
            continue
        (x1, y1), (x2, y2) = lay.pos[u], lay.pos[v]
        sx, sy, ex, ey = x1 + _W / 2, y0 + y1 + _H, x2 + _W / 2, y0 + y2
        if ey <= sy:  # an edge going up (a broken cycle): leave from the side
            sx, sy = x1 + _W, y0 + y1 + _H / 2
        mid = (sy + ey) / 2
        cls = "edge control" if control else "edge"
        out.append(f'<path class="{cls}" marker-end="url(#arrow)" '
                   f'd="M{sx:.1f},{sy:.1f} C{sx:.1f},{mid:.1f} {ex:.1f},{mid:.1f} {ex:.1f},{ey:.1f}"/>')
    for n in panel.nodes:
        x, y = lay.pos[n.id]
        y += y0
        out.append(f'<g class="node k-{n.kind}"><title>{_esc(n.detail)}</title>')
        if n.kind == "group":
            total = sum(c for _, c in n.counts) or 1
            cx = x
            for kind, count in n.counts:
                w = _W * count / total
                out.append(f'<rect x="{cx:.1f}" y="{y}" width="{w:.1f}" height="{_H}" fill="{KINDS[kind][0]}"/>')
                cx += w
            out.append(f'<rect class="box group" x="{x}" y="{y}" width="{_W}" height="{_H}" rx="6" fill="none"/>')
        else:
            cls = "box cast" if n.kind == "cast" else "box"
            out.append(f'<rect class="{cls}" x="{x}" y="{y}" width="{_W}" height="{_H}" rx="6" '
                       f'fill="{KINDS[n.kind][0]}"/>')
        out.append(f'<text x="{x + 6}" y="{y + 16}">{_esc(n.label)}</text>'
                   f'<text class="sub" x="{x + 6}" y="{y + 31}">{_esc(n.sublabel[:34])}</text></g>')
    return "".join(out), lay.width, y0 - top + lay.height


def to_svg(panels: Sequence[Panel], *, title: str = "amp_rewrite", standalone: bool = True) -> str:
    """One SVG document with a legend and the panels stacked vertically.  Pure."""
    legend, legend_w = _legend_svg(_MARGIN + 22)
    body = [f'<text class="title" x="{_MARGIN}" y="{_MARGIN + 12}">{_esc(title)}</text>', legend]
    top = float(_MARGIN + 46)
    width = legend_w + _MARGIN
    for panel in panels:
        markup, w, h = _panel_svg(panel, top)
        body.append(markup)
        width = max(width, w)
        top += h + 20
    head = ('<?xml version="1.0" encoding="UTF-8"?>\n' if standalone else "")
    return (
        f'{head}<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{top:.0f}" '
        f'viewBox="0 0 {width:.0f} {top:.0f}">'
        f'<style>{_STYLE}</style>'
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#9e9e9e"/>'
        '</marker></defs>'
        f'<rect width="100%" height="100%" fill="#ffffff"/>{"".join(body)}</svg>\n'
    )


def _table(graph: str, section: Mapping[str, Any]) -> str:
    """An HTML table of a report section's allow and deny decisions and its casts."""
    rows = []
    for name, node in section.get("nodes", {}).items():
        if node["color"] in ("allow", "deny"):
            rows.append(f"<tr class='k-{_esc(node['color'])}'><td>{_esc(name)}</td><td>{_esc(node['op'])}</td>"
                        f"<td>{_esc(node['color'])}</td><td>{_esc(node['dtype'])}</td>"
                        f"<td>{_esc(node['reason'])}</td></tr>")
    for cast in section.get("casts", ()):
        rows.append(f"<tr class='k-cast'><td>{_esc(cast['name'])}</td><td>Cast</td><td>inserted</td>"
                    f"<td>{_esc(cast['dtype'])}</td><td>reads {_esc(cast['source'])}</td></tr>")
    if not rows:
        return ""
    return (f"<details><summary>{_esc(graph)}: {len(rows)} decisions (allow, deny, casts)</summary>"
            "<table><tr><th>node</th><th>op</th><th>decision</th><th>dtype</th><th>why</th></tr>"
            + "".join(rows) + "</table></details>")


def to_html(panels: Sequence[Panel], *, title: str = "amp_rewrite", summary: str = "",
            tables: Sequence[str] = ()) -> str:
    """A self-contained HTML page: summary, the SVG drawing and decision tables.  Pure.

    Every string from the model is escaped; the page allows no scripts (CSP)."""
    css = ("body{font-family:Helvetica,Arial,sans-serif;margin:20px;color:#212121}"
           "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;"
           "text-align:left}details{margin:8px 0}.k-allow td:nth-child(3){background:#66bb6a}"
           ".k-deny td:nth-child(3){background:#ef5350}.k-cast td:nth-child(3){background:#ba68c8}"
           ".drawing{overflow:auto;border:1px solid #ddd}")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; img-src data:\">"
        f"<title>{_esc(title)}</title><style>{css}</style></head><body>"
        f"<h1>{_esc(title)}</h1><p>{_esc(summary)}</p>"
        f"<div class=\"drawing\">{to_svg(panels, title=title, standalone=False)}</div>"
        + "".join(tables) + "</body></html>\n"
    )


# ------------------------------------------------------------------------------ DOT


def _dot_str(text: str) -> str:
    """A DOT double-quoted string.  Backslashes are doubled, so graphviz's escapes (``\\N``,
    ``\\l``...) cannot be injected; control characters are dropped."""
    text = _XML_BAD.sub("\ufffd", text.replace("\r", ""))
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(panels: Sequence[Panel], *, title: str = "amp_rewrite") -> str:
    """Graphviz DOT text, one cluster per panel.  Node ids are generated (``p0n3``), names
    only appear in escaped labels and tooltips.  Pure."""
    lines = ["digraph amp_rewrite {",
             f"  graph [label={_dot_str(title)}, labelloc=t, rankdir=TB, fontname=Helvetica];",
             '  node [shape=box, style="rounded,filled", fontname=Helvetica, fontsize=10];',
             "  edge [color=\"#9e9e9e\"];"]
    for p, panel in enumerate(panels):
        ids = {n.id: f"p{p}n{i}" for i, n in enumerate(panel.nodes)}
        label = panel.title + (f"\n{panel.note}" if panel.note else "")
        lines.append(f"  subgraph cluster_{p} {{")
        lines.append(f"    label={_dot_str(label)};")
        for n in panel.nodes:
            color = KINDS["unchanged" if n.kind == "group" else n.kind][0]
            if n.kind == "group" and n.counts:
                color = KINDS[max(n.counts, key=lambda kc: kc[1])[0]][0]
            extra = ", penwidth=2, color=\"#6a1b9a\"" if n.kind == "cast" else ""
            extra += ", peripheries=2" if n.kind == "group" else ""
            lines.append(f"    {ids[n.id]} [label={_dot_str(n.label + chr(10) + n.sublabel)}, "
                         f"fillcolor={_dot_str(color)}, tooltip={_dot_str(n.detail)}{extra}];")
        lines.append("  }")
        for u, v, control in panel.edges:
            style = " [style=dashed]" if control else ""
            lines.append(f"  {ids[u]} -> {ids[v]}{style};")
    lines.append("}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ files


def graph_format(path: str | os.PathLike[str]) -> str:
    """``"svg"``, ``"html"`` or ``"dot"`` from a file name; :class:`AmpRewriteError` otherwise."""
    ext = os.path.splitext(os.fspath(path))[1].lower()
    fmt = {".svg": "svg", ".html": "html", ".htm": "html", ".dot": "dot", ".gv": "dot"}.get(ext)
    if fmt is None:
        raise AmpRewriteError(f"--graph {os.fspath(path)}: unknown drawing format {ext or '(none)'!r}; "
                              "use .svg, .html or .dot")
    return fmt


def _results(rewrite: "ModelRewrite | RewriteResult") -> list[tuple[str, "RewriteResult"]]:
    graphs = getattr(rewrite, "graphs", None)
    if graphs is None:
        return [("graph", rewrite)]  # type: ignore[list-item]
    return [(g.label, g.result) for g in graphs]


def render_file(rewrite: "ModelRewrite | RewriteResult", path: str | os.PathLike[str], *,
                max_nodes: int = DEFAULT_MAX_NODES) -> bytes:
    """The drawing of ``rewrite`` (a model rewrite or one :class:`RewriteResult`) in the
    format ``path`` names, as bytes.  Writes nothing."""
    fmt = graph_format(path)
    results = _results(rewrite)
    panels = [p for label, r in results for p in panels_for(r, title=label, max_nodes=max_nodes)]
    report = rewrite.report
    title = f"amp_rewrite: {report.get('input', 'graph')}" if "input" in report else "amp_rewrite"
    if fmt == "svg":
        return to_svg(panels, title=title).encode("utf-8")
    if fmt == "dot":
        return to_dot(panels, title=title).encode("utf-8")
    summary = (f"converted {report['converted_nodes']} of {report['total_nodes']} nodes to "
               f"{report['precision']}; {report['casts_to_low']} cast(s) to {report['precision']}, "
               f"{report['casts_to_high']} to float32; target {report['target']}, lists {report['lists']}")
    tables = []
    for label, r in results:
        tables.append(_table(f"{label}: main graph", r.report))
        for fname, section in r.report.get("functions", {}).items():
            tables.append(_table(f"{label}: function {fname}", section))
    return to_html(panels, title=title, summary=summary, tables=[t for t in tables if t]).encode("utf-8")


# ------------------------------------------------------------------------------ TensorBoard


def _annotated(result: "RewriteResult") -> Any:
    """A copy of the rewritten GraphDef whose nodes carry an ``_amp_rewrite`` string attr with
    their decision, which TensorBoard shows in the node's info panel."""
    gd = type(result.graph_def)()
    gd.CopyFrom(result.graph_def)

    def annotate(node_defs: Iterable[Any], section: Mapping[str, Any]) -> None:
        nodes = section.get("nodes", {})
        casts = {c["name"]: c for c in section.get("casts", ())}
        for nd in node_defs:
            if nd.name in casts:
                text = f"cast inserted by amp_rewrite (to {casts[nd.name]['dtype']})"
            elif nd.name in nodes:
                d = nodes[nd.name]
                text = f"{d['color']} {d['dtype']}: {d['reason']}"
            else:
                continue
            nd.attr["_amp_rewrite"].s = text.encode("utf-8")

    annotate(gd.node, result.report)
    functions = result.report.get("functions", {})
    for fdef in gd.library.function:
        if fdef.signature.name in functions:
            annotate(fdef.node_def, functions[fdef.signature.name])
    return gd


def _event_file(graph_def: Any, wall_time: float) -> bytes:
    """A TensorBoard event file (TFRecord of ``Event`` protos) holding ``graph_def``."""
    import tensorflow as tf
    from tensorflow.core.util import event_pb2

    events = [
        event_pb2.Event(wall_time=wall_time, file_version="brain.Event:2"),
        event_pb2.Event(wall_time=wall_time, step=0, graph_def=graph_def.SerializeToString(deterministic=True)),
    ]
    # TFRecord framing needs masked CRC32C; TensorFlow's writer provides it.
    with tempfile.TemporaryDirectory(prefix="amp-rewrite-tb-") as tmp:
        path = os.path.join(tmp, "events")
        with tf.io.TFRecordWriter(path) as writer:
            for event in events:
                writer.write(event.SerializeToString())
        with open(path, "rb") as f:
            return f.read()


def tensorboard_files(rewrite: "ModelRewrite | RewriteResult", *, before: Any = None,
                      wall_time: float | None = None) -> dict[str, bytes]:
    """Event files for TensorBoard's graph dashboard, keyed by path relative to the log dir:
    ``before/events.out.tfevents.<time>.amp-rewrite`` and ``after/...`` (one run each; with
    several meta graphs, ``before-<label>``...).  For a single :class:`RewriteResult`, pass
    the input GraphDef as ``before`` to get the ``before`` run.  Writes nothing."""
    wall = time.time() if wall_time is None else wall_time
    results = _results(rewrite)
    graphs = getattr(rewrite, "graphs", None)
    befores = [g.before for g in graphs] if graphs is not None else [before]
    files: dict[str, bytes] = {}
    name = f"events.out.tfevents.{int(wall)}.amp-rewrite"
    for (label, result), source in zip(results, befores, strict=True):
        suffix = "" if len(results) == 1 else "-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_")
        if source is not None:
            files[f"before{suffix}/{name}"] = _event_file(source, wall)
        files[f"after{suffix}/{name}"] = _event_file(_annotated(result), wall)
    return files
