"""Import: a GraphDef and its function library -> the networkx IR (:class:`ImportedGraph`).

Part of :mod:`amp_rewrite.graph.io` (which re-exports these names).  Builds new graphs; never
modifies the GraphDef.  Nodes keep their NodeDef (``proto``) so that export can copy the
ones the rewrite leaves alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from sys import intern
from typing import Any, Mapping

import networkx as nx

from . import ir
from ..errors import InvalidGraphError
from .call_graph import check_call_graph
from .node_checks import check_nodes
from .op_registry import OpRegistry, OpSignature, signature_from_opdef
from .tensor_names import CONTROL, parse_function_input, parse_graph_input
from .type_attrs import output_arg_ranges

# Logged under amp_rewrite.graph.io, the module users know this part of.
log = logging.getLogger(__package__ + ".io")


@dataclass
class ImportedGraph:
    """A GraphDef in IR form: the main graph, its function bodies, and what was not loaded.

    ``functions`` holds a graph for every function of the library that can be rewritten;
    ``skipped_functions`` maps the others (parametrized functions, bodies that cannot be
    resolved) to the reason.  ``source`` is the original GraphDef (never modified).
    """

    graph: nx.MultiDiGraph
    functions: dict[str, nx.MultiDiGraph]
    skipped_functions: dict[str, str] = field(default_factory=dict)
    source: Any = None



def _attr_values(
    node_def: Any,
) -> tuple[dict[str, int | tuple[int, ...]], dict[str, int], str, tuple[tuple[str, str], ...], tuple[str, ...]]:
    """Type attrs, int attrs, kernel label, called functions (``(attr, function)`` pairs in
    attr-name order) and sorted attr names of a NodeDef.  Reads only; does not modify
    ``node_def``.

    Iterates the attr map by key and indexes it: the map's ``items()`` view is implemented in
    Python (``collections.abc``) and costs several times more per attribute.
    """
    types: dict[str, int | tuple[int, ...]] = {}
    ints: dict[str, int] = {}
    label = ""
    funcs: list[tuple[str, str]] = []
    attr_map = node_def.attr
    # Interned: a million nodes then share a few dozen attr-name strings (less memory, and
    # hashing or comparing them later hits the cache).
    keys = sorted(map(intern, attr_map))
    for key in keys:
        value = attr_map[key]
        kind = value.WhichOneof("value")
        if kind == "type":
            types[key] = value.type
        elif kind == "list":
            lst = value.list
            if lst.type:
                types[key] = tuple(lst.type)
            if lst.func:
                funcs.extend((key, f.name) for f in lst.func)
        elif kind == "i":
            ints[key] = value.i
        elif kind == "func":
            funcs.append((key, value.func.name))
        elif kind == "s" and key == "_kernel":
            label = value.s.decode("utf-8", "replace")
    return types, ints, label, tuple(funcs), tuple(keys)


def _add_proto_node(g: nx.MultiDiGraph, node_def: Any, index: int, *, unique: bool = False) -> str:
    """Add ``node_def`` as node ``(index, 0)`` of ``g`` and return its name (the very string
    object keying ``g``'s dicts).  Mutates ``g`` (not ``node_def``).  ``unique``: the caller
    checks the names for duplicates itself (see :func:`_import_main`).

    Writes networkx's adjacency dicts directly, with exactly the layout ``add_node`` gives
    (same dicts, same key order): the public method costs several microseconds per call
    (argument handling, cache clearing), which dominated the import of large graphs.  Safe
    because ``g`` is a fresh graph being built here, with no cached views to invalidate.
    """
    name = node_def.name
    if not unique and name in g._node:
        raise InvalidGraphError(f"duplicate node name {name!r}", node=name)
    if not name:
        raise InvalidGraphError("a node has an empty name")
    types, ints, label, func_attrs, attr_names = _attr_values(node_def)
    g._succ[name] = {}
    g._pred[name] = {}
    # Key order as ir.add_node writes it (kept so node dicts look the same either way).  Op
    # and device strings are interned: protobuf returns a new string object per read, and a
    # million nodes sharing a handful of them keeps every later comparison in the cache.
    g._node[name] = {
        "op": intern(node_def.op), "device": intern(node_def.device), "order": (index, 0),
        "dtypes": types, "ints": ints, "attr_names": attr_names, "label": label, "proto": node_def,
        "synthetic": None, "dirty": False,
        "funcs": tuple(sorted(f for _, f in func_attrs)) if func_attrs else (), "func_attrs": func_attrs,
    }
    return name


def _check_unique(names: list[str]) -> None:
    """Raise for the first name of ``names`` that repeats an earlier one."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InvalidGraphError(f"duplicate node name {name!r}", node=name)
        seen.add(name)


def _check_input_order(node: str, inputs: list[str]) -> None:
    seen_control = False
    for text in inputs:
        if text.startswith("^"):
            seen_control = True
        elif seen_control:
            raise InvalidGraphError(
                f"node {node!r} lists data input {text!r} after a control input", node=node
            )


def _import_main(gd: Any) -> nx.MultiDiGraph:
    """The IR of ``gd``'s node list (not its library).  Pure with respect to ``gd``."""
    g = nx.MultiDiGraph(kind="graph", name="")
    node_defs = list(gd.node)  # one Python wrapper per node, reused by both passes
    # The names as keyed in g: each edge is filed under its destination by the same string
    # object (not a second copy read from the NodeDef), so lookups compare pointers.
    # Duplicates are looked for once at the end (a lookup per node in a dict that grows to
    # a million entries is a cache miss each): they are rare, and then reported as the
    # per-node check would have, the first one first.
    names: list[str] = []
    try:
        for i, node_def in enumerate(node_defs):
            names.append(_add_proto_node(g, node_def, i, unique=True))
    except InvalidGraphError:
        _check_unique(names)  # a duplicate before the bad node would have been met first
        raise
    if len(g._node) != len(names):
        _check_unique(names)
    succ = g._succ
    # Each node's predecessor dict, in node order (names are unique: the dict is in the
    # same order), so that no destination is looked up by name.
    preds = list(g._pred.values())
    for dst, node_def, dst_pred in zip(names, node_defs, preds):
        inputs = node_def.input[:]
        if not inputs:
            continue
        port = 0
        seen_control = False
        for pos, text in enumerate(inputs):
            if text[:1] == "^" or ":" in text:
                try:
                    src, src_port = parse_graph_input(text)
                except ValueError as exc:
                    # A misplaced data input is reported first, wherever it is.
                    _check_input_order(dst, inputs)
                    raise InvalidGraphError(f"node {dst!r}: {exc}", node=dst) from None
            else:
                # The common case, a bare node name (output 0), without the parser's call.
                src, src_port = text, 0
            src_succ = succ.get(src)  # one lookup: it checks that src exists, too
            if src_succ is None:
                _check_input_order(dst, inputs)
                if not text:
                    raise InvalidGraphError(f"node {dst!r}: empty input name", node=dst)
                raise InvalidGraphError(
                    f"node {dst!r} has input {text!r}, which names a node that does not exist",
                    node=dst,
                )
            if src_port == CONTROL:
                seen_control = True
                key = -1 - pos
                data = {"src_port": CONTROL, "dst_port": CONTROL, "pos": pos, "text": text}
            else:
                if seen_control:
                    _check_input_order(dst, inputs)  # raises with the first offending input
                key = port
                data = {"src_port": src_port, "dst_port": port, "pos": port, "text": text}
                port += 1
            # MultiDiGraph.add_edge's dict layout, written directly as for the nodes: both
            # nodes exist and the key is new for (src, dst) (ports and control positions are
            # unique per destination).
            keydict = dst_pred.get(src)
            if keydict is None:
                src_succ[dst] = dst_pred[src] = {key: data}
            else:
                keydict[key] = data
    return g


def _is_parametrized(sig_def: Any) -> bool:
    if sig_def.attr:
        return True
    return any(
        a.type_attr or a.number_attr or a.type_list_attr
        for a in list(sig_def.input_arg) + list(sig_def.output_arg)
    )


def _op_signature(
    op: str, registry: OpRegistry, signatures: Mapping[str, OpSignature]
) -> OpSignature | None:
    sig = registry.op(op)
    if sig is None:
        sig = signatures.get(op)
    return sig


def _import_function(
    fdef: Any, registry: OpRegistry, signatures: Mapping[str, OpSignature]
) -> nx.MultiDiGraph:
    """Build the IR of one function body; ``ValueError`` when it cannot be resolved."""
    sig_def = fdef.signature
    # Grappler's function items preserve control outputs (their "keep ops") like fetches.
    g = nx.MultiDiGraph(kind="function", name=sig_def.name, keep=frozenset(fdef.control_ret.values()))
    n_args = len(sig_def.input_arg)
    for i, arg in enumerate(sig_def.input_arg):
        if arg.name in g:
            raise ValueError(f"duplicate argument {arg.name!r}")
        ir.add_node(
            g, arg.name, op="_Arg", device="", order=(i - n_args, 0),
            dtypes={"T": int(arg.type)}, ints={"index": i}, synthetic="arg",
        )
        g._node[arg.name]["dirty"] = False
    for i, node_def in enumerate(fdef.node_def):
        if node_def.name in g:
            raise ValueError(f"node name {node_def.name!r} is used twice (or as an argument)")
        _add_proto_node(g, node_def, i)
    # Before any edge: resolving one expands its producer's counts into ports.
    check_nodes(g, registry, signatures, f"function {sig_def.name}")
    body_count = len(fdef.node_def)
    ret_nodes = []
    for i, out in enumerate(sig_def.output_arg):
        name = f"{out.name}_RetVal"
        while name in g:
            name += "_"
        ir.add_node(
            g, name, op="_Retval", device="", order=(body_count + i, 0),
            dtypes={"T": int(out.type)}, ints={"index": i}, synthetic="retval",
        )
        g._node[name]["dirty"] = False
        g._node[name]["ret_key"] = out.name
        ret_nodes.append((name, fdef.ret.get(out.name)))

    def resolve(text: str) -> tuple[str, int]:
        ref = parse_function_input(text)
        if ref.node not in g:
            raise ValueError(f"input {text!r} names a node that does not exist")
        data = g._node[ref.node]
        if ref.out_arg is None or data["synthetic"] == "arg":
            return ref.node, 0 if ref.out_arg is None else ref.index
        if ref.out_arg == "":
            return ref.node, ref.index
        sig = _op_signature(data["op"], registry, signatures)
        if sig is None:
            raise ValueError(f"op {data['op']!r} of node {ref.node!r} is unknown")
        ranges = output_arg_ranges(sig, data["dtypes"], data["ints"], ref.node)
        if ref.out_arg not in ranges or ref.index >= ranges[ref.out_arg][1]:
            raise ValueError(f"input {text!r}: {data['op']} has no output {ref.out_arg}:{ref.index}")
        return ref.node, ranges[ref.out_arg][0] + ref.index

    for node_def in fdef.node_def:
        dst = node_def.name
        inputs = list(node_def.input)
        _check_input_order(dst, inputs)
        port = 0
        for pos, text in enumerate(inputs):
            if text.startswith("^"):
                src = text[1:]
                if src not in g:
                    raise ValueError(f"control input {text!r} of {dst!r} names a node that does not exist")
                g.add_edge(src, dst, key=-1 - pos, src_port=CONTROL, dst_port=CONTROL, pos=pos, text=text)
            else:
                src, src_port = resolve(text)
                ir.add_data_edge(g, src, src_port, dst, port, text)
                port += 1
    for name, text in ret_nodes:
        if text is None:
            raise ValueError(f"output {g._node[name]['ret_key']!r} has no ret entry")
        src, src_port = resolve(text)
        ir.add_data_edge(g, src, src_port, name, 0, text)
    check_nodes(g, registry, signatures, f"function {sig_def.name}")  # again, with the unknown ops' ports read
    return g


def import_graph_def(graph_def: Any, registry: OpRegistry) -> ImportedGraph:
    """Build the IR of ``graph_def`` and its function library.  Does not modify ``graph_def``.

    Raises :class:`InvalidGraphError` for duplicate names, dangling inputs, malformed
    input strings, or nodes that declare what TensorFlow cannot import safely
    (:func:`~amp_rewrite.graph.node_checks.check_nodes`) in the main graph.  Functions that
    cannot be resolved (such nodes included), or that are parametrized (their signature has
    type attributes, which Grappler does not optimize either), are listed in
    ``skipped_functions`` and left as they are.
    """
    check_call_graph(graph_def)
    signatures: dict[str, OpSignature] = {}
    for fdef in graph_def.library.function:
        signatures[fdef.signature.name] = signature_from_opdef(fdef.signature)
    main = _import_main(graph_def)
    check_nodes(main, registry, signatures, "the graph")
    main.graph["signatures"] = signatures
    main.graph["source"] = graph_def
    functions: dict[str, nx.MultiDiGraph] = {}
    skipped: dict[str, str] = {}
    for fdef in graph_def.library.function:
        name = fdef.signature.name
        if _is_parametrized(fdef.signature):
            skipped[name] = "parametrized function (its signature has type attributes)"
            continue
        try:
            fg = _import_function(fdef, registry, signatures)
        except (ValueError, InvalidGraphError) as exc:
            skipped[name] = f"cannot resolve its body: {exc}"
            log.warning("function %s is left unchanged: %s", name, skipped[name])
            continue
        fg.graph["signatures"] = signatures
        fg.graph["source"] = fdef
        functions[name] = fg
    return ImportedGraph(main, functions, skipped, graph_def)
