"""The guard of the ``optimal`` planner (:mod:`amp_rewrite.plan.optimal`): never more Casts,
nor more bytes through them, than TensorFlow's greedy colouring.  Pure functions over a
:class:`~amp_rewrite.plan.mincut.PlacementProblem`.
"""

from __future__ import annotations

import math

from .mincut import FREE, LOW, PlacementProblem, objective, solve

def _cast_metrics(problem: PlacementProblem, low: list[bool], cast_bytes: list[float]) -> tuple[int, float]:
    """(Casts, bytes moved by Casts) of a colouring, over the problem's tensors."""
    count, total = 0, 0.0
    for (members, cost), nbytes in zip(problem.tensors, cast_bytes):
        if math.isinf(cost):
            continue  # a tie between vertices, not a tensor
        if len({low[m] for m in members}) > 1:
            count += 1
            total += nbytes
    return count, total


#: Factors by which :func:`_guard` prices Casts above their estimated cost.
_CAST_PENALTIES = (2.0, 4.0, 8.0, 16.0, 64.0, 256.0, 1024.0)


def _guard(problem: PlacementProblem, low: list[bool], greedy: list[bool], cast_bytes: list[float],
           fixed: list[int], cat: list[str | None]) -> list[bool]:
    """Never more Casts, nor more bytes through them, than the greedy colouring.

    The time-optimal cut trusts the cost model; where it would add Casts or Cast traffic
    (the model's estimate of a tensor or a kernel can be wrong), take instead the fastest
    (by the model) of the colourings that do not.  The candidates: the cut with Casts priced
    2x to 1024x their estimate (a Lagrangian relaxation of the Cast limit: each solve gives
    up some node time for fewer or smaller Casts, so the first prices that satisfy the limit
    keep most of the gain), the cut that minimizes Cast bytes with every allow-list op
    converted, every free vertex in float32 (no Cast among them; e.g. an encoder whose only
    gain would need its GELUs in bfloat16 on a CPU where those are 5x slower), and the
    greedy colouring itself.  Pure.
    """
    limit = _cast_metrics(problem, greedy, cast_bytes)

    def ok(sol: list[bool]) -> bool:
        count, nbytes = _cast_metrics(problem, sol, cast_bytes)
        return count <= limit[0] and nbytes <= limit[1] + 1e-6

    if ok(low):
        return low
    candidates = [greedy]
    for factor in _CAST_PENALTIES:
        priced = solve(PlacementProblem(problem.fixed, problem.cost_high, problem.cost_low,
                                        [(m, c * factor) for m, c in problem.tensors]))
        if ok(priced):
            candidates.append(priced)
    bytes_fixed = [LOW if f == FREE and cat[v] == "allow" else f for v, f in enumerate(fixed)]
    by_bytes = solve(PlacementProblem(bytes_fixed, [0.0] * len(fixed), [0.0] * len(fixed),
                                      [(m, c if math.isinf(c) else 1.0 + b)
                                       for (m, c), b in zip(problem.tensors, cast_bytes)]))
    all_high = [f == LOW for f in fixed]
    candidates += [sol for sol in (by_bytes, all_high) if ok(sol)]
    # min() keeps the first of equals: greedy wins a tie, as before.
    return min(candidates, key=lambda sol: objective(problem, sol))

