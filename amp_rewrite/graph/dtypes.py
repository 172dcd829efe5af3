"""TensorFlow ``DataType`` enum values as plain integers.

The decision and rewrite stages work on these integers so that they need neither protobuf
nor TensorFlow.  Values are TensorFlow's wire values (``types.proto``); a reference type is
its base type plus :data:`REF_OFFSET`.
"""

from __future__ import annotations

__all__ = [
    "INVALID",
    "FLOAT",
    "DOUBLE",
    "INT32",
    "UINT8",
    "INT16",
    "INT8",
    "STRING",
    "INT64",
    "BOOL",
    "QINT8",
    "QUINT8",
    "QINT32",
    "BFLOAT16",
    "QINT16",
    "QUINT16",
    "UINT16",
    "HALF",
    "RESOURCE",
    "VARIANT",
    "REF_OFFSET",
    "QUANTIZED",
    "name",
    "from_name",
    "base",
    "itemsize",
]

INVALID = 0
FLOAT = 1
DOUBLE = 2
INT32 = 3
UINT8 = 4
INT16 = 5
INT8 = 6
STRING = 7
INT64 = 9
BOOL = 10
QINT8 = 11
QUINT8 = 12
QINT32 = 13
BFLOAT16 = 14
QINT16 = 15
QUINT16 = 16
UINT16 = 17
HALF = 19
RESOURCE = 20
VARIANT = 21
REF_OFFSET = 100

QUANTIZED = frozenset({QINT8, QUINT8, QINT16, QUINT16, QINT32})

_NAMES = {
    INVALID: "invalid",
    FLOAT: "float32",
    DOUBLE: "float64",
    INT32: "int32",
    UINT8: "uint8",
    INT16: "int16",
    INT8: "int8",
    STRING: "string",
    8: "complex64",
    INT64: "int64",
    BOOL: "bool",
    QINT8: "qint8",
    QUINT8: "quint8",
    QINT32: "qint32",
    BFLOAT16: "bfloat16",
    QINT16: "qint16",
    QUINT16: "quint16",
    UINT16: "uint16",
    18: "complex128",
    HALF: "float16",
    RESOURCE: "resource",
    VARIANT: "variant",
    22: "uint32",
    23: "uint64",
}
_BY_NAME = {v: k for k, v in _NAMES.items()}
_BY_NAME.update({"float": FLOAT, "half": HALF, "double": DOUBLE})


def base(dtype: int) -> int:
    """Return ``dtype`` without its reference bit (``float_ref`` -> ``float``)."""
    return dtype - REF_OFFSET if dtype > REF_OFFSET else dtype


def name(dtype: int) -> str:
    """Return a readable name (``float32``, ``float16``, ``int32_ref``...) for an enum value."""
    text = _NAMES.get(dtype)
    if text is not None:  # the common case, without building the fallback string
        return text
    if dtype > REF_OFFSET:
        return name(dtype - REF_OFFSET) + "_ref"
    return f"dtype{dtype}"


def from_name(text: str) -> int:
    """Parse ``float16``/``half``/``bfloat16``/``float32``... into an enum value.

    Raises ``KeyError`` for an unknown name; callers at the API boundary turn that into a
    product error with context.
    """
    return _BY_NAME[text.lower()]


_ITEMSIZE = {FLOAT: 4, DOUBLE: 8, INT32: 4, UINT8: 1, INT16: 2, INT8: 1, INT64: 8, BOOL: 1, QINT8: 1, QUINT8: 1,
             QINT32: 4, BFLOAT16: 2, QINT16: 2, QUINT16: 2, UINT16: 2, HALF: 2}


def itemsize(dtype: int, default: int = 4) -> int:
    """Bytes per element of ``dtype`` (a reference type as its base type); ``default`` for
    types without a fixed size (strings, resources, variants) and unknown ones."""
    return _ITEMSIZE.get(base(dtype), default)
