"""Validation of an imported graph that needs the whole IR: every cycle must be a loop.

:func:`check_cycles` runs after :func:`amp_rewrite.graph.io.import_graph_def`, on the main
graph and on each function, before anything is decided.  Reads the graph only.
"""

from __future__ import annotations

import networkx as nx

from ..errors import InvalidGraphError

__all__ = ["check_cycles"]


def check_cycles(g: nx.MultiDiGraph, where: str) -> None:
    """Raise unless every cycle of ``g`` goes through a NextIteration node.  Reads ``g``.

    One pass in node order marks *settled* every node whose inputs (but loop back edges,
    NextIteration's out-edges) are all settled already: such a node has only settled
    ancestors, so it lies on no forbidden cycle.  TensorFlow writes nodes in creation order,
    so nearly every node settles; the few left (a node listed before one of its inputs) go
    through Kahn's algorithm, and only if that finds a cycle does the full check below run,
    for its error message.  Linear in nodes + edges.
    """
    nodes = g._node  # networkx's dicts, read directly: the views cost a call per item
    settled: set[str] = set()
    left: list[str] = []
    for v, preds in g._pred.items():
        for u in preds:
            if u not in settled and nodes[u]["op"] != "NextIteration":
                left.append(v)
                break
        else:
            settled.add(v)
    if not left:
        return
    # Kahn's algorithm on the nodes left, counting only edges between them.
    pending = set(left)
    indegree = dict.fromkeys(left, 0)
    for v in left:
        for u, keyed in g._pred[v].items():
            if u in pending and nodes[u]["op"] != "NextIteration":
                indegree[v] += len(keyed)
    ready = [v for v in left if indegree[v] == 0]
    done = 0
    while ready:
        u = ready.pop()
        done += 1
        if nodes[u]["op"] == "NextIteration":
            continue
        for v, keyed in g._succ[u].items():
            if v in pending:
                indegree[v] -= len(keyed)
                if indegree[v] == 0:
                    ready.append(v)
    if done < len(left):
        _check_cycles_full(g, where)


def _check_cycles_full(g: nx.MultiDiGraph, where: str) -> None:
    """Raise unless every cycle of ``g`` goes through a NextIteration node.

    Kahn's algorithm on the graph without NextIteration's out-edges (loop back edges); the
    nodes left over all lie on or behind a forbidden cycle.  Linear in nodes + edges.
    """
    # Reads networkx's adjacency dicts directly (read-only): the public views cost a Python
    # call per item, several times the work done here.
    succ = g._succ
    nodes = g._node
    indegree = dict.fromkeys(nodes, 0)
    ops = {n: d["op"] for n, d in nodes.items()}
    for u, nbrs in succ.items():
        if ops[u] == "NextIteration":
            continue
        for v, keyed in nbrs.items():
            indegree[v] += len(keyed)
    ready = [n for n, k in indegree.items() if k == 0]
    seen = 0
    while ready:
        u = ready.pop()
        seen += 1
        if ops[u] == "NextIteration":
            continue
        for v, keyed in succ[u].items():
            indegree[v] -= len(keyed)
            if indegree[v] == 0:
                ready.append(v)
    if seen == len(indegree):
        return
    stuck = {n for n, k in indegree.items() if k > 0}
    view = nx.subgraph_view(
        g, filter_node=stuck.__contains__, filter_edge=lambda u, v, k: ops[u] != "NextIteration"
    )
    cycle = nx.find_cycle(view)
    names = " -> ".join(repr(u) for u, *_ in cycle[:8])
    raise InvalidGraphError(
        f"{where} has a cycle not closed by a NextIteration node: {names}", node=cycle[0][0]
    )
