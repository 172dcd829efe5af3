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
    for name in order:
        ids = []
        for ta in types[name].attrs:
            v = len(tg.node)
            tg.node.append(name)
            tg.attr.append(ta)
            tg.index[(name, ta)] = v
            tg.fanin.append([])
            tg.fanout.append([])
            ids.append(v)
        tg.by_node[name] = ids
    index = tg.index
    for name in order:
        in_types = types[name].inputs
        for port, (src, src_port) in enumerate(inputs[name]):
            src_outputs = types[src].outputs
            if src_port >= len(src_outputs):
                raise InvalidGraphError(
                    f"node {name!r} reads output {src_port} of {src!r}, which has only "
                    f"{len(src_outputs)} output(s)",
                    node=name,
                )
            a = index[(src, src_outputs[src_port])]
            b = index[(name, in_types[port])]
            tg.fanout[a].append(b)
            tg.fanin[b].append(a)
    tg.finalize()
    return tg
