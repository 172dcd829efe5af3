"""Pictures of a rewrite: SVG, HTML and Graphviz DOT drawings, and TensorBoard event files.

A drawing shows the *rewritten* graph with every node coloured by its decision (allow,
infer, deny, clear, unchanged), inserted Casts marked, and function arguments/results drawn
as boundary nodes.  One panel is drawn per graph that changed: the main graph and each
function of the library with a converted node or a Cast (a TF2 SavedModel's work happens in
its functions).  A panel with more than ``max_nodes`` nodes is collapsed by name scope: scopes
are opened from the top, largest first, while the drawing stays within ``max_nodes`` boxes
(:func:`collapse`), and each closed box shows how many of its nodes got each decision.

With a SavedModel's signatures (``render_file`` reads them from the report), each panel is
titled by the signature keys that run it.  Labels are shortened in the middle, keeping the
start and the layer and op at the end; the full name is in each box's ``<title>``.

The layout is a simple layered one computed here (no graphviz binary needed): cycles are
broken by reversing DFS back edges, layers come from longest paths (sources pulled down to
just above their first consumer), and nodes in a layer are ordered by a few barycentre
sweeps.  A tall drawing is wrapped into columns (the layer sequence read left to right) so
that it stays near 3:2.  Everything is deterministic: the same rewrite gives the same bytes.
The HTML page puts the summary and the decision tables first, then one drawing per panel.

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
import math
import os
import re
import tempfile
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Literal, Mapping, Sequence

from ..graph import dtypes as dt
from ..errors import AmpRewriteError
from ..graph.tensor_names import parse_function_input, parse_graph_input

if TYPE_CHECKING:  # pragma: no cover
    from ..api import RewriteResult
    from ..models.saved_model import ModelRewrite

__all__ = [
    "DrawNode",
    "Panel",
    "KINDS",
    "panels_for",
    "to_svg",
    "to_html",
    "legend_svg",
    "panel_svg",
    "BARS_LEGEND",
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
_W, _H, _GAP_X, _GAP_Y, _MARGIN = 188, 40, 22, 38, 16
_LABEL_CHARS = 29  # characters of a box's first line (11 px Helvetica in _W - 12 px)
_SUB_CHARS = 34  # characters of its second line (9.5 px)
_MIN_HEAD = 4  # characters a shortened label keeps of its start, at least
_HUB = 12  # a collapsed box with more control edges than this (in or out) is a hub
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
    """One graph to draw: boxes, edges ``(src, dst, is_control)`` and a note.

    ``signatures`` are the signature keys that run this graph (the title names them);
    ``subtitle`` says which graph it is (meta graph and function name)."""

    title: str
    nodes: tuple[DrawNode, ...]
    edges: tuple[tuple[str, str, bool], ...]
    note: str = ""
    subtitle: str = ""
    signatures: tuple[str, ...] = ()


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


def _middle(text: str, limit: int = _LABEL_CHARS) -> str:
    """``text`` shortened to ``limit`` characters by an ellipsis in the middle.  Pure.

    Both ends are kept, never cut: the start (the model or outer scope) and as many whole
    trailing path components as fit, at least the last two (the Keras layer and the op), so
    ``mobilenetv2_1.00_224_1/block_16_expand_BN_1/`` reads ``mobile\u2026/block_16_expand_BN_1/``.
    When even the last components do not fit, the head keeps ``_MIN_HEAD`` characters and
    the rest of the room goes to the end, the most specific part."""
    if len(text) <= limit:
        return text
    room = limit - 1  # the ellipsis takes one character
    # The longest suffix starting at a "/" that leaves _MIN_HEAD characters of the head and
    # holds the last two components (layer and op), or the last one of a two-part name.
    want = min(2, text.strip("/").count("/"))
    for i, ch in enumerate(text):
        if (ch == "/" and i >= _MIN_HEAD and len(text) - i <= room - _MIN_HEAD and text[i:].strip("/")
                and text[i:].strip("/").count("/") + 1 >= want):
            return text[:room - (len(text) - i)] + "\u2026" + text[i:]
    return text[:_MIN_HEAD] + "\u2026" + text[len(text) - (room - _MIN_HEAD):]


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


def _variables_into_layers(panel: Panel, owner: dict[str, str]) -> None:
    """Move each function argument that feeds only one name-scope box into that box.

    A TF2 function takes every variable as a captured argument; drawn as one "arguments"
    box, it would send an edge to every layer.  A variable read by one layer belongs to that
    layer.  Mutates ``owner`` (``{node id: box id}``)."""
    feeds: dict[str, set[str]] = {}
    for u, v, _ in panel.edges:
        feeds.setdefault(u, set()).add(owner[v])
    for n in panel.nodes:
        if n.kind == "io" and n.sublabel == "argument" and len(boxes := feeds.get(n.id, ())) == 1:
            (box,) = boxes
            if box.endswith(" (scope)"):
                owner[n.id] = box


def _drop_control_hubs(nodes: list[DrawNode], edges: list[tuple[str, str, bool]]) -> list[tuple[str, str, bool]]:
    """Edges without the control edges of hubs: boxes with more than ``_HUB`` control edges
    in (or out), such as the ``NoOp`` every layer's variable reads precede.  Drawn, they
    would cross the whole picture; the hub's second line counts them instead.  Mutates
    ``nodes`` (the hubs' sublabel and detail) and returns the new edge list."""
    fan_in = Counter(v for _, v, control in edges if control)
    fan_out = Counter(u for u, _, control in edges if control)
    hubs = {b for b, c in (fan_in + fan_out).items() if max(fan_in[b], fan_out[b]) > _HUB}
    for k, n in enumerate(nodes):
        if n.id in hubs:
            ins, outs = fan_in[n.id], fan_out[n.id]
            text = ", ".join(t for t in (f"control from {ins} boxes" if ins > _HUB else "",
                                         f"control to {outs} boxes" if outs > _HUB else "") if t)
            op = n.sublabel.split(" \u00b7 ")[0]
            nodes[k] = DrawNode(n.id, n.label, f"{op} \u00b7 {text}", n.kind,
                                f"{n.detail}\n{text} (not drawn)", n.counts)
    return [(u, v, c) for u, v, c in edges
            if not (c and ((v in hubs and fan_in[v] > _HUB) or (u in hubs and fan_out[u] > _HUB)))]


def collapse(panel: Panel, max_nodes: int = DEFAULT_MAX_NODES) -> Panel:
    """Collapse ``panel`` by name scope when it has more than ``max_nodes`` boxes.  Pure.

    Top-level scopes are opened one by one, largest first, for as long as the drawing stays
    within ``max_nodes`` boxes (for a Keras model: one box per layer); each box left closed
    shows how many of its nodes got each decision.  A variable read by one layer is drawn in
    that layer's box, and a box of a single node is that node."""
    if len(panel.nodes) <= max_nodes:
        return panel
    owner = _cut(panel.nodes, max_nodes)
    _variables_into_layers(panel, owner)
    members: dict[str, list[DrawNode]] = {}
    for n in panel.nodes:
        members.setdefault(owner[n.id], []).append(n)
    nodes = []
    for gid, group in members.items():
        if len(group) == 1:
            owner[group[0].id] = group[0].id
            nodes.append(group[0])
            continue
        # The bars show decisions; a layer's variables (function arguments) are counted
        # apart, unless the box holds nothing else (the arguments box).
        counts = Counter(m.kind for m in group)
        args = counts.pop("io", 0) if len(group) > counts["io"] else 0
        ordered = tuple((k, counts[k]) for k in KINDS if counts[k])
        summary = ", ".join(f"{c} {k}" for k, c in ordered) + (f"; {args} arguments" if args else "")
        name = gid.rsplit(" (", 1)[0].strip() or gid.strip(" ()")
        size = f"{len(group) - args} nodes" + (f" + {args} arguments" if args else "")
        nodes.append(DrawNode(gid, _middle(name), size, "group", f"{name}\n{size}: {summary}", ordered))
    seen = set()
    edges = []
    for u, v, control in panel.edges:
        a, b = owner[u], owner[v]
        if a != b and (a, b) not in seen:
            seen.add((a, b))
            edges.append((a, b, control))
    edges = _drop_control_hubs(nodes, edges)
    note = f"{len(panel.nodes)} nodes collapsed by name scope into {len(nodes)} boxes"
    return Panel(panel.title, tuple(nodes), tuple(edges), note, panel.subtitle, panel.signatures)


def _casts_of(section: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """``{cast name: (dtype, tensor it reads)}`` from a report section."""
    return {c["name"]: (c["dtype"], c["source"]) for c in section.get("casts", ())}


def _titled(panel: Panel, keys: Sequence[str]) -> Panel:
    """``panel`` titled by the signature keys that run it (unchanged without any).  Pure."""
    if not keys:
        return panel
    title = ("signature " if len(keys) == 1 else "signatures ") + ", ".join(keys)
    return Panel(title, panel.nodes, panel.edges, panel.note, panel.title, tuple(keys))


def panels_for(result: "RewriteResult", *, title: str = "graph", which: str = "changed",
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


# ------------------------------------------------------------------------------ layout


@dataclass(frozen=True)
class _Layout:
    """Box positions (top-left corners) and size of one panel's drawing.

    A long graph is wrapped into columns: ``column`` gives each box's column and
    ``columns`` each column's ``(left, right)`` x; edges between columns run in the gaps
    between them and, to skip columns, along the strip above them."""

    pos: dict[str, tuple[float, float]]
    width: float
    height: float
    column: dict[str, int]
    columns: tuple[tuple[float, float], ...]


_MAX_COLUMN = 1300  # px: a drawing taller than this is wrapped into columns
_MAX_COLUMNS = 40
_COL_GAP = 56  # px between columns: the channel for edges from one column to the next
_ASPECT = 1.5  # width / height the column count aims at (a landscape screen)
_MAX_SIDE = 2800  # px: a column count that keeps both sides below this is preferred


def _acyclic(succ: Mapping[int, Sequence[int]]) -> dict[int, list[int]]:
    """``succ`` without its DFS back edges (iterative DFS in node order): a DAG.  Pure."""
    state = dict.fromkeys(succ, 0)  # 0 new, 1 on stack, 2 done
    dag: dict[int, list[int]] = {i: [] for i in succ}
    for root in succ:
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
    return dag


def _layers(panel: Panel) -> list[list[int]]:
    """Indices of ``panel.nodes`` by layer, top first, each layer ordered left to right.

    Cycles are broken, layers come from longest paths (sources pulled down to just above
    their first consumer), and a few barycentre sweeps order each layer.  Pure."""
    index = {n.id: i for i, n in enumerate(panel.nodes)}
    succ: dict[int, list[int]] = {i: [] for i in range(len(panel.nodes))}
    for src_id, dst_id, _ in panel.edges:
        a, b = index[src_id], index[dst_id]
        if a != b and b not in succ[a]:
            succ[a].append(b)
    dag = _acyclic(succ)
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
    for i in range(len(panel.nodes)):
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
    return [rows[lv] for lv in levels]


def _block_size(row: Sequence[int]) -> tuple[float, float]:
    """``(width, height)`` of one layer: it wraps onto lines of ``_MAX_ROW`` boxes."""
    lines = max(1, -(-len(row) // _MAX_ROW))
    return min(len(row), _MAX_ROW) * (_W + _GAP_X) - _GAP_X, lines * _H + (lines - 1) * _GAP_Y / 3


def _pack(sizes: Sequence[tuple[float, float]], target: float) -> list[list[int]]:
    """Consecutive layers into columns about ``target`` px tall (greedy, in order).  Pure."""
    cols: list[list[int]] = [[]]
    height = 0.0
    for i, (_, h) in enumerate(sizes):
        if cols[-1] and height + _GAP_Y + h / 2 > target:
            cols.append([])
            height = -_GAP_Y
        cols[-1].append(i)
        height += _GAP_Y + h
    return cols


def _columns(sizes: Sequence[tuple[float, float]]) -> list[list[int]]:
    """Layers split into columns: one column while the drawing is at most ``_MAX_COLUMN``
    px tall, else the column count whose drawing comes closest to ``_ASPECT``, among those
    no side of which is over ``_MAX_SIDE`` px when there are any.  Pure."""
    natural = sum(h for _, h in sizes) + _GAP_Y * (len(sizes) - 1)
    if natural <= _MAX_COLUMN:
        return [list(range(len(sizes)))]
    best: tuple[tuple[bool, float], list[list[int]]] | None = None
    for count in range(1, min(len(sizes), _MAX_COLUMNS) + 1):
        cols = _pack(sizes, natural / count)
        width = sum(max(sizes[i][0] for i in c) for c in cols) + _COL_GAP * len(cols)
        height = max(sum(sizes[i][1] + _GAP_Y for i in c) for c in cols)
        score = (max(width, height) > _MAX_SIDE, abs(math.log(width / height / _ASPECT)))
        if best is None or score < (best[0][0], best[0][1] - 1e-9):
            best = (score, cols)
    assert best is not None
    return best[1]


def _layout(panel: Panel) -> _Layout:
    """Layered layout: boxes on rows, edges pointing down where the graph allows, a long
    graph wrapped into columns read left to right.  Pure."""
    ids = [n.id for n in panel.nodes]
    rows = _layers(panel)
    sizes = [_block_size(row) for row in rows]
    cols = _columns(sizes) if sizes else []
    # With several columns, the first one also gets a channel on its left (edges that go
    # back to it).
    x = float(_MARGIN) + (_COL_GAP / 2 if len(cols) > 1 else 0)
    pos: dict[str, tuple[float, float]] = {}
    column: dict[str, int] = {}
    extents = []
    bottom = 0.0
    for c, col in enumerate(cols):
        col_w = max(max(sizes[i][0] for i in col), _W)
        y = float(_MARGIN)
        for i in col:
            # A wide layer (dozens of constants) wraps onto several lines; the lines of
            # one layer are drawn closer together.
            for k in range(0, len(rows[i]), _MAX_ROW):
                line = rows[i][k:k + _MAX_ROW]
                offset = x + (col_w - (len(line) * (_W + _GAP_X) - _GAP_X)) / 2
                for j, n in enumerate(line):
                    pos[ids[n]] = (offset + j * (_W + _GAP_X), y)
                    column[ids[n]] = c
                y += _H + _GAP_Y / 3
            y += _GAP_Y - _GAP_Y / 3
        bottom = max(bottom, y - _GAP_Y)
        extents.append((x, x + col_w))
        x += col_w + _COL_GAP
    width = x - _COL_GAP + _MARGIN + (_COL_GAP / 2 if len(cols) > 1 else 0)
    return _Layout(pos, max(width, 2 * _MARGIN + _W), max(bottom + _MARGIN, 2 * _MARGIN + _H),
                   column, tuple(extents))


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


#: What a collapsed box's bars mean, shown in the legend next to a sample box.
BARS_LEGEND = ("collapsed box: a name scope (for a Keras model, one layer) drawn as one box; "
               "each coloured bar is as wide as the share of its nodes with that decision")
_BARS_SAMPLE = (("allow", 5), ("infer", 2), ("unchanged", 2), ("cast", 1))


def _group_box(x: float, y: float, counts: Sequence[tuple[str, int]], w: float = _W) -> str:
    """A collapsed box at ``(x, y)``: one bar per kind, as wide as its share of ``counts``."""
    total = sum(c for _, c in counts) or 1
    out = []
    cx = x
    for kind, count in counts:
        bar = w * count / total
        out.append(f'<rect x="{cx:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{_H}" fill="{KINDS[kind][0]}"/>')
        cx += bar
    out.append(f'<rect class="box group" x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{_H}" rx="6" fill="none"/>')
    return "".join(out)


def _legend_svg(y: float, max_width: float) -> tuple[str, float, float]:
    """The legend at ``y``: one swatch per kind in a grid no wider than ``max_width``
    (two columns at least), then a sample collapsed box explaining the bars.  Returns
    ``(markup, width, height)``."""
    cell = 24 + 6.2 * max(len(text) for _, text in KINDS.values())
    per_line = max(2, int((max_width - 2 * _MARGIN) // cell))
    parts = []
    for k, (color, text) in enumerate(KINDS.values()):
        x, yy = _MARGIN + (k % per_line) * cell, y + (k // per_line) * 20
        parts.append(f'<rect x="{x:.1f}" y="{yy}" width="14" height="14" fill="{color}" stroke="#616161"/>'
                     f'<text x="{x + 19:.1f}" y="{yy + 11}">{_esc(text)}</text>')
    top = y + -(-len(KINDS) // per_line) * 20 + 6
    parts.append(_group_box(_MARGIN, top, _BARS_SAMPLE, 120))
    parts.append(f'<text class="sub" x="{_MARGIN + 6}" y="{top + 16}">example/layer/</text>'
                 f'<text class="sub" x="{_MARGIN + 6}" y="{top + 31}">10 nodes</text>')
    bars = ", ".join(f"{c} {k}" for k, c in _BARS_SAMPLE)
    parts.append(f'<text x="{_MARGIN + 130}" y="{top + 16}">{_esc(BARS_LEGEND)}</text>'
                 f'<text x="{_MARGIN + 130}" y="{top + 31}">{_esc(f"(here {bars}); hover a box for its counts")}'
                 '</text>')
    width = max(min(per_line, len(KINDS)) * cell, 130 + 6.2 * len(BARS_LEGEND)) + 2 * _MARGIN
    return "".join(parts), width, top + _H - y


def _edge_path(lay: _Layout, u: str, v: str, y0: float, lane: int) -> str:
    """The SVG path of an edge ``u -> v``: a curve within a column; between columns, out
    below ``u``, along the gap after its column (or before, going back), over the columns
    in between along the top strip, and into ``v`` from above.  ``lane`` spreads parallel
    runs in a gap a few px apart."""
    (x1, y1), (x2, y2) = lay.pos[u], lay.pos[v]
    sx, sy, ex, ey = x1 + _W / 2, y0 + y1 + _H, x2 + _W / 2, y0 + y2
    a, b = lay.column[u], lay.column[v]
    if a == b:
        if ey <= sy:  # an edge going up (a broken cycle): leave from the side
            sx, sy = x1 + _W, y0 + y1 + _H / 2
        mid = (sy + ey) / 2
        return f"M{sx:.1f},{sy:.1f} C{sx:.1f},{mid:.1f} {ex:.1f},{mid:.1f} {ex:.1f},{ey:.1f}"
    shift = (lane % 7 - 3) * 3
    out_x = (lay.columns[a][1] + _COL_GAP / 2 if b > a else lay.columns[a][0] - _COL_GAP / 2) + shift
    in_x = lay.columns[b][0] - _COL_GAP / 2 + shift
    below, above = sy + _GAP_Y / 2 + shift / 3, ey - _GAP_Y / 2 + shift / 3
    points = [(sx, sy), (sx, below), (out_x, below)]
    if out_x != in_x:
        strip = y0 + _MARGIN / 2 + shift / 3
        points += [(out_x, strip), (in_x, strip)]
    points += [(in_x, above), (ex, above), (ex, ey)]
    return "M" + " L".join(f"{px:.1f},{py:.1f}" for px, py in points)


def _panel_svg(panel: Panel, top: float, *, header: bool = True,
               arrow: str = "arrow") -> tuple[str, float, float]:
    """SVG elements of one panel starting at ``top``, with its title, subtitle and note
    unless ``header`` is off; edges end in the marker ``arrow``.  Returns (markup, width,
    height)."""
    lay = _layout(panel)
    lines = [(cls, text) for cls, text in (("title", panel.title), ("note", panel.subtitle),
                                           ("note", panel.note)) if text and header]
    out = [f'<text class="{cls}" x="{_MARGIN}" y="{top + 16 + 16 * k}">{_esc(text)}</text>'
           for k, (cls, text) in enumerate(lines)]
    y0 = top + (8 + 16 * len(lines) if lines else 0)
    for lane, (u, v, control) in enumerate(panel.edges):
        if u not in lay.pos or v not in lay.pos:
            continue
        cls = "edge control" if control else "edge"
        out.append(f'<path class="{cls}" marker-end="url(#{arrow})" d="{_edge_path(lay, u, v, y0, lane)}"/>')
    for n in panel.nodes:
        x, y = lay.pos[n.id]
        y += y0
        out.append(f'<g class="node k-{n.kind}"><title>{_esc(n.detail)}</title>')
        if n.kind == "group":
            out.append(_group_box(x, y, n.counts))
        else:
            cls = "box cast" if n.kind == "cast" else "box"
            out.append(f'<rect class="{cls}" x="{x}" y="{y}" width="{_W}" height="{_H}" rx="6" '
                       f'fill="{KINDS[n.kind][0]}"/>')
        out.append(f'<text x="{x + 6}" y="{y + 16}">{_esc(n.label)}</text>'
                   f'<text class="sub" x="{x + 6}" y="{y + 31}">{_esc(_middle(n.sublabel, _SUB_CHARS))}</text></g>')
    return "".join(out), lay.width, y0 - top + lay.height


def _svg_document(body: str, width: float, height: float, standalone: bool, arrow: str = "arrow") -> str:
    """An ``<svg>`` element (a document when ``standalone``) around ``body``, defining the
    arrow head marker ``arrow`` (ids must differ between the SVGs of one HTML page)."""
    head = ('<?xml version="1.0" encoding="UTF-8"?>\n' if standalone else "")
    return (
        f'{head}<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}">'
        f'<style>{_STYLE}</style>'
        f'<defs><marker id="{arrow}" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#9e9e9e"/>'
        '</marker></defs>'
        f'<rect width="100%" height="100%" fill="#ffffff"/>{body}</svg>' + ("\n" if standalone else "")
    )


def to_svg(panels: Sequence[Panel], *, title: str = "amp_rewrite", standalone: bool = True) -> str:
    """One SVG document with a legend and the panels stacked vertically.  Pure."""
    legend, width, legend_h = _legend_svg(_MARGIN + 22, 900)
    body = [f'<text class="title" x="{_MARGIN}" y="{_MARGIN + 12}">{_esc(title)}</text>', legend]
    top = _MARGIN + 22 + legend_h + 16
    for panel in panels:
        markup, w, h = _panel_svg(panel, top)
        body.append(markup)
        width = max(width, w)
        top += h + 20
    return _svg_document("".join(body), width, top, standalone)


def legend_svg() -> str:
    """The legend alone as an ``<svg>`` element (for the HTML page).  Pure."""
    legend, width, height = _legend_svg(4, 900)
    return _svg_document(legend, width, height + 8, standalone=False, arrow="arrow-legend")


def panel_svg(panel: Panel, number: int = 0) -> str:
    """One panel alone, without its header, as an ``<svg>`` element (for the HTML page,
    where it is panel ``number``).  Pure."""
    arrow = f"arrow-{number}"
    markup, width, height = _panel_svg(panel, 0, header=False, arrow=arrow)
    return _svg_document(markup, width, height, standalone=False, arrow=arrow)


def _table(graph: str, section: Mapping[str, Any]) -> str:
    """An HTML table of a report section's allow and deny decisions and its casts, open,
    in a box that scrolls past 24 rows ("" when there is nothing to list)."""
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
    return (f"<details open class='decisions'><summary>{_esc(graph)}: {len(rows)} decisions "
            "(allow, deny, casts)</summary><div class='scroll'>"
            "<table><tr><th>node</th><th>op</th><th>decision</th><th>dtype</th><th>why</th></tr>"
            + "".join(rows) + "</table></div></details>")


def _overview(report: Mapping[str, Any]) -> str:
    """An HTML table with one row per served signature of a model report (see
    docs/report.md): what it runs and how much of it was converted ("" for a GraphDef)."""
    rows = []
    for key, row in report.get("signatures", {}).items():
        rows.append(f"<tr><td>{_esc(key)}</td><td>{_esc(row.get('graph', ''))}</td>"
                    f"<td>{_esc(row.get('function') or '(main graph)')}</td>"
                    f"<td>{int(row['converted'])} of {int(row['total'])}</td>"
                    f"<td>{int(row['casts_to_low'])}</td><td>{int(row['casts_to_high'])}</td></tr>")
    if not rows:
        return ""
    return ("<table class='overview'><tr><th>signature</th><th>graph</th><th>function</th>"
            "<th>nodes converted</th><th>casts to low</th><th>casts to float32</th></tr>"
            + "".join(rows) + "</table>")


_CSS = ("body{font-family:Helvetica,Arial,sans-serif;margin:20px;color:#212121}"
        "h2{font-size:18px;margin:22px 0 8px}h3{font-size:15px;margin:18px 0 2px}"
        ".sub{color:#616161;font-size:13px;margin:2px 0 6px}"
        "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;"
        "text-align:left}th{background:#f5f5f5;position:sticky;top:0}details{margin:8px 0}"
        ".scroll{max-height:30em;overflow:auto;border:1px solid #ddd;display:inline-block;max-width:100%}"
        ".k-allow td:nth-child(3){background:#66bb6a}"
        ".k-deny td:nth-child(3){background:#ef5350}.k-cast td:nth-child(3){background:#ba68c8}"
        ".drawing{overflow:auto;border:1px solid #ddd;max-height:95vh}")


def to_html(panels: Sequence[Panel], *, title: str = "amp_rewrite", summary: str = "",
            tables: Sequence[str] = (), overview: str = "") -> str:
    """A self-contained HTML page: the summary, the per-signature ``overview`` table and the
    decision ``tables`` first (HTML from :func:`_overview` / :func:`_table`), then the
    legend and one drawing per panel, each under its own heading.  Pure.

    Every string from the model is escaped; the page allows no scripts (CSP)."""
    drawings = []
    for k, panel in enumerate(panels):
        sub = " \u00b7 ".join(t for t in (panel.subtitle, panel.note) if t)
        drawings.append(f"<section><h3>{_esc(panel.title)}</h3>"
                        + (f"<p class='sub'>{_esc(sub)}</p>" if sub else "")
                        + f"<div class=\"drawing\">{panel_svg(panel, k)}</div></section>")
    decisions = "".join(tables) or "<p>No node was converted and no Cast inserted.</p>"
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; img-src data:\">"
        f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_esc(title)}</h1><p>{_esc(summary)}</p>{overview}"
        f"<h2>Decisions</h2>{decisions}"
        f"<h2>Drawings</h2><p class='sub'>One drawing per graph that changed, titled by the "
        "signatures that run it. Hover a box for its full name and decision.</p>"
        f"{legend_svg()}{''.join(drawings)}</body></html>\n"
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


def _results(rewrite: "ModelRewrite | RewriteResult") -> list[tuple[str, "RewriteResult", dict[str, list[str]]]]:
    """``(label, result, {signature key: graphs it runs})`` per rewritten graph; the graphs
    are function names and ``""`` for the main graph (see :func:`panels_for`)."""
    graphs = getattr(rewrite, "graphs", None)
    if graphs is None:
        return [("graph", rewrite, {})]  # type: ignore[list-item]
    entries = rewrite.report.get("graphs", [])
    out = []
    for k, g in enumerate(graphs):
        rows = entries[k].get("summary", {}) if k < len(entries) else {}
        # A TF1 signature (no function) names main-graph tensors.
        sigs = {key: list(row["functions"]) + ([""] if row["function"] is None else [])
                for key, row in rows.items() if row["kind"] == "signature"}
        out.append((g.label, g.result, sigs))
    return out


def _heading(label: str, graph: str, sigs: Mapping[str, Sequence[str]]) -> tuple[tuple[str, ...], str]:
    """A decision table's heading: the signatures that run ``graph`` (sorted) and the text
    naming them and which graph it is."""
    keys = tuple(sorted(k for k, graphs in sigs.items() if graph in graphs))
    what = f"{label}: " + (f"function {graph}" if graph else "main graph")
    if not keys:
        return keys, what
    return keys, ("signature " if len(keys) == 1 else "signatures ") + ", ".join(keys) + f" ({what})"


def render_file(rewrite: "ModelRewrite | RewriteResult", path: str | os.PathLike[str], *,
                max_nodes: int = DEFAULT_MAX_NODES) -> bytes:
    """The drawing of ``rewrite`` (a model rewrite or one :class:`RewriteResult`) in the
    format ``path`` names, as bytes.  Writes nothing."""
    fmt = graph_format(path)
    results = _results(rewrite)
    panels = [p for label, r, sigs in results
              for p in panels_for(r, title=label, max_nodes=max_nodes, signatures=sigs)]
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
    for label, r, sigs in results:
        sections = [("", r.report), *r.report.get("functions", {}).items()]
        for graph, section in sections:
            keys, heading = _heading(label, graph, sigs)
            tables.append((not keys, keys[:1], len(tables), _table(heading, section)))
    # In the order of the drawings: by first signature key, graphs no signature runs last.
    return to_html(panels, title=title, summary=summary, tables=[t for *_, t in sorted(tables) if t],
                   overview=_overview(report)).encode("utf-8")


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
    results = [(label, result) for label, result, _ in _results(rewrite)]
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
