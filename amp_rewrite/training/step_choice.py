"""Choosing a training step by measuring it: ``measure_steps=N``.

The cost model decides a plan from estimates.  On a GPU without XLA those estimates are the
least reliable the model makes (whole steps priced 1.7-1.9x short on an H200, and TensorFlow's
pass priced slower than float32 on MobileNetV2 where it ran 3.4% faster:
``bench/gpu_runs/2026-11-28-h200``).  With ``measure_steps=N`` a rewritten ``tf.function``
(and so a Keras ``fit``) times the steps it could run instead of trusting the estimate:

* the step as planned (what it would run without measuring);
* the float32 step without loss scaling (what the user's code ran before the rewrite);
* the step rewritten with the ``default`` lists, where the plan came from the cost-aware
  planner (whose estimate is what is in doubt).

Each candidate runs one untimed warm-up step first (its first call instantiates the function,
compiles it under XLA, and autotunes cuDNN's algorithms), then ``N`` timed steps, round
robin, so a drift in the machine's speed touches every candidate alike.  A loss-scaled
step that skipped its update (the dynamic scale's first steps) is not counted among them.  The candidate with
the lowest median step time wins, but the planned step stays unless another is faster by
:data:`MIN_GAIN` of it (a choice inside the timing noise is no choice).  From then on only
the winner runs.

Every trial step is a real training step: it takes the caller's batch and updates the
variables, so measuring wastes no data and no work, and the result of each call is that
candidate's step.  The candidates compute the same update in different precisions (the
float32 step leaves the loss scale as it is), so switching between them changes the
numerics only as mixed precision does.

Left out, ``measure_steps`` is :data:`AUTO_MEASURE_STEPS` where the optimal planner plans for
this machine's GPU and the step runs without XLA (``tf_function.auto_measure_steps``): on an
H200 the optimal profile kept MobileNetV2's, EfficientNetB0's and an LSTM's training steps
float32, and the default lists' steps, timed, ran 2-17% faster (``bench/gpu_runs/2026-11-28b-h200``).

This module only chooses; :mod:`.tf_function` builds the candidates and decides when a step
may be measured (never where it reduces across workers, since each worker would choose
alone and they must run the same collectives).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable, Sequence

__all__ = ["AUTO_MEASURE_STEPS", "MAX_DISCARDED", "MIN_GAIN", "Candidate", "MeasuredChoice"]

#: Timed steps per candidate where the caller left ``measure_steps`` out and the step is
#: measured by default (the optimal planner on a GPU without XLA: ``tf_function.auto_measure_steps``):
#: the number the GPU benchmark's ``ours_measured`` ran (``bench/gpu_runs/2026-11-28b-h200``).
AUTO_MEASURE_STEPS = 3

#: Timed steps of one candidate that skipped their update and are not counted, at most, per
#: step to measure: after that the candidate's steps count whatever they do (a step whose every
#: update is skipped would otherwise be timed forever).
MAX_DISCARDED = 4
#: How much faster (a share of the planned step's median) another candidate must be to
#: replace the planned step: the A/A gaps of the GPU benchmark's training steps (the same
#: graph run twice, 5 repeats each) were 0.0-2.1% on the H100 and H200, but 6.8% once (the
#: GPT decoder, 2026-11-27); a step measured within that of another is a toss-up either way.
MIN_GAIN = 0.02


@dataclasses.dataclass
class Candidate:
    """One step the choice may keep: ``run`` runs it on the step's flat inputs."""

    name: str  #: "planned", "float32" or "default lists"
    run: Callable[[Sequence[Any]], Any]
    #: For a loss-scaled step: reads its optimizers' count of skipped updates.  A step that
    #: skips its update (a gradient not finite: the first steps of a dynamic loss scale, which
    #: starts high and halves until the gradients fit) runs no update kernels, and its time
    #: would flatter the candidate; it is not counted (:data:`MAX_DISCARDED`).
    skipped: Callable[[], int] | None = None
    #: Seconds of each timed step so far (the warm-up is not among them).
    seconds: list[float] = dataclasses.field(default_factory=list)
    warmed_up: bool = False
    #: Timed steps not counted: they skipped their update.
    discarded: int = 0

    @property
    def median_ms(self) -> float | None:
        return 1e3 * statistics.median(self.seconds) if self.seconds else None


class MeasuredChoice:
    """Runs ``candidates`` in turn, timed, until each has ``steps`` timed steps, then keeps the
    fastest (the first candidate, the planned step, unless another beats it by
    :data:`MIN_GAIN`).

    ``sync()`` waits for the device's queued work (a GPU runs a step asynchronously); it is
    called before and after each timed step.  ``clock`` is :func:`time.perf_counter` unless a
    test gives another.  ``on_chosen(choice)`` is called once, when the choice is made.

    A candidate other than the planned one that raises an error ``droppable(error)`` accepts
    (out of device memory: the float32 step needs more than the mixed one a batch was sized
    for) is dropped, ``on_dropped(candidate, error)`` is told, and the call runs the planned
    step instead, on the same inputs.  TensorFlow does not promise that a failed step updated
    nothing: each variable's update may run as soon as its own gradient is ready, and the
    variables a failed step had updated then take that batch's update twice.  So the float32
    candidate of :mod:`.tf_function` gates its updates behind its whole backward pass
    (:mod:`.update_barrier`), where its memory peaks; it logs a WARNING at a drop all the same
    (an allocation may also fail within the update).  Any other error, and any error of the
    planned step, is the caller's.  Mutates itself on each call; not thread-safe (a training step is called
    from one thread).
    """

    def __init__(self, candidates: Sequence[Candidate], steps: int, *, sync: Callable[[], None],
                 on_chosen: Callable[["MeasuredChoice"], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 droppable: Callable[[BaseException], bool] = lambda error: False,
                 on_dropped: Callable[[Candidate, BaseException], None] | None = None) -> None:
        if steps < 1:
            raise ValueError(f"steps must be at least 1, not {steps}")
        if not candidates:
            raise ValueError("no candidate to choose from")
        self.candidates = list(candidates)
        self.steps = steps
        self._sync = sync
        self._clock = clock
        self._on_chosen = on_chosen
        self._droppable = droppable
        self._on_dropped = on_dropped
        self._next = 0
        #: The kept candidate, once chosen.
        self.chosen: Candidate | None = None if len(self.candidates) > 1 else self.candidates[0]

    @property
    def deciding(self) -> bool:
        """Whether steps are still being timed."""
        return self.chosen is None

    def __call__(self, flat_args: Sequence[Any]) -> Any:
        if self.chosen is not None:
            return self.chosen.run(flat_args)
        cand = self.candidates[self._next]
        self._next = (self._next + 1) % len(self.candidates)
        try:
            outputs = self._trial(cand, flat_args)
        except Exception as error:  # noqa: BLE001  (re-raised unless droppable)
            if cand is self.candidates[0] or not self._droppable(error):
                raise
            self._drop(cand, error)
            if self.chosen is not None:
                return self.chosen.run(flat_args)
            outputs = self._trial(self.candidates[0], flat_args)
        if all(len(c.seconds) >= self.steps for c in self.candidates):
            self._choose()
        return outputs

    def _trial(self, cand: Candidate, flat_args: Sequence[Any]) -> Any:
        """One step of ``cand``: its warm-up, or a timed step (mutates ``cand``)."""
        if not cand.warmed_up:
            outputs = cand.run(flat_args)
            self._sync()
            cand.warmed_up = True
            return outputs
        self._sync()
        before = cand.skipped() if cand.skipped is not None else None
        start = self._clock()
        outputs = cand.run(flat_args)
        self._sync()
        elapsed = self._clock() - start
        if (before is not None and cand.skipped() != before  # type: ignore[misc]
                and cand.discarded < MAX_DISCARDED * self.steps):
            cand.discarded += 1
        else:
            cand.seconds.append(elapsed)
        return outputs

    def _drop(self, cand: Candidate, error: BaseException) -> None:
        """Leave ``cand`` out of the choice (the planned step is never dropped)."""
        index = self.candidates.index(cand)
        del self.candidates[index]
        self._next = self._next - 1 if self._next > index else self._next
        self._next %= len(self.candidates)
        if self._on_dropped is not None:
            self._on_dropped(cand, error)
        if len(self.candidates) == 1:
            self._choose()

    def _choose(self) -> None:
        self.chosen = self._fastest()
        if self._on_chosen is not None:
            self._on_chosen(self)

    def _fastest(self) -> Candidate:
        planned = self.candidates[0]
        if len(self.candidates) == 1:
            return planned  # the others were dropped
        best = min(self.candidates, key=lambda c: (statistics.median(c.seconds), c is not planned))
        if best is planned:
            return planned
        gain = 1.0 - statistics.median(best.seconds) / statistics.median(planned.seconds)
        return best if gain >= MIN_GAIN else planned

    def summary(self) -> str:
        """The medians, as one clause of a log line: ``planned 10.2 ms, float32 9.1 ms``, and
        the steps not counted because they skipped their update (``planned 10.2 ms (3 steps
        that skipped their update not counted)``)."""
        def one(c: Candidate) -> str:
            skipped = (f" ({c.discarded} step{' that skipped its' if c.discarded == 1 else 's that skipped their'} "
                       "update not counted)" if c.discarded else "")
            return f"{c.name} {c.median_ms:.2f} ms{skipped}"

        return ", ".join(one(c) for c in self.candidates if c.median_ms is not None)
