"""The ops that apply the loss scale stay float32 in a rewritten training step
(``amp_rewrite.training.loss_scale.SCOPE``).  Converted with the float16 gradient it divides,
the unscale cast the scale to float16, where 2**16 and more is ``inf``: every gradient divided
to 0, the finite check passed and no weight moved again (from the 2000th step of the default
dynamic scale)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import amp_rewrite
from amp_rewrite.training.loss_scale import SCOPE

#: Past float16's largest value (65504): ``inf`` in float16.
BIG_SCALE = 2.0 ** 17


def _data() -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int32)


def _model():
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2)])


def _scale_nodes(report: dict) -> dict[str, str]:
    nodes = dict(report["nodes"])
    for function in report["functions"].values():
        nodes.update(function["nodes"])
    return {name: node["dtype"] for name, node in nodes.items() if SCOPE in name and node["dtype"] != "resource"}


@pytest.mark.parametrize("jit_compile", [False, True])
def test_keras_fit_with_a_scale_past_float16_trains_every_weight(jit_compile):
    """Keras ``fit``, float16 for a GPU, a fixed loss scale of 2**17: every weight moves, the
    mixed step did convert (the MatMuls), and every op applying the scale is float32."""
    import keras

    model = _model()
    opt = amp_rewrite.enable_mixed_precision_graph_rewrite(
        keras.optimizers.SGD(0.1), target="gpu:8.0", precision="float16", loss_scale=BIG_SCALE)
    model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=jit_compile)
    before = [v.numpy().copy() for v in model.trainable_variables]
    x, y = _data()
    model.fit(x, y, batch_size=64, epochs=2, verbose=0)
    assert all(np.abs(b - v.numpy()).max() > 0 for b, v in zip(before, model.trainable_variables))
    report = model.train_function.amp_function.rewrite_results[0].report
    assert report["converted_nodes"] > 0 and int(opt.skipped_steps.numpy()) == 0
    scale_ops = _scale_nodes(report)
    assert any("truediv" in name for name in scale_ops) and set(scale_ops.values()) == {"float32"}, scale_ops


def test_a_custom_step_with_a_scale_past_float16_trains_every_weight():
    """``amp_rewrite.function`` around a ``GradientTape`` step with the loss-scaled Keras
    optimizer's ``scale_loss``: the same."""
    import keras

    model = _model()
    opt = amp_rewrite.enable_mixed_precision_graph_rewrite(
        keras.optimizers.SGD(0.1), target="gpu:8.0", precision="float16", loss_scale=BIG_SCALE)
    opt.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @amp_rewrite.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
            scaled = opt.scale_loss(loss)
        opt.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)
        return loss

    before = [v.numpy().copy() for v in model.trainable_variables]
    x, y = _data()
    for _ in range(2):
        step(tf.constant(x), tf.constant(y))
    assert all(np.abs(b - v.numpy()).max() > 0 for b, v in zip(before, model.trainable_variables))
    report = step.rewrite_results[0].report
    assert report["converted_nodes"] > 0
    assert set(_scale_nodes(report).values()) == {"float32"}


def test_every_rewrite_keeps_the_loss_scale_ops_float32():
    """Not only the training paths: a TF1 training graph built with the loss-scaled optimizer
    (``get_scaled_loss``/``get_unscaled_gradients`` around ``tf.gradients``), exported and
    rewritten as a GraphDef (what ``amp-rewrite rewrite train.meta`` does) keeps them too."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 16], name="x")
        w = tf.compat.v1.get_variable("w", [16, 4])
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w)))
        opt = amp_rewrite.enable_mixed_precision_graph_rewrite(
            tf.compat.v1.train.GradientDescentOptimizer(0.1), target="gpu:8.0", precision="float16",
            loss_scale=BIG_SCALE)
        grads = opt.get_unscaled_gradients(tf.gradients(opt.get_scaled_loss(loss), [w]))
        opt.apply_gradients(zip(grads, [w]), name="train")
    result = amp_rewrite.rewrite_graph_def(graph.as_graph_def(), target="gpu:8.0", precision="float16",
                                           fetches=["train"], use_env=False)
    assert result.report["nodes"]["MatMul"]["dtype"] == "float16"
    scale_ops = _scale_nodes(result.report)
    assert any("truediv" in name for name in scale_ops) and set(scale_ops.values()) == {"float32"}, scale_ops
