"""What ``rewrite_saved_model(..., autotune=...)`` needs of a tuner.

This package never imports :mod:`amp_rewrite.autotune` (which builds on it): the caller
passes the tuner in, and this package calls only the methods below.
:class:`~amp_rewrite.autotune.AutotuneOptions` has them (``tune_model`` runs
:func:`~amp_rewrite.autotune.autotune_model`).
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence

from .formats import ModelFile
from .results import ModelRewrite


class TunedModel(Protocol):
    """The result of :meth:`Autotuner.tune_model` (an :class:`~amp_rewrite.autotune.ModelAutotune`)."""

    rewrite: ModelRewrite | None  # the fastest rewrite, None when float32 won
    rel_error: Mapping[str, float]
    rounds: int

    def as_dict(self) -> dict[str, Any]:
        """The report's ``autotune`` section (JSON-ready)."""
        ...


class Autotuner(Protocol):
    """How a model is autotuned (an :class:`~amp_rewrite.autotune.AutotuneOptions`)."""

    max_rel_error: float | None
    min_gain: float

    def check(self) -> None:
        """Raise :class:`~amp_rewrite.errors.AmpRewriteError` for settings that cannot be measured."""
        ...

    def tune_model(self, model: ModelFile, *, tags: Sequence[str] | None = None, xla: bool = False,
                   **rewrite_options: Any) -> TunedModel:
        """Rewrite ``model`` once per candidate, time each and float32 (with ``xla``, each
        marked for XLA and timed compiled), return the fastest."""
        ...


def _float32_kept(tuned: Any, opts: Any) -> str:
    """Why autotune kept the float32 model (the report's ``skipped``)."""
    if opts.max_rel_error is not None and tuned.rel_error and all(e > opts.max_rel_error for e in tuned.rel_error.values()):
        return f"autotune: no candidate's outputs are within {opts.max_rel_error:g} of float32's"
    return (f"autotune: no rewrite was faster than float32 by {opts.min_gain:.0%} beyond chance in "
            f"{tuned.rounds} rounds on this machine")
