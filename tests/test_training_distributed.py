"""Loss scaling under tf.distribute.MirroredStrategy over two logical CPU devices.

``tf.config.set_logical_device_configuration`` must run before TensorFlow initializes its
devices, which the other tests in this process have already done, so the training runs in a
subprocess that prints its measurements as JSON.

The data put a NaN in the part of one batch that only the *second* replica sees.  Both
replicas must skip that step (Keras 3's own LossScaleOptimizer looks only at the first
replica's gradients, applies the NaN after the all-reduce, and corrupts every replica), their
variables must stay identical and finite, and the result must equal the same training on one
device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("keras")

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import numpy as np
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
    import keras
    import amp_rewrite
    from amp_rewrite.plan.targets import Device, Target

    # Both logical CPUs, with float16 math assumed: the replicas' ops are pinned to CPU:0 and
    # CPU:1, and both must be rewritten.
    TARGET = Target("cpu", (Device("CPU", 0), Device("CPU", 1)), assume_features=True,
                    description="two logical CPUs")
    rng = np.random.default_rng(0)
    x = rng.random((64 * 5, 8, 8, 1)).astype("float32")
    y = rng.integers(0, 10, 64 * 5).astype("int32")
    x[64 * 2 + 40] = np.nan  # batch 2, row 40: the second replica's half of the batch

    def components(variable):
        value = variable.value if hasattr(variable, "value") else variable
        return [c.numpy() for c in getattr(value, "values", (value,))]

    def build(strategy):
        with strategy.scope():
            keras.utils.set_random_seed(1)
            model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, activation="relu"),
                                      keras.layers.Flatten(), keras.layers.Dense(10)])
            opt = amp_rewrite.enable_mixed_precision_graph_rewrite(
                keras.optimizers.SGD(0.05), target=TARGET, precision="float16")
        return model, opt

    def summary(model, opt, graphs):
        comps = [components(w) for w in model.weights]
        half = sorted({(op.type, op.device.split("/")[-1]) for g in graphs for op in g.get_operations()
                       if op.type in ("MatMul", "Conv2D") and op.get_attr("T") == tf.float16})
        return {
            "replicas_identical": all(np.array_equal(c[0], d) for c in comps for d in c),
            "n_components": len(comps[0]),
            "finite": all(bool(np.isfinite(d).all()) for c in comps for d in c),
            "skipped": int(opt.skipped_steps),
            "scale": float(opt.current_loss_scale),
            "iterations": int(opt.iterations.numpy()),
            "half_ops": half,
            "weights": [c[0].tolist() for c in comps],
        }

    def keras_fit(devices):
        model, opt = build(tf.distribute.MirroredStrategy(devices))
        model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)
        return summary(model, opt, model.train_function.amp_function.executed_graphs())

    def custom_loop(devices):
        strategy = tf.distribute.MirroredStrategy(devices)
        model, opt = build(strategy)
        with strategy.scope():
            # Mirrored variables cannot be created inside the traced step: build first.
            opt.build(model.trainable_variables)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="sum")
        dataset = strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices((x, y)).batch(64))

        def replica_step(xb, yb):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True)) / 64.0
                scaled = opt.scale_loss(loss)
            grads = tape.gradient(scaled, model.trainable_variables)
            opt.apply(grads, model.trainable_variables)
            return loss

        @amp_rewrite.function
        def step(batch):
            return strategy.run(replica_step, args=batch)

        for batch in dataset:
            step(batch)
        return summary(model, opt, step.executed_graphs())

    def v1_loop(devices):
        # A tf.compat.v1.train optimizer in a custom loop: the TF1 wrapper's merge_call path.
        strategy = tf.distribute.MirroredStrategy(devices)
        with strategy.scope():
            keras.utils.set_random_seed(1)
            model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, activation="relu"),
                                      keras.layers.Flatten(), keras.layers.Dense(10)])
            opt = amp_rewrite.enable_mixed_precision_graph_rewrite(
                tf.compat.v1.train.GradientDescentOptimizer(0.05),
                loss_scale=amp_rewrite.DynamicLossScale(2.0**8), target=TARGET, precision="float16")
            opt.current_loss_scale  # create the loss-scale variables, mirrored, before tracing
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
        dataset = strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices((x, y)).batch(64))

        def replica_step(xb, yb):
            opt.minimize(lambda: loss_fn(yb, model(xb, training=True)) / 64.0,
                         var_list=[v.value for v in model.trainable_variables])

        @amp_rewrite.function
        def step(batch):
            strategy.run(replica_step, args=batch)

        for batch in dataset:
            step(batch)
        comps = [components(w) for w in model.weights]
        return {
            "replicas_identical": all(np.array_equal(c[0], d) for c in comps for d in c),
            "n_components": len(comps[0]),
            "finite": all(bool(np.isfinite(d).all()) for c in comps for d in c),
            "skipped": int(opt.skipped_steps.numpy()),
            "scale": float(opt.current_loss_scale.numpy()),
            "weights": [c[0].tolist() for c in comps],
        }

    def float32_fit(ours):
        # Clean data, and with ours a target on which nothing converts: the step is traced
        # again without loss scaling, as the user's own float32 step under the strategy.
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        with strategy.scope():
            keras.utils.set_random_seed(1)
            model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, activation="relu"),
                                      keras.layers.Flatten(), keras.layers.Dense(10)])
            opt = keras.optimizers.SGD(0.05)
            if ours:
                opt = amp_rewrite.enable_mixed_precision_graph_rewrite(opt, target="gpu:6.1", precision="float16")
        model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(np.nan_to_num(x), y, batch_size=64, epochs=1, shuffle=False, verbose=0)
        comps = [components(w) for w in model.weights]
        out = {"weights": [c[0].tolist() for c in comps],
               "replicas_identical": all(np.array_equal(c[0], d) for c in comps for d in c),
               "iterations": int(opt.iterations.numpy())}
        if ours:
            graphs = model.train_function.amp_function.executed_graphs()
            out["scale"] = float(opt.current_loss_scale)
            out["is_finite_ops"] = sum(op.type == "IsFinite" for g in graphs for op in g.get_operations()) + sum(
                node.op == "IsFinite" for g in graphs for f in g.as_graph_def().library.function for node in f.node_def)
            out["converted"] = model.train_function.amp_function.rewrite_results[0].report["converted_nodes"]
        return out

    print(json.dumps({
        "f32ours": float32_fit(True), "f32plain": float32_fit(False),
        "fit2": keras_fit(["/cpu:0", "/cpu:1"]), "fit1": keras_fit(["/cpu:0"]),
        "loop2": custom_loop(["/cpu:0", "/cpu:1"]), "loop1": custom_loop(["/cpu:0"]),
        "v1loop2": v1_loop(["/cpu:0", "/cpu:1"]), "v1loop1": v1_loop(["/cpu:0"]),
    }))
    """
)


@pytest.fixture(scope="module")
def runs() -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env = {k: v for k, v in env.items() if not k.startswith("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_")}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=env, cwd=root, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("path", ["fit", "loop"])
def test_replicas_skip_together_and_match_one_device(runs: dict, path: str) -> None:
    import numpy as np

    two, one = runs[f"{path}2"], runs[f"{path}1"]
    assert two["n_components"] == 2 and one["n_components"] == 1
    # The NaN reached only replica 1, yet the step was skipped everywhere:
    assert two["skipped"] == one["skipped"] == 1
    assert two["scale"] == one["scale"] == 2.0**14
    assert two["iterations"] == one["iterations"] == 4
    assert two["finite"] and two["replicas_identical"]
    # Same training as on one device (float16 arithmetic, summed in another order).
    for a, b in zip(two["weights"], one["weights"]):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=0, atol=1e-3)
    # Both replicas ran their MatMul and convolution in float16.
    assert sorted(map(tuple, two["half_ops"])) == [
        ("Conv2D", "device:CPU:0"), ("Conv2D", "device:CPU:1"),
        ("MatMul", "device:CPU:0"), ("MatMul", "device:CPU:1"),
    ]


def test_tf1_optimizer_replicas_skip_together(runs: dict) -> None:
    import numpy as np

    two, one = runs["v1loop2"], runs["v1loop1"]
    assert two["n_components"] == 2
    assert two["skipped"] == one["skipped"] == 1
    assert two["scale"] == one["scale"] == 2.0**7
    assert two["finite"] and two["replicas_identical"]
    for a, b in zip(two["weights"], one["weights"]):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=0, atol=1e-3)


def test_a_step_that_converts_nothing_trains_as_plain_keras_across_replicas(runs: dict) -> None:
    """Nothing converts: the step, traced again without loss scaling, trains both replicas
    exactly as plain Keras does under the same strategy, with no overflow check."""
    import numpy as np

    ours, plain = runs["f32ours"], runs["f32plain"]
    assert ours["converted"] == 0 and ours["is_finite_ops"] == 0 and ours["scale"] == 2.0**15
    assert ours["iterations"] == plain["iterations"] == 5
    assert ours["replicas_identical"] and plain["replicas_identical"]
    for a, b in zip(ours["weights"], plain["weights"]):
        np.testing.assert_array_equal(np.array(a), np.array(b))
