"""Autotuning: candidates timed against float32 on this machine, the fastest kept.

Which candidate wins depends on the machine, so the tests assert what holds whatever wins:
the choice is the fastest admissible measurement, its graph is the one written, outputs
stay close to float32, inputs are untouched, and bad settings fail before any output.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import amp_rewrite
from amp_rewrite.autotune import (
    AutotuneOptions,
    Comparison,
    _decide,
    _measure,
    _tune,
    candidate_options,
    default_max_repeats,
    relative_error,
    sign_test_p,
)
from amp_rewrite.cli import main
from graphs import graph_def, run, v1

CPU_BF16 = ["--target", "cpu", "--precision", "bfloat16"]


def _mlp_graph(batch: int | None = 64):
    def build():
        x = v1.placeholder(tf.float32, (batch, 256), name="x")
        w = tf.constant(np.random.RandomState(0).standard_normal((256, 256)).astype(np.float32) * 0.05)
        h = tf.nn.relu(tf.matmul(x, w), name="h")
        tf.identity(tf.matmul(h, w), name="out")

    return graph_def(build)


class _Model(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = tf.Variable(np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32) * 0.1)

    @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32, name="x")])
    def __call__(self, x):
        return {"y": tf.nn.softmax(tf.matmul(tf.nn.relu(tf.matmul(x, self.w)), self.w))}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("autotune") / "model"
    m = _Model()
    tf.saved_model.save(m, str(path), signatures={"serving_default": m.__call__})
    return path


def _check_choice(tuned, max_error=None, gain=0.02) -> None:
    """The choice is the admissible rewrite with the lowest median ratio to float32 among those
    proven faster by ``gain`` (median ratio and sign test), else float32 and none is proven.
    ``tuned``: an AutotuneResult or the report's autotune section."""
    if isinstance(tuned, dict):
        ratio, wins, rounds = tuned["ratio_to_float32"], tuned["faster_rounds"], tuned["rounds"]
        rel_error, choice = tuned["rel_error"], tuned["choice"]
    else:
        ratio, wins, rounds = tuned.ratio_to_float32, tuned.wins, tuned.rounds
        rel_error, choice = tuned.rel_error, tuned.choice
    assert set(ratio) == set(rel_error) == set(wins)
    comps = {n: Comparison(ratio[n], wins[n], rounds, sign_test_p(wins[n], rounds)) for n in ratio}
    proven = [n for n, c in comps.items() if (max_error is None or rel_error[n] <= max_error) and c.proven(gain)]
    if choice == "float32":
        assert not proven
    else:
        assert choice in proven and comps[choice].ratio == min(comps[n].ratio for n in proven)


def test_sign_test_p_is_the_binomial_tail():
    assert sign_test_p(5, 5) == 1 / 32
    assert sign_test_p(4, 5) == 6 / 32
    assert sign_test_p(0, 7) == 1.0 and sign_test_p(0, 0) == 1.0
    assert sign_test_p(12, 15) == pytest.approx(576 / 2**15)


def _rounds(base, **ratios):
    """Per-round samples: float32's ``base`` and each candidate's ``base * ratio`` (a list of
    ratios, one per round, or one ratio for all)."""
    out = {"float32": list(base)}
    for name, r in ratios.items():
        rs = r if isinstance(r, list) else [r] * len(base)
        out[name] = [b * x for b, x in zip(base, rs)]
    return out


def test_decide_needs_a_clear_gain_over_float32_and_an_admissible_error():
    s = _rounds([10.0] * 8, tensorflow=0.99, greedy=0.9, optimal=0.9)
    err = {"tensorflow": 1e-3, "greedy": 2e-3, "optimal": 2e-3}
    assert _decide(s, err, None, 0.02) == ("greedy", True)  # ties go to the earlier candidate
    assert _decide(s, err, None, 0.15) == ("float32", True)  # 10% faster is not enough
    assert _decide(s, err, 1.5e-3, 0.0) == ("tensorflow", True)  # greedy/optimal are too far off
    assert _decide(s, err, 1e-4, 0.0) == ("float32", True)
    assert _decide({"float32": [1.0]}, {}, None, 0.02) == ("float32", True)


def test_decide_pairs_rounds_so_that_drift_cancels():
    # The machine's speed swings 4x from round to round (a noisy neighbour); the candidate is
    # 5% faster in every round.  Its times spread over the same range as float32's, but paired
    # it won all 7 rounds (p = 1/128).
    base = [10.0, 40.0, 12.0, 35.0, 11.0, 38.0, 9.0]
    assert _decide(_rounds(base, optimal=0.95), {"optimal": 0.0}, None, 0.02) == ("optimal", True)
    # The same rounds with a slow spell inside two of them, once on the candidate's side and
    # once on float32's: 6 wins of 7 (p = 8/128) is not yet beyond chance, so float32 stays
    # the choice for now and more rounds are wanted.
    slow = [0.95, 3.5, 0.95, 0.95, 0.3, 0.95, 0.95]
    assert _decide(_rounds(base, optimal=slow), {"optimal": 0.0}, None, 0.02, rounds_left=5) == ("float32", False)
    # With no round left to time, that is the verdict.
    assert _decide(_rounds(base, optimal=slow), {"optimal": 0.0}, None, 0.02) == ("float32", True)


def test_decide_wants_more_rounds_before_trusting_a_gain_chance_could_explain():
    err = {"optimal": 0.0}
    # Faster in the median, but in 3 rounds of 5: float32 stays the choice, not settled while
    # 10 more rounds could still prove it (13 of 15) -- settled when only 5 could not (8 of 10).
    three_of_five = _rounds([10.0] * 5, optimal=[0.8, 0.8, 0.8, 1.1, 1.1])
    assert _decide(three_of_five, err, None, 0.02, rounds_left=10) == ("float32", False)
    assert _decide(three_of_five, err, None, 0.02, rounds_left=5) == ("float32", True)
    # Faster in every one of 4 rounds is still p = 1/16: not settled.  In 5 of 5: proven.
    assert _decide(_rounds([10.0] * 4, optimal=0.8), err, None, 0.02, rounds_left=1) == ("float32", False)
    assert _decide(_rounds([10.0] * 5, optimal=0.8), err, None, 0.02) == ("optimal", True)
    # A proven choice with a faster rival that is not yet proven is not settled either...
    s = _rounds([10.0] * 6, greedy=0.9, optimal=[0.5, 0.5, 0.5, 1.2, 1.2, 0.5])
    errs = {"greedy": 0.0, "optimal": 0.0}
    assert _decide(s, errs, None, 0.02, rounds_left=10) == ("greedy", False)
    # ... unless the rounds that may follow cannot prove it any more: 4 of 6 won, and even
    # 6 of 8 (p = 0.14) or 8 of 10 (p = 0.055) would still be chance.
    assert _decide(s, errs, None, 0.02, rounds_left=2) == ("greedy", True)
    assert _decide(s, errs, None, 0.02, rounds_left=4) == ("greedy", True)
    assert _decide(s, errs, None, 0.02, rounds_left=6) == ("greedy", False)  # 10 of 12: p = 0.019


def test_measure_times_more_rounds_until_settled_and_stops_at_the_limit():
    calls = {"float32": 0, "optimal": 0}

    def step(name):
        def run():
            calls[name] += 1
            return []
        return run

    fns = {n: step(n) for n in calls}
    seen = []
    samples = _measure(fns, 3, 2, 20, lambda s, left: seen.append(left) or len(s["float32"]) >= 7)
    assert [len(v) for v in samples.values()] == [7, 7] and calls == {"float32": 14, "optimal": 14}
    assert seen == [17, 16, 15, 14, 13]  # asked after rounds 3..7, with the rounds that may follow
    assert len(_measure(fns, 3, 1, 5, lambda s, left: False)["optimal"]) == 5
    assert len(_measure(fns, 3, 1, 5, lambda s, left: True)["optimal"]) == 3
    assert default_max_repeats(1) == 10 and default_max_repeats(7) == 21


# ------------------------------------------------------------------ library: GraphDefs


def test_measure_renews_the_sessions_every_few_rounds_and_drops_what_cannot_run_again():
    fns = {"float32": lambda: [], "optimal": lambda: []}
    renewed = []

    def renew():
        renewed.append(True)
        return fns

    samples = _measure(fns, 5, 1, 5, lambda s, left: True, renew=renew, per_session=2)
    assert len(renewed) == 2 and [len(v) for v in samples.values()] == [5, 5]  # renewed after 2 and 4
    samples = _measure(fns, 5, 1, 5, lambda s, left: True, renew=lambda: {"float32": fns["float32"]},
                       per_session=2)
    assert list(samples) == ["float32"] and len(samples["float32"]) == 5


def test_tune_spreads_the_rounds_over_fresh_sessions_and_closes_every_one():
    made, closed = [], []

    def maker(name):
        def make():
            made.append(name)
            return (lambda: [np.ones(2, np.float32)]), (lambda: closed.append(name))
        return make

    tuned = _tune({"float32": maker("float32"), "optimal": maker("optimal")}, repeats=6, steps=1,
                  max_rel_error=None, min_gain=0.02, max_repeats=6, sessions=3)
    assert tuned.rounds == 6 and tuned.sessions == 3
    assert made == ["float32", "optimal"] * 3 and sorted(closed) == sorted(made)
    with pytest.raises(amp_rewrite.AmpRewriteError, match="sessions"):
        _tune({"float32": maker("float32")}, repeats=1, steps=1, max_rel_error=None, min_gain=0.02,
              sessions=0)


def test_autotune_times_the_candidates_and_returns_the_fastest():
    gd = _mlp_graph()
    before = gd.SerializeToString(deterministic=True)
    feeds = {"x:0": np.random.RandomState(1).standard_normal((64, 256)).astype(np.float32)}
    got = amp_rewrite.autotune(gd, feeds=feeds, fetches=["out"], target="cpu", precision="bfloat16",
                               repeats=2, steps=2, use_env=False)
    assert set(got.step_ms) == {"float32", "tensorflow", "greedy", "optimal"}
    assert set(got.rel_error) == {"tensorflow", "greedy", "optimal"}
    assert all(0 < e < 8e-2 for e in got.rel_error.values())  # bfloat16 rounding, not garbage
    _check_choice(got)
    assert 2 <= got.rounds <= default_max_repeats(2)
    if got.choice == "float32":
        assert got.graph_def is gd and got.result is None
    else:
        assert got.graph_def is got.result.graph_def
        (ref,) = run(gd, feeds, ["out:0"])
        (out,) = run(got.graph_def, feeds, ["out:0"])
        assert np.max(np.abs(out - ref)) / np.max(np.abs(ref)) < 8e-2
    assert gd.SerializeToString(deterministic=True) == before  # the input is untouched


def test_autotune_max_rel_error_rules_out_inexact_candidates():
    gd = _mlp_graph()
    feeds = {"x:0": np.random.RandomState(1).standard_normal((64, 256)).astype(np.float32)}
    got = amp_rewrite.autotune(gd, feeds=feeds, fetches=["out"], candidates=["greedy"], target="cpu",
                               precision="bfloat16", repeats=1, steps=1, max_rel_error=0.0, use_env=False)
    # bfloat16 changes the outputs, so only float32 is admissible, however fast greedy was.
    assert got.rel_error["greedy"] > 0
    assert got.choice == "float32" and got.graph_def is gd


def test_autotune_accepts_named_option_sets_and_a_custom_runner():
    gd = _mlp_graph()
    x = np.random.RandomState(1).standard_normal((64, 256)).astype(np.float32)
    built = []

    def runner(graph):
        built.append(graph)
        g = tf.Graph()
        with g.as_default():
            (out,) = tf.graph_util.import_graph_def(graph, return_elements=["out:0"], name="")
        sess = tf.compat.v1.Session(graph=g)
        return (lambda: sess.run([out], {"x:0": x})), sess.close

    got = amp_rewrite.autotune(gd, fetches=["out"], runner=runner,
                               candidates={"no-matmul": {"remove": {"allow": ["MatMul"]}},
                                           "plain": {"planner": "greedy"}},
                               target="cpu", precision="bfloat16", repeats=1, steps=1, use_env=False)
    assert set(got.step_ms) == {"float32", "no-matmul", "plain"}
    # Without MatMul in the allow list nothing converts: the same graph as float32, so it is
    # not timed again (noise must not pick between two timings of one graph) and never chosen.
    assert got.same_as == {"no-matmul": "float32"}
    assert got.step_ms["no-matmul"] == got.step_ms["float32"] and got.rel_error["no-matmul"] == 0.0
    assert got.choice != "no-matmul"
    # One runner per graph and set of sessions, float32 first.
    assert len(built) == 2 * got.sessions and got.sessions >= 1
    assert all(b is gd for b in built[::2]) and all(b is not gd for b in built[1::2])


def test_autotune_refuses_bad_settings():
    gd = _mlp_graph(4)
    with pytest.raises(amp_rewrite.AmpRewriteError, match="does not run"):
        amp_rewrite.autotune(gd, feeds={"x:0": np.zeros((3, 3), np.float32)}, fetches=["out"],
                             target="cpu", precision="bfloat16", use_env=False)
    with pytest.raises(amp_rewrite.AmpRewriteError, match="repeats"):
        amp_rewrite.autotune(gd, feeds={}, fetches=["out"], repeats=0)
    with pytest.raises(amp_rewrite.AmpRewriteError, match="feeds"):
        amp_rewrite.autotune(gd, fetches=["out"])
    with pytest.raises(amp_rewrite.AmpRewriteError, match="max_repeats"):
        amp_rewrite.autotune(gd, feeds={}, fetches=["out"], repeats=5, max_repeats=4)
    with pytest.raises(amp_rewrite.AmpRewriteError, match="max_repeats"):
        AutotuneOptions(repeats=5, max_repeats=3).check()
    # Fewer than 5 rounds can never show a rewrite faster beyond chance.
    with pytest.raises(amp_rewrite.AmpRewriteError, match="at least 5"):
        AutotuneOptions(repeats=1, max_repeats=4).check()
    AutotuneOptions(repeats=1, max_repeats=5).check()
    with pytest.raises(amp_rewrite.AmpRewriteError, match="unknown autotune candidate 'fastest'"):
        candidate_options(["fastest"])
    with pytest.raises(amp_rewrite.AmpRewriteError, match="always a candidate"):
        candidate_options({"float32": {}})
    with pytest.raises(amp_rewrite.AmpRewriteError, match="batch"):
        AutotuneOptions(batch=0).check()
    with pytest.raises(amp_rewrite.AmpRewriteError, match="sessions"):
        AutotuneOptions(sessions=0).check()
    with pytest.raises(amp_rewrite.AmpRewriteError, match="sessions"):
        amp_rewrite.autotune(gd, feeds={}, fetches=["out"], sessions=0)


def test_relative_error_flags_wrong_shapes_and_non_finite_outputs():
    ref = [np.array([1.0, -2.0, 4.0], np.float32)]
    assert relative_error(ref, ref) == 0.0
    assert relative_error([np.array([1.0, -2.0, 3.0])], ref) == pytest.approx(0.25)
    assert relative_error([np.array([1.0, np.inf, 4.0])], ref) == float("inf")
    assert relative_error([np.array([1.0, 2.0])], ref) == float("inf")
    assert relative_error([np.array([np.nan])], [np.array([np.nan])]) == 0.0  # both undefined


# ------------------------------------------------------------------ models and the CLI


def test_cli_autotune_writes_the_fastest_saved_model(saved, tmp_path):
    before = (saved / "saved_model.pb").read_bytes()
    out, report_file = tmp_path / "out", tmp_path / "r.json"
    assert main(["rewrite", str(saved), str(out), *CPU_BF16, "--autotune", "--autotune-batch", "32",
                 "--autotune-repeats", "2", "--autotune-sessions", "2", "--report", str(report_file),
                 "-q"]) == 0
    report = json.loads(report_file.read_text())
    tuned = report["autotune"]
    # Two rounds, a set of fresh loads each; more rounds (while unsettled) open more sets.
    assert tuned["sessions"] == tuned["rounds"] >= 2
    assert tuned["signature"] == "serving_default" and tuned["inputs"] == {"x": [32, 64]}
    assert set(tuned["step_ms"]) == {"float32", "tensorflow", "greedy", "optimal"}
    _check_choice(tuned)
    assert (saved / "saved_model.pb").read_bytes() == before
    # The written model is the chosen one, and it serves close to float32.
    x = np.random.default_rng(3).standard_normal((32, 64)).astype(np.float32)
    ref = tf.saved_model.load(str(saved)).signatures["serving_default"](x=tf.constant(x))["y"].numpy()
    got = tf.saved_model.load(str(out)).signatures["serving_default"](x=tf.constant(x))["y"].numpy()
    assert np.max(np.abs(got - ref)) < 5e-2
    if tuned["choice"] == "float32":
        assert report["converted_nodes"] == 0 and "autotune" in report["skipped"]
    else:
        assert report["converted_nodes"] > 0 and report["skipped"] is None


def test_cli_autotune_keeps_float32_when_no_candidate_is_admissible(saved, tmp_path):
    out, report_file = tmp_path / "out", tmp_path / "r.json"
    assert main(["rewrite", str(saved), str(out), *CPU_BF16, "--autotune", "--autotune-repeats", "1",
                 "--autotune-candidates", "greedy", "--autotune-max-error", "0",
                 "--report", str(report_file), "-q"]) == 0
    report = json.loads(report_file.read_text())
    assert report["autotune"]["choice"] == "float32"
    assert report["converted_nodes"] == 0 and report["casts_to_low"] == 0
    assert report["skipped"] == "autotune: no candidate's outputs are within 0 of float32's"
    from tensorflow.core.protobuf import saved_model_pb2

    def meta(path):
        return saved_model_pb2.SavedModel.FromString((path / "saved_model.pb").read_bytes())

    assert meta(out) == meta(saved)  # the model as it was, variables copied alongside
    assert (out / "variables").is_dir()


def test_cli_autotune_frozen_graph_def_with_an_unknown_batch(tmp_path):
    pb, out, report_file = tmp_path / "in.pb", tmp_path / "out.pb", tmp_path / "r.json"
    pb.write_bytes(_mlp_graph(None).SerializeToString())
    assert main(["rewrite", str(pb), str(out), *CPU_BF16, "--autotune", "--autotune-batch", "16",
                 "--autotune-repeats", "1", "--autotune-candidates", "greedy,min-casts",
                 "--report", str(report_file), "-q"]) == 0
    tuned = json.loads(report_file.read_text())["autotune"]
    assert tuned["inputs"] == {"x": [16, 256]} and tuned["signature"] is None
    assert set(tuned["step_ms"]) == {"float32", "greedy", "min-casts"}
    _check_choice(tuned)
    assert out.exists()


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("amp-rewrite: error:") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("extra, message", [
    (["--graph", "g.svg"], "cannot go with it"),
    (["--autotune-candidates", "fastest"], "unknown autotune candidate"),
    (["--autotune-shape", "x"], "bad --autotune-shape"),
    (["--autotune-batch", "0"], "batch size"),
    (["--autotune-sessions", "0"], "sessions >= 1"),
    (["--loss-scale", "dynamic"], "cannot go with --loss-scale"),
])
def test_cli_autotune_refuses_bad_options_before_writing(saved, tmp_path, capsys, monkeypatch, extra, message):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    assert main(["rewrite", str(saved), str(out), *CPU_BF16, "--autotune", *extra]) == 1
    assert message in _one_error_line(capsys)
    assert not out.exists() and not (tmp_path / "g.svg").exists()


def test_cli_autotune_options_need_autotune(saved, tmp_path, capsys):
    assert main(["rewrite", str(saved), str(tmp_path / "o"), *CPU_BF16, "--autotune-batch", "8"]) == 1
    assert "need --autotune" in _one_error_line(capsys)


def test_cli_autotune_needs_shapes_it_cannot_guess(tmp_path, capsys):
    def build():
        x = v1.placeholder(tf.float32, (None, None), name="x")
        tf.identity(tf.matmul(x, x, transpose_b=True), name="out")

    pb = tmp_path / "in.pb"
    pb.write_bytes(graph_def(build).SerializeToString())
    assert main(["rewrite", str(pb), str(tmp_path / "o.pb"), *CPU_BF16, "--autotune"]) == 1
    assert "--autotune-shape x=" in _one_error_line(capsys)
    assert not (tmp_path / "o.pb").exists()
    assert main(["rewrite", str(pb), str(tmp_path / "o.pb"), *CPU_BF16, "--autotune", "--autotune-repeats",
                 "1", "--autotune-shape", "x=8,32", "-q"]) == 0
