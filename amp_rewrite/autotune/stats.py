"""Autotune's statistics and wording: paired per-round ratios to float32, the one-sided sign
test, the decision (:func:`_decide`) and the fixed sentences that report it
(:func:`decision_rule`, :func:`result_line`).  Everything here is pure."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

FLOAT32 = "float32"


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
