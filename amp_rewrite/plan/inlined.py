"""A step as TensorFlow's runtime hands it to Grappler: its function calls inlined.

Before Grappler optimizes a ``tf.function`` (or a SavedModel's signature) for a GPU, the
runtime inlines the functions it calls (``PartitionedCall``, ``StatefulPartitionedCall``, a
node whose op is a library function) into one graph.  Whole-graph passes then see the whole:
the layout optimizer (:mod:`.gpu_layout`) decides one layout for it, converts across what were
function boundaries, and fails for all of it where it fails.  The IR keeps each function body a
graph of its own; :func:`inline_calls` builds the one graph those passes see, for the step
estimate to place their work (:mod:`.step_cost`).

Only calls are inlined: a loop's body and a conditional's branches stay functions (lowered to
frames at run time, which this does not model).  Each call site gets its own copy of its
function, named ``<call node>/<node>`` inside the caller's names.

Pure: reads the graphs, builds a new one, changes nothing.  Imports nothing of TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import networkx as nx

from ..graph.ir import data_inputs, function_args, ordered_nodes
from ..graph.shapes import Shape

__all__ = ["CALL_OPS", "MAX_INLINED_NODES", "Inlined", "callee", "inline_calls"]

#: The most nodes :func:`inline_calls` copies: a function called from many call sites, each
#: calling others as often, grows exponentially with the depth of calls (a hostile graph's
#: might not fit in memory).
MAX_INLINED_NODES = 2_000_000

#: Ops that call one library function (its ``f`` attribute) with their inputs.
CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})


@dataclass(frozen=True)
class Inlined:
    """A step's graph with its calls inlined (:func:`inline_calls`): the graph, its nodes'
    output shapes, the nodes that run and those constant folding computes, and the functions
    that were inlined.  ``live`` is ``None`` where every node runs; ``graph`` is the main graph
    itself where it calls nothing to inline (never to be changed)."""

    graph: nx.MultiDiGraph
    shapes: Mapping[str, tuple[Shape, ...]]
    live: frozenset[str] | None
    constants: frozenset[str]
    functions: frozenset[str]


def callee(g: nx.MultiDiGraph, name: str, functions: Mapping[str, nx.MultiDiGraph]) -> str | None:
    """The function node ``name`` of ``g`` calls, where it is a call that runtime inlines and the
    function is in ``functions``; else ``None``.  Pure."""
    node = g.nodes[name]
    op = node["op"]
    if op in (g.graph.get("signatures") or {}) and op in functions:
        return op
    funcs = node.get("funcs") or ()
    if op in CALL_OPS and len(funcs) == 1 and funcs[0] in functions:
        return funcs[0]
    return None


@dataclass
class _Instance:
    """One copy of a graph in the inlined step: its graph's key, the prefix of its copies'
    names, and the caller (instance index and call node), ``None`` for the main graph."""

    key: str
    prefix: str
    caller: tuple[int, str] | None


def inline_calls(main: nx.MultiDiGraph, functions: Mapping[str, nx.MultiDiGraph],
                 shapes_of: Callable[[str], Mapping[str, tuple[Shape, ...]]],
                 live_of: Callable[[str], frozenset[str] | None],
                 constants_of: Callable[[str], frozenset[str]]) -> Inlined | None:
    """``main`` with every call to a function of ``functions`` inlined, transitively.  Per
    graph key (``""`` for ``main``, else a function name): ``shapes_of`` its shapes, ``live_of``
    the nodes of it that run (``None``: all), ``constants_of`` its constant nodes.  A call's
    inputs feed what read its function's arguments; what read its outputs read what its
    function returns.  ``None`` where that would copy more than :data:`MAX_INLINED_NODES`
    nodes.  Assumes the call graph has no cycle (checked on import).  Pure."""
    graphs = {"": main, **functions}
    instances = [_Instance("", "", None)]
    inlined: dict[tuple[int, str], int] = {}  # (instance, call node) -> callee's instance
    i = copied = 0
    while i < len(instances):
        inst = instances[i]
        g = graphs[inst.key]
        copied += len(g)
        if copied > MAX_INLINED_NODES:
            return None
        live = live_of(inst.key)
        for n in ordered_nodes(g):
            f = callee(g, n, functions) if live is None or n in live else None
            if f is not None:
                inlined[(i, n)] = len(instances)
                instances.append(_Instance(f, f"{inst.prefix}{n}/", (i, n)))
        i += 1
    if len(instances) == 1:  # no call to inline: the main graph itself, not a copy
        return Inlined(main, shapes_of(""), live_of(""), constants_of(""), frozenset())
    rets = {k: function_args(g, "retval") for k, g in functions.items()}

    def resolve(i: int, tensor: tuple[str, int]) -> tuple[str, int] | None:
        """The copy of ``tensor`` (of instance ``i``) that holds its value: through arguments
        up to the caller's input, through calls down to what the function returns."""
        for _ in range(10_000):  # bounded: a malformed graph must not spin
            inst = instances[i]
            g = graphs[inst.key]
            node, port = tensor
            child = inlined.get((i, node))
            if child is not None:  # a call's output: what its function returns there
                ret = rets[instances[child].key].get(port)
                ins = data_inputs(graphs[instances[child].key], ret) if ret is not None else []
                if not ins:
                    return None
                i, tensor = child, ins[0]
            elif inst.caller is not None and g.nodes[node].get("synthetic") == "arg":
                index = g.nodes[node]["ints"].get("index")
                parent, call = inst.caller
                ins = data_inputs(graphs[instances[parent].key], call)
                if index is None or index >= len(ins):
                    return None
                i, tensor = parent, ins[index]
            else:
                return f"{inst.prefix}{node}", port
        return None

    out = nx.MultiDiGraph(kind="graph", name=main.graph.get("name", ""),
                          signatures=main.graph.get("signatures") or {})
    shapes: dict[str, tuple[Shape, ...]] = {}
    live: set[str] = set()
    constants: set[str] = set()
    kept: list[tuple[int, str]] = []
    for i, inst in enumerate(instances):
        g = graphs[inst.key]
        own_shapes, own_live, own_consts = shapes_of(inst.key), live_of(inst.key), constants_of(inst.key)
        for n in ordered_nodes(g):
            node = g.nodes[n]
            synthetic = node.get("synthetic")
            if (i, n) in inlined or (inst.caller is not None and synthetic in ("arg", "retval")):
                continue  # a call, or an argument or result of an inlined body: edges now
            name = f"{inst.prefix}{n}"
            out.add_node(name, **{**node, "order": (i, *node.get("order", (0, 0)))})
            kept.append((i, n))
            if n in own_shapes:
                shapes[name] = own_shapes[n]
            if own_live is None or n in own_live:
                live.add(name)
            if n in own_consts:
                constants.add(name)
    for i, n in kept:
        g = graphs[instances[i].key]
        name = f"{instances[i].prefix}{n}"
        for q, tensor in enumerate(data_inputs(g, n)):
            src = resolve(i, tensor)
            if src is not None and src[0] in out:
                out.add_edge(src[0], name, key=q, src_port=src[1], dst_port=q, pos=q, text=None)
    # The inlined graph's results are the main graph's: what runs is what ran.
    return Inlined(out, shapes, frozenset(live), frozenset(constants), frozenset(inst.key for inst in instances[1:]))
