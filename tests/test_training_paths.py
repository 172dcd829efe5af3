"""The training paths end to end (issue 23): no silent no-op, Keras inference rewritten, the TF1
path's options and MonitoredTrainingSession, and the ``amp-rewrite run`` launcher.

This machine has no GPU and no fast bfloat16, so ``target="auto"`` converts nothing here: the
converting runs rewrite for ``gpu:8.0`` (float16, whose CPU kernels TensorFlow has) or ``cpu``
(an offline CPU with AMX, bfloat16), and ``gpu:6.1`` stands for a device that cannot profit.
Models are tiny and runs short; the launcher tests run unmodified scripts in a subprocess.
"""

from __future__ import annotations

import io
import logging
import os
import pathlib
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import amp_rewrite  # noqa: E402
from amp_rewrite.cli import main as cli_main  # noqa: E402
from amp_rewrite.errors import AmpRewriteError  # noqa: E402
from amp_rewrite.training import launcher  # noqa: E402

FP16 = {"target": "gpu:8.0", "precision": "float16"}


def _matmul_dtypes(graphs: list[Any]) -> set[str]:
    return {op.get_attr("T").name for g in graphs for op in g.get_operations() if op.type == "MatMul"}


def _data(n: int = 100) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(0).standard_normal((n, 16)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int32)


def _keras_model(jit_compile: Any = False, **options: Any) -> Any:
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(4)])
    opt = amp_rewrite.enable_mixed_precision_graph_rewrite(keras.optimizers.Adam(0.01), **options)
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=jit_compile)
    return model


def _records(caplog: Any, level: int, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == level and r.name.startswith("amp_rewrite.training") and text in r.getMessage()]


# -- 1. no silent no-op ----------------------------------------------------------------------------

def test_keras_fit_that_cannot_profit_warns_once_with_the_true_reason(caplog: Any) -> None:
    x, y = _data(100)  # 100 = 3 batches of 32 + 4: the last batch traces (and rewrites) again
    model = _keras_model(target="gpu:6.1", precision="float16")
    with caplog.at_level(logging.DEBUG, logger="amp_rewrite"):
        model.fit(x, y, batch_size=32, epochs=2, verbose=0)
    step = model.train_function.amp_function
    reports = [r.report for r in step.rewrite_results]
    assert len(reports) == 2 and all(r["converted_nodes"] == 0 for r in reports)
    reason = reports[0]["skipped"]
    assert reason and "6.1" in reason
    warnings = _records(caplog, logging.WARNING, "was not rewritten")
    assert len(warnings) == 1, warnings
    assert "Keras train step of model" in warnings[0] and reason in warnings[0]
    assert _matmul_dtypes(step.executed_graphs()) == {"float32"}
    assert not _records(caplog, logging.INFO, "converted")


def test_a_converting_fit_logs_one_info_line_and_no_warning(caplog: Any) -> None:
    x, y = _data(100)
    model = _keras_model(**FP16)
    with caplog.at_level(logging.INFO, logger="amp_rewrite"):
        model.fit(x, y, batch_size=32, epochs=2, verbose=0)
    assert not _records(caplog, logging.WARNING, "was not rewritten")
    infos = _records(caplog, logging.INFO, "Keras train step of model")
    report = model.train_function.amp_function.rewrite_results[0].report
    assert len(infos) == 1, infos  # the retrace of the last batch logs at DEBUG only
    assert (f"converted {report['converted_nodes']} of {report['total_nodes']} ops to float16"
            in infos[0]) and report["converted_nodes"] > 0
    assert f"{report['casts_to_low']} cast(s) to float16" in infos[0] and "rewritten in" in infos[0]


def test_amp_rewrite_function_with_nothing_to_convert_warns_once(caplog: Any) -> None:
    @amp_rewrite.function(target="gpu:8.0")
    def no_matmul(v: Any) -> Any:
        return tf.nn.relu(v) * 2.0

    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        no_matmul(tf.ones([4]))
        no_matmul(tf.ones([5]))  # a second signature: rewritten again, warned once
    warnings = _records(caplog, logging.WARNING, "was not rewritten")
    assert len(warnings) == 1 and "'no_matmul'" in warnings[0]
    assert "no allow-list op" in warnings[0]


# -- 2. Keras predict and evaluate run the rewritten plan ----------------------------------------------

def test_keras_predict_and_evaluate_run_rewritten_close_to_float32(caplog: Any) -> None:
    x, y = _data(100)
    model = _keras_model(**FP16)
    model.fit(x, y, batch_size=32, epochs=2, verbose=0)
    with caplog.at_level(logging.INFO, logger="amp_rewrite"):
        predicted = model.predict(x, batch_size=32, verbose=0)
        loss = model.evaluate(x, y, batch_size=32, verbose=0)
    reference = model(x, training=False).numpy()  # eager: float32 throughout
    reference_loss = float(keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, reference))
    assert predicted.dtype == np.float32 and predicted.shape == (100, 4)
    np.testing.assert_allclose(predicted, reference, rtol=2e-2, atol=2e-2)
    assert not np.array_equal(predicted, reference)  # float16 rounding: it really ran rewritten
    assert loss == pytest.approx(reference_loss, rel=2e-2)
    for function in (model.predict_function, model.test_function):
        step = function.amp_function
        assert all(r.report["converted_nodes"] > 0 for r in step.rewrite_results)
        assert _matmul_dtypes(step.executed_graphs()) == {"float16"}
    assert len(_records(caplog, logging.INFO, "Keras predict step of model")) == 1
    assert len(_records(caplog, logging.INFO, "Keras test step of model")) == 1


def test_keras_predict_and_evaluate_keep_jit_compile() -> None:
    x, y = _data(64)
    model = _keras_model(jit_compile=True, **FP16)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    model.predict(x, batch_size=32, verbose=0)
    model.evaluate(x, y, batch_size=32, verbose=0)
    for function in (model.train_function, model.predict_function, model.test_function):
        step = function.amp_function
        assert step.jit_compile is True and step.xla_compiled() == [True]
        assert _matmul_dtypes(step.executed_graphs()) == {"float16"}


def test_a_model_compiled_with_another_optimizer_predicts_with_keras_own() -> None:
    model = _keras_model(**FP16)
    model.compile(optimizer="adam", loss="mse")  # the hook stays on the instance...
    model.predict(_data(8)[0], verbose=0)
    assert not hasattr(model.predict_function, "amp_function")  # ...and steps aside


# -- 3. TF1 ------------------------------------------------------------------------------------------

def _tf1_graph(**options: Any) -> dict[str, Any]:
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [32, 16], name="x")
        y = tf.compat.v1.placeholder(tf.int32, [32], name="y")
        init = tf.compat.v1.glorot_uniform_initializer
        w1 = tf.compat.v1.get_variable("w1", [16, 32], initializer=init(seed=1))
        w2 = tf.compat.v1.get_variable("w2", [32, 4], initializer=init(seed=2))
        logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2, name="logits")
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits),
                              name="loss")
        global_step = tf.compat.v1.train.get_or_create_global_step()
        opt = amp_rewrite.enable_mixed_precision_graph_rewrite(
            tf.compat.v1.train.GradientDescentOptimizer(0.5), **options)
        train = opt.minimize(loss, global_step=global_step)
    return dict(graph=graph, x=x, y=y, loss=loss, train=train, opt=opt, global_step=global_step)


def test_rewrite_graph_uses_the_optimizer_options() -> None:
    m = _tf1_graph(**FP16)
    new, result = amp_rewrite.rewrite_graph_with_result(m["graph"])
    assert result.report["precision"] == "float16" and result.report["casts_to_low"] > 0
    assert new.get_operation_by_name("logits").get_attr("T") == tf.float16
    assert amp_rewrite.rewrite_graph(m["graph"]).get_operation_by_name("logits").get_attr("T") == tf.float16
    # Options passed to rewrite_graph win over the optimizer's.
    bf16 = amp_rewrite.rewrite_graph(m["graph"], precision="bfloat16")
    assert bf16.get_operation_by_name("logits").get_attr("T") == tf.bfloat16


def test_training_submodules_import_without_an_explicit_import(user_environ: dict[str, str]) -> None:
    code = ("import amp_rewrite\n"
            "print(amp_rewrite.training.session.Session.__name__,"
            " amp_rewrite.training.launcher.run_script.__name__,"
            " amp_rewrite.rewrite_graph_with_result.__name__)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**user_environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["Session", "run_script", "rewrite_graph_with_result"]


def test_monitored_training_session_trains_the_rewritten_graph(tmp_path: pathlib.Path) -> None:
    m = _tf1_graph(**FP16)
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((32, 16)).astype(np.float32)
    ys = (xs[:, 0] > 0).astype(np.int32)
    feed = {m["x"]: xs, m["y"]: ys}
    with m["graph"].as_default():
        with amp_rewrite.training.MonitoredTrainingSession(
                checkpoint_dir=str(tmp_path), save_summaries_steps=None,
                log_step_count_steps=None) as sess:
            losses = [sess.run([m["train"], m["loss"]], feed)[1] for _ in range(20)]
            options = tf.compat.v1.RunOptions(output_partition_graphs=True)
            metadata = tf.compat.v1.RunMetadata()
            sess.run(m["train"], feed, options=options, run_metadata=metadata)
            ran = {tf.dtypes.as_dtype(n.attr["T"].type).name for g in metadata.partition_graphs
                   for n in g.node if n.op == "MatMul"}
            assert ran == {"float16"}
            assert sess.run(m["opt"].skipped_steps) == 0
        # The chief's CheckpointSaverHook saved at the end; a new session restores from it.
        with amp_rewrite.training.MonitoredTrainingSession(
                checkpoint_dir=str(tmp_path), save_summaries_steps=None,
                log_step_count_steps=None) as sess:
            assert sess.run(m["global_step"]) == 21
            restored_loss = sess.run(m["loss"], feed)
    assert losses[-1] < 0.5 * losses[0]
    assert restored_loss == pytest.approx(losses[-1], rel=0.5)
    assert restored_loss < 0.5 * losses[0]


def test_session_creator_with_monitored_session_and_init_fn() -> None:
    m = _tf1_graph(**FP16)
    seen: list[Any] = []
    with m["graph"].as_default():
        scaffold = tf.compat.v1.train.Scaffold(init_fn=lambda scaffold, sess: seen.append(sess))
        creator = amp_rewrite.training.MixedPrecisionSessionCreator(scaffold=scaffold)
        with tf.compat.v1.train.MonitoredSession(session_creator=creator) as sess:
            logits = sess.run("logits:0", {m["x"]: np.ones((32, 16), np.float32)})
            assert len(seen) == 1 and isinstance(seen[0], amp_rewrite.Session)
            assert seen[0].rewritten_graph.get_tensor_by_name("logits:0").dtype == tf.float16
    assert logits.dtype == np.float32  # float16 in the graph that ran, float32 to the caller


def test_minimize_in_a_graph_never_rewritten_warns_once(caplog: Any) -> None:
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        m = _tf1_graph(**FP16)
        with m["graph"].as_default():
            m["opt"].minimize(m["loss"] * 2.0)  # a second train op: no second warning
    warnings = _records(caplog, logging.WARNING, "built a train op in a TF1 graph")
    assert len(warnings) == 1 and "amp_rewrite.Session" in warnings[0]
    # A graph that an amp_rewrite.Session already runs is not warned about.
    caplog.clear()
    graph = tf.Graph()
    amp_rewrite.Session(graph=graph)
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"), graph.as_default():
        w = tf.Variable(tf.ones([4, 4]))
        opt = amp_rewrite.enable_mixed_precision_graph_rewrite(
            tf.compat.v1.train.GradientDescentOptimizer(0.1), **FP16)
        opt.minimize(tf.reduce_sum(tf.matmul(w, w)))
    assert not _records(caplog, logging.WARNING, "built a train op in a TF1 graph")


# -- 4. the launcher -----------------------------------------------------------------------------------

KERAS_SCRIPT = """
    import sys
    import numpy as np
    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(4)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).standard_normal((128, 16)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    history = model.fit(x, y, batch_size=32, epochs=int(sys.argv[1]), verbose=0)
    model.predict(x[:32], verbose=0)
    print("argv", sys.argv[1:], "name", __name__)
    print("optimizer", type(model.optimizer).__module__)
    print("loss", history.history["loss"][0], history.history["loss"][-1])
"""

TF1_SCRIPT = """
    import numpy as np
    import tensorflow.compat.v1 as tf

    tf.disable_eager_execution()
    x = tf.placeholder(tf.float32, [32, 16], name="x")
    y = tf.placeholder(tf.int32, [32], name="y")
    w1 = tf.get_variable("w1", [16, 32], initializer=tf.glorot_uniform_initializer(seed=1))
    w2 = tf.get_variable("w2", [32, 4], initializer=tf.glorot_uniform_initializer(seed=2))
    logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2, name="logits")
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    train = tf.train.GradientDescentOptimizer(0.5).minimize(loss)
    xs = np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)
    ys = (xs[:, 0] > 0).astype(np.int32)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        losses = [sess.run([train, loss], {x: xs, y: ys})[1] for _ in range(30)]
        metadata = tf.RunMetadata()
        sess.run(train, {x: xs, y: ys}, options=tf.RunOptions(output_partition_graphs=True),
                 run_metadata=metadata)
    ran = sorted({tf.as_dtype(n.attr["T"].type).name for g in metadata.partition_graphs
                  for n in g.node if n.op == "MatMul"})
    print("matmul", ",".join(ran))
    print("variables", ",".join(v.op.name for v in tf.global_variables()))
    print("loss", losses[0], losses[-1])
"""


def _run(command: list[str], tmp_path: pathlib.Path, script: str, env: dict[str, str],
         options: list[str], args: list[str]) -> subprocess.CompletedProcess[str]:
    """``COMMAND run OPTIONS train.py ARGS`` with ``script`` as train.py, in ``tmp_path``."""
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(script))
    done = subprocess.run([*command, "run", *options, str(path), *args], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path,
                          env={**env, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _lines(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


def _losses(stdout: str) -> tuple[float, float]:
    first, last = _lines(stdout, "loss ")[0].split()[1:]
    return float(first), float(last)


def test_run_trains_an_unmodified_keras_script_rewritten(tmp_path: pathlib.Path,
                                                         user_environ: dict[str, str]) -> None:
    done = _run([sys.executable, "-m", "amp_rewrite"], tmp_path, KERAS_SCRIPT, user_environ,
                ["--target", "cpu"], ["3"])
    summaries = _lines(done.stderr, "amp-rewrite run: ")
    assert len(summaries) == 2, done.stderr[-3000:]
    train, predict = summaries
    assert "Keras train step of model" in train and "Keras predict step of model" in predict
    for line in summaries:
        converted = int(line.split("converted ")[1].split()[0])
        assert converted > 0 and "ops to bfloat16" in line, line
    assert _lines(done.stdout, "argv")[0] == "argv ['3'] name __main__"
    assert _lines(done.stdout, "optimizer")[0] == "optimizer amp_rewrite.training.keras_optimizer"
    first, last = _losses(done.stdout)
    assert last < first


#: The flags of a CPU with fast bfloat16 (this project's reference machine: AMD EPYC with
#: AVX512-BF16, no AMX).  The machines the tests run on vary (some have AVX2 only), so the
#: tests that check the *default* precision on such a CPU present it through ``cpu_features``,
#: the one place ``target="auto"`` reads the CPU from.
FAST_BF16_CPU = frozenset({"avx2", "avx512f", "avx512bw", "avx512_bf16"})

#: ``amp-rewrite`` run by a Python that presents :data:`FAST_BF16_CPU` first.
FAST_BF16_CLI = [sys.executable, "-c",
                 "import sys, amp_rewrite.plan.targets as t; "
                 f"t.cpu_features = lambda *a, **k: frozenset({sorted(FAST_BF16_CPU)!r}); "
                 "from amp_rewrite.cli import main; sys.exit(main())"]


def test_default_keras_fit_converts_with_bfloat16_on_a_cpu_with_fast_bfloat16(
        monkeypatch: Any, caplog: Any) -> None:
    """Issue 23's first done-when line: ``enable_mixed_precision_graph_rewrite(Adam())`` and
    ``fit``, with every option left at its default, train in bfloat16 on such a CPU."""
    from amp_rewrite.plan import targets
    monkeypatch.setattr(targets, "cpu_features", lambda *a, **k: FAST_BF16_CPU)
    x, y = _data(96)
    model = _keras_model()  # no target, no precision: both "auto"
    with caplog.at_level(logging.INFO, logger="amp_rewrite"):
        history = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    step = model.train_function.amp_function
    report = step.rewrite_results[0].report
    assert report["precision"] == "bfloat16" and "avx512_bf16" in report["precision_reason"]
    assert report["converted_nodes"] > 0 and report["casts_to_low"] > 0
    assert "bfloat16" in _matmul_dtypes(step.executed_graphs())
    assert not _records(caplog, logging.WARNING, "was not rewritten")
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_switch_on_runs_an_unmodified_keras_script_in_bfloat16_on_such_a_cpu(
        tmp_path: pathlib.Path, user_environ: dict[str, str]) -> None:
    """``TF_ENABLE_AUTO_MIXED_PRECISION=1 amp-rewrite run script.py`` with no option converts
    with bfloat16 on a CPU with fast bfloat16."""
    env = {**user_environ, "TF_ENABLE_AUTO_MIXED_PRECISION": "1"}
    done = _run(FAST_BF16_CLI, tmp_path, KERAS_SCRIPT, env, [], ["2"])
    summaries = _lines(done.stderr, "amp-rewrite run: ")
    assert summaries and "Keras train step of model" in summaries[0], done.stderr[-3000:]
    for line in summaries:
        converted = int(line.split("converted ")[1].split()[0])
        assert converted > 0 and "ops to bfloat16" in line, line
    assert _lines(done.stdout, "optimizer")[0] == "optimizer amp_rewrite.training.keras_optimizer"


def test_switch_on_warns_with_the_true_reason_on_a_cpu_that_cannot_profit(
        tmp_path: pathlib.Path, user_environ: dict[str, str]) -> None:
    """The same script on a CPU with no fast low-precision type (AVX2 only) trains in float32,
    and says why on stderr instead of passing silently."""
    slow_cli = [FAST_BF16_CLI[0], "-c", FAST_BF16_CLI[2].replace(repr(sorted(FAST_BF16_CPU)),
                                                                  repr(["avx", "avx2", "f16c"]))]
    env = {**user_environ, "TF_ENABLE_AUTO_MIXED_PRECISION": "1"}
    done = _run(slow_cli, tmp_path, KERAS_SCRIPT, env, [], ["2"])
    warned = [line for line in done.stderr.splitlines() if "was not rewritten" in line]
    assert warned and "Keras train step of model" in warned[0], done.stderr[-3000:]
    assert "no fast" in warned[0] or "cannot profit" in warned[0] or "float32" in warned[0], warned[0]
    assert not [line for line in _lines(done.stderr, "amp-rewrite run: ") if "ops to bfloat16" in line]


def test_run_trains_an_unmodified_tf1_script_rewritten_and_loss_scaled(
        tmp_path: pathlib.Path, user_environ: dict[str, str]) -> None:
    # The console script, with TensorFlow's own switch set: it is honoured, then removed so
    # that TensorFlow's pass does not rewrite the rewritten graph again.
    env = {**user_environ, "TF_ENABLE_AUTO_MIXED_PRECISION": "1"}
    command = [str(pathlib.Path(sys.executable).with_name("amp-rewrite"))]
    if not os.path.exists(command[0]):
        command = [sys.executable, "-m", "amp_rewrite"]
    done = _run(command, tmp_path, TF1_SCRIPT, env, ["--target", "gpu:8.0", "--precision", "fp16"], [])
    summaries = _lines(done.stderr, "amp-rewrite run: ")
    assert len(summaries) == 1 and summaries[0].startswith("amp-rewrite run: TF1 graph: converted ")
    assert "ops to float16" in summaries[0]
    assert _lines(done.stdout, "matmul")[0] == "matmul float16"
    assert "amp_loss_scale/current_loss_scale" in _lines(done.stdout, "variables")[0]
    first, last = _losses(done.stdout)
    assert last < 0.5 * first
    assert "built a train op in a TF1 graph" not in done.stderr  # the launcher rewrites it


def test_run_with_the_switch_off_runs_the_script_unchanged(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text("import sys, tensorflow as tf\n"
                      "print(sys.argv[1:], __name__, tf.compat.v1.Session.__module__)\n")
    out, printed = io.StringIO(), io.StringIO()
    environ = {"TF_ENABLE_AUTO_MIXED_PRECISION": "0"}
    saved = sys.stdout
    sys.stdout = printed
    try:
        assert launcher.run_script(str(script), ["a", "b"], environ=environ, out=out) == 0
    finally:
        sys.stdout = saved
    assert "without the rewrite" in out.getvalue()
    assert printed.getvalue().strip() == "['a', 'b'] __main__ tensorflow.python.client.session"
    assert environ == {"TF_ENABLE_AUTO_MIXED_PRECISION": "0"}


def test_run_patches_are_undone_after_the_script(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text("import tensorflow as tf, keras\n"
                      "PROBE.append((tf.compat.v1.Session.__name__, keras.Model.compile.__module__))\n")
    probe: list[Any] = []
    environ: dict[str, str] = {"TF_ENABLE_AUTO_MIXED_PRECISION_GRAPH_REWRITE": "1"}
    before = (tf.compat.v1.Session, keras.Model.compile, tf.compat.v1.train.Optimizer.minimize,
              tf.compat.v1.train.Optimizer.compute_gradients)
    import builtins
    builtins.PROBE = probe  # type: ignore[attr-defined]
    try:
        launcher.run_script(str(script), target="gpu:8.0", environ=environ, out=io.StringIO())
    finally:
        del builtins.PROBE  # type: ignore[attr-defined]
    assert probe == [("LauncherSession", "amp_rewrite.training.launcher")]
    assert environ == {}  # TensorFlow's own pass must not see the switch
    assert (tf.compat.v1.Session, keras.Model.compile, tf.compat.v1.train.Optimizer.minimize,
            tf.compat.v1.train.Optimizer.compute_gradients) == before
    assert "compile" not in keras.Model.__dict__


def test_run_says_so_when_the_script_trained_through_nothing_it_rewrites(tmp_path: pathlib.Path) -> None:
    """A script whose training loop is its own ``tf.function`` (which ``run`` cannot reach)
    ran in float32: one warning line at its end says so and names the way to rewrite it; a
    script that exits with an error gets no such line (its traceback is what matters)."""
    script = tmp_path / "custom_loop.py"
    script.write_text(
        "import sys, tensorflow as tf\n"
        "w = tf.Variable(tf.ones([16, 2]))\n"
        "@tf.function\n"
        "def step(x):\n"
        "    with tf.GradientTape() as tape:\n"
        "        loss = tf.reduce_sum(tf.matmul(x, w))\n"
        "    w.assign_sub(0.1 * tape.gradient(loss, w))\n"
        "    return loss\n"
        "step(tf.ones([4, 16]))\n"
        "if sys.argv[1:] == ['fail']:\n"
        "    sys.exit(3)\n")
    out = io.StringIO()
    assert launcher.run_script(str(script), target="gpu:8.0", environ={}, out=out) == 0
    lines = _lines(out.getvalue(), "amp-rewrite run: ")
    assert len(lines) == 1 and "warning" in lines[0] and "amp_rewrite.function" in lines[0], out.getvalue()
    out = io.StringIO()
    with pytest.raises(SystemExit):
        launcher.run_script(str(script), ["fail"], target="gpu:8.0", environ={}, out=out)
    assert "warning" not in out.getvalue()


def test_run_scales_a_script_wrapped_optimizer_once() -> None:
    uninstall = launcher.install(FP16, out=io.StringIO())
    try:
        graph = tf.Graph()
        with graph.as_default():
            w = tf.Variable(tf.ones([4, 4]))
            loss = tf.reduce_sum(tf.matmul(w, w))
            plain = tf.compat.v1.train.GradientDescentOptimizer(0.1)
            plain.minimize(loss)  # wrapped by the launcher
            own = amp_rewrite.enable_mixed_precision_graph_rewrite(
                tf.compat.v1.train.GradientDescentOptimizer(0.1), **FP16)
            own.minimize(loss)  # wrapped by the script: not wrapped again
            scales = [v.op.name for v in tf.compat.v1.global_variables()
                      if v.op.name.endswith("current_loss_scale")]
    finally:
        uninstall()
    assert len(scales) == 2, scales  # one per optimizer, not one per wrapper layer


def test_run_prints_each_function_once_in_place_of_the_log_line(caplog: Any) -> None:
    out = io.StringIO()
    uninstall = launcher.install({"target": "gpu:6.1"}, out=out)
    try:
        with caplog.at_level(logging.DEBUG, logger="amp_rewrite"):
            square = amp_rewrite.function(lambda v: tf.matmul(v, v), target="gpu:6.1")
            square(tf.ones([4, 4]))
            square(tf.ones([5, 5]))  # a second trace of the same function: no second line
    finally:
        uninstall()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("amp-rewrite run: amp_rewrite.function '<lambda>' was not rewritten")
    assert not [r for r in caplog.records
                if r.levelno >= logging.WARNING and "was not rewritten" in r.getMessage()]


@pytest.mark.parametrize("environ, message", [
    ({"TF_ENABLE_AUTO_MIXED_PRECISION": "maybe"}, "expected 1 (on) or 0 (off)"),
    ({"TF_ENABLE_AUTO_MIXED_PRECISION": "1", "TF_ENABLE_AUTO_MIXED_PRECISION_GRAPH_REWRITE": "0"},
     "disagree"),
])
def test_run_refuses_a_bad_switch_before_the_script_starts(
        tmp_path: pathlib.Path, monkeypatch: Any, capsys: Any, environ: dict[str, str],
        message: str) -> None:
    script = tmp_path / "never.py"
    script.write_text("raise SystemExit('the script ran')\n")
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    assert cli_main(["run", str(script)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("amp-rewrite: error: ") and message in err and err.count("\n") == 1
    with pytest.raises(AmpRewriteError, match="no such script"):
        launcher.check_run(str(tmp_path / "missing.py"), target="auto", precision="auto", environ={})
    with pytest.raises(AmpRewriteError):
        launcher.check_run(str(script), target="gpu:banana", precision="auto", environ={})
