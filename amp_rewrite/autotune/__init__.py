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
  placeholders), with random inputs of a given batch size or the caller's arrays
  (:attr:`AutotuneOptions.inputs`, ``--autotune-inputs FILE.npz``, read by
  :func:`load_inputs`, which never unpickles); ``amp-rewrite rewrite --autotune`` is this.

Every result says why it won in words (:func:`decision_rule`, :func:`result_line`): each
candidate's median time, its ratio to float32, the rounds it won out of those timed, and the
rule that decided.  Long runs report each round to a :class:`~amp_rewrite.progress.Progress`.

The pieces are the modules of this package, and every name is importable from here as before:
:mod:`.stats` (the sign test, the decision and its wording), :mod:`.inputs`
(the caller's arrays), :mod:`.measure` (candidates, timing, sessions) and
:mod:`.model_files` (:class:`AutotuneOptions`, :func:`autotune_model`).  Autotune builds
on :mod:`amp_rewrite.models`, never the other way round (see :mod:`.model_files`).

It runs graphs, so naturally it has to run on a machine of the kind the graph is rewritten
for.  The caller's graph and model are never modified.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..api import RewriteResult, rewrite_graph_def
from .inputs import (_NPY_MAGIC, InputArrays, _dims_text, _first_line, _fit_inputs,  # noqa: F401
                              _input_arrays, _read_member, load_inputs)
from .measure import (CANDIDATES, DEFAULT_CANDIDATES, DEFAULT_SESSIONS, StepFn, Tuning,  # noqa: F401
                               _cannot_run, _check_rounds, _graph_runner, _measure, _of, _per_candidate,
                               _round_reporter, _same_as, _tune, _unchanged, candidate_options, default_max_repeats,
                               session_config)
from .model_files import (AutotuneOptions, ModelAutotune, _graph_def_fetches, _graph_def_inputs,  # noqa: F401
                              _input_value, _saved_model_runner, _signature_inputs, autotune_model)
from .stats import (ALPHA, FLOAT32, MIN_PROOF_ROUNDS, Comparison, _decide, _percent, compare,  # noqa: F401
                             decision_rule, relative_error, result_line, sign_test_p, wins_needed)
from ..errors import AmpRewriteError, AutotuneInputError  # noqa: F401
from ..progress import Progress


__all__ = [
    "AutotuneInputError",
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
    "decision_rule",
    "default_max_repeats",
    "InputArrays",
    "load_inputs",
    "result_line",
    "session_config",
    "sign_test_p",
    "wins_needed",
]


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
    of fresh sessions they were spread over; ``rule`` the clause saying why ``choice`` won
    (:func:`decision_rule`), ``p_value`` each candidate's sign test.  :meth:`line` puts it
    all in one line.
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
    rule: str = ""
    p_value: Mapping[str, float] = field(default_factory=dict)
    min_gain: float = 0.02

    def line(self) -> str:
        """:func:`result_line` for this result."""
        return result_line(step_ms=self.step_ms, ratio=self.ratio_to_float32, wins=self.wins,
                           rel_error=self.rel_error, same_as=self.same_as, rounds=self.rounds,
                           sessions=self.sessions, min_gain=self.min_gain, rule=self.rule)


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
    progress: Progress | None = None,
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
    speed also depends on the session it runs in (:func:`_tune`).  ``progress`` hears of
    each round (:meth:`~amp_rewrite.progress.Progress.event`).  Other options go to
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
              sessions=sessions, progress=progress)
    chosen = results.get(t.choice)
    return AutotuneResult(t.choice, graph_def if chosen is None else chosen.graph_def, chosen, t.step_ms,
                          t.rel_error, same_as, t.ratio, t.wins, t.rounds, t.sessions, t.rule, t.p_value,
                          min_gain)
