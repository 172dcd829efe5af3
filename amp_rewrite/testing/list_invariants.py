"""The invariants of the op lists: *allow/deny* (allow ops with a low-precision kernel are
converted on eligible devices, deny ops never, and the report agrees) and *monotone* (moving
an op to deny never grows the set of low-precision nodes).
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any, Iterable, Mapping, Sequence

from .facts import DT_FLOAT, dtype_name, low_dtype, scopes, type_values, low_precision_nodes
from .invariant_support import InvariantError, _graph_def, _options, _preserved, _rewrite


# ----------------------------------------------------------------------------- allow / deny


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
    precision; no deny op is (but one the report's ``bounded`` section names: its input was
    proven within the list's limit); no op on an ineligible device (or preserved) changed.

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
            if category == "deny" and not force and node.op in op_lists.bounded and changed:
                # A deny-list op with a bounded entry may run in low precision where its input
                # is proven within the limit: the report must say so, with the proof.
                section = report if report is None or scope.name == "" else report.get("functions", {}).get(scope.name, {})
                if section is None:
                    raise InvariantError("allow/deny", f"deny-list op {node.op} was converted; pass the report "
                                         "to check its range proof", node=name, scope=scope.name)
                if name in section.get("bounded", {}):
                    category = "infer"
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
