"""Autotuning: candidates timed against float32 on this machine, the fastest kept.

Which candidate wins depends on the machine, so the tests assert what holds whatever wins:
the choice is the fastest admissible measurement, its graph is the one written, outputs
stay close to float32, inputs are untouched, and bad settings fail before any output.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf

import amp_rewrite
from amp_rewrite.autotune import (
    AutotuneInputError,
    AutotuneOptions,
    Comparison,
    InputArrays,
    _decide,
    _fit_inputs,
    _measure,
    _tune,
    candidate_options,
    compare,
    decision_rule,
    default_max_repeats,
    load_inputs,
    relative_error,
    result_line,
    sign_test_p,
    wins_needed,
)
from amp_rewrite.cli import main
from amp_rewrite.progress import Progress
from amp_rewrite.models.saved_model import load_model
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


# ------------------------------------------------------------------ the line, the rule (issue 23 item 7)


def test_wins_needed_is_the_fewest_rounds_the_sign_test_accepts():
    assert wins_needed(15) == 12 and sign_test_p(12, 15) <= 0.05 < sign_test_p(11, 15)
    assert wins_needed(5) == 5 and wins_needed(10) == 9
    assert wins_needed(4) is None and wins_needed(0) is None  # 4 of 4 is p = 1/16


def _line(samples, errors, max_error=None, gain=0.02, same_as=None):
    """The rule and the line for synthetic per-round samples, as _tune builds them."""
    comps = compare(samples, gain)
    rule = decision_rule(samples, errors, max_error, gain)
    rounds = len(samples["float32"])
    line = result_line(step_ms={n: 1e3 * float(np.median(v)) for n, v in samples.items()},
                       ratio={n: c.ratio for n, c in comps.items()}, wins={n: c.wins for n, c in comps.items()},
                       rel_error=errors, same_as=same_as or {}, rounds=rounds, sessions=3, min_gain=gain, rule=rule)
    return rule, line


def test_the_line_says_why_a_rewrite_with_the_slower_median_time_won():
    # The complaint: "greedy 10.40 ms (x0.871)" lost to "tensorflow 10.78 ms (x0.769)".  Here
    # float32's speed drifts between the sets of sessions, so medians of times and medians
    # of per-round ratios disagree: greedy has the lower median time, tensorflow the lower
    # ratio and the rounds.  The line must show the rounds and the rule that decided.
    base = [0.010] * 7 + [0.014] * 8
    greedy_r = [0.871] * 7 + [0.74] + [1.0] * 7
    s = {"float32": base, "tensorflow": [b * 0.769 for b in base],
         "greedy": [b * r for b, r in zip(base, greedy_r)]}
    errors = {"tensorflow": 3e-3, "greedy": 3e-3}
    assert _decide(s, errors, None, 0.02) == ("tensorflow", True)
    rule, line = _line(s, errors)
    assert rule == ("chosen: tensorflow -- the only candidate faster than float32 by >= 2% in >= 12 of 15 rounds "
                    "(sign test p <= 0.05); it won 15 (p=3.1e-05)")
    assert line == ("autotune over 15 rounds in 3 set(s) of sessions (ms: median per step; ratio: its step time / "
                    "float32's in the same round, median over rounds; won: rounds with ratio <= 0.98): "
                    "float32 14.00 ms; tensorflow 10.77 ms, ratio 0.769, won 15/15, rel. error 3.0e-03; "
                    "greedy 10.36 ms, ratio 0.871, won 8/15, rel. error 3.0e-03. " + rule)
    assert line.endswith(". " + rule)


def test_the_rule_of_several_winners_is_the_lowest_median_ratio():
    s = _rounds([10.0] * 6, tensorflow=0.9, greedy=0.8)
    rule, _ = _line(s, {"tensorflow": 0.0, "greedy": 0.0})
    assert rule == ("chosen: greedy -- of the 2 candidates faster than float32 by >= 2% in >= 6 of 6 rounds "
                    "(sign test p <= 0.05), the lowest median ratio to float32 (0.800; tensorflow 0.900)")


def test_the_line_says_why_float32_was_kept():
    nine_of_fifteen = _rounds([0.010] * 15, greedy=[0.87] * 9 + [1.0] * 6, optimal=[0.9] * 3 + [1.0] * 12)
    errors = {"greedy": 1e-3, "optimal": 1e-3}
    rule, line = _line(nine_of_fifteen, errors)
    assert rule == ("kept float32: no candidate won enough rounds -- faster than float32 by >= 2% in >= 12 of 15 "
                    "rounds (sign test p <= 0.05); most: greedy 9/15 (p=0.3)")
    assert "greedy 8.70 ms, ratio 0.870, won 9/15, rel. error 1.0e-03; optimal 10.00 ms, ratio 1.000, won 3/15" in line
    # A bound on the error is part of the rule it names.
    assert decision_rule(nine_of_fifteen, errors, 1e-2, 0.02).startswith(
        "kept float32: no candidate within relative error 0.01 won enough rounds -- ")
    assert decision_rule(_rounds([10.0] * 6, greedy=0.5), {"greedy": 0.1}, 1e-3, 0.02) == (
        "kept float32: no candidate's outputs are within relative error 0.001 of float32's")
    assert decision_rule(_rounds([10.0] * 3, greedy=0.5), {"greedy": 0.0}, None, 0.02) == (
        "kept float32: no candidate won enough rounds -- 3 rounds are too few to show one faster than float32 "
        "by >= 2% beyond chance (the sign test at p <= 0.05 needs >= 5); most: greedy 3/3 (p=0.12)")
    assert decision_rule({"float32": [1.0] * 5}, {}, None, 0.02, untimed=["greedy"]) == (
        "kept float32: every candidate's graph is the same as float32's")
    same = _rounds([0.010] * 5, greedy=0.5)
    _, line = _line({**same, "optimal": same["greedy"], "min-casts": same["float32"]}, {"greedy": 0.0},
                    same_as={"optimal": "greedy", "min-casts": "float32"})
    assert ("greedy 5.00 ms, ratio 0.500, won 5/5, rel. error 0.0e+00; optimal: same graph as greedy; "
            "min-casts: same graph as float32, not timed. chosen: greedy") in line


# ------------------------------------------------------------------ --autotune-inputs


class _Unpickled:
    """Unpickling this makes a directory: proof that a pickle was executed."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def _cli(*args) -> int:
    return main(["rewrite", *map(str, args)])


def test_autotune_inputs_files_are_checked_before_output_and_never_unpickled(saved, tmp_path, capsys):
    marker = tmp_path / "unpickled"
    np.savez(tmp_path / "pickle.npz", x=np.array([_Unpickled(str(marker))], dtype=object))
    np.save(tmp_path / "one.npy", np.zeros((2, 64), np.float32))
    (tmp_path / "text.npz").write_text("x = 1\n")
    np.savez(tmp_path / "empty.npz")
    (tmp_path / "dir.npz").mkdir()
    out = tmp_path / "out"
    out.write_text("keep me")  # an existing OUTPUT: the inputs' error must come first
    for name, message in [("missing.npz", "no such file"), ("pickle.npz", "holds Python objects"),
                          ("one.npy", "is a single .npy array"), ("text.npz", "is not an .npz archive"),
                          ("empty.npz", "holds no arrays"), ("dir.npz", "is a directory")]:
        assert _cli(saved, out, *CPU_BF16, "--autotune", "--autotune-inputs", tmp_path / name) == 1, name
        err = _one_error_line(capsys)
        assert f"{tmp_path / name}: " in err and message in err, err
    assert not marker.exists() and out.read_text() == "keep me"
    with pytest.raises(AutotuneInputError, match="never unpickled"):
        load_inputs(tmp_path / "pickle.npz")
    assert not marker.exists()
    with pytest.raises(AutotuneInputError, match="Python objects"):
        AutotuneOptions(inputs={"x": np.array([object()])}).check()


def test_autotune_inputs_need_autotune_and_no_random_input_flags(saved, tmp_path, capsys):
    np.savez(tmp_path / "in.npz", x=np.zeros((2, 64), np.float32))
    assert _cli(saved, tmp_path / "o", *CPU_BF16, "--autotune-inputs", tmp_path / "in.npz") == 1
    assert "need --autotune" in _one_error_line(capsys)
    assert _cli(saved, tmp_path / "o", *CPU_BF16, "--autotune", "--autotune-inputs", tmp_path / "in.npz",
                "--autotune-batch", "4") == 1
    assert "cannot go with --autotune-inputs" in _one_error_line(capsys)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("arrays, message", [
    ({"y": np.zeros((2, 64), np.float32)}, "inputs name 'y', not an input of the signature 'serving_default' "
                                           "(its inputs: x)"),
    ({"x": np.zeros((2, 64), np.float64)}, "input 'x' is float64; the signature 'serving_default' takes float32"),
    ({"x": np.zeros((2, 63), np.float32)}, "input 'x' has shape (2, 63); the signature 'serving_default' takes "
                                           "(?, 64)"),
    ({"x": np.zeros((2, 1, 64), np.float32)}, "has shape (2, 1, 64)"),
])
def test_cli_autotune_inputs_that_do_not_fit_the_saved_model_fail_in_one_line(saved, tmp_path, capsys, arrays,
                                                                             message):
    np.savez(tmp_path / "in.npz", **arrays)
    out = tmp_path / "out"
    assert _cli(saved, out, *CPU_BF16, "--autotune", "--autotune-inputs", tmp_path / "in.npz") == 1
    err = _one_error_line(capsys)
    assert message in err and err.startswith(f"amp-rewrite: error: {tmp_path / 'in.npz'}: "), err
    assert not out.exists()


def test_fit_inputs_names_missing_inputs_and_takes_any_shape_of_unknown_rank():
    specs = {"a": (np.float32, [None, 3]), "b": (np.int32, None), "c": (np.float32, [])}
    given = InputArrays({"a": np.zeros((5, 3), np.float32)}, "f.npz", "f.npz")
    with pytest.raises(AutotuneInputError, match=r"^f.npz: autotune inputs lack 'b' \(inputs of the graph's "
                                                 r"placeholders: a, b, c\)$"):
        _fit_inputs(given, specs, ["a", "b"], "graph's placeholders")
    ok = InputArrays({"a": np.zeros((1, 3), np.float32), "b": np.zeros((2, 2, 2), np.int32)}, "f.npz", "f.npz")
    assert set(_fit_inputs(ok, specs, ["a", "b"], "graph's placeholders")) == {"a", "b"}
    with pytest.raises(AutotuneInputError, match=r"'c' has shape \(2,\); .* takes \(\)"):
        _fit_inputs(InputArrays({**ok.arrays, "c": np.zeros(2, np.float32)}, "f.npz"), specs, ["a"], "graph")


def test_cli_autotune_inputs_saved_model_times_the_users_arrays(saved, tmp_path, capsys):
    np.savez(tmp_path / "in.npz", x=np.zeros((5, 64), np.float32))
    out, report_file = tmp_path / "out", tmp_path / "r.json"
    assert _cli(saved, out, *CPU_BF16, "--autotune", "--autotune-repeats", "1", "--autotune-sessions", "1",
                "--autotune-candidates", "greedy", "--autotune-inputs", tmp_path / "in.npz",
                "--report", report_file) == 0
    tuned = json.loads(report_file.read_text())["autotune"]
    assert tuned["inputs"] == {"x": [5, 64]} and tuned["input_source"] == str(tmp_path / "in.npz")
    assert tuned["decision"] and tuned["summary"].endswith(tuned["decision"])
    stdout = capsys.readouterr().out
    assert tuned["summary"] in stdout.splitlines() and "; autotune over" not in stdout.splitlines()[0]


def test_cli_autotune_inputs_graph_def_error_check_and_progress_in_a_pipe(tmp_path, capsys, monkeypatch):
    # On the user's zeros every candidate's outputs equal float32's (relative error 0), so
    # even --autotune-max-error 0 admits them; on random inputs bfloat16 rounding shows.
    pb, out, report_file = tmp_path / "in.pb", tmp_path / "out.pb", tmp_path / "r.json"
    pb.write_bytes(_mlp_graph(None).SerializeToString())
    np.savez(tmp_path / "zeros.npz", x=np.zeros((7, 256), np.float32))
    args = ["rewrite", str(pb), str(out), *CPU_BF16, "--autotune", "--autotune-repeats", "4",
            "--autotune-max-repeats", "5", "--autotune-sessions", "2", "--autotune-candidates", "greedy",
            "--autotune-max-error", "0", "--autotune-inputs", str(tmp_path / "zeros.npz"), "--report", str(report_file)]
    # stderr is a real pipe (not a terminal), read once the command is done.
    read_end, write_end = os.pipe()
    with open(write_end, "w", buffering=1) as pipe, open(read_end) as reader:
        monkeypatch.setattr(sys, "stderr", pipe)
        assert main(args) == 0
        monkeypatch.undo()
        pipe.close()
        stderr = reader.read()
    stdout = capsys.readouterr().out
    tuned = json.loads(report_file.read_text())["autotune"]
    assert tuned["inputs"] == {"x": [7, 256]} and tuned["rel_error"] == {"greedy": 0.0}
    assert "outputs are within" not in tuned["decision"]
    assert tuned["summary"] in stdout
    # stderr is a pipe: plain progress lines, one per event, no carriage returns.
    lines = [ln for ln in stderr.splitlines() if ln.startswith("amp-rewrite: autotune: ")]
    assert "\r" not in stderr
    assert lines[0].startswith("amp-rewrite: autotune: rewriting candidate 1/1 (greedy)")
    assert any(ln.startswith("amp-rewrite: autotune: round 1/4, session 1/2") for ln in lines)
    assert any(ln.startswith("amp-rewrite: autotune: loading and warming up every model, session 2/2")
               for ln in lines)
    assert lines[-1].startswith("amp-rewrite: autotune: done after ")
    # The same graph on random inputs: bfloat16 rounding is an error above 0, so float32 stays.
    random = amp_rewrite.autotune_model(
        load_model(str(pb)),
        AutotuneOptions(candidates=("greedy",), repeats=1, sessions=1, max_rel_error=0.0),
        target="cpu", precision="bfloat16", use_env=False)
    assert random.rel_error["greedy"] > 0 and random.choice == "float32"
    assert random.rule == "kept float32: no candidate's outputs are within relative error 0 of float32's"


# ------------------------------------------------------------------ progress off a terminal


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_events_are_plain_lines_off_a_terminal_at_a_modest_rate():
    piped = io.StringIO()
    with Progress(piped, plain_interval=3600) as p:
        p.stage("rewriting")  # stages stay silent off a terminal, as before
        p.event("autotune: round 1/5, session 1/2")
        p.event("autotune: round 2/5, session 1/2", milestone=False)  # within the interval: dropped
        p.event("autotune: round 3/5, session 2/2")
    lines = piped.getvalue().splitlines()
    assert [ln.rsplit("  ", 1)[0] for ln in lines] == [
        "amp-rewrite: autotune: round 1/5, session 1/2", "amp-rewrite: autotune: round 3/5, session 2/2"]
    assert piped.getvalue().endswith("s\n") and "\r" not in piped.getvalue()
    often = io.StringIO()
    with Progress(often, plain_interval=0) as p:
        for i in range(3):
            p.event(f"autotune: round {i + 1}/3", milestone=False)
    assert len(often.getvalue().splitlines()) == 3
    quiet = io.StringIO()
    with Progress(quiet, enabled=False) as p:
        p.event("autotune: round 1/5")
    assert quiet.getvalue() == ""
    tty = _Tty()
    with Progress(tty) as p:
        p.event("autotune: round 1/5, session 1/2")
    assert "\ramp-rewrite: autotune: round 1/5, session 1/2" in tty.getvalue() and "\n" not in tty.getvalue()
