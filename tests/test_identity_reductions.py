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

import amp_rewrite
from amp_rewrite.errors import ListError
from amp_rewrite.plan.lists import ListContext, load_lists
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
