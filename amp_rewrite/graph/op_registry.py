"""TensorFlow's op and kernel registries, seen as plain Python data.

The painter needs two facts from TensorFlow: each op's signature (``OpDef``: which type
attribute governs which input/output argument, allowed types, fixed-type ports) and which
kernels are registered (``KernelDef``: device type, type constraints, label).  This module
converts both into frozen dataclasses once per op and caches them, so the decision stage
never touches protobuf.  :class:`OpRegistry` is the protocol the rest of the library uses;
tests substitute their own implementation (e.g. one without a float16 Einsum kernel).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Protocol

__all__ = [
    "ArgSpec",
    "AttrSpec",
    "OpSignature",
    "KernelSpec",
    "OpRegistry",
    "kernel_accepts",
    "TensorFlowRegistry",
    "signature_from_opdef",
    "default_registry",
]


@dataclass(frozen=True)
class ArgSpec:
    """One input or output argument of an op (a slice of ``OpDef.ArgDef``)."""

    name: str
    type_attr: str = ""
    type_list_attr: str = ""
    number_attr: str = ""
    fixed_type: int = 0
    is_ref: bool = False


@dataclass(frozen=True)
class AttrSpec:
    """One attribute of an op: its declared type, allowed dtypes and default value.

    ``allowed`` is ``None`` when the OpDef lists no restriction (every type allowed).
    ``default`` is a dtype int, a tuple of dtype ints, an int, or ``None``.
    """

    name: str
    type: str
    allowed: frozenset[int] | None = None
    default: Any = None


@dataclass(frozen=True)
class OpSignature:
    """The parts of an ``OpDef`` the rewrite needs."""

    name: str
    inputs: tuple[ArgSpec, ...]
    outputs: tuple[ArgSpec, ...]
    attrs: Mapping[str, AttrSpec]
    is_stateful: bool = False

    def has_ref_args(self) -> bool:
        return any(a.is_ref for a in self.inputs + self.outputs)


@dataclass(frozen=True)
class KernelSpec:
    """One registered kernel: device type, per-attribute allowed dtypes, and label."""

    device_type: str
    constraints: tuple[tuple[str, frozenset[int]], ...]
    label: str = ""


def kernel_accepts(kernels: Iterable[KernelSpec], label: str, types: Mapping[str, int | tuple[int, ...]]) -> bool:
    """Whether one of ``kernels`` accepts a node with these type attrs and kernel label: the
    labels match and every constrained attribute is present with allowed types.  Pure."""
    for kernel in kernels:
        if kernel.label != label:
            continue
        for attr, allowed in kernel.constraints:
            val = types.get(attr)
            if val is None:
                break
            if isinstance(val, tuple):
                if not all(t in allowed for t in val):
                    break
            elif val not in allowed:
                break
        else:
            return True
    return False


class OpRegistry(Protocol):
    """What the library asks of an op/kernel registry."""

    def op(self, name: str) -> OpSignature | None:
        """The signature of a registered op, or ``None`` if it is unknown."""

    def kernels(self, op: str, device_type: str) -> tuple[KernelSpec, ...]:
        """The kernels registered for ``op`` on ``device_type`` (``"GPU"``, ``"CPU"``)."""


def _attr_default(attr: Any) -> Any:
    if not attr.HasField("default_value"):
        return None
    value = attr.default_value
    kind = value.WhichOneof("value")
    if kind == "type":
        return int(value.type)
    if kind == "i":
        return int(value.i)
    if kind == "list":
        return tuple(int(t) for t in value.list.type)
    return None


def signature_from_opdef(op_def: Any) -> OpSignature:
    """Convert an ``OpDef`` protobuf (registry entry or function signature) to a signature."""

    def args(defs: Any) -> tuple[ArgSpec, ...]:
        return tuple(
            ArgSpec(
                name=a.name,
                type_attr=a.type_attr,
                type_list_attr=a.type_list_attr,
                number_attr=a.number_attr,
                fixed_type=int(a.type),
                is_ref=bool(a.is_ref),
            )
            for a in defs
        )

    attrs = {}
    for a in op_def.attr:
        allowed = None
        if a.HasField("allowed_values") and a.allowed_values.list.type:
            allowed = frozenset(int(t) for t in a.allowed_values.list.type)
        attrs[a.name] = AttrSpec(a.name, a.type, allowed, _attr_default(a))
    return OpSignature(
        name=op_def.name,
        inputs=args(op_def.input_arg),
        outputs=args(op_def.output_arg),
        attrs=attrs,
        is_stateful=bool(op_def.is_stateful),
    )


class TensorFlowRegistry:
    """The op and kernel registries of the TensorFlow installed in this process."""

    @functools.lru_cache(maxsize=None)
    def op(self, name: str) -> OpSignature | None:
        from tensorflow.python.framework import op_def_registry

        op_def = op_def_registry.get(name)
        return None if op_def is None else signature_from_opdef(op_def)

    @functools.lru_cache(maxsize=None)
    def _all_kernels(self, op: str) -> Mapping[str, tuple[KernelSpec, ...]]:
        from tensorflow.python.framework import kernels

        by_device: dict[str, list[KernelSpec]] = {}
        try:
            kernel_list = kernels.get_registered_kernels_for_op(op)
        except Exception:  # noqa: BLE001 - an op TF cannot describe simply has no kernels
            return {}
        for k in kernel_list.kernel:
            constraints = tuple(
                (c.name, frozenset(int(t) for t in c.allowed_values.list.type))
                for c in k.constraint
            )
            by_device.setdefault(k.device_type, []).append(
                KernelSpec(k.device_type, constraints, k.label)
            )
        return {d: tuple(v) for d, v in by_device.items()}

    def kernels(self, op: str, device_type: str) -> tuple[KernelSpec, ...]:
        return self._all_kernels(op).get(device_type, ())

    def __hash__(self) -> int:  # lru_cache on methods needs a hashable self
        return id(self)


@functools.lru_cache(maxsize=1)
def default_registry() -> TensorFlowRegistry:
    """The process-wide TensorFlow registry (created lazily: importing TF is slow)."""
    return TensorFlowRegistry()
