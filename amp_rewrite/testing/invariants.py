"""The invariants of a mixed precision rewrite, each callable on its own.

Every ``check_*`` function takes the GraphDef before the rewrite, the GraphDef after it and
the report (``None`` where it is not needed), plus the options the rewrite ran with, and
raises :class:`InvariantError` (an ``AssertionError``) naming the invariant and the node when
the invariant does not hold.  :func:`check_rewrite` runs several at once.

The checks read GraphDefs with TensorFlow's own op registry and kernel registry, not with
amp_rewrite's type analysis, so they do not trust the code they check.  Only the op lists
(:func:`amp_rewrite.resolve_lists`) and device placement (:class:`amp_rewrite.Target`)
come from the product: they are its specification.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from typing import Any, Callable, Iterable, Mapping, Sequence

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
    low_dtype,
    output_dtypes,
    output_port,
    parse_input,
    scopes,
    sinks,
    tensor_dtype,
    type_values,
    converted_type_attrs,
    low_precision_nodes,
)

__all__ = [
    "InvariantError",
    "INVARIANTS",
    "DEFAULT_INVARIANTS",
    "check_rewrite",
    "check_valid",
    "check_allow_deny",
    "check_interface",
    "check_minimal_casts",
    "check_idempotent",
    "check_deterministic",
    "check_monotone",
    "check_numerics",
    "check_parity",
    "NUMERIC_TOLERANCE",
]

#: Keyword arguments of :func:`amp_rewrite.rewrite_graph_def` the checks pass through.
REWRITE_OPTIONS = (
    "target", "precision", "lists", "lists_file", "fetches", "add", "remove", "level",
    "exclude", "functions", "tensorflow_bugs", "use_env", "registry", "planner",
)

#: Error allowed per level of low-precision ops, relative to the magnitude of the values
#: involved: a few roundings (unit roundoff 2**-11 for float16, 2**-8 for bfloat16) per op.
NUMERIC_TOLERANCE = {"float16": 4 * 2.0 ** -11, "bfloat16": 4 * 2.0 ** -8}


class InvariantError(AssertionError):
    """An invariant does not hold: ``invariant``, and where (``node`` in ``scope``)."""

    def __init__(self, invariant: str, message: str, *, node: str | None = None, scope: str = "") -> None:
        self.invariant = invariant
        self.node = node
        self.scope = scope
        where = ""
        if node is not None:
            where = f" node {node!r}" + (f" of function {scope!r}" if scope else "")
        super().__init__(f"invariant {invariant!r} broken at{where or ' graph'}: {message}")


def _graph_def(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        from amp_rewrite.graph.io import parse_graph_def

        return parse_graph_def(bytes(value))
    return value


def _rewrite(before: Any, options: Mapping[str, Any]) -> Any:
    import amp_rewrite

    return amp_rewrite.rewrite_graph_def(before, **options)


def _serialize(graph_def: Any) -> bytes:
    return graph_def.SerializeToString(deterministic=True)


def _options(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(kwargs) - set(REWRITE_OPTIONS))
    if unknown:
        raise TypeError(f"unknown rewrite option(s) {unknown}; expected some of {list(REWRITE_OPTIONS)}")
    return {k: v for k, v in kwargs.items() if v is not None or k == "fetches"}


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
    if node.op in ("PartitionedCall", "StatefulPartitionedCall") and node.attr["f"].func.name in library:
        sig = library[node.attr["f"].func.name].signature
        tin = [int(t) for t in node.attr["Tin"].list.type]
        tout = [int(t) for t in node.attr["Tout"].list.type]
        if tin != [int(a.type) for a in sig.input_arg] or tout != [int(a.type) for a in sig.output_arg]:
            raise InvariantError("valid", f"Tin/Tout do not match the signature of {sig.name!r}",
                                 node=node.name, scope=scope.name)


# ----------------------------------------------------------------------------- allow / deny


def _preserved(scope: Scope, before: Any, fetches: Sequence[str] | None, exclude: str | None) -> set[str]:
    if scope.function is not None:
        keep = set(scope.function.control_ret.values())
    elif fetches is None:
        keep = set(sinks(before))
    else:
        keep = {parse_input(f)[0] for f in fetches}
    if exclude:
        pattern = re.compile(exclude)
        keep |= {n for n in scope.nodes if pattern.search(n)}
    return keep


def _rewritten_functions(before: Any, report: Mapping[str, Any] | None, functions: str) -> set[str]:
    names = set()
    for f in before.library.function:
        sig = f.signature
        parametrized = bool(sig.attr) or any(
            a.type_attr or a.number_attr or a.type_list_attr for a in list(sig.input_arg) + list(sig.output_arg))
        if not parametrized:
            names.add(sig.name)
    if functions == "reachable":
        from amp_rewrite.graph.io import reachable_functions

        names &= reachable_functions(before)
    if report is not None:
        names -= set(report.get("skipped_functions", {}))
    return names


@functools.lru_cache(maxsize=None)
def _kernels(op: str) -> tuple[tuple[str, str, tuple[tuple[str, frozenset[int]], ...]], ...]:
    """TensorFlow's registered kernels of ``op``: (device type, label, type constraints)."""
    from tensorflow.python.framework import kernels

    return tuple(
        (k.device_type, k.label, tuple((c.name, frozenset(c.allowed_values.list.type)) for c in k.constraint))
        for k in kernels.get_registered_kernels_for_op(op).kernel
    )


def _kernel_exists(op: str, device_type: str, attrs: Mapping[str, int], label: str = "") -> bool:
    """Whether TensorFlow registers a kernel for ``op`` on ``device_type`` accepting ``attrs``."""
    for kernel_device, kernel_label, constraints in _kernels(op):
        if kernel_device not in (device_type, "DEFAULT") or kernel_label != label:
            continue
        if all(name not in attrs or attrs[name] in allowed for name, allowed in constraints):
            return True
    return False


def _allowed_types(op: str, attr: str) -> set[int] | None:
    from tensorflow.python.framework import op_def_registry

    op_def = op_def_registry.get(op)
    if op_def is None:
        return set()
    for a in op_def.attr:
        if a.name == attr:
            return set(a.allowed_values.list.type) or None
    return set()


def check_allow_deny(
    before: Any, after: Any, report: Mapping[str, Any] | None = None, *,
    target: Any = "auto", precision: str = "float16", lists: Any = "default", lists_file: Any = None,
    add: Mapping[str, Iterable[str]] | None = None, remove: Mapping[str, Iterable[str]] | None = None,
    level: str | None = None, fetches: Sequence[str] | None = None, exclude: str | None = None,
    functions: str = "all", use_env: bool = True, tensorflow_bugs: bool = False, registry: Any = None,
    planner: str | None = None,
) -> None:
    """**allow/deny**: every allow op on an eligible device with a low-precision kernel is low
    precision; no deny op is; no op on an ineligible device (or preserved) changed.

    Under the ``optimal`` planner an allow op may stay float32, but only where the report
    says the cost model kept it (so the report is then required).

    The report, when given, must agree: a node is converted exactly when the report paints
    it ``allow`` in the low precision (or it was already low precision).
    """
    from amp_rewrite import resolve_lists, resolve_target

    before, after = _graph_def(before), _graph_def(after)
    tgt = resolve_target(target)
    op_lists, lvl = resolve_lists(lists, target=tgt, precision=precision, lists_file=lists_file, add=add,
                                  remove=remove, level=level, environ=os.environ if use_env else {})
    force = lvl == "UNSAFE_FORCE_ALL"
    optimal = (planner or op_lists.planner) == "optimal"
    if optimal and report is None:
        raise TypeError("check_allow_deny needs the report under the optimal planner")
    low = low_dtype(precision)
    rewritten = _rewritten_functions(before, report, functions)
    a_scopes = scopes(after)
    default_type = tgt.default_device().type
    for scope in scopes(before).values():
        if scope.function is not None and scope.name not in rewritten:
            continue
        a_scope = a_scopes[scope.name]
        keep = _preserved(scope, before, fetches, exclude)
        for name, node in scope.nodes.items():
            new = a_scope.nodes.get(name)
            if new is None:
                raise InvariantError("allow/deny", "the node is gone", node=name, scope=scope.name)
            b_types, a_types = type_values(node), type_values(new)
            eligible = name not in keep and tgt.node_is_eligible(node.device, precision)
            changed = {k: (v, a_types.get(k)) for k, v in b_types.items() if a_types.get(k) != v}
            if not eligible:
                if changed:
                    k, (old, now) = next(iter(sorted(changed.items())))
                    why = "it is preserved" if name in keep else f"its device {node.device or '(default)'!r} is not eligible"
                    raise InvariantError("allow/deny", f"{node.op} changed {k} from {dtype_name(old)} to "
                                         f"{dtype_name(now)} although {why}", node=name, scope=scope.name)
                continue
            category = op_lists.category_of(node.op)
            if category == "deny" and not force:
                for k, (old, now) in sorted(changed.items()):
                    if old == DT_FLOAT:
                        raise InvariantError("allow/deny", f"deny-list op {node.op} has {k} converted to "
                                             f"{dtype_name(now)}", node=name, scope=scope.name)
            if category == "allow":
                device = node.device or ""
                parsed = re.search(r"(?:device:)?([A-Za-z_]+):\d+$", device)
                device_type = parsed.group(1).upper() if parsed else default_type
                for k, old in sorted(b_types.items()):
                    if old != DT_FLOAT or "[" in k or any(v in (11, 12, 13, 15, 16) for v in b_types.values()):
                        continue
                    allowed = _allowed_types(node.op, k)
                    if allowed is not None and low not in allowed:
                        continue
                    label = node.attr["_kernel"].s.decode() if "_kernel" in node.attr else ""
                    if not _kernel_exists(node.op, device_type, {**b_types, k: low}, label):
                        continue
                    if a_types.get(k) != low and optimal and "cost model" in _reason_of(
                            report, scope.name, name, k):
                        continue  # the optimal planner kept it float32, and says why
                    if a_types.get(k) != low:
                        raise InvariantError(
                            "allow/deny", f"allow-list op {node.op} on an eligible device kept {k} "
                            f"{dtype_name(a_types.get(k, 0))}, though a {precision} kernel exists",
                            node=name, scope=scope.name)
    if report is not None:
        _check_report_agrees(before, after, report, low, precision)


def _reason_of(report: Mapping[str, Any] | None, scope: str, node: str, attr: str) -> str:
    """The report's reason for one type attribute of a node ('' when it has none)."""
    if report is None:
        return ""
    section = report if scope == "" else report.get("functions", {}).get(scope, {})
    entry = section.get("nodes", {}).get(node, {})
    attrs = entry.get("attrs", {})
    for key, value in attrs.items():
        if key == attr or key.startswith(attr + "["):
            return str(value.get("reason", ""))
    return str(entry.get("reason", ""))


def _check_report_agrees(before: Any, after: Any, report: Mapping[str, Any], low: int, precision: str) -> None:
    converted = low_precision_nodes(before, after, low)
    b_scopes = scopes(before)
    sections = {"": report.get("nodes", {})}
    sections.update({f: sec.get("nodes", {}) for f, sec in report.get("functions", {}).items()})
    for scope_name, nodes in sections.items():
        scope = b_scopes.get(scope_name)
        if scope is None:
            continue
        for name, entry in nodes.items():
            if name not in scope.nodes:
                continue
            is_converted = (scope_name, name) in converted
            says_low = entry.get("color") == "allow" and entry.get("dtype") == precision
            already_low = low in type_values(scope.nodes[name]).values()
            if is_converted and not says_low:
                raise InvariantError("allow/deny", f"converted in the graph, but the report says "
                                     f"{entry.get('color')}/{entry.get('dtype')}", node=name, scope=scope_name)
            if says_low and not (is_converted or already_low):
                raise InvariantError("allow/deny", f"the report says allow/{precision}, but no type "
                                     "attribute changed", node=name, scope=scope_name)


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


# ----------------------------------------------------------------------------- idempotent


def _first_difference(a: Any, b: Any) -> tuple[str | None, str]:
    sa, sb = scopes(a), scopes(b)
    for name in sorted(set(sa) | set(sb)):
        if name not in sa or name not in sb:
            return None, name
        na, nb = sa[name].nodes, sb[name].nodes
        for n in list(na) + [n for n in nb if n not in na]:
            if n not in na or n not in nb or _serialize(na[n]) != _serialize(nb[n]):
                return n, name
    return None, ""


def check_idempotent(before: Any, after: Any, report: Any = None, **rewrite_options: Any) -> None:
    """**idempotent**: rewriting the rewritten graph (same options) changes nothing."""
    after = _graph_def(after)
    again = _rewrite(after, _options(rewrite_options)).graph_def
    if _serialize(again) != _serialize(after):
        node, scope = _first_difference(after, again)
        raise InvariantError("idempotent", "a second rewrite changed the graph", node=node, scope=scope)


# ----------------------------------------------------------------------------- deterministic


def _digest(graph_def: Any, report: Any) -> tuple[str, str]:
    return (hashlib.sha256(_serialize(graph_def)).hexdigest(),
            hashlib.sha256(json.dumps(report, sort_keys=True).encode()).hexdigest())


def check_deterministic(before: Any, after: Any, report: Any, *, hash_seeds: Sequence[int] = (),
                        **rewrite_options: Any) -> None:
    """**deterministic**: the same input gives byte-identical output and an identical report,
    in this process and in fresh processes with each ``PYTHONHASHSEED`` of ``hash_seeds``.
    """
    before, after = _graph_def(before), _graph_def(after)
    options = _options(rewrite_options)
    again = _rewrite(before, options)
    if _serialize(again.graph_def) != _serialize(after):
        node, scope = _first_difference(after, again.graph_def)
        raise InvariantError("deterministic", "a second run gave a different graph", node=node, scope=scope)
    if report is not None and json.dumps(again.report, sort_keys=True) != json.dumps(report, sort_keys=True):
        raise InvariantError("deterministic", "a second run gave a different report")
    if hash_seeds:
        from .hashseed import rewrite_digests

        want = _digest(after, report if report is not None else again.report)
        for seed, got in rewrite_digests(_serialize(before), options, hash_seeds).items():
            if got != want:
                part = "graph" if got[0] != want[0] else "report"
                raise InvariantError("deterministic", f"with PYTHONHASHSEED={seed} the {part} differs")


# ----------------------------------------------------------------------------- monotone


def _moved_to_deny(options: Mapping[str, Any], op: str) -> dict[str, Any]:
    moved = dict(options)
    add = {k: [o for o in ([v] if isinstance(v, str) else list(v)) if o != op]
           for k, v in (options.get("add") or {}).items() if k != "deny"}
    deny = options.get("add", {}).get("deny", []) if options.get("add") else []
    deny = [deny] if isinstance(deny, str) else list(deny)
    add["deny"] = deny + [op]
    moved["add"] = {k: v for k, v in add.items() if v}
    return moved


def check_monotone(before: Any, after: Any, report: Any = None, *, ops: Iterable[str] | None = None,
                   **rewrite_options: Any) -> None:
    """**monotone**: moving an op from any list to deny never grows the set of low-precision
    nodes.  ``ops`` defaults to every op type of the graph that TensorFlow registers.
    """
    from tensorflow.python.framework import op_def_registry

    before, after = _graph_def(before), _graph_def(after)
    options = _options(rewrite_options)
    low = low_dtype(options.get("precision", "float16"))
    baseline = low_precision_nodes(before, after, low)
    if ops is None:
        found = {n.op for n in before.node} | {n.op for f in before.library.function for n in f.node_def}
        ops = sorted(o for o in found if op_def_registry.get(o) is not None)
    for op in ops:
        moved = _rewrite(before, _moved_to_deny(options, op))
        grown = sorted(low_precision_nodes(before, moved.graph_def, low) - baseline)
        if grown:
            scope, node = grown[0]
            raise InvariantError("monotone", f"moving {op} to deny made it low precision "
                                 f"({len(grown)} node(s) newly converted)", node=node, scope=scope)


# ----------------------------------------------------------------------------- numerics


def _low_depth(before: Any, after: Any, low: int) -> dict[str, int]:
    """Per main-graph node of ``after``: the most low-precision ops on a path into it."""
    a_scopes = scopes(after)
    library = library_of(after)

    def weight(scope: Scope, node: Any, fdepth: Mapping[str, int]) -> int:
        if node.op in ("PartitionedCall", "StatefulPartitionedCall"):
            return fdepth.get(node.attr["f"].func.name, 0)
        return 1 if low in type_values(node).values() else 0

    def longest(scope: Scope, fdepth: Mapping[str, int]) -> dict[str, int]:
        depth: dict[str, int] = {}
        order = list(scope.nodes)
        pending = set(order)
        # Iterate to a fixed point over the DAG (loop back edges from NextIteration ignored).
        for _ in range(len(order) + 1):
            progress = False
            for name in order:
                if name not in pending:
                    continue
                node = scope.nodes[name]
                srcs = [parse_input(t)[0] for t in node.input]
                srcs = [s for s in srcs if s in scope.nodes and scope.nodes[s].op != "NextIteration"]
                if any(s in pending for s in srcs):
                    continue
                depth[name] = max([depth[s] for s in srcs], default=0) + weight(scope, node, fdepth)
                pending.discard(name)
                progress = True
            if not progress:
                break
        for name in pending:
            depth[name] = len(order)
        return depth

    fdepth: dict[str, int] = {}
    for fname, scope in a_scopes.items():
        if fname:
            fdepth[fname] = max(longest(scope, {}).values(), default=0)
    del library
    return longest(a_scopes[""], fdepth)


def check_numerics(before: Any, after: Any, report: Any = None, *,
                   feeds: Mapping[str, np.ndarray] | None = None, outputs: Sequence[str] | None = None,
                   precision: str = "float16", rtol: float | None = None) -> None:
    """**numerics**: every float output of the rewritten graph is within a tolerance of the
    float32 graph's, and finite wherever the float32 output is finite.

    The tolerance is ``rtol`` (default :data:`NUMERIC_TOLERANCE`) times one plus the number of
    low-precision ops on the longest path into the output, times the largest magnitude of the
    output and of the float32 values it is computed from (at least 1).
    """
    from .execute import graph_outputs, loop_frame_nodes, random_feeds, run_graph

    before, after = _graph_def(before), _graph_def(after)
    if feeds is None:
        feeds = random_feeds(before)
    if outputs is None:
        outputs = graph_outputs(before)
    library = library_of(before)
    main = scopes(before)[""]
    outputs = [o for o in outputs if tensor_dtype(main, o, library) == DT_FLOAT]
    if not outputs:
        return
    # Every float32 tensor of the main graph (outside loops), to know the magnitudes involved.
    frame = loop_frame_nodes(before)
    inner = []
    for node in before.node:
        if node.name in frame:
            continue
        for port, t in enumerate(output_dtypes(node, library)):
            if t == DT_FLOAT:
                inner.append(f"{node.name}:{port}")
    ref_all = run_graph(before, feeds, list(outputs) + inner)
    got = run_graph(after, feeds, outputs)
    ref, inner_values = ref_all[:len(outputs)], dict(zip(inner, ref_all[len(outputs):]))
    ancestors = _ancestors(before)
    depth = _low_depth(before, after, low_dtype(precision))
    per_level = rtol if rtol is not None else NUMERIC_TOLERANCE[precision]
    for name, r, g in zip(outputs, ref, got):
        node = parse_input(name)[0]
        if g.dtype != r.dtype or g.shape != r.shape:
            raise InvariantError("numerics", f"output {name} is {g.dtype}{list(g.shape)}, float32 gave "
                                 f"{r.dtype}{list(r.shape)}", node=node)
        finite = np.isfinite(r)
        if not np.all(np.isfinite(g[finite])):
            raise InvariantError("numerics", f"output {name} is not finite where float32 is", node=node)
        scale = 1.0
        for a in ancestors.get(node, ()) | {node}:
            for key, value in inner_values.items():
                if parse_input(key)[0] == a and value.size:
                    with np.errstate(invalid="ignore"):
                        m = np.max(np.abs(value[np.isfinite(value)]), initial=0.0)
                    scale = max(scale, float(m))
        if np.any(finite):
            err = float(np.max(np.abs(g[finite].astype(np.float64) - r[finite].astype(np.float64))))
            levels = depth.get(node, 0) + 1
            tol = per_level * levels * scale
            if not err <= tol:
                raise InvariantError("numerics", f"output {name} differs from float32 by {err:.3g} > "
                                     f"{tol:.3g} ({levels} level(s) x {per_level:.2g} x magnitude {scale:.3g})",
                                     node=node)


def _ancestors(graph_def: Any) -> dict[str, set[str]]:
    preds = {n.name: [parse_input(t)[0] for t in n.input] for n in graph_def.node}
    memo: dict[str, set[str]] = {}
    for start in preds:
        seen: set[str] = set()
        stack = list(preds[start])
        while stack:
            x = stack.pop()
            if x in seen or x not in preds:
                continue
            seen.add(x)
            stack.extend(preds[x])
        memo[start] = seen
    return memo


# ----------------------------------------------------------------------------- parity


def check_parity(before: Any, after: Any, report: Any = None, *, reference: Any,
                 precision: str = "float16") -> None:
    """**parity**: the (node, type attribute) pairs converted equal those of ``reference``
    (TensorFlow's own pass on the same graph, see :func:`~amp_rewrite.testing.reference.
    tensorflow_reference`), and we insert no more casts than it does.
    """
    before, after, reference = _graph_def(before), _graph_def(after), _graph_def(reference)
    low = low_dtype(precision)
    ours = converted_type_attrs(before, after, low)
    theirs = converted_type_attrs(before, reference, low)
    if ours != theirs:
        only_ours, only_theirs = sorted(ours - theirs), sorted(theirs - ours)
        first = (only_ours or only_theirs)[0]
        raise InvariantError("parity", f"only amp_rewrite converted {only_ours[:6]}; only TensorFlow "
                             f"converted {only_theirs[:6]}", node=first[1], scope=first[0])
    b_scopes = scopes(before)

    def new_casts(gd: Any) -> int:
        return sum(1 for name, sc in scopes(gd).items() for n, node in sc.nodes.items()
                   if node.op == "Cast" and n not in b_scopes.get(name, Scope("", {})).nodes)

    if new_casts(after) > new_casts(reference):
        raise InvariantError("parity", f"{new_casts(after)} casts inserted, TensorFlow needs "
                             f"{new_casts(reference)}")


# ----------------------------------------------------------------------------- all at once

INVARIANTS: dict[str, Callable[..., None]] = {
    "valid": check_valid,
    "allow/deny": check_allow_deny,
    "interface": check_interface,
    "minimal casts": check_minimal_casts,
    "idempotent": check_idempotent,
    "deterministic": check_deterministic,
    "monotone": check_monotone,
    "numerics": check_numerics,
    "parity": check_parity,
}

#: What :func:`check_rewrite` checks unless told otherwise (parity needs a reference graph).
DEFAULT_INVARIANTS = ("valid", "interface", "allow/deny", "minimal casts", "idempotent",
                      "deterministic", "monotone", "numerics")


def check_rewrite(before: Any, after: Any, report: Mapping[str, Any] | None, *,
                  invariants: Sequence[str] = DEFAULT_INVARIANTS,
                  feeds: Mapping[str, np.ndarray] | None = None, outputs: Sequence[str] | None = None,
                  reference: Any = None, hash_seeds: Sequence[int] = (), monotone_ops: Iterable[str] | None = None,
                  rtol: float | None = None, **rewrite_options: Any) -> None:
    """Check the invariants of one rewrite: ``after``/``report`` came from
    ``amp_rewrite.rewrite_graph_def(before, **rewrite_options)``.

    ``invariants`` picks which (names as in :data:`INVARIANTS`); ``feeds``/``outputs`` run the
    graphs for *valid* and *numerics*; ``reference`` (TensorFlow's own rewrite of ``before``)
    is needed for *parity*; ``hash_seeds`` makes *deterministic* also compare fresh processes.
    Raises :class:`InvariantError` for the first invariant that does not hold.
    """
    options = _options(rewrite_options)
    unknown = sorted(set(invariants) - set(INVARIANTS))
    if unknown:
        raise ValueError(f"unknown invariant(s) {unknown}; known: {list(INVARIANTS)}")
    before, after = _graph_def(before), _graph_def(after)
    precision = options.get("precision", "float16")
    for name in invariants:
        if name == "valid":
            check_valid(before, after, report, feeds=feeds, outputs=outputs)
        elif name == "allow/deny":
            check_allow_deny(before, after, report, **{k: v for k, v in options.items() if k != "registry"})
        elif name == "interface":
            check_interface(before, after, report, fetches=options.get("fetches"))
        elif name == "minimal casts":
            check_minimal_casts(before, after, report, **{k: v for k, v in options.items()
                                                          if k in ("target", "precision", "fetches", "exclude")})
        elif name == "idempotent":
            check_idempotent(before, after, report, **options)
        elif name == "deterministic":
            check_deterministic(before, after, report, hash_seeds=hash_seeds, **options)
        elif name == "monotone":
            check_monotone(before, after, report, ops=monotone_ops, **options)
        elif name == "numerics":
            check_numerics(before, after, report, feeds=feeds, outputs=outputs, precision=precision, rtol=rtol)
        elif name == "parity":
            if reference is None:
                raise ValueError("the parity invariant needs reference= (TensorFlow's own rewrite)")
            check_parity(before, after, report, reference=reference, precision=precision)
