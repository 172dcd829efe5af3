"""The default profile's ``[float16.identity]`` rule (and ``[bfloat16.identity]`` on a GPU): a
deny-list reduction whose static shapes show it reduces no element is a copy, and is cleared
instead of denied.

TensorFlow's lists deny ``Sum``; the gradient of a broadcasting ``BatchMatMulV2`` (Keras 3's
``Dense`` on a sequence) sums the input's gradient over no axis, and deny propagation from that
copy kept the gradient of every encoder block float32 (bench/gpu_runs/2026-11-27-h200).  The
``tensorflow`` profile keeps TensorFlow's rule (the parity tests hold it to TensorFlow's pass).
"""

from __future__ import annotations

import json
import pathlib

import jsonschema
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import amp_rewrite
from amp_rewrite.errors import ListError
from amp_rewrite.plan.lists import ListContext, load_lists
from conftest import examples
from graphs import graph_def, run, v1

RNG = np.random.RandomState(0)


def _between_matmuls(reduce) -> tf.compat.v1.GraphDef:
    """``MatMul -> reduce -> MatMul``: ``reduce`` of the first product, read by the second."""
    def build():
        x = v1.placeholder(tf.float32, (16, 32), name="x")
        w = tf.constant(RNG.standard_normal((32, 32)).astype(np.float32) * 0.2)
        h = tf.matmul(x, w, name="mm0")
        r = reduce(h)
        tf.identity(tf.matmul(tf.reshape(r, (-1, 32)), w, name="mm1"), name="out")
    return graph_def(build)


@pytest.mark.parametrize("reduce,expect_identity", [
    (lambda h: tf.reduce_sum(h, axis=[], name="red"), True),  # over no axis
    (lambda h: tf.reduce_mean(tf.reshape(h, (16, 1, 32)), axis=1, name="red"), True),  # an axis of 1
    (lambda h: tf.reduce_sum(tf.reshape(h, (8, 2, 32)), axis=1, name="red"), False),  # two values each
])
def test_a_reduction_over_no_element_is_cleared_in_the_default_profile(reduce, expect_identity):
    gd = _between_matmuls(reduce)
    ours = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", use_env=False)
    tf_rules = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="tensorflow", use_env=False)
    o, t = ours.report["nodes"]["red"], tf_rules.report["nodes"]["red"]
    assert t["color"] == "deny" and t["dtype"] == "float32"
    assert "identity" not in tf_rules.report
    if not expect_identity:
        assert o["color"] == "deny" and "identity" not in ours.report
        return
    # Cleared, then painted between the two MatMuls: it runs in float16, and no Cast is
    # needed around it.
    assert o["dtype"] == "float16" and "shape-proven" in o["reason"], o
    assert set(ours.report["identity"]) == {"red"}
    assert "reduces no element" in ours.report["identity"]["red"]
    schema = json.loads((pathlib.Path(amp_rewrite.__file__).parent / "report_schema.json").read_text())
    errors = list(jsonschema.Draft202012Validator({**schema, "$ref": "#/$defs/core"}).iter_errors(ours.report))
    assert errors == []
    assert ours.report["casts_to_low"] + ours.report["casts_to_high"] < (
        tf_rules.report["casts_to_low"] + tf_rules.report["casts_to_high"])
    x = RNG.standard_normal((16, 32)).astype(np.float32)
    (ref,) = run(gd, {"x:0": x}, ["out:0"])
    (got,) = run(ours.graph_def, {"x:0": x}, ["out:0"])
    err = np.max(np.abs(got - ref)) / np.max(np.abs(ref))
    assert 0 < err < 1e-2


def test_the_gradient_of_a_broadcasting_batch_matmul_sums_over_no_axis():
    """The case that matters: ``tf.matmul`` of a sequence by a weight matrix broadcasts; its
    gradient for the sequence is a ``Sum`` over the axes ``BroadcastGradientArgs`` computes at
    run time (none).  Only static shapes show it; the default profile infers them for it."""
    def build():
        x = v1.placeholder(tf.float32, (4, 16, 32), name="x")
        w = tf.constant(RNG.standard_normal((32, 32)).astype(np.float32) * 0.2)
        h = tf.matmul(tf.matmul(x, w), w)
        (gx,) = tf.gradients(tf.reduce_sum(h), [x])
        tf.identity(gx, name="gx")

    gd = graph_def(build)
    sums = [n.name for n in gd.node if n.op == "Sum" and "gradients" in n.name]
    ours = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", use_env=False)
    identity = set(ours.report.get("identity", {}))
    # The gradients for x of both products are copies; the weights' (over the batch) are not.
    assert identity and identity < set(sums)
    for name in identity:
        assert ours.report["nodes"][name]["dtype"] == "float16", name
    for name in set(sums) - identity:
        assert ours.report["nodes"][name]["color"] == "deny", name


def test_identity_entries_are_validated_and_follow_the_lists(tmp_path):
    """Only reductions may be named; a later layer that lists the op, or an edit, turns the
    entry off; bfloat16 has them on a GPU only (backend cuda), and the ``tensorflow`` profile
    has none."""
    f16 = ListContext("float16", "cuda")
    assert set(load_lists("default", context=f16).identity) == {"Sum", "Mean", "Prod"}
    assert not load_lists("tensorflow", context=f16).identity
    assert not load_lists("default", context=ListContext("bfloat16", "onednn")).identity
    bf16_gpu = load_lists("default", context=ListContext("bfloat16", "cuda")).identity
    assert set(bf16_gpu) == {"Sum", "Mean", "Prod"} and "bfloat16" in bf16_gpu["Sum"]
    # A later layer's entry for another backend overrides the parent's for this one too.
    cpu_only = tmp_path / "cpu_only.toml"
    cpu_only.write_text('schema_version = 1\n[bfloat16.identity]\n'
                        'Sum = { reason = "on oneDNN only", backends = ["onednn"] }\n')
    assert set(load_lists("default", context=ListContext("bfloat16", "cuda"), user_file=cpu_only).identity) == {
        "Mean", "Prod"}
    assert set(load_lists("default", context=ListContext("bfloat16", "onednn"), user_file=cpu_only).identity) == {
        "Sum"}
    for text, match in (('Sum = { reason = "x", backends = ["tpu"] }', "backends"),
                        ('Sum = { reason = "x", backends = [] }', "backends"),
                        ('Sum = { reason = "x", min_cuda = 1 }', "min_cuda")):
        wrong = tmp_path / "wrong.toml"
        wrong.write_text(f"schema_version = 1\n[bfloat16.identity]\n{text}\n")
        with pytest.raises(ListError, match=match):
            load_lists("default", context=f16, user_file=wrong)
    bad = tmp_path / "bad.toml"
    bad.write_text('schema_version = 1\nextends = "default"\n[float16.identity]\nEuclideanNorm = "no"\n')
    with pytest.raises(ListError, match="EuclideanNorm"):
        load_lists("default", context=f16, user_file=bad)
    versioned = tmp_path / "versioned.toml"
    versioned.write_text('schema_version = 1\ntf_version = "2.21"\n[versions."2.16".float16.identity]\nSum = "x"\n')
    with pytest.raises(ListError, match="not versioned"):
        load_lists(versioned, context=f16)
    relisted = tmp_path / "relisted.toml"
    relisted.write_text('schema_version = 1\n[float16.deny]\nSum = "every Sum stays float32 here"\n')
    assert set(load_lists("default", context=f16, user_file=relisted).identity) == {"Mean", "Prod"}


@settings(max_examples=examples(30))
@given(dims=st.lists(st.sampled_from([1, 1, 2, 4]), min_size=1, max_size=4),
       axes_mask=st.lists(st.booleans(), min_size=4, max_size=4),
       op=st.sampled_from(["Sum", "Mean", "Prod"]), keepdims=st.booleans(),
       precision=st.sampled_from(["float16", "bfloat16"]))
def test_a_reduction_is_cleared_exactly_when_its_shapes_show_it_reduces_nothing(dims, axes_mask, op, keepdims,
                                                                               precision):
    """Property: between two MatMuls, a ``Sum``/``Mean``/``Prod`` over any axes of a tensor of
    any static shape is cleared (and runs in the low precision, on a GPU) exactly when every
    axis it reduces has one element; otherwise it stays denied.  TensorFlow's profile denies
    it always.  Either way the rewritten graph computes what the float32 one does."""
    axes = [i for i, keep in enumerate(axes_mask[:len(dims)]) if keep]
    reduce = {"Sum": tf.reduce_sum, "Mean": tf.reduce_mean, "Prod": tf.reduce_prod}[op]
    n = int(np.prod(dims))

    def build():
        x = v1.placeholder(tf.float32, (3, 8), name="x")
        w = tf.constant(np.linspace(-0.3, 0.3, 8 * n, dtype=np.float32).reshape(8, n))
        h = tf.reshape(tf.matmul(x, w, name="mm0"), (3, *dims))
        r = reduce(h, axis=[a + 1 for a in axes], keepdims=keepdims, name="red")  # never the batch axis
        w2 = tf.constant(np.linspace(-0.2, 0.2, 4, dtype=np.float32).reshape(1, 4))
        tf.identity(tf.matmul(tf.reshape(r, (-1, 1)), w2, name="mm1"), name="out")

    gd = graph_def(build)
    ours = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", precision=precision, use_env=False)
    tf_rules = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", precision=precision, lists="tensorflow",
                                             use_env=False)
    copies = all(dims[a] == 1 for a in axes)
    node = ours.report["nodes"]["red"]
    if copies:
        assert node["dtype"] == precision and "shape-proven" in node["reason"], node
        assert set(ours.report["identity"]) == {"red"}
    else:
        assert node["color"] == "deny" and node["dtype"] == "float32", node
        assert "identity" not in ours.report
    assert "identity" not in tf_rules.report
    assert ours.report["converted_nodes"] > 0  # the MatMuls convert either way
    x = np.linspace(-1.0, 1.0, 24, dtype=np.float32).reshape(3, 8)
    (ref,) = run(gd, {"x:0": x}, ["out:0"])
    (got,) = run(ours.graph_def, {"x:0": x}, ["out:0"])
    scale = max(float(np.max(np.abs(ref))), 1e-6)
    assert float(np.max(np.abs(got - ref))) / scale < (2e-2 if precision == "float16" else 8e-2)
