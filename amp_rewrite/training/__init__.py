"""Training with the rewrite: loss-scaled optimizers and the places the rewrite happens.

* :func:`enable_mixed_precision_graph_rewrite` / :func:`disable_mixed_precision_graph_rewrite`
  (:mod:`.optimizer`, :mod:`.keras_optimizer`): loss-scaled optimizers, scoped to what they
  train, with no process-global side effect.
* :func:`function` (:mod:`.tf_function`): ``tf.function`` whose traced graph is rewritten.
* :func:`rewrite_graph`, :func:`rewrite_graph_with_result` and :class:`Session`
  (:mod:`.session`): TF1 graphs; :class:`MixedPrecisionSessionCreator` and
  :func:`MonitoredTrainingSession` (:mod:`.monitored`): TF1 ``MonitoredSession``.
* :mod:`.launcher`: ``amp-rewrite run SCRIPT.py``, an unmodified script trained rewritten.
* :func:`rewrite_training_meta_graph` (:mod:`.offline`): an exported TF1 training
  MetaGraphDef, optimizer included (loss scaling written into the graph).
* :mod:`.loss_scale`: the loss-scale configurations and their update rule.

Names are imported lazily: ``import amp_rewrite.training`` imports neither TensorFlow nor Keras.
Submodules import as usual (``amp_rewrite.training.session`` works without an import first).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

__all__ = [
    "enable_mixed_precision_graph_rewrite",
    "disable_mixed_precision_graph_rewrite",
    "function",
    "Function",
    "rewrite_graph",
    "rewrite_graph_with_result",
    "Session",
    "MixedPrecisionSessionCreator",
    "MonitoredTrainingSession",
    "rewrite_training_meta_graph",
    "rewrite_keras_train_step",
    "LossScale",
    "DynamicLossScale",
    "AutoLossScale",
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
    "rewrite_graph_with_result": "session",
    "Session": "session",
    "MixedPrecisionSessionCreator": "monitored",
    "MonitoredTrainingSession": "monitored",
    "rewrite_training_meta_graph": "offline",
    "rewrite_keras_train_step": "keras_optimizer",
    "LossScale": "loss_scale",
    "DynamicLossScale": "loss_scale",
    "AutoLossScale": "loss_scale",
    "FixedLossScale": "loss_scale",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        # A submodule not imported yet: imported now, so ``amp_rewrite.training.session``
        # works as it would in a package without a module __getattr__ after an import.
        if not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}"):
            return importlib.import_module(f".{name}", __name__)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
