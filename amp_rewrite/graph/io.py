"""Import and export: GraphDef / FunctionDef protobufs <-> the networkx IR.

This is the only module that reads or writes protobuf messages.  Import builds one
``MultiDiGraph`` for the GraphDef and one per function in its library (see
:mod:`amp_rewrite.graph.ir` for the schema); export turns them back into a GraphDef.  Nodes the
rewrite did not touch are emitted as copies of their original NodeDef, and functions with no
changed node as copies of their original FunctionDef, so a round trip without changes is
byte-identical.  The caller's protobuf is never modified.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from sys import intern
from typing import Any, Mapping

import networkx as nx

from . import ir
from ..errors import GraphFormatError, InvalidGraphError
from .op_registry import OpRegistry, OpSignature, signature_from_opdef
from .tensor_names import CONTROL, format_graph_input, parse_function_input, parse_graph_input
from .type_attrs import output_arg_ranges

__all__ = [
    "ImportedGraph",
    "parse_graph_def",
    "load_graph_def",
    "import_graph_def",
    "export_graph_def",
    "reachable_functions",
    "check_call_graph",
    "check_binary_readable",
    "MAX_CALL_DEPTH",
]

log = logging.getLogger(__name__)


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


def _graph_def_class() -> Any:
    from tensorflow.core.framework import graph_pb2

    return graph_pb2.GraphDef


def parse_graph_def(data: bytes, *, path: str | None = None) -> Any:
    """Parse serialized GraphDef bytes.  :class:`GraphFormatError` if they are not one."""
    from google.protobuf.message import DecodeError

    gd = _graph_def_class()()
    try:
        gd.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise GraphFormatError(f"not a GraphDef (protobuf could not parse it: {exc})", path=path) from None
    except RecursionError:
        raise GraphFormatError("not a GraphDef: messages are nested too deeply", path=path) from None
    if data and not gd.node and not gd.library.function:
        # Random bytes sometimes parse as an empty message made of unknown fields.
        raise GraphFormatError("not a GraphDef (no nodes and no functions found)", path=path)
    return gd


def check_binary_readable(message: Any, *, path: str | None = None) -> None:
    """Raise :class:`GraphFormatError` if ``message`` (parsed from text) could not be read
    back from its binary form: the text parser accepts deeper nesting (``func`` attrs inside
    ``func`` attrs) than the binary decoder TensorFlow and this package use, so such a graph
    would fail later, or be written as an output nothing can read."""
    from google.protobuf.message import DecodeError

    try:
        type(message).FromString(message.SerializeToString())
    except (DecodeError, RecursionError, ValueError, RuntimeError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise GraphFormatError(f"messages are nested too deeply to be read in binary form ({detail})",
                               path=path) from None


def load_graph_def(path: str | os.PathLike[str]) -> Any:
    """Read a frozen GraphDef from ``.pb`` (binary) or ``.pbtxt`` (text) file."""
    from google.protobuf import text_format

    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise GraphFormatError(f"cannot read file: {exc.strerror}", path=p) from None
    if p.endswith((".pbtxt", ".txt")):
        gd = _graph_def_class()()
        try:
            text_format.Parse(data.decode("utf-8"), gd)
        except (text_format.ParseError, UnicodeDecodeError) as exc:
            raise GraphFormatError(f"not a text GraphDef: {exc}", path=p) from None
        except RecursionError:
            # The text parser recurses into nested messages (``func`` attrs in ``func`` attrs).
            raise GraphFormatError("not a text GraphDef: messages are nested too deeply", path=p) from None
        check_binary_readable(gd, path=p)
        return gd
    return parse_graph_def(data, path=p)


# ----------------------------------------------------------------------------------- import


def _attr_values(
    node_def: Any,
) -> tuple[dict[str, int | tuple[int, ...]], dict[str, int], str, tuple[str, ...], tuple[str, ...]]:
    """Type attrs, int attrs, kernel label, called functions and sorted attr names of a
    NodeDef.  Reads only; does not modify ``node_def``.

    Iterates the attr map by key and indexes it: the map's ``items()`` view is implemented in
    Python (``collections.abc``) and costs several times more per attribute.
    """
    types: dict[str, int | tuple[int, ...]] = {}
    ints: dict[str, int] = {}
    label = ""
    funcs: list[str] = []
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
                funcs.extend(f.name for f in lst.func)
        elif kind == "i":
            ints[key] = value.i
        elif kind == "func":
            funcs.append(value.func.name)
        elif kind == "s" and key == "_kernel":
            label = value.s.decode("utf-8", "replace")
    return types, ints, label, tuple(sorted(funcs)) if funcs else (), tuple(keys)


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
    types, ints, label, funcs, attr_names = _attr_values(node_def)
    g._succ[name] = {}
    g._pred[name] = {}
    # Key order as ir.add_node writes it (kept so node dicts look the same either way).  Op
    # and device strings are interned: protobuf returns a new string object per read, and a
    # million nodes sharing a handful of them keeps every later comparison in the cache.
    g._node[name] = {
        "op": intern(node_def.op), "device": intern(node_def.device), "order": (index, 0),
        "dtypes": types, "ints": ints, "attr_names": attr_names, "label": label, "proto": node_def,
        "synthetic": None, "dirty": False, "funcs": funcs,
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
    return g


def import_graph_def(graph_def: Any, registry: OpRegistry) -> ImportedGraph:
    """Build the IR of ``graph_def`` and its function library.  Does not modify ``graph_def``.

    Raises :class:`InvalidGraphError` for duplicate names, dangling inputs or malformed
    input strings in the main graph.  Functions that cannot be resolved, or that are
    parametrized (their signature has type attributes, which Grappler does not optimize
    either), are listed in ``skipped_functions`` and left as they are.
    """
    check_call_graph(graph_def)
    signatures: dict[str, OpSignature] = {}
    for fdef in graph_def.library.function:
        signatures[fdef.signature.name] = signature_from_opdef(fdef.signature)
    main = _import_main(graph_def)
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


def _called_functions(node_defs: Any, library: set[str]) -> set[str]:
    called = set()
    if not library:
        return called
    for nd in node_defs:
        if nd.op in library:
            called.add(nd.op)
        attr_map = nd.attr
        for key in attr_map:  # by key: the map's values() view is slow pure Python
            value = attr_map[key]
            kind = value.WhichOneof("value")
            if kind == "func" and value.func.name in library:
                called.add(value.func.name)
            elif kind == "list":
                called.update(f.name for f in value.list.func if f.name in library)
    return called


def _calls_closure(graph_def: Any, start: set[str]) -> set[str]:
    """``start`` and every library function those call, directly or not.  Pure."""
    by_name = {f.signature.name: f for f in graph_def.library.function}
    names = set(by_name)
    todo = list(start)
    seen = set(todo)
    while todo:
        fdef = by_name[todo.pop()]
        for callee in _called_functions(fdef.node_def, names) - seen:
            seen.add(callee)
            todo.append(callee)
    return seen


#: The longest chain of nested function calls accepted.  TensorFlow's own runtime and shape
#: inference walk call chains recursively in C++; real models nest a few levels (a Keras
#: layer's call inside a While body inside a signature), so this is far above any of them and
#: far below a stack overflow.
MAX_CALL_DEPTH = 256


def check_call_graph(graph_def: Any) -> None:
    """Raise :class:`InvalidGraphError` if the function library calls itself (a function
    calling itself, or functions calling each other in a cycle) or if a chain of nested calls
    is deeper than :data:`MAX_CALL_DEPTH`.

    TensorFlow has no recursion in graphs (a recursive call never terminates as dataflow),
    and its C++ shape inference and function instantiation overflow the stack on such
    libraries, killing the process.  Checked before anything hands the graph to TensorFlow.
    Iterative (Kahn's algorithm over the call graph); reads ``graph_def`` only.
    """
    fdefs = list(graph_def.library.function)
    if not fdefs:
        return
    names = {f.signature.name for f in fdefs}
    callees = {f.signature.name: _called_functions(f.node_def, names) for f in fdefs}
    # Longest chain of calls below each function, computed from the callees up: a function is
    # done once everything it calls is.
    pending = {name: len(callees[name]) for name in names}
    called_by: dict[str, list[str]] = {name: [] for name in names}
    for name, called in callees.items():
        for callee in called:
            called_by[callee].append(name)
    depth = dict.fromkeys(names, 1)
    ready = [name for name, k in pending.items() if k == 0]
    done = 0
    while ready:
        name = ready.pop()
        done += 1
        for caller in called_by[name]:
            depth[caller] = max(depth[caller], depth[name] + 1)
            pending[caller] -= 1
            if pending[caller] == 0:
                ready.append(caller)
    if done < len(names):
        cyclic = sorted(name for name, k in pending.items() if k > 0)
        shown = ", ".join(repr(n) for n in cyclic[:3]) + (" ..." if len(cyclic) > 3 else "")
        raise InvalidGraphError(
            f"the function library is recursive ({len(cyclic)} function(s) call themselves, "
            f"directly or through others: {shown}); TensorFlow graphs cannot recurse")
    deepest = max(depth.values())
    if deepest > MAX_CALL_DEPTH:
        top = min((n for n in names if depth[n] == deepest))
        raise InvalidGraphError(
            f"function calls nest {deepest} deep (from {top!r}); at most {MAX_CALL_DEPTH} "
            "levels are accepted")


def reachable_functions(graph_def: Any) -> set[str]:
    """Names of library functions called, directly or through other functions, by the graph.

    Calls are ops named after a function and ``func`` / ``list(func)`` attributes (While
    bodies, If branches, PartitionedCall targets).  Grappler optimizes exactly these.
    """
    names = {f.signature.name for f in graph_def.library.function}
    return _calls_closure(graph_def, _called_functions(graph_def.node, names))


#: Ops whose ``cond``/``body`` functions run once per iteration.
_LOOP_OPS = frozenset({"While", "StatelessWhile", "_While"})


def loop_functions(graph_def: Any) -> set[str]:
    """Names of the library functions that run inside a loop: the bodies and conditions of the
    While ops of the graph and of its functions, and every function those call.  Pure."""
    names = {f.signature.name for f in graph_def.library.function}
    loops = [nd for nd in graph_def.node if nd.op in _LOOP_OPS]
    for fdef in graph_def.library.function:
        loops.extend(nd for nd in fdef.node_def if nd.op in _LOOP_OPS)
    return _calls_closure(graph_def, _called_functions(loops, names))


# ----------------------------------------------------------------------------------- export


def _set_type_attr(attr_map: Any, name: str, value: int | tuple[int, ...]) -> None:
    if isinstance(value, tuple):
        attr_map[name].list.type[:] = list(value)
    else:
        attr_map[name].type = value


def _edge_text(
    g: nx.MultiDiGraph, src: str, src_port: int, registry: OpRegistry
) -> str:
    """Spell a reference to ``src:src_port`` for an edge the rewrite created."""
    if g.graph["kind"] == "graph":
        from .tensor_names import TensorRef

        return format_graph_input(TensorRef(src, src_port))
    data = g._node[src]
    if data["synthetic"] == "arg":
        return src
    sig = _op_signature(data["op"], registry, g.graph["signatures"])
    assert sig is not None, f"op {data['op']} vanished from the registry"
    for arg, (start, count) in output_arg_ranges(sig, data["dtypes"], data["ints"], src).items():
        if start <= src_port < start + count:
            return f"{src}:{arg}:{src_port - start}"
    raise AssertionError(f"output {src_port} of {src} does not exist")


def _node_inputs(g: nx.MultiDiGraph, name: str, registry: OpRegistry) -> list[str]:
    """The input strings of ``name``: data inputs by port, then control inputs in their
    original order.  Edges the rewrite created are spelled here.  Reads ``g`` only."""
    return _inputs_from(g, name, g._pred[name], registry)


def _inputs_from(g: nx.MultiDiGraph, name: str, pred: dict, registry: OpRegistry) -> list[str]:
    """:func:`_node_inputs` given the node's predecessor dict (``g._pred[name]``)."""
    data_edges = []
    control_edges = []
    in_graph = g.graph["kind"] == "graph"
    for u, keyed in pred.items():  # networkx's dict, read directly (see import)
        for d in keyed.values():
            if d["dst_port"] == CONTROL:
                control_edges.append((d["pos"], d["text"] or "^" + u))
            else:
                text = d["text"]
                if not text:
                    port = d["src_port"]
                    if in_graph:
                        # format_graph_input's spelling, inlined: it runs for every new edge.
                        text = u if port == 0 else f"{u}:{port}"
                    else:
                        text = _edge_text(g, u, port, registry)
                data_edges.append((d["dst_port"], text))
    if len(data_edges) > 1:
        data_edges.sort()
    if control_edges:
        control_edges.sort()
        return [t for _, t in data_edges] + [t for _, t in control_edges]
    return [t for _, t in data_edges]


def _fill_from(
    g: nx.MultiDiGraph, name: str, data: dict, pred: dict, registry: OpRegistry, nd: Any,
    templates: dict[tuple[object, ...], Any],
) -> None:
    """Write node ``name`` of ``g``, given its attribute and predecessor dicts, into ``nd``,
    a new empty NodeDef.  Mutates ``nd`` only.

    A node the rewrite made (a Cast) is copied from a template NodeDef with its op, device
    and attrs, kept in ``templates`` for the next node alike: one copy instead of an attr
    map write per attribute.
    """
    proto = data["proto"]
    if proto is not None:
        nd.CopyFrom(proto)
        _apply_changes(g, name, data, pred, registry, nd)
        return
    dtypes = data["dtypes"]
    bools = data.get("bools", {})
    key = (data["op"], data["device"], tuple(sorted(dtypes.items())), tuple(sorted(bools.items())))
    template = templates.get(key)
    if template is None:
        template = templates[key] = type(nd)()
        template.op = data["op"]
        template.device = data["device"]
        attr_map = template.attr
        for attr in sorted(dtypes):
            _set_type_attr(attr_map, attr, dtypes[attr])
        for attr, value in sorted(bools.items()):
            attr_map[attr].b = value
    nd.CopyFrom(template)
    nd.name = name
    nd.input.extend(_inputs_from(g, name, pred, registry))


def _apply_changes(
    g: nx.MultiDiGraph, name: str, data: dict, pred: dict, registry: OpRegistry, nd: Any
) -> None:
    """Write what the rewrite changed on an imported node into ``nd``, a copy of its NodeDef:
    its op, its changed type attrs and, if rewired, its inputs.  Mutates ``nd`` only."""
    nd.op = data["op"]
    changed = data.get("changed_attrs")
    if changed:
        attr_map = nd.attr
        dtypes = data["dtypes"]
        for attr in sorted(changed):
            _set_type_attr(attr_map, attr, dtypes[attr])
    if data.get("inputs_changed"):
        del nd.input[:]
        nd.input.extend(_inputs_from(g, name, pred, registry))


def _export_nodes(g: nx.MultiDiGraph, registry: OpRegistry, container: Any) -> None:
    """Append ``g``'s nodes, in node order, to ``container`` (an empty repeated NodeDef field,
    which this mutates).  Changed nodes are built in place (``container.add()``) rather than
    built and then copied in; runs of unchanged ones are copied with one ``extend``."""
    pending: list[Any] = []
    add = container.add
    templates: dict[tuple[object, ...], Any] = {}
    names, datas, _, preds = ir.ordered_entries(g, succ=False)
    for name, data, pred in zip(names, datas, preds):  # type: ignore[arg-type]
        if data["synthetic"]:
            continue
        if data["dirty"]:
            if pending:
                container.extend(pending)
                pending = []
            _fill_from(g, name, data, pred, registry, add(), templates)
        else:
            pending.append(data["proto"])
    if pending:
        container.extend(pending)


def _export_main_in_place(g: nx.MultiDiGraph, registry: OpRegistry, container: Any) -> bool:
    """Turn ``container``, a copy of the node list ``g`` was imported from, into ``g``'s
    node list: changed nodes are edited where they are, new ones appended, then all put in
    node order.  Mutates ``container``; returns False (and leaves it to be refilled) when
    ``g``'s imported nodes are not exactly the container's, in its order.

    Copying the whole list is one C-level copy; copying node by node (:func:`_export_nodes`)
    costs microseconds per node, seconds on graphs of a million nodes.
    """
    names, datas, _, preds = ir.node_entries(g, succ=False)
    size = len(container)
    old_keys: list[tuple[int, int]] = []  # order of container[i], for i < size
    new_keys: list[tuple[int, int]] = []  # order of the nodes appended, in turn
    add = container.add
    templates: dict[tuple[object, ...], Any] = {}
    for name, data, pred in zip(names, datas, preds):  # type: ignore[arg-type]
        if data["synthetic"]:
            return False
        order = data["order"]
        if data["proto"] is None:
            _fill_from(g, name, data, pred, registry, add(), templates)
            new_keys.append(order)
            continue
        # Imported node i has order (i, 0); they come first, in the dict's insertion order.
        i = len(old_keys)
        if order[0] != i or order[1] != 0 or i >= size:
            return False
        old_keys.append(order)
        if data["dirty"]:
            _apply_changes(g, name, data, pred, registry, container[i])
    if len(old_keys) != size:
        return False
    if new_keys:
        # Sort the container by node order.  Its elements are the imported nodes, then the
        # appended ones: keys in that order, handed out one per call, as list.sort (which
        # the container's sort uses) computes each element's key once, first to last.
        keys = iter(old_keys + new_keys)
        container.sort(key=lambda _: next(keys))
    return True


def _export_function(fg: nx.MultiDiGraph, registry: OpRegistry) -> Any:
    from tensorflow.core.framework import function_pb2

    source = fg.graph["source"]
    if not any(d["dirty"] for _, d in fg.nodes(data=True)):
        return source
    fdef = function_pb2.FunctionDef()
    fdef.CopyFrom(source)
    del fdef.node_def[:]
    _export_nodes(fg, registry, fdef.node_def)
    for name, data in fg.nodes(data=True):
        if data["synthetic"] == "retval":
            (text,) = _node_inputs(fg, name, registry)
            fdef.ret[data["ret_key"]] = text
    return fdef


def export_graph_def(imported: ImportedGraph, registry: OpRegistry) -> Any:
    """Build a new GraphDef from the IR.  Untouched nodes and functions are copied verbatim."""
    source = imported.source
    gd = _graph_def_class()()
    # Copy everything (versions, library, unknown fields) and then replace what changed.
    gd.CopyFrom(source)
    if any(d["dirty"] for _, d in imported.graph.nodes(data=True)):
        if not _export_main_in_place(imported.graph, registry, gd.node):
            del gd.node[:]
            _export_nodes(imported.graph, registry, gd.node)
    for i, fdef in enumerate(source.library.function):
        fg = imported.functions.get(fdef.signature.name)
        if fg is not None:
            new = _export_function(fg, registry)
            if new is not fdef:
                gd.library.function[i].CopyFrom(new)
    return gd
