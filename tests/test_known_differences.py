"""Known differences from TensorFlow's pass (KNOWN_DIFFERENCES.md), each shown next to
what TensorFlow does."""

from __future__ import annotations

import tensorflow as tf

import amp_rewrite
from graphs import graph_def, v1
from tf_oracle import converted_type_attrs, tf_amp_rewrite

HALF = tf.float16.as_datatype_enum
FLOAT = tf.float32.as_datatype_enum


def test_fetched_cast_keeps_its_dtype():
    def build():
        b = v1.placeholder(tf.bool, (4, 4), name="b")
        c = tf.cast(b, tf.float32, name="cast")
        x = v1.placeholder(tf.float32, (4, 4), name="x")
        tf.identity(tf.matmul(c, x, name="mm"), name="out")

    gd = graph_def(build)
    fetches = ["out", "cast"]
    ref = tf_amp_rewrite(gd, fetches)
    assert ("", "cast", "DstT") in converted_type_attrs(gd, ref)  # TensorFlow retypes a fetch
    ours = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="tensorflow", fetches=fetches,
                                         use_env=False)
    cast = next(n for n in ours.graph_def.node if n.name == "cast")
    assert cast.attr["DstT"].type == FLOAT
    assert next(n for n in ours.graph_def.node if n.name == "mm").attr["T"].type == HALF
    exact = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="tensorflow", fetches=fetches,
                                          use_env=False, tensorflow_bugs=True)
    assert converted_type_attrs(gd, exact.graph_def) == converted_type_attrs(gd, ref)


def test_force_all_with_a_fixed_float_port_still_rewrites():
    # SparseMatMul's output is a fixed float32 port and its inputs take float/bfloat16 only:
    # under UNSAFE_FORCE_ALL TensorFlow paints them, fails and gives the graph back unchanged.
    # We skip what cannot change and force the rest.
    def build():
        a = v1.placeholder(tf.float32, (4, 4), name="a")
        s = tf.raw_ops.SparseMatMul(a=a, b=a, name="sparse")
        tf.identity(tf.matmul(tf.tanh(s, name="tanh"), a, name="mm"), name="out")

    gd = graph_def(build)
    env = {"TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LEVEL": "UNSAFE_FORCE_ALL"}
    ref = tf_amp_rewrite(gd, ["out"], env=env)
    assert converted_type_attrs(gd, ref) == set()
    ours = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="tensorflow", fetches=["out"],
                                         level="UNSAFE_FORCE_ALL", use_env=False)
    conv = converted_type_attrs(gd, ours.graph_def)
    assert {("", "tanh", "T"), ("", "mm", "T")} <= conv
    assert not any(node == "sparse" for _, node, _ in conv)  # Ta/Tb allow float/bfloat16 only
    import numpy as np
    from graphs import run

    feeds = {"a:0": np.eye(4, dtype=np.float32)}
    (got,) = run(ours.graph_def, feeds, ["out:0"])
    assert got.dtype == np.float32


def test_force_all_keeps_boundary_casts_and_is_idempotent():
    """KD-5: TensorFlow forces an existing float32 <-> half Cast under UNSAFE_FORCE_ALL, so a
    second rewrite of a rewritten graph chained new Casts onto the first one's (12 on a Keras
    MLP, which broke ``check_rewrite``'s idempotence invariant)."""
    def build():
        x = v1.placeholder(tf.float32, (4, 4), name="x")
        h = tf.cast(x, tf.float16, name="to_half")
        y = tf.matmul(h, h, name="mm")
        tf.identity(tf.tanh(tf.cast(y, tf.float32, name="to_float")), name="out")

    gd = graph_def(build)
    env = {"TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LEVEL": "UNSAFE_FORCE_ALL"}
    fetches = ["out", "x"]  # the input stays float32, so to_half is a boundary
    ref = tf_amp_rewrite(gd, fetches, env=env)
    assert ("", "to_half", "SrcT") in converted_type_attrs(gd, ref)  # TensorFlow forces it
    kw = dict(target="gpu:8.0", lists="tensorflow", fetches=fetches, level="UNSAFE_FORCE_ALL",
              use_env=False)
    ours = amp_rewrite.rewrite_graph_def(gd, **kw)
    conv = converted_type_attrs(gd, ours.graph_def)
    assert ("", "to_half", "SrcT") not in conv
    assert "[KD-5]" in ours.report["nodes"]["to_half"]["reason"]
    assert ("", "Tanh", "T") in conv  # the rest is still forced
    exact = amp_rewrite.rewrite_graph_def(gd, tensorflow_bugs=True, **kw)
    assert converted_type_attrs(gd, exact.graph_def) == converted_type_attrs(gd, ref)
    # Idempotent: a second rewrite of the output adds nothing.
    again = amp_rewrite.rewrite_graph_def(ours.graph_def, **kw)
    assert again.report["casts_to_low"] == again.report["casts_to_high"] == 0
    assert again.report["converted_nodes"] == 0


def test_force_all_rewrite_of_a_keras_mlp_is_idempotent():
    import sys, os
    sys.path.insert(0, os.path.dirname(__file__))
    import corpus

    item = corpus.build("mlp/training")
    kw = dict(target="gpu:8.0", precision="float16", level="UNSAFE_FORCE_ALL",
              fetches=list(item.fetches), use_env=False)
    once = amp_rewrite.rewrite_graph_def(item.graph_def, **kw)
    assert once.report["converted_nodes"] > 0
    twice = amp_rewrite.rewrite_graph_def(once.graph_def, **kw)
    assert twice.report["casts_to_low"] == twice.report["casts_to_high"] == 0


def _loop_then_matmul_graph_def() -> tf.compat.v1.GraphDef:
    """A functional loop (``StatelessWhile`` with ``cond``/``body`` functions) whose state
    starts from a ``Fill`` and feeds a MatMul: the loop variable sits between clear ops and
    an allow-list op, as a Keras LSTM's state does on a CPU."""

    @tf.function
    def step(x, w):
        h0 = tf.fill(tf.shape(x), 0.5)
        _, h = tf.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, tf.tanh(h + x)), [tf.constant(0), h0])
        return tf.matmul(h, w)

    spec = (tf.TensorSpec([4, 8], tf.float32, name="x"), tf.TensorSpec([8, 8], tf.float32, name="w"))
    return step.get_concrete_function(*spec).graph.as_graph_def()


def test_loop_variables_keep_their_functions_types():
    # KD-6: TensorFlow's bfloat16 lists clear While/StatelessWhile and its pass paints the loop
    # variable bfloat16 while cond and body keep float32 signatures; its own graph optimizer
    # then rejects the result.  Ours keeps the loop a float32 boundary and converts the rest.
    import numpy as np
    import pytest

    from amp_rewrite.testing import InvariantError, check_valid

    # Before 2.17 TensorFlow's bfloat16 lists put While on no list: the same graph shows no
    # difference there (the parity tier runs this under 2.16).
    lists_clear_loops = tuple(int(p) for p in tf.__version__.split(".")[:2]) >= (2, 17)
    gd = _loop_then_matmul_graph_def()
    fetches = ["Identity"]
    bf16 = tf.bfloat16.as_datatype_enum
    theirs = tf_amp_rewrite(gd, fetches, mode="bf16", tfg=False)  # the pass's output, before TFG checks it
    kwargs = dict(target="cpu", precision="bfloat16", lists="tensorflow", fetches=fetches, use_env=False)
    exact = amp_rewrite.rewrite_graph_def(gd, tensorflow_bugs=True, **kwargs)
    assert converted_type_attrs(gd, exact.graph_def, to_dtype=bf16) == converted_type_attrs(gd, theirs, to_dtype=bf16)
    if lists_clear_loops:
        assert ("", "while", "T[3]") in converted_type_attrs(gd, theirs, to_dtype=bf16)
        with pytest.raises(InvariantError, match="does not match the signature"):
            check_valid(gd, theirs, run=False)
        with pytest.raises(tf.errors.InvalidArgumentError, match="Graph Optimizer failed"):
            tf_amp_rewrite(gd, fetches, mode="bf16")

    ours = amp_rewrite.rewrite_graph_def(gd, **kwargs)
    loop = next(n for n in ours.graph_def.node if n.op == "StatelessWhile")
    assert list(loop.attr["T"].list.type) == [int(t) for t in next(
        n for n in gd.node if n.op == "StatelessWhile").attr["T"].list.type]
    # The Fill stays float32 too: the loop, a boundary, does not link it to the MatMul.
    assert converted_type_attrs(gd, ours.graph_def, to_dtype=bf16) == {("", "MatMul", "T")}
    if lists_clear_loops:
        assert ours.report["nodes"][loop.name]["reason"].startswith("[KD-6]")
    check_valid(gd, ours.graph_def, feeds={"x:0": np.ones((4, 8), np.float32), "w:0": np.eye(8, dtype=np.float32)})
