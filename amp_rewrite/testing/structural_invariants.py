"""The structural invariants: *valid* (dtypes agree across every edge, and the graph runs),
*interface* (the rewrite only retypes nodes and inserts Casts) and *minimal casts* (inserted
Casts are minimal in form).  Each reads GraphDefs with TensorFlow's registries, not the
product's type analysis.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import numpy as np

from .facts import (
    DT_FLOAT,
    Scope,
    control_inputs,
    data_inputs,
    dtype_name,
    exact_conversion,
    input_dtypes,
    is_inserted_cast,
    library_of,
    output_dtypes,
    output_port,
    parse_input,
    scopes,
    sinks,
    tensor_dtype,
    type_values,
)
from .invariant_support import InvariantError, _graph_def, _preserved, _serialize


# ----------------------------------------------------------------------------- valid


def check_valid(before: Any, after: Any, report: Any = None, *,
                feeds: Mapping[str, np.ndarray] | None = None,
                outputs: Sequence[str] | None = None, run: bool = True) -> None:
    """**valid**: dtypes agree across every edge, and the graph imports and runs.

    ``outputs`` (tensor names) default to every output of every node nothing reads from;
    ``feeds`` default to uniform values in [-1, 1] for every Placeholder.
    """
    after = _graph_def(after)
    library = library_of(after)
    for scope in scopes(after).values():
        for node in scope.nodes.values():
            _check_node_types(scope, node, library)
        if scope.function is not None:
            sig = scope.function.signature
            for arg in sig.output_arg:
                text = scope.function.ret.get(arg.name)
                if text is None:
                    raise InvariantError("valid", f"output {arg.name!r} has no return value", scope=scope.name)
                got = _tensor_dtype(scope, text, library, "valid", scope.name)
                if got != int(arg.type):
                    raise InvariantError("valid", f"returns {dtype_name(got)} for output {arg.name!r} "
                                         f"declared {dtype_name(arg.type)}", node=text, scope=scope.name)
    if not run:
        return
    from .execute import graph_outputs, random_feeds, run_graph

    before = _graph_def(before)
    if feeds is None:
        feeds = random_feeds(before)
    if outputs is None:
        outputs = graph_outputs(after)
    try:
        run_graph(after, feeds, outputs)
    except Exception as exc:  # noqa: BLE001 - any failure to run breaks the invariant
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        node = re.search(r"node '?([^\s'}]+)", str(exc))
        raise InvariantError("valid", f"the rewritten graph does not run: {type(exc).__name__}: {first}",
                             node=node.group(1) if node else None) from None


def _tensor_dtype(scope: Scope, text: str, library: Mapping[str, Any], invariant: str, node: str) -> int:
    try:
        return tensor_dtype(scope, text, library)
    except (KeyError, IndexError) as exc:
        raise InvariantError(invariant, f"input {text!r} does not resolve: {exc}", node=node,
                             scope=scope.name) from None


def _check_node_types(scope: Scope, node: Any, library: Mapping[str, Any]) -> None:
    try:
        expected = input_dtypes(node, library)
    except KeyError as exc:
        raise InvariantError("valid", str(exc), node=node.name, scope=scope.name) from None
    inputs = data_inputs(node)
    if len(inputs) != len(expected):
        raise InvariantError("valid", f"{node.op} takes {len(expected)} data input(s), has {len(inputs)}",
                             node=node.name, scope=scope.name)
    for i, (text, want) in enumerate(zip(inputs, expected)):
        got = _tensor_dtype(scope, text, library, "valid", node.name)
        if got != want:
            raise InvariantError(
                "valid", f"input {i} ({text!r}) carries {dtype_name(got)} but {node.op} expects "
                f"{dtype_name(want)} there", node=node.name, scope=scope.name)
    _check_call_signatures(scope, node, library)


#: Ops that call functions of the library, and per op: the attribute naming each callee (a
#: list attribute for ``Case``), and the type attributes its arguments and results must match.
_CALLS: dict[str, tuple[str, str, str]] = {
    "PartitionedCall": ("f", "Tin", "Tout"), "StatefulPartitionedCall": ("f", "Tin", "Tout"),
    "While": ("cond body", "T", "T"), "StatelessWhile": ("cond body", "T", "T"),
    "If": ("then_branch else_branch", "Tin", "Tout"), "StatelessIf": ("then_branch else_branch", "Tin", "Tout"),
    "Case": ("branches", "Tin", "Tout"), "StatelessCase": ("branches", "Tin", "Tout"),
}


def _check_call_signatures(scope: Scope, node: Any, library: Mapping[str, Any]) -> None:
    """A call's type attributes must be its callees' signatures: a function is rewritten on
    its own and keeps its signature, so a call painted otherwise does not run ("passed
    bfloat16 expected float").  A loop's condition returns a bool, not the loop variables."""
    spec = _CALLS.get(node.op)
    if spec is None:
        return
    attrs, tin_attr, tout_attr = spec
    tin = [int(t) for t in node.attr[tin_attr].list.type]
    tout = [int(t) for t in node.attr[tout_attr].list.type]
    for attr in attrs.split():
        value = node.attr[attr]
        for callee in ([f.name for f in value.list.func] if value.HasField("list") else [value.func.name]):
            if callee not in library:
                continue
            sig = library[callee].signature
            ins = [int(a.type) for a in sig.input_arg]
            outs = [int(a.type) for a in sig.output_arg]
            if ins != tin or (attr != "cond" and outs != tout):
                which = tin_attr if tin_attr == tout_attr else f"{tin_attr}/{tout_attr}"
                raise InvariantError("valid", f"{which} of {node.op} does not match the signature of its {attr} "
                                     f"{callee!r}", node=node.name, scope=scope.name)


# ----------------------------------------------------------------------------- interface

_RENAMES = {"FusedBatchNorm": "FusedBatchNormV2", "FusedBatchNormGrad": "FusedBatchNormGradV2"}


def _origin(scope: Scope, inserted: set[str], text: str, library: Mapping[str, Any]) -> tuple[str, int]:
    """The tensor an input reads, looking through inserted Casts."""
    node, port = output_port(scope, text, library)
    seen = set()
    while node in inserted and node not in seen:
        seen.add(node)
        node, port = output_port(scope, data_inputs(scope.nodes[node])[0], library)
    return node, port


def check_interface(before: Any, after: Any, report: Any = None, *,
                    fetches: Sequence[str] | None = None) -> None:
    """**interface**: graph outputs and fetches keep their names and dtypes; every original
    node is still there with its op (FusedBatchNorm may become its V2), device, control
    edges and non-type attributes, and reads the same tensors (through inserted Casts); type
    attributes only change between float32 and the low precision; function signatures do not
    change; the only new nodes are Casts.
    """
    before, after = _graph_def(before), _graph_def(after)
    b_lib, a_lib = library_of(before), library_of(after)
    b_scopes, a_scopes = scopes(before), scopes(after)
    if set(b_scopes) != set(a_scopes):
        gone, new = sorted(set(b_scopes) - set(a_scopes)), sorted(set(a_scopes) - set(b_scopes))
        raise InvariantError("interface", f"functions removed {gone}, added {new}")
    for name, f in b_lib.items():
        if _serialize(f.signature) != _serialize(a_lib[name].signature):
            raise InvariantError("interface", "the function signature changed", scope=name)
    for scope in b_scopes.values():
        a_scope = a_scopes[scope.name]
        inserted = {n for n, node in a_scope.nodes.items() if n not in scope.nodes}
        for n in sorted(inserted):
            node = a_scope.nodes[n]
            if not is_inserted_cast(node, scope):
                raise InvariantError("interface", f"a new {node.op} node that is not an inserted Cast",
                                     node=n, scope=scope.name)
            if control_inputs(node) or len(data_inputs(node)) != 1:
                raise InvariantError("interface", "an inserted Cast must have one data input and no "
                                     "control input", node=n, scope=scope.name)
        for name, node in scope.nodes.items():
            new = a_scope.nodes.get(name)
            if new is None:
                raise InvariantError("interface", "an original node is missing", node=name, scope=scope.name)
            _check_same_node(scope, a_scope, node, new, inserted, b_lib, a_lib)
    preserved = sinks(before) if fetches is None else [parse_input(f)[0] for f in fetches]
    b_main, a_main = b_scopes[""].nodes, a_scopes[""].nodes
    for name in preserved:
        if name not in b_main:
            continue
        old, new = output_dtypes(b_main[name], b_lib), output_dtypes(a_main[name], a_lib)
        if old != new:
            raise InvariantError("interface", f"a graph output / fetch changed its output dtypes from "
                                 f"{[dtype_name(t) for t in old]} to {[dtype_name(t) for t in new]}", node=name)


def _check_same_node(scope: Scope, a_scope: Scope, node: Any, new: Any, inserted: set[str],
                     b_lib: Mapping[str, Any], a_lib: Mapping[str, Any]) -> None:
    name, where = node.name, scope.name
    renamed = _RENAMES.get(node.op)
    if new.op != node.op and new.op != renamed:
        raise InvariantError("interface", f"op changed from {node.op} to {new.op}", node=name, scope=where)
    if new.device != node.device:
        raise InvariantError("interface", f"device changed from {node.device!r} to {new.device!r}",
                             node=name, scope=where)
    if control_inputs(new) != control_inputs(node):
        raise InvariantError("interface", f"control inputs changed from {control_inputs(node)} to "
                             f"{control_inputs(new)}", node=name, scope=where)
    b_types, a_types = type_values(node), type_values(new)
    for key in sorted(set(node.attr) | set(new.attr)):
        if key not in new.attr or key not in node.attr:
            if renamed and new.op == renamed and key == "U" and key not in node.attr:
                continue
            raise InvariantError("interface", f"attribute {key!r} was added or removed", node=name, scope=where)
        kind = node.attr[key].WhichOneof("value")
        if kind not in ("type", "list") or (kind == "list" and not len(node.attr[key].list.type)):
            if _serialize(node.attr[key]) != _serialize(new.attr[key]):
                raise InvariantError("interface", f"non-type attribute {key!r} changed", node=name, scope=where)
    lows = {DT_FLOAT, 19, 14}
    for k, old in b_types.items():
        now = a_types.get(k)
        if now != old and not (old in lows and now in lows and DT_FLOAT in (old, now)):
            raise InvariantError("interface", f"type attribute {k} changed from {dtype_name(old)} to "
                                 f"{dtype_name(now) if now is not None else 'nothing'}", node=name, scope=where)
    old_inputs, new_inputs = data_inputs(node), data_inputs(new)
    if len(old_inputs) != len(new_inputs):
        raise InvariantError("interface", f"has {len(new_inputs)} data inputs instead of {len(old_inputs)}",
                             node=name, scope=where)
    for i, (old_text, new_text) in enumerate(zip(old_inputs, new_inputs)):
        try:
            want = output_port(scope, old_text, b_lib)
            got = _origin(a_scope, inserted, new_text, a_lib)
        except (KeyError, IndexError) as exc:
            raise InvariantError("interface", f"input {i} does not resolve: {exc}", node=name, scope=where) from None
        if got == want:
            continue
        # A folded chain: the original input was an exact Cast, now read around.
        src = scope.nodes.get(want[0])
        if (src is not None and src.op == "Cast"
                and exact_conversion(src.attr["SrcT"].type, src.attr["DstT"].type)
                and output_port(scope, data_inputs(src)[0], b_lib) == got):
            continue
        raise InvariantError("interface", f"input {i} read {old_text!r} and now reads {got[0]}:{got[1]} "
                             f"(through {new_text!r})", node=name, scope=where)


# ----------------------------------------------------------------------------- minimal casts


def check_minimal_casts(before: Any, after: Any, report: Mapping[str, Any] | None = None, *,
                        target: Any = "auto", precision: str = "float16",
                        fetches: Sequence[str] | None = None, exclude: str | None = None) -> None:
    """**casts are minimal in form**: no Cast -> Cast chain that involves an inserted Cast whose
    first conversion is exact, no inserted Cast whose output nobody uses, no inserted Cast that
    does not convert, and at most one inserted Cast per (tensor, dtype).  The report's cast
    counts, when given, match the graph.

    The one chain that must stay is an inserted Cast feeding an original Cast that may not
    change: one that is preserved (``fetches``/graph outputs, ``exclude``, a function's
    control outputs) or on a device of ``target`` not eligible for ``precision``; folding the
    chain would rewrite that Cast.  (With ``tensorflow_bugs=True`` nothing is folded, like
    TensorFlow, and this invariant does not apply.)
    """
    from amp_rewrite import resolve_target

    before, after = _graph_def(before), _graph_def(after)
    b_scopes = scopes(before)
    library = library_of(after)
    tgt = resolve_target(target)
    total = 0
    for scope in scopes(after).values():
        original = b_scopes.get(scope.name)
        inserted = {n for n, node in scope.nodes.items() if is_inserted_cast(node, original)}
        frozen: set[str] = set()
        if original is not None:
            frozen = _preserved(original, before, fetches, exclude) | {
                n for n, node in original.nodes.items() if not tgt.node_is_eligible(node.device, precision)}
        total += len(inserted)
        used: set[str] = set()
        for node in scope.nodes.values():
            used.update(parse_input(t)[0] for t in node.input)
        for ret in (scope.function.ret.values() if scope.function is not None else ()):
            used.add(parse_input(ret)[0])
        seen: dict[tuple[str, int, int], str] = {}
        for name in sorted(inserted):
            node = scope.nodes[name]
            src_t, dst_t = int(node.attr["SrcT"].type), int(node.attr["DstT"].type)
            if src_t == dst_t:
                raise InvariantError("minimal casts", f"casts {dtype_name(src_t)} to itself", node=name,
                                     scope=scope.name)
            if name not in used:
                raise InvariantError("minimal casts", "nobody reads this inserted Cast", node=name,
                                     scope=scope.name)
            key = (*output_port(scope, data_inputs(node)[0], library), dst_t)
            if key in seen:
                raise InvariantError("minimal casts", f"casts {key[0]}:{key[1]} to {dtype_name(dst_t)} like "
                                     f"{seen[key]!r}", node=name, scope=scope.name)
            seen[key] = name
        for name, node in scope.nodes.items():
            if node.op != "Cast":
                continue
            src, _ = output_port(scope, data_inputs(node)[0], library)
            producer = scope.nodes.get(src)
            if producer is None or producer.op != "Cast" or not (name in inserted or src in inserted):
                continue
            if src in inserted and name not in inserted and name in frozen:
                continue  # folding would change a Cast that must not change
            if exact_conversion(int(producer.attr["SrcT"].type), int(producer.attr["DstT"].type)):
                raise InvariantError(
                    "minimal casts", f"Cast chain {src} ({dtype_name(producer.attr['SrcT'].type)} -> "
                    f"{dtype_name(producer.attr['DstT'].type)}, exact) -> {name}", node=name, scope=scope.name)
    if report is not None:
        counted = report.get("casts_to_low", 0) + report.get("casts_to_high", 0)
        if counted != total:
            raise InvariantError("minimal casts", f"the report counts {counted} inserted casts, the graph "
                                 f"has {total}")
