"""Training with the rewrite: loss-scaled optimizers and the places the rewrite happens.

* :func:`enable_mixed_precision_graph_rewrite` / :func:`disable_mixed_precision_graph_rewrite`
  (:mod:`.optimizer`, :mod:`.keras_optimizer`): loss-scaled optimizers, scoped to what they
  train, with no process-global side effect.
* :func:`function` (:mod:`.tf_function`): ``tf.function`` whose traced graph is rewritten.
* :func:`rewrite_graph` and :class:`Session` (:mod:`.session`): TF1 graphs.
* :func:`rewrite_training_meta_graph` (:mod:`.offline`): an exported TF1 training
  MetaGraphDef, optimizer included (loss scaling written into the graph).
* :mod:`.loss_scale`: the loss-scale configurations and their update rule.

Names are imported lazily: ``import amp_rewrite.training`` imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "enable_mixed_precision_graph_rewrite",
    "disable_mixed_precision_graph_rewrite",
    "function",
    "Function",
    "rewrite_graph",
    "Session",
    "rewrite_training_meta_graph",
    "rewrite_keras_train_step",
    "LossScale",
    "DynamicLossScale",
    "FixedLossScale",
    "LossScaleOptimizerV1",
]

_WHERE = {
    "enable_mixed_precision_graph_rewrite": "optimizer",
    "disable_mixed_precision_graph_rewrite": "optimizer",
    "LossScaleOptimizerV1": "optimizer",
    "function": "tf_function",
    "Function": "tf_function",
    "rewrite_graph": "session",
    "Session": "session",
    "rewrite_training_meta_graph": "offline",
    "rewrite_keras_train_step": "keras_optimizer",
    "LossScale": "loss_scale",
    "DynamicLossScale": "loss_scale",
    "FixedLossScale": "loss_scale",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
