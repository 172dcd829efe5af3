"""Training with the rewrite: the three paths, loss scaling, no global leak, offline graphs.

A small CNN on scikit-learn's bundled digits (8x8 images, no download) is trained for a fixed
number of steps in float32 and with each path; each mixed-precision run must come within one
accuracy point of its float32 run, and the graph that executed must have run MatMul and the
convolutions in float16.

This machine has no GPU and its CPU has no fast float16, so ``target="auto"`` would leave the
graphs unchanged; the tests rewrite for ``gpu:8.0`` (TensorFlow has CPU float16 kernels for
every op these graphs use, gradients included, so the rewritten graphs run here).
"""

from __future__ import annotations

import functools
from typing import Any, Iterator

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
sklearn_datasets = pytest.importorskip("sklearn.datasets")

import amp_rewrite  # noqa: E402
from amp_rewrite.training.loss_scale import DynamicLossScale  # noqa: E402

TARGET = {"target": "gpu:8.0", "precision": "float16"}
BATCH = 64
STEPS = 176  # 8 passes over the 1400 training images
LOW_PRECISION_OPS = ("MatMul", "Conv2D", "Conv2DBackpropFilter")


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    data = sklearn_datasets.load_digits()
    x = (data.images / 16.0).astype(np.float32)[..., None]
    y = data.target.astype(np.int32)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    return x[:1400], y[:1400], x[1400:], y[1400:]


def _batches(x: np.ndarray, y: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for step in range(STEPS):
        i = (step * BATCH) % (len(x) - BATCH)
        yield x[i:i + BATCH], y[i:i + BATCH]


def _keras_cnn() -> Any:
    keras.utils.set_random_seed(1)  # same initial weights in every run
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(10),
    ])


def _accuracy(model: Any, x: np.ndarray, y: np.ndarray) -> float:
    return float((model.predict(x, verbose=0, batch_size=512).argmax(-1) == y).mean())


def _dtypes_of(ops: Any) -> dict[str, set[str]]:
    """Op type -> dtypes (``T``) of the MatMul/convolution ops among ``ops``."""
    found: dict[str, set[str]] = {}
    for op_type, dtype in ops:
        if op_type in LOW_PRECISION_OPS:
            found.setdefault(op_type, set()).add(dtype)
    return found


def _graph_dtypes(graphs: list[Any]) -> dict[str, set[str]]:
    return _dtypes_of((op.type, op.get_attr("T").name) for g in graphs for op in g.get_operations()
                      if op.type in LOW_PRECISION_OPS)


def _assert_ran_in_float16(found: dict[str, set[str]]) -> None:
    assert set(found) == set(LOW_PRECISION_OPS), found
    assert all(dtypes == {"float16"} for dtypes in found.values()), found


# -- Keras fit --------------------------------------------------------------------------------

def test_keras_fit_matches_float32_and_runs_float16(digits: Any) -> None:
    xtr, ytr, xte, yte = digits
    results = {}
    for amp in (False, True):
        model = _keras_cnn()
        opt = keras.optimizers.Adam(0.01)
        if amp:
            opt = amp_rewrite.enable_mixed_precision_graph_rewrite(opt, **TARGET)
        model.compile(optimizer=opt,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        # A schedule callback sets the learning rate through the wrapper every epoch.
        schedule = keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.01 if epoch < 6 else 0.005)
        model.fit(xtr, ytr, batch_size=BATCH, epochs=8, shuffle=False, verbose=0,
                  callbacks=[schedule])
        results[amp] = _accuracy(model, xte, yte)
        if amp:
            assert float(opt.learning_rate) == pytest.approx(0.005)
            assert int(opt.iterations.numpy()) == 8 * 22  # no step was skipped
            assert int(opt.skipped_steps) == 0
            step = model.train_function.amp_function
            _assert_ran_in_float16(_graph_dtypes(step.executed_graphs()))
            report = step.rewrite_results[0].report
            assert report["converted_nodes"] > 0 and report["skipped"] is None
    print(f"digits accuracy, Keras fit: float32 {results[False]:.4f}, mixed {results[True]:.4f}")
    assert results[False] > 0.9
    assert abs(results[True] - results[False]) <= 0.01


@pytest.mark.parametrize("layer", ["LSTM", "GRU"])
def test_keras_rnn_fit_in_bfloat16_runs_with_its_loop_float32(layer: str) -> None:
    """A Keras LSTM's or GRU's training step on a CPU is a functional loop.  With 256 units
    its initial state is a ``Fill`` (a clear op) and the loop's state feeds MatMuls, so
    TensorFlow's bfloat16 lists, which clear ``While``, painted the loop variable bfloat16
    while the loop's functions kept float32 signatures: the step failed with "passed bfloat16
    expected float" (KNOWN_DIFFERENCES.md, KD-6).  Now the loop stays a float32 boundary, the
    loop body is rewritten, and the step runs and trains close to float32."""
    x = np.random.default_rng(0).integers(0, 500, size=(8, 6)).astype(np.int32)
    y = np.arange(8, dtype=np.int32) % 4
    losses = {}
    for amp in (False, True):
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((6,), dtype="int32"), keras.layers.Embedding(500, 32),
                                  getattr(keras.layers, layer)(256), keras.layers.Dense(4)])
        opt = keras.optimizers.SGD(0.1)
        if amp:
            opt = amp_rewrite.enable_mixed_precision_graph_rewrite(opt, target="cpu", precision="bfloat16",
                                                                   lists="tensorflow")
        model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=False)
        losses[amp] = [float(model.train_on_batch(x, y)) for _ in range(3)]
        if amp:
            step = model.train_function.amp_function
            report = step.rewrite_results[0].report
            bodies = [name for name, f in report["functions"].items() if "while_body" in name and f["converted_nodes"]]
            assert bodies, "the loop body's MatMuls should run in bfloat16"
            loops = [n for n, d in report["nodes"].items() if d["op"] == "While"]
            assert loops and all(report["nodes"][n]["reason"].startswith("[KD-6]") for n in loops)
    assert losses[True][-1] < losses[True][0]  # it trains
    np.testing.assert_allclose(losses[True], losses[False], rtol=0.05)


# -- amp_rewrite.function -----------------------------------------------------------------------

def _custom_loop(digits: Any, amp: bool, **options: Any) -> tuple[float, Any, Any, Any]:
    xtr, ytr, xte, yte = digits
    model = _keras_cnn()
    opt = keras.optimizers.Adam(0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if amp:
        opt = amp_rewrite.enable_mixed_precision_graph_rewrite(opt, **{**TARGET, **options})

    def step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
            scaled = opt.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)
        return loss

    # No options on the decorator: the step uses those given to the optimizer.
    train_step = amp_rewrite.function(step) if amp else tf.function(step)
    for xb, yb in _batches(xtr, ytr):
        train_step(xb, yb)
    return _accuracy(model, xte, yte), train_step, opt, [w.numpy() for w in model.weights]


def test_function_training_loop_matches_float32_and_runs_float16(digits: Any) -> None:
    acc32, _, _, weights32 = _custom_loop(digits, amp=False)
    acc16, step, opt, weights16 = _custom_loop(digits, amp=True)
    # Same start, same batches: the weights differ only by float16 arithmetic, a little.
    assert any(not np.array_equal(a, b) for a, b in zip(weights32, weights16))
    assert max(float(np.abs(a - b).max()) for a, b in zip(weights32, weights16)) < 0.5
    print(f"digits accuracy, amp_rewrite.function: float32 {acc32:.4f}, mixed {acc16:.4f}")
    assert acc32 > 0.9
    assert abs(acc16 - acc32) <= 0.01
    assert int(opt.iterations.numpy()) == STEPS  # the model's optimizer state was updated
    _assert_ran_in_float16(_graph_dtypes(step.executed_graphs()))
    # Rewritten with the options given to the optimizer (the decorator had none).
    assert step.rewrite_results[0].report["skipped"] is None


def test_function_training_loop_with_the_optimal_planner_converges(digits: Any) -> None:
    acc32, _, _, _ = _custom_loop(digits, amp=False)
    acc, step, _, _ = _custom_loop(digits, amp=True, lists="optimal")
    print(f"digits accuracy, amp_rewrite.function, optimal planner: float32 {acc32:.4f}, mixed {acc:.4f}")
    assert abs(acc - acc32) <= 0.01
    assert step.rewrite_results[0].report["lists"] == "optimal"
    assert "placement" in step.rewrite_results[0].report


# -- TF1 graph + amp_rewrite.Session ------------------------------------------------------------

def _tf1_cnn(amp: bool) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 8, 8, 1], name="x")
        y = tf.compat.v1.placeholder(tf.int32, [None], name="y")
        init1 = (rng.standard_normal((3, 3, 1, 8)) * 0.3).astype(np.float32)
        init2 = (rng.standard_normal((72, 10)) * 0.1).astype(np.float32)
        w1 = tf.compat.v1.get_variable("w1", initializer=init1)
        b1 = tf.compat.v1.get_variable("b1", initializer=tf.zeros([8]))
        w2 = tf.compat.v1.get_variable("w2", initializer=init2)
        b2 = tf.compat.v1.get_variable("b2", initializer=tf.zeros([10]))
        h = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, w1, 1, "VALID"), b1))
        h = tf.nn.max_pool2d(h, 2, 2, "VALID")
        logits = tf.nn.bias_add(tf.matmul(tf.reshape(h, [-1, 72]), w2), b2, name="logits")
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        opt = tf.compat.v1.train.AdamOptimizer(0.01)
        if amp:
            opt = amp_rewrite.enable_mixed_precision_graph_rewrite(opt, **TARGET)
        global_step = tf.compat.v1.train.get_or_create_global_step()
        train = opt.minimize(loss, global_step=global_step)
        init = tf.compat.v1.global_variables_initializer()
        pred = tf.argmax(logits, -1, name="pred")
    return dict(graph=graph, x=x, y=y, train=train, loss=loss, init=init, pred=pred,
                logits=logits, opt=opt, global_step=global_step, w2=w2)


def test_tf1_session_matches_float32_and_runs_float16(digits: Any) -> None:
    xtr, ytr, xte, yte = digits
    acc = {}
    for amp in (False, True):
        m = _tf1_cnn(amp)
        session_type = amp_rewrite.Session if amp else tf.compat.v1.Session
        with session_type(graph=m["graph"]) as sess:
            sess.run(m["init"])
            for xb, yb in _batches(xtr, ytr):
                sess.run(m["train"], {m["x"]: xb, m["y"]: yb})
            acc[amp] = float((sess.run(m["pred"], {m["x"]: xte}) == yte).mean())
            if not amp:
                continue
            # Check the graph that executed: the partition graphs of a training step.
            options = tf.compat.v1.RunOptions(output_partition_graphs=True)
            metadata = tf.compat.v1.RunMetadata()
            sess.run(m["train"], {"x:0": xtr[:BATCH], "y:0": ytr[:BATCH]},
                     options=options, run_metadata=metadata)
            _assert_ran_in_float16(_dtypes_of(
                (node.op, tf.dtypes.as_dtype(node.attr["T"].type).name)
                for graph in metadata.partition_graphs for node in graph.node
                if node.op in LOW_PRECISION_OPS))
            # Fetches come back in their original dtypes, by object or by name.
            logits, loss = sess.run([m["logits"], "loss:0"], {m["x"]: xte[:4], m["y"]: yte[:4]})
            assert logits.dtype == np.float32 and loss.dtype == np.float32
            assert sess.rewritten_graph.get_tensor_by_name("logits:0").dtype == tf.float16
            assert sess.run(m["global_step"]) == STEPS + 1
            assert sess.run([m["opt"].current_loss_scale, m["opt"].skipped_steps]) == [2.0**15, 0]
    print(f"digits accuracy, TF1 Session: float32 {acc[False]:.4f}, mixed {acc[True]:.4f}")
    assert acc[False] > 0.9
    assert abs(acc[True] - acc[False]) <= 0.01


def test_rewrite_graph_keeps_names_and_collections() -> None:
    m = _tf1_cnn(amp=True)
    new = amp_rewrite.rewrite_graph(m["graph"], **TARGET)
    old_names = {op.name for op in m["graph"].get_operations()}
    new_names = {op.name for op in new.get_operations()}
    assert old_names <= new_names
    assert new_names - old_names and all(n.endswith("-AutoMixedPrecision") and "-CastToFp" in n
                                         for n in new_names - old_names)
    for key in (tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES,
                tf.compat.v1.GraphKeys.TRAIN_OP):
        assert ([v.name for v in new.get_collection(key)]
                == [v.name for v in m["graph"].get_collection(key)]), key
    assert new.get_operation_by_name("MatMul").get_attr("T") == tf.float16
    assert m["graph"].get_operation_by_name("MatMul").get_attr("T") == tf.float32  # untouched


# -- forced overflow -----------------------------------------------------------------------------

def test_overflow_skips_the_step_halves_the_scale_then_grows_it() -> None:
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    opt = amp_rewrite.enable_mixed_precision_graph_rewrite(
        keras.optimizers.SGD(0.1), loss_scale=DynamicLossScale(2.0**10, increment_period=3),
        **TARGET)
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)

    @amp_rewrite.function
    def step(factor: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x))) * factor
            scaled = opt.scale_loss(loss)
        opt.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)
        return loss

    step(tf.constant(1.0))
    before = [w.numpy() for w in model.weights]
    scale = float(opt.current_loss_scale)
    iterations = int(opt.iterations.numpy())
    step(tf.constant(3e38))  # times the loss scale: the scaled loss and gradients overflow
    assert float(opt.current_loss_scale) == scale / 2
    assert int(opt.skipped_steps) == 1
    assert int(opt.iterations.numpy()) == iterations  # the inner optimizer did not step
    for old, new in zip(before, model.weights):
        np.testing.assert_array_equal(old, new.numpy())
    for _ in range(3):  # increment_period finite steps grow the scale again
        step(tf.constant(1.0))
    assert float(opt.current_loss_scale) == scale
    assert not np.array_equal(before[0], model.weights[0].numpy())
    assert len(step.rewrite_results) == 1  # one trace: the factor is a tensor argument
    assert _graph_dtypes(step.executed_graphs())["MatMul"] == {"float16"}


def test_tf1_overflow_skips_the_step_and_keeps_global_step() -> None:
    graph = tf.Graph()
    with graph.as_default():
        factor = tf.compat.v1.placeholder(tf.float32, [], name="factor")
        w = tf.compat.v1.get_variable("w", initializer=np.ones((4, 2), np.float32))
        x = tf.constant(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32))
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w))) * factor
        opt = amp_rewrite.enable_mixed_precision_graph_rewrite(
            tf.compat.v1.train.GradientDescentOptimizer(0.01),
            loss_scale=DynamicLossScale(2.0**8, increment_period=2), **TARGET)
        global_step = tf.compat.v1.train.get_or_create_global_step()
        train = opt.minimize(loss, global_step=global_step)
        init = tf.compat.v1.global_variables_initializer()
    with amp_rewrite.Session(graph=graph) as sess:
        sess.run(init)
        w0 = sess.run(w)
        sess.run(train, {factor: 1e38})
        np.testing.assert_array_equal(sess.run(w), w0)
        assert sess.run([opt.current_loss_scale, opt.skipped_steps, global_step]) == [2.0**7, 1, 0]
        sess.run(train, {factor: 1.0})
        sess.run(train, {factor: 1.0})
        assert sess.run([opt.current_loss_scale, opt.skipped_steps, global_step]) == [2.0**8, 1, 2]
        assert not np.array_equal(sess.run(w), w0)


# -- no global leak ------------------------------------------------------------------------------

def _has_low_precision(graph_def: Any) -> bool:
    def nodes() -> Iterator[Any]:
        yield from graph_def.node
        for fdef in graph_def.library.function:
            yield from fdef.node_def
    return any(
        attr.type in (tf.float16.as_datatype_enum, tf.bfloat16.as_datatype_enum)
        for node in nodes() for attr in node.attr.values()
    )


def test_enabling_for_one_optimizer_leaves_other_models_float32() -> None:
    x = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)
    y = np.zeros(16, np.int32)
    # Enable, and train, with one optimizer...
    first = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    first.compile(optimizer=amp_rewrite.enable_mixed_precision_graph_rewrite(
        keras.optimizers.SGD(0.1), **TARGET), loss="sparse_categorical_crossentropy")
    first.fit(x, y, epochs=1, verbose=0)
    assert _graph_dtypes(first.train_function.amp_function.executed_graphs())["MatMul"] == {"float16"}
    # ... then a float32 model built afterwards, with a plain optimizer, stays float32: in Keras,
    second = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    second.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    second.fit(x, y, epochs=1, verbose=0)
    assert not hasattr(second.train_function, "amp_function")
    assert "auto_mixed_precision" not in tf.config.optimizer.get_experimental_options()

    # in a plain tf.function (checked on the graph TensorFlow optimizes and runs),
    w = tf.Variable(np.ones((4, 2), np.float32))

    @tf.function
    def plain(v: Any) -> Any:
        return tf.matmul(v, w)

    plain(x)
    run_graph = plain.get_concrete_function(x).graph.as_graph_def()
    assert not _has_low_precision(run_graph)

    # and in a TF1 session (the partition graphs that ran).
    graph = tf.Graph()
    with graph.as_default():
        out = tf.matmul(tf.constant(x), tf.constant(np.ones((4, 2), np.float32)))
    with tf.compat.v1.Session(graph=graph) as sess:
        metadata = tf.compat.v1.RunMetadata()
        sess.run(out, options=tf.compat.v1.RunOptions(output_partition_graphs=True),
                 run_metadata=metadata)
    assert metadata.partition_graphs and not any(_has_low_precision(g) for g in metadata.partition_graphs)


# -- checkpoints ---------------------------------------------------------------------------------

def test_keras_wrapper_checkpoints_inner_state_and_scale(tmp_path: Any) -> None:
    def make() -> tuple[Any, Any]:
        keras.utils.set_random_seed(5)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        opt = amp_rewrite.enable_mixed_precision_graph_rewrite(
            keras.optimizers.Adam(0.1), loss_scale=DynamicLossScale(2.0**4, increment_period=2),
            **TARGET)
        opt.build(model.trainable_variables)
        return model, opt

    model, opt = make()
    x = np.ones((4, 4), np.float32)
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = opt.scale_loss(tf.reduce_sum(model(x)))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    assert float(opt.current_loss_scale) == 2.0**5
    path = tf.train.Checkpoint(model=model, optimizer=opt).write(str(tmp_path / "ckpt"))
    model2, opt2 = make()
    tf.train.Checkpoint(model=model2, optimizer=opt2).read(path).assert_consumed()
    assert float(opt2.current_loss_scale) == 2.0**5
    assert int(opt2.iterations.numpy()) == 3
    np.testing.assert_array_equal(opt2._momentums[0].numpy(), opt._momentums[0].numpy())


# -- offline training MetaGraphDef ---------------------------------------------------------------

def test_offline_training_meta_graph_trains_and_skips(digits: Any) -> None:
    xtr, ytr, _, _ = digits
    m = _tf1_cnn(amp=False)
    with m["graph"].as_default():
        meta = tf.compat.v1.train.export_meta_graph()
    original = meta.SerializeToString()
    result = amp_rewrite.rewrite_training_meta_graph(
        meta, loss_scale=DynamicLossScale(2.0**12, increment_period=1000), **TARGET)
    assert meta.SerializeToString() == original  # the input is not modified
    training = result.report["training"]
    assert len(training["apply_ops"]) == 4 and training["gradient_seeds"] == ["gradients/grad_ys_0"]
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.import_meta_graph(result.meta_graph_def)
        init = tf.compat.v1.global_variables_initializer()
        variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
        state = [variables["amp_loss_scale/current_loss_scale"],
                 variables["amp_loss_scale/skipped_steps"], variables["global_step"]]
    train_op = graph.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP)[0]
    assert graph.get_operation_by_name("MatMul").get_attr("T") == tf.float16
    feed = {"x:0": xtr[:256], "y:0": ytr[:256]}
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        first = sess.run("loss:0", feed)
        for _ in range(30):
            sess.run(train_op, feed)
        last = sess.run("loss:0", feed)
        assert last < 0.5 * first
        assert sess.run(state) == [2.0**12, 0, 30]
        # A non-finite step is skipped: the variables and global_step stay, the scale halves.
        w2 = sess.run("w2/Read/ReadVariableOp:0")
        sess.run(train_op, {**feed, "x:0": np.full_like(xtr[:256], np.nan)})
        np.testing.assert_array_equal(sess.run("w2/Read/ReadVariableOp:0"), w2)
        assert sess.run(state) == [2.0**11, 1, 30]
    print(f"offline training graph: loss {first:.3f} -> {last:.3f} in 30 steps")


def test_offline_rewrite_rejects_what_it_cannot_scale() -> None:
    graph = tf.Graph()
    with graph.as_default():
        v = tf.Variable([1.0, 2.0], name="v")
        loss = tf.reduce_sum(v * v)
        grad = tf.compat.v1.gradients(loss, [v])[0]
        train = v.assign_sub(0.1 * grad)  # a hand-written update: no Apply op to unscale
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, train.op)
        meta = tf.compat.v1.train.export_meta_graph()
    with pytest.raises(amp_rewrite.AmpRewriteError, match="Apply"):
        amp_rewrite.rewrite_training_meta_graph(meta, **TARGET)
    with pytest.raises(amp_rewrite.AmpRewriteError, match="train_op"):
        amp_rewrite.rewrite_training_meta_graph(meta, train_op="nope", **TARGET)
    with pytest.raises(amp_rewrite.AmpRewriteError, match="loss scale"):
        amp_rewrite.rewrite_training_meta_graph(meta, loss_scale="huge", **TARGET)
    with pytest.raises(amp_rewrite.AmpRewriteError, match="MetaGraphDef"):
        amp_rewrite.rewrite_training_meta_graph(b"not a proto at all \xff", **TARGET)


# -- contracts around the paths ------------------------------------------------------------------

def test_v1_optimizer_in_a_rewritten_function_skips_overflow() -> None:
    w = tf.Variable(np.ones((4, 2), np.float32))
    x = tf.constant(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32))
    opt = amp_rewrite.enable_mixed_precision_graph_rewrite(
        tf.compat.v1.train.GradientDescentOptimizer(0.01),
        loss_scale=DynamicLossScale(2.0**6, increment_period=100), **TARGET)

    @amp_rewrite.function
    def step(factor: Any) -> Any:
        opt.minimize(lambda: tf.reduce_mean(tf.square(tf.matmul(x, w))) * factor, var_list=[w])

    step(tf.constant(1e38))
    np.testing.assert_array_equal(w.numpy(), np.ones((4, 2), np.float32))
    assert float(opt.current_loss_scale) == 2.0**5 and int(opt.skipped_steps) == 1
    step(tf.constant(1.0))
    assert not np.array_equal(w.numpy(), np.ones((4, 2), np.float32))
    assert _graph_dtypes(step.executed_graphs())["MatMul"] == {"float16"}


#: A target on which no op can profit (float16 needs compute capability 7.0): the rewrite
#: converts nothing, so the step runs float32 whole.
NOTHING_CONVERTS = {"target": "gpu:6.1", "precision": "float16"}


def _loss_scale_ops(graphs: list[Any]) -> set[str]:
    """The ops of the loss scale's overflow check and skip among ``graphs``' (and their
    functions') ops."""
    found = set()
    for g in graphs:
        ops = list(g.get_operations())
        ops += [node for f in g.as_graph_def().library.function for node in f.node_def]
        found |= {op.op if hasattr(op, "op") else op.type for op in ops} & {"IsFinite", "If", "StatelessIf"}
    return found


def test_a_keras_step_that_converts_nothing_runs_without_loss_scaling(caplog: Any) -> None:
    """Where the rewrite converts nothing, the train step is traced again without loss
    scaling and runs as the user's own float32 step: the same weights as plain Keras, bit for
    bit, no overflow check in the graph that ran, and the loss-scale state untouched.  The
    WARNING that says the step runs float32 says so."""
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32)
    y = np.random.default_rng(1).integers(0, 3, 64)

    def fit(opt: Any) -> Any:
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])
        model.compile(opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        return model

    opt = amp_rewrite.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1), **NOTHING_CONVERTS)
    with caplog.at_level("WARNING", logger="amp_rewrite"):
        ours = fit(opt)
    plain = fit(keras.optimizers.SGD(0.1))
    step = ours.train_function.amp_function
    (result,) = step.rewrite_results
    assert result.report["converted_nodes"] == 0
    assert _loss_scale_ops(step.executed_graphs()) == set()
    assert float(opt.current_loss_scale) == 2.0**15 and int(opt.skipped_steps) == 0
    assert int(opt.iterations.numpy()) == 8
    for a, b in zip(ours.weights, plain.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert [r for r in caplog.records if "runs in float32 without loss scaling" in r.getMessage()]

    # Where the rewrite converts something, the same step keeps its loss scaling.
    converted = amp_rewrite.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1), **TARGET)
    step = fit(converted).train_function.amp_function
    assert step.rewrite_results[0].report["converted_nodes"] > 0
    assert "IsFinite" in _loss_scale_ops(step.executed_graphs())


def test_a_custom_step_that_converts_nothing_applies_its_gradients_unscaled() -> None:
    """``amp_rewrite.function`` with a loss-scaled optimizer, Keras's or TF1's: where nothing
    converts, ``scale_loss`` hands the loss back as it is and the update is the inner
    optimizer's own, so a non-finite gradient is applied as float32 training applies it
    rather than skipped.  Where something converts, the same step skips it."""
    x = tf.constant(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32))
    for target, skips in ((NOTHING_CONVERTS, False), (TARGET, True)):
        w = tf.Variable(np.ones((4, 2), np.float32))
        opt = amp_rewrite.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1), **target)

        @amp_rewrite.function
        def step(factor: Any) -> Any:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(tf.matmul(x, w))) * factor
                scaled = opt.scale_loss(loss)
            opt.apply(tape.gradient(scaled, [w]), [w])
            return loss, scaled

        loss, scaled = step(tf.constant(1.0))
        assert (float(scaled) == float(loss)) is not skips
        step(tf.constant(np.inf))
        assert (int(opt.skipped_steps) == 1) is skips
        assert bool(np.isfinite(w.numpy()).all()) is skips

        v = tf.Variable(np.ones((4, 2), np.float32))
        v1 = amp_rewrite.enable_mixed_precision_graph_rewrite(tf.compat.v1.train.GradientDescentOptimizer(0.01),
                                                              **target)

        @amp_rewrite.function
        def v1_step(factor: Any) -> None:
            v1.minimize(lambda: tf.reduce_mean(tf.square(tf.matmul(x, v))) * factor, var_list=[v])

        v1_step(tf.constant(np.inf))
        assert (int(v1.skipped_steps) == 1) is skips
        assert bool(np.isfinite(v.numpy()).all()) is skips
        assert bool(_loss_scale_ops(v1_step.executed_graphs())) is skips


def test_a_step_that_converts_nothing_keeps_loss_scaling_where_it_still_needs_it(caplog: Any,
                                                                                 monkeypatch: Any) -> None:
    """Nothing converts, yet the loss scale stays: where the step has float16 ops of its own
    (the user's casts), and where tracing it again would create a variable (the step must be
    traced once; forced here).  Both still run, skipping a non-finite step."""
    from amp_rewrite.training import _common, tf_function

    x = tf.constant(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32))
    for case in ("own float16", "creates a variable"):
        w = tf.Variable(np.ones((4, 2), np.float32))
        opt = amp_rewrite.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1), **NOTHING_CONVERTS)
        if case == "creates a variable":
            def creating(fn: Any) -> Any:
                def traced(*args: Any, **kwargs: Any) -> Any:
                    tf.Variable(0.0)
                    return fn(*args, **kwargs)
                return _common.unscaled(traced)
            monkeypatch.setattr(tf_function, "unscaled", creating)

        @amp_rewrite.function
        def step(factor: Any) -> Any:
            with tf.GradientTape() as tape:
                if case == "own float16":
                    y = tf.cast(tf.matmul(tf.cast(x, tf.float16), tf.cast(w, tf.float16)), tf.float32)
                else:
                    y = tf.matmul(x, w)
                loss = tf.reduce_mean(tf.square(y)) * factor
                scaled = opt.scale_loss(loss)
            opt.apply(tape.gradient(scaled, [w]), [w])
            return loss

        with caplog.at_level("WARNING", logger="amp_rewrite"):
            step(tf.constant(np.inf))
        assert step.rewrite_results[0].report["converted_nodes"] == 0
        assert "IsFinite" in _loss_scale_ops(step.executed_graphs()), case
        assert int(opt.skipped_steps) == 1 and np.array_equal(w.numpy(), np.ones((4, 2), np.float32)), case
        assert not [r for r in caplog.records if "without loss scaling" in r.getMessage()], case


def test_an_optimal_step_that_loss_scaling_makes_slower_runs_the_float32_step(caplog: Any, monkeypatch: Any) -> None:
    """``lists="optimal"`` on a GPU without XLA, three 2048 x 2048 layers.  The planner's own
    check prices the traced graph against itself in float32, loss scaling in both, and
    converts.  Priced whole against the user's float32 step without loss scaling, the mixed
    step with Adam's update (many small kernels, each costing host time without XLA) in the
    loss scale's conditional is slower, so the float32 step runs: no overflow scan, MatMuls in
    float32, the weights plain Keras's bit for bit, one WARNING giving both estimates.  With
    SGD's lighter update the same model's mixed step wins and keeps its loss scaling.  Where
    the whole step cannot be priced, the planner's decision stands (and the step trains)."""
    from amp_rewrite.training.tf_function import captured_variable_shapes

    n = 2048
    x = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    y = np.random.default_rng(1).integers(0, 3, n)

    def fit(opt: Any) -> Any:
        keras.utils.set_random_seed(5)
        model = keras.Sequential([keras.Input((n,))] + [keras.layers.Dense(n, activation="relu") for _ in range(3)]
                                 + [keras.layers.Dense(3)])
        model.compile(opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
        model.fit(x, y, batch_size=n, epochs=1, shuffle=False, verbose=0)
        return model

    gpu = {"target": "gpu:9.0", "precision": "float16", "lists": "optimal"}
    with caplog.at_level("WARNING", logger="amp_rewrite"):
        ours = fit(amp_rewrite.enable_mixed_precision_graph_rewrite(keras.optimizers.Adam(1e-3), **gpu))
    step = ours.train_function.amp_function
    (result,) = step.rewrite_results
    assert result.report["converted_nodes"] == 0
    assert "the whole mixed step, loss scaling included, is estimated at" in result.report["skipped"]
    assert _loss_scale_ops(step.executed_graphs()) == set()
    assert _graph_dtypes(step.executed_graphs())["MatMul"] == {"float32"}
    (warning,) = [r.getMessage() for r in caplog.records if "without loss scaling" in r.getMessage()]
    assert "for the float32 step without loss scaling" in warning
    # What the planner alone does with the loss-scaled trace: it converts.
    ((traced, _),) = step._calls.values()  # noqa: SLF001
    alone = amp_rewrite.rewrite_graph_def(traced.graph.as_graph_def(), use_env=False, price_step=True,
                                          fetches=sorted({t.op.name for t in traced.graph.outputs}),
                                          variable_shapes=captured_variable_shapes(traced.graph), **gpu)
    assert alone.report["converted_nodes"] > 0
    # The mixed step the WARNING prices is that rewrite's whole step, as rewritten.
    from amp_rewrite.training.tf_function import _duration

    assert f"estimated at {_duration(alone.step_estimates.rewritten.total_ns)} on" in warning
    plain = fit(keras.optimizers.Adam(1e-3))
    for a, b in zip(ours.weights, plain.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())

    sgd = fit(amp_rewrite.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1), **gpu))
    step = sgd.train_function.amp_function
    assert step.rewrite_results[0].report["converted_nodes"] > 0
    assert "IsFinite" in _loss_scale_ops(step.executed_graphs())
    assert _graph_dtypes(step.executed_graphs())["MatMul"] == {"float16"}

    def unpriceable(*args: Any, **kwargs: Any) -> Any:
        raise amp_rewrite.AmpRewriteError("cannot price this graph")

    monkeypatch.setattr(amp_rewrite.api, "estimate_step_time", unpriceable)
    kept = fit(amp_rewrite.enable_mixed_precision_graph_rewrite(keras.optimizers.Adam(1e-3), **gpu))
    step = kept.train_function.amp_function
    assert step.rewrite_results[0].report["converted_nodes"] > 0
    assert "IsFinite" in _loss_scale_ops(step.executed_graphs())
    assert all(np.isfinite(w.numpy()).all() for w in kept.weights)


def test_the_whole_step_check_is_made_without_xla_only(monkeypatch: Any) -> None:
    """Under XLA the loss scale's ops fuse and add a read of every gradient, which the
    planner's margin covers: a converted loss-scaled step is not traced again nor priced whole
    (the first step would pay for it).  The min-casts planner converts what TensorFlow does and
    is not second-guessed either.  Without XLA the optimal planner's step is priced whole, both
    steps: the mixed one by its own rewrite (``price_step``, from the import it made), the
    float32 one by ``estimate_step_time``."""
    n = 2048
    x = tf.constant(np.random.default_rng(0).standard_normal((n, n)).astype(np.float32))
    ws = [tf.Variable(np.full((n, n), 0.01, np.float32)) for _ in range(3)]
    priced, rewrites = [], []
    estimate, rewrite = amp_rewrite.api.estimate_step_time, amp_rewrite.api.rewrite_graph_def
    monkeypatch.setattr(amp_rewrite.api, "estimate_step_time",
                        lambda *args, **kwargs: priced.append(kwargs["compiled"]) or estimate(*args, **kwargs))

    @functools.wraps(rewrite)  # the options are checked against its signature
    def recorded(*args: Any, **kwargs: Any) -> Any:
        rewrites.append(kwargs.get("price_step", False))
        return rewrite(*args, **kwargs)

    monkeypatch.setattr(amp_rewrite.api, "rewrite_graph_def", recorded)
    for jit_compile, planner in ((True, "optimal"), (False, "min-casts"), (False, "optimal")):
        opt = amp_rewrite.enable_mixed_precision_graph_rewrite(keras.optimizers.Adam(1e-3), target="gpu:9.0",
                                                               precision="float16", lists="optimal",
                                                               planner=planner)

        def body(x: Any) -> Any:
            with tf.GradientTape() as tape:
                h = x
                for w in ws:
                    h = tf.nn.relu(tf.matmul(h, w))
                loss = tf.reduce_mean(tf.square(h))
                scaled = opt.scale_loss(loss)
            opt.apply(tape.gradient(scaled, ws), ws)
            return loss

        step = amp_rewrite.function(body, jit_compile=jit_compile)
        runner = step._runner(step.get_concrete_function(x))  # noqa: SLF001  (built, not run)
        assert runner.result.report["converted_nodes"] > 0
        assert (runner.result.step_estimates is not None) == (not jit_compile and planner == "optimal")
    assert rewrites == [False, False, True] and priced == [False]


def test_the_unscaled_mark_is_the_traced_graphs_and_refuses_variables() -> None:
    """:func:`amp_rewrite.training._common.unscaled` marks the graph it is traced into, and the
    graphs nested in it (a ``tf.cond`` branch), not the process: a plain trace, and eager
    code, keep loss scaling.  A variable created in such a trace raises."""
    from amp_rewrite.training._common import in_unscaled_trace, unscaled

    seen: dict[str, bool] = {}

    def body(x: Any) -> Any:
        seen["top"] = in_unscaled_trace()

        def branch() -> Any:
            seen["branch"] = in_unscaled_trace()
            return x * 2

        return tf.cond(x > 0, branch, lambda: x)

    tf.function(unscaled(body)).get_concrete_function(tf.constant(1.0))
    assert seen == {"top": True, "branch": True}
    seen.clear()
    tf.function(body).get_concrete_function(tf.constant(1.0))
    assert seen == {"top": False, "branch": False}
    assert not in_unscaled_trace()
    # Raised as VariableCreatedError, which autograph wraps in its StagingError.
    with pytest.raises(Exception, match="VariableCreatedError: the step creates variable"):
        tf.function(unscaled(lambda: tf.Variable(1.0) + 1)).get_concrete_function()


def test_v1_optimizer_with_a_fixed_scale_in_a_rewritten_function_updates() -> None:
    """A TF1 optimizer with a fixed loss scale applies its update outside any ``tf.cond``,
    colocated with the variable's handle, a placeholder the runner maps rather than imports:
    the constraint is dropped and the step runs (it failed to import before), in float16, with
    float32 training's update."""
    x = tf.constant(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32))
    updated = {}
    for amp in (False, True):
        v = tf.Variable(np.ones((4, 2), np.float32))
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.01)
        if amp:
            opt = amp_rewrite.enable_mixed_precision_graph_rewrite(opt, loss_scale=128.0, **TARGET)

        def step() -> None:
            opt.minimize(lambda: tf.reduce_mean(tf.square(tf.matmul(x, v))), var_list=[v])

        run = amp_rewrite.function(step) if amp else tf.function(step)
        run()
        updated[amp] = v.numpy()
    assert _graph_dtypes(run.executed_graphs())["MatMul"] == {"float16"}
    assert not np.array_equal(updated[True], np.ones((4, 2), np.float32))
    np.testing.assert_allclose(updated[True], updated[False], rtol=1e-2)


def test_optimizer_traced_without_the_rewrite_warns(caplog: Any) -> None:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    opt = amp_rewrite.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1), **TARGET)
    opt.build(model.trainable_variables)

    def step() -> None:
        with tf.GradientTape() as tape:
            loss = opt.scale_loss(tf.reduce_sum(model(tf.ones((2, 4)))))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    with caplog.at_level("WARNING", logger="amp_rewrite"):
        amp_rewrite.function(step)()
    assert not [r for r in caplog.records if "does not rewrite" in r.getMessage()]
    with caplog.at_level("WARNING", logger="amp_rewrite"):
        tf.function(step)()  # a plain tf.function: the step is not rewritten, say so
    assert [r for r in caplog.records if "does not rewrite" in r.getMessage()]


def test_session_refuses_a_graph_that_grew_after_the_first_run() -> None:
    graph = tf.Graph()
    with graph.as_default():
        a = tf.constant(2.0)
    with amp_rewrite.Session(graph=graph, rewrite_options=TARGET) as sess:
        assert sess.run(a) == 2.0
        assert a.eval() == 2.0  # the default session is the amp_rewrite.Session
        with graph.as_default():
            b = a * 3.0
        with pytest.raises(amp_rewrite.AmpRewriteError, match="graph changed"):
            sess.run(b)


def test_session_partial_run_uses_the_rewritten_graph_in_original_names_and_dtypes() -> None:
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (64, 64), name="x")
        w = tf.constant(np.eye(64, dtype=np.float32) * 0.5, name="w")
        h = tf.matmul(x, w, name="h")
        y = tf.matmul(h, w, name="y")
    value = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    with amp_rewrite.Session(graph=graph, rewrite_options=TARGET) as sess:
        handle = sess.partial_run_setup([h, y], [x])
        got_h = sess.partial_run(handle, h, feed_dict={x: value})
        got_y = sess.partial_run(handle, y)
        assert sess.rewrite_result.report["converted_nodes"] > 0
    assert got_h.dtype == np.float32 and got_y.dtype == np.float32
    np.testing.assert_allclose(got_h, value * 0.5, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(got_y, value * 0.25, rtol=2e-2, atol=2e-2)


def test_loss_scale_base_class_is_abstract() -> None:
    from amp_rewrite.training.loss_scale import LossScale

    with pytest.raises(TypeError, match="abstract"):
        LossScale()


def test_function_on_a_method_and_with_explicit_options() -> None:
    class Scaler(tf.Module):
        def __init__(self) -> None:
            self.w = tf.Variable(np.eye(4, dtype=np.float32))

        @amp_rewrite.function(target="cpu", precision="bfloat16")
        def __call__(self, x: Any) -> Any:
            return {"y": tf.matmul(x, self.w), "n": None}

    module = Scaler()
    out = module(np.ones((2, 4), np.float32))
    assert out["n"] is None and out["y"].dtype == tf.float32  # outputs keep their dtypes
    np.testing.assert_allclose(out["y"].numpy(), np.ones((2, 4)))
    assert _graph_dtypes(type(module).__call__.__get__(module).executed_graphs())["MatMul"] == {"bfloat16"}


def test_session_takes_fetches_from_the_optimizer_and_itself() -> None:
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 4], name="x")
        w = tf.compat.v1.get_variable("w", initializer=np.eye(4, dtype=np.float32))
        y = tf.identity(tf.matmul(x, w), name="y")
        loss = tf.reduce_sum(tf.square(y), name="loss")
        opt = amp_rewrite.enable_mixed_precision_graph_rewrite(
            tf.compat.v1.train.GradientDescentOptimizer(0.01), fetches=["y"], **TARGET)
        train = opt.minimize(loss)
        init = tf.compat.v1.global_variables_initializer()
    with amp_rewrite.Session(graph=graph, fetches=["loss"]) as sess:  # both name nodes to keep
        sess.run(init)
        sess.run(train, {"x:0": np.ones((4, 4), np.float32)})
        assert sess.run(y, {"x:0": np.ones((4, 4), np.float32)}).shape == (4, 4)


def test_offline_rewrite_unscales_float16_gradients_past_float16s_range() -> None:
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", initializer=np.ones((4, 4), np.float16))
        # Small values, so the scaled float16 gradients (about 26 at a scale of 2^17) stay
        # finite, and a large step, so the unscaled ones (2e-4) visibly move float16 weights.
        x = tf.constant(np.full((4, 4), 0.01, np.float16))
        loss = tf.reduce_mean(tf.cast(tf.square(tf.matmul(x, w)), tf.float32), name="loss")
        tf.compat.v1.train.GradientDescentOptimizer(10.0).minimize(loss)  # files itself as train op
        meta = tf.compat.v1.train.export_meta_graph()
    # The scale doubles after every good step: 2^15, then 2^16 (float16's inf), 2^17...
    result = amp_rewrite.rewrite_training_meta_graph(
        meta, loss_scale=DynamicLossScale(2.0**15, increment_period=1), **TARGET)
    out = tf.Graph()
    with out.as_default():
        tf.compat.v1.train.import_meta_graph(result.meta_graph_def)
        init = tf.compat.v1.global_variables_initializer()
        variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
        scale = variables["amp_loss_scale/current_loss_scale"]
    train_op = out.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP)[0]
    with tf.compat.v1.Session(graph=out) as sess:
        sess.run(init)
        values = [sess.run("w/Read/ReadVariableOp:0")]
        for _ in range(3):
            sess.run(train_op)
            values.append(sess.run("w/Read/ReadVariableOp:0"))
        assert sess.run(scale) == 2.0**18
    for a, b in zip(values, values[1:]):
        assert np.all(b < a)  # every step moved the weights, past a scale of 65536 too


def test_offline_rewrite_refuses_an_update_that_is_not_a_gradient() -> None:
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", initializer=np.ones(2, np.float32))
        u = tf.compat.v1.get_variable("u", initializer=np.ones(2, np.float32))
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        step = opt.minimize(tf.reduce_sum(w * w))
        other = opt.apply_gradients([(tf.constant([1.0, 1.0]), u)])  # not from tf.gradients
        train = tf.group(step, other, name="train")
        meta = tf.compat.v1.train.export_meta_graph()
    with pytest.raises(amp_rewrite.AmpRewriteError, match="no tf.gradients seed"):
        amp_rewrite.rewrite_training_meta_graph(meta, loss_scale=1024, train_op=train.name, **TARGET)
