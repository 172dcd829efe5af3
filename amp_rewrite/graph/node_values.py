"""Values the IR keeps only inside a node's opaque ``proto``: bool, int and string attributes
and the range of a float constant.

The IR (:mod:`amp_rewrite.graph.ir`) holds what every pass reads (op, dtypes, int attrs); a
value only one analysis needs is read from the original NodeDef on demand, here, because the
import stage is the only one that knows protobuf.  The decide stage's range analysis
(:mod:`amp_rewrite.plan.ranges`) asks for a few nodes' values, never for all of them.

Pure: reads node dicts and their NodeDefs; modifies nothing.  Nodes the rewrite inserted
have no ``proto`` and give ``None``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from . import dtypes as dt

__all__ = ["bool_attr", "bytes_attr", "int_attr", "int_list_attr", "int_const_values", "float_const_range",
           "MAX_CONST_ELEMENTS"]

#: Largest constant whose values are read for a range (elements); a larger one counts as
#: unknown.  A range proof needs the few scalars of an expression (``-0.5``, ``1/sqrt(2)``),
#: not a weight tensor, and reading one costs time on graphs with many large constants.
MAX_CONST_ELEMENTS = 1 << 16


def bool_attr(data: Mapping[str, Any], key: str) -> bool | None:
    """The bool attribute ``key`` of the node whose IR dict is ``data`` (``keep_dims`` of a
    reduction), or ``None`` when the node has no NodeDef, no such attribute, or one of
    another kind.  Pure."""
    value = _attr_value(data, key, "b")
    return None if value is None else bool(value)


def int_attr(data: Mapping[str, Any], key: str) -> int | None:
    """The int attribute ``key`` of the node whose IR dict is ``data`` (an ``Enter``'s
    ``parallel_iterations``), or ``None`` as for :func:`bool_attr`.  Pure."""
    value = _attr_value(data, key, "i")
    return None if value is None else int(value)


def bytes_attr(data: Mapping[str, Any], key: str) -> bytes | None:
    """The string attribute ``key`` of the node whose IR dict is ``data`` (an ``Enter``'s
    ``frame_name``), as bytes, or ``None`` as for :func:`bool_attr`.  Pure."""
    value = _attr_value(data, key, "s")
    return None if value is None else bytes(value)


def int_list_attr(data: Mapping[str, Any], key: str) -> tuple[int, ...] | None:
    """The ``list(int)`` attribute ``key`` of the node whose IR dict is ``data`` (a
    ``Squeeze``'s ``squeeze_dims``; an empty list is ``()``), or ``None`` as for
    :func:`bool_attr`.  Pure."""
    value = _attr_value(data, key, "list")
    return None if value is None else tuple(int(i) for i in value.i)


def int_const_values(data: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The values of an int32 or int64 ``Const`` of at most one dimension whose IR dict is
    ``data`` (a reduction's axes), flattened; ``None`` when the node is not such a constant,
    has no NodeDef, holds more than :data:`MAX_CONST_ELEMENTS` values, or values that cannot
    be read.  Pure."""
    proto = data.get("proto")
    if proto is None or data.get("op") != "Const" or "value" not in proto.attr:
        return None
    tensor = proto.attr["value"].tensor
    dims = [d.size for d in tensor.tensor_shape.dim]
    if len(dims) > 1 or any(d < 0 for d in dims) or (dims and dims[0] > MAX_CONST_ELEMENTS):
        return None
    n = dims[0] if dims else 1
    numpy_type = {dt.INT32: "<i4", dt.INT64: "<i8"}.get(tensor.dtype)
    if numpy_type is None:
        return None
    content = tensor.tensor_content
    if content:
        if len(content) != n * np.dtype(numpy_type).itemsize:
            return None  # malformed: import validates elsewhere
        return tuple(int(v) for v in np.frombuffer(content, dtype=numpy_type))
    listed = list(tensor.int_val if tensor.dtype == dt.INT32 else tensor.int64_val)
    if n == 0:
        return ()
    # No values stands for zeros; fewer than n repeat the last one (TensorProto's rule).
    listed = listed or [0]
    return tuple(int(v) for v in listed[:n]) + (int(listed[-1]),) * max(0, n - len(listed))


def _attr_value(data: Mapping[str, Any], key: str, kind: str) -> Any:
    """Field ``kind`` (``"b"``, ``"i"``, ``"s"``, ``"list"``) of attribute ``key`` of the node's NodeDef,
    or ``None`` where there is no NodeDef, no such attribute, or one of another kind.  Pure."""
    proto = data.get("proto")
    if proto is None or key not in proto.attr:
        return None
    value = proto.attr[key]
    return getattr(value, kind) if value.WhichOneof("value") == kind else None


def float_const_range(data: Mapping[str, Any]) -> tuple[float, float] | None:
    """``(min, max)`` of the values of a float ``Const`` (float32, float64, float16 or
    bfloat16) whose IR dict is ``data``; ``None`` when the node is not such a constant, has
    no NodeDef, holds a NaN, more than :data:`MAX_CONST_ELEMENTS` values, or values that
    cannot be read.  Pure."""
    proto = data.get("proto")
    if proto is None or data.get("op") != "Const" or "value" not in proto.attr:
        return None
    tensor = proto.attr["value"].tensor
    try:
        values = _tensor_values(tensor)
    except (ValueError, TypeError, OverflowError):
        return None  # a malformed constant proves nothing; import validates elsewhere
    if values is None or values.size == 0:
        return None
    lo, hi = float(values.min()), float(values.max())
    if math.isnan(lo) or math.isnan(hi):
        return None
    return lo, hi


def _tensor_values(tensor: Any) -> np.ndarray | None:
    """The values of a float TensorProto as a float64 array (its distinct values suffice:
    a short repeated field stands for its last value repeated), or ``None``."""
    n = 1
    for dim in tensor.tensor_shape.dim:
        if dim.size < 0:
            return None
        n *= dim.size
    if n > MAX_CONST_ELEMENTS:
        return None
    dtype = tensor.dtype
    content = tensor.tensor_content
    if content:
        numpy_type = {dt.FLOAT: "<f4", dt.DOUBLE: "<f8", dt.HALF: "<f2", dt.BFLOAT16: "<u2"}.get(dtype)
        if numpy_type is None:
            return None
        raw = np.frombuffer(content, dtype=numpy_type)
        if raw.size != n:
            return None
        return _bfloat16_bits(raw) if dtype == dt.BFLOAT16 else raw.astype(np.float64)
    if dtype == dt.FLOAT:
        listed = np.asarray(tensor.float_val, dtype=np.float64)
    elif dtype == dt.DOUBLE:
        listed = np.asarray(tensor.double_val, dtype=np.float64)
    elif dtype in (dt.HALF, dt.BFLOAT16):
        bits = np.asarray(tensor.half_val, dtype=np.int64)
        if bits.size and (bits.min() < 0 or bits.max() > 0xFFFF):
            return None
        bits = bits.astype(np.uint16)
        listed = _bfloat16_bits(bits) if dtype == dt.BFLOAT16 else bits.view(np.float16).astype(np.float64)
    else:
        return None
    if n == 0:
        return listed[:0]
    # No values stands for zeros; fewer than n repeat the last one (TensorProto's rule).
    return listed[:n] if listed.size else np.zeros(1)


def _bfloat16_bits(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) as float64 values: the top half of a float32."""
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
