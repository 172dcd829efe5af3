"""Small pieces shared by the training modules: option checking and the "being rewritten" flag.

Nothing here imports TensorFlow at module level.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

from ..errors import AmpRewriteError

if TYPE_CHECKING:
    from .loss_scale import LossScale

__all__ = [
    "DEFAULT_TARGET",
    "LossScaleSettings",
    "TracedOptimizers",
    "TRAINING_OPTIONS",
    "check_rewrite_options",
    "without_training_options",
    "rewrite_precision",
    "multi_worker",
    "rewrite_trace",
    "in_rewrite_trace",
    "unscaled",
    "in_unscaled_trace",
    "VariableCreatedError",
    "note_rewrite_options",
    "warn_if_float16_without_loss_scaling",
    "warn_once",
    "building_unrewritten_function",
    "report_rewrite",
    "add_rewrite_listener",
    "mark_graph_rewritten",
    "graph_is_rewritten",
    "set_tf1_sessions_rewritten",
]

log = logging.getLogger(__name__)

#: The training API rewrites for this machine unless told otherwise.  On a machine without a
#: suitable GPU or CPU this leaves the graph unchanged (with one INFO line saying why).
DEFAULT_TARGET = "auto"

# Options that the training API computes itself and so may not be passed through.
_RESERVED = {"graph_def", "declined", "price_step"}
#: Options of the training API's own, beside :func:`amp_rewrite.rewrite_graph_def`'s:
#: ``measure_steps`` (:mod:`.step_choice`), which only ``tf.function`` steps (Keras's
#: included) carry out.
TRAINING_OPTIONS = ("measure_steps",)

class LossScaleSettings:
    """The read-only settings both loss-scaled optimizers (Keras 3 and TF1) expose, and whether
    they scale the loss of the step being traced.

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

    @property
    def scales_loss(self) -> bool:
        """Whether this optimizer scales the loss of the steps it trains: ``False`` for the
        default ``loss_scale="auto"`` where the rewrite runs bfloat16
        (:func:`amp_rewrite.training.loss_scale.applies`), which does not need it; else ``True``.
        Under a multi-worker strategy with a machine-dependent precision (``target`` and
        ``precision`` left ``"auto"``) it stays ``True``: workers on different machines could
        choose differently, and every worker must run the same collectives (the overflow
        flags are reduced across them).  Reads TensorFlow's device list once, at first use."""
        from .loss_scale import AutoLossScale, applies

        if not isinstance(self._amp_loss_scale, AutoLossScale):
            return True
        # In __dict__ directly: Keras's attribute tracking has no business with it.
        precision = self.__dict__.get("_amp_precision")
        if precision is None:
            precision = self.__dict__["_amp_precision"] = rewrite_precision(self._amp_rewrite_options)
        if applies(self._amp_loss_scale, precision):
            return True
        return _precision_per_machine(self._amp_rewrite_options) and _multi_worker_strategy()

    def _loss_scaling_off(self) -> bool:
        """Whether the step being traced leaves the loss unscaled: it is traced again without
        loss scaling (:func:`unscaled`), or this optimizer does not scale (:attr:`scales_loss`,
        decided in the trace: a strategy's scope is part of it).  Remembers the latter for
        :meth:`_scaled_its_steps`."""
        if in_unscaled_trace():
            return True
        scales = self.__dict__["_amp_scaled_steps"] = self.scales_loss
        return not scales

    def _scaled_its_steps(self) -> bool:
        """Whether the steps traced so far scale the loss (:attr:`scales_loss` before any):
        what ``current_loss_scale`` reports, read outside the strategy scope a trace had."""
        scaled = self.__dict__.get("_amp_scaled_steps")
        return self.scales_loss if scaled is None else scaled


def rewrite_precision(options: Mapping[str, Any]) -> str:
    """The low-precision type :func:`amp_rewrite.rewrite_graph_def` uses with the rewrite
    ``options`` (``precision`` as given, or, left ``"auto"``, the one its ``target`` calls for).
    Reads TensorFlow's device list where the target is ``"auto"``."""
    from ..api import resolve_target
    from ..plan.targets import resolve_precision

    target = resolve_target(options.get("target", DEFAULT_TARGET))
    return resolve_precision(options.get("precision", "auto"), target)[0]


def _precision_per_machine(options: Mapping[str, Any]) -> bool:
    """Whether ``options`` leave the precision to the machine: ``target`` and ``precision``
    both ``"auto"``.  Pure."""
    def is_auto(value: Any) -> bool:
        return isinstance(value, str) and value.strip().lower() == "auto"

    return is_auto(options.get("target", DEFAULT_TARGET)) and is_auto(options.get("precision", "auto"))


def _multi_worker_strategy() -> bool:
    """Whether the current ``tf.distribute`` strategy spans workers (:func:`multi_worker`)."""
    import tensorflow as tf

    return tf.distribute.has_strategy() and multi_worker(tf.distribute.get_strategy())


def multi_worker(strategy: Any) -> bool:
    """Whether ``strategy`` is a ``MultiWorkerMirroredStrategy`` in multi-worker mode (one
    worker alone reduces nothing across machines).  Reads the strategy."""
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return False
    in_multi_worker_mode = getattr(strategy.extended, "_in_multi_worker_mode", None)
    return bool(in_multi_worker_mode()) if callable(in_multi_worker_mode) else True


class TracedOptimizers:
    """What the loss-scaled optimizers traced into one :func:`rewrite_trace` noted
    (:func:`note_rewrite_options`): their rewrite options, each once, whether any of them
    scaled the loss, and, for those that did, how to read their count of skipped updates."""

    def __init__(self) -> None:
        self.options: list[dict[str, Any]] = []
        self.scaled = False
        self.skip_counters: list[Callable[[], int]] = []

    def skipped_updates(self) -> int:
        """The skipped updates of every loss-scaled optimizer of the step, summed (read
        eagerly: a host sync on a GPU)."""
        return sum(count() for count in self.skip_counters)

    def __bool__(self) -> bool:
        return bool(self.options)


_trace_lock = threading.Lock()
_trace_depth = 0
# One record per active rewrite_trace(): the rewrite options of the loss-scaled optimizers that
# were traced into it (so a step decorated without options uses its optimizer's), and whether
# one of them scaled the loss.
_collectors: list[TracedOptimizers] = []
# owner -> keys already warned about; weak, so a new object reusing an id is warned again.
_warned: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()
# Callbacks told of every training rewrite (the launcher prints one line per function).
_listeners: list[Callable[[str, Mapping[str, Any]], None]] = []
# TF1 graphs that something will run rewritten (an amp_rewrite.Session or session creator was
# built for them, or rewrite_graph was called): their optimizers need not warn.
_rewritten_graphs: "weakref.WeakSet[Any]" = weakref.WeakSet()
# Set by the launcher, which replaces tf.compat.v1.Session: every TF1 graph runs rewritten.
_tf1_sessions_rewritten = False


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
    unknown = sorted(set(options) - allowed - set(TRAINING_OPTIONS))
    if unknown:
        raise AmpRewriteError(
            f"unknown rewrite option(s) {', '.join(unknown)}; rewrite_graph_def takes "
            f"{', '.join(sorted(allowed))}, and training steps also {', '.join(TRAINING_OPTIONS)}"
        )
    steps = options.get("measure_steps", 0)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise AmpRewriteError(f"measure_steps must be a whole number of steps (0: trust the estimate), not {steps!r}")
    out = dict(options)
    out.setdefault("target", DEFAULT_TARGET)
    return out


def without_training_options(options: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``options`` without :data:`TRAINING_OPTIONS`, for a path that rewrites a graph once and
    cannot carry them out (``where`` names it: a TF1 session's graph, a meta graph offline);
    logs one WARNING where one was asked for.  Pure but for the log."""
    if options.get("measure_steps"):
        log.warning("amp_rewrite: measure_steps=%s applies to tf.function and Keras steps; %s runs the "
                    "planned rewrite without measuring", options["measure_steps"], where)
    return {k: v for k, v in options.items() if k not in TRAINING_OPTIONS}


@contextlib.contextmanager
def rewrite_trace() -> Iterator[TracedOptimizers]:
    """Mark that amp_rewrite is tracing a function whose graph it will rewrite.

    Yields a :class:`TracedOptimizers` that collects what the loss-scaled optimizers traced
    meanwhile note (:func:`note_rewrite_options`).

    Process-wide rather than thread-local on purpose: MirroredStrategy traces each replica in a
    thread of its own, and those replicas belong to the same rewritten trace.  The flag only
    decides whether a warning is logged, so the rare false negative under concurrent tracing
    in unrelated threads is harmless.
    """
    global _trace_depth
    seen = TracedOptimizers()
    with _trace_lock:
        _trace_depth += 1
        _collectors.append(seen)
    try:
        yield seen
    finally:
        with _trace_lock:
            _trace_depth -= 1
            # By identity: a nested or concurrent trace has a record of its own.
            for i, other in enumerate(_collectors):
                if other is seen:
                    del _collectors[i]
                    break


def note_rewrite_options(options: Mapping[str, Any], *, scaled: bool,
                         skipped: Callable[[], int] | None = None) -> None:
    """Record, for every active :func:`rewrite_trace`, the options of an optimizer traced in it,
    whether it ``scaled`` the loss there, and ``skipped``, a reader of its count of skipped
    updates (``measure_steps`` does not time a step that skipped its update)."""
    with _trace_lock:
        for seen in _collectors:
            if dict(options) not in seen.options:
                seen.options.append(dict(options))
            seen.scaled = seen.scaled or scaled
            if scaled and skipped is not None and skipped not in seen.skip_counters:
                seen.skip_counters.append(skipped)


def in_rewrite_trace() -> bool:
    """Whether some :func:`rewrite_trace` is active."""
    return _trace_depth > 0


# FuncGraphs traced by unscaled() (weak: a graph goes when its function does).
_unscaled_graphs: "weakref.WeakSet[Any]" = weakref.WeakSet()


class VariableCreatedError(AmpRewriteError):
    """A step traced again by :func:`unscaled` tried to create a variable: tracing it again
    would train a second copy, so the step keeps the trace it had."""


def _refuse_variable(next_creator: Any, **kwargs: Any) -> Any:
    raise VariableCreatedError(f"the step creates variable {kwargs.get('name')!r} each time it is traced")


def unscaled(python_function: Callable[..., Any]) -> Callable[..., Any]:
    """``python_function`` for tracing a step again without loss scaling, because its rewrite
    converted nothing: the graph each call is traced into is marked, and the loss-scaled
    optimizers traced into it (or into a graph nested in it: a ``tf.cond`` branch, a replica
    of ``MirroredStrategy``, which traces in the same graph from threads of its own) neither
    scale the loss nor unscale, check or skip an update (:func:`in_unscaled_trace`).  Loss
    scaling keeps small float16 gradients from flushing to zero; a step that runs float32
    whole only pays for it (a scan of every gradient for overflow, and a conditional around
    the update, which XLA runs as a host round trip on a GPU; see :func:`compiled_for_gpu`).

    The mark is per graph, not per process: another step traced meanwhile, in another thread,
    keeps its loss scaling.  A variable created by the call raises
    :class:`VariableCreatedError` (the step must be traced once only)."""

    @functools.wraps(python_function)
    def traced_unscaled(*args: Any, **kwargs: Any) -> Any:
        import tensorflow as tf

        _unscaled_graphs.add(tf.compat.v1.get_default_graph())
        with tf.variable_creator_scope(_refuse_variable):
            return python_function(*args, **kwargs)

    return traced_unscaled


def in_unscaled_trace() -> bool:
    """Whether the graph being built is (or is nested in) one that :func:`unscaled` traces.
    Eagerly, never."""
    import tensorflow as tf

    if tf.executing_eagerly():
        return False
    graph: Any = tf.compat.v1.get_default_graph()
    while graph is not None:
        if graph in _unscaled_graphs:
            return True
        graph = getattr(graph, "outer_graph", None)
    return False


def compiled_for_gpu() -> bool:
    """Whether the graph being traced is compiled by XLA (``jit_compile=True``) on a machine
    with a GPU, where the step runs there.  Reads TensorFlow's device list; pure otherwise.

    The loss-scaled optimizers then give the skip-on-overflow ``tf.cond`` work in both
    branches: XLA's conditional simplifier turns a two-branch conditional of element-wise
    branches into selects except when a branch is empty, and a conditional that stays one runs
    on a GPU as a host round trip (the predicate is copied back, the stream waits) before every
    update is launched (issue 22, bench/gpu_runs/2026-11-26-h200).  On a CPU the empty branch
    stays, where selects cost more (150-layer MLP under XLA: 17.8 against 14.1 ms per step).
    """
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    if not control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        return False
    return bool(tf.config.list_logical_devices("GPU"))


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


def warn_if_float16_without_loss_scaling(owner: object, label: str, report: Mapping[str, Any], graph_def: Any,
                                         hint: str, variable_names: Iterable[str] = ()) -> bool:
    """Log one WARNING per ``owner`` where ``graph_def`` (a rewritten step, or the graph a
    rewrite was made from) trains -- it updates variables from gradients -- in float16
    (``report`` converted something to it) and nothing in it scales the loss (nor among
    ``variable_names``, the variables a traced step captured); ``hint`` says what to do
    instead.  Returns whether it warned (or had warned before).  Pure but for the log."""
    from ..graph.training_ops import float16_training_unscaled

    if not float16_training_unscaled(report, graph_def, variable_names):
        return False
    warn_once(owner, "float16-without-loss-scaling", (
        f"amp_rewrite: {label} trains in float16 without loss scaling: gradients smaller than float16's "
        f"smallest value (6e-8) become 0, and the weights they belong to stop learning; {hint}"))
    return True


def add_rewrite_listener(listener: Callable[[str, Mapping[str, Any]], None]) -> Callable[[], None]:
    """Call ``listener(message, report)`` with each summary line of :func:`report_rewrite`
    (once per function and outcome) and its report.  Returns a function that
    removes it.  Process-wide: meant for a launcher that owns the process.  While any listener
    is registered the listeners *replace* the INFO/WARNING line (it is logged at DEBUG), so
    the launcher's own line is not printed twice."""
    _listeners.append(listener)

    def remove() -> None:
        if listener in _listeners:
            _listeners.remove(listener)

    return remove


def _hoisted_clause(report: Mapping[str, Any]) -> str:
    """", N of them hoisted out of loop bodies" where the rewrite hoisted Casts, else ""."""
    hoisted = len(report.get("hoisted_casts", ()))
    return f", {hoisted} of them hoisted out of loop bodies" if hoisted else ""


def report_rewrite(owner: object, label: str, report: Mapping[str, Any], seconds: float, *,
                   unscaled: bool = False, scale_not_needed: bool = False) -> str:
    """Log the outcome of rewriting one training function; returns the summary line.

    ``label`` names the function ("Keras train step of model 'm'"), ``report`` is its
    :func:`~amp_rewrite.rewrite_graph_def` report and ``seconds`` how long the rewrite took;
    ``unscaled``: the step, which converted nothing, runs without loss scaling
    (:func:`unscaled`); ``scale_not_needed``: its optimizer left the loss unscaled because the
    rewrite runs bfloat16 (:attr:`LossScaleSettings.scales_loss`).
    A function that converted something gets one INFO line; one that converted nothing (or was
    skipped) gets one WARNING with the report's reason, because a training run that silently
    stays float32 is the failure users of TensorFlow's rewrite could not see.  Each kind is
    logged once per ``owner`` (later traces of the same function log at DEBUG).  Listeners
    (:func:`add_rewrite_listener`) hear of each line logged once, and take it over from the log.
    """
    precision = report.get("precision", "?")
    reason = report.get("skipped")
    if reason is None and not report.get("converted_nodes"):
        reason = "no op was converted"
    if reason is None:
        message = (
            f"amp_rewrite: {label}: converted {report['converted_nodes']} of "
            f"{report['total_nodes']} ops to {precision}, {report['casts_to_low']} cast(s) to "
            f"{precision} and {report['casts_to_high']} to float32{_hoisted_clause(report)} "
            f"(target {report.get('target')}; "
            f"rewritten in {seconds:.2f} s)"
            f"{'; no loss scaling: bfloat16 has the range of float32' if scale_not_needed else ''}"
        )
        key, level = "rewrite-info", logging.INFO
    else:
        message = (
            f"amp_rewrite: {label} was not rewritten and runs in float32"
            f"{' without loss scaling' if unscaled else ''}: {reason} (target "
            f"{report.get('target')}, precision {precision})"
        )
        key, level = "rewrite-noop", logging.WARNING
    try:
        keys = _warned.setdefault(owner, set())
    except TypeError:  # not weak-referenceable: log every time rather than never
        keys = set()
    listeners = list(_listeners)
    first = key not in keys
    keys.add(key)
    if first and not listeners:
        log.log(level, message)
    else:
        log.debug(message)
    if first:
        for listener in listeners:
            listener(message, report)
    return message


def mark_graph_rewritten(graph: Any) -> None:
    """Record that ``graph`` (a TF1 ``tf.Graph``) is run rewritten, so its optimizers do not
    warn that it is not."""
    _rewritten_graphs.add(graph)


def graph_is_rewritten(graph: Any) -> bool:
    """Whether :func:`mark_graph_rewritten` was called for ``graph``, or the launcher rewrites
    every TF1 session."""
    return _tf1_sessions_rewritten or graph in _rewritten_graphs


def set_tf1_sessions_rewritten(value: bool) -> None:
    """The launcher's switch: ``tf.compat.v1.Session`` is amp_rewrite's in this process."""
    global _tf1_sessions_rewritten
    _tf1_sessions_rewritten = bool(value)


def building_unrewritten_function() -> bool:
    """True while TensorFlow traces a ``tf.function`` that amp_rewrite did not ask for.

    Used by the loss-scaled optimizers to warn that their step will not be rewritten (the
    silent no-op users of TensorFlow's API complained about).  A TF1 ``tf.Graph`` is not a
    function: it is rewritten later by :class:`amp_rewrite.Session`.
    """
    import tensorflow as tf

    graph = tf.compat.v1.get_default_graph()
    return bool(getattr(graph, "building_function", False)) and not in_rewrite_trace()
