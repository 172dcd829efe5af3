"""TF1 training whose gradients the optimizer did not compute (tensorflow/tensorflow#35379).

``grads = tf.gradients(loss, vars)`` then ``opt.apply_gradients(zip(grads, vars))`` with
``opt = amp_rewrite.enable_mixed_precision_graph_rewrite(..., target=, precision=)``: the graph
must be rewritten with the options given to ``enable_...`` (they were recorded only by
``compute_gradients``), the update must equal float32's (never divided by the loss scale), and
the optimizer must say, with one WARNING, that such gradients are not loss-scaled.
``get_scaled_loss``/``get_unscaled_gradients`` scale such a step, and gradients of the scaled
loss that were never unscaled are refused with an ``AmpRewriteError``.

This machine has no GPU: ``gpu:8.0``/``float16`` rewrites run on TensorFlow's float16 CPU
kernels.  Graphs are tiny: one MatMul and a softmax cross entropy.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import amp_rewrite  # noqa: E402
from amp_rewrite.errors import AmpRewriteError  # noqa: E402
from amp_rewrite.training import optimizer as optimizer_module  # noqa: E402

FP16 = {"target": "gpu:8.0", "precision": "float16"}
LR = 0.5
WARNING_TEXT = "applies gradients of a loss it did not scale"


def _data() -> tuple[np.ndarray, np.ndarray]:
    xs = np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)
    return xs, (xs[:, 0] > 0).astype(np.int32)


def _warnings(caplog: Any, text: str = WARNING_TEXT) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.name.startswith("amp_rewrite") and text in r.getMessage()]


def _build(make_train: Callable[[Any, Any, Any], Any] | None, loss_factor: float = 1.0,
           **options: Any) -> dict[str, Any]:
    """A graph with ``logits = x @ w`` and its mean cross entropy (times ``loss_factor``, with
    the learning rate divided by it, so the float32 update is the same whatever the factor).

    ``make_train(opt, loss, w)`` builds the train op with a loss-scaled optimizer made with
    ``options``; ``None`` builds a plain float32 ``GradientDescentOptimizer.minimize``.
    """
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [32, 16], name="x")
        y = tf.compat.v1.placeholder(tf.int32, [32], name="y")
        w = tf.compat.v1.get_variable("w", [16, 4],
                                      initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
        logits = tf.matmul(x, w, name="logits")
        loss = loss_factor * tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        opt = None
        if make_train is None:
            train = tf.compat.v1.train.GradientDescentOptimizer(LR / loss_factor).minimize(loss)
        else:
            opt = amp_rewrite.enable_mixed_precision_graph_rewrite(
                tf.compat.v1.train.GradientDescentOptimizer(LR / loss_factor), **options)
            train = make_train(opt, loss, w)
    return dict(graph=graph, x=x, y=y, w=w, train=train, opt=opt)


def _tf_gradients(opt: Any, loss: Any, w: Any) -> Any:
    grads = tf.gradients(loss, [w])
    return opt.apply_gradients(zip(grads, [w]))


def _helpers(opt: Any, loss: Any, w: Any) -> Any:
    grads = tf.gradients(opt.get_scaled_loss(loss), [w])
    return opt.apply_gradients(zip(opt.get_unscaled_gradients(grads), [w]))


def _step(m: dict[str, Any], session: Any) -> np.ndarray:
    """How much one training step changes ``w`` (runs the initializer first)."""
    xs, ys = _data()
    with m["graph"].as_default():
        session.run(tf.compat.v1.global_variables_initializer())
        before = session.run(m["w"])
        session.run(m["train"], {m["x"]: xs, m["y"]: ys})
        return session.run(m["w"]) - before


def _float32_step(loss_factor: float = 1.0) -> np.ndarray:
    m = _build(None, loss_factor)
    with tf.compat.v1.Session(graph=m["graph"]) as session:
        return _step(m, session)


def test_tf_gradients_path_rewrites_with_the_optimizer_options() -> None:
    m = _build(_tf_gradients, **FP16)
    with amp_rewrite.Session(graph=m["graph"]) as session:
        _step(m, session)
        report = session.rewrite_result.report
        logits = session.rewritten_graph.get_operation_by_name("logits")
    assert report["precision"] == "float16"
    assert "gpu" in str(report["target"]) and "8.0" in str(report["target"])
    assert logits.get_attr("T") == tf.float16
    # rewrite_graph reads the same registration.
    assert amp_rewrite.rewrite_graph(m["graph"]).get_operation_by_name("logits").get_attr("T") == tf.float16


def test_tf_gradients_step_equals_float32_and_is_not_divided_by_the_scale() -> None:
    m = _build(_tf_gradients, **FP16)
    with amp_rewrite.Session(graph=m["graph"]) as session:
        delta = _step(m, session)
        assert session.run(m["opt"].current_loss_scale) == 2.0 ** 15  # dynamic, as configured
    expected = _float32_step()
    assert np.abs(expected).max() > 1e-3
    np.testing.assert_allclose(delta, expected, rtol=2e-2, atol=2e-3 * np.abs(expected).max())


def test_tf_gradients_path_warns_once_naming_what_to_call(caplog: Any) -> None:
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        m = _build(_tf_gradients, **FP16)
        with m["graph"].as_default():
            _tf_gradients(m["opt"], tf.reduce_sum(m["w"]), m["w"])  # a second one: no second warning
    warnings = _warnings(caplog)
    assert len(warnings) == 1
    assert "GradientDescent" in warnings[0]
    assert "opt.compute_gradients(loss)" in warnings[0] and "get_scaled_loss" in warnings[0]
    assert "get_unscaled_gradients" in warnings[0]


def test_helpers_scale_the_loss_and_the_step_equals_float32(caplog: Any) -> None:
    # A loss small enough that its float16 gradients flush to zero unless the loss is scaled.
    factor = 1e-6
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        m = _build(_helpers, factor, **FP16)
        with amp_rewrite.Session(graph=m["graph"]) as session:
            delta = _step(m, session)
            assert session.rewritten_graph.get_operation_by_name("logits").get_attr("T") == tf.float16
            assert session.run(m["opt"].skipped_steps) == 0
    assert not _warnings(caplog)
    expected = _float32_step(factor)
    np.testing.assert_allclose(delta, expected, rtol=2e-2, atol=2e-3 * np.abs(expected).max())
    # Without the helpers those gradients are lost: the float16 step barely moves w.
    plain = _build(_tf_gradients, factor, **FP16)
    with amp_rewrite.Session(graph=plain["graph"]) as session:
        unscaled_delta = _step(plain, session)
    assert np.abs(unscaled_delta - expected).max() > 0.5 * np.abs(expected).max()


def test_helpers_return_the_loss_and_gradients_as_they_are_where_nothing_is_scaled() -> None:
    # loss_scale="auto" in bfloat16 does not scale (bfloat16 has float32's range).
    graph = tf.Graph()
    with graph.as_default():
        w = tf.Variable(tf.ones([4, 4]))
        loss = tf.reduce_sum(tf.matmul(w, w))
        opt = amp_rewrite.enable_mixed_precision_graph_rewrite(
            tf.compat.v1.train.GradientDescentOptimizer(0.1), target="cpu", precision="bfloat16")
        assert opt.get_scaled_loss(loss) is loss
        grads = tf.gradients(loss, [w])
        assert opt.get_unscaled_gradients(grads) == grads


@pytest.mark.parametrize("how", ["minimize", "clipped", "helpers", "by_hand", "callable"])
def test_gradients_the_optimizer_scaled_do_not_warn(caplog: Any, how: str) -> None:
    def clipped(opt: Any, loss: Any, w: Any) -> Any:
        grads, variables = zip(*opt.compute_gradients(loss, [w]))
        grads, _ = tf.clip_by_global_norm(list(grads), 1.0)
        return opt.apply_gradients(zip(grads, variables))

    def by_hand(opt: Any, loss: Any, w: Any) -> Any:
        scale = opt.current_loss_scale
        grads = tf.gradients(loss * scale, [w])
        return opt.apply_gradients([(g / scale, w) for g in grads])

    def callable_loss(opt: Any, loss: Any, w: Any) -> Any:
        scaled = opt.get_scaled_loss(lambda: loss)
        return opt.apply_gradients(zip(opt.get_unscaled_gradients(tf.gradients(scaled(), [w])), [w]))

    make = {"minimize": lambda opt, loss, w: opt.minimize(loss), "clipped": clipped,
            "helpers": _helpers, "by_hand": by_hand, "callable": callable_loss}[how]
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        m = _build(make, **FP16)
        with amp_rewrite.Session(graph=m["graph"]) as session:
            delta = _step(m, session)
    assert not _warnings(caplog)
    expected = _float32_step()
    if how != "clipped":
        np.testing.assert_allclose(delta, expected, rtol=2e-2, atol=2e-3 * np.abs(expected).max())


def test_gradients_of_the_scaled_loss_never_unscaled_are_refused() -> None:
    def forgot(opt: Any, loss: Any, w: Any) -> Any:
        return opt.apply_gradients(zip(tf.gradients(opt.get_scaled_loss(loss), [w]), [w]))

    with pytest.raises(optimizer_module.ScaledGradientsError, match="get_unscaled_gradients") as raised:
        _build(forgot, **FP16)
    assert isinstance(raised.value, AmpRewriteError)


def test_amp_rewrite_function_with_a_tape_uses_the_helpers(caplog: Any) -> None:
    # The same helpers in a TF2 loop: the scale variable is eager and captured by the function.
    xs, ys = _data()
    # The float32 step's own initial weights: an eager initializer with an op seed draws
    # from a stream that earlier tests move, so its values depend on the order tests run in.
    reference = _build(None)
    with tf.compat.v1.Session(graph=reference["graph"]) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        w0 = session.run(reference["w"])

    def train(scaled: bool) -> np.ndarray:
        w = tf.Variable(w0)
        opt = amp_rewrite.enable_mixed_precision_graph_rewrite(
            tf.compat.v1.train.GradientDescentOptimizer(LR), **FP16)

        @amp_rewrite.function
        def step(x: Any, y: Any) -> None:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=y, logits=tf.matmul(x, w)))
                if scaled:
                    loss = opt.get_scaled_loss(loss)
            grads = tape.gradient(loss, [w])
            if scaled:
                grads = opt.get_unscaled_gradients(grads)
            opt.apply_gradients(zip(grads, [w]))

        step(tf.constant(xs), tf.constant(ys))
        return w.numpy() - w0

    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        delta = train(scaled=True)
    assert not _warnings(caplog)
    np.testing.assert_allclose(delta, _float32_step(), rtol=2e-2,
                               atol=2e-3 * np.abs(_float32_step()).max())
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        train(scaled=False)
    assert len(_warnings(caplog)) == 1


@pytest.mark.parametrize("how", ["helpers", "gate_none"])
def test_the_unscale_stays_float32_with_a_scale_beyond_float16(how: str) -> None:
    # Rewritten to float16 with the gradient that feeds it, the division cast a scale of 2**17
    # to inf: every gradient became 0, the finite check passed, and w never moved.
    make = {"helpers": _helpers,
            "gate_none": lambda opt, loss, w: opt.minimize(loss, gate_gradients=0)}[how]
    m = _build(make, loss_scale=2.0 ** 17, **FP16)
    with amp_rewrite.Session(graph=m["graph"]) as session:
        delta = _step(m, session)
        for op in session.rewritten_graph.get_operations():
            if op.type == "RealDiv" and not op.name.startswith("gradients/"):
                assert op.get_attr("T") == tf.float32, op.name
    expected = _float32_step()
    np.testing.assert_allclose(delta, expected, rtol=2e-2, atol=2e-3 * np.abs(expected).max())
