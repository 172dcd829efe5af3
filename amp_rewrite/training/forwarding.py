"""Attribute forwarding from a loss-scaled wrapper to the optimizer it wraps.

TensorFlow's wrappers hid the inner optimizer's attributes (``opt.lr`` disappeared and
learning-rate schedules broke, tensorflow/tensorflow#32905).  Forwarding everything would be
wrong too: TensorFlow's and Keras's tracking code probes *private* attributes lazily with
``getattr(obj, name, default)``, and the wrapper must not answer those with the inner
optimizer's bookkeeping.  So public names are forwarded, and private names only when they are
common hyperparameters or hold variables (slots such as Keras's ``_momentums``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["forwarded_attribute"]

#: Private hyperparameter attributes of TF1 and Keras optimizers that user code reads.
_PRIVATE_HYPERPARAMETERS = frozenset({
    "_learning_rate", "_lr", "_momentum", "_use_nesterov", "_beta1", "_beta2", "_epsilon",
    "_decay", "_rho", "_initial_accumulator_value", "_learning_rate_power",
    "_l1_regularization_strength", "_l2_regularization_strength",
})


def _holds_variables(value: Any) -> bool:
    import tensorflow as tf

    def is_var(v: Any) -> bool:
        return isinstance(v, tf.Variable) or type(v).__name__ == "Variable" and hasattr(v, "assign")

    if is_var(value):
        return True
    if isinstance(value, (list, tuple)) and value:
        return all(is_var(v) for v in value)
    if isinstance(value, dict) and value:
        return all(is_var(v) or isinstance(v, dict) for v in value.values())
    return False


def forwarded_attribute(wrapper: Any, inner: Any, name: str) -> Any:
    """The inner optimizer's attribute ``name``, or ``AttributeError`` naming the wrapper.

    Pure lookup; called from ``__getattr__`` (so only for names the wrapper lacks).
    """
    if name.startswith("__") or name.startswith("_self_"):
        raise AttributeError(name)
    if name.startswith("_"):
        if name not in _PRIVATE_HYPERPARAMETERS:
            value = inner.__dict__.get(name)
            if value is None or not _holds_variables(value):
                raise AttributeError(
                    f"{type(wrapper).__name__!r} object has no attribute {name!r}"
                )
            return value
    try:
        return getattr(inner, name)
    except AttributeError:
        raise AttributeError(
            f"neither {type(wrapper).__name__!r} nor the optimizer it wraps "
            f"({type(inner).__name__}) has attribute {name!r}"
        ) from None
