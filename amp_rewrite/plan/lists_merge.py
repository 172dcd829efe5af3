"""Combining the op lists: the layers' move semantics, the op-name checks, the gates, the
level and the edits, and the final :class:`OpLists`.

Part of :mod:`amp_rewrite.plan.lists` (which re-exports these names and whose ``load_lists``
runs them in the order its docstring gives).  Pure except the logging (under the logger
``amp_rewrite.plan.lists``) and :func:`_tensorflow_knows_op`, which imports TensorFlow.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from ..errors import ListError
from .lists_schema import _Entry, _Layer
from .lists_types import CATEGORIES, PRECISIONS, Category, Level, ListContext, ListEdit, OpLists

# The messages belong to the list loader (amp_rewrite.plan.lists), whose logger users and tests
# configure; this module is an implementation detail of it.
logger = logging.getLogger(__package__ + ".lists")


def _merge(layers: Sequence[_Layer]) -> dict[str, dict[str, _Entry]]:
    """Apply the layers in order with move semantics.  Returns a new dict; inputs untouched."""
    merged: dict[str, dict[str, _Entry]] = {p: {} for p in PRECISIONS}
    for index, layer in enumerate(layers):
        for precision in PRECISIONS:
            if layer.removes[precision] and index == 0:
                raise ListError(
                    f"[{precision}.remove] is only allowed in a file that extends another "
                    f"(or a user file layered on a profile)",
                    path=layer.location,
                )
            missing = sorted(op for op in layer.removes[precision] if op not in merged[precision])
            if missing:
                raise ListError(
                    f"[{precision}.remove] names op(s) on no list of the parent: {', '.join(missing)}",
                    path=layer.location,
                )
            for op in layer.removes[precision]:
                del merged[precision][op]
            # Keyed by op, so a child's entry replaces (moves) the parent's, whatever its list.
            merged[precision].update(layer.entries[precision])
    return merged


# ---------------------------------------------------------------------------------------------
# Op-name checks
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _tensorflow_knows_op(op: str) -> bool:
    """Whether TensorFlow's global op registry has ``op``.  Imports TensorFlow on first use."""
    # Imported lazily: importing TensorFlow takes seconds, and callers that pass their own
    # is_known_op never need it.
    from tensorflow.python.framework import op_def_registry

    return op_def_registry.get(op) is not None


def _check_known_ops(layers: Sequence[_Layer], is_known_op: Callable[[str], bool]) -> None:
    """Every entry of every layer (gated or not) must name an op TensorFlow knows."""
    unknown: list[str] = []
    for layer in layers:
        for precision in PRECISIONS:
            for op, entry in sorted(layer.entries[precision].items()):
                if entry.registered and not is_known_op(op):
                    unknown.append(f"{op} ({layer.location}, {precision}.{entry.category})")
        for key, tables in (("bounded", layer.bounded), ("identity", layer.identity),
                            ("float32_inputs", layer.float32_inputs)):
            for precision, table in tables.items():
                for op in sorted(table):
                    if not is_known_op(op):
                        unknown.append(f"{op} ({layer.location}, {precision}.{key})")
    if unknown:
        raise ListError(
            "unknown op name(s), not in TensorFlow's op registry: "
            + "; ".join(unknown)
            + ". Fix the spelling, or mark an op that OSS TensorFlow does not register with "
            "registered = false."
        )


# ---------------------------------------------------------------------------------------------
# Gates, level and edits
# ---------------------------------------------------------------------------------------------


def _gated_lists(merged: Mapping[str, _Entry], context: ListContext) -> dict[Category, dict[str, tuple[str, str]]]:
    """A new ``category -> op -> (reason, origin)`` dict of the entries of ``merged`` (one
    precision's merged entries) whose gates admit ``context``.  Pure."""
    lists: dict[Category, dict[str, tuple[str, str]]] = {c: {} for c in CATEGORIES}
    for op, entry in merged.items():
        if entry.applies(context):
            lists[entry.category][op] = (entry.reason, entry.origin)
    return lists


def _freeze_for_level(
    lists: dict[Category, dict[str, tuple[str, str]]], level: Level, context: ListContext
) -> tuple[Category, ...]:
    """The lists ``level`` freezes for ``context`` (edits of them are ignored), emptied in
    ``lists`` in place.  Only ``TENSOR_CORES_ONLY`` for float16 on cuda freezes any."""
    # TENSOR_CORES_ONLY (float16 on cuda): TensorFlow returns empty infer, deny and clear lists
    # without even reading their environment edits, so edits of those lists are ignored too
    # (verified against TF 2.21); allow and its edits are unaffected.
    frozen: tuple[Category, ...] = ()
    if level == "TENSOR_CORES_ONLY" and context.precision == "float16" and context.backend == "cuda":
        frozen = ("infer", "deny", "clear")
        for category in frozen:
            lists[category].clear()
    return frozen


def _deny_infer(lists: dict[Category, dict[str, tuple[str, str]]]) -> None:
    """Level ``TREAT_INFER_AS_DENY``: move every infer op to deny, in ``lists`` in place."""
    for op, (reason, origin) in lists["infer"].items():
        lists["deny"][op] = (f"{reason} [infer, denied by level TREAT_INFER_AS_DENY]", origin)
    lists["infer"].clear()


def _take_for_backend(entries: Mapping[str, Any], backend: str, into: dict[str, Any],
                      value: Callable[[Any], Any]) -> None:
    """Merge one layer's ``bounded`` or ``identity`` ``entries`` into ``into`` (mutated): an
    entry for ``backend`` sets its op's ``value(entry)``; one for other backends only drops what
    an earlier layer said about the op (a later layer's statement about an op overrides)."""
    for op, entry in entries.items():
        if backend in entry.backends:
            into[op] = value(entry)
        else:
            into.pop(op, None)


def _op_lists(
    lists: Mapping[Category, Mapping[str, tuple[str, str]]],
    profile_label: str,
    layers: Sequence[_Layer],
    version: str | None,
    context: ListContext,
    level: str = "DEFAULT",
    edited: frozenset[str] = frozenset(),
) -> OpLists:
    """The immutable :class:`OpLists` of the final ``lists``; the planner, the loop policy and
    the normalization policy (for ``context``'s precision and backend) are those of the last layer
    that sets each (``"greedy"`` and ``"float32"`` when none does).  An ``identity`` or
    ``bounded`` entry counts for the backends it names only.  A ``bounded`` or ``identity`` entry is
    the last layer's for its op, and is dropped where a later statement about the op overrides
    it: a later layer listing or removing the op (a user file that puts ``Exp`` on deny means
    it), an edit naming it (``edited``), an ``input_max`` of ``-inf``, the op not being on the
    final deny list, or level ``TREAT_INFER_AS_DENY`` (which asks for more float32, not less).
    Pure."""
    reasons = {op: reason for table in lists.values() for op, (reason, _) in table.items()}
    origins = {op: origin for table in lists.values() for op, (_, origin) in table.items()}
    precision = context.precision
    apply, why = next(((layer.normalization.apply, layer.normalization.reason) for layer in reversed(layers)
                       if layer.normalization and layer.normalization.applies(context)), ("float32", ""))
    hoist, hoist_why = next((layer.loops for layer in reversed(layers) if layer.loops), (False, ""))
    bounded: dict[str, tuple[float, str]] = {}
    identity: dict[str, str] = {}
    if level != "TREAT_INFER_AS_DENY":
        for layer in layers:
            for op in (*layer.entries[precision], *layer.removes[precision]):
                bounded.pop(op, None)
                identity.pop(op, None)
            _take_for_backend(layer.bounded.get(precision, {}), context.backend, bounded,
                              lambda bound: (bound.input_max, bound.reason))
            _take_for_backend(layer.identity.get(precision, {}), context.backend, identity,
                              lambda entry: entry.reason)
    bounded = {op: bounded[op] for op in sorted(bounded)
               if op in lists["deny"] and op not in edited and bounded[op][0] > -math.inf}
    identity = {op: identity[op] for op in sorted(identity) if op in lists["deny"] and op not in edited}
    # Asks for more float32, never less: under every level, for an op still on the deny list.
    float32_inputs: dict[str, str] = {}
    for layer in layers:
        for op in (*layer.entries[precision], *layer.removes[precision]):
            float32_inputs.pop(op, None)
        _take_for_backend(layer.float32_inputs.get(precision, {}), context.backend, float32_inputs,
                          lambda entry: entry.reason)
    float32_inputs = {op: float32_inputs[op] for op in sorted(float32_inputs) if op in lists["deny"]}
    return OpLists(
        allow=frozenset(lists["allow"]),
        infer=frozenset(lists["infer"]),
        deny=frozenset(lists["deny"]),
        clear=frozenset(lists["clear"]),
        reasons=MappingProxyType(reasons),
        origins=MappingProxyType(origins),
        profile=profile_label,
        planner=next((layer.planner for layer in reversed(layers) if layer.planner), "greedy"),
        normalization_apply=apply,
        normalization_reason=why,
        hoist_loop_casts=hoist,
        hoist_loop_casts_reason=hoist_why,
        bounded=MappingProxyType(bounded),
        identity=MappingProxyType(identity),
        float32_inputs=MappingProxyType(float32_inputs),
        tf_version=version,
    )


def _apply_edits(
    lists: dict[Category, dict[str, tuple[str, str]]],
    edits: Sequence[ListEdit],
    is_known_op: Callable[[str], bool],
    entries: Mapping[str, _Entry],
    frozen: Sequence[Category] = (),
) -> None:
    """Apply ``edits`` to ``lists`` in place, in order, skipping edits of ``frozen`` lists.

    Unknown op names are an error (even in skipped edits: a typo is a typo).
    """
    # An op the loaded files name (e.g. an unregistered internal op) may be edited too.
    # dict.fromkeys: one mention per op and origin (an argument that moves an op expands to
    # several edits of the same op).
    unknown = list(dict.fromkeys(
        f"{e.op} ({e.origin})" for e in edits if e.op not in entries and not is_known_op(e.op)))
    if unknown:
        raise ListError("list edit(s) name unknown op(s), not in TensorFlow's op registry: " + "; ".join(unknown))
    ignored = [f"{e.action} {e.op} ({e.origin})" for e in edits if e.category in frozen]
    if ignored:
        logger.warning(
            "level TENSOR_CORES_ONLY keeps the %s lists empty; ignoring edit(s): %s",
            "/".join(frozen), "; ".join(ignored),
        )
    for edit in edits:
        if edit.category in frozen:
            continue
        table = lists[edit.category]
        if edit.action == "add":
            # setdefault: re-adding an op keeps the reason of the entry already there.
            table.setdefault(edit.op, (f"added by {edit.origin}", edit.origin))
        elif table.pop(edit.op, None) is None:
            # Like TensorFlow, removing an absent op is not an error.
            logger.debug("%s: %s is not on the %s list; nothing to remove", edit.origin, edit.op, edit.category)


def _check_conflicts(lists: Mapping[Category, Mapping[str, tuple[str, str]]]) -> None:
    """TensorFlow refuses lists with an op on more than one list; so do we, naming them all."""
    where: dict[str, list[str]] = {}
    for category in CATEGORIES:
        for op, (_, origin) in lists[category].items():
            where.setdefault(op, []).append(f"{category} (from {origin})")
    conflicts = sorted((op, places) for op, places in where.items() if len(places) > 1)
    if conflicts:
        details = "; ".join(f"{op} is on {' and '.join(places)}" for op, places in conflicts)
        raise ListError(
            f"op lists have conflicting entries: {details}. Remove the op from the other list "
            "as well (e.g. with a matching *_REMOVE edit).",
            op=conflicts[0][0],
        )

