"""Sanity tests for the test corpus (tests/corpus.py) and the TF oracle (tests/tf_oracle.py).

Items built from the big Keras applications (ResNet50, MobileNetV2) are marked ``slow``.
"""

from __future__ import annotations

import numpy as np
import pytest

try:  # tests/ is a rootdir-style test directory (no __init__.py) ...
    import corpus
    import tf_oracle
except ImportError:  # ... unless someone turns it into a package
    from tests import corpus, tf_oracle

from tensorflow.core.framework import attr_value_pb2, function_pb2, graph_pb2, types_pb2
from tensorflow.python.framework import errors

BIG_MODELS = ("resnet50", "mobilenetv2")


def _param(name: str):
    marks = [pytest.mark.slow] if name.split("/")[0] in BIG_MODELS else []
    return pytest.param(name, marks=marks, id=name)


ALL = [_param(n) for n in corpus.corpus_names()]
INFERENCE = [_param(n) for n in corpus.corpus_names() if "/inference" in n]
# Graphs whose TF-rewritten version executes (see tf_oracle docstring: a TensorList going through
# a functional While is painted half in the main graph but not in the body function).
TF_OUTPUT_BROKEN = {"rnn/inference_v2", "rnn/training"}
RUNNABLE_AFTER_TF = [
    _param(n)
    for n in corpus.corpus_names()
    if n not in TF_OUTPUT_BROKEN and not n.endswith("/training")
]

ALLOW_OPS = {"MatMul", "Conv2D", "BatchMatMulV2", "Einsum", "Conv2DBackpropInput",
             "Conv2DBackpropFilter"}


def _ops(gd) -> dict[tuple[str, str], str]:
    ops = {("", n.name): n.op for n in gd.node}
    for f in gd.library.function:
        ops.update({(f.signature.name, n.name): n.op for n in f.node_def})
    return ops


def _serialized(gd) -> bytes:
    return gd.SerializeToString(deterministic=True)


# ------------------------------------------------------------------------------------------
# Corpus


def test_corpus_names():
    names = corpus.corpus_names()
    assert len(names) == len(set(names))
    for model in ("resnet50", "mobilenetv2", "mlp", "transformer", "rnn"):
        assert f"{model}/inference" in names
        assert f"{model}/training" in names
    assert "while_v1" in names
    with pytest.raises(KeyError):
        corpus.build("nope/inference")


@pytest.mark.parametrize("name", ALL)
def test_item_builds_and_runs(name):
    item = corpus.build(name)
    assert corpus.build(name) is item  # cached
    assert item.name == name
    assert item.kind == {"inference": "inference", "training": "training"}.get(
        name.split("/")[-1].split("_")[0], "v1loop"
    )
    gd = item.graph_def
    node_names = {n.name for n in gd.node}
    assert set(item.fetches) <= node_names
    for tensor in item.feeds:
        assert tensor.endswith(":0") and tensor[:-2] in node_names
    assert item.feeds["x:0"].shape[0] == corpus.BATCH
    if item.kind == "training":
        placeholders = {
            n.name for n in gd.node
            if n.op == "Placeholder" and n.attr["dtype"].type == types_pb2.DT_RESOURCE
        }
        assert placeholders and placeholders == set(item.variables)
        assert set(item.watch) <= placeholders
    else:
        assert not item.variables

    before = _serialized(gd)
    out = corpus.run(gd, item)
    assert _serialized(gd) == before
    assert len(out) == len(item.fetches) + len(item.watch)
    assert [tuple(o.shape) for o in out] == [tuple(s) for s in item.output_shapes]
    for o in out:
        assert np.all(np.isfinite(o)), name
    if item.kind == "inference":
        assert out[0].shape == (corpus.BATCH, corpus.NUM_CLASSES)
    if item.kind == "training":
        assert out[0].shape == ()
        # one optimizer step really updated the watched variables
        for w, value in zip(item.watch, out[len(item.fetches):]):
            assert not np.array_equal(value, item.variables[w]), w


def test_run_is_repeatable_and_starts_from_stored_weights():
    item = corpus.build("mlp/training")
    a = corpus.run(item.graph_def, item)
    b = corpus.run(item.graph_def, item)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_while_v1_uses_control_flow_v1():
    item = corpus.build("while_v1")
    ops = {n.op for n in item.graph_def.node}
    assert {"Enter", "Merge", "Switch", "NextIteration", "Exit", "LoopCond", "MatMul"} <= ops
    assert not item.graph_def.library.function
    import tensorflow as tf

    assert tf.compat.v1.control_flow_v2_enabled()  # restored after building


def test_rnn_variants_agree():
    lowered = corpus.build("rnn/inference")
    functional = corpus.build("rnn/inference_v2")
    assert not lowered.graph_def.library.function
    assert {"Enter", "TensorListSetItem"} <= {n.op for n in lowered.graph_def.node}
    assert functional.graph_def.library.function
    assert {"While", "StatelessWhile"} & {n.op for n in functional.graph_def.node}
    np.testing.assert_allclose(
        corpus.run(lowered.graph_def, lowered)[0],
        corpus.run(functional.graph_def, functional)[0],
        rtol=1e-5,
        atol=1e-6,
    )


def test_training_graph_has_function_library():
    item = corpus.build("rnn/training")
    names = [f.signature.name for f in item.graph_def.library.function]
    assert any("while_body" in n for n in names)
    # canonicalized uids: zero-padded, stable across processes
    assert all("_0" in n for n in names)


# ------------------------------------------------------------------------------------------
# Oracle


@pytest.mark.parametrize("name", INFERENCE)
def test_oracle_converts_on_ampere_and_not_on_pascal(name):
    item = corpus.build(name)
    before = _serialized(item.graph_def)

    after = tf_oracle.tf_amp_rewrite(item.graph_def, item.fetches, gpus=("8.0",))
    assert _serialized(item.graph_def) == before  # input untouched
    converted = tf_oracle.converted_type_attrs(item.graph_def, after)
    ops = _ops(item.graph_def)
    allow = {(s, n) for (s, n, a) in converted if a == "T" and ops[(s, n)] in ALLOW_OPS}
    assert allow, f"no MatMul/Conv2D converted in {name}"
    assert tf_oracle.amp_cast_count(item.graph_def, after) > 0
    # fetched nodes are preserved
    for f in item.fetches:
        assert all(n != f for (_, n, _) in converted)
    after_nodes = {n.name: n for n in after.node}
    assert set(item.fetches) <= set(after_nodes)

    old = tf_oracle.tf_amp_rewrite(item.graph_def, item.fetches, gpus=("6.1",))
    assert _serialized(item.graph_def) == before
    assert tf_oracle.converted_type_attrs(item.graph_def, old) == set()
    assert tf_oracle.amp_cast_count(item.graph_def, old) == 0
    assert tf_oracle.same_nodes(item.graph_def, old)
    assert tf_oracle.rewritten_functions(item.graph_def, old) == []


@pytest.mark.parametrize("name", ["mlp/training", "transformer/training", "while_v1"])
def test_oracle_small_graphs(name):
    item = corpus.build(name)
    after = tf_oracle.tf_amp_rewrite(item.graph_def, item.fetches)
    converted = tf_oracle.converted_type_attrs(item.graph_def, after)
    ops = _ops(item.graph_def)
    assert any(ops[(s, n)] == "MatMul" and a == "T" for (s, n, a) in converted)
    assert tf_oracle.amp_cast_count(item.graph_def, after) > 0
    none = tf_oracle.tf_amp_rewrite(item.graph_def, item.fetches, gpus=())
    assert tf_oracle.converted_type_attrs(item.graph_def, none) == set()
    assert tf_oracle.same_nodes(item.graph_def, none)


def test_oracle_rewrites_reachable_functions():
    item = corpus.build("rnn/training")
    after = tf_oracle.tf_amp_rewrite(item.graph_def, item.fetches)
    changed = tf_oracle.rewritten_functions(item.graph_def, after)
    assert changed and all("while_body" in f for f in changed)
    scopes = {s for (s, _, _) in tf_oracle.converted_type_attrs(item.graph_def, after)}
    assert "" in scopes and scopes - {""} == set(changed)
    # function signatures never change, and unreachable functions are dropped
    b = {f.signature.name: f for f in item.graph_def.library.function}
    a = {f.signature.name: f for f in after.library.function}
    assert set(a) < set(b)
    for fname, f in a.items():
        assert f.signature == b[fname].signature
    # Main-graph functional While nodes are boundaries.
    for n in after.node:
        if n.op in ("While", "StatelessWhile"):
            assert types_pb2.DT_HALF not in n.attr["T"].list.type


@pytest.mark.parametrize("name", RUNNABLE_AFTER_TF)
def test_tf_rewritten_graph_runs_close_to_original(name):
    item = corpus.build(name)
    after = tf_oracle.tf_amp_rewrite(item.graph_def, item.fetches)
    ref = corpus.run(item.graph_def, item)
    got = corpus.run(after, item)
    for r, g in zip(ref, got):
        assert g.dtype == r.dtype  # fetches are preserved as float32
        np.testing.assert_allclose(g, r, rtol=5e-2, atol=5e-3)


def test_tf_output_for_tensorlist_through_while_does_not_run():
    """Documents TF 2.21 behaviour (see tf_oracle docstring)."""
    item = corpus.build("rnn/inference_v2")
    after = tf_oracle.tf_amp_rewrite(item.graph_def, item.fetches)
    half_lists = [
        n.name for n in after.node
        if n.op.startswith("TensorList") and n.attr["element_dtype"].type == types_pb2.DT_HALF
    ]
    assert half_lists
    with pytest.raises(errors.InvalidArgumentError, match="list elements half"):
        corpus.run(after, item)


def test_oracle_bf16_mode():
    item = corpus.build("mlp/inference")
    after = tf_oracle.tf_amp_rewrite(item.graph_def, item.fetches, mode="bf16")
    converted = tf_oracle.converted_type_attrs(
        item.graph_def, after, to_dtype=tf_oracle.DT_BFLOAT16
    )
    ops = _ops(item.graph_def)
    assert any(ops[(s, n)] == "MatMul" for (s, n, _) in converted)
    assert tf_oracle.converted_type_attrs(item.graph_def, after) == set()  # nothing to half
    assert any("CastToBf16" in n.name for n in after.node)


def test_oracle_accepts_fetch_tensor_names_and_string_gpu():
    item = corpus.build("mlp/inference")
    a = tf_oracle.tf_amp_rewrite(item.graph_def, [f + ":0" for f in item.fetches], gpus="8.0")
    b = tf_oracle.tf_amp_rewrite(item.graph_def, item.fetches)
    assert tf_oracle.converted_type_attrs(item.graph_def, a) == tf_oracle.converted_type_attrs(
        item.graph_def, b
    )


# ------------------------------------------------------------------------------------------
# Helpers on handmade graphs


def _node(gd_or_fn, name, op, **types):
    n = gd_or_fn.add()
    n.name, n.op = name, op
    for k, v in types.items():
        if isinstance(v, list):
            n.attr[k].CopyFrom(attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(type=v)))
        else:
            n.attr[k].CopyFrom(attr_value_pb2.AttrValue(type=v))
    return n


def _handmade(half: bool):
    F, H = types_pb2.DT_FLOAT, types_pb2.DT_HALF
    t = H if half else F
    gd = graph_pb2.GraphDef()
    _node(gd.node, "mm", "MatMul", T=t)
    _node(gd.node, "ids", "IdentityN", T=[F, t, types_pb2.DT_INT32])
    _node(gd.node, "c", "Const", dtype=F)
    if half:
        _node(gd.node, "mm-0-CastToFp16-AutoMixedPrecision", "Cast", SrcT=F, DstT=H)
        _node(gd.node, "only_after", "Relu", T=H)
    else:
        _node(gd.node, "only_before", "Relu", T=F)
    fn = function_pb2.FunctionDef()
    fn.signature.name = "body"
    _node(fn.node_def, "mm", "MatMul", T=t)
    if half:
        _node(fn.node_def, "cast", "Cast", SrcT=F, DstT=H)
    gd.library.function.add().CopyFrom(fn)
    return gd


def test_converted_type_attrs_and_cast_count_handmade():
    before, after = _handmade(False), _handmade(True)
    assert tf_oracle.converted_type_attrs(before, after) == {
        ("", "mm", "T"),
        ("", "ids", "T[1]"),
        ("body", "mm", "T"),
    }
    assert tf_oracle.converted_type_attrs(before, after, to_dtype=types_pb2.DT_BFLOAT16) == set()
    assert tf_oracle.converted_type_attrs(before, before) == set()
    assert tf_oracle.amp_cast_count(before, after) == 2
    assert tf_oracle.amp_cast_count(after, after) == 0
    assert tf_oracle.rewritten_functions(before, after) == ["body"]
    assert not tf_oracle.same_nodes(before, after)
    assert tf_oracle.same_nodes(before, before)
