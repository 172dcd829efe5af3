"""Type analysis: which input and output ports each type attribute of a node governs.

A node's ports are expanded from its op signature exactly as TensorFlow does: an argument
with ``type_list_attr`` gives one port per list element (id ``Tin[i]``); one with
``number_attr`` gives ``N`` ports sharing its ``type_attr``; a fixed-type argument gives a
port whose id is the dtype itself (``int32``, ``variant``...).  Type attributes that govern
no port (``TensorListReserve.element_dtype``) are ids too.  Decisions are made per id, so
``FusedBatchNormV3`` can have ``T`` in float16 and ``U`` in float32.

Ops missing from the registry (custom ops) get an opaque description from their
neighbours: every port gets a fixed id carrying the dtype seen on the other end of the
edge, so they are never painted but casts next to them are placed correctly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, NamedTuple

from . import dtypes as dt
from ..errors import InvalidGraphError
from .op_registry import ArgSpec, OpSignature
from .tensor_names import MAX_PORTS

__all__ = ["TypeAttr", "NodeTypes", "node_types", "opaque_node_types", "output_arg_ranges",
           "output_dtypes", "get_dtype"]


class TypeAttr(NamedTuple):
    """Identifies one type attribute of a node (TensorFlow's ``TypeAttrId``).

    ``TypeAttr("T", -1, 0)`` is attr ``T``; ``TypeAttr("Tin", 2, 0)`` is element 2 of the
    list attr ``Tin``; ``TypeAttr("", -1, dt.INT32)`` is a fixed ``int32`` port.
    """

    attr: str
    index: int
    fixed: int

    def __str__(self) -> str:
        if not self.attr:
            return dt.name(self.fixed)
        if self.index >= 0:
            return f"{self.attr}[{self.index}]"
        return self.attr

    @property
    def is_fixed(self) -> bool:
        return not self.attr


@dataclass(frozen=True)
class NodeTypes:
    """The type ids of one node: per input port, per output port, and all distinct ids.

    ``dtypes`` holds the node's type attrs with OpDef defaults filled in; ``known`` is False
    for ops found neither in the registry nor in the function library.
    """

    inputs: tuple[TypeAttr, ...]
    outputs: tuple[TypeAttr, ...]
    attrs: tuple[TypeAttr, ...]
    dtypes: Mapping[str, int | tuple[int, ...]]
    known: bool = True

    def ports_of(self, ta: TypeAttr) -> tuple[list[int], list[int]]:
        """Input ports and output ports governed by ``ta``."""
        return (
            [i for i, t in enumerate(self.inputs) if t == ta],
            [i for i, t in enumerate(self.outputs) if t == ta],
        )


def get_dtype(types: Mapping[str, int | tuple[int, ...]], ta: TypeAttr) -> int:
    """The current dtype of ``ta`` (``dt.INVALID`` when the attr is missing or out of range)."""
    if not ta.attr:
        return ta.fixed
    value = types.get(ta.attr)
    if value is None:
        return dt.INVALID
    if ta.index < 0:
        return value if isinstance(value, int) else dt.INVALID
    if isinstance(value, int) or ta.index >= len(value):
        return dt.INVALID
    return value[ta.index]


def _arg_ports(
    arg: ArgSpec,
    types: Mapping[str, int | tuple[int, ...]],
    ints: Mapping[str, int],
    node: str,
) -> list[TypeAttr]:
    if arg.type_list_attr:
        value = types.get(arg.type_list_attr, ())
        count = len(value) if isinstance(value, tuple) else 0
        return [TypeAttr(arg.type_list_attr, i, 0) for i in range(count)]
    count = ints.get(arg.number_attr, 1) if arg.number_attr else 1
    if not 0 <= count <= MAX_PORTS:
        # The importer refuses such a node first (node_checks.check_nodes); checked here
        # too because the list below would take memory in proportion to the count.
        raise InvalidGraphError(
            f"node {node!r} has {arg.number_attr} = {count}; a count must be between 0 and {MAX_PORTS}", node=node
        )
    if arg.type_attr:
        if arg.type_attr not in types:
            raise InvalidGraphError(
                f"type attribute {arg.type_attr!r} is not present in node {node!r}", node=node
            )
        ta = TypeAttr(arg.type_attr, -1, 0)
    else:
        ta = TypeAttr("", -1, arg.fixed_type)
    return [ta] * count


def _with_defaults(
    sig: OpSignature,
    types: Mapping[str, int | tuple[int, ...]],
    ints: Mapping[str, int],
) -> tuple[dict[str, int | tuple[int, ...]], dict[str, int]]:
    full_types = dict(types)
    full_ints = dict(ints)
    for a in sig.attrs.values():
        if a.type in ("type", "list(type)") and a.name not in full_types and a.default is not None:
            full_types[a.name] = a.default
        elif a.type == "int" and a.name not in full_ints and a.default is not None:
            full_ints[a.name] = a.default
    return full_types, full_ints


def output_arg_ranges(
    sig: OpSignature,
    types: Mapping[str, int | tuple[int, ...]],
    ints: Mapping[str, int],
    node: str = "",
) -> dict[str, tuple[int, int]]:
    """Map each output argument name to ``(first flat port, count)``.

    Used to turn FunctionDef references ``node:out_arg:i`` into flat output ports.
    """
    full_types, full_ints = _with_defaults(sig, types, ints)
    ranges = {}
    start = 0
    for arg in sig.outputs:
        n = len(_arg_ports(arg, full_types, full_ints, node))
        ranges[arg.name] = (start, n)
        start += n
    return ranges


def output_dtypes(
    sig: OpSignature | None,
    types: Mapping[str, int | tuple[int, ...]],
    ints: Mapping[str, int],
) -> list[int] | None:
    """The dtype of each flat output port of a node of op ``sig`` with these type and int
    attrs (OpDef defaults filled in); ``None`` for an unknown op or a missing type attr.
    Pure."""
    if sig is None:
        return None
    full_types, full_ints = _with_defaults(sig, types, ints)
    try:
        ports = [ta for arg in sig.outputs for ta in _arg_ports(arg, full_types, full_ints, sig.name)]
    except InvalidGraphError:
        return None
    return [get_dtype(full_types, ta) for ta in ports]


def node_types(
    name: str,
    op: str,
    types: Mapping[str, int | tuple[int, ...]],
    ints: Mapping[str, int],
    attr_names: tuple[str, ...],
    n_inputs: int,
    sig: OpSignature,
) -> NodeTypes:
    """Expand ``sig`` for one node.  Pure; raises :class:`InvalidGraphError` like TF would.

    ``n_inputs`` is the node's number of data (non-control) inputs.
    """
    full_types, full_ints = _with_defaults(sig, types, ints)
    inputs: list[TypeAttr] = []
    for arg in sig.inputs:
        inputs.extend(_arg_ports(arg, full_types, full_ints, name))
    if len(inputs) != n_inputs:
        raise InvalidGraphError(
            f"expected {op} node {name!r} to have {len(inputs)} data input(s), but it has {n_inputs}",
            node=name,
            op=op,
        )
    outputs: list[TypeAttr] = []
    for arg in sig.outputs:
        outputs.extend(_arg_ports(arg, full_types, full_ints, name))
    seen: dict[TypeAttr, None] = {}
    for ta in inputs + outputs:
        seen.setdefault(ta, None)
    for attr in attr_names:
        if attr.startswith("_"):
            continue
        spec = sig.attrs.get(attr)
        if spec is None:
            raise InvalidGraphError(
                f"node {name!r} has attribute {attr!r}, which op {op} does not define",
                node=name,
                op=op,
            )
        if spec.type == "type":
            seen.setdefault(TypeAttr(attr, -1, 0), None)
        elif spec.type == "list(type)":
            value = full_types.get(attr, ())
            for i in range(len(value) if isinstance(value, tuple) else 0):
                seen.setdefault(TypeAttr(attr, i, 0), None)
    return NodeTypes(tuple(inputs), tuple(outputs), tuple(seen), full_types, True)


def opaque_node_types(
    input_dtypes: list[int], output_dtypes: list[int], types: Mapping[str, int | tuple[int, ...]]
) -> NodeTypes:
    """Describe a node whose op is unknown: one fixed id per distinct dtype seen on its edges."""
    inputs = tuple(TypeAttr("", -1, d) for d in input_dtypes)
    outputs = tuple(TypeAttr("", -1, d) for d in output_dtypes)
    seen: dict[TypeAttr, None] = {}
    for ta in inputs + outputs:
        seen.setdefault(ta, None)
    return NodeTypes(inputs, outputs, tuple(seen), dict(types), False)
