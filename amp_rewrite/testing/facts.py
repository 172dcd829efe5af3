"""Facts about a GraphDef that the invariants read: scopes, dtypes of every edge, casts.

Everything here works on GraphDef protobufs with TensorFlow's own op registry
(``op_def_registry``), independently of amp_rewrite's IR and type analysis, so the invariants
do not trust the code they check.  A *scope* is ``""`` for the main graph or the name of a
function of the library.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

__all__ = [
    "CAST_NAME",
    "DT_FLOAT",
    "DT_HALF",
    "DT_BFLOAT16",
    "Scope",
    "scopes",
    "library_of",
    "is_inserted_cast",
    "low_dtype",
    "dtype_name",
    "exact_conversion",
    "parse_input",
    "node_name",
    "data_inputs",
    "control_inputs",
    "output_dtypes",
    "input_dtypes",
    "output_port",
    "tensor_dtype",
    "iter_edges",
    "type_values",
    "converted_type_attrs",
    "low_precision_nodes",
    "sinks",
]

DT_FLOAT = 1
DT_HALF = 19
DT_BFLOAT16 = 14

#: The name amp_rewrite (and Grappler) gives an inserted Cast.
CAST_NAME = re.compile(r"^(?P<src>.+)-(?P<port>\d+)-CastTo(?P<to>Fp16|Bf16|Fp32)-(?P<k>\d+)-AutoMixedPrecision$")

_DTYPE_NAMES = {
    1: "float32", 2: "float64", 3: "int32", 4: "uint8", 5: "int16", 6: "int8", 7: "string",
    9: "int64", 10: "bool", 14: "bfloat16", 17: "uint16", 19: "float16", 20: "resource",
    21: "variant", 22: "uint32", 23: "uint64",
}
#: Source dtypes whose conversion to float32 loses nothing.
_EXACT_IN_FLOAT = frozenset({10, 6, 4, 5, 17, 19, 14, 1})


def dtype_name(dtype: int) -> str:
    return _DTYPE_NAMES.get(int(dtype), f"dtype#{int(dtype)}")


def low_dtype(precision: str) -> int:
    """``"float16"`` -> ``DT_HALF``, ``"bfloat16"`` -> ``DT_BFLOAT16``."""
    if precision == "float16":
        return DT_HALF
    if precision == "bfloat16":
        return DT_BFLOAT16
    raise ValueError(f"unknown precision {precision!r}")


def exact_conversion(src: int, dst: int) -> bool:
    """Whether casting ``src`` to ``dst`` keeps every value (only ``X -> float32`` counts)."""
    return src == dst or (dst == DT_FLOAT and src in _EXACT_IN_FLOAT)


@dataclass
class Scope:
    """The nodes of the main graph or of one function body, by name, in GraphDef order."""

    name: str
    nodes: dict[str, Any]
    function: Any = None  # the FunctionDef, for a function scope

    @property
    def args(self) -> dict[str, int]:
        """Function arguments: name -> dtype (empty for the main graph)."""
        if self.function is None:
            return {}
        return {a.name: int(a.type) for a in self.function.signature.input_arg}


def scopes(graph_def: Any) -> dict[str, Scope]:
    """``""`` -> the main graph; each function name -> its body."""
    out = {"": Scope("", {n.name: n for n in graph_def.node})}
    for f in graph_def.library.function:
        out[f.signature.name] = Scope(f.signature.name, {n.name: n for n in f.node_def}, f)
    return out


def is_inserted_cast(node: Any, before: Scope | None) -> bool:
    """A Cast that the rewrite added: named like one and absent from ``before``."""
    return (
        node.op == "Cast"
        and CAST_NAME.match(node.name) is not None
        and (before is None or node.name not in before.nodes)
    )


def parse_input(text: str) -> tuple[str, str | None, int, bool]:
    """``"^n"`` / ``"n"`` / ``"n:2"`` / ``"n:out:1"`` -> (node, out_arg or None, index, control)."""
    if text.startswith("^"):
        return text[1:], None, 0, True
    parts = text.split(":")
    if len(parts) == 1:
        return parts[0], None, 0, False
    if len(parts) == 2:
        return parts[0], None, int(parts[1]), False
    return parts[0], parts[1], int(parts[2]), False


# ------------------------------------------------------------------------------- dtypes


def _op_def(op: str, library: Mapping[str, Any]) -> Any:
    from tensorflow.python.framework import op_def_registry

    found = op_def_registry.get(op)
    if found is not None:
        return found
    if op in library:
        return library[op].signature
    raise KeyError(f"op {op!r} is neither registered nor a function of the library")


def _attr(node: Any, op_def: Any, name: str) -> Any:
    if name in node.attr:
        return node.attr[name]
    for a in op_def.attr:
        if a.name == name and a.HasField("default_value"):
            return a.default_value
    raise KeyError(f"node {node.name!r} ({node.op}) has no attribute {name!r}")


def _arg_dtypes(node: Any, op_def: Any, arg: Any) -> list[int]:
    if arg.type_list_attr:
        return [int(t) for t in _attr(node, op_def, arg.type_list_attr).list.type]
    dtype = int(arg.type) if arg.type else int(_attr(node, op_def, arg.type_attr).type)
    count = int(_attr(node, op_def, arg.number_attr).i) if arg.number_attr else 1
    return [dtype] * count


def _arg_ranges(node: Any, op_def: Any, args: Any) -> dict[str, tuple[int, list[int]]]:
    out: dict[str, tuple[int, list[int]]] = {}
    start = 0
    for arg in args:
        types = _arg_dtypes(node, op_def, arg)
        out[arg.name] = (start, types)
        start += len(types)
    return out


def output_dtypes(node: Any, library: Mapping[str, Any]) -> list[int]:
    """Dtypes of every output of ``node``, from its OpDef (or function signature) and attrs."""
    op_def = _op_def(node.op, library)
    return [t for _, types in _arg_ranges(node, op_def, op_def.output_arg).values() for t in types]


def input_dtypes(node: Any, library: Mapping[str, Any]) -> list[int]:
    """Dtypes ``node`` expects on each data input."""
    op_def = _op_def(node.op, library)
    return [t for _, types in _arg_ranges(node, op_def, op_def.input_arg).values() for t in types]


def output_port(scope: Scope, text: str, library: Mapping[str, Any]) -> tuple[str, int]:
    """Resolve a (non-control) input string of ``scope`` to (producer, flat output port)."""
    node, out_arg, index, _ = parse_input(text)
    if out_arg is None or node in scope.args:
        return node, index
    producer = scope.nodes[node]
    op_def = _op_def(producer.op, library)
    start, types = _arg_ranges(producer, op_def, op_def.output_arg)[out_arg]
    if index >= len(types):
        raise KeyError(f"{text!r}: output {out_arg} of {node!r} has only {len(types)} element(s)")
    return node, start + index


def tensor_dtype(scope: Scope, text: str, library: Mapping[str, Any]) -> int:
    """The dtype of the tensor an input string of ``scope`` names."""
    node, port = output_port(scope, text, library)
    if node in scope.args:
        return scope.args[node]
    return output_dtypes(scope.nodes[node], library)[port]


def data_inputs(node: Any) -> list[str]:
    return [t for t in node.input if not t.startswith("^")]


def control_inputs(node: Any) -> list[str]:
    return [t[1:] for t in node.input if t.startswith("^")]


def library_of(graph_def: Any) -> dict[str, Any]:
    return {f.signature.name: f for f in graph_def.library.function}


def iter_edges(graph_def: Any) -> Iterator[tuple[Scope, Any, int, str]]:
    """Every data edge: (scope, consumer NodeDef, input position, input string)."""
    for scope in scopes(graph_def).values():
        for node in scope.nodes.values():
            for i, text in enumerate(data_inputs(node)):
                yield scope, node, i, text


# ------------------------------------------------------------------------------- changes


def _type_values(node: Any) -> dict[str, int]:
    """Every type attribute of ``node``: ``"T"`` -> dtype, list entries as ``"Tin[2]"``."""
    out: dict[str, int] = {}
    for key, value in node.attr.items():
        kind = value.WhichOneof("value")
        if kind == "type":
            out[key] = int(value.type)
        elif kind == "list" and len(value.list.type):
            for i, t in enumerate(value.list.type):
                out[f"{key}[{i}]"] = int(t)
    return out


def converted_type_attrs(before: Any, after: Any, low: int) -> set[tuple[str, str, str]]:
    """``(scope, node, attr)`` for every type attribute float32 in ``before`` and ``low`` after."""
    out = set()
    b_scopes, a_scopes = scopes(before), scopes(after)
    for name, b in b_scopes.items():
        a = a_scopes.get(name)
        if a is None:
            continue
        for node_name, b_node in b.nodes.items():
            a_node = a.nodes.get(node_name)
            if a_node is None:
                continue
            a_types = _type_values(a_node)
            for attr, dtype in _type_values(b_node).items():
                if dtype == DT_FLOAT and a_types.get(attr) == low:
                    out.add((name, node_name, attr))
    return out


def low_precision_nodes(before: Any, after: Any, low: int) -> set[tuple[str, str]]:
    """``(scope, node)`` of every original node with at least one type attribute converted."""
    return {(s, n) for s, n, _ in converted_type_attrs(before, after, low)}


def type_values(node: Any) -> dict[str, int]:
    return _type_values(node)


def sinks(graph_def: Any) -> list[str]:
    """Main-graph nodes nothing reads from (data or control): the graph's outputs."""
    used = set()
    for node in graph_def.node:
        for text in node.input:
            used.add(parse_input(text)[0])
    return [n.name for n in graph_def.node if n.name not in used]


def node_name(tensor: str) -> str:
    """``"n:1"`` -> ``"n"``; ``"^n"`` -> ``"n"``."""
    return parse_input(tensor)[0]
