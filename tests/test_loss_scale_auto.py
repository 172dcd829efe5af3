"""The default loss scale, ``"auto"``: dynamic where the rewrite runs float16, none in bfloat16.

bfloat16 has float32's exponent range, so its gradients do not flush to zero and scaling them
only costs time (a scan of every gradient for overflow, a conditional around the update).
These tests train real steps on this CPU and read the graphs that ran: the rewrite must have
converted something, and the loss-scaling ops must be absent (bfloat16) or present (float16,
or bfloat16 with ``loss_scale="dynamic"`` asked for).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

import amp_rewrite
from amp_rewrite.errors import AmpRewriteError
from amp_rewrite.training import _common
from amp_rewrite.training import loss_scale as ls

BF16 = {"target": "cpu", "precision": "bfloat16"}
FP16 = {"target": "gpu:8.0", "precision": "float16"}
#: Ops only loss scaling adds to a step: the overflow scan and the skip conditional.
SCALING_OPS = {"IsFinite", "If", "StatelessIf", "Switch"}


def test_auto_is_dynamic_in_float16_and_off_in_bfloat16() -> None:
    auto = ls.get("auto")
    assert isinstance(auto, ls.AutoLossScale) and auto.dynamic and auto.initial_scale == 2.0**15
    assert auto != ls.DynamicLossScale()  # a class of its own: configs keep which was asked
    assert ls.applies(auto, "float16") and not ls.applies(auto, "bfloat16")
    # Asked for explicitly, a scale applies in either precision.
    for explicit in (ls.DynamicLossScale(), ls.FixedLossScale(8.0)):
        assert ls.applies(explicit, "bfloat16") and ls.applies(explicit, "float16")


def test_precision_per_machine_only_when_target_and_precision_are_auto() -> None:
    assert _common._precision_per_machine({"target": "auto"})
    assert _common._precision_per_machine({"target": " AUTO ", "precision": "auto"})
    assert not _common._precision_per_machine({"target": "cpu"})
    assert not _common._precision_per_machine({"target": "auto", "precision": "bfloat16"})


def test_the_offline_training_rewrite_refuses_auto() -> None:
    from amp_rewrite.training.offline import _loss_scale_config

    with pytest.raises(AmpRewriteError, match="not 'auto'"):
        _loss_scale_config("auto")
    assert _loss_scale_config("dynamic") == ls.DynamicLossScale()


def _step_ops(function: Any) -> set[str]:
    """Every op type of the graphs an amp_rewrite Function ran, library functions included."""
    ops = set()
    for graph in function.executed_graphs():
        graph_def = graph.as_graph_def()
        ops |= {n.op for n in graph_def.node}
        ops |= {n.op for f in graph_def.library.function for n in f.node_def}
    return ops


def _fit(loss_scale: Any, options: dict[str, Any]) -> tuple[Any, Any, list[float]]:
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(4)])
    opt = amp_rewrite.enable_mixed_precision_graph_rewrite(keras.optimizers.Adam(0.01), loss_scale=loss_scale,
                                                           **options)
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    x = np.random.default_rng(0).standard_normal((256, 16)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    history = model.fit(x, y, batch_size=64, epochs=3, verbose=0)
    return model, opt, history.history["loss"]


def test_keras_bfloat16_step_runs_without_loss_scaling(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="amp_rewrite"):
        model, opt, losses = _fit("auto", BF16)
    step = model.train_function.amp_function
    report = step.rewrite_results[0].report
    assert report["precision"] == "bfloat16" and report["converted_nodes"] > 0
    assert not (_step_ops(step) & SCALING_OPS)
    assert not opt.scales_loss and float(opt.current_loss_scale) == 1.0 and int(opt.skipped_steps) == 0
    assert losses[-1] < losses[0]
    assert any("no loss scaling: bfloat16 has the range of float32" in r.getMessage() for r in caplog.records)
    # The same model with the scale asked for: the same losses (a power of two scales exactly),
    # the scan and the conditional back in the step.
    scaled_model, scaled_opt, scaled_losses = _fit("dynamic", BF16)
    scaled_step = scaled_model.train_function.amp_function
    assert scaled_step.rewrite_results[0].report["converted_nodes"] > 0
    assert {"IsFinite"} <= _step_ops(scaled_step) and scaled_opt.scales_loss
    assert float(scaled_opt.current_loss_scale) == 2.0**15
    np.testing.assert_allclose(losses, scaled_losses, rtol=1e-6)


def test_keras_float16_step_keeps_dynamic_loss_scaling_by_default() -> None:
    model, opt, losses = _fit("auto", FP16)
    step = model.train_function.amp_function
    assert step.rewrite_results[0].report["converted_nodes"] > 0
    assert {"IsFinite"} <= _step_ops(step)
    assert opt.scales_loss and float(opt.current_loss_scale) == 2.0**15 and losses[-1] < losses[0]


def test_keras_auto_loss_scale_survives_get_config() -> None:
    import keras

    from amp_rewrite.training.keras_optimizer import LossScaleOptimizer

    opt = amp_rewrite.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1), **BF16)
    clone = LossScaleOptimizer.from_config(opt.get_config())
    assert isinstance(clone.loss_scale, ls.AutoLossScale) and not clone.scales_loss


def test_tf1_bfloat16_graph_has_no_loss_scaling_but_keeps_its_variables() -> None:
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 16], name="x")
        w = tf.compat.v1.get_variable("w", [16, 4])
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w)))
        opt = amp_rewrite.enable_mixed_precision_graph_rewrite(
            tf.compat.v1.train.GradientDescentOptimizer(0.1), **BF16)
        train = opt.minimize(loss)
        ops = {op.type for op in graph.get_operations()}
        # No scan, no conditional, but the scale's variables, so a checkpoint has the same
        # variables whichever precision the machine chose.
        assert not (ops & SCALING_OPS)
        names = {v.op.name for v in tf.compat.v1.global_variables()}
        assert "amp_loss_scale/current_loss_scale" in names
        init = tf.compat.v1.global_variables_initializer()
    with amp_rewrite.Session(graph=graph) as sess:
        sess.run(init)
        feed = {x: np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)}
        before = sess.run(loss, feed)
        for _ in range(5):
            sess.run(train, feed)
        assert sess.run(loss, feed) < before
        assert float(sess.run(opt.current_loss_scale)) == 1.0
        report = sess.rewrite_result.report
    assert report["precision"] == "bfloat16" and report["converted_nodes"] > 0


def test_a_multi_worker_step_keeps_scaling_where_each_machine_picks_its_precision(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers on different machines could resolve ``target="auto"`` to different precisions,
    and all must run the same collectives (the overflow flags are reduced across them): under a
    multi-worker strategy the loss stays scaled unless the precision is fixed by the options."""
    import keras

    monkeypatch.setattr(_common, "_multi_worker_strategy", lambda: True)
    per_machine = amp_rewrite.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1))
    assert _common.rewrite_precision(per_machine.rewrite_options) == "bfloat16"  # any CPU without a GPU
    assert per_machine.scales_loss
    fixed = amp_rewrite.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1), **BF16)
    assert not fixed.scales_loss
    monkeypatch.setattr(_common, "_multi_worker_strategy", lambda: False)
    assert not per_machine.scales_loss
