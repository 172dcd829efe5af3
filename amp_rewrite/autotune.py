"""Autotuning: time candidate rewrites on the local device and keep the fastest.

The optimal planner's cost model ranks colourings by estimate; on a given machine an
estimate can be wrong (kernel fusions, cache effects, a noisy neighbour).  Autotuning
measures instead: it rewrites the graph once per *candidate* (a named set of rewrite
options, e.g. TensorFlow's lists, the default profile, the optimal planner), runs every
candidate and the float32 original on this machine, round-robin, and keeps the rewrite
with the best median ratio to float32 among those that beat float32 by a margin (2% by
default) beyond chance, so that the result is never measurably slower than not rewriting.

The decision is paired: each round times every candidate and float32 back to back, and a
candidate is judged by its per-round ratios to float32 (a slow spell of a shared machine
hits both sides of a ratio), by their median and by a one-sided sign test on the rounds it
won (:func:`_decide`).  A rewrite that looks faster but is not yet beyond chance earns more
rounds, up to a limit, rather than a verdict either way.  Candidates whose graph is the
same as another's are timed once.  Each candidate's outputs are compared with float32's on the same inputs;
``max_rel_error`` rules out candidates that are fast but too far off.

Two entry points:

* :func:`autotune` -- a GraphDef, with the caller's feeds and fetches (or the caller's own
  runner, e.g. one that feeds variables);
* :func:`autotune_model` -- a model file (a SavedModel's signature or a frozen GraphDef's
  placeholders), with random inputs of a given batch size; ``amp-rewrite rewrite --autotune``
  is this.

It runs graphs, so naturally it has to run on a machine of the kind the graph is rewritten
for.  The caller's graph and model are never modified.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .api import RewriteResult, rewrite_graph_def
from .errors import AmpRewriteError

__all__ = [
    "AutotuneOptions",
    "AutotuneResult",
    "CANDIDATES",
    "Comparison",
    "DEFAULT_CANDIDATES",
    "DEFAULT_SESSIONS",
    "ModelAutotune",
    "autotune",
    "autotune_model",
    "candidate_options",
    "compare",
    "default_max_repeats",
    "session_config",
    "sign_test_p",
]

log = logging.getLogger(__name__)

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
FLOAT32 = "float32"

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


@dataclass(frozen=True)
class AutotuneOptions:
    """How :func:`autotune_model` measures.

    ``candidates`` as for :func:`candidate_options`; ``repeats`` rounds of ``steps`` steps
    per candidate (medians), and more up to ``max_repeats`` (default
    :func:`default_max_repeats`) while a rewrite looks faster but is not proven; ``batch`` replaces each input's unknown first dimension, and
    ``shapes`` gives whole shapes by input name; ``signature`` picks the SavedModel
    signature to time (default ``serving_default``, else the first); ``max_rel_error``
    rules out candidates whose outputs differ more from float32's (max abs difference over
    max abs value, per output); a rewrite is chosen only when it beats float32 by
    ``min_gain`` (a fraction of float32's step time); ``seed`` makes the random inputs reproducible;
    the rounds are spread over ``sessions`` fresh sessions (or loads) of every graph, since a
    graph's speed also depends on the session it runs in (:func:`_tune`).
    """

    candidates: Sequence[str] | Mapping[str, Mapping[str, Any]] = DEFAULT_CANDIDATES
    repeats: int = 5
    steps: int = 3
    max_repeats: int | None = None
    batch: int = 1
    shapes: Mapping[str, Sequence[int]] = field(default_factory=dict)
    signature: str | None = None
    max_rel_error: float | None = None
    min_gain: float = 0.02
    seed: int = 0
    sessions: int = DEFAULT_SESSIONS

    def check(self) -> None:
        """Raises :class:`AmpRewriteError` for settings that cannot be measured."""
        _check_rounds(self.repeats, self.steps, self.sessions, self.max_repeats)
        if self.batch < 1:
            raise AmpRewriteError("autotune needs a batch size >= 1")
        if not 0 <= self.min_gain < 1:
            raise AmpRewriteError("autotune's min_gain must be in [0, 1)")
        if self.max_rel_error is not None and not self.max_rel_error >= 0:
            raise AmpRewriteError("autotune's max relative error must be >= 0")
        for name, dims in self.shapes.items():
            if any(int(d) < 0 for d in dims):
                raise AmpRewriteError(f"autotune shape for {name!r} has a negative dimension")
        candidate_options(self.candidates)


@dataclass(frozen=True)
class AutotuneResult:
    """The winner of :func:`autotune` and what was measured.

    ``choice`` is ``"float32"`` (keep the original graph) or a candidate name;
    ``graph_def`` is the graph to use; ``result`` the winning :class:`RewriteResult`
    (``None`` for float32); ``step_ms`` the median step time of every candidate that ran;
    ``rel_error`` each candidate's output error against float32; ``same_as`` the
    candidates whose graph is the same as an earlier one's (``"float32"`` when the rewrite
    changed nothing), which were not timed separately; ``ratio_to_float32`` each candidate's
    median over rounds of its step time over float32's in the same round, ``wins`` the rounds
    it beat float32 by ``min_gain``, ``rounds`` the rounds timed and ``sessions`` the sets
    of fresh sessions they were spread over.
    """

    choice: str
    graph_def: Any
    result: RewriteResult | None
    step_ms: Mapping[str, float] = field(default_factory=dict)
    rel_error: Mapping[str, float] = field(default_factory=dict)
    same_as: Mapping[str, str] = field(default_factory=dict)
    ratio_to_float32: Mapping[str, float] = field(default_factory=dict)
    wins: Mapping[str, int] = field(default_factory=dict)
    rounds: int = 0
    sessions: int = 1


# ------------------------------------------------------------------------ measuring


def relative_error(got: Sequence[Any], ref: Sequence[Any]) -> float:
    """Max over outputs of ``max|got - ref| / max|ref|`` (in float64).  Outputs of another
    shape, or non-finite where the reference is finite, count as infinitely wrong."""
    worst = 0.0
    for g, r in zip(got, ref):
        g64, r64 = np.asarray(g, np.float64), np.asarray(r, np.float64)
        if g64.shape != r64.shape:
            return float("inf")
        if r64.size == 0:
            continue
        finite = np.isfinite(r64)
        if np.any(~np.isfinite(g64) & finite):
            return float("inf")
        if not np.any(finite):
            continue
        scale = max(float(np.max(np.abs(r64[finite]))), 1e-30)
        worst = max(worst, float(np.max(np.abs(g64[finite] - r64[finite]))) / scale)
    return worst


#: Significance of the sign test that a rewrite must pass to be chosen over float32.  The
#: test is checked again after each extra round (and per candidate), so the chance that noise
#: alone picks a rewrite is somewhat above it; ``min_gain`` makes the null conservative.
ALPHA = 0.05
#: Fewest rounds in which the sign test can prove anything at :data:`ALPHA` (all won: 2**-5).
MIN_PROOF_ROUNDS = 5


def sign_test_p(wins: int, rounds: int) -> float:
    """One-sided sign test: the chance of at least ``wins`` successes in ``rounds`` fair coin
    flips (1.0 for no rounds).  Pure."""
    if rounds <= 0:
        return 1.0
    return sum(math.comb(rounds, k) for k in range(max(wins, 0), rounds + 1)) / 2.0 ** rounds


@dataclass(frozen=True)
class Comparison:
    """One candidate against float32 over paired rounds (each round times every candidate
    and float32 back to back, so a slow spell of a shared machine hits both sides).

    ``ratio`` is the median over rounds of (candidate time / float32 time); ``wins`` the
    rounds in which the candidate beat float32 by at least the required gain; ``p_value``
    the sign test of those wins against chance (:func:`sign_test_p`).
    """

    ratio: float
    wins: int
    rounds: int
    p_value: float

    def proven(self, min_gain: float, alpha: float = ALPHA) -> bool:
        """Faster than float32 by ``min_gain``, in the median and beyond chance."""
        return self.ratio <= 1.0 - min_gain and self.p_value <= alpha


def compare(samples: Mapping[str, Sequence[float]], min_gain: float) -> dict[str, Comparison]:
    """Each candidate of ``samples`` (per-round times, float32's among them) against float32,
    round by round.  Pure."""
    base = samples[FLOAT32]
    out = {}
    for name, times in samples.items():
        if name == FLOAT32:
            continue
        # A timer that reads 0 must not drop the round (rounds would then differ per candidate).
        ratios = [t / max(b, 1e-12) for t, b in zip(times, base)]
        wins = sum(r <= 1.0 - min_gain for r in ratios)
        out[name] = Comparison(statistics.median(ratios) if ratios else float("inf"), wins, len(ratios),
                               sign_test_p(wins, len(ratios)))
    return out


def _decide(samples: Mapping[str, Sequence[float]], rel_error: Mapping[str, float],
            max_rel_error: float | None, min_gain: float, alpha: float = ALPHA,
            rounds_left: int = 0) -> tuple[str, bool]:
    """``(choice, settled)`` from the per-round times so far.  Pure.

    The choice is the admissible candidate with the lowest median ratio to float32 among
    those *proven* faster (:meth:`Comparison.proven`), else float32: a rewrite has to earn
    its place, and a margin within the noise would let chance pick it.  Ties go to the
    earlier candidate.  The decision is *settled* when no admissible candidate that is not
    proven yet has a lower median ratio than the choice (or than ``1 - min_gain`` when
    float32 is the choice) and could still be proven by winning the ``rounds_left`` rounds
    that may follow: more rounds could then only confirm what is chosen.
    """
    if FLOAT32 not in samples:
        return FLOAT32, True
    order = list(samples)
    comps = compare(samples, min_gain)
    rivals = [n for n in order if n in comps and (max_rel_error is None
                                                   or rel_error.get(n, float("inf")) <= max_rel_error)]
    proven = [n for n in rivals if comps[n].proven(min_gain, alpha)]
    choice = min(proven, key=lambda n: (comps[n].ratio, order.index(n))) if proven else FLOAT32
    bar = comps[choice].ratio if proven else 1.0 - min_gain
    settled = not any(
        comps[n].ratio < bar
        and sign_test_p(comps[n].wins + rounds_left, comps[n].rounds + rounds_left) <= alpha
        for n in rivals if n not in proven)
    return choice, settled


def _measure(steps_fns: Mapping[str, StepFn], repeats: int, steps: int, max_repeats: int,
             settled: Callable[[Mapping[str, Sequence[float]], int], bool], *,
             renew: Callable[[], Mapping[str, StepFn]] | None = None,
             per_session: int = 0) -> dict[str, list[float]]:
    """Per-round seconds per step of each step function (each the median of ``steps``
    steps), sampled round-robin so that drift on a shared machine hits every candidate alike.
    ``repeats`` rounds, then more, up to ``max_repeats``, until ``settled(samples,
    rounds_left)``: a rewrite that looks faster but is not yet beyond chance earns more
    rounds, not a verdict.

    With ``renew``, every ``per_session`` rounds the step functions are replaced by
    ``renew()``'s (fresh sessions; see :func:`_tune`).  A name it no longer returns could not
    run again: its samples are dropped, so it loses.
    """
    fns = dict(steps_fns)
    samples: dict[str, list[float]] = {n: [] for n in fns}
    rounds = 0
    while True:
        if renew is not None and per_session > 0 and rounds and rounds % per_session == 0:
            fns = dict(renew())
            for gone in [n for n in samples if n not in fns]:
                del samples[gone]
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


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


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
    output error against float32; ``rounds``: rounds timed.  Candidates whose graph is the
    same as an earlier one's carry that one's numbers.  All in the order of the makers.
    """

    choice: str
    step_ms: dict[str, float]
    rel_error: dict[str, float]
    ratio: dict[str, float]
    wins: dict[str, int]
    rounds: int
    sessions: int = 1


def _tune(makers: Mapping[str, Callable[[], tuple[StepFn, Callable[[], None]]]], *, repeats: int,
          steps: int, max_rel_error: float | None, min_gain: float,
          same_as: Mapping[str, str] | None = None, max_repeats: int | None = None,
          sessions: int = 1) -> Tuning:
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
    """
    _check_rounds(repeats, steps, sessions, max_repeats)
    same_as = dict(same_as or {})
    limit = max(repeats, max_repeats if max_repeats is not None else default_max_repeats(repeats))
    runners: dict[str, tuple[StepFn, Callable[[], None]]] = {}
    outputs: dict[str, Sequence[Any]] = {}
    opened = 0

    def open_all() -> None:
        """Opens a runner per graph into ``runners`` and runs each once: the first set's
        outputs are kept for the error check, and the run is the warm-up (kernels,
        Grappler, oneDNN primitives) every set needs before it is timed."""
        nonlocal opened
        first = opened == 0
        opened += 1
        for name, make in makers.items():
            if name in same_as or (not first and name not in runners):
                continue
            try:
                runner = make()
            except AmpRewriteError:
                raise
            except Exception as exc:  # noqa: BLE001 - a candidate that cannot run loses
                _cannot_run(name, exc)
                runners.pop(name, None)
                continue
            runners[name] = runner
            try:
                out = runner[0]()
            except Exception as exc:  # noqa: BLE001
                _cannot_run(name, exc)
                del runners[name]
                runner[1]()
                continue
            if first:
                outputs[name] = out

    def renew() -> dict[str, StepFn]:
        for _, close in runners.values():
            close()
        open_all()
        return {n: r[0] for n, r in runners.items()}

    try:
        open_all()
        errors = {n: relative_error(outputs[n], outputs[FLOAT32]) for n in runners if n != FLOAT32}
        samples = _measure({n: r[0] for n, r in runners.items()}, repeats, steps, limit,
                           lambda s, left: _decide(s, errors, max_rel_error, min_gain, rounds_left=left)[1],
                           renew=renew, per_session=math.ceil(repeats / sessions) if sessions > 1 else 0)
    finally:
        for _, close in runners.values():
            close()
    choice, _ = _decide(samples, errors, max_rel_error, min_gain)
    comps = compare(samples, min_gain)
    step_ms: dict[str, float] = {}
    rel_error: dict[str, float] = {}
    ratio: dict[str, float] = {}
    wins: dict[str, int] = {}
    for name in makers:
        source = same_as.get(name, name)
        if source not in samples:
            continue
        step_ms[name] = statistics.median(samples[source]) * 1e3
        if name != FLOAT32:
            rel_error[name] = 0.0 if source == FLOAT32 else errors[source]
            ratio[name] = 1.0 if source == FLOAT32 else comps[source].ratio
            wins[name] = 0 if source == FLOAT32 else comps[source].wins
    rounds = len(samples[FLOAT32])
    log.info("autotune: %s -> %s after %d rounds in %d sets of sessions", ", ".join(
        f"{n} {ms:.2f} ms" + (f" (x{ratio[n]:.3f} of float32, faster in {wins[n]}/{rounds} rounds, "
                              f"rel. error {rel_error[n]:.1e})" if n in rel_error else "")
        + (f" (same graph as {same_as[n]})" if n in same_as else "")
        for n, ms in step_ms.items()), choice, rounds, opened)
    return Tuning(choice, step_ms, rel_error, ratio, wins, rounds, opened)


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


# ------------------------------------------------------------------------ GraphDefs


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


def autotune(
    graph_def: Any,
    *,
    feeds: Mapping[str, Any] | None = None,
    fetches: Sequence[str],
    candidates: Sequence[str] | Mapping[str, Mapping[str, Any]] = DEFAULT_CANDIDATES,
    repeats: int = 5,
    steps: int = 3,
    max_rel_error: float | None = None,
    min_gain: float = 0.02,
    runner: Callable[[Any], tuple[StepFn, Callable[[], None]]] | None = None,
    max_repeats: int | None = None,
    sessions: int = DEFAULT_SESSIONS,
    **rewrite_options: Any,
) -> AutotuneResult:
    """Rewrite ``graph_def`` once per candidate, time each and float32, return the fastest.

    ``feeds`` maps placeholder tensors (``"x:0"``) to values; ``fetches`` are the tensors a
    step computes (the rewrite preserves them).  Instead of feeds, ``runner`` may build
    the step itself: called with a GraphDef, it returns ``(step, close)`` where ``step()``
    runs one step and returns the outputs (e.g. a session that feeds variables).  A rewrite
    is chosen only if it beats float32 by ``min_gain`` (2% by default) in the median of the
    per-round ratios *and* in enough rounds to rule out chance (a one-sided sign test at 5%;
    :func:`_decide`); while a rewrite looks faster but is not proven, more rounds are timed,
    up to ``max_repeats`` (default :func:`default_max_repeats`).  The rounds are spread over
    ``sessions`` fresh runners per graph (``runner`` is called once per set), since a graph's
    speed also depends on the session it runs in (:func:`_tune`).  Other options go to
    :func:`~amp_rewrite.api.rewrite_graph_def`, under each candidate's.

    Raises :class:`AmpRewriteError` for bad settings or when the original graph cannot run.
    ``graph_def`` is not modified.
    """
    _check_rounds(repeats, steps, sessions, max_repeats)
    if not 0 <= min_gain < 1:
        raise AmpRewriteError("autotune's min_gain must be in [0, 1)")
    if runner is None and feeds is None:
        raise AmpRewriteError("autotune needs feeds (or a runner)")
    options = candidate_options(candidates)
    results = {name: rewrite_graph_def(graph_def, fetches=list(fetches), **{**rewrite_options, **opts})
               for name, opts in options.items()}
    graphs = {FLOAT32: graph_def, **{n: r.graph_def for n, r in results.items()}}
    same_as = _same_as({FLOAT32: None, **{
        n: None if _unchanged(r.report) else r.graph_def.SerializeToString(deterministic=True)
        for n, r in results.items()}})
    make = runner if runner is not None else (lambda gd: _graph_runner(gd, feeds or {}, fetches))
    t = _tune({n: (lambda gd=gd: make(gd)) for n, gd in graphs.items()}, repeats=repeats, steps=steps,
              max_rel_error=max_rel_error, min_gain=min_gain, same_as=same_as, max_repeats=max_repeats,
              sessions=sessions)
    chosen = results.get(t.choice)
    return AutotuneResult(t.choice, graph_def if chosen is None else chosen.graph_def, chosen, t.step_ms,
                          t.rel_error, same_as, t.ratio, t.wins, t.rounds, t.sessions)


# ------------------------------------------------------------------------ model files


@dataclass(frozen=True)
class ModelAutotune:
    """The winner of :func:`autotune_model`.  ``rewrite`` is the winning candidate's
    :class:`~amp_rewrite.saved_model.ModelRewrite`, ``None`` when float32 won."""

    choice: str
    rewrite: Any
    step_ms: Mapping[str, float]
    rel_error: Mapping[str, float]
    inputs: Mapping[str, tuple[int, ...]]
    signature: str | None
    candidates: Mapping[str, Mapping[str, Any]]
    same_as: Mapping[str, str] = field(default_factory=dict)
    ratio_to_float32: Mapping[str, float] = field(default_factory=dict)
    wins: Mapping[str, int] = field(default_factory=dict)
    rounds: int = 0
    sessions: int = 1

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, for the report."""
        return {
            "choice": self.choice,
            "step_ms": {k: round(v, 4) for k, v in self.step_ms.items()},
            "ratio_to_float32": {k: round(v, 4) for k, v in self.ratio_to_float32.items()},
            "faster_rounds": dict(self.wins),
            "rounds": self.rounds,
            "sessions": self.sessions,
            "rel_error": dict(self.rel_error),
            "same_graph_as": dict(self.same_as),
            "signature": self.signature,
            "inputs": {k: list(v) for k, v in self.inputs.items()},
            "candidates": {k: {o: str(v) for o, v in opts.items()} for k, opts in self.candidates.items()},
        }


def _input_value(name: str, dtype: Any, dims: Sequence[int | None], opts: AutotuneOptions,
                 rng: np.random.Generator) -> np.ndarray:
    """A random input: unknown first dimension -> ``opts.batch``; ``opts.shapes[name]``
    overrides the whole shape.  Floats are standard normal, integers and booleans zero (a
    valid index and a valid mask)."""
    if name in opts.shapes:
        shape = tuple(int(d) for d in opts.shapes[name])
    else:
        if dims is None:
            raise AmpRewriteError(f"input {name!r} has unknown rank; give its shape "
                                  f"(--autotune-shape {name}=D0,D1,...)")
        shape_l = []
        for i, d in enumerate(dims):
            if d is None or d < 0:
                if i != 0:
                    raise AmpRewriteError(f"input {name!r} has an unknown dimension {i}; give its shape "
                                          f"(--autotune-shape {name}=D0,D1,...)")
                d = opts.batch
            shape_l.append(int(d))
        shape = tuple(shape_l)
    np_dtype = np.dtype(dtype)
    if np_dtype.kind == "f":
        return rng.standard_normal(shape).astype(np_dtype)
    if np_dtype.kind in "iub":
        return np.zeros(shape, np_dtype)
    raise AmpRewriteError(f"autotune cannot make random inputs of dtype {np_dtype} for {name!r}; "
                          "use amp_rewrite.autotune with your own feeds")


def _graph_def_inputs(graph_def: Any, opts: AutotuneOptions) -> dict[str, np.ndarray]:
    import tensorflow as tf

    rng = np.random.default_rng(opts.seed)
    feeds = {}
    for node in graph_def.node:
        if node.op not in ("Placeholder", "PlaceholderWithDefault"):
            continue
        if node.op == "PlaceholderWithDefault" and node.name not in opts.shapes:
            continue  # it has a value already
        dtype = tf.dtypes.as_dtype(node.attr["dtype"].type).as_numpy_dtype
        shape = node.attr["shape"].shape
        dims = None if shape.unknown_rank or "shape" not in node.attr else [d.size for d in shape.dim]
        feeds[node.name + ":0"] = _input_value(node.name, dtype, dims, opts, rng)
    return feeds


def _graph_def_fetches(graph_def: Any, outputs: Sequence[str]) -> list[str]:
    """The output tensors of the graph-output nodes (nodes with no outputs are skipped)."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    return [t.name for name in outputs for t in graph.get_operation_by_name(name).outputs]


def _saved_model_runner(path: str, tags: Sequence[str] | None, signature: str,
                        inputs: Mapping[str, np.ndarray]) -> tuple[StepFn, Callable[[], None]]:
    import tensorflow as tf

    loaded = tf.saved_model.load(path, tags=list(tags) if tags else None)
    fn = loaded.signatures[signature]
    args = {k: tf.constant(v) for k, v in inputs.items()}

    def step() -> list[Any]:
        out = fn(**args)
        return [out[k].numpy() for k in sorted(out)]

    return step, lambda: None


def _signature_inputs(path: str, tags: Sequence[str] | None, want: str | None,
                      opts: AutotuneOptions) -> tuple[str, dict[str, np.ndarray]]:
    import tensorflow as tf

    loaded = tf.saved_model.load(path, tags=list(tags) if tags else None)
    keys = sorted(loaded.signatures.keys())
    if not keys:
        raise AmpRewriteError("the SavedModel has no signatures to time; autotune needs one")
    key = want or ("serving_default" if "serving_default" in keys else keys[0])
    if key not in keys:
        raise AmpRewriteError(f"no signature {key!r} to time (the model has: {', '.join(keys)})")
    specs = loaded.signatures[key].structured_input_signature[1]
    rng = np.random.default_rng(opts.seed)
    inputs = {}
    for name in sorted(specs):
        spec = specs[name]
        dims = None if spec.shape.rank is None else list(spec.shape.as_list())
        inputs[name] = _input_value(name, spec.dtype.as_numpy_dtype, dims, opts, rng)
    return key, inputs


def autotune_model(model: Any, opts: AutotuneOptions, *, tags: Sequence[str] | None = None,
                   **rewrite_options: Any) -> ModelAutotune:
    """Rewrite ``model`` (a :class:`~amp_rewrite.saved_model.ModelFile`) once per candidate
    with :func:`~amp_rewrite.saved_model.rewrite_model`, time each and float32 on random
    inputs, and return the fastest.

    A SavedModel is timed through one signature (``opts.signature``), each candidate
    written to a temporary directory and loaded with ``tf.saved_model.load``; a frozen
    GraphDef through its placeholders and output nodes.  A MetaGraphDef cannot be run
    without its checkpoint and is refused.  Raises :class:`AmpRewriteError`; ``model`` is
    not modified and nothing is left on disk.
    """
    from .saved_model import _graph_outputs, rewrite_model, stage_model
    from .staging import Staging

    opts.check()
    options = candidate_options(opts.candidates)
    if model.format == "meta_graph":
        raise AmpRewriteError("autotune runs SavedModels and frozen GraphDefs; a MetaGraphDef (.meta) "
                              "needs its checkpoint to run")
    rewrites = {name: rewrite_model(model, tags=tags, **{**rewrite_options, **o}) for name, o in options.items()}
    same_as = _same_as({FLOAT32: None, **{
        n: None if _unchanged(r.report) else r.message.SerializeToString(deterministic=True)
        for n, r in rewrites.items()}})

    if model.format == "graph_def":
        feeds = _graph_def_inputs(model.message, opts)
        fetches = _graph_def_fetches(model.message, sorted(_graph_outputs(model.message)))
        if not fetches:
            raise AmpRewriteError("the graph has no outputs to time")
        graphs = {FLOAT32: model.message, **{n: r.message for n, r in rewrites.items()}}
        makers = {n: (lambda gd=gd: _graph_runner(gd, feeds, fetches)) for n, gd in graphs.items()}
        tuned = _tune(makers, repeats=opts.repeats, steps=opts.steps, max_rel_error=opts.max_rel_error,
                      min_gain=opts.min_gain, same_as=same_as, max_repeats=opts.max_repeats,
                      sessions=opts.sessions)
        inputs = {k.rsplit(":", 1)[0]: tuple(v.shape) for k, v in feeds.items()}
        signature = None
    else:
        key, values = _signature_inputs(model.path, tags, opts.signature, opts)
        with tempfile.TemporaryDirectory(prefix="amp-rewrite-autotune-") as tmp:
            paths = {FLOAT32: model.path}
            for name, rw in rewrites.items():
                paths[name] = os.path.join(tmp, f"candidate{len(paths)}")
                with Staging() as staging:
                    stage_model(staging, rw, paths[name])
                    staging.commit()
            makers = {n: (lambda p=p: _saved_model_runner(p, tags, key, values)) for n, p in paths.items()}
            tuned = _tune(makers, repeats=opts.repeats, steps=opts.steps, max_rel_error=opts.max_rel_error,
                          min_gain=opts.min_gain, same_as=same_as, max_repeats=opts.max_repeats,
                          sessions=opts.sessions)
        inputs = {k: tuple(v.shape) for k, v in values.items()}
        signature = key
    return ModelAutotune(tuned.choice, rewrites.get(tuned.choice), tuned.step_ms, tuned.rel_error, inputs,
                         signature, options, same_as, tuned.ratio, tuned.wins, tuned.rounds, tuned.sessions)
