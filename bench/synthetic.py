"""Synthetic GraphDefs of any size with a realistic op mix, for the scaling benchmark.

The graph is a chain of residual blocks, 10 nodes each, written directly as NodeDef
protobufs (building a million nodes through tf ops would take longer than the rewrite):
``Const -> Identity`` weight read, ``MatMul``, ``BiasAdd`` with a ``Const`` bias, ``Relu``,
residual ``AddV2``, a ``Softmax`` side branch reduced by ``Mean`` over a ``Const`` axis (deny
in the default lists, so deny propagation and casts back to float32 are exercised).
"""

from __future__ import annotations

from tensorflow.core.framework import graph_pb2, types_pb2

__all__ = ["optimal_chain_graph", "synthetic_graph"]

F32 = types_pb2.DT_FLOAT
I32 = types_pb2.DT_INT32


def _const(gd, name: str, dtype: int, dims: list[int]) -> None:
    n = gd.node.add(name=name, op="Const")
    n.attr["dtype"].type = dtype
    t = n.attr["value"].tensor
    t.dtype = dtype
    for d in dims:
        t.tensor_shape.dim.add(size=d)
    if dtype == F32:
        t.float_val.append(0.01)
    else:
        t.int_val.append(1)


def synthetic_graph(n_nodes: int, seed: int = 0, width: int = 64) -> graph_pb2.GraphDef:
    """A valid GraphDef of about ``n_nodes`` nodes (rounded to whole blocks).  ``seed`` is
    accepted for symmetry with other generators; the graph is deterministic."""
    del seed
    gd = graph_pb2.GraphDef()
    gd.versions.producer = 1994
    x = gd.node.add(name="x", op="Placeholder")
    x.attr["dtype"].type = F32
    shape = x.attr["shape"].shape
    shape.dim.add(size=8)
    shape.dim.add(size=width)
    h = "x"
    blocks = max(1, (n_nodes - 1) // 10)
    for i in range(blocks):
        p = f"block{i}/"
        _const(gd, p + "w", F32, [width, width])
        wr = gd.node.add(name=p + "w/read", op="Identity", input=[p + "w"])
        wr.attr["T"].type = F32
        mm = gd.node.add(name=p + "matmul", op="MatMul", input=[h, p + "w/read"])
        mm.attr["T"].type = F32
        mm.attr["transpose_a"].b = False
        mm.attr["transpose_b"].b = False
        _const(gd, p + "b", F32, [width])
        ba = gd.node.add(name=p + "bias", op="BiasAdd", input=[p + "matmul", p + "b"])
        ba.attr["T"].type = F32
        ba.attr["data_format"].s = b"NHWC"
        relu = gd.node.add(name=p + "relu", op="Relu", input=[p + "bias"])
        relu.attr["T"].type = F32
        add = gd.node.add(name=p + "add", op="AddV2", input=[p + "relu", h])
        add.attr["T"].type = F32
        sm = gd.node.add(name=p + "softmax", op="Softmax", input=[p + "add"])
        sm.attr["T"].type = F32
        _const(gd, p + "axis", I32, [1])
        mean = gd.node.add(name=p + "mean", op="Mean", input=[p + "softmax", p + "axis"])
        mean.attr["T"].type = F32
        mean.attr["Tidx"].type = I32
        mean.attr["keep_dims"].b = False
        h = p + "add"
    return gd


def optimal_chain_graph(n_nodes: int, width: int = 256, batch: int = 8) -> graph_pb2.GraphDef:
    """A valid GraphDef of about ``n_nodes`` nodes (``n_nodes // 8`` blocks of 7 or 8 nodes)
    that the optimal planner sees as one long free chain.  A block is ``MatMul`` (allow) with
    a ``Const`` weight, ``BiasAdd`` with a ``Const`` bias (infer; folded into the MatMul),
    ``Relu`` (clear; fused), ``Tanh`` (infer; ``Erfc`` in every fourth block), ``Identity``
    (clear) and, where the widths match, a residual ``AddV2`` (infer) of the block's input.
    Every fourth block's MatMul narrows to ``width - 3`` columns and the next one widens
    back, so those two are misaligned for tensor cores and the cut has something to decide
    (convert them or not, and where the Casts go).  Nothing is on the deny list, so no fixed
    vertex splits the chain: the whole graph is one component of the minimum cut, the worst
    case for its size.  Pure and deterministic.
    """
    gd = graph_pb2.GraphDef()
    gd.versions.producer = 1994
    x = gd.node.add(name="x", op="Placeholder")
    x.attr["dtype"].type = F32
    shape = x.attr["shape"].shape
    shape.dim.add(size=batch)
    shape.dim.add(size=width)
    h, h_width = "x", width
    blocks = max(1, (n_nodes - 1) // 8)
    for i in range(blocks):
        p = f"block{i}/"
        # Blocks 4k+1 narrow to a misaligned width, blocks 4k+2 widen back: the residual
        # needs equal widths, so only the other blocks add one.
        out_width = width - 3 if i % 4 == 1 else width
        _const(gd, p + "w", F32, [h_width, out_width])
        mm = gd.node.add(name=p + "matmul", op="MatMul", input=[h, p + "w"])
        mm.attr["T"].type = F32
        mm.attr["transpose_a"].b = False
        mm.attr["transpose_b"].b = False
        _const(gd, p + "b", F32, [out_width])
        ba = gd.node.add(name=p + "bias", op="BiasAdd", input=[p + "matmul", p + "b"])
        ba.attr["T"].type = F32
        ba.attr["data_format"].s = b"NHWC"
        relu = gd.node.add(name=p + "relu", op="Relu", input=[p + "bias"])
        relu.attr["T"].type = F32
        # Erfc runs 5x slower in bfloat16 than in float32 on CPUs without bfloat16 arithmetic.
        unary = "Erfc" if i % 4 == 3 else "Tanh"
        tanh = gd.node.add(name=p + "tanh", op=unary, input=[p + "relu"])
        tanh.attr["T"].type = F32
        ident = gd.node.add(name=p + "identity", op="Identity", input=[p + "tanh"])
        ident.attr["T"].type = F32
        out = p + "identity"
        if out_width == h_width:
            add = gd.node.add(name=p + "add", op="AddV2", input=[out, h])
            add.attr["T"].type = F32
            out = p + "add"
        h, h_width = out, out_width
    return gd
