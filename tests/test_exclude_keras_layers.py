"""``exclude=<Keras layer name>`` in the Keras training path, and the WARNING for a pattern that
matches nothing (audit R9).

Keras 3 opens each layer's name scope twice per call (to build it, then to call it), and
TensorFlow makes every opening unique in the traced graph: in a train step the layers
``dense``, ``dense_1``, ``dense_2`` of a ``Sequential`` put their ops under ``dense_1``,
``dense_1_2`` and ``dense_2_1``.  ``exclude="dense_1"`` used to keep the *first* layer float32
there (its scope is spelled ``dense_1``) and leave the real ``dense_1`` converted; a layer name
matching no scope at all (``head``, whose scope is ``head_1``) excluded nothing, silently.

This machine has no GPU: ``target="gpu:8.0"`` makes the rewrite convert MatMul to float16 (whose
CPU kernels TensorFlow has).  Models are tiny and each trains one step.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import amp_rewrite  # noqa: E402
from amp_rewrite.plan.exclude import NameMatcher  # noqa: E402

GPU = {"target": "gpu:8.0"}
EXCLUDE_LOGGER = "amp_rewrite.plan.exclude"


def _data(n: int = 32) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(0).standard_normal((n, 16)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int32)


def _sequential() -> Any:
    """Three Dense layers named by Keras (``dense``, ``dense_1``, ``dense_2`` in a fresh session)."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2)])


def _functional() -> Any:
    """Three Dense layers with names of our own, one of them another's name plus ``_1``."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input((16,))
    h = keras.layers.Dense(32, activation="relu", name="d1")(inputs)
    h = keras.layers.Dense(32, activation="relu", name="d1_1")(h)
    return keras.Model(inputs, keras.layers.Dense(2, name="head")(h), name="net")


def _trained(model: Any, exclude: Any) -> Any:
    """``model`` compiled with the rewrite's optimizer and trained one step."""
    opt = amp_rewrite.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1), exclude=exclude, **GPU)
    model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = _data()
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    return model


def _nodes(report: dict) -> dict[str, dict]:
    """Every node of a rewrite report, the main graph's in graph order, then the functions'."""
    out = dict(report["nodes"])
    for fn in report["functions"].values():
        out.update(fn["nodes"])
    return out


def _matmuls_by_layer(report: dict, layers: list[str]) -> dict[str, dict[str, str]]:
    """``{layer: {node: dtype}}`` for the MatMuls of each Dense layer of ``layers`` (in call
    order): its forward MatMul and the gradient MatMuls of that MatMul.

    Found without the naming rule under test: the forward MatMuls, in graph (creation) order,
    are the layers' in call order, and TensorFlow names a gradient op after the forward op it
    differentiates (``gradient_tape/<forward op>/...``)."""
    nodes = _nodes(report)
    forward = [n for n, e in report["nodes"].items()
               if e["op"] == "MatMul" and not n.startswith("gradient_tape/")]
    assert len(forward) == len(layers), forward
    out = {}
    for layer, op in zip(layers, forward):
        grads = {n: e["dtype"] for n, e in nodes.items()
                 if e["op"] == "MatMul" and n.startswith(f"gradient_tape/{op}/")}
        out[layer] = {op: nodes[op]["dtype"], **grads}
    return out


def _check_only(report: dict, layers: list[str], excluded: str, *, gradients: bool = True) -> None:
    """Exactly the layer ``excluded`` keeps its MatMuls float32; every other layer's are float16."""
    by_layer = _matmuls_by_layer(report, layers)
    for layer, dtypes in by_layer.items():
        # The first layer's input has no gradient; the others' have two MatMuls, kernel and input.
        if gradients:
            assert len(dtypes) >= 2, (layer, dtypes)
        want = "float32" if layer == excluded else "float16"
        assert set(dtypes.values()) == {want}, (excluded, layer, dtypes)
    forward = next(iter(by_layer[excluded]))
    reason = report["nodes"][forward]["reason"]
    assert reason.startswith(f"preserved: excluded by --exclude {excluded!r}"), reason
    assert f"Keras layer {excluded!r}" in reason, reason


@pytest.mark.parametrize("index", [0, 1, 2])
def test_sequential_train_step_excludes_the_named_layer(index):
    model = _sequential()
    layers = [layer.name for layer in model.layers]
    assert layers == ["dense", "dense_1", "dense_2"]
    _trained(model, layers[index])
    report = model.train_function.amp_function.rewrite_results[0].report
    _check_only(report, layers, layers[index])
    assert report["excluded"][layers[index]] > 0
    # The layers' scopes were read while tracing, through wrappers that are gone now.
    assert all("_open_name_scope" not in vars(layer) for layer in [model, *model.layers])


@pytest.mark.parametrize("name", ["d1", "d1_1", "head"])
def test_functional_train_step_excludes_the_named_layer(name):
    keras.backend.clear_session()
    model = _functional()
    layers = ["d1", "d1_1", "head"]
    _trained(model, name)
    report = model.train_function.amp_function.rewrite_results[0].report
    _check_only(report, layers, name)


def test_predict_step_excludes_the_named_layer():
    model = _trained(_sequential(), "dense_1")
    model.predict(_data()[0], batch_size=32, verbose=0)
    report = model.predict_function.amp_function.rewrite_results[0].report
    _check_only(report, ["dense", "dense_1", "dense_2"], "dense_1", gradients=False)


def test_a_regex_and_a_whole_name_still_match_as_documented():
    # A regex over layer names takes every layer it matches, scopes spelled as Keras 3 did.
    model = _trained(_functional(), "d1.*")
    report = model.train_function.amp_function.rewrite_results[0].report
    by_layer = _matmuls_by_layer(report, ["d1", "d1_1", "head"])
    assert {layer: set(d.values()) for layer, d in by_layer.items()} == \
        {"d1": {"float32"}, "d1_1": {"float32"}, "head": {"float16"}}
    # A whole node name is the name as the graph spells it.
    model = _trained(_functional(), ".*/MatMul")
    report = model.train_function.amp_function.rewrite_results[0].report
    forward = [n for n, e in report["nodes"].items() if e["op"] == "MatMul" and not n.startswith("gradient_tape/")]
    assert {report["nodes"][n]["dtype"] for n in forward} == {"float32"}


def test_recorded_scopes_name_layers_and_leave_other_components_alone():
    scopes = {"sequential_1": "sequential", "sequential_1/dense_1": "dense", "sequential_1/dense_1_2": "dense_1"}
    matcher = NameMatcher.compile(["dense_1"]).bind_layer_scopes(scopes)
    assert matcher.match("sequential_1/dense_1_2/MatMul") == ("dense_1", "dense_1_2")
    assert matcher.match("gradient_tape/sequential_1/dense_1_2/MatMul/MatMul_1") == ("dense_1", "dense_1_2")
    assert matcher.match("sequential_1/dense_1/MatMul") is None  # the layer dense
    assert matcher.match("gradient_tape/sequential_1/dense_1/MatMul/MatMul") is None
    # A component no recorded scope ends is compared as it is, whatever the graph.
    assert matcher.match("SGD/dense_1/update") == ("dense_1", "dense_1")
    assert NameMatcher.compile(["MatMul"]).bind_layer_scopes(scopes).match("sequential_1/dense_1/MatMul_1") is None
    # Bound or not, a matcher is the same patterns (the report counts them by their text).
    assert matcher == NameMatcher.compile("dense_1") and NameMatcher.compile(matcher) is matcher


def _unmatched_warnings(caplog: Any, pattern: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.name == EXCLUDE_LOGGER and repr(pattern) in r.getMessage()]


def test_a_pattern_matching_nothing_is_warned_about_in_the_keras_path(caplog):
    caplog.set_level(logging.WARNING, logger="amp_rewrite")
    model = _trained(_sequential(), ["dense_1", "head"])
    report = model.train_function.amp_function.rewrite_results[0].report
    assert report["excluded"]["head"] == 0 and report["excluded"]["dense_1"] > 0
    warned = _unmatched_warnings(caplog, "head")
    assert len(warned) == 1, warned  # once for the train step, however many graphs it rewrote
    assert "Keras train step of model 'sequential'" in warned[0] and "matches no node" in warned[0]
    assert not _unmatched_warnings(caplog, "dense_1")


def test_a_pattern_matching_nothing_is_warned_about_in_the_api(caplog):
    caplog.set_level(logging.WARNING, logger="amp_rewrite")

    @tf.function
    def f(x, w):
        return tf.matmul(x, w)

    gd = f.get_concrete_function(tf.TensorSpec([4, 4]), tf.TensorSpec([4, 4])).graph.as_graph_def()
    result = amp_rewrite.rewrite_graph_def(gd, exclude=["MatMul", "nothing_here"], use_env=False, **GPU)
    assert result.report["excluded"] == {"MatMul": 1, "nothing_here": 0}
    assert len(_unmatched_warnings(caplog, "nothing_here")) == 1
    assert not _unmatched_warnings(caplog, "MatMul")


def test_overlapping_recordings_from_two_threads_leave_no_wrapper_behind():
    """Two threads tracing the same model at once (a serving thread's predict while fit traces
    its step), entering and leaving in the order A in, B in, A out, B out: the wrapper stays
    while either needs it, and none is left on the layers after both."""
    import threading

    import keras

    from amp_rewrite.training.keras_optimizer import _recorded_layer_scopes

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="d")])
    layer = model.layers[0]
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []

    def a() -> None:
        with _recorded_layer_scopes(model):
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def b() -> None:
        a_in.wait(10)
        with _recorded_layer_scopes(model):
            b_in.set()
            a_out.wait(10)
            seen.append("_open_name_scope" in layer.__dict__)  # A left; B still needs it

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert seen == [True]
    assert "_open_name_scope" not in layer.__dict__ and "_open_name_scope" not in model.__dict__
