"""The networkx graph model (IR) shared by every stage.

Schema (one ``networkx.MultiDiGraph`` per GraphDef and one per FunctionDef body):

Graph attributes (``g.graph``)
    ``kind``: ``"graph"`` or ``"function"``; ``name``: ``""`` or the function name;
    ``signatures``: mapping function name -> :class:`~amp_rewrite.graph.op_registry.OpSignature`
    of the library (a node whose op is a function name is a call); ``source``: the original
    protobuf, opaque to everything but :mod:`amp_rewrite.graph.io`.

Node attributes (node key = node name)
    ``op`` (str), ``device`` (str), ``order`` (tuple used to sort nodes on export: original
    nodes ``(index, 0)``, inserted nodes ``(index of their producer, k)``), ``dtypes``
    (dict attr name -> dtype int, or tuple of dtype ints for ``list(type)`` attrs), ``ints``
    (dict attr name -> int, for ``number_attr`` lookups), ``attr_names`` (tuple of every attr
    name on the NodeDef), ``label`` (the ``_kernel`` attr, ``""`` if absent), ``proto`` (the
    original NodeDef or ``None`` for inserted nodes; opaque), ``synthetic`` (``"arg"`` /
    ``"retval"`` for the argument and return nodes made for a function body, else ``None``),
    ``dirty`` (True once the rewrite changed the node, so export rebuilds it),
    ``inputs_changed`` (True once an input was rewired, so export respells its inputs), ``funcs``
    (names of the functions the node's ``func``/``list(func)`` attrs call: While bodies, If
    branches, PartitionedCall targets; sorted), ``func_attrs`` (the same calls as ``(attr,
    function)`` pairs in attr-name order, ``list(func)`` elements in their order).

Edge attributes (key: the destination port for data edges, ``-1 - position`` for control edges)
    ``src_port`` (int, :data:`~amp_rewrite.graph.tensor_names.CONTROL` for control edges),
    ``dst_port`` (int, ``CONTROL`` for control edges), ``pos`` (position among the node's
    control inputs, or the data port), ``text`` (the input string as it was written, reused
    on export; ``None`` for edges the rewrite created).

Nothing here imports protobuf or TensorFlow.
"""

from __future__ import annotations

import operator
from typing import Any, Iterator, Mapping

import networkx as nx

from .tensor_names import CONTROL

__all__ = [
    "data_inputs",
    "control_inputs",
    "consumers",
    "consumers_by_port",
    "ordered_nodes",
    "add_node",
    "add_new_node",
    "add_data_edge",
    "function_args",
    "passed_through",
]


def data_inputs(g: nx.MultiDiGraph, name: str) -> list[tuple[str, int]]:
    """The data inputs of ``name`` as ``(producer, output port)``, in input-port order."""
    pred = g._pred[name]
    if not pred:
        return []
    # Edge keys are the destination port for data edges and negative for control edges
    # (see the module docstring), so the key alone tells them apart.
    ins: dict[int, tuple[str, int]] = {}
    for u, keyed in pred.items():
        for q, d in keyed.items():
            if q >= 0:
                ins[q] = (u, d["src_port"])
    return [ins[q] for q in range(len(ins))]


def control_inputs(g: nx.MultiDiGraph, name: str) -> list[str]:
    """The control inputs of ``name`` in their original order."""
    ins = [(d["pos"], u) for u, _, d in g.in_edges(name, data=True) if d["dst_port"] == CONTROL]
    ins.sort()
    return [u for _, u in ins]


def consumers_of(out: Mapping[str, Mapping[int, Mapping[str, Any]]]) -> dict[int, list[tuple[str, int, int]]]:
    """:func:`consumers_by_port` from a node's successor dict (``g._succ[name]``), for
    callers that hold it already: in a graph of a million nodes each lookup by name is a
    cache miss.  Pure."""
    by_port: dict[int, list[tuple[str, int, int]]] = {}
    for v, keyed in out.items():
        for k, d in keyed.items():
            q = d["dst_port"]
            if q != CONTROL:
                port = d["src_port"]
                lst = by_port.get(port)
                if lst is None:
                    by_port[port] = [(v, q, k)]
                else:
                    lst.append((v, q, k))
    return by_port


def consumers_by_port(g: nx.MultiDiGraph, name: str) -> dict[int, list[tuple[str, int, int]]]:
    """Regular consumers of every output of ``name``: port -> ``[(consumer, dst_port, key)]``.

    Lists follow the order in which the edges were added: import adds them consumer by
    consumer in GraphDef order and the rewrite in its own deterministic order, so iteration
    is deterministic without sorting.  One pass over the node's out-edges.
    """
    return consumers_of(g._succ[name])


def consumers(g: nx.MultiDiGraph, name: str, port: int) -> list[tuple[str, int, int]]:
    """Regular consumers of output ``port`` of ``name`` as ``(consumer, dst_port, key)``."""
    return consumers_by_port(g, name).get(port, [])


def ordered_nodes(g: nx.MultiDiGraph) -> list[str]:
    """Node names sorted by their ``order`` attribute (original GraphDef order)."""
    return ordered_entries(g, succ=False, pred=False)[0]


def node_entries(
    g: nx.MultiDiGraph, *, succ: bool = True, pred: bool = True
) -> tuple[list[str], list[dict], list[dict] | None, list[dict] | None]:
    """Node names in ``g``'s own (insertion) order, with each node's attribute dict and, if
    asked for, its successor dict (``g._succ[name]``) and predecessor dict (``g._pred[name]``)
    in the same order.  Reads ``g`` only.

    Callers walking every node take the dicts from here instead of looking each name up: on
    a graph of a million nodes every lookup in a dict that size misses the CPU caches.
    """
    nodes = g._node
    names = list(nodes)
    adjacency: list[list[dict] | None] = []
    for wanted, adj in ((succ, g._succ), (pred, g._pred)):
        if not wanted:
            adjacency.append(None)
        # networkx adds and removes a node in _succ, _pred and _node together, so their keys
        # are in the same order; checked (one C-level list comparison, identity first).
        elif len(adj) == len(names) and list(adj) == names:
            adjacency.append(list(adj.values()))
        else:
            adjacency.append([adj[n] for n in names])
    return names, list(nodes.values()), adjacency[0], adjacency[1]


def ordered_entries(
    g: nx.MultiDiGraph, *, succ: bool = True, pred: bool = True
) -> tuple[list[str], list[dict], list[dict] | None, list[dict] | None]:
    """:func:`node_entries` sorted by the nodes' ``order`` attribute (original GraphDef
    order, inserted nodes after their producer).  Reads ``g`` only."""
    names, datas, succs, preds = node_entries(g, succ=succ, pred=pred)
    keys = [d["order"] for d in datas]
    # A freshly imported graph is already in order (nodes are added in GraphDef order): one
    # C-level pairwise check instead of a sort.
    if all(map(operator.lt, keys, keys[1:])):
        return names, datas, succs, preds
    # New nodes are appended in order, so the sort merges two sorted runs.  Orders are
    # unique, so sorting positions by order is sorting names by order; were two equal, the
    # names would decide, as they did when names were sorted by (order, name).
    perm = sorted(range(len(keys)), key=keys.__getitem__)
    if any(map(operator.eq, map(keys.__getitem__, perm), map(keys.__getitem__, perm[1:]))):
        perm = [i for _, _, i in sorted(zip(keys, names, range(len(keys))))]
    return tuple(  # type: ignore[return-value]
        None if lst is None else list(map(lst.__getitem__, perm))
        for lst in (names, datas, succs, preds)
    )


def add_node(
    g: nx.MultiDiGraph,
    name: str,
    *,
    op: str,
    device: str,
    order: tuple[int, int],
    dtypes: dict[str, int | tuple[int, ...]],
    ints: dict[str, int] | None = None,
    attr_names: tuple[str, ...] = (),
    label: str = "",
    proto: object = None,
    synthetic: str | None = None,
) -> dict:
    """Add a node with the full schema and return its attribute dict.  Mutates ``g``.

    Writes networkx's dicts directly, exactly as ``MultiDiGraph.add_node`` would (the rewrite
    adds hundreds of thousands of Casts to large graphs and the public method's overhead
    showed); an existing node's attributes are updated, as networkx does.
    """
    attrs = _node_attrs(op, device, order, dtypes, ints, attr_names, label, proto, synthetic)
    if name in g._succ:
        node_attrs = g._node[name]
        node_attrs.update(attrs)
    else:
        g._succ[name] = {}
        g._pred[name] = {}
        g._node[name] = node_attrs = attrs
    nx._clear_cache(g)
    return node_attrs


def add_new_node(
    g: nx.MultiDiGraph,
    name: str,
    *,
    op: str,
    device: str,
    order: tuple[int, int],
    dtypes: dict[str, int | tuple[int, ...]],
) -> tuple[dict, dict, dict]:
    """:func:`add_node` for an inserted node whose name the caller has checked is not in
    ``g``: returns its attribute, successor and predecessor dicts, so that wiring it needs no
    lookup by name (each one a cache miss in a graph of a million nodes).  Mutates ``g``;
    the caller clears networkx's cache (``nx._clear_cache``) when done."""
    attrs = _node_attrs(op, device, order, dtypes, None, (), "", None, None)
    succ: dict = {}
    pred: dict = {}
    g._succ[name] = succ
    g._pred[name] = pred
    g._node[name] = attrs
    return attrs, succ, pred


def _node_attrs(
    op: str, device: str, order: tuple[int, int], dtypes: dict[str, int | tuple[int, ...]],
    ints: dict[str, int] | None, attr_names: tuple[str, ...], label: str, proto: object,
    synthetic: str | None,
) -> dict:
    """A node's attribute dict, every key of the schema in its usual order."""
    return {
        "op": op, "device": device, "order": order, "dtypes": dtypes, "ints": ints or {},
        "attr_names": attr_names, "label": label, "proto": proto, "synthetic": synthetic,
        "dirty": proto is None, "funcs": (), "func_attrs": (),
    }


def link(src_out: dict, dst_in: dict, src: str, dst: str, src_port: int, dst_port: int,
         text: str | None) -> None:
    """:func:`add_data_edge` from the source's successor dict and the destination's
    predecessor dict, for callers that hold them already.  Mutates them; the caller clears
    networkx's cache (``nx._clear_cache``) when done."""
    attrs = {"src_port": src_port, "dst_port": dst_port, "pos": dst_port, "text": text}
    keydict = src_out.get(dst)
    if keydict is None:
        src_out[dst] = dst_in[src] = {dst_port: attrs}
    else:
        old = keydict.get(dst_port)
        if old is None:
            keydict[dst_port] = attrs
        else:
            old.update(attrs)


def add_data_edge(
    g: nx.MultiDiGraph, src: str, src_port: int, dst: str, dst_port: int, text: str | None
) -> None:
    """Connect ``src:src_port`` to input ``dst_port`` of ``dst``.  Mutates ``g``.

    Both nodes must exist.  Same dict layout as ``MultiDiGraph.add_edge`` (an existing edge
    with this key is updated), written directly for speed, as in :func:`add_node`.
    """
    link(g._succ[src], g._pred[dst], src, dst, src_port, dst_port, text)
    nx._clear_cache(g)


def iter_data_edges(g: nx.MultiDiGraph) -> Iterator[tuple[str, str, int, int]]:
    """Every data edge as ``(src, dst, src_port, dst_port)``."""
    for u, v, d in g.edges(data=True):
        if d["dst_port"] != CONTROL:
            yield u, v, d["src_port"], d["dst_port"]


def function_args(fg: nx.MultiDiGraph, kind: str = "arg") -> dict[int, str]:
    """The argument (``kind="arg"``) or result (``"retval"``) nodes of function body ``fg``,
    by index.  Reads ``fg`` only."""
    return {d["ints"]["index"]: n for n, d in fg.nodes(data=True) if d["synthetic"] == kind}


def passed_through(fg: nx.MultiDiGraph) -> set[int]:
    """Indices ``i`` where function body ``fg`` returns its argument ``i`` unchanged as its
    result ``i``, directly or through ``Identity`` ops (``tf.while_loop`` returns each loop
    variable through one): as a loop body, loop variable ``i`` is the same in every
    iteration.  Reads ``fg`` only."""
    args = function_args(fg, "arg")
    same = set()
    for i, ret in function_args(fg, "retval").items():
        ins = data_inputs(fg, ret)
        while len(ins) == 1 and ins[0][1] == 0 and fg._node[ins[0][0]]["op"] == "Identity":
            ins = data_inputs(fg, ins[0][0])
        if i in args and ins == [(args[i], 0)]:
            same.add(i)
    return same
