"""A training step whose variable writes wait for everything they read
(``amp_rewrite/training/update_barrier.py``): the float32 step that ``measure_steps`` times may
run out of memory on a batch sized for mixed precision, and must then have updated nothing,
since the planned step runs that batch again."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from amp_rewrite.training.tf_function import _Runner
from amp_rewrite.training.update_barrier import BARRIER, WRITE_OPS, updates_after_inputs

#: Rewrite options that keep every op float32 (as the float32 candidate's do).
FLOAT32 = {"target": "gpu:8.0", "planner": "optimal", "declined": "the test's float32 step"}


def _late_failing_step(in_cond: bool = False):
    """Two layers; the last layer's update needs only its own gradient, and the first layer's
    gradient needs a buffer of ``huge`` elements (2**40: out of memory, after the last layer's
    gradient is ready).  ``in_cond``: the updates in a ``tf.cond`` branch (as Keras's gradient
    accumulation applies them), whose lowered ops run as their own inputs allow."""
    w1 = tf.Variable(tf.ones([8, 8]))
    w2 = tf.Variable(tf.ones([8, 1]))

    @tf.function
    def step(x, huge):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(tf.matmul(x, w1), w2))
        g1, g2 = tape.gradient(loss, [w1, w2])
        if not in_cond:
            w2.assign_sub(0.01 * g2)  # before the failing allocation, in program order too
        g1 = g1 + tf.reduce_sum(tf.zeros(tf.reshape(huge, [1])))

        def update(g1):
            if in_cond:
                w2.assign_sub(0.01 * g2)
            w1.assign_sub(0.01 * g1)
            return tf.constant(0)

        if in_cond:
            tf.cond(huge > 0, lambda: update(g1), lambda: tf.constant(1))
        else:
            update(g1)
        return loss

    concrete = step.get_concrete_function(tf.TensorSpec([4, 8], tf.float32), tf.TensorSpec([], tf.int64))
    return concrete, w1, w2


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("in_cond", [False, True])
def test_a_step_that_fails_in_its_backward_pass_has_updated_nothing_when_gated(gated, in_cond):
    """Ungated, the last layer is updated before the first layer's gradient fails (what the
    gate is for); gated, neither is, and a step that does not fail updates both once.  The
    same where the updates are in a ``tf.cond`` branch."""
    concrete, w1, w2 = _late_failing_step(in_cond)
    runner = _Runner(concrete, FLOAT32, gate_updates=gated)
    x = tf.ones([4, 8])
    before = (w1.numpy().copy(), w2.numpy().copy())
    with pytest.raises(tf.errors.ResourceExhaustedError):
        runner([x, tf.constant(1 << 40, tf.int64)])
    assert np.array_equal(w1.numpy(), before[0])
    assert np.array_equal(w2.numpy(), before[1]) == gated
    if gated:
        runner([x, tf.constant(1, tf.int64)])
        g2 = (x.numpy() @ before[0]).sum(axis=0).reshape(8, 1)
        np.testing.assert_allclose(w2.numpy(), before[1] - 0.01 * g2, rtol=1e-6)
        assert not np.array_equal(w1.numpy(), before[0])


def test_every_write_of_a_keras_step_waits_for_the_barrier_and_nothing_it_waits_for_follows_a_write():
    """On a Keras training step (Adam: writes that read other writes' results): every write
    waits for the barrier, the barrier waits for the gradients, and for no node that follows a
    write (which would be a cycle); the step still runs."""
    import keras

    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    y = np.zeros(8, np.int32)
    model.optimizer.build(model.trainable_variables)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = model.compute_loss(x=x, y=y, y_pred=model(x, training=True))
        model.optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    concrete = step.get_concrete_function(tf.TensorSpec([8, 16]), tf.TensorSpec([8], tf.int32))
    gated, count = updates_after_inputs(concrete.graph.as_graph_def())
    nodes = {n.name: n for n in gated.node}
    writes = [n for n in gated.node if WRITE_OPS.match(n.op)]
    assert count == len(writes) > 4 and all(f"^{BARRIER}" in n.input for n in writes)
    waits_for = {i[1:] for i in nodes[BARRIER].input}
    ancestors, stack = set(), list(waits_for)
    while stack:
        name = stack.pop()
        if name not in ancestors:
            ancestors.add(name)
            stack.extend(i.lstrip("^").split(":")[0] for i in nodes[name].input)
    gradients = {n.name for n in gated.node if n.op == "MatMul" and "gradient_tape" in n.name}
    assert gradients and gradients <= ancestors  # the whole backward pass
    # Nothing the barrier waits for is reached from a write (no cycle).
    from amp_rewrite.training.update_barrier import _downstream
    assert not ancestors & _downstream(gated, {n.name for n in writes})
    assert updates_after_inputs(gated)[1] == 0  # gated once
    runner = _Runner(concrete, FLOAT32, gate_updates=True)
    before = [v.numpy().copy() for v in model.trainable_variables]
    loss = runner([tf.constant(x), tf.constant(y)])
    assert np.isfinite(float(loss[0] if isinstance(loss, (list, tuple)) else loss))
    assert all(not np.array_equal(b, v.numpy()) for b, v in zip(before, model.trainable_variables))
