"""Keras 3 ``fit`` under ``tf.distribute.MultiWorkerMirroredStrategy``: two Keras bugs worked around.

1. Before its first step, Keras 3's TensorFlow trainer (``TensorFlowTrainer._maybe_symbolic_build``,
Keras 3.15) takes the first batch of the distributed dataset and calls
``strategy.reduce("MEAN", batch)`` on the *whole* ``(x, y)`` structure, only to learn shapes and
dtypes for building the model, its metrics and its optimizer.  ``MultiWorkerMirroredStrategy``
cannot reduce a nested structure, so every ``fit`` with ``(x, y)`` data fails there with
"Attempt to convert a value (PerReplica: ...) with an unsupported type" (keras-team/keras#20585)
before amp_rewrite's train step is ever traced.

:func:`install` gives one model instance a ``_maybe_symbolic_build`` that, under a
multi-worker ``MultiWorkerMirroredStrategy`` only, builds from this worker's own local batch
(one component per distributed value: same shapes and dtypes, and no collective is needed
just to learn them).  Every other case goes to Keras's method unchanged.

2. After each step, Keras's ``reduce_per_replica`` (``reduction="auto"``, i.e. ``"mean"``)
reduces every metric under a multi-worker strategy with ``strategy.reduce("MEAN", v, axis=0)``,
which cannot trace for a scalar (the loss): "Invalid reduction dimension 0 for input with 0
dimensions".  :func:`reduce_per_replica` (used by amp_rewrite's rewritten train function)
averages each value across replicas element-wise (``axis=None``) instead, which is what Keras
computes on one machine (``tf.reduce_mean`` over the replicas' values); other strategies and
reductions go to Keras's function unchanged.
"""

from __future__ import annotations

import types
from typing import Any

from ._common import multi_worker as _multi_worker

__all__ = ["install", "reduce_per_replica"]


def _maybe_symbolic_build(model: Any, iterator: Any = None, data_batch: Any = None) -> Any:
    """Keras's ``_maybe_symbolic_build`` with a per-leaf local batch under multi-worker MWMS.

    Consumes the first batch of ``iterator`` as Keras does (``fit`` resets the iterator right
    after); builds ``model`` (mutation: its variables, metrics and optimizer state are created).
    """
    import tensorflow as tf

    strategy = getattr(model, "_distribute_strategy", None)
    if iterator is None or strategy is None or not _multi_worker(strategy):
        return type(model)._maybe_symbolic_build(model, iterator=iterator, data_batch=data_batch)
    for _, _, it in iterator:
        first = next(it)
        break
    else:  # an empty dataset: Keras builds nothing either, and fit reports the empty input
        return None

    def local(value: Any) -> Any:
        # This worker's component: the shapes and dtypes are what the build needs.
        if isinstance(value, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(value)[0]
        return value

    return type(model)._maybe_symbolic_build(
        model, data_batch=tf.nest.map_structure(local, first))


def install(model: Any) -> None:
    """Give ``model`` (this instance only) the multi-worker-safe symbolic build.

    Mutates ``model``: sets the instance attribute ``_maybe_symbolic_build`` (a bound method,
    set with ``object.__setattr__`` so Keras does not track it as state).  Idempotent.
    """
    if "_maybe_symbolic_build" in model.__dict__:
        return
    object.__setattr__(model, "_maybe_symbolic_build", types.MethodType(_maybe_symbolic_build, model))


def reduce_per_replica(values: Any, strategy: Any, reduction: str = "auto") -> Any:
    """Keras's ``reduce_per_replica``, with element-wise means under multi-worker MWMS.

    Pure (builds ops in the current graph); call it in the cross-replica context, as Keras
    does.  Under a multi-worker ``MultiWorkerMirroredStrategy`` each mean is an all-reduce, so
    every worker must call it with the same structure, which a train step guarantees.
    """
    import tensorflow as tf
    from keras.src.backend.tensorflow.trainer import reduce_per_replica as keras_reduce

    if reduction not in ("auto", "mean") or not _multi_worker(strategy):
        return keras_reduce(values, strategy, reduction=reduction)

    def mean(value: Any) -> Any:
        if isinstance(value, tf.distribute.DistributedValues) or tf.is_tensor(value):
            return strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None)
        return value

    return tf.nest.map_structure(mean, values)
