"""A logarithm and what computes its input stay float32 in the default profile's float16
(``[float16.float32_inputs]``): a hand-written binary cross-entropy, ``y log(sigmoid(z)) + (1 -
y) log(1 - sigmoid(z))``, after a float16 MatMul.  In float16 a sigmoid of -17.6 (2.3e-8) is 0 and
its log ``-inf``; TensorFlow's lists (infer for Sigmoid and Log) give an infinite loss."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import amp_rewrite


def _bce_graph() -> tf.compat.v1.GraphDef:
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 8], name="x")
        y = tf.compat.v1.placeholder(tf.float32, [4, 1], name="y")
        z = tf.matmul(x, tf.ones([8, 1]), name="logit")
        p = tf.sigmoid(z, name="p")
        ll = tf.add(y * tf.math.log(p, name="log_p"), (1 - y) * tf.math.log(1 - p, name="log_1mp"), name="ll")
        tf.identity(-tf.reduce_mean(ll), name="loss")
    return graph.as_graph_def()


def _loss(graph_def, logit: float) -> float:
    xs = np.full((4, 8), logit / 8, np.float32)
    with tf.Graph().as_default():
        tf.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session() as session:
            return float(session.run("loss:0", {"x:0": xs, "y:0": np.ones((4, 1), np.float32)}))


@pytest.mark.parametrize("logit", [-17.6, -9.0])
def test_a_hand_written_binary_cross_entropy_stays_finite_in_the_default_profile(logit):
    graph = _bce_graph()
    want = _loss(graph, logit)
    default = amp_rewrite.rewrite_graph_def(graph, target="gpu:8.0", precision="float16", fetches=["loss"],
                                            use_env=False)
    nodes = default.report["nodes"]
    assert nodes["logit"]["dtype"] == "float16"  # the MatMul still converts
    for name in ("p", "log_p", "sub", "log_1mp"):
        assert nodes[name]["dtype"] == "float32", (name, nodes[name])
    assert "float32_inputs" in nodes["log_p"]["reason"] or "whose inputs stay float32" in nodes["p"]["reason"]
    assert np.isfinite(_loss(default.graph_def, logit))
    assert _loss(default.graph_def, logit) == pytest.approx(want, rel=2e-2)
    # TensorFlow's lists, for parity, infer both: the float16 sigmoid underflows to 0.
    tensorflow = amp_rewrite.rewrite_graph_def(graph, target="gpu:8.0", precision="float16", lists="tensorflow",
                                               fetches=["loss"], use_env=False)
    assert tensorflow.report["nodes"]["log_p"]["dtype"] == "float16"
    if logit < -17:
        assert not np.isfinite(_loss(tensorflow.graph_def, logit))


def test_float32_inputs_apply_only_to_an_op_left_on_the_deny_list(tmp_path):
    """A user file that moves ``Log`` back to infer takes its float32_inputs entry with it: the
    sigmoid converts again (the user asked for it)."""
    lists = tmp_path / "mine.toml"
    lists.write_text('schema_version = 1\nextends = "default"\n\n[float16.infer]\nLog = "mine"\n')
    result = amp_rewrite.rewrite_graph_def(_bce_graph(), target="gpu:8.0", precision="float16", lists=str(lists),
                                           fetches=["loss"], use_env=False)
    assert result.report["nodes"]["p"]["dtype"] == "float16"
    assert result.report["nodes"]["log_p"]["dtype"] == "float16"
