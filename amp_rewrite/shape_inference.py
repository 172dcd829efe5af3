"""Static tensor shapes for the cost-aware planner, read with TensorFlow's shape inference.

Part of the import stage: it reads the caller's GraphDef (protobuf) and never modifies it.
The result maps each node to one shape per output port; a shape is a tuple of dimensions,
``None`` for an unknown dimension, or ``None`` as a whole when even the rank is unknown.

TensorFlow's own shape functions are the reference, so the main graph is imported into a
scratch ``tf.Graph`` (which runs them).  A graph TensorFlow cannot import (custom ops, a
broken function library) falls back to the ``_output_shapes`` attributes some exporters
write, and then to "unknown": the planner then uses a default size per tensor, so missing
shapes cost quality, never correctness.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["Shape", "graph_shapes", "function_shapes", "numel"]

log = logging.getLogger(__name__)

#: One tensor's static shape: dims (``None`` = unknown), or ``None`` for unknown rank.
Shape = tuple[int | None, ...] | None


def _from_tensor_shape(shape: Any) -> Shape:
    if shape.rank is None:
        return None
    return tuple(shape.as_list())


def _from_proto(proto: Any) -> Shape:
    if proto.unknown_rank:
        return None
    return tuple(d.size if d.size >= 0 else None for d in proto.dim)


def _attr_shapes(node_defs: Any) -> dict[str, tuple[Shape, ...]]:
    """Shapes from ``_output_shapes`` attributes (written by some exporters), if present."""
    out: dict[str, tuple[Shape, ...]] = {}
    for nd in node_defs:
        if "_output_shapes" in nd.attr:
            out[nd.name] = tuple(_from_proto(s) for s in nd.attr["_output_shapes"].list.shape)
    return out


#: Ops whose data outputs have the shape of their (first known) data input.  TensorFlow
#: leaves the loop variables of a lowered ``while_loop`` without a shape (the back edge is
#: unknown when Merge is built); for the cost model, the shape entering the loop is the
#: best estimate.
_FORWARDING = frozenset({"Enter", "Exit", "Merge", "Switch", "NextIteration", "Identity",
                         "RefEnter", "RefExit", "RefMerge", "RefSwitch", "RefNextIteration"})


def _known(shape: Shape) -> bool:
    return shape is not None and all(d is not None for d in shape)


def _forward_loop_shapes(node_defs: Any, shapes: dict[str, tuple[Shape, ...]]) -> dict[str, tuple[Shape, ...]]:
    """Fill unknown shapes of loop plumbing from their inputs.  Returns ``shapes``, updated."""
    forwarding = [nd for nd in node_defs if nd.op in _FORWARDING]
    for _ in range(8):  # nested loops need a few rounds; each round only adds knowledge
        changed = False
        for nd in forwarding:
            outs = shapes.get(nd.name)
            if not outs or _known(outs[0]):
                continue
            for text in nd.input:
                if text.startswith("^"):
                    continue
                name, _, port = text.partition(":")
                src = shapes.get(name)
                idx = int(port) if port.isdigit() else 0
                if src and idx < len(src) and _known(src[idx]):
                    n_out = 2 if nd.op.endswith("Switch") or nd.op.endswith("Merge") else len(outs)
                    new = list(outs)
                    for i in range(min(n_out, len(new))):
                        if nd.op.endswith("Merge") and i == 1:
                            continue  # value_index is a scalar int
                        new[i] = src[idx]
                    shapes[nd.name] = tuple(new)
                    changed = True
                    break
        if not changed:
            break
    return shapes


def graph_shapes(graph_def: Any) -> dict[str, tuple[Shape, ...]]:
    """Static output shapes of every node of ``graph_def``'s main graph.  Pure.

    Assumes TensorFlow is importable.  Never raises for a graph TensorFlow rejects: the
    nodes then get the shapes of their ``_output_shapes`` attribute, or none at all.
    """
    import tensorflow as tf

    try:
        scratch = tf.Graph()
        with scratch.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
        shapes = {
            op.name: tuple(_from_tensor_shape(t.shape) for t in op.outputs)
            for op in scratch.get_operations()
        }
        return _forward_loop_shapes(graph_def.node, shapes)
    except Exception as exc:  # noqa: BLE001 - any failure only means "shapes unknown"
        log.info("static shapes unavailable (TensorFlow cannot import the graph: %s); "
                 "using _output_shapes attributes where present", str(exc).splitlines()[0][:200])
        return _attr_shapes(graph_def.node)


def function_shapes(fdef: Any) -> dict[str, tuple[Shape, ...]]:
    """Static output shapes of the nodes of one FunctionDef body (argument shapes from its
    ``_input_shapes`` attribute or argument attributes).  Pure; never raises: a body
    TensorFlow cannot build gets its ``_output_shapes`` attributes or nothing.
    """
    from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

    try:
        fg = function_def_to_graph(fdef)
        shapes = {
            op.name: tuple(_from_tensor_shape(t.shape) for t in op.outputs)
            for op in fg.get_operations()
        }
        return shapes
    except Exception as exc:  # noqa: BLE001 - any failure only means "shapes unknown"
        log.debug("no static shapes for function %s: %s", fdef.signature.name,
                  str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
        return _attr_shapes(fdef.node_def)


def numel(shape: Shape, default: int) -> int:
    """Number of elements of ``shape``; unknown dimensions count as ``default`` each and an
    unknown rank as ``default`` elements in all."""
    if shape is None:
        return default
    n = 1
    for d in shape:
        n *= default if d is None else max(d, 0)
    return n

