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

It runs graphs, so naturally it has to run on a machine of the kind the graph is rewritten
for.  The caller's graph and model are never modified.
"""

from __future__ import annotations

import logging
import math
import os
import stat
import statistics
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .api import RewriteResult, rewrite_graph_def
from .errors import AmpRewriteError, AutotuneInputError
from .progress import Progress

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


# ------------------------------------------------------------------------ the caller's inputs


@dataclass(frozen=True, eq=False)
class InputArrays:
    """Arrays to time with, keyed by input name, and where they came from: ``source`` names
    the file (or says they were the caller's arrays) in messages and in the report, ``path``
    is the file or ``None``.  The arrays are plain (no object dtype) and are not modified."""

    arrays: Mapping[str, np.ndarray]
    source: str
    path: str | None = None


#: The magic of a lone ``.npy`` array (numpy.save), told apart from an ``.npz`` archive.
_NPY_MAGIC = b"\x93NUMPY"


def load_inputs(path: str | os.PathLike[str]) -> InputArrays:
    """The arrays of the ``.npz`` archive at ``path`` (``numpy.savez``), keyed by its names.

    Reads with ``allow_pickle=False``: an archive that holds Python objects (an object
    array, stored as a pickle) is refused, never unpickled -- loading a pickle runs code
    chosen by whoever wrote the file.  Raises :class:`AutotuneInputError`, one line naming
    the file, for a missing path, something that is not a regular file, a file that is not
    an ``.npz`` archive (a lone ``.npy`` array included), a member that is not an array or
    cannot be read, and an archive with no arrays.  Reads the whole file; writes nothing.
    """
    p = os.fspath(path)
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        raise AutotuneInputError("no such file (autotune inputs)", path=p) from None
    except OSError as exc:
        raise AutotuneInputError(f"cannot read autotune inputs: {exc.strerror or exc}", path=p) from None
    # A FIFO or device would block or stream forever; a directory is a common slip.
    if not stat.S_ISREG(mode):
        what = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise AutotuneInputError(f"is {what}; autotune inputs are an .npz file (numpy.savez)", path=p)
    with open(p, "rb") as f:
        head = f.read(len(_NPY_MAGIC))
    if head == _NPY_MAGIC:
        raise AutotuneInputError("is a single .npy array; autotune inputs are an .npz archive of arrays "
                                 "keyed by input name (numpy.savez(FILE, x=..., ...))", path=p)
    if not zipfile.is_zipfile(p):
        raise AutotuneInputError("is not an .npz archive (numpy.savez); cannot read autotune inputs", path=p)
    arrays: dict[str, np.ndarray] = {}
    try:
        with np.load(p, allow_pickle=False) as npz:
            for name in npz.files:
                arrays[name] = _read_member(npz, name, p)
    except AutotuneInputError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise AutotuneInputError(f"is not a readable .npz archive: {_first_line(exc)}", path=p) from None
    if not arrays:
        raise AutotuneInputError("holds no arrays; autotune inputs need one per model input", path=p)
    return InputArrays(arrays, p, p)


def _read_member(npz: Any, name: str, path: str) -> np.ndarray:
    """One array of an open archive; raises :class:`AutotuneInputError` for a pickle or a
    member that is not a ``.npy`` array (``np.load`` returns such members as bytes)."""
    try:
        value = npz[name]
    except ValueError as exc:
        if "pickle" in str(exc).lower():
            raise AutotuneInputError(
                f"array {name!r} holds Python objects (stored as a pickle); autotune inputs are never "
                "unpickled -- save numeric arrays", path=path) from None
        raise AutotuneInputError(f"array {name!r} cannot be read: {_first_line(exc)}", path=path) from None
    if not isinstance(value, np.ndarray):
        raise AutotuneInputError(f"member {name!r} is not a .npy array", path=path)
    return value


def _input_arrays(inputs: str | os.PathLike[str] | Mapping[str, Any] | InputArrays) -> InputArrays:
    """:attr:`AutotuneOptions.inputs` as :class:`InputArrays` (a path is read with
    :func:`load_inputs`).  Raises :class:`AutotuneInputError` for object arrays or no arrays."""
    if isinstance(inputs, InputArrays):
        return inputs
    if isinstance(inputs, (str, os.PathLike)):
        return load_inputs(inputs)
    if not isinstance(inputs, Mapping):
        raise AutotuneInputError(f"autotune inputs must be an .npz path or a mapping of arrays, "
                                 f"not {type(inputs).__name__}")
    arrays = {}
    for name, value in inputs.items():
        array = np.asarray(value)
        if array.dtype.kind == "O":
            raise AutotuneInputError(f"autotune input {name!r} holds Python objects; give numeric arrays")
        arrays[str(name)] = array
    if not arrays:
        raise AutotuneInputError("autotune inputs hold no arrays; give one per model input")
    return InputArrays(arrays, "the caller's arrays")


def _dims_text(dims: Sequence[int | None] | None) -> str:
    """``(?, 4)`` for a signature's dims (unknown rank: ``<any shape>``).  Pure."""
    if dims is None:
        return "<any shape>"
    return "(" + ", ".join("?" if d is None or d < 0 else str(d) for d in dims) + (",)" if len(dims) == 1 else ")")


def _fit_inputs(given: InputArrays, specs: Mapping[str, tuple[Any, Sequence[int | None] | None]],
                required: Sequence[str], what: str) -> dict[str, np.ndarray]:
    """The caller's arrays checked against the model's inputs: ``specs`` maps each input
    name to ``(numpy dtype, dims or None)``, ``required`` lists those that need a value,
    ``what`` names the inputs in messages (``"signature 'serving_default'"``).  Returns the
    arrays by name (the same objects).  Raises :class:`AutotuneInputError`, one line, for an
    unknown or missing name, or a dtype, rank or shape the model does not take."""
    path = given.path
    names = ", ".join(sorted(specs)) or "none"
    unknown = sorted(set(given.arrays) - set(specs))
    if unknown:
        raise AutotuneInputError(f"autotune inputs name {', '.join(map(repr, unknown))}, not an input of the "
                                 f"{what} (its inputs: {names})", path=path)
    missing = sorted(set(required) - set(given.arrays))
    if missing:
        raise AutotuneInputError(f"autotune inputs lack {', '.join(map(repr, missing))} (inputs of the {what}: "
                                 f"{names})", path=path)
    for name, array in given.arrays.items():
        want, dims = specs[name]
        want = np.dtype(want)
        # TensorFlow's strings are numpy objects; fixed-width bytes or str arrays feed them.
        ok = array.dtype.kind in "SU" if want.kind == "O" else array.dtype == want
        if not ok:
            raise AutotuneInputError(f"autotune input {name!r} is {array.dtype}; the {what} takes "
                                     f"{'strings' if want.kind == 'O' else want}", path=path)
        if dims is None:
            continue
        if array.ndim != len(dims) or any(d is not None and d >= 0 and d != n for d, n in zip(dims, array.shape)):
            raise AutotuneInputError(f"autotune input {name!r} has shape {_dims_text(array.shape)}; the {what} "
                                     f"takes {_dims_text(dims)}", path=path)
    return dict(given.arrays)


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

    ``inputs`` replaces the random inputs with the caller's data, for the timing and for the
    output error check alike: an ``.npz`` path (read by :func:`load_inputs`, never
    unpickled), a mapping of arrays, or :class:`InputArrays`, keyed by input name (a
    SavedModel signature's input keys, a GraphDef's placeholder names); every input that
    has no default needs one, of the model's dtype and a shape it takes.  ``batch`` and
    ``shapes`` shape random inputs and cannot go with it.  ``progress`` (a
    :class:`~amp_rewrite.progress.Progress`) is told of each candidate's rewrite and each
    round (:meth:`~amp_rewrite.progress.Progress.event`); it is no part of the measurement.
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
    inputs: str | os.PathLike[str] | Mapping[str, Any] | InputArrays | None = None
    progress: Progress | None = field(default=None, compare=False, repr=False)

    def check(self) -> None:
        """Raises :class:`AmpRewriteError` for settings that cannot be measured, and
        :class:`AutotuneInputError` for ``inputs`` that cannot be read (a path is read here,
        and again when the model is timed)."""
        _check_rounds(self.repeats, self.steps, self.sessions, self.max_repeats)
        if self.inputs is not None:
            if self.batch != 1 or self.shapes:
                raise AmpRewriteError("autotune's batch and shapes shape random inputs; they cannot go "
                                      "with the caller's inputs")
            _input_arrays(self.inputs)
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


def wins_needed(rounds: int, alpha: float = ALPHA) -> int | None:
    """Fewest rounds won out of ``rounds`` that the sign test counts as beyond chance at
    ``alpha`` (:func:`sign_test_p`); ``None`` when even winning all of them would not (fewer
    than :data:`MIN_PROOF_ROUNDS` rounds at 5%).  Pure."""
    return next((k for k in range(rounds + 1) if sign_test_p(k, rounds) <= alpha), None)


def _percent(fraction: float) -> str:
    return f"{fraction * 100:g}%"


def decision_rule(samples: Mapping[str, Sequence[float]], rel_error: Mapping[str, float],
                  max_rel_error: float | None, min_gain: float, *, alpha: float = ALPHA,
                  untimed: Sequence[str] = ()) -> str:
    """The clause that says which rule decided :func:`_decide`'s choice for these samples,
    in fixed words with the numbers filled in: ``chosen: X -- the only candidate faster than
    float32 by >= 2% in >= 12 of 15 rounds (sign test p <= 0.05); it won 14 (p=0.00049)``,
    or ``kept float32: no candidate won enough rounds -- ...; most: X 9/15 (p=0.3)``.
    ``untimed`` names candidates not timed because their graph is float32's.  Pure.

    Winning ``wins_needed`` rounds implies a median ratio of at most ``1 - min_gain`` (more
    than half the rounds are that fast), so the rounds are the whole rule in practice; the
    clause still names the median where it alone decided.
    """
    choice, _ = _decide(samples, rel_error, max_rel_error, min_gain, alpha)
    comps = compare(samples, min_gain) if FLOAT32 in samples else {}
    rounds = len(samples.get(FLOAT32, ()))
    need = wins_needed(rounds, alpha)
    within = "" if max_rel_error is None else f" within relative error {max_rel_error:g}"
    faster = f"faster than float32 by >= {_percent(min_gain)}"
    enough = f"in >= {need} of {rounds} rounds (sign test p <= {alpha:g})"
    admissible = [n for n in comps if max_rel_error is None or rel_error.get(n, math.inf) <= max_rel_error]
    proven = [n for n in admissible if comps[n].proven(min_gain, alpha)]
    if choice != FLOAT32:
        won = comps[choice]
        if len(proven) == 1:
            return (f"chosen: {choice} -- the only candidate{within} {faster} {enough}; "
                    f"it won {won.wins} (p={won.p_value:.2g})")
        others = ", ".join(f"{n} {comps[n].ratio:.3f}" for n in proven if n != choice)
        return (f"chosen: {choice} -- of the {len(proven)} candidates{within} {faster} {enough}, the "
                f"lowest median ratio to float32 ({won.ratio:.3f}; {others})")
    if not comps:
        if untimed:
            return "kept float32: every candidate's graph is the same as float32's"
        return "kept float32: no candidate could run"
    if not admissible:
        return f"kept float32: no candidate's outputs are within relative error {max_rel_error:g} of float32's"
    # The candidate closest to being chosen: most rounds won, then the lower ratio.
    best = max(admissible, key=lambda n: (comps[n].wins, -comps[n].ratio))
    near = comps[best]
    if need is None:
        return (f"kept float32: no candidate won enough rounds -- {rounds} rounds are too few to show one "
                f"{faster} beyond chance (the sign test at p <= {alpha:g} needs >= {MIN_PROOF_ROUNDS}); "
                f"most: {best} {near.wins}/{rounds} (p={near.p_value:.2g})")
    if near.wins >= need:
        return (f"kept float32: no candidate{within} is {faster} in the median ratio; {best} won "
                f"{near.wins}/{rounds} rounds but its median ratio is {near.ratio:.3f}")
    return (f"kept float32: no candidate{within} won enough rounds -- {faster} {enough}; "
            f"most: {best} {near.wins}/{rounds} (p={near.p_value:.2g})")


def result_line(*, step_ms: Mapping[str, float], ratio: Mapping[str, float], wins: Mapping[str, int],
                rel_error: Mapping[str, float], same_as: Mapping[str, str], rounds: int, sessions: int,
                min_gain: float, rule: str) -> str:
    """The one line that reports an autotune run: per candidate its median time per step,
    its ratio to float32 (its step time over float32's in the same round, median over
    rounds; not the ratio of the two medians, which can disagree with it), the rounds it won
    against float32 out of those run, its output error, then ``rule``
    (:func:`decision_rule`).  Fixed wording; only numbers and names vary.  Pure."""
    parts = []
    for name, ms in step_ms.items():
        source = same_as.get(name)
        if name == FLOAT32:
            parts.append(f"float32 {ms:.2f} ms")
        elif source == FLOAT32:
            parts.append(f"{name}: same graph as float32, not timed")
        elif source is not None:
            parts.append(f"{name}: same graph as {source}")
        else:
            error = f", rel. error {rel_error[name]:.1e}" if name in rel_error else ""
            parts.append(f"{name} {ms:.2f} ms, ratio {ratio.get(name, math.inf):.3f}, "
                         f"won {wins.get(name, 0)}/{rounds}{error}")
    return (f"autotune over {rounds} rounds in {sessions} set(s) of sessions (ms: median per step; ratio: "
            f"its step time / float32's in the same round, median over rounds; won: rounds with ratio <= "
            f"{1 - min_gain:.4g}): {'; '.join(parts)}. {rule}")


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
        if progress is not None:
            # Loading a SavedModel and the warm-up step can take as long as many rounds.
            progress.event(f"autotune: loading and warming up every model, session {_of(opened, sessions)}")
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

    per_session = math.ceil(repeats / sessions) if sessions > 1 else 0

    try:
        open_all()
        errors = {n: relative_error(outputs[n], outputs[FLOAT32]) for n in runners if n != FLOAT32}
        samples = _measure({n: r[0] for n, r in runners.items()}, repeats, steps, limit,
                           lambda s, left: _decide(s, errors, max_rel_error, min_gain, rounds_left=left)[1],
                           renew=renew, per_session=per_session,
                           on_round=_round_reporter(progress, repeats, limit, sessions, per_session))
    finally:
        for _, close in runners.values():
            close()
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


# ------------------------------------------------------------------------ model files


@dataclass(frozen=True)
class ModelAutotune:
    """The winner of :func:`autotune_model`.  ``rewrite`` is the winning candidate's
    :class:`~amp_rewrite.models.saved_model.ModelRewrite`, ``None`` when float32 won; ``rule`` why
    (:func:`decision_rule`); ``input_source`` where the inputs came from (random, or the
    caller's file or arrays).  The other fields are :class:`AutotuneResult`'s."""

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
    rule: str = ""
    p_value: Mapping[str, float] = field(default_factory=dict)
    min_gain: float = 0.02
    max_rel_error: float | None = None
    input_source: str = "random"

    def line(self) -> str:
        """:func:`result_line` for this result: what the CLI prints."""
        return result_line(step_ms=self.step_ms, ratio=self.ratio_to_float32, wins=self.wins,
                           rel_error=self.rel_error, same_as=self.same_as, rounds=self.rounds,
                           sessions=self.sessions, min_gain=self.min_gain, rule=self.rule)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, for the report: the measurements, the rule (``decision``: the clause
        of :func:`decision_rule`; ``wins_needed``: the rounds the sign test asks for, or
        ``None``) and the whole line (``summary``, :meth:`line`)."""
        return {
            "choice": self.choice,
            "summary": self.line(),
            "decision": self.rule,
            "step_ms": {k: round(v, 4) for k, v in self.step_ms.items()},
            "ratio_to_float32": {k: round(v, 4) for k, v in self.ratio_to_float32.items()},
            "faster_rounds": dict(self.wins),
            "sign_test_p": {k: float(f"{v:.4g}") for k, v in self.p_value.items()},
            "wins_needed": wins_needed(self.rounds),
            "min_gain": self.min_gain,
            "max_rel_error": self.max_rel_error,
            "rounds": self.rounds,
            "sessions": self.sessions,
            "input_source": self.input_source,
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


def _graph_def_inputs(graph_def: Any, opts: AutotuneOptions, given: InputArrays | None) -> dict[str, np.ndarray]:
    """Feeds (``"name:0"`` -> array) for a frozen GraphDef's placeholders: the caller's
    ``given`` arrays, checked against the placeholders' dtypes and shapes
    (:func:`_fit_inputs`; a PlaceholderWithDefault may be left out), else random values
    (:func:`_input_value`).  Raises :class:`AmpRewriteError`; reads ``graph_def`` only."""
    import tensorflow as tf

    rng = np.random.default_rng(opts.seed)
    specs: dict[str, tuple[Any, list[int] | None]] = {}
    required = []
    for node in graph_def.node:
        if node.op not in ("Placeholder", "PlaceholderWithDefault"):
            continue
        dtype = tf.dtypes.as_dtype(node.attr["dtype"].type).as_numpy_dtype
        shape = node.attr["shape"].shape
        dims = None if shape.unknown_rank or "shape" not in node.attr else [d.size for d in shape.dim]
        specs[node.name] = (dtype, dims)
        if node.op == "Placeholder":
            required.append(node.name)
    if given is not None:
        return {name + ":0": value for name, value in
                _fit_inputs(given, specs, required, "graph's placeholders").items()}
    feeds = {}
    for name, (dtype, dims) in specs.items():
        if name not in required and name not in opts.shapes:
            continue  # a PlaceholderWithDefault has a value already
        feeds[name + ":0"] = _input_value(name, dtype, dims, opts, rng)
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


def _signature_inputs(path: str, tags: Sequence[str] | None, want: str | None, opts: AutotuneOptions,
                      given: InputArrays | None) -> tuple[str, dict[str, np.ndarray]]:
    """The signature to time (``want``, else ``serving_default``, else the first) and its
    inputs by key: the caller's ``given`` arrays, checked against the signature's specs
    (:func:`_fit_inputs`), else random values.  Raises :class:`AmpRewriteError`; loads the
    SavedModel, writes nothing."""
    import tensorflow as tf

    loaded = tf.saved_model.load(path, tags=list(tags) if tags else None)
    keys = sorted(loaded.signatures.keys())
    if not keys:
        raise AmpRewriteError("the SavedModel has no signatures to time; autotune needs one")
    key = want or ("serving_default" if "serving_default" in keys else keys[0])
    if key not in keys:
        raise AmpRewriteError(f"no signature {key!r} to time (the model has: {', '.join(keys)})")
    specs = loaded.signatures[key].structured_input_signature[1]
    shapes = {name: (spec.dtype.as_numpy_dtype, None if spec.shape.rank is None else list(spec.shape.as_list()))
              for name, spec in specs.items()}
    if given is not None:
        return key, _fit_inputs(given, shapes, sorted(shapes), f"signature {key!r}")
    rng = np.random.default_rng(opts.seed)
    return key, {name: _input_value(name, dtype, dims, opts, rng) for name, (dtype, dims) in sorted(shapes.items())}


def autotune_model(model: Any, opts: AutotuneOptions, *, tags: Sequence[str] | None = None,
                   **rewrite_options: Any) -> ModelAutotune:
    """Rewrite ``model`` (a :class:`~amp_rewrite.models.saved_model.ModelFile`) once per candidate
    with :func:`~amp_rewrite.models.saved_model.rewrite_model`, time each and float32 on random
    inputs or the caller's (``opts.inputs``), and return the fastest.

    A SavedModel is timed through one signature (``opts.signature``), each candidate
    written to a temporary directory and loaded with ``tf.saved_model.load``; a frozen
    GraphDef through its placeholders and output nodes.  A MetaGraphDef cannot be run
    without its checkpoint and is refused.  The inputs are made (or the caller's checked
    against the model) before any rewrite.  ``opts.progress`` hears of each rewrite and
    round.  Raises :class:`AmpRewriteError` (:class:`AutotuneInputError` for inputs that do
    not fit); ``model`` is not modified and nothing is left on disk.
    """
    from .models.saved_model import _graph_outputs, rewrite_model, stage_model
    from .models.staging import Staging

    opts.check()
    options = candidate_options(opts.candidates)
    if model.format == "meta_graph":
        raise AmpRewriteError("autotune runs SavedModels and frozen GraphDefs; a MetaGraphDef (.meta) "
                              "needs its checkpoint to run")
    given = None if opts.inputs is None else _input_arrays(opts.inputs)
    source = given.source if given is not None else f"random (seed {opts.seed})"
    if model.format == "graph_def":
        feeds = _graph_def_inputs(model.message, opts, given)
        fetches = _graph_def_fetches(model.message, sorted(_graph_outputs(model.message)))
        if not fetches:
            raise AmpRewriteError("the graph has no outputs to time")
    else:
        key, values = _signature_inputs(model.path, tags, opts.signature, opts, given)
    rewrites = {}
    for i, (name, o) in enumerate(options.items(), 1):
        if opts.progress is not None:
            opts.progress.event(f"autotune: rewriting candidate {i}/{len(options)} ({name})")
        rewrites[name] = rewrite_model(model, tags=tags, **{**rewrite_options, **o})
    same_as = _same_as({FLOAT32: None, **{
        n: None if _unchanged(r.report) else r.message.SerializeToString(deterministic=True)
        for n, r in rewrites.items()}})
    tune: dict[str, Any] = dict(repeats=opts.repeats, steps=opts.steps, max_rel_error=opts.max_rel_error, min_gain=opts.min_gain,
                same_as=same_as, max_repeats=opts.max_repeats, sessions=opts.sessions, progress=opts.progress)
    if model.format == "graph_def":
        graphs = {FLOAT32: model.message, **{n: r.message for n, r in rewrites.items()}}
        tuned = _tune({n: (lambda gd=gd: _graph_runner(gd, feeds, fetches)) for n, gd in graphs.items()}, **tune)
        inputs = {k.rsplit(":", 1)[0]: tuple(v.shape) for k, v in feeds.items()}
        signature = None
    else:
        with tempfile.TemporaryDirectory(prefix="amp-rewrite-autotune-") as tmp:
            paths = {FLOAT32: model.path}
            for name, rw in rewrites.items():
                paths[name] = os.path.join(tmp, f"candidate{len(paths)}")
                with Staging() as staging:
                    stage_model(staging, rw, paths[name])
                    staging.commit()
            tuned = _tune({n: (lambda p=p: _saved_model_runner(p, tags, key, values)) for n, p in paths.items()},
                          **tune)
        inputs = {k: tuple(v.shape) for k, v in values.items()}
        signature = key
    return ModelAutotune(tuned.choice, rewrites.get(tuned.choice), tuned.step_ms, tuned.rel_error, inputs,
                         signature, options, same_as, tuned.ratio, tuned.wins, tuned.rounds, tuned.sessions,
                         tuned.rule, tuned.p_value, opts.min_gain, opts.max_rel_error, source)
