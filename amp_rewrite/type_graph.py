"""The type-attribute graph: one vertex per (node, type attribute), edges along data flow.

Vertices are integers assigned in GraphDef node order (and, within a node, in the order of
its :class:`~amp_rewrite.type_attrs.NodeTypes.attrs`), because a few rules of TensorFlow's
pass depend on that order.  An edge ``(A, a) -> (B, b)`` exists for every data input of
``B`` whose port is governed by ``b`` and whose producer port is governed by ``a``.
Loop back edges (NextIteration -> Merge) are ordinary edges, so the graph can have cycles.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .errors import InvalidGraphError
from .type_attrs import NodeTypes, TypeAttr

__all__ = ["TypeGraph", "build_type_graph"]


@dataclass
class TypeGraph:
    """Vertices and adjacency of the type-attribute graph.  Built once, then read-only
    except for :meth:`add_edge` (TensorList implicit edges) before :meth:`finalize`."""

    node: list[str] = field(default_factory=list)
    attr: list[TypeAttr] = field(default_factory=list)
    index: dict[tuple[str, TypeAttr], int] = field(default_factory=dict)
    by_node: dict[str, list[int]] = field(default_factory=dict)
    fanin: list[list[int]] = field(default_factory=list)
    fanout: list[list[int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.node)

    def vertex(self, node: str, ta: TypeAttr) -> int:
        return self.index[(node, ta)]

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
    # Per node, the vertex of each input and output port, so edges are list lookups.
    in_v: dict[str, list[int]] = {}
    out_v: dict[str, list[int]] = {}
    node_list = tg.node
    attr_list = tg.attr
    index = tg.index
    for name in order:
        nt = types[name]
        local: dict[TypeAttr, int] = {}
        for ta in nt.attrs:
            v = len(node_list)
            node_list.append(name)
            attr_list.append(ta)
            index[(name, ta)] = v
            local[ta] = v
        tg.by_node[name] = list(local.values())
        in_v[name] = [local[ta] for ta in nt.inputs]
        out_v[name] = [local[ta] for ta in nt.outputs]
    n = len(node_list)
    fanin: list[list[int]] = [[] for _ in range(n)]
    fanout: list[list[int]] = [[] for _ in range(n)]
    for name in order:
        dst_vertices = in_v[name]
        for port, (src, src_port) in enumerate(inputs[name]):
            src_vertices = out_v[src]
            if src_port >= len(src_vertices):
                raise InvalidGraphError(
                    f"node {name!r} reads output {src_port} of {src!r}, which has only "
                    f"{len(src_vertices)} output(s)",
                    node=name,
                )
            a = src_vertices[src_port]
            b = dst_vertices[port]
            fanout[a].append(b)
            fanin[b].append(a)
    tg.fanin = fanin
    tg.fanout = fanout
    tg.finalize()
    return tg
