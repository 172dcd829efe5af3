"""Collapsing a large panel by name scope (:func:`collapse`): scopes opened from the top,
largest first, while the drawing stays within ``max_nodes`` boxes; a layer's variables
drawn in its box; control hubs counted instead of wired.  Pure."""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from .boxes import _HUB, DEFAULT_MAX_NODES, KINDS, DrawNode, Panel, _middle

__all__ = ["collapse"]


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
