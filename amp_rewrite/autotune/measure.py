"""Autotune's measurement: the candidates, timing step functions round-robin over fresh sets
of sessions (:func:`_measure`, :func:`_tune`), and running a GraphDef as users run it
(:func:`session_config`, :func:`_graph_runner`).  Nothing here rewrites a graph."""

from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from .inputs import _first_line
from .stats import (FLOAT32, MIN_PROOF_ROUNDS, _decide, compare, decision_rule, relative_error,
                             result_line)
from ..errors import AmpRewriteError
from ..progress import Progress

# Every autotune module logs as amp_rewrite.autotune, the name the CLI's log lines always showed.
log = logging.getLogger("amp_rewrite.autotune")


#: Named candidates: the rewrite options each one sets on top of the caller's.
CANDIDATES: Mapping[str, Mapping[str, Any]] = {
    # TensorFlow's own lists and greedy passes: the graph TensorFlow's pass would produce.
    "tensorflow": {"lists": "tensorflow", "planner": "greedy"},
    # The caller's lists with the greedy planner (the default profile's behaviour).
    "greedy": {"planner": "greedy"},
    # The caller's lists with the cost-aware minimum-cut planner.
    "optimal": {"planner": "optimal"},
    "min-casts": {"planner": "min-casts"},
}


DEFAULT_CANDIDATES: tuple[str, ...] = ("tensorflow", "greedy", "optimal")


#: Sets of fresh sessions the rounds are spread over by default (see :func:`_tune`).
DEFAULT_SESSIONS = 3


#: A step: runs the graph once and returns its outputs.
StepFn = Callable[[], Sequence[Any]]


def candidate_options(candidates: Sequence[str] | Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Named candidates -> their rewrite options.  A sequence names entries of
    :data:`CANDIDATES`; a mapping gives options directly (``{"mine": {"lists": "x.toml"}}``).
    Raises :class:`AmpRewriteError` for an unknown or reserved name, or no candidate."""
    if isinstance(candidates, Mapping):
        out = {str(k): dict(v) for k, v in candidates.items()}
    else:
        out = {}
        for name in candidates:
            if name not in CANDIDATES:
                raise AmpRewriteError(f"unknown autotune candidate {name!r}; expected one of "
                                      f"{', '.join(CANDIDATES)}")
            out[name] = dict(CANDIDATES[name])
    if FLOAT32 in out:
        raise AmpRewriteError("'float32' is always a candidate (the original graph); do not name it")
    if not out:
        raise AmpRewriteError("autotune needs at least one candidate")
    return out


def _measure(steps_fns: Mapping[str, StepFn], repeats: int, steps: int, max_repeats: int,
             settled: Callable[[Mapping[str, Sequence[float]], int], bool], *,
             renew: Callable[[], Mapping[str, StepFn]] | None = None,
             per_session: int = 0,
             on_round: Callable[[int, int], None] | None = None) -> dict[str, list[float]]:
    """Per-round seconds per step of each step function (each the median of ``steps``
    steps), sampled round-robin so that drift on a shared machine hits every candidate alike.
    ``repeats`` rounds, then more, up to ``max_repeats``, until ``settled(samples,
    rounds_left)``: a rewrite that looks faster but is not yet beyond chance earns more
    rounds, not a verdict.

    With ``renew``, every ``per_session`` rounds the step functions are replaced by
    ``renew()``'s (fresh sessions; see :func:`_tune`).  A name it no longer returns could not
    run again: its samples are dropped, so it loses.  ``on_round(rounds, session)`` is
    called before each round (1-based: the round about to be timed, the set of sessions it
    runs in), for progress reports.
    """
    fns = dict(steps_fns)
    samples: dict[str, list[float]] = {n: [] for n in fns}
    rounds = 0
    session = 1
    while True:
        if renew is not None and per_session > 0 and rounds and rounds % per_session == 0:
            session += 1
            fns = dict(renew())
            for gone in [n for n in samples if n not in fns]:
                del samples[gone]
        if on_round is not None:
            on_round(rounds + 1, session)
        for name, step in fns.items():
            times = []
            for _ in range(steps):
                t = time.perf_counter()
                step()
                times.append(time.perf_counter() - t)
            samples[name].append(statistics.median(times))
        rounds += 1
        if rounds >= max_repeats or (rounds >= repeats and settled(samples, max_repeats - rounds)):
            return samples


def _cannot_run(name: str, exc: BaseException) -> None:
    """A graph failed to build or run: float32 failing is the caller's error (bad feeds),
    raised as :class:`AmpRewriteError`; a candidate failing is logged and loses."""
    if name == FLOAT32:
        raise AmpRewriteError(f"the original graph does not run with these inputs: {_first_line(exc)}") from None
    log.warning("autotune: candidate %s cannot run here: %s", name, _first_line(exc))


def _same_as(keys: Mapping[str, bytes | None]) -> dict[str, str]:
    """Candidates whose graph is the same as an earlier one's (float32 first): ``None`` as a
    key means "unchanged", i.e. float32's graph.  Returns ``{later: earlier}``."""
    first: dict[bytes | None, str] = {}
    aliases = {}
    for name, key in keys.items():
        if key in first:
            aliases[name] = first[key]
        else:
            first[key] = name
    return aliases


def _unchanged(report: Mapping[str, Any]) -> bool:
    """Whether a rewrite's report says it changed nothing (no conversion, no Cast)."""
    return not (report["converted_attrs"] or report["casts_to_low"] or report["casts_to_high"])


@dataclass(frozen=True)
class Tuning:
    """What :func:`_tune` measured and chose.

    ``step_ms``: median ms per step; ``ratio``: median over rounds of (time / float32's
    time); ``wins``: rounds a candidate beat float32 by the required gain; ``rel_error``:
    output error against float32; ``rounds``: rounds timed; ``rule``: why the choice won
    (:func:`decision_rule`); ``p_value``: each candidate's sign test.  Candidates whose
    graph is the same as an earlier one's carry that one's numbers.  All in the order of the
    makers.
    """

    choice: str
    step_ms: dict[str, float]
    rel_error: dict[str, float]
    ratio: dict[str, float]
    wins: dict[str, int]
    rounds: int
    sessions: int = 1
    rule: str = ""
    p_value: dict[str, float] = field(default_factory=dict)


def _tune(makers: Mapping[str, Callable[[], tuple[StepFn, Callable[[], None]]]], *, repeats: int,
          steps: int, max_rel_error: float | None, min_gain: float,
          same_as: Mapping[str, str] | None = None, max_repeats: int | None = None,
          sessions: int = 1, progress: Progress | None = None) -> Tuning:
    """Build every runner (float32 first), compare outputs, time, choose (:func:`_decide`).

    ``makers`` maps a name to a function returning ``(step, close)``, float32 first, then
    the candidates in the caller's order.  float32 failing to run is the caller's error
    (bad feeds); a candidate failing to run just loses.  A candidate in ``same_as`` has the
    same graph as an earlier one: it is not run again (two timings of one graph would let
    noise pick between them), it gets that one's numbers, and the earlier one is chosen in
    its place.  ``repeats`` rounds are timed, and more up to ``max_repeats`` (default
    :func:`default_max_repeats`) while the choice is not settled.

    The rounds are spread over ``sessions`` sets of fresh runners (``ceil(repeats /
    sessions)`` rounds each; with more than one set, rounds beyond ``repeats`` open more).  A graph's speed
    depends on the session it runs in, not only on the graph: DenseNet121's training step,
    the same graph in four sessions of one process, ran 87-102 ms per step, each session
    steadily (measured 2026-11-25; where its buffers land, presumably).  Paired rounds cannot
    cancel that, since it follows a session for its whole life; several sessions average it.

    ``progress`` hears of each set of sessions opened and each round
    (:meth:`~amp_rewrite.progress.Progress.event`), and of the choice.
    """
    _check_rounds(repeats, steps, sessions, max_repeats)
    same_as = dict(same_as or {})
    limit = max(repeats, max_repeats if max_repeats is not None else default_max_repeats(repeats))
    runners = _Runners(makers, same_as, sessions, progress)
    per_session = math.ceil(repeats / sessions) if sessions > 1 else 0

    try:
        runners.open_all()
        outputs = runners.outputs
        errors = {n: relative_error(outputs[n], outputs[FLOAT32]) for n in runners.open if n != FLOAT32}
        samples = _measure(runners.steps(), repeats, steps, limit,
                           lambda s, left: _decide(s, errors, max_rel_error, min_gain, rounds_left=left)[1],
                           renew=runners.renew, per_session=per_session,
                           on_round=_round_reporter(progress, repeats, limit, sessions, per_session))
    finally:
        runners.close()
    opened = runners.opened
    choice, _ = _decide(samples, errors, max_rel_error, min_gain)
    rule = decision_rule(samples, errors, max_rel_error, min_gain,
                         untimed=[n for n, s in same_as.items() if s == FLOAT32])
    step_ms, rel_error, ratio, wins, p_value = _per_candidate(list(makers), same_as, samples, errors, min_gain)
    rounds = len(samples[FLOAT32])
    log.info("%s", result_line(step_ms=step_ms, ratio=ratio, wins=wins, rel_error=rel_error, same_as=same_as,
                               rounds=rounds, sessions=opened, min_gain=min_gain, rule=rule))
    if progress is not None:
        progress.event(f"autotune: done after {rounds} rounds; {rule.split(' -- ')[0]}")
    return Tuning(choice, step_ms, rel_error, ratio, wins, rounds, opened, rule, p_value)


class _Runners:
    """The runners :func:`_tune` times: one ``(step, close)`` per graph that runs, opened
    a set of sessions at a time.

    ``open`` holds the runners of the current set by name (float32 first), ``outputs`` the
    first set's outputs (for the error check), ``opened`` how many sets were opened.
    Mutates only itself; every runner it opened is closed by :meth:`renew` or :meth:`close`.
    """

    def __init__(self, makers: Mapping[str, Callable[[], tuple[StepFn, Callable[[], None]]]],
                 same_as: Mapping[str, str], sessions: int, progress: Progress | None) -> None:
        self.makers = makers
        self.same_as = same_as
        self.sessions = sessions
        self.progress = progress
        self.open: dict[str, tuple[StepFn, Callable[[], None]]] = {}
        self.outputs: dict[str, Sequence[Any]] = {}
        self.opened = 0

    def open_all(self) -> None:
        """Opens a runner per graph into ``open`` and runs each once: the first set's
        outputs are kept for the error check, and the run is the warm-up (kernels,
        Grappler, oneDNN primitives) every set needs before it is timed.  A graph that
        failed in an earlier set is not opened again."""
        first = self.opened == 0
        self.opened += 1
        if self.progress is not None:
            # Loading a SavedModel and the warm-up step can take as long as many rounds.
            self.progress.event(f"autotune: loading and warming up every model, session "
                                f"{_of(self.opened, self.sessions)}")
        for name, make in self.makers.items():
            if name in self.same_as or (not first and name not in self.open):
                continue
            try:
                runner = make()
            except AmpRewriteError:
                raise
            except Exception as exc:  # noqa: BLE001 - a candidate that cannot run loses
                _cannot_run(name, exc)
                self.open.pop(name, None)
                continue
            self.open[name] = runner
            try:
                out = runner[0]()
            except Exception as exc:  # noqa: BLE001
                _cannot_run(name, exc)
                del self.open[name]
                runner[1]()
                continue
            if first:
                self.outputs[name] = out

    def steps(self) -> dict[str, StepFn]:
        """The step function of each open runner."""
        return {n: r[0] for n, r in self.open.items()}

    def renew(self) -> dict[str, StepFn]:
        """Closes the open runners and opens a fresh set (:meth:`open_all`); its steps."""
        self.close()
        self.open_all()
        return self.steps()

    def close(self) -> None:
        """Closes every open runner (they stay in ``open``, for :meth:`open_all` to renew)."""
        for _, close in self.open.values():
            close()


def _per_candidate(names: Sequence[str], same_as: Mapping[str, str], samples: Mapping[str, Sequence[float]],
                   errors: Mapping[str, float], min_gain: float
                   ) -> tuple[dict[str, float], dict[str, float], dict[str, float], dict[str, int], dict[str, float]]:
    """:class:`Tuning`'s per-candidate numbers in the order of ``names``: median ms per step,
    output error, median ratio, rounds won and sign test p.  A candidate in ``same_as`` gets
    the numbers of the graph it shares (float32's: ratio 1, no wins, no error); one absent
    from ``samples`` (it could not run) gets none.  Pure."""
    comps = compare(samples, min_gain)
    step_ms: dict[str, float] = {}
    rel_error: dict[str, float] = {}
    ratio: dict[str, float] = {}
    wins: dict[str, int] = {}
    p_value: dict[str, float] = {}
    for name in names:
        source = same_as.get(name, name)
        if source not in samples:
            continue
        step_ms[name] = statistics.median(samples[source]) * 1e3
        if name != FLOAT32:
            rel_error[name] = 0.0 if source == FLOAT32 else errors[source]
            ratio[name] = 1.0 if source == FLOAT32 else comps[source].ratio
            wins[name] = 0 if source == FLOAT32 else comps[source].wins
            p_value[name] = 1.0 if source == FLOAT32 else comps[source].p_value
    return step_ms, rel_error, ratio, wins, p_value


def _round_reporter(progress: Progress | None, repeats: int, limit: int, sessions: int,
                    per_session: int) -> Callable[[int, int], None] | None:
    """``on_round`` for :func:`_measure` that tells ``progress`` of each round (``None``
    without one).  The first round of each set of sessions is a milestone, so a log shows
    every set; the other rounds are rate-limited by the :class:`Progress`."""
    if progress is None:
        return None

    def on_round(done: int, session: int) -> None:
        # Rounds past ``repeats`` are timed only while the choice is undecided: say so.
        which = f"round {done}/{repeats}" if done <= repeats else f"extra round {done}/{limit} (undecided)"
        progress.event(f"autotune: {which}, session {_of(session, sessions)}",
                       milestone=done == 1 or (per_session > 0 and (done - 1) % per_session == 0))

    return on_round


def _of(session: int, planned: int) -> str:
    """``2/3`` for the second of three planned sets of sessions; ``4`` for one opened past
    the plan (extra rounds of an undecided choice).  Pure."""
    return f"{session}/{planned}" if session <= planned else str(session)


def _check_rounds(repeats: int, steps: int, sessions: int, max_repeats: int | None) -> None:
    """Raises :class:`AmpRewriteError` for counts of rounds, steps or sessions that cannot be
    measured (every entry point checks them before any rewrite or timing starts)."""
    if repeats < 1 or steps < 1 or sessions < 1:
        raise AmpRewriteError("autotune needs repeats >= 1, steps >= 1 and sessions >= 1")
    if max_repeats is not None and max_repeats < max(repeats, MIN_PROOF_ROUNDS):
        raise AmpRewriteError(
            f"autotune's max_repeats must be at least repeats and at least {MIN_PROOF_ROUNDS}: in "
            "fewer rounds no rewrite can be shown faster than float32 beyond chance")


def default_max_repeats(repeats: int) -> int:
    """Most rounds :func:`_tune` times by default: three times ``repeats``, and at least 10,
    since the sign test cannot tell a rewrite from chance in fewer than 5."""
    return max(3 * repeats, 10)


def session_config() -> Any:
    """A new ``ConfigProto`` for timing a graph as users run it: Grappler on (constant folding
    removes Casts of constants, the remapper fuses ops), every one of TensorFlow's own
    mixed-precision passes off, so nothing is rewritten twice."""
    import tensorflow as tf
    from tensorflow.core.protobuf import rewriter_config_pb2

    config = tf.compat.v1.ConfigProto()
    ro = config.graph_options.rewrite_options
    off = rewriter_config_pb2.RewriterConfig.OFF
    ro.auto_mixed_precision = ro.auto_mixed_precision_onednn_bfloat16 = off
    ro.auto_mixed_precision_mkl = ro.auto_mixed_precision_cpu = off
    return config


def _graph_runner(graph_def: Any, feeds: Mapping[str, Any], fetches: Sequence[str]) -> tuple[StepFn, Callable[[], None]]:
    """A session over ``graph_def`` as users run it (:func:`session_config`)."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    out = [graph.get_tensor_by_name(f if ":" in f else f + ":0") for f in fetches]
    feed = {graph.get_tensor_by_name(k if ":" in k else k + ":0"): v for k, v in feeds.items()}
    sess = tf.compat.v1.Session(graph=graph, config=session_config())
    return (lambda: sess.run(out, feed)), sess.close
