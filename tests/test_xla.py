"""XLA: the rewritten graph runs compiled where asked (issue 22), and the cost model knows it.

* ``amp_rewrite.function(jit_compile=True)``: the runner is compiled, and falls back with one
  WARNING where XLA has no kernel for an op;
* Keras: ``model.compile(jit_compile=...)`` with ``enable_mixed_precision_graph_rewrite``
  compiles the rewritten train step exactly when Keras resolves ``jit_compile`` to True;
* offline: ``amp-rewrite rewrite --xla`` marks a SavedModel's served functions;
* the cost model's ``compiled`` pricing (Casts fused) changes plans only when asked.

XLA runs on the CPU, so all of this runs here.  That XLA really compiled the rewritten
graphs is checked from XLA's own dumps: a subprocess (``python tests/test_xla.py DIR MODEL``)
runs the three paths with ``XLA_FLAGS=--xla_dump_to=...``, and the test looks for the HLO
modules XLA compiled, named after the rewritten functions, with their float16 converts.
XLA reads its flags once per process, hence the subprocess.  The graphs are rewritten for
``gpu:8.0`` in float16, as in ``tests/test_training.py``: TensorFlow and XLA both have CPU
float16 kernels for these ops.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import re
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import amp_rewrite  # noqa: E402
from amp_rewrite.cli import main as cli_main  # noqa: E402
from amp_rewrite.errors import AmpRewriteError  # noqa: E402
from amp_rewrite.models.saved_model import rewrite_saved_model  # noqa: E402

TARGET = {"target": "gpu:8.0", "precision": "float16"}
HERE = pathlib.Path(__file__).resolve()


# -- shared pieces (also run by the evidence subprocess) ------------------------------------------

def _step_function(jit_compile: bool | None) -> tuple[Any, Any, Any]:
    """A small training step (MatMul, ReLU, gradient, variable update) under amp_rewrite."""
    w = tf.Variable(np.random.default_rng(1).standard_normal((32, 32)).astype(np.float32) * 0.1)

    def amp_step(x: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.nn.relu(tf.matmul(x, w)) - 1.0))
        w.assign_sub(0.1 * tape.gradient(loss, w))
        return loss

    x = tf.constant(np.random.default_rng(2).standard_normal((16, 32)).astype(np.float32))
    return amp_rewrite.function(amp_step, jit_compile=jit_compile, **TARGET), w, x


def _regression_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 16)).astype(np.float32)
    y = (x @ rng.standard_normal((16, 1)).astype(np.float32)).astype(np.float32)
    return x, y


def _keras_fit(jit_compile: Any, epochs: int = 3) -> tuple[Any, list[float]]:
    """A two-layer MLP fitted with the rewrite; returns the model and the loss per epoch."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(1)])
    opt = amp_rewrite.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.05), **TARGET)
    model.compile(optimizer=opt, loss="mse", jit_compile=jit_compile)
    x, y = _regression_data()
    history = model.fit(x, y, batch_size=32, epochs=epochs, shuffle=False, verbose=0)
    return model, history.history["loss"]


def _export_model(path: pathlib.Path) -> None:
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(8)])
    model.export(str(path), verbose=False)


def _model_input() -> Any:
    return tf.constant(np.random.default_rng(4).standard_normal((8, 16)).astype(np.float32))


def _xla_marked(model_dir: pathlib.Path) -> dict[str, bool]:
    """FunctionDef name -> whether it carries ``_XlaMustCompile=true``."""
    from tensorflow.core.protobuf import saved_model_pb2

    sm = saved_model_pb2.SavedModel()
    sm.ParseFromString((model_dir / "saved_model.pb").read_bytes())
    return {f.signature.name: bool(f.attr["_XlaMustCompile"].b) if "_XlaMustCompile" in f.attr else False
            for f in sm.meta_graphs[0].graph_def.library.function}


# -- 1. amp_rewrite.function(jit_compile=...) ----------------------------------------------------

def test_function_jit_compile_runs_the_rewritten_graph_compiled() -> None:
    step, w, x = _step_function(jit_compile=True)
    plain, w_plain, _ = _step_function(jit_compile=None)
    losses = [float(step(x)) for _ in range(5)]
    plain_losses = [float(plain(x)) for _ in range(5)]
    report = step.rewrite_results[0].report
    assert report["converted_nodes"] > 0 and report["casts_to_low"] > 0
    assert step.jit_compile is True and step.xla_compiled() == [True]
    assert plain.xla_compiled() == [False]
    # What TensorFlow runs is the runner, and the runner's FunctionDef is XLA's to compile.
    runner = next(iter(step._runners.values()))  # noqa: SLF001
    executed = runner._run._list_all_concrete_functions()  # noqa: SLF001
    assert executed and all(c.function_def.attr["_XlaMustCompile"].b for c in executed)
    plain_runner = next(iter(plain._runners.values()))  # noqa: SLF001
    assert all("_XlaMustCompile" not in c.function_def.attr
               for c in plain_runner._run._list_all_concrete_functions())  # noqa: SLF001
    # XLA's own HLO of the runner holds the rewrite: converts to f16 feeding an f16 dot.
    hlo = runner._run.experimental_get_compiler_ir(x)(stage="hlo")  # noqa: SLF001
    assert re.search(r"f16\[[0-9,]*\][^\n]*convert\(", hlo)
    assert re.search(r"f16\[[0-9,]*\][^\n]* dot\(", hlo)
    # The variable is the model's own: it moved, the loss fell, and as it does without XLA.
    assert losses[-1] < losses[0]
    np.testing.assert_allclose(losses, plain_losses, rtol=2e-3)
    np.testing.assert_allclose(w.numpy(), w_plain.numpy(), rtol=2e-3, atol=1e-4)


def test_function_without_an_xla_kernel_falls_back_with_one_warning(caplog: Any) -> None:
    w = tf.Variable(np.eye(8, dtype=np.float32))

    @amp_rewrite.function(jit_compile=True, **TARGET)
    def doubled(x: Any) -> Any:
        y = tf.py_function(lambda a: a * 2.0, [x], tf.float32)  # no XLA kernel
        y.set_shape(x.shape)
        return tf.matmul(y, w)

    x = tf.constant(np.arange(16, dtype=np.float32).reshape(2, 8))
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        first, second = doubled(x), doubled(x)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "XLA cannot compile" in warnings[0].getMessage()
    assert "EagerPyFunc" in warnings[0].getMessage()  # the reason names the op
    np.testing.assert_allclose(first.numpy(), 2.0 * x.numpy(), rtol=1e-2)
    np.testing.assert_array_equal(first.numpy(), second.numpy())
    assert doubled.xla_compiled() == [False]
    runner = next(iter(doubled._runners.values()))  # noqa: SLF001
    assert "EagerPyFunc" in (runner.xla_fallback_reason or "")
    assert doubled.rewrite_results[0].report["converted_nodes"] > 0


def test_function_rejects_a_bad_jit_compile() -> None:
    with pytest.raises(AmpRewriteError, match="jit_compile"):
        amp_rewrite.function(lambda x: x, jit_compile="yes")


def test_jit_compile_plans_for_xla_unless_told_otherwise() -> None:
    compiled, _, x = _step_function(jit_compile=True)
    compiled(x)
    runner = next(iter(compiled._runners.values()))  # noqa: SLF001
    assert compiled._plan_options(runner.concrete)["compiled"] is True  # noqa: SLF001
    explicit = amp_rewrite.function(lambda v: v * 2.0, jit_compile=True, compiled=False, **TARGET)
    concrete = explicit.get_concrete_function(x)
    assert explicit._plan_options(concrete)["compiled"] is False  # noqa: SLF001


# -- 2. Keras ------------------------------------------------------------------------------------

def test_keras_jit_compile_true_compiles_the_rewritten_train_step() -> None:
    model, losses = _keras_fit(jit_compile=True)
    step = model.train_function.amp_function
    assert model.jit_compile is True
    assert step.jit_compile is True and step.xla_compiled() == [True]
    report = step.rewrite_results[0].report
    assert report["converted_nodes"] > 0 and report["skipped"] is None
    assert {op.get_attr("T").name for g in step.executed_graphs() for op in g.get_operations()
            if op.type == "MatMul"} == {"float16"}
    assert losses[-1] < 0.5 * losses[0]
    _, plain_losses = _keras_fit(jit_compile=False)
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-2)


def test_keras_jit_compile_false_and_auto_follow_keras(monkeypatch: Any) -> None:
    model, _ = _keras_fit(jit_compile=False, epochs=1)
    step = model.train_function.amp_function
    assert step.jit_compile is False and step.xla_compiled() == [False]
    # "auto" is Keras's to resolve (on this CPU-only machine: no XLA)...
    model, _ = _keras_fit(jit_compile="auto", epochs=1)
    assert model.jit_compile is False
    assert model.train_function.amp_function.xla_compiled() == [False]
    # ...and where Keras resolves it to XLA (as with a GPU), the rewritten step is compiled.
    monkeypatch.setattr(keras.Model, "_resolve_auto_jit_compile", lambda self: True)
    model, losses = _keras_fit(jit_compile="auto", epochs=1)
    assert model.jit_compile is True
    assert model.train_function.amp_function.xla_compiled() == [True]
    assert np.isfinite(losses).all()


@pytest.mark.parametrize("gpu", [True, False])
def test_keras_overflow_skip_compiles_to_selects_on_a_gpu(gpu: bool, monkeypatch: Any) -> None:
    """Traced for XLA on a GPU, the skip-on-overflow decision of our Keras loss-scale
    optimizer becomes selects: XLA keeps a conditional with an empty branch, and on a GPU
    that is a host round trip before the update (our ResNet50 step on an H200 kept one,
    bench/gpu_runs/2026-11-26-h200).  On a CPU the conditional stays, where it is cheaper.
    The decision holds either way.  (No GPU here: its presence is what the optimizer asks
    TensorFlow, so the test answers for it.)"""
    import amp_rewrite.training.keras_optimizer as keras_optimizer

    real = tf.config.list_logical_devices
    monkeypatch.setattr(keras_optimizer.tf.config, "list_logical_devices",
                        lambda kind=None: ["/GPU:0"] if kind == "GPU" and gpu else real(kind))
    opt = amp_rewrite.enable_mixed_precision_graph_rewrite(
        keras.optimizers.SGD(0.1, momentum=0.9), **TARGET)
    w = [tf.Variable(np.ones((8, 8), np.float32)), tf.Variable(np.ones((8,), np.float32))]
    opt.build(w)

    @tf.function(jit_compile=True)
    def apply(g0: Any, g1: Any) -> Any:
        opt.apply([g0, g1], w)
        return opt.current_loss_scale

    g0, g1 = tf.ones((8, 8)), tf.ones((8,))
    hlo = apply.experimental_get_compiler_ir(g0, g1)(stage="optimized_hlo")
    assert ("conditional(" in hlo) is not gpu
    scale = float(apply(g0, g1))
    assert scale == 2.0 ** 15 and int(opt.skipped_steps) == 0
    assert (w[1].numpy() < 1.0).all()  # applied
    before = [v.numpy().copy() for v in w]
    assert float(apply(g0, g1 * np.nan)) == scale / 2  # skipped: halved...
    assert int(opt.skipped_steps) == 1
    for v, b in zip(w, before):  # ...and nothing applied, momentum included
        np.testing.assert_array_equal(v.numpy(), b)
    float(apply(g0, g1))
    assert not np.array_equal(w[1].numpy(), before[1]) and int(opt.skipped_steps) == 1


@pytest.mark.parametrize("gpu", [True, False])
def test_tf1_optimizer_overflow_skip_compiles_to_selects_on_a_gpu(gpu: bool, monkeypatch: Any) -> None:
    """The same for a TF1 optimizer wrapped by ``enable_mixed_precision_graph_rewrite`` and
    applied in a ``tf.function(jit_compile=True)``."""
    real = tf.config.list_logical_devices
    monkeypatch.setattr(tf.config, "list_logical_devices",
                        lambda kind=None: ["/GPU:0"] if kind == "GPU" and gpu else real(kind))
    opt = amp_rewrite.enable_mixed_precision_graph_rewrite(
        tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), **TARGET)
    w = [tf.Variable(np.ones((8, 8), np.float32)), tf.Variable(np.ones((8,), np.float32))]

    @tf.function(jit_compile=True)
    def apply(g0: Any, g1: Any) -> Any:
        opt.apply_gradients(zip([g0, g1], w))
        return opt.current_loss_scale

    g0, g1 = tf.ones((8, 8)), tf.ones((8,))
    hlo = apply.experimental_get_compiler_ir(g0, g1)(stage="optimized_hlo")
    assert ("conditional(" in hlo) is not gpu
    scale = float(apply(g0, g1))
    assert int(opt.skipped_steps) == 0 and (w[1].numpy() < 1.0).all()
    before = [v.numpy().copy() for v in w]
    assert float(apply(g0, g1 * np.nan)) == scale / 2 and int(opt.skipped_steps) == 1
    for v, b in zip(w, before):
        np.testing.assert_array_equal(v.numpy(), b)


# -- 3. offline: rewrite --xla -------------------------------------------------------------------

@pytest.fixture(scope="module")
def exported(tmp_path_factory: Any) -> pathlib.Path:
    path = tmp_path_factory.mktemp("xla") / "float32"
    _export_model(path)
    return path


@pytest.fixture(scope="module")
def xla_model(exported: pathlib.Path) -> tuple[pathlib.Path, dict[str, Any]]:
    out = exported.parent / "xla"
    report = rewrite_saved_model(exported, out, xla=True, **TARGET)
    return out, report


def test_rewrite_xla_marks_the_served_functions(exported: pathlib.Path,
                                                xla_model: tuple[pathlib.Path, dict[str, Any]]) -> None:
    out, report = xla_model
    assert report["converted_nodes"] > 0 and report["casts_to_low"] > 0
    marked = _xla_marked(out)
    (names,) = report["xla"]["compiled_functions"].values()
    assert names and all(marked[n] for n in names)
    assert any("signature_wrapper" in n for n in names) and any("__call__" in n for n in names)
    # Only what is served: the checkpoint's save/restore functions are left alone.
    assert not any(v for k, v in marked.items() if "traced_save" in k or "traced_restore" in k)
    assert not any(_xla_marked(exported).values())  # the input is untouched
    loaded, original = tf.saved_model.load(str(out)), tf.saved_model.load(str(exported))
    x = _model_input()
    want = original.serve(x).numpy()
    np.testing.assert_allclose(loaded.serve(x).numpy(), want, rtol=2e-2, atol=2e-2)
    signature = loaded.signatures["serving_default"]
    (arg,) = signature.structured_input_signature[1]  # Keras numbers its input's name
    got = signature(**{arg: x})
    np.testing.assert_allclose(next(iter(got.values())).numpy(), want, rtol=2e-2, atol=2e-2)


def test_cli_xla_flag_marks_the_served_functions(exported: pathlib.Path, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "cli"
    assert cli_main(["rewrite", "--xla", "--target", "gpu:8.0", "-q", str(exported), str(out)]) == 0
    assert any(_xla_marked(out).values())


# -- evidence: XLA's own dumps ------------------------------------------------------------------

def _saved_model_bytes(model_dir: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(model_dir)): p.read_bytes() for p in sorted(model_dir.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("min_gain", [0.0, 0.99])
def test_autotune_under_xla_times_every_graph_compiled_and_marks_what_it_writes(
        exported: pathlib.Path, tmp_path: pathlib.Path, min_gain: float, monkeypatch: Any) -> None:
    """``--xla --autotune``: the candidates and float32 are timed as they would be served,
    marked for XLA (every SavedModel autotune loads has its served functions marked), and
    what is written is marked, the float32 model too when it is kept (``min_gain`` 0.99: no
    rewrite can win); the input is untouched."""
    from amp_rewrite.autotune import AutotuneOptions
    from amp_rewrite.autotune import model_files

    timed: list[bool] = []
    runner = model_files._saved_model_runner

    def recording_runner(path: str, *args: Any) -> Any:
        timed.append(any(_xla_marked(pathlib.Path(path)).values()))
        return runner(path, *args)

    monkeypatch.setattr(model_files, "_saved_model_runner", recording_runner)
    before = _saved_model_bytes(exported)
    out = tmp_path / "tuned"
    opts = AutotuneOptions(repeats=5, steps=2, sessions=1, max_repeats=5, batch=8, min_gain=min_gain)
    report = rewrite_saved_model(exported, out, xla=True, autotune=opts, **TARGET)
    tuned = report["autotune"]
    assert tuned["xla"] is True and tuned["rounds"] == 5
    assert len(timed) >= 2 and all(timed)  # float32 and at least one rewrite, each compiled
    assert set(tuned["step_ms"]) >= {"float32", "tensorflow"}
    (names,) = report["xla"]["compiled_functions"].values()
    marked = _xla_marked(out)
    assert names and all(marked[n] for n in names)
    if min_gain == 0.99:
        assert tuned["choice"] == "float32" and report["converted_nodes"] == 0 and "autotune" in report["skipped"]
    x = _model_input()
    original, loaded = tf.saved_model.load(str(exported)), tf.saved_model.load(str(out))  # kept alive
    np.testing.assert_allclose(loaded.serve(x).numpy(), original.serve(x).numpy(), rtol=2e-2, atol=2e-2)
    assert _saved_model_bytes(exported) == before  # the input is untouched, unmarked


def test_autotune_under_xla_times_only_a_signature_it_marks(exported: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """``--signatures`` limits what is marked for XLA: timing another signature would measure
    it uncompiled, so autotune refuses before any work (and writes nothing)."""
    from amp_rewrite.autotune import AutotuneOptions

    with pytest.raises(AmpRewriteError, match="without XLA"):
        rewrite_saved_model(exported, tmp_path / "t", xla=True, signatures=["serve"],
                            autotune=AutotuneOptions(signature="serving_default"), **TARGET)
    assert not (tmp_path / "t").exists()


def test_a_tuner_written_before_xla_still_works_without_it(exported: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """The Autotuner protocol's ``tune_model`` gains ``xla``; a tuner without that keyword
    (any object with the protocol's methods) is only ever passed it under ``--xla``."""
    class KeepFloat32:
        max_rel_error = None
        min_gain = 0.02

        def check(self) -> None:
            pass

        def tune_model(self, model: Any, *, tags: Any = None, **rewrite_options: Any) -> Any:
            assert "xla" not in rewrite_options

            class Kept:
                rewrite, rel_error, rounds = None, {}, 5

                def as_dict(self) -> dict[str, Any]:
                    return {"choice": "float32"}

            return Kept()

    report = rewrite_saved_model(exported, tmp_path / "t", autotune=KeepFloat32(), **TARGET)
    assert report["autotune"] == {"choice": "float32"} and report["converted_nodes"] == 0


@pytest.mark.parametrize("autotune", [False, True])
def test_xla_refuses_a_frozen_graph_which_has_no_functions_to_mark(tmp_path: pathlib.Path, autotune: bool) -> None:
    from amp_rewrite.autotune import AutotuneOptions

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 4], name="x")
        tf.identity(tf.matmul(x, x), name="out")
    pb = tmp_path / "frozen.pb"
    pb.write_bytes(graph.as_graph_def().SerializeToString())
    with pytest.raises(AmpRewriteError, match="--xla"):
        rewrite_saved_model(pb, tmp_path / "o.pb", xla=True, autotune=AutotuneOptions() if autotune else None,
                            **TARGET)
    assert not (tmp_path / "o.pb").exists()


def _evidence_run(dump_dir: str, model_dir: str) -> dict[str, Any]:
    """Run the three compiled paths (and one uncompiled control) in this process; XLA dumps
    what it compiles to ``dump_dir`` (set through XLA_FLAGS by the caller)."""
    out: dict[str, Any] = {}
    step, _, x = _step_function(jit_compile=True)
    out["function_losses"] = [float(step(x)) for _ in range(3)]
    control, _, _ = _step_function(jit_compile=None)
    control.__name__ = "uncompiled_control"  # names its runner amp_rewrite_uncompiled_control
    out["control_loss"] = float(control(x))
    out["control_runner"] = [g.name for g in control.executed_graphs()]
    model, losses = _keras_fit(jit_compile=True, epochs=2)
    out["keras_losses"] = losses
    out["keras_converted"] = model.train_function.amp_function.rewrite_results[0].report["converted_nodes"]
    loaded = tf.saved_model.load(model_dir)
    out["served"] = loaded.serve(_model_input()).numpy().tolist()
    return out


@pytest.fixture(scope="module")
def xla_dumps(tmp_path_factory: Any,
              xla_model: tuple[pathlib.Path, dict[str, Any]]) -> tuple[dict[str, str], dict[str, Any]]:
    dump = tmp_path_factory.mktemp("xla_dump")
    env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={dump}", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, str(HERE), str(dump), str(xla_model[0])], env=env,
                          capture_output=True, text=True, timeout=300, cwd=HERE.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    modules = {p.name: p.read_text() for p in dump.glob("*before_optimizations.txt")}
    return modules, results


def _compiled_modules(modules: dict[str, str], name: str) -> list[str]:
    return [text for fname, text in modules.items() if re.search(rf"\.a_inference_{name}", fname)]


def _has_f16_convert(hlo: str) -> bool:
    return re.search(r"= f16\[[0-9,]*\]\{[0-9,]*\} convert\(", hlo) is not None


def test_xla_really_compiled_the_rewritten_graphs(xla_dumps: tuple[dict[str, str], dict[str, Any]]) -> None:
    modules, results = xla_dumps
    # amp_rewrite.function(jit_compile=True): the runner, named after the step.
    function = _compiled_modules(modules, "amp_rewrite_amp_step")
    assert function and all(_has_f16_convert(m) for m in function), sorted(modules)
    # The uncompiled control ran too, and XLA compiled nothing of it.
    assert any("amp_rewrite_uncompiled_control" in name for name in results["control_runner"])
    assert not _compiled_modules(modules, "amp_rewrite_uncompiled_control")
    assert np.isfinite(results["control_loss"])
    # Keras fit with jit_compile=True: the rewritten train step.
    keras_step = _compiled_modules(modules, "amp_rewrite_one_step_on_data")
    assert keras_step and all(_has_f16_convert(m) for m in keras_step), sorted(modules)
    assert results["keras_converted"] > 0
    assert results["keras_losses"][-1] < results["keras_losses"][0]
    # The SavedModel rewritten with --xla: its serve function, loaded and called.
    served = _compiled_modules(modules, "__call__")
    assert served and all(_has_f16_convert(m) for m in served), sorted(modules)
    assert results["function_losses"][-1] < results["function_losses"][0]
    assert np.isfinite(results["served"]).all()


# -- 4. the cost model under XLA ----------------------------------------------------------------

def _chain_between_matmuls(n: int = 256) -> Any:
    """x @ w1 -> BiasAdd -> Relu -> Mul -> @ w2: an element-wise chain between two MatMuls."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [n, n], name="x")
        w1 = tf.compat.v1.placeholder(tf.float32, [n, n], name="w1")
        w2 = tf.compat.v1.placeholder(tf.float32, [n, n], name="w2")
        b = tf.compat.v1.placeholder(tf.float32, [n], name="b")
        h = tf.nn.relu(tf.nn.bias_add(tf.matmul(x, w1, name="mm1"), b, name="bias"), name="relu")
        y = tf.matmul(tf.multiply(h, 0.5, name="scale"), w2, name="mm2")
        tf.identity(y, name="out")
    return graph.as_graph_def()


CHAIN = ("mm1", "bias", "relu", "scale", "mm2")


def test_compiled_planner_converts_a_chain_it_keeps_float32_unfused() -> None:
    graph_def = _chain_between_matmuls(768)
    unfused = amp_rewrite.rewrite_graph_def(graph_def, lists="optimal", **TARGET).report
    fused = amp_rewrite.rewrite_graph_def(graph_def, lists="optimal", compiled=True, **TARGET).report
    # Without XLA four Cast kernels, each ~2 us plus reading and writing its tensor, and the
    # element-wise kernels between cost more than two 768x768 MatMuls gain on Tensor Cores.
    assert {unfused["nodes"][n]["dtype"] for n in CHAIN} == {"float32"}
    assert unfused["converted_nodes"] == 0
    # Under XLA the Casts of the chain fuse and cost the bytes they write (those of the inputs,
    # buffers no kernel makes, launch one each): the whole chain converts.
    assert {fused["nodes"][n]["dtype"] for n in CHAIN} == {"float16"}
    assert fused["converted_nodes"] >= len(CHAIN) and fused["casts_to_low"] > 0
    # float16 runs the products at about twice TF32's rate (gpu:8.0's float32); the Casts'
    # bytes and launches and the element-wise ops' bytes remain.
    est = fused["placement"]["estimated_us"]
    assert est["optimal"] < 0.8 * est["float32"]


def test_compiled_planner_keeps_small_matmuls_whose_weight_casts_are_kernels() -> None:
    """Under XLA a convert fuses into the element-wise kernel next to it, but a buffer read
    (a variable each step, an input) has no kernel to fuse into, nor has a GEMM: each Cast of
    one is a kernel of its own, about 2 us.  Two 256x256 MatMuls gain less than their four
    input Casts launch, so the chain stays float32 (it converted while Casts were only bytes)."""
    report = amp_rewrite.rewrite_graph_def(_chain_between_matmuls(256), lists="optimal", compiled=True,
                                           **TARGET).report
    assert {report["nodes"][n]["dtype"] for n in CHAIN} == {"float32"}
    assert report["converted_nodes"] == 0


def _matmul_then(n: int, tail: bool) -> Any:
    """x @ w, fetched; with ``tail``, through LeakyRelu -> Tanh -> Softsign first (three
    element-wise ops no GPU class has measured kernels of)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [n, n], name="x")
        w = tf.compat.v1.placeholder(tf.float32, [n, n], name="w")
        h = tf.matmul(x, w, name="mm")
        if tail:
            h = tf.nn.softsign(tf.tanh(tf.nn.leaky_relu(h, name="leaky"), name="tanh"), name="softsign")
        tf.identity(h, name="out")
    return graph.as_graph_def()


def test_compiled_planner_counts_the_bytes_every_fused_op_saves() -> None:
    """Without XLA the planner takes no gain from converting element-wise ops whose kernels
    its class never measured (a guess is not worth a Cast).  Under XLA each one is fused and
    costs the bytes of its output, as a Cast does: converting the tail saves half of them, and
    the estimated gain over float32 grows by that much."""
    from amp_rewrite.plan.cost_model import DEVICE_COSTS

    n = 2048
    gain = {}
    for tail in (False, True):
        for compiled in (False, True):
            report = amp_rewrite.rewrite_graph_def(_matmul_then(n, tail), lists="optimal", fetches=["out"],
                                                   compiled=compiled, **TARGET).report
            assert report["nodes"]["mm"]["dtype"] == "float16"
            if tail:
                assert {report["nodes"][m]["dtype"] for m in ("leaky", "tanh", "softsign")} == {"float16"}
            est = report["placement"]["estimated_us"]
            gain[tail, compiled] = est["float32"] - est["optimal"]
    assert gain[True, False] == pytest.approx(gain[False, False])  # unfused: the tail is not priced
    halved = 3 * n * n * (4 - 2) / DEVICE_COSTS["gpu-ampere"].bandwidth / 1e3  # us
    assert gain[True, True] - gain[False, True] > 0.5 * halved


def test_compiled_false_leaves_every_plan_byte_identical() -> None:
    graph_def = _chain_between_matmuls(2048)  # large enough that the unfused plan converts (TF32)
    for lists in ("optimal", "default"):
        default = amp_rewrite.rewrite_graph_def(graph_def, lists=lists, **TARGET)
        explicit = amp_rewrite.rewrite_graph_def(graph_def, lists=lists, compiled=False, **TARGET)
        assert default.report["converted_nodes"] > 0
        assert (default.graph_def.SerializeToString(deterministic=True)
                == explicit.graph_def.SerializeToString(deterministic=True))
        assert json.dumps(default.report, sort_keys=True) == json.dumps(explicit.report, sort_keys=True)
    # The greedy planner has no cost model: compiled changes nothing there at all.
    greedy = amp_rewrite.rewrite_graph_def(graph_def, compiled=True, **TARGET)
    assert (greedy.graph_def.SerializeToString(deterministic=True)
            == amp_rewrite.rewrite_graph_def(graph_def, **TARGET).graph_def.SerializeToString(deterministic=True))


def test_compiled_cost_model_prices_fusion() -> None:
    from amp_rewrite.plan.cost_model import DEVICE_COSTS, cast_cost, node_cost

    gpu, cpu = DEVICE_COSTS["gpu-ampere"], DEVICE_COSTS["cpu-avx512-bf16"]
    shape = (256, 256)
    # A fused Cast: no launch, only its low-precision copy written once.
    assert cast_cost(shape, 2, gpu, compiled=True) == pytest.approx(256 * 256 * 2 / gpu.bandwidth)
    assert cast_cost(shape, 2, gpu) >= gpu.op_overhead > 10 * cast_cost(shape, 2, gpu, compiled=True)
    assert cast_cost(None, 2, cpu, compiled=True) < cpu.op_overhead  # no fixed cost, even unsized
    # A fused element-wise op moves its output once, and converting halves those bytes.
    add = node_cost("AddV2", [shape, shape], [shape], 2, gpu, compiled=True)
    assert add.high == pytest.approx(256 * 256 * 4 / gpu.bandwidth) and add.low == pytest.approx(add.high / 2)
    # Its arithmetic (Erfc's compute factor on the CPU) stays: XLA does it in float32 registers.
    erfc = node_cost("Erfc", [shape], [shape], 2, cpu, compiled=True)
    assert erfc.high - erfc.low == pytest.approx(256 * 256 * 2 / cpu.bandwidth)
    assert erfc.low > erfc.high / 2
    # Dense ops are priced as without XLA.
    mm = [(256, 256), (256, 256)], [(256, 256)]
    assert node_cost("MatMul", *mm, 2, gpu, compiled=True) == node_cost("MatMul", *mm, 2, gpu)


if __name__ == "__main__":  # the evidence subprocess: python tests/test_xla.py DUMP_DIR MODEL_DIR
    print(json.dumps(_evidence_run(sys.argv[1], sys.argv[2])))
