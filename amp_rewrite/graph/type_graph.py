"""The type-attribute graph: one vertex per (node, type attribute), edges along data flow.

Vertices are integers assigned in GraphDef node order (and, within a node, in the order of
its :class:`~amp_rewrite.graph.type_attrs.NodeTypes.attrs`), because a few rules of TensorFlow's
pass depend on that order.  An edge ``(A, a) -> (B, b)`` exists for every data input of
``B`` whose port is governed by ``b`` and whose producer port is governed by ``a``.
Loop back edges (NextIteration -> Merge) are ordinary edges, so the graph can have cycles.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate, chain, repeat
from operator import itemgetter
from typing import Mapping, Sequence

from ..errors import InvalidGraphError
from .type_attrs import NodeTypes, TypeAttr

__all__ = ["TypeGraph", "build_type_graph", "build_type_graph_from_lists"]


@dataclass
class TypeGraph:
    """Vertices and adjacency of the type-attribute graph.  Built once, then read-only
    except for :meth:`add_edge` (TensorList implicit edges) before :meth:`finalize`."""

    node: list[str] = field(default_factory=list)
    attr: list[TypeAttr] = field(default_factory=list)
    _index: dict[tuple[str, TypeAttr], int] | None = None
    fanin: list[list[int]] = field(default_factory=list)
    fanout: list[list[int]] = field(default_factory=list)
    #: vertex -> position of its node in the order the graph was built in
    node_pos: list[int] = field(default_factory=list, repr=False)
    #: node position -> its first vertex, then the number of vertices (node ``i`` has the
    #: vertices ``range(bases[i], bases[i + 1])``)
    bases: list[int] = field(default_factory=lambda: [0], repr=False)
    #: The nodes in that order, from which :attr:`by_node` is made on first use.
    _order: list[str] = field(default_factory=list, repr=False)
    _by_node: dict[str, Sequence[int]] | None = field(default=None, repr=False)

    @property
    def by_node(self) -> dict[str, Sequence[int]]:
        """Node -> its vertices (a ``range``).  Built on first use: the painting passes
        rarely need it, and a dict of a million names costs half a second to build."""
        if self._by_node is None:
            bases = self.bases
            self._by_node = dict(zip(self._order, map(range, bases, bases[1:])))
        return self._by_node

    def __len__(self) -> int:
        return len(self.node)

    @property
    def index(self) -> dict[tuple[str, TypeAttr], int]:
        """``(node, type attr) -> vertex``, built on first use: the painting passes only
        look up a few vertices, usually through :meth:`find`, so most runs never need it."""
        if self._index is None:
            self._index = {(n, ta): v for v, (n, ta) in enumerate(zip(self.node, self.attr))}
        return self._index

    def find(self, node: str, ta: TypeAttr) -> int | None:
        """The vertex of ``(node, ta)``, or ``None``.  Scans the node's few vertices."""
        attr = self.attr
        for v in self.by_node.get(node, ()):
            if attr[v] == ta:
                return v
        return None

    def vertex(self, node: str, ta: TypeAttr) -> int:
        v = self.find(node, ta)
        if v is None:
            raise KeyError((node, ta))
        return v

    def add_edge(self, src: int, dst: int) -> None:
        self.fanout[src].append(dst)
        self.fanin[dst].append(src)

    def finalize(self) -> None:
        """Sort and de-duplicate every adjacency list (iteration order is then stable)."""
        self.fanin = [sorted(set(f)) if len(f) > 1 else f for f in self.fanin]
        self.fanout = [sorted(set(f)) if len(f) > 1 else f for f in self.fanout]


def build_type_graph(
    order: list[str],
    types: Mapping[str, NodeTypes],
    inputs: Mapping[str, list[tuple[str, int]]],
) -> TypeGraph:
    """Build the type graph for nodes in ``order``.  Pure.

    ``inputs[n]`` lists the data inputs of ``n`` as ``(producer, port)`` in port order.
    Raises :class:`InvalidGraphError` if an input names an output its producer lacks.
    """
    return build_type_graph_from_lists(
        order, [types[n] for n in order], [inputs[n] for n in order],
        dict(zip(order, range(len(order)))),
    )


def build_type_graph_from_lists(
    order: list[str],
    node_types: Sequence[NodeTypes],
    node_inputs: Sequence[list[tuple[str, int]]],
    position: Mapping[str, int],
) -> TypeGraph:
    """:func:`build_type_graph` with the types and inputs given as lists aligned with
    ``order`` and ``position`` mapping each node to its place in ``order`` (the decision
    stage has them so: no other name-keyed dict is made or read).  Pure."""
    tg = TypeGraph()
    # Nodes of the same op and attrs share one NodeTypes object (decide caches them): the
    # positions of their ports among the attrs are computed once per object.  Keyed by id(),
    # which is stable while the caller keeps the objects alive.  Per node only its first
    # vertex and that shared layout are kept (no per-node port lists: at a million nodes the
    # allocations dominated).
    ids = list(map(id, node_types))
    layout: dict[int, tuple[tuple[TypeAttr, ...], list[int], list[int]]] = {}
    for key, nt in dict(zip(ids, node_types)).items():
        pos = {ta: i for i, ta in enumerate(nt.attrs)}
        layout[key] = (nt.attrs, [pos[ta] for ta in nt.inputs], [pos[ta] for ta in nt.outputs])
    lays = list(map(layout.__getitem__, ids))
    # The per-node bookkeeping below runs as C-level map/zip/chain passes over lists in node
    # order rather than a Python loop per node: on graphs of a million nodes the interpreter
    # overhead (and the scattered dict lookups) of such a loop cost seconds.
    attrs_of = list(map(itemgetter(0), lays))
    counts = list(map(len, attrs_of))
    bases = list(accumulate(counts, initial=0))  # first vertex of each node, then the total
    node_pos = tg.node_pos = list(chain.from_iterable(map(repeat, range(len(order)), counts)))
    tg.node = list(map(order.__getitem__, node_pos))
    tg.attr = list(chain.from_iterable(attrs_of))
    tg._order = order
    tg.bases = bases
    outs_of = list(map(itemgetter(2), lays))
    n = bases[-1]
    # A node's fanin lists are made in its turn (vertices are numbered in node order), and
    # sorted and de-duplicated then, as finalize() would; fanout lists are appended to from
    # the consumers' side, so they exist up front, and only those that get a second entry
    # need finalizing (a pass over all of them would touch a million lists).
    fanin: list[list[int]] = []
    fanout: list[list[int]] = [[] for _ in range(n)]
    shared: list[int] = []  # vertices whose fanout got a second entry
    for name, ins, base, count, (_, rel_in, _) in zip(order, node_inputs, bases, counts, lays):
        if not count:
            continue
        # One list of producer vertices per vertex of the node; most nodes have one vertex,
        # which every input belongs to.
        mine = [[] for _ in range(count)] if count > 1 else None
        single: list[int] = []
        # One input vertex per data input (node_types checked the count).
        for i, (src, src_port) in zip(rel_in, ins):
            j = position[src]
            src_out = outs_of[j]
            if src_port >= len(src_out):
                raise InvalidGraphError(
                    f"node {name!r} reads output {src_port} of {src!r}, which has only "
                    f"{len(src_out)} output(s)",
                    node=name,
                )
            a = bases[j] + src_out[src_port]
            consumers = fanout[a]
            consumers.append(base + i)
            if len(consumers) == 2:
                shared.append(a)
            (single if mine is None else mine[i]).append(a)
        if mine is None:
            fanin.append(sorted(set(single)) if len(single) > 1 else single)
        else:
            for f in mine:
                fanin.append(sorted(set(f)) if len(f) > 1 else f)
    for a in shared:
        fanout[a] = sorted(set(fanout[a]))
    tg.fanin = fanin
    tg.fanout = fanout
    return tg
