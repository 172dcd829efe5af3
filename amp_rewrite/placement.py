"""Optimal precision placement as an s-t minimum cut.

A :class:`PlacementProblem` has one variable per type-attribute vertex: it runs in low
precision (the *source* side) or in float32 (the *sink* side).  Some vertices are fixed
(allow-list ops that must convert, deny paths that must not); the others are free.  The cost
of a colouring is

* a unary term per vertex: its estimated time in the chosen precision, and
* a term per *tensor*: one Cast (of the tensor's size) when the producer and any of its
  consumers disagree.  The rewrite inserts one Cast per (tensor, direction) and every
  consumer on the other side shares it, so the term is a hyperedge over the producer and all
  consumers, not a sum over edges.

Hyperedges become graph edges with Lawler's construction (two auxiliary nodes per tensor:
members -> in (infinite), in -> out (the Cast's cost), out -> members (infinite)); a
tensor with two members is a plain pair of opposite edges.  Since every term is a cut
function, a minimum s-t cut of that network is an optimal colouring: :func:`solve` is exact,
not a heuristic (``tests/test_optimal.py`` checks it against brute force).

Independent components are solved separately, so cost grows with the largest component.  A
tie between colourings goes to low precision, as TensorFlow's greedy passes would: the float32
side is the smallest sink side of a minimum cut (the vertices that still reach the sink in
the residual network).  Pure: nothing here knows TensorFlow or the IR.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import networkx as nx

__all__ = ["PlacementProblem", "solve", "objective", "FREE", "HIGH", "LOW"]

FREE, HIGH, LOW = -1, 0, 1

#: Costs are scaled to integers so the max-flow is exact and deterministic.
_SCALE = 16


@dataclass
class PlacementProblem:
    """Vertices ``0..n-1``; ``fixed[v]`` is FREE, HIGH or LOW.

    ``cost_high[v]``/``cost_low[v]`` are the unary costs; each entry of ``tensors`` is
    ``(members, cost)``: the vertices that produce or consume one tensor and the cost of a
    Cast of it.  Costs are non-negative; an infinite cost ties its members to one side (a
    group of vertices that cannot be separated by a Cast).
    """

    fixed: list[int]
    cost_high: list[float]
    cost_low: list[float]
    tensors: list[tuple[tuple[int, ...], float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.fixed)
        if len(self.cost_high) != n or len(self.cost_low) != n:
            raise ValueError("fixed, cost_high and cost_low must have one entry per vertex")


def objective(problem: PlacementProblem, low: Sequence[bool]) -> float:
    """Total cost of a colouring (``low[v]`` True = low precision).  Pure."""
    total = 0.0
    for v, is_low in enumerate(low):
        total += problem.cost_low[v] if is_low else problem.cost_high[v]
    for members, cost in problem.tensors:
        sides = {bool(low[m]) for m in members}
        if len(sides) > 1:
            total += cost
    return total


def _int(cost: float) -> int:
    return int(round(cost * _SCALE))


def solve(problem: PlacementProblem) -> list[bool]:
    """An optimal colouring: ``result[v]`` is True when ``v`` runs in low precision.  Pure.

    Fixed vertices keep their side.  Deterministic: the same problem gives the same answer.
    """
    n = len(problem.fixed)
    low = [f == LOW for f in problem.fixed]
    free = [v for v in range(n) if problem.fixed[v] == FREE]
    if not free:
        return low
    # Components of free vertices linked by tensors (fixed vertices do not link them: they
    # become the terminals).
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for members, _ in problem.tensors:
        fm = [m for m in members if problem.fixed[m] == FREE]
        for a in fm[1:]:
            ra, rb = find(fm[0]), find(a)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    comp_tensors: dict[int, list[int]] = {}
    for i, (members, _) in enumerate(problem.tensors):
        fm = [m for m in members if problem.fixed[m] == FREE]
        if fm:
            comp_tensors.setdefault(find(fm[0]), []).append(i)
    comps: dict[int, list[int]] = {}
    for v in free:
        comps.setdefault(find(v), []).append(v)
    for root in sorted(comps):
        for v, is_low in _solve_component(problem, comps[root], comp_tensors.get(root, [])).items():
            low[v] = is_low
    return low


def _solve_component(problem: PlacementProblem, verts: list[int], tensor_ids: list[int]) -> dict[int, bool]:
    fixed = problem.fixed
    g = nx.DiGraph()
    s, t = "s", "t"
    g.add_node(s)
    g.add_node(t)

    def add(u: object, v: object, cap: int | None) -> None:
        if cap is not None and cap <= 0:
            return
        if g.has_edge(u, v):
            if cap is None or "capacity" not in g[u][v]:
                g[u][v].pop("capacity", None)
            else:
                g[u][v]["capacity"] += cap
        elif cap is None:
            g.add_edge(u, v)
        else:
            g.add_edge(u, v, capacity=cap)

    for v in verts:
        g.add_node(v)
        d = _int(problem.cost_high[v]) - _int(problem.cost_low[v])
        if d > 0:
            add(s, v, d)  # paid when v ends on the float32 side
        elif d < 0:
            add(v, t, -d)  # paid when v ends on the low side
    for i in tensor_ids:
        members, cost = problem.tensors[i]
        w: int | None = None if math.isinf(cost) else _int(cost)  # None: an uncuttable edge
        if w is not None and w <= 0:
            continue
        nodes: list[object] = []
        has_low = has_high = False
        for m in members:
            if fixed[m] == LOW:
                has_low = True
            elif fixed[m] == HIGH:
                has_high = True
            elif m not in nodes:
                nodes.append(m)
        if has_low and has_high:
            if w is None:
                raise ValueError(f"tensor {i} ties vertices fixed to both sides")
            continue  # a Cast is needed whatever the free vertices do: a constant
        if has_low:
            nodes.append(s)
        if has_high:
            nodes.append(t)
        if len(nodes) < 2:
            continue
        if len(nodes) == 2:
            a, b = nodes
            add(a, b, w)
            add(b, a, w)
            continue
        x, y = ("in", i), ("out", i)
        for m in nodes:
            add(m, x, None)
            add(y, m, None)
        add(x, y, w)
    _, (source_side, _) = nx.minimum_cut(g, s, t, flow_func=nx.algorithms.flow.preflow_push)
    return {v: v in source_side for v in verts}
