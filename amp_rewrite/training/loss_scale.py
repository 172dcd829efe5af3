"""Loss scales: a fixed one and TensorFlow's dynamic one, as configuration plus pure update math.

A :class:`LossScale` is immutable configuration and holds no TensorFlow state, so one instance
can be shared by optimizers, graphs and processes.  The *state* (the current scale, the count
of consecutive finite steps, the count of skipped steps) lives in variables owned by whoever
trains: the Keras wrapper (Keras variables, checkpointed with the optimizer), the TF1 wrapper
(one set per ``tf.Graph``, in ``GLOBAL_VARIABLES`` so ``Saver`` and the initializer see them),
or the offline MetaGraphDef rewrite (variables added to the graph).

:func:`next_state` computes the new state with ``tf.where`` only, no control flow, so it can run
in any context (graph, ``tf.function``, cross-replica) and gives the same answer wherever the
same finite flag goes in.

The dynamic rule is TensorFlow's ``tf.compat.v1.mixed_precision.DynamicLossScale`` (design
notes §7.4): on a finite step, count it, and after ``increment_period`` consecutive finite steps
multiply the scale by ``multiplier`` (only if the result is finite) and restart the count; on a
non-finite step, divide the scale by ``multiplier`` (never below ``min_scale``), restart the
count, and skip the update.  We also count skipped steps, because users could not tell expected
calibration skips from real divergence (user_issues.md, Theme 3).

:class:`AutoLossScale` (``"auto"``, the training wrappers' default) is the dynamic rule where
the rewrite runs float16 and no loss scaling where it runs bfloat16 (:func:`applies`), as Keras's
``mixed_float16`` and ``mixed_bfloat16`` policies do.
"""

from __future__ import annotations

import abc
import logging
import math
from dataclasses import dataclass
from typing import Any, Iterable

from ..graph.training_ops import LOSS_SCALE_SCOPE

__all__ = [
    "LossScale",
    "FixedLossScale",
    "DynamicLossScale",
    "AutoLossScale",
    "get",
    "applies",
    "all_finite",
    "unscale",
    "next_state",
    "SCOPE",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LossScale(abc.ABC):
    """Base class of the loss-scale configurations; use :func:`get` to build one."""

    @property
    def dynamic(self) -> bool:
        """Whether the scale changes during training (and non-finite steps are skipped)."""
        return False

    @property
    @abc.abstractmethod
    def initial_scale(self) -> float:
        """The scale the first step uses."""


@dataclass(frozen=True)
class FixedLossScale(LossScale):
    """A constant loss scale.

    As in TensorFlow, a fixed scale never skips a step: gradients are unscaled and applied even
    when they are not finite.  Use ``"dynamic"`` to get skipping.
    """

    value: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)):
            raise TypeError(f"a fixed loss scale must be a Python int or float, got {self.value!r}")
        if not math.isfinite(self.value) or self.value < 1:
            raise ValueError(f"a fixed loss scale must be finite and >= 1, got {self.value!r}")

    @property
    def initial_scale(self) -> float:
        return float(self.value)


@dataclass(frozen=True)
class DynamicLossScale(LossScale):
    """TensorFlow's dynamic loss scale, with its defaults (2**15, 2000, 2.0), all configurable.

    ``min_scale`` is the floor when halving (TensorFlow's TF1 loss scale uses 1; Keras 3 has no
    floor).  A small ``increment_period`` makes growth observable in tests.
    """

    initial_loss_scale: float = 2.0**15
    increment_period: int = 2000
    multiplier: float = 2.0
    min_scale: float = 1.0

    def __post_init__(self) -> None:
        if not (isinstance(self.initial_loss_scale, (int, float)) and math.isfinite(self.initial_loss_scale)
                and self.initial_loss_scale >= 1):
            raise ValueError(f"initial_loss_scale must be finite and >= 1, got {self.initial_loss_scale!r}")
        if isinstance(self.increment_period, bool) or not isinstance(self.increment_period, int) \
                or self.increment_period < 1:
            raise ValueError(f"increment_period must be an int >= 1, got {self.increment_period!r}")
        if not (isinstance(self.multiplier, (int, float)) and math.isfinite(self.multiplier)
                and self.multiplier > 1):
            raise ValueError(f"multiplier must be finite and > 1, got {self.multiplier!r}")
        if not (isinstance(self.min_scale, (int, float)) and 0 < self.min_scale <= self.initial_loss_scale):
            raise ValueError(
                f"min_scale must be > 0 and <= initial_loss_scale, got {self.min_scale!r}"
            )

    @property
    def dynamic(self) -> bool:
        return True

    @property
    def initial_scale(self) -> float:
        return float(self.initial_loss_scale)


@dataclass(frozen=True)
class AutoLossScale(DynamicLossScale):
    """Loss scaling where the low precision needs it: :class:`DynamicLossScale` (these fields)
    where the rewrite runs float16, none where it runs bfloat16 (:func:`applies`).

    Loss scaling keeps float16 gradients, whose smallest normal value is 6.1e-5, from flushing
    to zero.  bfloat16 has float32's exponent range (down to 1.2e-38), so a gradient float32
    holds does not flush; scaling would only cost time: a scan of every gradient for overflow,
    the division, and a conditional around the update (which XLA runs as a host round trip on
    a GPU).  Keras's ``mixed_bfloat16`` policy does not scale either; ``mixed_float16`` does.
    """


def applies(loss_scale: LossScale, precision: str) -> bool:
    """Whether ``loss_scale`` scales the loss of a step rewritten to ``precision``
    (``"float16"`` or ``"bfloat16"``): always, but for :class:`AutoLossScale` in bfloat16.
    Pure."""
    return not (isinstance(loss_scale, AutoLossScale) and precision == "bfloat16")


def get(identifier: Any) -> LossScale:
    """Interpret a loss-scale argument.

    ``"auto"`` gives :class:`AutoLossScale` (dynamic in float16, none in bfloat16);
    ``"dynamic"`` gives :class:`DynamicLossScale` with TensorFlow's defaults; an int or float
    (or its text, such as ``"128"``) gives :class:`FixedLossScale`; a :class:`LossScale` is
    returned as is.  TensorFlow's own
    (deprecated) ``tf.compat.v1.mixed_precision.DynamicLossScale``/``FixedLossScale`` objects
    are converted, so code written for ``tf.compat.v1.mixed_precision`` keeps working.

    Raises
    ------
    ValueError
        For ``None`` or anything else that is not a loss scale.
    """
    if isinstance(identifier, LossScale):
        return identifier
    if isinstance(identifier, str):
        if identifier == "auto":
            return AutoLossScale()
        if identifier == "dynamic":
            return DynamicLossScale()
        try:  # a number given as text, as on a command line
            return FixedLossScale(float(identifier))
        except ValueError:
            raise ValueError(
                f"unknown loss scale {identifier!r}; expected 'auto', 'dynamic' or a number >= 1"
            ) from None
    if isinstance(identifier, (int, float)) and not isinstance(identifier, bool):
        return FixedLossScale(identifier)
    # Duck-typed conversion of TensorFlow's deprecated loss-scale classes (no import needed).
    cls_name = type(identifier).__name__
    if cls_name == "DynamicLossScale" and hasattr(identifier, "increment_period"):
        return DynamicLossScale(
            float(identifier.initial_loss_scale), int(identifier.increment_period),
            float(identifier.multiplier),
        )
    if cls_name == "FixedLossScale" and hasattr(identifier, "_loss_scale_value"):
        return FixedLossScale(float(identifier._loss_scale_value))
    raise ValueError(
        f"could not interpret loss scale {identifier!r}: expected 'auto', 'dynamic', a number >= 1, "
        "or an amp_rewrite.training.loss_scale.LossScale"
    )


def _values(grad: Any) -> Any:
    """The dense values of a gradient (``IndexedSlices`` carry theirs in ``.values``)."""
    return getattr(grad, "values", grad)


def all_finite(grads: Iterable[Any]) -> Any:
    """A boolean scalar tensor: every element of every non-``None`` gradient is finite.

    Pure; builds ops in the current graph (or runs eagerly).  With no gradients it is True.
    """
    import tensorflow as tf

    flags = [tf.reduce_all(tf.math.is_finite(_values(g))) for g in grads if g is not None]
    if not flags:
        return tf.constant(True)
    if len(flags) == 1:
        return flags[0]
    return tf.reduce_all(tf.stack(flags))


#: The name scope of the ops that apply the loss scale to a loss or a gradient
#: (:func:`unscale`, the optimizers' loss multiply); every rewrite keeps what is under it
#: float32 (:data:`amp_rewrite.graph.training_ops.LOSS_SCALE_SCOPE` says why).
SCOPE = LOSS_SCALE_SCOPE


def unscale(grad: Any, scale: Any) -> Any:
    """``grad / scale``, returned in the gradient's own dtype; ``IndexedSlices`` keep their
    sparsity, ``None`` stays ``None``.  Pure; builds ops in the current graph (or runs eagerly),
    under :data:`SCOPE`, so that a rewrite of the step keeps them float32.

    A float16 or bfloat16 gradient is divided in float32: the dynamic scale grows past
    65504, float16's largest value, and cast to float16 it would be ``inf``, turning every
    finite gradient into zero while the finite-check still passes.
    """
    import tensorflow as tf

    with tf.name_scope(SCOPE):
        return _unscale(grad, scale)


def _unscale(grad: Any, scale: Any) -> Any:
    import tensorflow as tf

    def divide(values: Any) -> Any:
        if values.dtype in (tf.float16, tf.bfloat16):
            return tf.cast(tf.cast(values, tf.float32) / tf.cast(scale, tf.float32), values.dtype)
        return values / tf.cast(scale, values.dtype)

    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(divide(grad.values), grad.indices, grad.dense_shape)
    return divide(grad)


def next_state(
    loss_scale: LossScale, scale: Any, good_steps: Any, skipped_steps: Any, is_finite: Any
) -> tuple[Any, Any, Any]:
    """The state after one step: ``(new_scale, new_good_steps, new_skipped_steps)``.

    Pure: it reads the given tensors (or variables) and returns new tensors with the dtypes of
    the inputs; assigning them is the caller's job.  Only ``tf.where``, no ``tf.cond``, so it is
    safe in a replica context and costs nothing to run every step.  For a fixed scale the state
    never changes.
    """
    import tensorflow as tf

    scale = tf.convert_to_tensor(scale)
    good_steps = tf.convert_to_tensor(good_steps)
    skipped_steps = tf.convert_to_tensor(skipped_steps)
    if not isinstance(loss_scale, DynamicLossScale):
        return scale, good_steps, skipped_steps
    is_finite = tf.convert_to_tensor(is_finite)
    multiplier = tf.constant(loss_scale.multiplier, scale.dtype)
    one = tf.ones_like(good_steps)
    zero = tf.zeros_like(good_steps)
    period = tf.cast(loss_scale.increment_period, good_steps.dtype)
    grow = tf.logical_and(is_finite, good_steps + one >= period)
    grown = scale * multiplier
    # TensorFlow assigns the grown scale only if it is finite (a float32 scale can overflow).
    grown = tf.where(tf.math.is_finite(grown), grown, scale)
    shrunk = tf.maximum(scale / multiplier, tf.constant(loss_scale.min_scale, scale.dtype))
    new_scale = tf.where(is_finite, tf.where(grow, grown, scale), shrunk)
    new_good = tf.where(tf.logical_and(is_finite, tf.logical_not(grow)), good_steps + one, zero)
    new_skipped = tf.where(is_finite, skipped_steps, skipped_steps + tf.ones_like(skipped_steps))
    return new_scale, new_good, new_skipped
