"""A float16 training step that nothing loss-scales gets one WARNING on every path that can
make one: ``amp_rewrite.function`` around a plain optimizer, a TF1 graph trained with a plain
optimizer, and the offline rewrite of a training ``.meta`` without ``--loss-scale``.  (Such a
step loses every gradient below 6e-8 to zero; TensorFlow's rewrite trained them silently.)
The same steps loss-scaled, in bfloat16, or without training get none."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf

import amp_rewrite

TEXT = "without loss scaling"


def _warned(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and TEXT in r.getMessage()]


def _keras_step(optimizer, scale_loss: bool | None = None, **options):
    """One step of a small Keras model in ``amp_rewrite.function``, with a GradientTape and
    ``optimizer.apply``; the loss goes through ``optimizer.scale_loss`` where ``scale_loss``
    says (default: where the optimizer is ours, loss-scaled)."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2)])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer.build(model.trainable_variables)
    scaled = hasattr(optimizer, "skipped_steps") if scale_loss is None else scale_loss

    @amp_rewrite.function(**options)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
            target = optimizer.scale_loss(loss) if scaled else loss
        optimizer.apply(tape.gradient(target, model.trainable_variables), model.trainable_variables)
        return loss

    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    step(tf.constant(x), tf.constant(np.zeros(8, np.int32)))
    return step


def test_a_function_around_a_plain_optimizer_is_warned_about(caplog):
    import keras

    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        step = _keras_step(keras.optimizers.SGD(0.1), target="gpu:8.0", precision="float16")
    assert step.rewrite_results[0].report["converted_nodes"] > 0
    assert len(_warned(caplog)) == 1 and "enable_mixed_precision_graph_rewrite" in _warned(caplog)[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        _keras_step(keras.optimizers.SGD(0.1), target="gpu:8.0", precision="bfloat16")
        _keras_step(amp_rewrite.enable_mixed_precision_graph_rewrite(
            keras.optimizers.SGD(0.1), target="gpu:8.0", precision="float16"))
        # Keras's own loss-scaled optimizer scales the loss too (its scale variable reaches the
        # traced step as a capture, named for nothing in the graph).
        _keras_step(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)), scale_loss=True,
                    target="gpu:8.0", precision="float16")
    assert not _warned(caplog)


def _tf1_graph(optimizer=None, **options):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 16], name="x")
        y = tf.compat.v1.placeholder(tf.int32, [None], name="y")
        w = tf.compat.v1.get_variable("w", [16, 4])
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=tf.matmul(x, w)))
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.5)
        if optimizer == "scaled":
            opt = amp_rewrite.enable_mixed_precision_graph_rewrite(opt, **options)
        opt.minimize(loss, name="train")
    return graph


def test_a_tf1_graph_trained_with_a_plain_optimizer_is_warned_about(caplog):
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        _, result = amp_rewrite.rewrite_graph_with_result(_tf1_graph(), target="gpu:8.0", precision="float16")
    assert result.report["converted_nodes"] > 0 and len(_warned(caplog)) == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        amp_rewrite.rewrite_graph_with_result(_tf1_graph("scaled", target="gpu:8.0", precision="float16"))
    assert not _warned(caplog)


def test_the_offline_rewrite_of_a_training_meta_without_loss_scaling_is_warned_about(tmp_path, caplog):
    from amp_rewrite.cli import main

    meta = tmp_path / "train.meta"
    graph = _tf1_graph()
    with graph.as_default():
        meta.write_bytes(tf.compat.v1.train.export_meta_graph(graph=graph).SerializeToString())
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        assert main(["rewrite", str(meta), str(tmp_path / "fp16.meta"), "--target", "gpu:8.0"]) == 0
    assert len(_warned(caplog)) == 1 and "--loss-scale" in _warned(caplog)[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        assert main(["rewrite", str(meta), str(tmp_path / "scaled.meta"), "--target", "gpu:8.0",
                     "--loss-scale", "dynamic"]) == 0
    assert not _warned(caplog)


def test_a_custom_loop_that_never_scales_its_loss_is_warned_about(caplog):
    """A loop written for a plain optimizer takes gradients of the bare loss and hands them to
    the loss-scaled optimizer, which divides them by the scale: every update 2**15 times too
    small, training stalls.  One WARNING names the fix; the loop that scales its loss, and
    Keras's ``fit`` (whose train_step scales it), get none."""
    import keras

    def scaled_optimizer():
        return amp_rewrite.enable_mixed_precision_graph_rewrite(
            keras.optimizers.SGD(0.1), target="gpu:8.0", precision="float16")

    text = "did not call its scale_loss"
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        _keras_step(scaled_optimizer(), scale_loss=False)
    assert len([r for r in caplog.records if text in r.getMessage()]) == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        _keras_step(scaled_optimizer(), scale_loss=True)
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(2)])
        model.compile(scaled_optimizer(), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(np.zeros((8, 16), np.float32), np.zeros(8, np.int32), verbose=0)
    assert not [r for r in caplog.records if text in r.getMessage()]
