"""``enable_mixed_precision_graph_rewrite``: loss-scaled optimizers, scoped to what they train.

A drop-in for ``tf.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite(opt)``
without its faults (user_issues.md, Themes 1 and 7):

* **No process-global switch.**  TensorFlow's version turns Grappler's pass on for every graph
  and session in the process (tensorflow/tensorflow#33435).  Here the rewrite happens only
  where this optimizer trains: a Keras model compiled with it, a step decorated with
  :func:`amp_rewrite.function`, or a TF1 graph run through :class:`amp_rewrite.Session`.
  Nothing else in the process changes, and :func:`disable_mixed_precision_graph_rewrite`
  has nothing to undo.
* **Transparent wrapper.**  Attribute access falls through to the inner optimizer
  (:mod:`.forwarding`); slots and variables are the inner optimizer's; checkpoints contain
  both.
* **Two families accepted:** ``tf.compat.v1.train.Optimizer`` subclasses (any, not only the
  built-in ones) and Keras 3 optimizers.  Anything else is a ``TypeError`` naming both.
* **Replica-consistent skipping** under ``tf.distribute`` (see :mod:`.keras_optimizer` and
  :meth:`LossScaleOptimizerV1.apply_gradients`).
* **Gradients computed outside the optimizer** (``tf.gradients(loss, vars)`` then
  ``opt.apply_gradients``, tensorflow/tensorflow#35379): TensorFlow's wrapper applies them
  silently without loss scaling.  Here the graph is still rewritten with the options given to
  ``enable_...``; ``get_scaled_loss``/``get_unscaled_gradients`` (Keras's names) scale such a
  step; and ``apply_gradients`` says, with one WARNING, when its gradients come from a loss it
  did not scale, and refuses gradients of the scaled loss that were never unscaled
  (:class:`ScaledGradientsError`).
"""

from __future__ import annotations

import logging
import sys
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import tensorflow as tf

from ..errors import AmpRewriteError
from . import loss_scale as loss_scale_module
from ._common import (
    LossScaleSettings,
    building_unrewritten_function,
    compiled_for_gpu,
    check_rewrite_options,
    graph_is_rewritten,
    in_unscaled_trace,
    note_rewrite_options,
    warn_once,
)
from .forwarding import forwarded_attribute

__all__ = [
    "enable_mixed_precision_graph_rewrite",
    "disable_mixed_precision_graph_rewrite",
    "LossScaleOptimizerV1",
    "ScaledGradientsError",
    "graph_rewrite_options",
]

log = logging.getLogger(__name__)

# tf.Graph -> rewrite options of the loss-scaled optimizer that built a train op in it, so
# amp_rewrite.Session(graph) rewrites with the options given to enable_...(); weak, so a graph
# that is garbage collected leaves nothing behind.
_graph_options: "weakref.WeakKeyDictionary[Any, dict[str, Any]]" = weakref.WeakKeyDictionary()


# tf.Graph (FuncGraphs too) -> {tensor name: kind} for the tensors a loss-scaled optimizer made
# that a gradient handed to apply_gradients may derive from: "unscaled" (a gradient divided by
# the loss scale: compute_gradients, get_unscaled_gradients) and "scaled_loss" (a loss times
# the scale, and the read of the scale it was multiplied by).  apply_gradients walks a
# gradient's inputs back to them (_gradient_origin), so gradients clipped or averaged after
# compute_gradients still count as the optimizer's; the rewrite keeps them float32
# (their ops are under loss_scale.SCOPE).  Weak, as _graph_options.
_UNSCALED, _SCALED_LOSS = "unscaled", "scaled_loss"
_marks: "weakref.WeakKeyDictionary[Any, dict[str, str]]" = weakref.WeakKeyDictionary()


class ScaledGradientsError(AmpRewriteError):
    """``apply_gradients`` received gradients of ``get_scaled_loss(loss)`` that were never
    divided by the loss scale: applied, every update would be the loss scale (2**15 by
    default) times too large."""


def _mark(value: Any, kind: str) -> None:
    """Record ``value`` (a tensor or ``IndexedSlices`` being built in a graph) as a tensor of
    ``kind`` for :func:`_gradient_origin`.  ``None`` and eager values are ignored: eagerly
    there is no graph to trace a gradient back through.  Mutates the module's marks."""
    if isinstance(value, tf.IndexedSlices):
        value = value.values
    if value is None or not tf.is_symbolic_tensor(value):
        return
    _marks.setdefault(value.graph, {})[value.name] = kind


def _captured(graph: Any, name: str) -> Any:
    """The outer value a ``tf.function`` (or ``tf.cond`` branch) graph captured as its
    placeholder ``name``, or ``None`` where the placeholder is not a capture.  Pure."""
    for external, internal in getattr(graph, "captures", ()):
        if getattr(internal, "name", None) == name:
            return external
    return None


def _gradient_origin(grad: Any, scale_variables: list[Any]) -> str:
    """Where ``grad`` (not ``None``), a gradient handed to ``apply_gradients`` in a graph,
    comes from.

    Walks the data inputs of ``grad`` back (through ``tf.function`` captures, around loops)
    and stops at the tensors :func:`_mark` recorded.  Returns

    * ``"user"``: a path reads one of ``scale_variables`` other than through
      ``get_scaled_loss``: the caller scales or unscales by hand (``loss *
      opt.current_loss_scale``), so the gradient is taken as it is;
    * ``"scaled"``: it derives from ``get_scaled_loss`` but not through an unscaled gradient:
      still multiplied by the scale;
    * ``"unscaled"``: it derives from the optimizer's unscaled gradients only (clipped,
      averaged... as the caller likes);
    * ``"none"``: from none of them: the gradient of a loss that nobody scaled (eager or
      Python values too, which have no inputs to follow).

    Pure.  Costs one visit per op upstream of ``grad`` down to the marks: a few ops for the
    optimizer's own gradients, the whole forward and backward graph (once) for a
    ``tf.gradients`` of the bare loss.
    """
    start = grad.values if isinstance(grad, tf.IndexedSlices) else grad
    # A resource variable's handle: a VarHandleOp's output in a graph, an eager tensor (which
    # a function captures) where the variable was made eagerly.
    handles = [v.handle for v in scale_variables]
    graph_variables = {(h.graph, h.op.name) for h in handles if tf.is_symbolic_tensor(h)}
    eager_handles = [h for h in handles if not tf.is_symbolic_tensor(h)]
    found: set[str] = set()
    seen: set[tuple[int, str]] = set()
    stack = [start]
    while stack:
        tensor = stack.pop()
        if not tf.is_symbolic_tensor(tensor):
            if any(tensor is handle for handle in eager_handles):
                found.add("user")
            continue
        graph, name = tensor.graph, tensor.name
        if (id(graph), name) in seen:
            continue
        seen.add((id(graph), name))
        kind = _marks.get(graph, {}).get(name)
        if kind is not None:
            found.add(kind)
            continue  # what made a marked tensor is the optimizer's business
        op = tensor.op
        if (graph, op.name) in graph_variables:
            found.add("user")
            continue
        if op.type == "Placeholder":
            outer = _captured(graph, name)
            if outer is not None:
                stack.append(outer)
            continue
        stack.extend(op.inputs)
    for origin in ("user", _SCALED_LOSS, _UNSCALED):
        if origin in found:
            return "scaled" if origin == _SCALED_LOSS else origin
    return "none"


def graph_rewrite_options(graph: Any) -> dict[str, Any] | None:
    """The rewrite options registered for ``graph`` by a TF1 loss-scaled optimizer, if any."""
    options = _graph_options.get(graph)
    return None if options is None else dict(options)


def _is_keras_optimizer(opt: Any) -> bool:
    # Only look at Keras if it is already imported: an object cannot be a Keras optimizer
    # otherwise, and `import amp_rewrite` must not pull Keras in.
    keras = sys.modules.get("keras")
    if keras is None:
        return False
    try:
        return isinstance(opt, keras.optimizers.Optimizer)
    except AttributeError:  # pragma: no cover - a partial keras import
        return False


def _refuse_keras_mixed_policy() -> None:
    """As TensorFlow: the rewrite and a mixed Keras dtype policy would cast twice."""
    keras = sys.modules.get("keras")
    if keras is None:
        return
    try:
        policy = keras.mixed_precision.global_policy().name
    except AttributeError:  # pragma: no cover - a partial keras import
        return
    if policy.startswith("mixed_"):
        raise ValueError(
            f"the mixed precision graph rewrite cannot be enabled while the global Keras dtype "
            f"policy is {policy!r}; use one or the other (keras.mixed_precision."
            "set_global_policy('float32') to use the rewrite)"
        )


def enable_mixed_precision_graph_rewrite(
    opt: Any, loss_scale: Any = "auto", **rewrite_options: Any
) -> Any:
    """Return a loss-scaled ``opt`` whose training graphs are rewritten to mixed precision.

    Parameters
    ----------
    opt
        A ``tf.compat.v1.train.Optimizer`` (any subclass) or a Keras 3 optimizer
        (``keras.optimizers.*``).  Not modified, except that Keras's loss-scale wrapper sets the
        inner optimizer's ``loss_scale_factor`` to None (so gradients are not unscaled twice).
    loss_scale
        ``"auto"`` (the default): ``"dynamic"`` where the rewrite runs float16, no loss scaling
        where it runs bfloat16, whose range is float32's (as Keras's ``mixed_bfloat16``;
        :class:`~amp_rewrite.training.loss_scale.AutoLossScale`).  ``"dynamic"`` (TensorFlow's
        defaults: 2**15, doubled after 2000 finite steps, halved and the step skipped on
        Inf/NaN) in either precision, a number (fixed scale, never skips), or a
        :class:`~amp_rewrite.training.loss_scale.LossScale` such as
        ``DynamicLossScale(initial_loss_scale=2**10, increment_period=100)``.
    rewrite_options
        Passed to :func:`amp_rewrite.rewrite_graph_def` for every graph this optimizer trains:
        ``target`` (default ``"auto"``: this machine), ``precision``, ``lists``, ``add``...
        And ``measure_steps=N``: a Keras step (or an :func:`amp_rewrite.function` step) times
        the step as planned against the float32 step (and, with ``lists="optimal"``, the
        default lists' step) in its first calls and keeps the fastest
        (:mod:`amp_rewrite.training.step_choice`); a TF1 graph, rewritten before any step
        runs, cannot, and says so.  Left out, it is 3 where the optimal planner plans for
        this machine's GPU (``target="auto"``) and the step runs without XLA, where the cost
        model is least sure (:func:`amp_rewrite.training.tf_function.auto_measure_steps`);
        ``measure_steps=0`` trusts the estimate there.

    Returns
    -------
    A :class:`LossScaleOptimizerV1` for a TF1 optimizer, or an
    :class:`amp_rewrite.training.keras_optimizer.LossScaleOptimizer` for a Keras optimizer.

    Raises
    ------
    TypeError
        If ``opt`` is neither kind of optimizer.
    ValueError
        If ``opt`` is already loss-scaled, ``loss_scale`` is not a loss scale, or the global
        Keras dtype policy is a mixed one (the model would be cast twice).
    AmpRewriteError
        For an unknown rewrite option.
    """
    options = check_rewrite_options(rewrite_options)
    scale = loss_scale_module.get(loss_scale)
    _refuse_keras_mixed_policy()
    if isinstance(opt, LossScaleOptimizerV1):
        raise ValueError(
            "opt is already loss-scaled by enable_mixed_precision_graph_rewrite; pass the "
            "optimizer it wraps"
        )
    if isinstance(opt, tf.compat.v1.train.Optimizer):
        return LossScaleOptimizerV1(opt, scale, options)
    if _is_keras_optimizer(opt):
        import keras

        if isinstance(opt, keras.optimizers.LossScaleOptimizer):
            raise ValueError(
                "opt is already a keras.optimizers.LossScaleOptimizer; pass the optimizer it "
                "wraps (its inner_optimizer) and enable_mixed_precision_graph_rewrite adds the "
                "loss scaling"
            )
        from .keras_optimizer import LossScaleOptimizer

        return LossScaleOptimizer(opt, loss_scale=scale, rewrite_options=options)
    raise TypeError(
        "opt must be a tf.compat.v1.train.Optimizer (any subclass) or a Keras 3 optimizer "
        f"(keras.optimizers.Optimizer), got {type(opt).__module__}.{type(opt).__qualname__}"
    )


def disable_mixed_precision_graph_rewrite() -> None:
    """Counterpart of :func:`enable_mixed_precision_graph_rewrite`, kept for symmetry.

    Enabling changes no process-global state, so there is nothing to turn off: graphs that
    are not trained with a loss-scaled optimizer from this package are never rewritten, and
    optimizers already wrapped stay wrapped (as in TensorFlow).  Logs one DEBUG line.
    """
    log.debug("disable_mixed_precision_graph_rewrite: nothing global to undo")


@dataclass
class _ScaleState:
    """The loss-scale variables of one graph (or of eager execution)."""

    scale: Any
    good_steps: Any
    skipped_steps: Any


def _train_ops() -> list[Any] | None:
    """The default graph's TRAIN_OP collection as it is now (``None`` eagerly or in a function)."""
    if tf.executing_eagerly():
        return None
    graph = tf.compat.v1.get_default_graph()
    if getattr(graph, "building_function", False):
        return None
    return list(graph.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP))


def _fix_train_op_collection(train_op: Any, before: list[Any] | None) -> None:
    """Put ``train_op`` in the graph's TRAIN_OP collection in place of the inner update.

    The inner optimizer adds its own update op to TRAIN_OP, but that op lives inside the
    ``tf.cond`` branch: with control flow v2 in a branch function, so the collection would
    name an op the graph does not have (and exporting/importing the MetaGraphDef would fail);
    with v1 control flow in the graph itself, a second train op inside the wrapper's cond.
    ``before``: the collection before the inner optimizer ran
    (:func:`_train_ops`); entries added since are the inner update's and are dropped.  Mutates
    the default graph's collection; nothing to do eagerly or inside a function.
    """
    if before is None:
        return
    graph = tf.compat.v1.get_default_graph()
    ref = graph.get_collection_ref(tf.compat.v1.GraphKeys.TRAIN_OP)
    ref[:] = [op for op in ref if getattr(op, "graph", graph) is graph and any(op is b for b in before)]
    if train_op not in ref:
        ref.append(train_op)


class LossScaleOptimizerV1(LossScaleSettings, tf.compat.v1.train.Optimizer):
    """A loss-scaled ``tf.compat.v1.train.Optimizer`` (TF1 graphs and ``tf.function``).

    Build it with :func:`enable_mixed_precision_graph_rewrite`.  ``minimize`` and
    ``compute_gradients`` scale the loss and unscale the gradients; ``apply_gradients`` skips
    non-finite steps (dynamic scale) and updates the scale.  The loss-scale variables are
    created lazily, one set per graph (and one for eager execution), in ``GLOBAL_VARIABLES``, so
    ``global_variables_initializer`` and ``Saver`` include them; ``current_loss_scale`` and
    ``skipped_steps`` are those variables.  Other attributes fall through to the inner
    optimizer; ``get_slot`` and ``variables()`` are the inner optimizer's (plus the scale
    variables), while ``get_slot_names()`` is empty (see there).  ``compute_gradients``,
    ``get_scaled_loss`` and ``apply_gradients`` also record this optimizer's rewrite options on
    the graph, for :class:`amp_rewrite.Session`, however the gradients were computed.

    Gradients computed outside the optimizer (``tf.gradients``, a ``GradientTape``) are scaled
    with ``grads = opt.get_unscaled_gradients(tf.gradients(opt.get_scaled_loss(loss), vars))``
    (Keras's ``LossScaleOptimizer`` names); ``apply_gradients`` logs one WARNING for gradients
    of a loss nobody scaled, and raises :class:`ScaledGradientsError` for gradients of the
    scaled loss that were never unscaled.
    """

    def __init__(self, opt: Any, loss_scale: Any = "auto",
                 rewrite_options: Mapping[str, Any] | None = None) -> None:
        if not isinstance(opt, tf.compat.v1.train.Optimizer):
            raise TypeError(
                f"opt must be a tf.compat.v1.train.Optimizer, got {type(opt).__name__}"
            )
        super().__init__(use_locking=opt._use_locking, name=opt.get_name())
        self._optimizer = opt
        self._amp_loss_scale = loss_scale_module.get(loss_scale)
        self._amp_rewrite_options = check_rewrite_options(rewrite_options or {})
        # Weak per-graph state, so a discarded graph is not kept alive by the optimizer.
        self._states: weakref.WeakKeyDictionary[Any, _ScaleState] = weakref.WeakKeyDictionary()
        self._eager_state: _ScaleState | None = None
        self._track_trackable(opt, "base_optimizer")

    # -- forwarding -------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("_optimizer")
        if inner is None:
            raise AttributeError(name)
        return forwarded_attribute(self, inner, name)

    @property
    def inner_optimizer(self) -> Any:
        """The wrapped optimizer."""
        return self._optimizer

    def get_slot(self, var: Any, name: str) -> Any:
        return self._optimizer.get_slot(var, name)

    def get_slot_names(self) -> list[str]:
        """None of its own: the slots belong to the inner optimizer, which a checkpoint lists
        (as ``base_optimizer``).  Listing them here too would name each slot variable twice,
        and ``tf.train.Checkpoint`` refuses that.  ``get_slot`` still reaches them."""
        return []

    def variables(self) -> list[Any]:
        """The inner optimizer's variables plus this graph's loss-scale variables."""
        state = self._lookup_state(self._state_key())
        extra = [] if state is None else [state.scale, state.good_steps, state.skipped_steps]
        return self._optimizer.variables() + extra

    # -- loss-scale state, one set per graph --------------------------------------------
    @staticmethod
    def _state_key() -> Any:
        with tf.init_scope():
            return None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()

    def _lookup_state(self, key: Any) -> _ScaleState | None:
        return self._eager_state if key is None else self._states.get(key)

    def _state(self) -> _ScaleState:
        key = self._state_key()
        state = self._lookup_state(key)
        if state is None:
            # Created in the graph that uses them (tensorflow/tensorflow#37666 created them
            # in the wrong graph), outside any function or cond being traced.
            with tf.init_scope(), tf.name_scope("amp_loss_scale"):
                def var(value: Any, dtype: Any, name: str) -> Any:
                    return tf.Variable(
                        value, dtype=dtype, trainable=False, name=name,
                        synchronization=tf.VariableSynchronization.ON_WRITE,
                        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
                    )
                # 1.0 where nothing is scaled: the scale the loss is multiplied by.
                initial = self._amp_loss_scale.initial_scale if self.scales_loss else 1.0
                state = _ScaleState(
                    var(initial, tf.float32, "current_loss_scale"),
                    var(0, tf.int64, "good_steps"),
                    var(0, tf.int64, "skipped_steps"),
                )
            if key is None:
                self._eager_state = state
            else:
                self._states[key] = state
            # Checkpointed with the optimizer (object-based checkpoints; a TF1 Saver finds them
            # among the global variables anyway), and restored on creation when a checkpoint
            # was restored before the first step.
            for name, v in (("current_loss_scale", state.scale), ("good_steps", state.good_steps),
                            ("skipped_steps", state.skipped_steps)):
                self._track_trackable(v, f"loss_scale_{name}", overwrite=True)
        return state

    def _visible_state(self) -> _ScaleState:
        # The state of the current graph (or of eager execution).  Read outside any graph
        # context (e.g. for sess.run after the `with graph.as_default()` block), the one
        # graph this optimizer trained is meant, rather than new eager variables.
        state = self._lookup_state(self._state_key())
        if state is None:
            existing = list(self._states.values()) + ([self._eager_state] if self._eager_state else [])
            if len(existing) == 1:
                return existing[0]
            state = self._state()
        return state

    @property
    def current_loss_scale(self) -> Any:
        """The loss-scale variable (``sess.run`` it in a graph, ``float()`` it eagerly).  Where
        this optimizer does not scale (:attr:`scales_loss`: ``loss_scale="auto"`` in bfloat16)
        it starts at 1.0 and stays there."""
        return self._visible_state().scale

    @property
    def skipped_steps(self) -> Any:
        """The count of skipped updates (an int64 variable)."""
        return self._visible_state().skipped_steps

    def _skipped_count(self) -> int:
        """The eager state's count of skipped updates (what a ``tf.function`` step updates),
        as an int; read eagerly, outside any graph."""
        with tf.init_scope():
            return int(self._visible_state().skipped_steps.numpy())

    # -- gradients ----------------------------------------------------------------------
    def compute_gradients(self, loss: Any, var_list: Any = None, *args: Any, **kwargs: Any) -> Any:
        """Gradients of ``loss * scale``, divided by ``scale`` (TensorFlow's contract); the
        inner optimizer's own where the step is not loss-scaled: traced again because its
        rewrite converted nothing (:func:`._common.unscaled`), or rewritten to bfloat16 with
        ``loss_scale="auto"`` (:attr:`scales_loss`; the loss-scale variables are created all
        the same, so a checkpoint has the same variables whatever the machine chose)."""
        off = self._loss_scaling_off()
        self._register_graph(off)
        if off:
            if not in_unscaled_trace():
                self._state()
            return self._optimizer.compute_gradients(loss, var_list, *args, **kwargs)
        scaled_loss = self._scaled(loss)
        grads_and_vars = self._optimizer.compute_gradients(scaled_loss, var_list, *args, **kwargs)
        scale = tf.convert_to_tensor(self._state().scale)
        unscaled = [(loss_scale_module.unscale(g, scale), v) for g, v in grads_and_vars]
        for g, _ in unscaled:
            _mark(g, _UNSCALED)  # so apply_gradients knows them for its own (_gradient_origin)
        return unscaled

    def _register_graph(self, off: bool) -> None:
        """Say where this optimizer builds part of a step: the rewrite options go to the active
        :func:`amp_rewrite.function` trace (``note_rewrite_options``, ``off``: the step leaves
        the loss unscaled) or, in a TF1 graph, onto the graph for :class:`amp_rewrite.Session`
        (with the WARNING of :meth:`_warn_if_graph_not_rewritten`).  Called by every method a
        step may be built with, since a caller of ``tf.gradients`` never calls
        ``compute_gradients``.  Mutates the module's registry of graph options."""
        note_rewrite_options(self._amp_rewrite_options, scaled=not off, skipped=self._skipped_count)
        graph = tf.compat.v1.get_default_graph()
        if not tf.executing_eagerly() and not getattr(graph, "building_function", False):
            _graph_options[graph] = dict(self._amp_rewrite_options)
            self._warn_if_graph_not_rewritten(graph)

    def get_scaled_loss(self, loss: Any) -> Any:
        """``loss`` multiplied by the current loss scale, for gradients computed outside the
        optimizer: ``opt.get_unscaled_gradients(tf.gradients(opt.get_scaled_loss(loss), vars))``
        (or a ``GradientTape``) is then what ``compute_gradients`` returns.

        ``loss`` is a tensor or a callable returning one (then a callable is returned).  Where
        the step is not loss-scaled (:meth:`compute_gradients`) ``loss`` is returned as it is.
        Records the rewrite options on the graph, as ``compute_gradients`` does; mutates
        nothing else (the loss-scale variables are created on first use).
        """
        off = self._loss_scaling_off()
        self._register_graph(off)
        if off:
            if not in_unscaled_trace():
                self._state()
            return loss
        return self._scaled(loss)

    def _scaled(self, loss: Any) -> Any:
        """``loss`` (a tensor, or a callable returning one: then a callable) times the current
        scale, under :data:`.loss_scale.SCOPE` (kept float32 by the rewrite); the product and
        the scale's read are marked, so ``apply_gradients`` can tell a gradient never
        unscaled (:func:`_gradient_origin`).  Creates the loss-scale variables on first use."""
        scale = tf.convert_to_tensor(self._state().scale)
        # The gradient of `loss * scale` reads `scale` itself, not the product: marked too, so
        # that read is not mistaken for the caller's own use of current_loss_scale.
        _mark(scale, _SCALED_LOSS)

        def times_scale(value: Any) -> Any:
            with tf.name_scope(loss_scale_module.SCOPE):
                out = value * tf.cast(scale, value.dtype)
            _mark(out, _SCALED_LOSS)
            return out

        if callable(loss):
            return lambda: times_scale(loss())
        return times_scale(loss)

    def get_unscaled_gradients(self, grads: Any) -> list[Any]:
        """``grads`` (gradients of :meth:`get_scaled_loss`; ``None`` and ``IndexedSlices``
        allowed) divided by the current loss scale, as a new list; as they are where the step
        is not loss-scaled.  Pure but for the loss-scale variables, created on first use.

        The scale is read again here; in a TF1 graph the scale is only updated after the
        update op, which depends on these gradients, so both reads see the same value.
        """
        grads = list(grads)
        if self._loss_scaling_off():
            return grads
        scale = tf.convert_to_tensor(self._state().scale)
        unscaled = [loss_scale_module.unscale(g, scale) for g in grads]
        for g in unscaled:
            _mark(g, _UNSCALED)
        return unscaled

    def _warn_if_graph_not_rewritten(self, graph: Any) -> None:
        """One WARNING per optimizer, when it builds a train op in a TF1 graph that nothing
        has said it will run rewritten.

        A plain ``tf.compat.v1.Session`` runs the graph as built: float32 with loss scaling,
        silently.  Python sees no hook when such a session runs a graph, so this is said
        here, unless the graph already has an ``amp_rewrite.Session``, session creator or
        ``rewrite_graph`` call, or the launcher (``amp-rewrite run``) rewrites every session.
        """
        if graph_is_rewritten(graph):
            return
        warn_once(self, "tf1-graph", (
            f"amp_rewrite: optimizer {self.get_name()!r} built a train op in a TF1 graph, which "
            "runs rewritten only through amp_rewrite.Session(graph=...), "
            "amp_rewrite.training.MonitoredTrainingSession (or MixedPrecisionSessionCreator) or "
            "amp_rewrite.rewrite_graph(graph); a plain tf.compat.v1.Session runs it in float32 "
            f"{'(with loss scaling)' if self.scales_loss else '(without loss scaling: bfloat16 needs none)'}. "
            "`amp-rewrite run script.py` does this for an unmodified script"
        ))

    def apply_gradients(self, grads_and_vars: Any, global_step: Any = None,
                        name: str | None = None) -> Any:
        """Apply with the inner optimizer unless a gradient is not finite; update the scale.

        Must be called in a replica context.  A skipped step neither updates the variables
        nor increments ``global_step`` (as in TensorFlow).  Under ``tf.distribute`` the
        replicas' finite flags are summed in the cross-replica context before deciding.  Where
        the step is not loss-scaled (:meth:`compute_gradients`) the inner optimizer applies the
        gradients as they are.
        """
        if tf.distribute.in_cross_replica_context():
            raise ValueError("apply_gradients() must be called in a replica context.")
        off = self._loss_scaling_off()
        # Here too, not only in compute_gradients: a caller of tf.gradients never calls that,
        # and its graph would be rewritten with the default options instead of this optimizer's.
        self._register_graph(off)
        if building_unrewritten_function():
            warn_once(self, "unrewritten", (
                f"amp_rewrite: optimizer {self.get_name()!r} is being traced into a "
                "tf.function that amp_rewrite does not rewrite; decorate the training "
                "step with @amp_rewrite.function"
            ))
        grads_and_vars = tuple(grads_and_vars)
        name = name or self.get_name()
        if not off:
            self._check_gradients_scaled(g for g, _ in grads_and_vars)
        if not self._amp_loss_scale.dynamic or off:
            return self._optimizer.apply_gradients(grads_and_vars, global_step, name)
        if tf.distribute.has_strategy():
            return tf.distribute.get_replica_context().merge_call(
                self._distributed_apply, args=(grads_and_vars, global_step, name)
            )
        finite = loss_scale_module.all_finite(g for g, _ in grads_and_vars)
        return self._finish(
            finite, lambda: self._optimizer.apply_gradients(grads_and_vars, global_step,
                                                            name + "-wrapped"), name,
        )

    def _check_gradients_scaled(self, grads: Any) -> None:
        """Tell gradients of a loss this optimizer scaled from others, while a graph is built.

        Assumes the step is loss-scaled.  Gradients of the optimizer's own (from
        ``compute_gradients`` or ``get_unscaled_gradients``, possibly clipped or averaged
        since) and gradients the caller scaled by hand with ``current_loss_scale`` pass.
        Gradients of a loss nobody scaled (``tf.gradients(loss, vars)``) are applied as they
        are, which is right for their values, but float16 gradients below its range have
        already flushed to zero: one WARNING per optimizer says so and what to call instead
        (dividing them by the scale would shrink every update 2**15 times).  Eagerly there is
        no graph to follow: nothing is checked.  Mutates nothing but the warning registry.

        Raises
        ------
        ScaledGradientsError
            For a gradient of ``get_scaled_loss`` that was never unscaled.
        """
        if tf.executing_eagerly():
            return
        variables = [s.scale for s in list(self._states.values()) + [self._eager_state] if s is not None]
        origins = [_gradient_origin(g, variables) for g in grads if g is not None]
        if "scaled" in origins:
            raise ScaledGradientsError(
                f"optimizer {self.get_name()!r} was given gradients of get_scaled_loss(loss) that "
                "were not divided by the loss scale; pass them through "
                "opt.get_unscaled_gradients(grads) before apply_gradients"
            )
        if "none" in origins:
            warn_once(self, "unscaled-loss", (
                f"amp_rewrite: optimizer {self.get_name()!r} applies gradients of a loss it did not "
                "scale (computed with tf.gradients or a GradientTape on the loss itself): they are "
                "applied as they are, without loss scaling, so float16 gradients too small for "
                "float16 are lost, and current_loss_scale does not apply to them. Compute them "
                "with opt.compute_gradients(loss) (or opt.minimize), or as "
                "opt.get_unscaled_gradients(tf.gradients(opt.get_scaled_loss(loss), vars))"
            ))

    def _distributed_apply(self, distribution: Any, grads_and_vars: Any, global_step: Any,
                           name: str) -> Any:
        flags = distribution.extended.call_for_each_replica(
            lambda gv: tf.cast(loss_scale_module.all_finite(g for g, _ in gv), tf.float32),
            args=(grads_and_vars,),
        )
        n_finite = distribution.reduce(tf.distribute.ReduceOp.SUM, flags, axis=None)
        finite = tf.equal(n_finite, tf.cast(distribution.num_replicas_in_sync, n_finite.dtype))

        def apply_fn() -> Any:
            return distribution.extended.call_for_each_replica(
                self._optimizer.apply_gradients,
                args=(grads_and_vars, global_step, name + "-wrapped"),
            )

        return self._finish(finite, apply_fn, name)

    def _finish(self, finite: Any, apply_fn: Callable[[], Any], name: str) -> Any:
        state = self._state()
        before = _train_ops()
        if compiled_for_gpu():
            # Both branches do work, so XLA turns the skip into selects (see compiled_for_gpu).
            def on_finite() -> Any:
                with tf.control_dependencies([tf.group(apply_fn())]):
                    return self._assign_state(state, tf.constant(True))

            train_op = tf.group(tf.cond(finite, on_finite,
                                        lambda: self._assign_state(state, tf.constant(False))), name=name)
        else:
            maybe_apply = tf.cond(finite, lambda: tf.group(apply_fn()), tf.no_op)
            # After the update: in a TF1 graph nothing else orders the assignment after the
            # reads of the scale that unscaled this step's gradients.
            with tf.control_dependencies([maybe_apply]):
                update = self._assign_state(state, finite)
            train_op = tf.group(maybe_apply, update, name=name)
        _fix_train_op_collection(train_op, before)
        return train_op

    def _assign_state(self, state: Any, finite: Any) -> Any:
        """An op assigning the loss-scale state after a step that was ``finite`` (or not)."""
        new_scale, new_good, new_skipped = loss_scale_module.next_state(
            self._amp_loss_scale, state.scale, state.good_steps, state.skipped_steps, finite
        )
        return tf.group(
            state.scale.assign(new_scale), state.good_steps.assign(new_good),
            state.skipped_steps.assign(new_skipped),
        )

    # The update is delegated as a whole; these are never reached.
    def _apply_dense(self, grad: Any, var: Any) -> Any:  # pragma: no cover
        raise RuntimeError("This function should never be called")

    _resource_apply_dense = _apply_sparse = _resource_apply_sparse = _apply_dense



