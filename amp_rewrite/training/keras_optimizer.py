"""The Keras 3 side: a loss-scaled optimizer whose model's train step is rewritten.

Importing this module imports Keras; :mod:`amp_rewrite` imports it only when a Keras optimizer
is wrapped.

:class:`LossScaleOptimizer` subclasses ``keras.optimizers.LossScaleOptimizer`` so that Keras's
trainer treats it as one (``scale_loss`` is applied in ``train_step``, ``compile`` does not wrap
it again), but replaces its update rule:

* TensorFlow's dynamic loss scale (:mod:`.loss_scale`): the halving has a floor, growth is
  checked for overflow, and the period and multiplier are configurable; skipped steps are
  counted.
* Under ``tf.distribute`` every replica takes the same skip decision.  Keras 3 takes the
  finite flag of the *first* replica's local gradients, so a NaN that only another replica sees
  is applied (after the all-reduce) to every replica.  Here each replica's flag is summed
  across replicas in the cross-replica context before the decision, and the ``tf.cond`` around
  the inner update runs in the cross-replica context, so no collective sits inside a
  replica-dependent branch.

The rewrite of the train step: Keras has no hook that tells an optimizer which model compiled
it before ``fit`` traces the train step, and the step must be rewritten *as a whole* (forward
pass, gradients and update).  The model's tracking code does call the optimizer's
``_maybe_initialize_trackable`` from ``model.compile`` (assigning ``model.optimizer``); the
override below recognises that call and installs, on that one model instance only, a
``make_train_function`` that runs the train step through :class:`amp_rewrite.function`, and
``make_test_function`` / ``make_predict_function`` that do the same for ``evaluate`` (and
``fit``'s validation) and ``predict``, so inference runs the rewritten plan the model is trained
with.  The installed methods check at call time that the model's optimizer is still one of
ours.  If the hook is missed (a future Keras), the optimizer logs a WARNING when it is traced
into an unrewritten graph, and :func:`rewrite_keras_train_step` installs the same thing
explicitly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import types
import weakref
from typing import Any, Iterator, Mapping

import keras
import tensorflow as tf

from ..errors import AmpRewriteError
from . import loss_scale as loss_scale_module
from ._common import (
    LossScaleSettings,
    compiled_for_gpu,
    building_unrewritten_function,
    check_rewrite_options,
    note_rewrite_options,
    warn_once,
)
from .forwarding import forwarded_attribute
from .tf_function import Function, note_layer_scopes

__all__ = ["LossScaleOptimizer", "rewrite_keras_train_step"]

log = logging.getLogger(__name__)

try:  # Keras's own decorator, so the extra counter is tracked once, like LSO's variables.
    from keras.src.utils.tracking import no_automatic_dependency_tracking as _no_tracking
except ImportError:  # pragma: no cover - a Keras without it tracks a variable twice at worst
    def _no_tracking(fn: Any) -> Any:
        return fn


@keras.saving.register_keras_serializable(package="amp_rewrite")
class LossScaleOptimizer(LossScaleSettings, keras.optimizers.LossScaleOptimizer):
    """A Keras 3 loss-scaled optimizer for models trained with amp_rewrite's graph rewrite.

    Build it with :func:`amp_rewrite.enable_mixed_precision_graph_rewrite`.  Attribute access
    falls through to the inner optimizer (``learning_rate`` and ``iterations`` as in Keras,
    hyperparameters such as ``beta_1``, slot variables such as ``_momentums``), and its
    variables (the inner optimizer's plus the scale, the finite-step counter and the skipped-step
    counter) are saved with the model and in ``tf.train.Checkpoint``.

    As with Keras's own ``LossScaleOptimizer``, gradients must be of ``scale_loss(loss)``:
    Keras's ``train_step`` does this; a custom ``train_step`` or training loop must too.  Under
    a distribution strategy, build the optimizer (``opt.build(variables)`` in the strategy's
    scope) before a custom training step is traced; ``fit`` does this itself.
    """

    def __init__(
        self,
        inner_optimizer: Any,
        loss_scale: Any = "auto",
        rewrite_options: Mapping[str, Any] | None = None,
        name: str | None = None,
        **kwargs: Any,
    ) -> None:
        if isinstance(loss_scale, dict):  # from get_config
            loss_scale = _loss_scale_from_config(loss_scale)
        scale = loss_scale_module.get(loss_scale)
        # Keras's growth counter; a fixed scale never grows (our update rule ignores it anyway).
        dynamic = isinstance(scale, loss_scale_module.DynamicLossScale)
        growth = scale.increment_period if dynamic else 2**31 - 1
        super().__init__(inner_optimizer, initial_scale=scale.initial_scale,
                         dynamic_growth_steps=growth, name=name, **kwargs)
        # Immutable values, so Keras's attribute tracking leaves them alone.
        self._amp_loss_scale = scale
        self._amp_rewrite_options = types.MappingProxyType(check_rewrite_options(rewrite_options or {}))

    # -- attribute forwarding -------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails.  Before __init__ has set inner_optimizer this
        # must fail, because Keras's __setattr__ probes attributes with getattr.
        inner = self.__dict__.get("inner_optimizer")
        if inner is None:
            raise AttributeError(name)
        return forwarded_attribute(self, inner, name)

    # -- the model hook -------------------------------------------------------------------
    def _maybe_initialize_trackable(self) -> None:
        # See the module docstring: model.compile -> Layer.__setattr__("optimizer", self) ->
        # Trackable._handle_deferred_dependencies(name="optimizer") calls this method with the
        # model as the caller's `self`.
        frame = sys._getframe(1)
        try:
            caller = frame.f_locals
            if caller.get("name") == "optimizer" and isinstance(caller.get("self"), keras.Model):
                _install(caller["self"])
        finally:
            del frame
        super()._maybe_initialize_trackable()

    # -- state ------------------------------------------------------------------------------
    @_no_tracking
    def build(self, var_list: Any) -> None:
        super().build(var_list)
        self.skipped_steps_counter = self.add_variable(
            shape=(), dtype="int", initializer="zeros", aggregation="none", name="skipped_steps",
        )

    @property
    def current_loss_scale(self) -> Any:
        """The current loss scale as a float32 tensor (``float(opt.current_loss_scale)``): 1.0
        where this optimizer does not scale (:attr:`scales_loss`: ``loss_scale="auto"`` in
        bfloat16)."""
        if not self._scaled_its_steps():
            return tf.constant(1.0, tf.float32)
        if not self.built:
            return tf.constant(self._amp_loss_scale.initial_scale, tf.float32)
        return tf.convert_to_tensor(self.dynamic_scale)

    @property
    def skipped_steps(self) -> Any:
        """How many updates were skipped because a gradient was not finite (a tensor)."""
        if not self.built:
            return tf.constant(0, tf.int64)
        return tf.convert_to_tensor(self.skipped_steps_counter)

    # -- the update -------------------------------------------------------------------------
    def scale_loss(self, loss: Any) -> Any:
        """``loss`` times the current loss scale, or ``loss`` itself where the step is not
        loss-scaled: traced again because its rewrite converted nothing
        (:func:`._common.unscaled`), or rewritten to bfloat16 with ``loss_scale="auto"``."""
        self._warn_if_not_rewritten()
        if self._loss_scaling_off():
            return loss
        _note_scaled_in(self, tf.compat.v1.get_default_graph())
        with tf.name_scope(loss_scale_module.SCOPE):  # kept float32 by the rewrite (SCOPE says why)
            return super().scale_loss(loss)

    def apply(self, grads: Any, trainable_variables: Any = None) -> None:
        """Unscale, and apply with the inner optimizer unless a gradient is not finite.

        Must be called in a replica context (as Keras's ``apply`` is); mutates the model's
        variables, the inner optimizer's variables and the loss-scale state.  Where the step
        is not loss-scaled (:meth:`scale_loss`) the inner optimizer applies ``grads`` as they
        are, and the loss-scale state is untouched.
        """
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
            self.built = True
        self._warn_if_not_rewritten()
        grads = list(grads)
        if trainable_variables is not None:
            trainable_variables = list(trainable_variables)
        if tf.distribute.in_cross_replica_context():
            raise ValueError("apply() must be called in a replica context.")
        if not self._loss_scaling_off():
            self._warn_if_loss_not_scaled()
        if self._loss_scaling_off():
            # The step runs float32 whole (its rewrite converted nothing), or in bfloat16, which
            # needs no scaling: the gradients were not scaled, and the inner optimizer applies
            # them as it would without us.  The loss-scale state is left as it is.
            self.inner_optimizer.apply(grads, trainable_variables=trainable_variables)
            return
        if tf.distribute.has_strategy():
            tf.distribute.get_replica_context().merge_call(
                self._cross_replica_apply, args=(grads, trainable_variables)
            )
            return
        finite = loss_scale_module.all_finite(grads)
        self._maybe_apply(finite, lambda: self._apply_unscaled(grads, trainable_variables))

    def _maybe_apply(self, finite: Any, apply_fn: Any) -> None:
        """Run ``apply_fn`` if ``finite``, and advance the loss-scale state either way.

        Traced for XLA on a GPU (:func:`._common.compiled_for_gpu`, which says why), both
        branches assign the loss-scale state, so neither is empty; elsewhere the skip branch
        stays empty.  Mutates the variables ``apply_fn`` updates and the loss-scale state.
        """
        if self._amp_loss_scale.dynamic and compiled_for_gpu():
            def on_finite() -> None:
                apply_fn()
                self._update_state(tf.constant(True))

            tf.cond(finite, on_finite, lambda: self._update_state(tf.constant(False)))
            return
        if self._amp_loss_scale.dynamic:
            tf.cond(finite, apply_fn, lambda: None)
        else:
            apply_fn()  # a fixed scale never skips, as in TensorFlow
        self._update_state(finite)

    def _cross_replica_apply(self, distribution: Any, grads: Any, trainable_variables: Any) -> None:
        # One finite flag per replica, summed across replicas: every replica then sees the same
        # decision, whichever replica's gradients overflowed.
        flags = distribution.extended.call_for_each_replica(
            lambda g: tf.cast(loss_scale_module.all_finite(g), tf.float32), args=(grads,)
        )
        n_finite = distribution.reduce(tf.distribute.ReduceOp.SUM, flags, axis=None)
        finite = tf.equal(n_finite, tf.cast(distribution.num_replicas_in_sync, n_finite.dtype))

        def apply_fn() -> None:
            distribution.extended.call_for_each_replica(
                self._apply_unscaled, args=(grads, trainable_variables)
            )

        self._maybe_apply(finite, apply_fn)

    def _apply_unscaled(self, grads: Any, trainable_variables: Any) -> None:
        scale = tf.convert_to_tensor(self.dynamic_scale)
        variables = trainable_variables or self._trainable_variables
        unscaled = [
            g if self._overwrite_variable_with_gradient(v) else loss_scale_module.unscale(g, scale)
            for g, v in zip(grads, variables)
        ]
        self.inner_optimizer.apply(unscaled, trainable_variables=trainable_variables)

    def _update_state(self, finite: Any) -> None:
        new_scale, new_good, new_skipped = loss_scale_module.next_state(
            self._amp_loss_scale, self.dynamic_scale, self.step_counter,
            self.skipped_steps_counter, finite,
        )
        self.dynamic_scale.assign(new_scale)
        self.step_counter.assign(new_good)
        self.skipped_steps_counter.assign(new_skipped)

    def _warn_if_loss_not_scaled(self) -> None:
        """One WARNING where :meth:`apply` is traced into a step in which :meth:`scale_loss`
        never ran: the gradients it gets are then of a loss nobody scaled, and dividing them by
        the scale (2**15 and up) makes every update that much too small -- training stalls,
        silently (a custom loop written for a plain optimizer).  Keras's ``fit`` scales the
        loss itself.  Eagerly there is no step to look at."""
        if tf.executing_eagerly() or _scaled_in(self, tf.compat.v1.get_default_graph()):
            return
        warn_once(self, "apply-without-scale-loss", (
            f"amp_rewrite: optimizer {self.name!r} applies gradients in a step that did not call its scale_loss: "
            "they are divided by the loss scale all the same, so every update is the loss scale times too small "
            "unless you scaled the loss yourself; take the gradients of opt.scale_loss(loss), as Keras's "
            "train_step does"))

    def _skipped_count(self) -> int:
        """:attr:`skipped_steps` now, as an int (read eagerly)."""
        return int(self.skipped_steps.numpy())

    def _warn_if_not_rewritten(self) -> None:
        note_rewrite_options(self._amp_rewrite_options, scaled=not self._loss_scaling_off(),
                             skipped=self._skipped_count)
        if building_unrewritten_function():
            warn_once(self, "unrewritten", (
                f"amp_rewrite: optimizer {self.name!r} is being traced into a tf.function that "
                "amp_rewrite does not rewrite, so that step runs in float32"
                f"{' (with loss scaling)' if self.scales_loss else ''}. "
                "Compile the Keras model with this optimizer, call "
                "amp_rewrite.training.rewrite_keras_train_step(model), or decorate a custom "
                "training step with @amp_rewrite.function."
            ))

    # -- serialization ----------------------------------------------------------------------
    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.pop("initial_scale", None)
        config.pop("dynamic_growth_steps", None)
        config["loss_scale"] = _loss_scale_config(self._amp_loss_scale)
        config["rewrite_options"] = {k: _config_value(k, v) for k, v in self._amp_rewrite_options.items()}
        return config


def _config_value(key: str, value: Any) -> Any:
    """``value`` as JSON can hold it (tuples become lists, paths strings), for the Keras config.

    Raises
    ------
    AmpRewriteError
        For a value the config cannot carry (a :class:`~amp_rewrite.Target` object, say):
        silently dropping it would make a reloaded model train with other options.
    """
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return [_config_value(key, v) for v in value]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: _config_value(key, v) for k, v in value.items()}
    raise AmpRewriteError(
        f"rewrite option {key}={value!r} cannot be saved in the optimizer's config; pass it as a "
        "string, number, list or dict (e.g. target='gpu:8.0' rather than a Target object)"
    )


def _loss_scale_config(scale: loss_scale_module.LossScale) -> dict[str, Any]:
    if isinstance(scale, loss_scale_module.DynamicLossScale):  # AutoLossScale included
        return {"class_name": type(scale).__name__, "initial_loss_scale": scale.initial_loss_scale,
                "increment_period": scale.increment_period, "multiplier": scale.multiplier,
                "min_scale": scale.min_scale}
    return {"class_name": "FixedLossScale", "value": scale.initial_scale}


def _loss_scale_from_config(config: Mapping[str, Any]) -> loss_scale_module.LossScale:
    fields = {k: v for k, v in config.items() if k != "class_name"}
    if config.get("class_name") == "AutoLossScale":
        return loss_scale_module.AutoLossScale(**fields)
    if config.get("class_name") == "DynamicLossScale":
        return loss_scale_module.DynamicLossScale(**fields)
    return loss_scale_module.FixedLossScale(**fields)


# -- the rewritten train step ---------------------------------------------------------------

def _install(model: Any) -> None:
    """Give ``model`` (this instance only) ``make_train_function``, ``make_test_function`` and
    ``make_predict_function`` methods that rewrite the step.  Mutates ``model``."""
    if model.__dict__.get("_amp_rewrite_installed"):
        return
    # object.__setattr__: a bound method is not state Keras should track or save.
    object.__setattr__(model, "make_train_function", types.MethodType(_make_train_function, model))
    object.__setattr__(model, "make_test_function", types.MethodType(_make_test_function, model))
    object.__setattr__(model, "make_predict_function",
                       types.MethodType(_make_predict_function, model))
    object.__setattr__(model, "_amp_rewrite_installed", True)
    # Keras 3's own symbolic build breaks fit under MultiWorkerMirroredStrategy before the
    # train step is traced (keras-team/keras#20585); see _keras_multiworker.
    from . import _keras_multiworker

    _keras_multiworker.install(model)
    # A model compiled (or used) before may hold functions traced without the rewrite.
    for cached in ("train_function", "test_function", "predict_function"):
        if getattr(model, cached, None) is not None:
            setattr(model, cached, None)


def rewrite_keras_train_step(model: Any) -> None:
    """Make ``model.fit`` run its train step through the rewrite (explicit form of the hook),
    and ``evaluate``/``predict`` their steps.

    Mutates ``model``: sets instance attributes ``make_train_function``,
    ``make_test_function`` and ``make_predict_function`` and clears the cached functions.  The
    model must be compiled with an optimizer from
    :func:`amp_rewrite.enable_mixed_precision_graph_rewrite` by the time ``fit`` runs; with any
    other optimizer Keras's own train function is used.
    """
    if not isinstance(model, keras.Model):
        raise TypeError(f"expected a keras.Model, got {type(model).__name__}")
    _install(model)


def _make_train_function(model: Any, force: bool = False) -> Any:
    optimizer = getattr(model, "optimizer", None)
    if not isinstance(optimizer, LossScaleOptimizer):
        # Recompiled with another optimizer: Keras's own train function, untouched.
        return type(model).make_train_function(model, force)
    if model.train_function is not None and not force:
        return model.train_function
    if model.run_eagerly:
        warn_once(model, "eager", (
            "amp_rewrite: the model runs eagerly (run_eagerly=True), so there is no graph to "
            "rewrite; training runs in float32 with loss scaling"
        ))
        return type(model).make_train_function(model, force)
    model.train_function = _rewritten_train_function(model, optimizer.rewrite_options)
    return model.train_function


def _rewritten_optimizer(model: Any) -> "LossScaleOptimizer | None":
    """The model's optimizer if it is ours and the model runs graphs (else ``None``: Keras's
    own function is used; the train function has already warned about eager models)."""
    optimizer = getattr(model, "optimizer", None)
    if not isinstance(optimizer, LossScaleOptimizer) or model.run_eagerly:
        return None
    return optimizer


def _make_test_function(model: Any, force: bool = False) -> Any:
    optimizer = _rewritten_optimizer(model)
    if optimizer is None:
        return type(model).make_test_function(model, force)
    if model.test_function is not None and not force:
        return model.test_function
    model.test_function = _rewritten_train_function(
        model, optimizer.rewrite_options, step_function=model.test_step,
        name="one_test_step_on_data", description=f"Keras test step of model {model.name!r}",
    )
    return model.test_function


def _make_predict_function(model: Any, force: bool = False) -> Any:
    optimizer = _rewritten_optimizer(model)
    if optimizer is None:
        return type(model).make_predict_function(model, force)
    if model.predict_function is not None and not force:
        return model.predict_function
    model.predict_function = _rewritten_predict_function(model, optimizer.rewrite_options)
    return model.predict_function


#: Per traced function graph (weakly held): the optimizers (weakly held) whose ``scale_loss`` ran
#: in it, or in a function graph inside it (a loss computed in a nested function).
_scaled_graphs: "weakref.WeakKeyDictionary[Any, weakref.WeakSet[Any]]" = weakref.WeakKeyDictionary()


def _function_graphs(graph: Any) -> Iterator[Any]:
    """``graph`` and the graphs around it, while they are function graphs being traced (not
    the process's global graph, which an eager call would name)."""
    while graph is not None and getattr(graph, "building_function", False):
        yield graph
        graph = getattr(graph, "outer_graph", None)


def _note_scaled_in(optimizer: Any, graph: Any) -> None:
    """Record that ``optimizer`` scaled a loss in ``graph`` and the function graphs around it
    (nothing eagerly)."""
    for traced in _function_graphs(graph):
        _scaled_graphs.setdefault(traced, weakref.WeakSet()).add(optimizer)


def _scaled_in(optimizer: Any, graph: Any) -> bool:
    """Whether ``optimizer`` scaled a loss in ``graph`` or a function graph around it."""
    return any(optimizer in _scaled_graphs.get(traced, ()) for traced in _function_graphs(graph))


def _layers_of(model: Any) -> list[Any]:
    """``model`` and every layer under it (nested models' layers included).  Pure."""
    flatten = getattr(model, "_flatten_layers", None)
    if flatten is not None:
        return list(flatten(include_self=True, recursive=True))
    # A Keras without the private walk: the public ``layers`` of each model, recursively.
    out, todo = [], [model]
    while todo:
        layer = todo.pop()
        if any(layer is seen for seen in out):
            continue
        out.append(layer)
        todo.extend(getattr(layer, "layers", None) or ())
    return out


#: Stands for "no instance attribute" when one is restored.
_ABSENT = object()
#: id(layer) -> [layer, its own ``_open_name_scope`` before (or _ABSENT), how many recordings
#: need the wrapper]: one wrapper per layer, however many threads trace the model at once.
_installed: dict[int, list[Any]] = {}
_INSTALL_LOCK = threading.Lock()


def _wrap_scope_of(layer: Any) -> None:
    """Wrap ``layer``'s ``_open_name_scope`` so that each scope it opens in a traced graph is
    noted for that graph (:func:`.tf_function.note_layer_scopes`), or count one more user of
    the wrapper already there.  Under :data:`_INSTALL_LOCK`; mutates the layer instance."""
    entry = _installed.get(id(layer))
    if entry is not None:
        entry[2] += 1
        return
    original = getattr(layer, "_open_name_scope", None)
    if not callable(original):
        return

    @contextlib.contextmanager
    def open_name_scope() -> Iterator[Any]:
        with original() as scope:
            # Eager calls meanwhile (another thread) have no graph scope worth keeping.
            if not tf.executing_eagerly():
                note_layer_scopes(tf.compat.v1.get_default_graph(), {tf.get_current_name_scope(): layer.name})
            yield scope

    _installed[id(layer)] = [layer, layer.__dict__.get("_open_name_scope", _ABSENT), 1]
    # object.__setattr__: Keras's own __setattr__ would track the function as state.
    object.__setattr__(layer, "_open_name_scope", open_name_scope)


def _unwrap_scope_of(layer: Any) -> None:
    """One user fewer of ``layer``'s wrapper; the last one restores what was there.  Under
    :data:`_INSTALL_LOCK`; mutates the layer instance."""
    entry = _installed.get(id(layer))
    if entry is None:
        return
    entry[2] -= 1
    if entry[2]:
        return
    del _installed[id(layer)]
    if entry[1] is _ABSENT:
        object.__delattr__(layer, "_open_name_scope")
    else:
        object.__setattr__(layer, "_open_name_scope", entry[1])


@contextlib.contextmanager
def _recorded_layer_scopes(model: Any) -> Iterator[None]:
    """Record, while a step of ``model`` is traced in this block, the name scope each of its
    layers opens in the graph, for that graph's rewrite (:func:`.tf_function.note_layer_scopes`),
    so that ``exclude="dense_1"`` takes the layer ``dense_1``.  To be entered inside the traced
    function.

    Why record rather than derive: Keras 3 opens a layer's scope twice per call (to build it,
    then to call it), and TensorFlow makes each opening unique in the graph, so the layers
    ``dense``, ``dense_1`` of a train step put their ops under ``dense_1`` and ``dense_1_2``;
    what suffix a layer gets depends on every scope opened before it (a layer called twice, a
    model called in a custom ``train_step``).  The scope TensorFlow chose is read as each layer
    opens it (``tf.get_current_name_scope()`` inside ``Layer._open_name_scope``, wrapped on the
    layer instances while any such block is open) and noted for the graph it is opened in, so
    the replicas of a distribution strategy, and two threads tracing the same model, each note
    their own graph's.  Mutates the layers only for that long (the last block to leave removes
    the wrappers, exception or not); a Keras whose layers do not open their scopes that way
    records nothing, and the rewrite falls back on its rules for names.
    """
    layers = _layers_of(model)
    with _INSTALL_LOCK:
        for layer in layers:
            _wrap_scope_of(layer)
    try:
        yield
    finally:
        with _INSTALL_LOCK:
            for layer in reversed(layers):
                _unwrap_scope_of(layer)


def _without_optionals(data: Any) -> Any:
    """Keras's ``_autoconvert_optionals``: a missing element (an empty Optional) becomes None."""
    return tf.nest.map_structure(
        lambda x: None if isinstance(x, tf.experimental.Optional) else x, data
    )


def _rewritten_predict_function(model: Any, options: Mapping[str, Any]) -> Any:
    """Keras's TensorFlow predict function, with amp_rewrite.function in place of tf.function.

    Mirrors ``TensorFlowTrainer.make_predict_function`` (Keras 3.15): called with a list of
    ``steps_per_execution`` batches, it runs ``predict_step`` on each through the distribution
    strategy and concatenates the outputs.  Each batch runs the rewritten step (one trace per
    batch shape, relaxed as ``reduce_retracing`` does); the concatenation stays in Python, as
    Keras's own runs outside its per-step function.  ``jit_compile`` as Keras resolved it.
    """
    from keras.src import tree
    from keras.src.backend.tensorflow.trainer import concat, reduce_per_replica

    def one_predict_step_on_data(data: Any) -> Any:
        with _recorded_layer_scopes(model):  # for exclude= a layer name
            outputs = model.distribute_strategy.run(model.predict_step, args=(data,))
        return reduce_per_replica(outputs, model.distribute_strategy, reduction="concat")

    one_step = Function(one_predict_step_on_data, autograph=False, reduce_retracing=True,
                        jit_compile=bool(model.jit_compile), rewrite_options=options,
                        description=f"Keras predict step of model {model.name!r}")

    def function(data: Any) -> Any:
        outputs = None
        for batch in data:
            step_outputs = one_step(_without_optionals(batch))
            outputs = step_outputs if outputs is None else tree.map_structure(
                lambda t1, t2: concat([t1, t2]), outputs, step_outputs)
        return outputs

    function.amp_function = one_step  # type: ignore[attr-defined]
    return function


def _rewritten_train_function(model: Any, options: Mapping[str, Any], *, step_function: Any = None,
                              name: str = "one_step_on_data", description: str | None = None) -> Any:
    """Keras's TensorFlow train function, with amp_rewrite.function in place of tf.function.

    Mirrors ``keras.src.backend.tensorflow.trainer.TensorFlowTrainer._make_function`` (Keras
    3.15), which builds the test function too: ``step_function`` is ``model.train_step``
    (default) or ``model.test_step``, ``name`` names the rewritten runner (and XLA's module)
    and ``description`` the log lines.  ``steps_per_execution`` steps run as a Python loop
    over the rewritten step.

    XLA as Keras decides it: ``model.jit_compile`` is the value ``model.compile`` resolved
    (Keras's own ``_resolve_auto_jit_compile`` for ``"auto"``: XLA when a non-CPU device is
    present, no distribution strategy is set and every layer supports it; its setter turns an
    unsupported ``True`` into ``False``).  When it is true the rewritten step is compiled with
    XLA (:class:`~amp_rewrite.training.tf_function.Function` with ``jit_compile=True``, which
    falls back, with one WARNING, where XLA cannot compile the rewritten graph).  The test
    and predict functions (:func:`_make_test_function`, :func:`_make_predict_function`) do
    the same.
    """
    # Keras's reduce_per_replica, except under MultiWorkerMirroredStrategy, where Keras's
    # cannot reduce a scalar loss (see _keras_multiworker).
    from ._keras_multiworker import reduce_per_replica

    if step_function is None:
        step_function = model.train_step
    if description is None:
        description = f"Keras train step of model {model.name!r}"
    # The resolved value (a bool); the property resolves a model compiled before Keras
    # resolved "auto" eagerly, exactly as Keras's own train function would.
    jit_compile = bool(model.jit_compile)
    log.debug("amp_rewrite: %s: jit_compile=%s", description, jit_compile)

    def one_step_on_data(data: Any) -> Any:
        with _recorded_layer_scopes(model):  # for exclude= a layer name
            outputs = model.distribute_strategy.run(step_function, args=(data,))
        return reduce_per_replica(outputs, model.distribute_strategy, reduction="auto")

    # The name names the runner's FunctionDef and XLA's HLO module (amp_rewrite_<name>).
    one_step_on_data.__name__ = one_step_on_data.__qualname__ = name
    one_step = Function(one_step_on_data, autograph=False, reduce_retracing=True,
                        jit_compile=jit_compile, rewrite_options=options, description=description)

    def run_step(data: Any) -> Any:
        return one_step(_without_optionals(data))

    def function(iterator: Any) -> Any:
        outputs = None
        if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            for _ in range(model.steps_per_execution):
                optional = iterator.get_next_as_optional()
                if not optional.has_value():
                    break
                outputs = run_step(optional.get_value())
            if outputs is None:
                raise StopIteration
            return outputs
        for _, data in zip(range(model.steps_per_execution), iterator):
            outputs = run_step(data)
        return outputs

    # For inspection: what was rewritten and what ran (tests check the executed dtypes).
    function.amp_function = one_step  # type: ignore[attr-defined]
    return function
