"""Small pieces shared by the training modules: option checking and the "being rewritten" flag.

Nothing here imports TensorFlow at module level.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
import weakref
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from ..errors import AmpRewriteError

if TYPE_CHECKING:
    from .loss_scale import LossScale

__all__ = [
    "DEFAULT_TARGET",
    "LossScaleSettings",
    "check_rewrite_options",
    "rewrite_trace",
    "in_rewrite_trace",
    "note_rewrite_options",
    "warn_once",
    "building_unrewritten_function",
]

log = logging.getLogger(__name__)

#: The training API rewrites for this machine unless told otherwise.  On a machine without a
#: suitable GPU or CPU this leaves the graph unchanged (with one INFO line saying why).
DEFAULT_TARGET = "auto"

# Options that the training API computes itself and so may not be passed through.
_RESERVED = {"graph_def"}

class LossScaleSettings:
    """The read-only settings both loss-scaled optimizers (Keras 3 and TF1) expose.

    The class using it sets ``_amp_loss_scale`` and ``_amp_rewrite_options`` in ``__init__``
    (attribute names the wrapped optimizers do not use, so forwarding never shadows them).
    """

    _amp_loss_scale: "LossScale"
    _amp_rewrite_options: Mapping[str, Any]

    @property
    def loss_scale(self) -> "LossScale":
        """The loss-scale configuration."""
        return self._amp_loss_scale

    @property
    def rewrite_options(self) -> dict[str, Any]:
        """The options the train step is rewritten with (a copy)."""
        return dict(self._amp_rewrite_options)


_trace_lock = threading.Lock()
_trace_depth = 0
# One list per active rewrite_trace(): the rewrite options of the loss-scaled optimizers that
# were traced into it, so a step decorated without options uses its optimizer's.
_collectors: list[list[dict[str, Any]]] = []
# owner -> keys already warned about; weak, so a new object reusing an id is warned again.
_warned: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()


def check_rewrite_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Validate ``**rewrite_options`` against :func:`amp_rewrite.rewrite_graph_def` early.

    Returns a new dict with ``target`` defaulted to ``"auto"``; never mutates ``options``.
    A typo would otherwise surface only at the first training step, far from its cause.

    Raises
    ------
    AmpRewriteError
        For an option that ``rewrite_graph_def`` does not take.
    """
    from ..api import rewrite_graph_def

    allowed = set(inspect.signature(rewrite_graph_def).parameters) - _RESERVED
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise AmpRewriteError(
            f"unknown rewrite option(s) {', '.join(unknown)}; rewrite_graph_def takes "
            f"{', '.join(sorted(allowed))}"
        )
    out = dict(options)
    out.setdefault("target", DEFAULT_TARGET)
    return out


@contextlib.contextmanager
def rewrite_trace() -> Iterator[list[dict[str, Any]]]:
    """Mark that amp_rewrite is tracing a function whose graph it will rewrite.

    Yields a list that collects the rewrite options noted (:func:`note_rewrite_options`) by
    the loss-scaled optimizers traced meanwhile.

    Process-wide rather than thread-local on purpose: MirroredStrategy traces each replica in a
    thread of its own, and those replicas belong to the same rewritten trace.  The flag only
    decides whether a warning is logged, so the rare false negative under concurrent tracing
    in unrelated threads is harmless.
    """
    global _trace_depth
    seen: list[dict[str, Any]] = []
    with _trace_lock:
        _trace_depth += 1
        _collectors.append(seen)
    try:
        yield seen
    finally:
        with _trace_lock:
            _trace_depth -= 1
            # By identity: list.remove compares by equality, and a nested or concurrent trace
            # that saw the same options (or none) holds an equal list.
            for i, other in enumerate(_collectors):
                if other is seen:
                    del _collectors[i]
                    break


def note_rewrite_options(options: Mapping[str, Any]) -> None:
    """Record, for every active :func:`rewrite_trace`, the options of an optimizer traced in it."""
    with _trace_lock:
        for seen in _collectors:
            if dict(options) not in seen:
                seen.append(dict(options))


def in_rewrite_trace() -> bool:
    """Whether some :func:`rewrite_trace` is active."""
    return _trace_depth > 0


def warn_once(owner: object, key: str, message: str) -> None:
    """Log ``message`` as a WARNING once per (``owner``, ``key``)."""
    try:
        keys = _warned.setdefault(owner, set())
    except TypeError:  # not weak-referenceable: warn every time rather than never
        keys = set()
    if key in keys:
        return
    keys.add(key)
    log.warning(message)


def building_unrewritten_function() -> bool:
    """True while TensorFlow traces a ``tf.function`` that amp_rewrite did not ask for.

    Used by the loss-scaled optimizers to warn that their step will not be rewritten (the
    silent no-op users of TensorFlow's API complained about).  A TF1 ``tf.Graph`` is not a
    function: it is rewritten later by :class:`amp_rewrite.Session`.
    """
    import tensorflow as tf

    graph = tf.compat.v1.get_default_graph()
    return bool(getattr(graph, "building_function", False)) and not in_rewrite_trace()
