"""The rewrite's self-check (:mod:`amp_rewrite.rewrite_check`): a rewrite that would hand
TensorFlow a graph it cannot build fails with a RewriteError naming the node, before anything
is written; a type error the input had already is not the rewrite's to report.

Each broken rewrite here is made by switching off one piece of the product (the binding of
calls to their functions' signatures, KD-6's fix; the Casts), so that the check is seen to
catch what those pieces prevent.
"""

from __future__ import annotations

import logging

import pytest
import tensorflow as tf

import amp_rewrite
from amp_rewrite.graph import dtypes as dt
from amp_rewrite.plan.painting import PaintingState
from amp_rewrite.rewrite import _Rewriter
from test_known_differences import _loop_then_matmul_graph_def

_BF16_CPU = dict(target="cpu", precision="bfloat16", lists="tensorflow", fetches=["Identity"], use_env=False)
_FP16_GPU = dict(target="gpu:8.0", precision="float16", lists="tensorflow", fetches=["y"], use_env=False)
# TensorFlow's bfloat16 lists clear While from 2.17: before, the loop is on no list and the
# painting never reaches it.
_LISTS_CLEAR_LOOPS = tuple(int(p) for p in tf.__version__.split(".")[:2]) >= (2, 17)


def _matmul_graph_def(extra: bool = False) -> tf.compat.v1.GraphDef:
    """``y = Identity(MatMul(x, w))``; with ``extra``, also a node that the input itself types
    wrongly (an int32 Identity reading float32 ``x``), which TensorFlow would reject."""
    gd = tf.compat.v1.GraphDef()
    for name in ("x", "w"):
        node = gd.node.add(name=name, op="Placeholder")
        node.attr["dtype"].type = dt.FLOAT
        node.attr["shape"].shape.CopyFrom(tf.TensorShape([16, 16]).as_proto())
    mm = gd.node.add(name="mm", op="MatMul", input=["x", "w"])
    mm.attr["T"].type = dt.FLOAT
    y = gd.node.add(name="y", op="Identity", input=["mm"])
    y.attr["T"].type = dt.FLOAT
    if extra:
        bad = gd.node.add(name="bad", op="Identity", input=["x"])
        bad.attr["T"].type = dt.INT32
    return gd


@pytest.mark.skipif(not _LISTS_CLEAR_LOOPS, reason="TensorFlow's bfloat16 lists put While on a list from 2.17")
def test_a_call_retyped_against_its_functions_fails_the_rewrite(monkeypatch):
    gd = _loop_then_matmul_graph_def()
    given = gd.SerializeToString(deterministic=True)
    assert amp_rewrite.rewrite_graph_def(gd, **_BF16_CPU).report["converted_nodes"] == 1  # the MatMul
    # Without KD-6's fix the loop variable is painted bfloat16 against its functions' float32.
    monkeypatch.setattr(PaintingState, "_bind_function_signatures", lambda self: None)
    with pytest.raises(amp_rewrite.RewriteError) as caught:
        amp_rewrite.rewrite_graph_def(gd, **_BF16_CPU)
    err = caught.value
    assert err.node == "while"
    assert "the main graph failed its type check" in str(err)
    assert "passes arguments T that do not match its body 'while_body" in str(err)
    assert "element 3 is bfloat16" in str(err) and "declares float32" in str(err)
    assert "excluding 'while'" in str(err)
    assert gd.SerializeToString(deterministic=True) == given


@pytest.mark.skipif(not _LISTS_CLEAR_LOOPS, reason="TensorFlow's bfloat16 lists put While on a list from 2.17")
def test_tensorflow_bugs_keeps_the_passs_invalid_graph_with_a_warning(caplog):
    # Parity with TensorFlow's pass means its output, which TensorFlow rejects (KD-6).
    gd = _loop_then_matmul_graph_def()
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        result = amp_rewrite.rewrite_graph_def(gd, tensorflow_bugs=True, **_BF16_CPU)
    loop = next(n for n in result.graph_def.node if n.name == "while")
    assert loop.attr["T"].list.type[3] == dt.BFLOAT16
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("main graph will not run" in w and "'while'" in w for w in warnings), warnings


def test_a_missing_cast_fails_the_rewrite(monkeypatch):
    gd = _matmul_graph_def()
    assert amp_rewrite.rewrite_graph_def(gd, **_FP16_GPU).report["casts_to_low"] == 2
    monkeypatch.setattr(_Rewriter, "rewire", lambda self, *args: None)  # no Casts at all
    with pytest.raises(amp_rewrite.RewriteError) as caught:
        amp_rewrite.rewrite_graph_def(gd, **_FP16_GPU)
    message = str(caught.value)
    assert caught.value.node == "mm"
    assert "MatMul node 'mm' reads float32 from output 0 of Placeholder node 'w' at input 1, which is float16" \
        in message
    assert "Identity node 'y' reads float16 from output 0 of MatMul node 'mm'" in message


def test_an_op_missing_from_the_registry_must_be_handed_the_type_it_had(monkeypatch):
    gd = _matmul_graph_def()
    custom = gd.node.add(name="custom", op="AmpRewriteTestCustomOp", input=["mm"])
    custom.attr["T"].type = dt.FLOAT
    result = amp_rewrite.rewrite_graph_def(gd, **_FP16_GPU)
    (fed,) = next(n for n in result.graph_def.node if n.name == "custom").input
    assert fed != "mm" and next(n for n in result.graph_def.node if n.name == fed).attr["DstT"].type == dt.FLOAT
    monkeypatch.setattr(_Rewriter, "rewire", lambda self, *args: None)
    with pytest.raises(amp_rewrite.RewriteError, match="AmpRewriteTestCustomOp node 'custom' reads float16 "
                       "from output 0 of MatMul node 'mm' at input 0, which is float32"):
        amp_rewrite.rewrite_graph_def(gd, **_FP16_GPU)


def test_a_type_error_the_input_had_is_not_blamed_on_the_rewrite():
    gd = _matmul_graph_def(extra=True)
    result = amp_rewrite.rewrite_graph_def(gd, **_FP16_GPU)
    # The rewrite did its work around the broken node, and left it as it was.
    assert result.report["converted_nodes"] == 1
    assert result.report["nodes"]["mm"]["dtype"] == "float16"
    bad = next(n for n in result.graph_def.node if n.name == "bad")
    assert list(bad.input) == ["x"] and bad.attr["T"].type == dt.INT32


def _call_graph_def() -> tf.compat.v1.GraphDef:
    """``Identity(inner(x, w))`` where ``inner``, a function of the library, is a MatMul."""

    @tf.function
    def inner(x, w):
        return tf.matmul(x, w)

    @tf.function
    def outer(x, w):
        return tf.identity(inner(x, w))

    spec = tf.TensorSpec([16, 16], tf.float32)
    return outer.get_concrete_function(spec, spec).graph.as_graph_def()


def test_a_missing_cast_inside_a_function_names_the_function(monkeypatch):
    gd = _call_graph_def()
    options = dict(_FP16_GPU, fetches=["Identity"])
    result = amp_rewrite.rewrite_graph_def(gd, **options)
    (inner,) = [f for f in result.graph_def.library.function if "inner" in f.signature.name]
    assert any(n.op == "MatMul" and n.attr["T"].type == dt.HALF for n in inner.node_def)
    monkeypatch.setattr(_Rewriter, "rewire", lambda self, *args: None)
    with pytest.raises(amp_rewrite.RewriteError, match=rf"the rewrite of function {inner.signature.name} "
                       r"failed its type check.*MatMul node 'MatMul' reads float32 from output 0 of _Arg"):
        amp_rewrite.rewrite_graph_def(gd, **options)
