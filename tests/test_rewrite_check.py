"""The rewrite's self-check (:mod:`amp_rewrite.rewrite_check`): a rewrite that would hand
TensorFlow a graph it cannot build is made again with the nodes involved kept float32, with a
WARNING; where that does not avoid it (or the retries are spent) it fails with a RewriteError
naming the node, before anything is written.  A type error the input had already is not the
rewrite's to report.

Each broken rewrite here is made by switching off one piece of the product (the binding of
calls to their functions' signatures, KD-6's fix; the Casts), so that the check is seen to
catch what those pieces prevent.  ``_TYPE_CHECK_RETRIES = 0`` shows what the check finds
first; the default shows the recovery.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, Phase, find, given, settings

import amp_rewrite
import amp_rewrite.api
from amp_rewrite.graph import dtypes as dt
from amp_rewrite.plan.painting import PaintingState
from amp_rewrite.rewrite import _Rewriter
from amp_rewrite.testing import InvariantError, check_valid, graphs
from conftest import examples
from test_known_differences import _loop_then_matmul_graph_def

_BF16_CPU = dict(target="cpu", precision="bfloat16", lists="tensorflow", fetches=["Identity"], use_env=False)
_FP16_GPU = dict(target="gpu:8.0", precision="float16", lists="tensorflow", fetches=["y"], use_env=False)
# TensorFlow's bfloat16 lists clear While from 2.17: before, the loop is on no list and the
# painting never reaches it.
_LISTS_CLEAR_LOOPS = tuple(int(p) for p in tf.__version__.split(".")[:2]) >= (2, 17)


def _matmul_graph_def(extra: bool = False) -> tf.compat.v1.GraphDef:
    """``y = Identity(MatMul(x, w))``; with ``extra``, also two nodes that the input itself
    types wrongly (int32 Identities reading float32 ``x`` and the MatMul), which TensorFlow
    would reject."""
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
        for name, source in (("bad", "x"), ("bad_too", "mm")):
            bad = gd.node.add(name=name, op="Identity", input=[source])
            bad.attr["T"].type = dt.INT32
    return gd


def _no_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(amp_rewrite.api, "_TYPE_CHECK_RETRIES", 0)


def _unbind_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without KD-6's fix the loop variable is painted bfloat16 against its functions' float32."""
    monkeypatch.setattr(PaintingState, "_bind_function_signatures", lambda self: None)


def _no_casts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_Rewriter, "rewire", lambda self, *args: None)


@pytest.mark.type_check_failures
@pytest.mark.skipif(not _LISTS_CLEAR_LOOPS, reason="TensorFlow's bfloat16 lists put While on a list from 2.17")
def test_a_call_retyped_against_its_functions_fails_the_check(monkeypatch):
    gd = _loop_then_matmul_graph_def()
    as_given = gd.SerializeToString(deterministic=True)
    assert amp_rewrite.rewrite_graph_def(gd, **_BF16_CPU).report["converted_nodes"] == 1  # the MatMul
    _unbind_calls(monkeypatch)
    _no_retries(monkeypatch)
    with pytest.raises(amp_rewrite.RewriteError) as caught:
        amp_rewrite.rewrite_graph_def(gd, **_BF16_CPU)
    err = caught.value
    assert err.node == "while"
    assert "the main graph failed its type check, so nothing was written" in str(err)
    assert "passes arguments T that do not match its body 'while_body" in str(err)
    assert "element 3 is bfloat16" in str(err) and "declares float32" in str(err)
    assert "This is a bug in amp_rewrite" in str(err)
    assert gd.SerializeToString(deterministic=True) == as_given


@pytest.mark.type_check_failures
@pytest.mark.skipif(not _LISTS_CLEAR_LOOPS, reason="TensorFlow's bfloat16 lists put While on a list from 2.17")
def test_a_failed_check_is_rewritten_again_with_the_nodes_involved_kept_float32(monkeypatch, caplog):
    gd = _loop_then_matmul_graph_def()
    _unbind_calls(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        result = amp_rewrite.rewrite_graph_def(gd, **_BF16_CPU)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("failed its type check" in w and "Rewriting again with 'while' kept float32" in w
               for w in warnings), warnings
    loop = next(n for n in result.graph_def.node if n.name == "while")
    assert list(loop.attr["T"].list.type) == list(next(n for n in gd.node if n.name == "while").attr["T"].list.type)
    assert result.report["nodes"]["while"]["reason"].startswith(
        "preserved: kept float32 after the rewrite that converted it failed amp_rewrite's type check")
    # The rest of the rewrite stands: the MatMul runs in bfloat16, and the graph runs.
    assert result.report["converted_nodes"] == 1
    check_valid(gd, result.graph_def, feeds={"x:0": np.ones((4, 8), np.float32), "w:0": np.eye(8, dtype=np.float32)})


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


@pytest.mark.type_check_failures
def test_a_missing_cast_fails_the_check(monkeypatch):
    gd = _matmul_graph_def()
    assert amp_rewrite.rewrite_graph_def(gd, **_FP16_GPU).report["casts_to_low"] == 2
    _no_casts(monkeypatch)
    _no_retries(monkeypatch)
    with pytest.raises(amp_rewrite.RewriteError) as caught:
        amp_rewrite.rewrite_graph_def(gd, **_FP16_GPU)
    message = str(caught.value)
    assert caught.value.node == "mm"
    assert "MatMul node 'mm' reads float32 from output 0 of Placeholder node 'w' at input 1, which is float16" \
        in message
    assert "Identity node 'y' reads float16 from output 0 of MatMul node 'mm'" in message


@pytest.mark.type_check_failures
def test_a_check_that_fails_again_raises(monkeypatch, caplog):
    # With no Casts at all, keeping the first try's nodes float32 (both ends of each broken
    # edge) leaves nothing to convert here; a rewrite that cannot avoid the break raises once
    # nothing new is left to keep.
    gd = _matmul_graph_def()
    _no_casts(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        result = amp_rewrite.rewrite_graph_def(gd, **_FP16_GPU)
    assert result.report["converted_nodes"] == 0
    assert result.report["nodes"]["mm"]["reason"].startswith("preserved: kept float32 after the rewrite")
    assert sum("failed its type check" in r.getMessage() for r in caplog.records) == 1
    # A break that keeping nodes float32 cannot avoid: every try retypes the MatMul anyway.
    monkeypatch.setattr(amp_rewrite.api, "_still_kept", lambda kept, g, preserved: {})
    with pytest.raises(amp_rewrite.RewriteError, match=r"failed its type check.*Keeping 4 node\(s\) float32 "
                       r"that earlier tries involved did not avoid it"):
        amp_rewrite.rewrite_graph_def(gd, **_FP16_GPU)


@pytest.mark.type_check_failures
def test_an_op_missing_from_the_registry_must_be_handed_the_type_it_had(monkeypatch):
    gd = _matmul_graph_def()
    custom = gd.node.add(name="custom", op="AmpRewriteTestCustomOp", input=["mm"])
    custom.attr["T"].type = dt.FLOAT
    result = amp_rewrite.rewrite_graph_def(gd, **_FP16_GPU)
    (fed,) = next(n for n in result.graph_def.node if n.name == "custom").input
    assert fed != "mm" and next(n for n in result.graph_def.node if n.name == fed).attr["DstT"].type == dt.FLOAT
    _no_casts(monkeypatch)
    _no_retries(monkeypatch)
    with pytest.raises(amp_rewrite.RewriteError, match="AmpRewriteTestCustomOp node 'custom' reads float16 "
                       "from output 0 of MatMul node 'mm' at input 0, which is float32"):
        amp_rewrite.rewrite_graph_def(gd, **_FP16_GPU)


@pytest.mark.type_check_failures
def test_a_function_that_fails_the_check_is_rewritten_again_alone(monkeypatch, caplog):
    gd = _call_graph_def()
    options = dict(_FP16_GPU, fetches=["Identity"])
    _no_casts(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        result = amp_rewrite.rewrite_graph_def(gd, **options)
    (inner,) = [f for f in result.graph_def.library.function if "inner" in f.signature.name]
    warnings = [r.getMessage() for r in caplog.records if "failed its type check" in r.getMessage()]
    assert len(warnings) == 1 and f"function {inner.signature.name}" in warnings[0]
    assert all(n.attr["T"].type == dt.FLOAT for n in inner.node_def if n.op == "MatMul")
    reason = result.report["functions"][inner.signature.name]["nodes"]["MatMul"]["reason"]
    assert reason.startswith("preserved: kept float32 after the rewrite that converted it failed")
    check_valid(gd, result.graph_def, feeds={"x:0": np.eye(16, dtype=np.float32),
                                             "w:0": np.ones((16, 16), np.float32)})


def _gru_cell_graph_def() -> tf.compat.v1.GraphDef:
    """A fused GRU cell (``GRUBlockCell``, on TensorFlow's allow list, whose ``T`` takes only
    float32) read by an Identity."""

    @tf.function
    def cell(x, h, w_ru, w_c, b_ru, b_c):
        return tf.identity(tf.raw_ops.GRUBlockCell(x=x, h_prev=h, w_ru=w_ru, w_c=w_c, b_ru=b_ru, b_c=b_c)[3])

    specs = [tf.TensorSpec(s, tf.float32) for s in ([8, 16], [8, 32], [48, 64], [48, 32], [64], [32])]
    return cell.get_concrete_function(*specs).graph.as_graph_def()


@pytest.mark.type_check_failures
def test_a_type_the_op_does_not_allow_fails_the_check(monkeypatch):
    gd = _gru_cell_graph_def()
    options = dict(_FP16_GPU, fetches=["Identity"])
    result = amp_rewrite.rewrite_graph_def(gd, **options)
    assert result.report["converted_nodes"] == 0  # TensorFlow's kernel takes float32 only
    # Painted as if the op took float16 (and had a kernel for it), it is converted, with
    # Casts on every edge: only its own type is wrong.
    monkeypatch.setattr(PaintingState, "_supports_dtype", lambda self, op, known, ta: known)
    monkeypatch.setattr(PaintingState, "has_kernel", lambda self, v: True)
    _no_retries(monkeypatch)
    with pytest.raises(amp_rewrite.RewriteError, match=r"GRUBlockCell node '\w+' has T float16, which op "
                       r"GRUBlockCell does not allow"):
        amp_rewrite.rewrite_graph_def(gd, **options)


def test_a_type_error_the_input_had_is_not_blamed_on_the_rewrite():
    gd = _matmul_graph_def(extra=True)
    result = amp_rewrite.rewrite_graph_def(gd, **_FP16_GPU)
    # The rewrite did its work around the broken nodes, and left them as they were: one still
    # reads x, the other now reads the MatMul's float32 copy, as mistyped as before (no
    # WARNING either: the suite fails a test whose rewrite fails its type check).
    assert result.report["converted_nodes"] == 1
    assert result.report["nodes"]["mm"]["dtype"] == "float16"
    nodes = {n.name: n for n in result.graph_def.node}
    assert list(nodes["bad"].input) == ["x"] and nodes["bad"].attr["T"].type == dt.INT32
    (cast,) = nodes["bad_too"].input
    assert nodes[cast].op == "Cast" and nodes[cast].attr["DstT"].type == dt.FLOAT
    assert nodes["bad_too"].attr["T"].type == dt.INT32


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


@pytest.mark.type_check_failures
def test_a_missing_cast_inside_a_function_names_the_function(monkeypatch):
    gd = _call_graph_def()
    options = dict(_FP16_GPU, fetches=["Identity"])
    result = amp_rewrite.rewrite_graph_def(gd, **options)
    (inner,) = [f for f in result.graph_def.library.function if "inner" in f.signature.name]
    assert any(n.op == "MatMul" and n.attr["T"].type == dt.HALF for n in inner.node_def)
    _no_casts(monkeypatch)
    _no_retries(monkeypatch)
    with pytest.raises(amp_rewrite.RewriteError, match=rf"the rewrite of function {inner.signature.name} "
                       r"failed its type check.*MatMul node 'MatMul' reads float32 from output 0 of _Arg"):
        amp_rewrite.rewrite_graph_def(gd, **options)


class _Warnings(logging.Handler):
    """The WARNING messages amp_rewrite logs while it is attached."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


#: Drawn graphs with many loops and MatMuls between clear ops: where TensorFlow's bfloat16
#: painting (kept with its bugs) meets a functional loop, about one graph in fifteen.
_LOOPS_AND_MATMULS = graphs(while_loops=True, functions=True, min_nodes=3,
                            ops={"MatMul": 3, "Tanh": 1, "AddV2": 1, "Identity": 1, "Relu": 1})


def _rewrite_with_tensorflows_bugs(case) -> tuple[amp_rewrite.RewriteResult, bool]:
    """The bfloat16 rewrite of ``case`` with TensorFlow's lists and bugs, and whether the
    check warned that it will not run."""
    handler = _Warnings()
    logger = logging.getLogger("amp_rewrite")
    logger.addHandler(handler)
    try:
        out = amp_rewrite.rewrite_graph_def(case.graph_def, target="cpu", precision="bfloat16", lists="tensorflow",
                                            tensorflow_bugs=True, fetches=list(case.fetches), use_env=False)
    finally:
        logger.removeHandler(handler)
    return out, any("will not run" in m for m in handler.messages)


def _invalid(case, out) -> InvariantError | None:
    try:
        check_valid(case.graph_def, out.graph_def, run=False)
    except InvariantError as exc:
        return exc
    return None


@settings(max_examples=examples(60), deadline=None, suppress_health_check=list(HealthCheck))
@given(_LOOPS_AND_MATMULS)
def test_the_check_agrees_with_tensorflows_registries(case):
    """A differential test of the check: with TensorFlow's bugs kept, the bfloat16 painting
    makes graphs TensorFlow will not build (KD-6's functional loops).  The check must warn on
    exactly those that the testing kit's ``valid`` invariant, which reads TensorFlow's own op
    registry and the exported GraphDef, finds mistyped."""
    out, warned = _rewrite_with_tensorflows_bugs(case)
    invalid = _invalid(case, out)
    assert warned == (invalid is not None), invalid


@pytest.mark.skipif(not _LISTS_CLEAR_LOOPS, reason="TensorFlow's bfloat16 lists put While on a list from 2.17")
def test_the_check_finds_a_drawn_graph_tensorflows_painting_breaks():
    # The other direction of the test above, made sure of: a drawn graph that it warns on.
    case = find(_LOOPS_AND_MATMULS, lambda c: _rewrite_with_tensorflows_bugs(c)[1], settings=settings(
        max_examples=500, phases=[Phase.generate], database=None, derandomize=True,
        suppress_health_check=list(HealthCheck)))
    out, _ = _rewrite_with_tensorflows_bugs(case)
    assert "does not match the signature" in str(_invalid(case, out))


@pytest.mark.type_check_failures
def test_the_command_line_writes_nothing_when_the_check_fails(tmp_path, monkeypatch, capsys):
    from amp_rewrite.cli import main

    source = tmp_path / "in.pb"
    source.write_bytes(_matmul_graph_def().SerializeToString())
    given_bytes = source.read_bytes()
    out = tmp_path / "out.pb"
    _no_casts(monkeypatch)
    _no_retries(monkeypatch)
    assert main(["rewrite", str(source), str(out), "--target", "gpu:8.0", "--lists", "tensorflow"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("amp-rewrite: error:") and "failed its type check" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists() and not list(tmp_path.glob("out*"))  # nothing staged is left either
    assert source.read_bytes() == given_bytes
    # With its retries, the same command writes a graph that runs, the MatMul kept float32.
    monkeypatch.setattr(amp_rewrite.api, "_TYPE_CHECK_RETRIES", 2)
    assert main(["rewrite", str(source), str(out), "--target", "gpu:8.0", "--lists", "tensorflow"]) == 0
    written = tf.compat.v1.GraphDef.FromString(out.read_bytes())
    assert next(n for n in written.node if n.name == "mm").attr["T"].type == dt.FLOAT
    check_valid(_matmul_graph_def(), written, run=False)
