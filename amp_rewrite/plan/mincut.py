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

A tie between colourings goes to low precision, as TensorFlow's greedy passes would: the
float32 side is the smallest sink side of a minimum cut (the vertices that still reach the
sink in the residual network of a maximum flow).  That set is unique -- it is the float32
side of every minimum cut at once -- so it does not depend on which maximum flow is found,
and the solver may take any exact route to it.  It takes a fast one, because graphs have
hundreds of thousands of vertices: vertices whose side a local bound settles are merged into
the terminals first (:meth:`_Network.reduce`), the rest splits into independent components,
and each is solved with Dinic's algorithm searching from the sink (:meth:`_Network.min_sink_side`),
in plain integer arrays.  On a 400,000-node chain that is linear; networkx's preflow-push,
used before, grew as ``n ** 1.7``.  Pure: nothing here knows TensorFlow or the IR.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

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

    Fixed vertices keep their side.  Deterministic: the same problem gives the same answer,
    and the answer does not depend on how the flow is found: a free vertex is float32
    exactly when it is float32 in *every* minimum cut (the smallest sink side, which is
    unique), so the reductions and the max-flow algorithm below are free to work in any
    order.
    """
    fixed = problem.fixed
    n = len(fixed)
    low = [f == LOW for f in fixed]
    if FREE not in fixed:
        return low
    net = _Network(problem)
    high = net.reduce()
    for comp in net.components():
        high.update(net.min_sink_side(comp))
    if net.flow >= net.big:
        # Only an uncuttable path from a low-fixed vertex to a float32-fixed one costs this.
        raise ValueError("vertices tied by uncuttable edges are fixed to both sides")
    for v in range(n):
        if fixed[v] == FREE:
            low[v] = v not in high
    return low


class _Network:
    """The s-t flow network of a :class:`PlacementProblem`, as integer capacities.

    Node ``v < n`` is vertex ``v`` (only free vertices get edges); tensor ``i`` with more
    than two members (after fixed members are replaced by the terminals) gets the Lawler
    pair ``n + 2i`` (in) and ``n + 2i + 1`` (out).  Terminal edges are kept apart, as
    ``src[x]`` (s -> x) and ``snk[x]`` (x -> t); the other edges in ``out[x]``/``into[x]``
    (neighbour -> capacity), with ``out_sum``/``in_sum`` their totals.

    An infinite capacity (an uncuttable tie) is stored as ``big``, one more than the total of
    every finite capacity: a cut through such an edge costs more than any cut through finite
    edges only, so the minimum cuts are the same, and all arithmetic stays exact integers.
    Mutated by :meth:`reduce` and :meth:`min_sink_side`; it never mutates the problem.
    """

    def __init__(self, problem: PlacementProblem) -> None:
        fixed = problem.fixed
        n = len(fixed)
        size = n + 2 * len(problem.tensors)
        self.n = n
        self.src = [0] * size
        self.snk = [0] * size
        self.out: list[dict[int, int] | None] = [None] * size
        self.into: list[dict[int, int] | None] = [None] * size
        self.out_sum = [0] * size
        self.in_sum = [0] * size
        self.nodes: list[int] = []  # nodes that have any edge, in creation order
        # Scaled costs first: ``big`` must exceed their total.
        unary = [(_int(problem.cost_high[v]) - _int(problem.cost_low[v])) if fixed[v] == FREE else 0
                 for v in range(n)]
        weights = [None if math.isinf(cost) else _int(cost) for _, cost in problem.tensors]
        self.big = 1 + sum(map(abs, unary)) + 2 * sum(w for w in weights if w is not None and w > 0)
        self.flow = 0  # flow sent so far (reductions cancel some; max flows add the rest)
        for v in range(n):
            if fixed[v] == FREE:
                self._node(v)
                d = unary[v]
                if d > 0:
                    self.src[v] += d  # paid when v ends on the float32 side
                elif d < 0:
                    self.snk[v] += -d  # paid when v ends on the low side
        S, T = -1, -2  # the terminals, while the edges of a tensor are collected
        for i, (members, _) in enumerate(problem.tensors):
            w = self.big if weights[i] is None else weights[i]
            nodes: list[int] = []
            seen: set[int] = set()  # a tensor may have thousands of consumers: no list search
            has_low = has_high = False
            for m in members:
                if fixed[m] == LOW:
                    has_low = True
                elif fixed[m] == HIGH:
                    has_high = True
                elif m not in seen:
                    seen.add(m)
                    nodes.append(m)
            if not nodes:
                continue  # no free member: a constant, whatever it is
            if weights[i] is not None and w <= 0:
                continue
            if has_low and has_high:
                if weights[i] is None:
                    raise ValueError(f"tensor {i} ties vertices fixed to both sides")
                continue  # a Cast is needed whatever the free vertices do: a constant
            if has_low:
                nodes.append(S)
            if has_high:
                nodes.append(T)
            if len(nodes) < 2:
                continue
            if len(nodes) == 2:
                a, b = nodes
                self._edge(a, b, w)
                self._edge(b, a, w)
                continue
            x, y = n + 2 * i, n + 2 * i + 1
            self._node(x)
            self._node(y)
            for m in nodes:
                self._edge(m, x, self.big)
                self._edge(y, m, self.big)
            self._edge(x, y, w)

    def _node(self, x: int) -> None:
        """Give node ``x`` its (empty) edge maps, once.  Mutates the network."""
        if self.out[x] is None:
            self.out[x] = {}
            self.into[x] = {}
            self.nodes.append(x)

    def _edge(self, a: int, b: int, cap: int) -> None:
        """Add capacity ``cap`` to edge a -> b; ``-1`` is the source and ``-2`` the sink."""
        if a == -1:
            if b >= 0:
                self.src[b] += cap
            return  # s -> t cannot happen (fixed members on both sides are a constant)
        if b == -2:
            self.snk[a] += cap
            return
        if a == -2 or b == -1:
            return  # t -> x and x -> s are never cut
        out, into = self.out[a], self.into[b]
        assert out is not None and into is not None
        out[b] = out.get(b, 0) + cap
        into[a] = into.get(a, 0) + cap
        self.out_sum[a] += cap
        self.in_sum[b] += cap

    def reduce(self) -> set[int]:
        """Settle every node whose side a local bound decides, and take it out of the
        network.  Returns the settled nodes on the float32 (sink) side; the others it took
        out are on the source side.  Mutates the network.

        Two rules, each exact for the smallest sink side (every minimum cut keeps its cost
        when a node moves as they say, so the smallest sink side does not change):

        * ``src[x] >= out_sum[x] + snk[x]``: moving ``x`` to the source side saves
          ``src[x]`` and costs at most its outgoing capacity, so some minimum cut has it
          there, and the smallest sink side does not contain it.  It joins the source: its
          outgoing edges become source edges of their heads.
        * ``snk[x] > in_sum[x] + src[x]``: on the source side it would cost more than all its
          incoming edges, so every minimum cut has it on the sink side.  It joins the sink.

        Where a node has both terminal edges, both are lowered by the smaller (every cut
        pays that amount once either way).  A settled node makes its neighbours' terminal
        edges larger, so the rules cascade: a chain whose Casts cost less than its ops
        gain folds into the terminals from the end that decides it, in linear time.
        """
        src, snk, out, into = self.src, self.snk, self.out, self.into
        out_sum, in_sum = self.out_sum, self.in_sum
        high: set[int] = set()
        settled = [False] * len(src)
        todo = list(reversed(self.nodes))  # a stack, so nodes are first looked at in order
        while todo:
            x = todo.pop()
            if settled[x]:
                continue
            s, t = src[x], snk[x]
            if s and t:
                m = min(s, t)
                src[x] = s = s - m
                snk[x] = t = t - m
                self.flow += m
            ox, ix = out[x], into[x]
            assert ox is not None and ix is not None
            if s >= out_sum[x] + t:
                # To the source: x -> y becomes s -> y; y -> x becomes y -> s, never cut.
                for y, c in ox.items():
                    src[y] += c
                    del into[y][x]  # type: ignore[index]
                    in_sum[y] -= c
                    todo.append(y)
                for y, c in ix.items():
                    del out[y][x]  # type: ignore[index]
                    out_sum[y] -= c
                    todo.append(y)
            elif t > in_sum[x] + s:
                # To the sink: y -> x becomes y -> t; x -> y becomes t -> y, never cut.
                for y, c in ix.items():
                    snk[y] += c
                    del out[y][x]  # type: ignore[index]
                    out_sum[y] -= c
                    todo.append(y)
                for y, c in ox.items():
                    del into[y][x]  # type: ignore[index]
                    in_sum[y] -= c
                    todo.append(y)
                high.add(x)
            else:
                continue
            settled[x] = True
            out[x] = into[x] = None
            src[x] = snk[x] = 0
        self.nodes = [x for x in self.nodes if not settled[x]]
        return high

    def components(self) -> list[list[int]]:
        """The weakly connected components of the nodes left, each in node order, in order of
        their first node.  Pure."""
        out, into = self.out, self.into
        comp_of: dict[int, int] = {}
        comps: list[list[int]] = []
        for r in self.nodes:
            if r in comp_of:
                continue
            k = len(comps)
            comp_of[r] = k
            members = [r]
            stack = [r]
            while stack:
                x = stack.pop()
                for nbrs in (out[x], into[x]):
                    for y in nbrs:  # type: ignore[union-attr]
                        if y not in comp_of:
                            comp_of[y] = k
                            members.append(y)
                            stack.append(y)
            comps.append(members)
        return comps

    def min_sink_side(self, comp: list[int]) -> set[int]:
        """The nodes of component ``comp`` on the smallest sink side of its minimum cut: those
        that still reach the sink in the residual network of a maximum flow.  Reads the
        network; adds the flow to ``self.flow``.

        Dinic's algorithm (a blocking flow of shortest augmenting paths per phase), with the
        distances measured *to* the sink and the search stopped at the source's distance:
        once the sinks near the sources are full, a phase only looks at the few nodes
        around the sinks that still take flow, not at the whole component, so a long chain
        costs a few passes over it, not one per phase.  Everything is iterative.
        """
        k = len(comp)
        residual = self._residual(comp)
        flow = 0
        phase = 0
        source_edges = list(residual.adj[residual.S])
        while True:
            phase += 1
            reached, found = residual.distances_to_sink(phase)
            if not found:
                # ``reached`` holds every node that reaches T: the smallest sink side.
                break
            # A saturated source edge stays saturated (no shortest path re-enters S), so the
            # phases after it need not look at it again.
            source_edges = [e for e in source_edges if residual.cap[e] > 0]
            flow += residual.blocking_flow(phase, source_edges)
        self.flow += flow
        return {comp[v] for v in reached if v < k}

    def _residual(self, comp: list[int]) -> _Residual:
        """A new residual network of component ``comp``: its nodes renumbered ``0..k-1`` in
        ``comp``'s order, the source and the sink ``k`` and ``k + 1``.  Reads the network."""
        residual = _Residual(len(comp))
        add, S, T = residual.add, residual.S, residual.T
        local = {x: j for j, x in enumerate(comp)}
        for j, x in enumerate(comp):
            if self.src[x]:
                add(S, j, self.src[x])
            if self.snk[x]:
                add(j, T, self.snk[x])
            for y, c in self.out[x].items():  # type: ignore[union-attr]
                add(j, local[y], c)
        return residual


class _Residual:
    """The residual network of one component for :meth:`_Network.min_sink_side`, in plain
    integer arrays: ``adj[v]`` lists the edges leaving ``v``, edge ``e`` goes to ``to[e]``
    with residual capacity ``cap[e]``, and edge ``e ^ 1`` is its twin.  ``dist[v]`` is
    ``v``'s distance to the sink in phase ``stamp[v]``; older stamps mean "not reached"."""

    def __init__(self, k: int) -> None:
        self.S, self.T = k, k + 1
        self.adj: list[list[int]] = [[] for _ in range(k + 2)]
        self.to: list[int] = []
        self.cap: list[int] = []
        self.dist = [0] * (k + 2)
        self.stamp = [0] * (k + 2)

    def add(self, a: int, b: int, c: int) -> None:
        """Add the edge ``a -> b`` of capacity ``c`` and its empty twin."""
        adj, to, cap = self.adj, self.to, self.cap
        # Edge 2j is a -> b; edge 2j + 1 its residual twin b -> a.
        adj[a].append(len(to))
        to.append(b)
        cap.append(c)
        adj[b].append(len(to))
        to.append(a)
        cap.append(0)

    def distances_to_sink(self, phase: int) -> tuple[list[int], bool]:
        """Breadth first from the sink, backwards along edges with residual capacity, stamping
        ``dist`` for ``phase``, until the source is reached.  Returns the nodes reached (the
        sink first) and whether the source was: when it was not, they are every node that
        reaches the sink."""
        adj, to, cap, dist, stamp, S, T = self.adj, self.to, self.cap, self.dist, self.stamp, self.S, self.T
        stamp[T] = phase
        dist[T] = 0
        queue = [T]
        found = False
        for v in queue:  # breadth first, backwards; the list grows while it is read
            dv = dist[v] + 1
            for e in adj[v]:
                w = to[e]
                # e is v -> w, so its twin e ^ 1 is w -> v.
                if stamp[w] != phase and cap[e ^ 1] > 0:
                    stamp[w] = phase
                    dist[w] = dv
                    if w == S:
                        found = True
                        break
                    queue.append(w)
            if found:
                break
        return queue, found

    def blocking_flow(self, phase: int, source_edges: list[int]) -> int:
        """Augment along shortest paths (by this phase's distances) until none is left, and
        return the flow added.  ``source_edges`` are the source's edges still worth trying.
        Mutates ``cap`` (and ``stamp``: dead ends are unstamped for the rest of the phase)."""
        adj, to, cap, dist, stamp, S, T = self.adj, self.to, self.cap, self.dist, self.stamp, self.S, self.T
        flow = 0
        it: dict[int, int] = {}
        nodes = [S]
        path: list[int] = []
        next_source = 0
        while True:
            u = nodes[-1]
            if u == T:
                f = min(cap[e] for e in path)
                for e in path:
                    cap[e] -= f
                    cap[e ^ 1] += f
                flow += f
                # Resume from the tail of the first edge the augmentation saturated.
                cut = next(j for j, e in enumerate(path) if cap[e] == 0)
                del nodes[cut + 1:]
                del path[cut:]
                continue
            want = dist[u] - 1
            if u == S:
                au, i = source_edges, next_source
            else:
                au, i = adj[u], it.get(u, 0)
            while i < len(au):
                e = au[i]
                v = to[e]
                if cap[e] > 0 and stamp[v] == phase and dist[v] == want:
                    break
                i += 1
            if u == S:
                next_source = i
            else:
                it[u] = i
            if i < len(au):
                e = au[i]
                path.append(e)
                nodes.append(to[e])
            elif u == S:
                return flow  # a blocking flow: no shortest path is left
            else:
                stamp[u] = 0  # a dead end for the rest of this phase
                nodes.pop()
                path.pop()
                if len(nodes) == 1:
                    next_source += 1
                else:
                    it[nodes[-1]] += 1
