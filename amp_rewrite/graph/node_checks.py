"""Checks of what single nodes declare, made before anything expands a node into its ports or
hands the graph to TensorFlow.

Part of the import stage (:func:`amp_rewrite.graph.io.import_graph_def` runs them on the main
graph and on each function body).  Two kinds of node pass TensorFlow's import unharmed and then
take the process down, so neither may reach it:

* **Counts.**  A count attribute (``Unpack``'s ``num``, ``AddN``'s ``N``: an argument's
  ``number_attr``) may be as large as 2**31 - 1 in TensorFlow.  Both TensorFlow and this
  package expand it into one list entry per port when they import the node, so a NodeDef of a
  few bytes can claim gigabytes: TensorFlow's import then runs out of memory or aborts.  A count
  must be at most :data:`~amp_rewrite.graph.tensor_names.MAX_PORTS`, and a graph's counted
  output ports, with the outputs of ops nobody knows (as many as the highest port read from
  them), at most :data:`MAX_GRAPH_PORTS` together.
* **Constants of the wrong type.**  TensorFlow types a ``Const``'s output by its ``dtype``
  attribute, but its shape inference takes the constant's value as the ``value`` tensor's own
  type.  A shape function that reads such a value (``ReverseV2``'s axis) as the type the graph
  promised fails a CHECK inside ``tensorflow::Tensor`` and aborts the process.  The ``Const``
  kernel refuses the same node when it runs ("Type mismatch between value and dtype"), so the
  graph could never run anyway.

Pure: reads the IR (node dicts and their NodeDefs); raises :class:`InvalidGraphError`.
"""

from __future__ import annotations

from typing import Any, Mapping

import networkx as nx

from . import dtypes as dt
from ..errors import InvalidGraphError
from .op_registry import OpRegistry, OpSignature
from .tensor_names import MAX_PORTS

__all__ = ["MAX_GRAPH_PORTS", "check_nodes"]

#: Most output ports the counted arguments and the unknown ops of one graph (or function body)
#: may declare together: about 30 MB of per-port lists, where a real model has a few thousand.
MAX_GRAPH_PORTS = 1 << 22

_CONSTANTS = frozenset({"Const", "HostConst"})

#: Per counted argument of an op: (count attribute, its default or None, is an output).
_Counted = tuple[tuple[str, Any, bool], ...]


def _counted_args(sig: OpSignature) -> _Counted:
    def default(attr: str) -> Any:
        spec = sig.attrs.get(attr)
        return spec.default if spec is not None else None

    return tuple((a.number_attr, default(a.number_attr), is_output)
                 for is_output, args in ((False, sig.inputs), (True, sig.outputs))
                 for a in args if a.number_attr)


def _check_const(name: str, data: Mapping[str, Any]) -> None:
    proto = data.get("proto")
    declared = data["dtypes"].get("dtype")
    if proto is None or not isinstance(declared, int) or "value" not in proto.attr:
        return  # TensorFlow and the painter report a Const without these
    value = proto.attr["value"]
    # The value's dtype first: a value that is not a tensor reads as dtype 0 there, and is
    # left to TensorFlow and the painter by the second test.
    if value.tensor.dtype != declared and value.WhichOneof("value") == "tensor":
        raise InvalidGraphError(
            f"Const node {name!r} declares dtype {dt.name(declared)} but its value is a "
            f"{dt.name(value.tensor.dtype)} tensor (TensorFlow's Const kernel refuses it)", node=name)


def _unknown_outputs(g: nx.MultiDiGraph, name: str) -> int:
    """How many output ports a node of an unknown op has: one past the highest port read."""
    return 1 + max((d["src_port"] for keyed in g._succ[name].values() for d in keyed.values()), default=-1)


def check_nodes(g: nx.MultiDiGraph, registry: OpRegistry, signatures: Mapping[str, OpSignature],
                where: str) -> None:
    """Raise :class:`InvalidGraphError` for a ``Const`` whose value's type is not its ``dtype``,
    a count attribute outside ``[0, MAX_PORTS]``, or counted and unknown-op output ports past
    :data:`MAX_GRAPH_PORTS` in ``g`` (``where``: "the graph", "function f", for the message).

    ``signatures``: the function library's, for nodes that call a function by op name.
    Unknown ops' ports are counted from ``g``'s edges, so a body whose edges are resolved
    through the counts is checked once before its edges (counts) and once after.  Reads ``g``
    only; one dict lookup per node for ops without counts.
    """
    counted: dict[str, _Counted | None] = {}
    total = 0
    for name, data in g._node.items():
        op = data["op"]
        if op in _CONSTANTS:
            _check_const(name, data)
        if op not in counted:
            sig = registry.op(op) or signatures.get(op)
            counted[op] = None if sig is None else _counted_args(sig)
        spec = counted[op]
        if spec is None:
            if data["synthetic"] is None:
                total += _unknown_outputs(g, name)
            continue
        ints = data["ints"]
        for attr, default, is_output in spec:
            count = ints.get(attr, default)
            if not isinstance(count, int):
                continue  # missing: TensorFlow and the painter report it
            if not 0 <= count <= MAX_PORTS:
                raise InvalidGraphError(
                    f"{op} node {name!r} in {where} has {attr} = {count}; amp_rewrite reads counts "
                    f"from 0 to {MAX_PORTS}", node=name, op=op)
            if is_output:
                total += count
    if total > MAX_GRAPH_PORTS:
        raise InvalidGraphError(
            f"{where} declares {total} output ports in counted arguments and unknown ops together; "
            f"amp_rewrite reads at most {MAX_GRAPH_PORTS}")
