"""The type-attribute graph: one vertex per (node, type attribute), edges along data flow.

Vertices are integers assigned in GraphDef node order (and, within a node, in the order of
its :class:`~amp_rewrite.type_attrs.NodeTypes.attrs`), because a few rules of TensorFlow's
pass depend on that order.  An edge ``(A, a) -> (B, b)`` exists for every data input of
``B`` whose port is governed by ``b`` and whose producer port is governed by ``a``.
Loop back edges (NextIteration -> Merge) are ordinary edges, so the graph can have cycles.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from .errors import InvalidGraphError
from .type_attrs import NodeTypes, TypeAttr

__all__ = ["TypeGraph", "build_type_graph"]


@dataclass
class TypeGraph:
    """Vertices and adjacency of the type-attribute graph.  Built once, then read-only
    except for :meth:`add_edge` (TensorList implicit edges) before :meth:`finalize`."""

    node: list[str] = field(default_factory=list)
    attr: list[TypeAttr] = field(default_factory=list)
    _index: dict[tuple[str, TypeAttr], int] | None = None
    by_node: dict[str, Sequence[int]] = field(default_factory=dict)
    fanin: list[list[int]] = field(default_factory=list)
    fanout: list[list[int]] = field(default_factory=list)

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
    tg = TypeGraph()
    node_list = tg.node
    attr_list = tg.attr
    by_node = tg.by_node
    # Nodes of the same op and attrs share one NodeTypes object (decide caches them): the
    # positions of their ports among the attrs are computed once per object.  Keyed by id(),
    # which is stable while ``types`` keeps the objects alive.  Per node only its first
    # vertex and that shared layout are kept (no per-node port lists: at a million nodes the
    # allocations dominated).
    layout: dict[int, tuple[tuple[TypeAttr, ...], list[int], list[int]]] = {}
    node_base: dict[str, tuple[int, list[int], list[int]]] = {}
    for name in order:
        nt = types[name]
        lay = layout.get(id(nt))
        if lay is None:
            pos = {ta: i for i, ta in enumerate(nt.attrs)}
            lay = layout[id(nt)] = (nt.attrs, [pos[ta] for ta in nt.inputs], [pos[ta] for ta in nt.outputs])
        attrs, rel_in, rel_out = lay
        base = len(node_list)
        k = len(attrs)
        if k == 1:
            node_list.append(name)
            attr_list.append(attrs[0])
        else:
            node_list.extend([name] * k)
            attr_list.extend(attrs)
        by_node[name] = range(base, base + k)  # immutable and cheaper than a list
        node_base[name] = (base, rel_in, rel_out)
    n = len(node_list)
    fanin: list[list[int]] = [[] for _ in range(n)]
    fanout: list[list[int]] = [[] for _ in range(n)]
    for name in order:
        ins = inputs[name]
        if not ins:
            continue
        base, rel_in, _ = node_base[name]
        # One input vertex per data input (node_types checked the count).
        for i, (src, src_port) in zip(rel_in, ins):
            src_base, _, src_out = node_base[src]
            if src_port >= len(src_out):
                raise InvalidGraphError(
                    f"node {name!r} reads output {src_port} of {src!r}, which has only "
                    f"{len(src_out)} output(s)",
                    node=name,
                )
            a = src_base + src_out[src_port]
            b = base + i
            fanout[a].append(b)
            fanin[b].append(a)
    tg.fanin = fanin
    tg.fanout = fanout
    tg.finalize()
    return tg
