"""The layout of one panel (:func:`_layout`), computed here (no graphviz binary needed):
cycles broken by reversing DFS back edges, layers from longest paths (sources pulled down
to just above their first consumer), nodes in a layer ordered by a few barycentre sweeps,
and a tall drawing wrapped into columns so that it stays near 3:2.  Deterministic and
pure."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Mapping, Sequence

from .boxes import _GAP_X, _GAP_Y, _H, _MARGIN, _MAX_ROW, _W, Panel


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
