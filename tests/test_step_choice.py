"""``measure_steps``: a training step chosen by timing the steps it may run
(:mod:`amp_rewrite.training.step_choice`), and how :class:`amp_rewrite.function` builds and
uses the candidates."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf

import amp_rewrite
from amp_rewrite.errors import AmpRewriteError
from amp_rewrite.training import tf_function
from amp_rewrite.training._common import check_rewrite_options
from amp_rewrite.training.step_choice import MAX_DISCARDED, MIN_GAIN, Candidate, MeasuredChoice


class _Clock:
    """A clock that each candidate's run advances by that candidate's step time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _candidates(clock: _Clock, times: dict[str, float], calls: list[str]) -> list[Candidate]:
    def runner(name: str):
        def run(args):
            calls.append(name)
            clock.now += times[name]
            return (name, args)
        return run
    return [Candidate(name, runner(name)) for name in times]


def test_measured_choice_warms_up_times_round_robin_then_keeps_the_fastest():
    """Each candidate's first call is a warm-up (not timed); then the candidates take turns
    until each has ``steps`` timed steps; the fastest median wins and from then on only it
    runs.  Every call runs one candidate on the caller's inputs and returns its outputs."""
    clock, calls, chosen = _Clock(), [], []
    cands = _candidates(clock, {"planned": 0.010, "float32": 0.008, "default lists": 0.012}, calls)
    choice = MeasuredChoice(cands, 2, sync=lambda: None, clock=clock, on_chosen=chosen.append)
    outputs = [choice(i) for i in range(9)]
    assert calls == ["planned", "float32", "default lists"] * 3
    assert outputs[4] == ("float32", 4)  # a trial step is that candidate's real step
    assert [c.seconds for c in cands] == [[pytest.approx(0.010)] * 2, [pytest.approx(0.008)] * 2,
                                          [pytest.approx(0.012)] * 2]
    assert choice.chosen is cands[1] and chosen == [choice] and not choice.deciding
    assert choice(9) == ("float32", 9) and calls[-1] == "float32" and len(calls) == 10
    assert choice.summary() == "planned 10.00 ms, float32 8.00 ms, default lists 12.00 ms"


def test_a_step_that_skipped_its_update_is_not_timed():
    """The first steps of a dynamic loss scale skip their update (a gradient overflowed) and run
    no update kernels: faster, and not the step that will run.  A timed step during which the
    candidate's count of skipped updates moved is not counted, and the candidate is timed
    again; a candidate whose every step skips is counted after :data:`MAX_DISCARDED` per step,
    so that measuring ends."""
    clock, calls, chosen = _Clock(), [], []
    skipped = {"count": 0}
    times = {"planned": 0.010, "float32": 0.011}

    def planned(args):
        calls.append("planned")
        if len(calls) <= 5:  # its warm-up and first two timed steps skip their update: fast
            skipped["count"] += 1
            clock.now += 0.001
        else:
            clock.now += times["planned"]
        return args

    def float32(args):
        calls.append("float32")
        clock.now += times["float32"]
        return args

    cands = [Candidate("planned", planned, lambda: skipped["count"]), Candidate("float32", float32)]
    choice = MeasuredChoice(cands, 2, sync=lambda: None, clock=clock, on_chosen=chosen.append)
    while choice.deciding:
        choice(len(calls))
    assert cands[0].discarded == 2 and cands[0].seconds == [pytest.approx(0.010)] * 2
    assert choice.chosen is cands[0]  # 10 ms against 11: without the rule, 1 ms against 11 anyway
    assert "2 steps that skipped their update not counted" in choice.summary()
    # Every step skips: counted after MAX_DISCARDED per step, so measuring ends.
    clock, calls = _Clock(), []
    always = Candidate("planned", lambda args: (calls.append(1), skipped.update(count=skipped["count"] + 1)),
                       lambda: skipped["count"])
    other = Candidate("float32", lambda args: calls.append(2))
    choice = MeasuredChoice([always, other], 1, sync=lambda: None, clock=clock)
    for i in range(2 * (MAX_DISCARDED + 2) + 2):
        if not choice.deciding:
            break
        choice(i)
    assert not choice.deciding and always.discarded == MAX_DISCARDED and len(always.seconds) == 1


def test_measured_choice_keeps_the_planned_step_unless_another_is_faster_by_the_margin():
    """A candidate faster by less than :data:`MIN_GAIN` of the planned step's median does not
    replace it (a choice inside the timing noise is no choice); faster by more, it does."""
    for other, kept in ((0.010 * (1 - MIN_GAIN / 2), "planned"), (0.010 * (1 - 2 * MIN_GAIN), "float32")):
        clock, calls = _Clock(), []
        choice = MeasuredChoice(_candidates(clock, {"planned": 0.010, "float32": other}, calls), 3,
                                sync=lambda: None, clock=clock)
        for i in range(8):
            choice(i)
        assert choice.chosen is not None and choice.chosen.name == kept


def test_measured_choice_syncs_around_each_timed_step_and_refuses_bad_arguments():
    """The device is synchronised before and after each timed step (a GPU's step returns before
    its kernels finish) and after a warm-up; one candidate is chosen at once; no candidate, or
    fewer than one timed step, is an error."""
    clock, calls, events = _Clock(), [], []
    cands = _candidates(clock, {"planned": 0.001, "float32": 0.002}, calls)
    choice = MeasuredChoice(cands, 1, sync=lambda: events.append(("sync", len(calls))), clock=clock)
    for i in range(4):
        choice(i)
    # warm-ups: a sync after each; timed steps: one before and one after each.
    assert events == [("sync", 1), ("sync", 2), ("sync", 2), ("sync", 3), ("sync", 3), ("sync", 4)]
    single = MeasuredChoice(cands[:1], 5, sync=lambda: None)
    assert single.chosen is cands[0] and not single.deciding
    with pytest.raises(ValueError):
        MeasuredChoice(cands, 0, sync=lambda: None)
    with pytest.raises(ValueError):
        MeasuredChoice([], 1, sync=lambda: None)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_measure_steps_must_be_a_whole_number_of_steps(bad):
    with pytest.raises(AmpRewriteError, match="measure_steps"):
        check_rewrite_options({"measure_steps": bad})
    assert check_rewrite_options({"measure_steps": 4})["measure_steps"] == 4


def _step(w: tf.Variable, counter: tf.Variable):
    def step(x):
        y = tf.matmul(x, w)
        loss = tf.reduce_mean(tf.square(y))
        counter.assign_add(1)
        return loss
    return step


def test_function_times_the_mixed_step_against_float32_and_keeps_the_faster(caplog):
    """A float16 plan on this CPU (which emulates float16 GEMMs) against the float32 step: the
    first ``2 * (1 + 2)`` calls time them (every call runs exactly one step); the float32 step
    measures faster, so it is kept, with a WARNING that says the rewrite does not run, and
    the executed graphs are then float32's."""
    w = tf.Variable(tf.random.stateless_normal([512, 512], seed=[1, 2]))
    counter = tf.Variable(0, dtype=tf.int64)
    f = amp_rewrite.function(_step(w, counter), target="gpu:8.0", precision="float16", measure_steps=2)
    x = tf.random.stateless_normal([512, 512], seed=[3, 4])
    with caplog.at_level(logging.INFO, logger="amp_rewrite"):
        for _ in range(5):
            f(x)
        assert f.measured_choices[0]["chosen"] is None  # two candidates: a warm-up and 2 timed each
        f(x)  # the last timed step: the choice is made
    assert int(counter.numpy()) == 6
    # the planned (mixed) step converted the MatMul; the float32 candidate converted nothing
    choice = f._choices[next(iter(f._choices))]  # noqa: SLF001
    assert [c.name for c in choice.candidates] == ["planned", "float32"]
    assert choice.candidates[0].run.result.report["converted_nodes"] > 0
    assert not choice.candidates[1].run.result.report["converted_nodes"]
    f(x)  # nothing more to time: the float32 step runs
    measured = f.measured_choices[0]
    assert measured["chosen"] == "float32", measured
    assert measured["candidates"]["float32"] < measured["candidates"]["planned"]
    assert int(counter.numpy()) == 7
    assert any(r.levelno == logging.WARNING and "runs the float32 step" in r.getMessage()
               and "the rewrite does not run" in r.getMessage() for r in caplog.records)
    assert not f.rewrite_results[0].report["converted_nodes"]
    ran = {op.type: op for g in f.executed_graphs() for op in g.get_operations()}
    assert "MatMul" in ran and all(op.get_attr("T") != tf.float16 for op in ran.values()
                                   if op.type == "MatMul")


def test_function_times_the_default_lists_where_the_cost_model_kept_float32(caplog):
    """The cost-aware planner keeps a tiny MatMul float32 (the step as planned is float32's):
    the candidate is then the default lists' step, which converts it, timed against it."""
    w = tf.Variable(tf.ones([4, 4]))
    counter = tf.Variable(0, dtype=tf.int64)
    f = amp_rewrite.function(_step(w, counter), target="gpu:8.0", precision="float16", lists="optimal",
                             measure_steps=3)
    with caplog.at_level(logging.INFO, logger="amp_rewrite"):
        f(tf.ones([4, 4]))
        # The step's summary line waits for the choice: it describes the step that runs.
        assert not any("was not rewritten" in r.getMessage() or "converted 1 of" in r.getMessage()
                       for r in caplog.records if r.name.startswith("amp_rewrite.training"))
        for _ in range(7):
            f(tf.ones([4, 4]))
    summaries = [r.getMessage() for r in caplog.records if r.name == "amp_rewrite.training._common"]
    assert len(summaries) == 1 and (("converted 1 of" in summaries[0]) == (f.measured_choices[0]["chosen"] ==
                                                                          "default lists")), summaries
    assert int(counter.numpy()) == 8
    choice = f._choices[next(iter(f._choices))]  # noqa: SLF001
    assert [c.name for c in choice.candidates] == ["planned", "default lists"]
    assert not choice.candidates[0].run.result.report["converted_nodes"]
    assert choice.candidates[1].run.result.report["converted_nodes"] == 1
    assert f.measured_choices[0]["chosen"] in ("planned", "default lists")
    assert any("timing planned, default lists over its first 8 calls" in r.getMessage() for r in caplog.records)


def test_function_without_another_step_to_time_runs_the_planned_one(caplog):
    """A step with nothing to convert: the planned step is the float32 one and the default
    lists' too, so there is nothing to time (one INFO line) and no choice is kept."""
    w = tf.Variable(tf.ones([4, 4]))
    counter = tf.Variable(0, dtype=tf.int64)

    def step(x):
        counter.assign_add(1)
        return tf.reduce_sum(tf.exp(x * w))

    f = amp_rewrite.function(step, target="gpu:8.0", precision="float16", lists="optimal", measure_steps=3)
    with caplog.at_level(logging.INFO, logger="amp_rewrite"):
        f(tf.ones([4, 4]))
    assert f.measured_choices == [] and int(counter.numpy()) == 1
    assert any("no other step to measure against" in r.getMessage() for r in caplog.records)


def test_function_does_not_measure_a_step_that_reduces_across_workers(monkeypatch, caplog):
    """Each worker would choose alone, and they must all run the same collectives: a step that
    reduces across workers runs as planned, with one WARNING saying measure_steps was not
    carried out."""
    monkeypatch.setattr(tf_function, "_cross_worker_reason",
                        lambda graph_def: "it reduces across workers (CollectiveReduceV2 'r' on /job:worker)")
    w = tf.Variable(tf.random.stateless_normal([256, 256], seed=[1, 2]))
    counter = tf.Variable(0, dtype=tf.int64)
    f = amp_rewrite.function(_step(w, counter), target="gpu:8.0", precision="float16", measure_steps=2)
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        f(tf.ones([256, 256]))
    assert f.measured_choices == []
    assert f.rewrite_results[0].report["converted_nodes"] > 0
    assert any("measure_steps=2 was asked for" in r.getMessage() for r in caplog.records)


def test_tf1_graph_rewrite_says_it_does_not_measure(caplog):
    """A TF1 graph is rewritten once, before any step runs: measure_steps cannot be carried
    out there, and one WARNING says so; the rewrite itself still happens."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 64], name="x")
        w = tf.compat.v1.get_variable("w", [64, 64])
        tf.identity(tf.matmul(x, w), name="out")
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        _, result = amp_rewrite.training.session.rewrite_graph_with_result(
            g, fetches=["out"], target="gpu:8.0", precision="float16", measure_steps=2)
    assert result.report["converted_nodes"] > 0
    assert any("measure_steps=2 applies to tf.function" in r.getMessage() for r in caplog.records)
    assert np.isfinite(result.report["total_nodes"])


def test_keras_fit_measures_its_train_step_and_trains_every_batch():
    """``enable_mixed_precision_graph_rewrite(opt, measure_steps=N)``: Keras's train step is
    timed in its first calls (the mixed step with loss scaling against the float32 step
    without it) and one is kept; every batch trains once, trial steps included."""
    import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((64,))
    out = keras.layers.Dense(10)(keras.layers.Dense(256, activation="relu")(inp))
    model = keras.Model(inp, out)
    opt = amp_rewrite.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.01), target="gpu:8.0",
                                                           precision="float16", measure_steps=2)
    model.compile(opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    rng = np.random.default_rng(0)
    x, y = rng.random((32 * 9, 64), dtype=np.float32), rng.integers(0, 10, 32 * 9)
    before = model.get_weights()[0].copy()
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    step = model.train_function.amp_function
    (measured,) = step.measured_choices
    assert set(measured["candidates"]) == {"planned", "float32"} and measured["chosen"] in measured["candidates"]
    assert all(ms is not None and ms > 0 for ms in measured["candidates"].values())
    assert int(opt.iterations.numpy()) == 9  # 6 trial steps and 3 more, none lost
    assert not np.allclose(model.get_weights()[0], before)


def test_measured_choice_drops_a_candidate_that_runs_out_of_memory_and_runs_the_planned_step():
    """The float32 step may need more device memory than the mixed step a batch was sized for:
    a candidate whose error is droppable is left out, told to ``on_dropped``, and that call
    runs the planned step instead (every batch still trains once).  The planned step's own
    errors, and errors that are not droppable, are the caller's."""

    class OutOfMemory(Exception):
        pass

    clock, calls, dropped, chosen = _Clock(), [], [], []
    cands = _candidates(clock, {"planned": 0.010, "float32": 0.008, "default lists": 0.009}, calls)
    inner = cands[1].run

    def float32_oom(args):
        if args >= 1:
            raise OutOfMemory("OOM when allocating tensor")
        return inner(args)
    cands[1].run = float32_oom
    choice = MeasuredChoice(cands, 1, sync=lambda: None, clock=clock, droppable=lambda e: isinstance(e, OutOfMemory),
                            on_dropped=lambda c, e: dropped.append(c.name), on_chosen=chosen.append)
    outputs = [choice(i) for i in range(5)]
    # 0: planned's warm-up; 1: float32's warm-up runs out of memory, so planned runs batch 1
    # (its first timed step); 2: default lists' warm-up; 3, 4: timed steps of the two left.
    assert dropped == ["float32"] and [c.name for c in choice.candidates] == ["planned", "default lists"]
    assert [o[1] for o in outputs] == [0, 1, 2, 3, 4]  # every batch ran once
    assert calls == ["planned", "planned", "default lists", "planned", "default lists"]
    assert choice.chosen is not None and chosen == [choice]

    # The planned step's errors are never swallowed, nor errors that are not droppable.
    def broken(args):
        raise OutOfMemory("planned")
    for first, second in ((broken, cands[2].run), (cands[0].run, broken)):
        bad = MeasuredChoice([Candidate("planned", first), Candidate("float32", second)], 1,
                             sync=lambda: None, droppable=lambda e: False)
        with pytest.raises(OutOfMemory):
            bad(0)
            bad(1)

    # Every other candidate dropped: the planned step is chosen at once.
    lone = MeasuredChoice([Candidate("planned", cands[0].run), Candidate("float32", broken)], 3,
                          sync=lambda: None, droppable=lambda e: True, on_chosen=chosen.append)
    lone(0)
    lone(1)
    assert lone.chosen is not None and lone.chosen.name == "planned" and chosen[-1] is lone


def test_only_running_out_of_device_memory_drops_a_candidate():
    """What :class:`amp_rewrite.function` lets a candidate be dropped for: TensorFlow's
    out-of-memory error, nothing else (a wrong input is the user's to see)."""
    assert tf_function._out_of_memory(tf.errors.ResourceExhaustedError(None, None, "OOM when allocating"))  # noqa: SLF001
    assert not tf_function._out_of_memory(tf.errors.InvalidArgumentError(None, None, "bad shape"))  # noqa: SLF001
    assert not tf_function._out_of_memory(ValueError("x"))  # noqa: SLF001


def _this_machine_as(monkeypatch, spec: str):
    """Make ``target="auto"`` resolve to target ``spec`` (a GPU this CPU-only machine lacks)."""
    import amp_rewrite.api as api

    real = api.resolve_target
    gpu = real(spec)
    monkeypatch.setattr(api, "resolve_target", lambda target: gpu if target == "auto" else real(target))
    return gpu


@pytest.fixture
def on_a_gpu(monkeypatch):
    """This machine as a GPU of compute capability 8.0: ``target="auto"`` resolves to it."""
    return _this_machine_as(monkeypatch, "gpu:8.0")


def test_auto_measure_steps_is_for_the_optimal_planner_on_this_gpu_without_xla(on_a_gpu):
    """Left out, ``measure_steps`` is 3 where the cost model is least sure of its whole-step
    verdict: the optimal planner, on this machine's GPU (target ``"auto"``), without XLA.  A
    compiled step, the greedy lists, or a target named for another machine are not measured."""
    auto = tf_function.auto_measure_steps
    assert auto({"target": "auto", "lists": "optimal"}, compiled=False) == 3
    assert auto({"lists": "optimal", "precision": "bfloat16"}, compiled=False) == 3
    assert auto({"target": "auto", "lists": "optimal"}, compiled=True) == 0
    assert auto({"target": "auto", "lists": "default"}, compiled=False) == 0
    assert auto({"target": "gpu:8.0", "lists": "optimal"}, compiled=False) == 0
    assert auto({"target": "auto", "lists": "no-such-profile"}, compiled=False) == 0


def test_auto_measure_steps_is_off_on_a_cpu_and_a_gpu_that_cannot_profit(monkeypatch):
    """On this CPU (no GPU) the model's margin is the planner's own, and a GPU without Tensor
    Cores converts nothing: nothing is measured."""
    assert tf_function.auto_measure_steps({"target": "auto", "lists": "optimal"}, compiled=False) == 0
    for machine, steps in (("gpu:6.1", 0), ("gpu:6.1,8.0", 0), ("gpu:8.0,6.1", 3)):  # GPU:0 runs the steps
        _this_machine_as(monkeypatch, machine)
        assert tf_function.auto_measure_steps({"target": "auto", "lists": "optimal"}, compiled=False) == steps


def _keras_model_and_data(units: int = 256, rows: int = 32 * 9, **options):
    """A Keras MLP (``units`` wide) compiled without XLA around our optimizer with
    ``options``, and ``rows`` examples (nine batches of 32 by default)."""
    import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((64,))
    hidden = keras.layers.Dense(units, activation="relu")(keras.layers.Dense(units, activation="relu")(inp))
    model = keras.Model(inp, keras.layers.Dense(10)(hidden))
    opt = amp_rewrite.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.01), precision="float16",
                                                           lists="optimal", **options)
    model.compile(opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    rng = np.random.default_rng(0)
    return model, rng.random((rows, 64), dtype=np.float32), rng.integers(0, 10, rows)


def test_the_optimal_planner_on_a_gpu_without_xla_measures_by_default(on_a_gpu, caplog):
    """With the optimal lists on this machine's GPU and no XLA, a training step chooses by
    timing without being asked (one INFO line says why and how to turn it off); the predict
    step, whose outputs would come from alternating candidates, is not timed; and
    ``measure_steps=0`` trusts the estimate."""
    model, x, y = _keras_model_and_data()
    with caplog.at_level(logging.INFO, logger="amp_rewrite"):
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)
        model.predict(x[:64], batch_size=32, verbose=0)
    (measured,) = model.train_function.amp_function.measured_choices
    assert measured["chosen"] is not None and len(measured["candidates"]) >= 2
    assert model.predict_function.amp_function.measured_choices == []
    assert int(model.optimizer.iterations.numpy()) == 9
    assert any("least sure" in r.getMessage() and "measure_steps=0 trusts the estimate" in r.getMessage()
               and r.levelno == logging.INFO for r in caplog.records)
    model, x, y = _keras_model_and_data(measure_steps=0)
    model.fit(x[:64], y[:64], batch_size=32, epochs=1, verbose=0)
    assert model.train_function.amp_function.measured_choices == []


def test_a_step_measured_by_default_that_reduces_across_workers_says_so_at_info(on_a_gpu, monkeypatch, caplog):
    """Measuring nobody asked for is not a request left undone: no WARNING where it cannot be
    done (a step that reduces across workers), one INFO line."""
    monkeypatch.setattr(tf_function, "_cross_worker_reason",
                        lambda graph_def: "it reduces across workers (CollectiveReduceV2 'r' on /job:worker)")
    model, x, y = _keras_model_and_data()
    with caplog.at_level(logging.INFO, logger="amp_rewrite"):
        model.fit(x[:64], y[:64], batch_size=32, epochs=1, verbose=0)
    assert model.train_function.amp_function.measured_choices == []
    assert not any(r.levelno >= logging.WARNING and "measure" in r.getMessage() for r in caplog.records)
    assert any("its steps are not measured (it reduces across workers" in r.getMessage() for r in caplog.records)


def test_a_step_measured_by_default_keeps_the_whole_step_check_where_it_cannot_be_timed(monkeypatch):
    """A training step first called inside another tf.function cannot be timed and runs as
    planned: measuring by default must not have dropped the whole-step check there (asked-for
    measuring skips it, its float32 candidate being timed instead).  On a Volta, where the
    planner converts this MLP."""
    _this_machine_as(monkeypatch, "gpu:7.0")
    calls = []
    real = tf_function.Function._float32_if_faster

    def spy(self, *args, **kwargs):
        calls.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(tf_function.Function, "_float32_if_faster", spy)
    model, x, y = _keras_model_and_data(2048, 512)  # the planner converts it (at batch 32 it does not)
    model.fit(x, y, batch_size=512, epochs=1, verbose=0)
    assert calls  # checked (called only where the planned rewrite converted), and measured
    calls.clear()
    model, x, y = _keras_model_and_data(2048, 512, measure_steps=2)
    model.fit(x, y, batch_size=512, epochs=1, verbose=0)
    assert not calls
