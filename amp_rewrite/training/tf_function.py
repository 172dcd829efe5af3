"""``amp_rewrite.function``: a drop-in for ``tf.function`` whose traced graph is rewritten.

How it works, for each concrete function (one per input signature, as ``tf.function``):

1. ``tf.function`` traces the Python function as usual, gradients (``GradientTape``) and
   optimizer updates included, and creates any variables on the first call.
2. The traced graph's GraphDef (with its function library: ``tf.cond`` branches, loops) is
   rewritten by :func:`amp_rewrite.rewrite_graph_def`, preserving the outputs' dtypes.
3. A second ``tf.function`` (the *runner*) imports the rewritten GraphDef with
   ``tf.graph_util.import_graph_def``.  Each input placeholder is mapped to the runner's
   argument and each captured placeholder (variable handles, captured constants) to
   ``tf.identity`` of the captured value, so the rewritten ops read and update the model's own
   variables.  The runner's automatic control dependencies keep every stateful op (variable
   updates) and order ops on the same resource in program order.
4. Calls run the runner; its result is packed into the traced function's output structure.
5. Where the rewrite converted nothing, a loss-scaled optimizer was traced into the step and
   the step runs float32 whole (no float16 or bfloat16 op of the user's own, no collective
   that other workers must match), the Python function is traced once more, for the same
   input signature, with loss scaling off (:func:`._common.unscaled`).  If that trace creates
   no variable and its rewrite converts nothing either, it is the one run: loss scaling
   protects float16 gradients and only costs a step that runs float32 whole.
6. Where the optimal planner (``lists="optimal"``, or ``planner="optimal"``) converted
   something in a loss-scaled step that runs without XLA, the mixed step is priced whole
   (:func:`amp_rewrite.estimate_step_time`: every graph of the step, loss scaling's overflow
   scan and conditional update included) against the float32 step without loss scaling,
   traced as in 5 (the mixed step's estimate is the rewrite's own, ``price_step``, from the
   import it made; TensorFlow's shape inference of the float32 step, done to price it, serves
   its rewrite too).  The planner's own check prices one
   graph against the same graph in float32, loss scaling in both; but the alternative to a
   mixed step is the user's float32 step, which has no loss scaling.  Unless the mixed step
   is estimated faster by the whole-step checks' margin (3%; without XLA on a GPU 10%, the
   model's error on such steps: :func:`amp_rewrite.step_check.whole_step_margin`), the
   float32 step runs, with one WARNING giving both estimates.  (Without XLA on a GPU, where
   every kernel costs host time, loss scaling alone can cost more than float16 saves.)

Functions in the rewritten library are renamed (suffix ``_amp<N>``) because the originals
stay registered with the eager context under their names with their float32 bodies.

XLA (``jit_compile=True``): the runner is a ``tf.function(jit_compile=True)``, so its
FunctionDef carries ``_XlaMustCompile`` and TensorFlow compiles the rewritten graph, Casts
included, with XLA when it runs; the traced function is traced in XLA's context too (as
``tf.function`` does), so control flow is built the way XLA needs it.  Before the first
compiled call of each concrete function the runner's graph is lowered to HLO once
(``experimental_get_compiler_ir``), which runs nothing: where XLA cannot compile it (an op
without an XLA kernel, such as a ``tf.py_function`` or a string op) the function logs one
WARNING with XLA's reason and runs without XLA, with the same results.  The check needs
argument values, so it happens at the first eager call: called only from inside another
``tf.function``, a graph XLA cannot compile fails with TensorFlow's error instead.  The rewrite is
planned for compiled execution (``compiled=True``, :mod:`amp_rewrite.plan.cost_model`) unless the
rewrite options say otherwise.

Assumptions and limits: the function is not differentiated from outside (a ``GradientTape``
around a call sees no gradient); deferred captures (``capture_call_time_value``) are evaluated
at each call and passed in as arguments; non-tensor Python arguments are part of the trace
key, as in ``tf.function``; the ``experimental_*`` options of ``tf.function`` are not offered.
The renamed library functions are registered with the eager context and stay there for the
life of the process.
"""

from __future__ import annotations

import functools
import itertools
import logging
import re
import threading
import time
import weakref
from typing import Any, Callable, Mapping, Sequence

from ..errors import AmpRewriteError
from ..plan.exclude import NameMatcher, unmatched_warned_once
from ._common import (
    DEFAULT_TARGET,
    TRAINING_OPTIONS,
    check_rewrite_options,
    report_rewrite,
    rewrite_trace,
    unscaled,
    warn_if_float16_without_loss_scaling,
    warn_once,
)
from .step_choice import AUTO_MEASURE_STEPS, Candidate, MeasuredChoice
from .update_barrier import updates_after_inputs

__all__ = ["function", "Function", "rename_functions", "note_layer_scopes"]

log = logging.getLogger(__name__)

#: Per traced graph (a ``FuncGraph``, weakly held): the name scopes Keras layers opened in it,
#: mapped to the layers' names (:func:`note_layer_scopes`).
_layer_scopes: "weakref.WeakKeyDictionary[Any, dict[str, str]]" = weakref.WeakKeyDictionary()
_layer_scopes_lock = threading.Lock()


def note_layer_scopes(graph: Any, scopes: Mapping[str, str]) -> None:
    """Record that, in the traced ``graph``, each name scope of ``scopes`` was opened by the
    Keras layer it maps to; the rewrite of ``graph`` then matches ``exclude`` patterns against
    those layers' names (:meth:`amp_rewrite.plan.exclude.NameMatcher.bind_layer_scopes`).
    Called while ``graph`` is traced (the Keras train, test and predict steps call it);
    mutates this module's record, which holds ``graph`` weakly."""
    with _layer_scopes_lock:
        _layer_scopes.setdefault(graph, {}).update(scopes)


def _exclude_for(graph: Any, exclude: Any) -> Any:
    """``exclude`` (the rewrite option) for the rewrite of ``graph``: where layer scopes were
    noted for ``graph`` and there are patterns, a matcher bound to them, so that a pattern
    names a Keras layer as the trace spelled its scope; else ``exclude`` as given.  Raises
    :class:`AmpRewriteError` for a bad pattern, as the rewrite would.  Reads the record of
    :func:`note_layer_scopes`; mutates nothing."""
    with _layer_scopes_lock:
        scopes = _layer_scopes.get(graph)
    if not scopes or not exclude:
        return exclude
    return NameMatcher.compile(exclude).bind_layer_scopes(scopes)

# Suffixes for renamed library functions must be unique in the process, because they are
# registered with TensorFlow's process-wide eager context; the counter never reaches a
# GraphDef that is compared or saved, so it does not affect output determinism.
_suffixes = itertools.count(1)


def rename_functions(graph_def: Any, suffix: str) -> Any:
    """A copy of ``graph_def`` whose library functions are all renamed ``<name><suffix>``.

    Every reference is updated: nodes that call a function as their op, ``func`` and
    ``list(func)`` attributes (``While``/``If``/``PartitionedCall``...), nested name-attr
    lists, and the library's gradient table.  Does not mutate ``graph_def``.
    """
    out = type(graph_def)()
    out.CopyFrom(graph_def)
    mapping = {f.signature.name: f"{f.signature.name}{suffix}" for f in out.library.function}
    if not mapping:
        return out

    def fix_name_list(name_list: Any) -> None:
        if name_list.name in mapping:
            name_list.name = mapping[name_list.name]
        for value in name_list.attr.values():
            fix_attr(value)

    def fix_attr(value: Any) -> None:
        which = value.WhichOneof("value")
        if which == "func":
            fix_name_list(value.func)
        elif which == "list":
            for name_list in value.list.func:
                fix_name_list(name_list)

    def fix_node(node: Any) -> None:
        if node.op in mapping:
            node.op = mapping[node.op]
        for value in node.attr.values():
            fix_attr(value)

    for node in out.node:
        fix_node(node)
    for fdef in out.library.function:
        fdef.signature.name = mapping[fdef.signature.name]
        for node in fdef.node_def:
            fix_node(node)
        for value in fdef.attr.values():
            fix_attr(value)
    for grad in out.library.gradient:
        grad.function_name = mapping.get(grad.function_name, grad.function_name)
        grad.gradient_func = mapping.get(grad.gradient_func, grad.gradient_func)
    return out


def captured_variable_shapes(graph: Any) -> dict[str, list[int | None]]:
    """Shapes of the variables a ``tf.function`` graph captures, by the name of the resource
    placeholder that stands for each in its GraphDef.  Pure.

    The GraphDef keeps only ``Placeholder(dtype=resource)`` for a captured variable; the
    variable's shape lives in the capture tensor's handle data, on the Python side, and is
    lost on export unless passed along (``rewrite_graph_def(variable_shapes=...)``).
    """
    import tensorflow as tf
    from tensorflow.python.ops import handle_data_util

    out: dict[str, list[int | None]] = {}
    for t in graph.internal_captures:
        if t.dtype != tf.resource or t.op.type != "Placeholder":
            continue
        data = handle_data_util.get_resource_handle_data(t)
        if not data.is_set or len(data.shape_and_type) != 1:
            continue  # not a variable (or a resource of several tensors)
        shape = tf.TensorShape(data.shape_and_type[0].shape)
        if shape.rank is not None:
            out[t.op.name] = shape.as_list()
    return out


def xla_failure_reason(exc: BaseException) -> str:
    """XLA's reason for not compiling a graph, on one line, from the error TensorFlow raised.

    TensorFlow's message ("Detected unsupported operations when trying to compile graph ...
    on XLA_CPU_JIT: EagerPyFunc (No registered 'EagerPyFunc' OpKernel ...") spans lines and
    ends with a traceback of where the op was created; the first line names the op.  Pure.
    """
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    first = re.sub(r"^Failed getting HLO text:\s*'?", "", first)
    # The node's own name in {{node X}} repeats the op; the graph's attrs are noise.
    first = re.sub(r"(\s*compatible with node)?\s*\{\{node [^}]*\}\}", "", first)
    first = re.sub(r"\[_XlaMustCompile=[^\]]*\]", "", first)
    return first if len(first) <= 300 else first[:297] + "..."


def _identifier(name: str) -> str:
    """``name`` as a Python identifier (a runner's name, which names XLA's HLO module)."""
    return re.sub(r"\W", "_", name) or "step"


#: Op types of collectives (MirroredStrategy's and MultiWorkerMirroredStrategy's reductions).
_COLLECTIVE_PREFIX = "Collective"


def _whole_step_estimates(result: Any, mixed_graph: Any, float32_graph: Any,
                          options: Mapping[str, Any]) -> tuple[float, float, float]:
    """``(mixed ns, float32 ns, margin)``: the step estimates without XLA
    (:func:`amp_rewrite.estimate_step_time`) of ``result``'s rewritten step (traced as
    ``mixed_graph``, whose captured variables size it; the rewrite's own estimate where it
    priced the step, ``price_step``) and of ``float32_graph``, on the target and in the
    precision of the rewrite, and the gain a rewrite needs there
    (:func:`amp_rewrite.step_check.target_step_margin`).  The caller's ``variable_shapes`` win,
    as in the runner's rewrite.  Raises what pricing raises; reads the graphs only."""
    from ..api import estimate_step_time, resolve_target
    from ..step_check import target_step_margin

    target, precision = options.get("target", "auto"), result.report["precision"]
    given = options.get("variable_shapes") or {}

    def priced(graph_def: Any, graph: Any) -> float:
        shapes = {**captured_variable_shapes(graph), **given}
        # What the step runs: what its outputs and stateful ops need (as the rewrite prices it).
        outputs = sorted({t.op.name for t in graph.outputs})
        return estimate_step_time(graph_def, target=target, precision=precision, compiled=False,
                                  variable_shapes=shapes, registry=options.get("registry"),
                                  fetches=outputs).total_ns

    mixed = (result.step_estimates.rewritten.total_ns if result.step_estimates is not None
             else priced(result.graph_def, mixed_graph))
    return (mixed, priced(float32_graph.as_graph_def(), float32_graph),
            target_step_margin(resolve_target(target), precision, compiled=False))


#: The rewrite options that say which planner runs (:func:`amp_rewrite.api.resolve_planner`).
_PLANNER_OPTIONS = ("planner", "lists", "lists_file", "target", "precision", "add", "remove", "level", "use_env")


def _optimal_planner(options: Mapping[str, Any]) -> bool:
    """Whether a rewrite with ``options`` runs the optimal planner; ``False`` where the
    options are bad (the rewrite itself then says why).  Reads list files and the environment
    as the rewrite does."""
    from ..api import resolve_planner

    try:
        return resolve_planner(**{k: options[k] for k in _PLANNER_OPTIONS if k in options}) == "optimal"
    except AmpRewriteError:
        return False


def auto_measure_steps(options: Mapping[str, Any], *, compiled: bool) -> int:
    """How many steps to time per candidate (``measure_steps``) where the caller of a training
    step did not say: :data:`~.step_choice.AUTO_MEASURE_STEPS` where the optimal planner plans for this machine
    (target ``"auto"``) and the step runs without XLA (``compiled`` false) on a device whose
    whole steps the cost model prices with an error above the planner's margin there (a GPU's
    ``unfused_step_error``: the model's verdict is least sure, and a GPU's step is cheap to
    time); else 0.  On an H200 the optimal profile kept three such training steps float32 that
    the default lists ran 2-17% faster (``bench/gpu_runs/2026-11-28b-h200``).  Reads
    TensorFlow's device list and the list files, as the rewrite does; bad options give 0 (the
    rewrite itself says why)."""
    from ..api import resolve_target
    from ..plan.cost_model import costs_for
    from ..plan.optimal import MIN_ESTIMATED_GAIN
    from ..plan.targets import resolve_precision
    from ..step_check import whole_step_margin

    target = options.get("target", DEFAULT_TARGET)
    if compiled or not (isinstance(target, str) and target.strip().lower() == "auto") or not _optimal_planner(options):
        return 0
    try:
        machine = resolve_target(target)
        precision = resolve_precision(options.get("precision", "auto"), machine)[0]
        # The device a step's ops go to unless placed (the lowest-numbered GPU), where the
        # rewrite converts for it: a GPU that cannot profit (compute capability below 7.0)
        # keeps its steps float32, and there is nothing to time.
        runs_on = machine.default_device()
        margin = whole_step_margin([costs_for(runs_on, precision)] if runs_on in machine.eligible_devices(precision)
                                   else [], compiled=False)
    except AmpRewriteError:
        return 0
    return AUTO_MEASURE_STEPS if margin > MIN_ESTIMATED_GAIN else 0


def _duration(ns: float) -> str:
    """``ns`` as a reason states a step's time: in ms with two decimals from 1 ms, else in us.
    Pure."""
    return f"{ns / 1e6:.2f} ms" if ns >= 1e6 else f"{ns / 1e3:.1f} us"


def _across_workers(node: Any) -> bool:
    """Whether ``node`` (a NodeDef) is a collective placed on a cluster job's device: one that
    other workers join (MultiWorkerMirroredStrategy), not local devices (``/job:localhost``,
    MirroredStrategy on one machine)."""
    if not node.op.startswith(_COLLECTIVE_PREFIX):
        return False
    job = re.search(r"/job:([^/]+)", node.device)
    return job is not None and job.group(1) != "localhost"


def _all_nodes(graph_def: Any) -> list[Any]:
    """The NodeDefs of ``graph_def`` and of every function in its library.  Pure."""
    return list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]


def _cross_worker_reason(graph_def: Any) -> str | None:
    """Why ``graph_def``'s step must be the same on every worker (a collective across workers
    in it, or its library), or ``None``.  Pure."""
    for node in _all_nodes(graph_def):
        if _across_workers(node):
            return f"it reduces across workers ({node.op} {node.name!r} on {node.device}), which must all run the same step"
    return None


def _why_loss_scaling_stays(graph_def: Any) -> str | None:
    """Why a step that runs float32 (``graph_def``, with its library: traced, or rewritten to
    convert nothing) still needs its loss scaling, or ``None``: it has float16 or bfloat16 ops
    of its own, or collectives across workers (each worker decides alone, and all must run the
    same collectives).  Pure."""
    from tensorflow.core.framework import types_pb2

    low = {types_pb2.DT_HALF, types_pb2.DT_BFLOAT16}
    why = _cross_worker_reason(graph_def)
    if why is not None:
        return why
    for node in _all_nodes(graph_def):
        for value in node.attr.values():
            if value.type in low or low.intersection(value.list.type):
                return f"it has low-precision ops of its own ({node.op} {node.name!r})"
    return None


def _drop_colocation_with(node: Any, names: set[str]) -> None:
    """Remove from ``node`` (a NodeDef; mutated) its colocation constraints (``_class``
    entries ``loc:@name``) with the nodes ``names``: placeholders the runner does not import,
    whose values it maps in.  ``import_graph_def`` refuses a constraint with a node it does not
    import (a TF1 optimizer's update is colocated with the variable's handle); the mapped
    value already lives where the variable does."""
    if "_class" not in node.attr:
        return
    values = list(node.attr["_class"].list.s)
    kept = [v for v in values if not (v.startswith(b"loc:@") and v[5:].decode(errors="replace") in names)]
    if len(kept) == len(values):
        return
    if kept:
        del node.attr["_class"].list.s[:]
        node.attr["_class"].list.s.extend(kept)
    else:
        del node.attr["_class"]


class _Runner:
    """Runs one rewritten concrete function; built once per concrete function.

    ``jit_compile`` is ``tf.function``'s: ``True`` compiles the rewritten graph with XLA
    (checked once, before the first call; ``owner`` is warned, once, if XLA cannot compile
    it and the runner falls back to running it without XLA), ``False`` forbids it, ``None``
    leaves it to TensorFlow (not compiled, except inside an XLA-compiled caller).
    ``gate_updates``: the step's variable writes wait until everything they read is computed
    (:func:`.update_barrier.updates_after_inputs`), so a step that fails in its backward pass
    has updated nothing.
    """

    def __init__(self, concrete: Any, options: Mapping[str, Any], *, jit_compile: bool | None = None,
                 name: str = "step", owner: object = None, gate_updates: bool = False) -> None:
        import tensorflow as tf

        from ..api import rewrite_graph_def

        graph = concrete.graph
        static_internal = list(graph.internal_captures)
        self._captured = list(graph.external_captures)
        # Deferred captures (capture_call_time_value; MirroredStrategy uses them inside
        # tf.cond) are evaluated at each call and passed to the runner as extra arguments.
        self._deferred = list(graph.deferred_external_captures)
        deferred_internal = tf.nest.flatten(list(graph.deferred_internal_captures),
                                            expand_composites=True)
        capture_ids = {id(t) for t in static_internal} | {id(t) for t in deferred_internal}
        args = [t for t in graph.inputs if id(t) not in capture_ids]
        self.concrete = concrete
        self._arg_names = [t.name for t in args] + [t.name for t in deferred_internal]
        self._capture_names = [t.name for t in static_internal]
        outputs = list(graph.outputs)
        self._output_names = [t.name for t in outputs]
        self._structured_outputs = concrete.structured_outputs
        # The training API's own options (measure_steps) are the Function's, not the rewrite's.
        options = {k: v for k, v in options.items() if k not in TRAINING_OPTIONS}
        # The outputs keep their dtypes; user fetches (extra nodes to keep) are added to them.
        fetches = sorted({t.op.name for t in outputs} | set(options.pop("fetches", None) or ()))
        # The captured variables' shapes, which the GraphDef drops, size the cost model's
        # tensors (shapes the caller passed win).
        options["variable_shapes"] = {**captured_variable_shapes(graph),
                                      **(options.get("variable_shapes") or {})}
        # Keras 3 spells a layer's scope with a suffix TensorFlow chose (the layer dense_1 of a
        # train step is under dense_1_2): where the trace recorded the scopes, the patterns
        # are matched against the layers they belong to.
        if options.get("exclude"):
            options["exclude"] = _exclude_for(graph, options["exclude"])
        # (The ops applying the loss scale stay float32: rewrite_graph_def keeps them.)
        self.result = rewrite_graph_def(graph.as_graph_def(), fetches=fetches, **options)
        self.graph_def = rename_functions(self.result.graph_def, f"_amp{next(_suffixes)}")
        if gate_updates:
            self.graph_def, _ = updates_after_inputs(self.graph_def)
        # import_graph_def copies the library into the runner's graph, but TensorFlow does not
        # carry those functions into the runner's function when it is built, so a lowered
        # tf.cond branch would not be found at run time: register them with the eager context.
        from tensorflow.python.eager import context

        ctx = context.context()
        for fdef in self.graph_def.library.function:
            ctx.add_function_def(fdef)
        self._import_name = "amp_rewrite"
        # The placeholders the runner maps to its arguments and captures are not imported:
        # nothing reads them once mapped, and XLA, which compiles every node of a function,
        # has no kernel for a Placeholder.  import_graph_def remaps the edges that name them.
        mapped = {t.split(":")[0] for t in self._arg_names + self._capture_names}
        self._import_def = type(self.graph_def)()
        self._import_def.CopyFrom(self.graph_def)
        dropped = {n.name for n in self._import_def.node if n.name in mapped and n.op == "Placeholder"}
        kept = [n for n in self._import_def.node if n.name not in dropped]
        for node in kept:
            _drop_colocation_with(node, dropped)
        del self._import_def.node[:]
        self._import_def.node.extend(kept)

        def run(*flat_args: Any) -> list[Any]:
            input_map = dict(zip(self._arg_names, flat_args))
            for name, value in zip(self._capture_names, self._captured):
                # tf.identity of the outer value captures it in this graph: for a variable
                # handle that is the variable itself, so updates land on the model's variables.
                input_map[name] = tf.identity(value)
            # An output that is an input (returned unchanged) is the mapped value itself.
            imported = [n for n in self._output_names if n not in input_map]
            returned = tf.graph_util.import_graph_def(
                self._import_def, input_map=input_map,
                return_elements=imported or None, name=self._import_name,
            )
            by_name = dict(zip(imported, returned or []))
            return [input_map[n] if n in input_map else by_name[n] for n in self._output_names]

        # The runner's name names its FunctionDef and XLA's HLO module (a_inference_<name>_N),
        # so a profile or an XLA dump shows which rewritten step it is.
        run.__name__ = run.__qualname__ = f"amp_rewrite_{_identifier(name)}"
        self._python_run = run
        self._owner = owner if owner is not None else self
        self._name = name
        #: ``jit_compile`` as asked, and whether the runner compiles with XLA now (``False``
        #: after a fallback).
        self.jit_compile = jit_compile
        self.xla_compiled = jit_compile is True
        #: Why XLA could not compile the graph (after a fallback), else ``None``.
        self.xla_fallback_reason: str | None = None
        self._checked = jit_compile is not True
        self._run = tf.function(run, autograph=False, jit_compile=jit_compile)
        #: The runner's concrete function per argument signature (:meth:`_call_run`).
        self._run_concretes: dict[tuple[Any, ...], Any] = {}

    def _check_xla(self, args: Sequence[Any]) -> None:
        """Lower the runner to HLO once for ``args``; fall back to no XLA if that fails.

        Lowering runs no op (no variable changes), so a failure here leaves nothing half
        done; it is where XLA rejects ops it has no kernel for.  Mutates the runner.
        """
        import tensorflow as tf

        self._checked = True
        try:
            self._run.experimental_get_compiler_ir(*args)(stage="hlo")
        except (ValueError, tf.errors.OpError) as exc:
            # experimental_get_compiler_ir wraps XLA's error in a ValueError; the arguments
            # are the ones the trace already accepted, so nothing else raises it here.
            reason = xla_failure_reason(exc)
            self.xla_fallback_reason = reason
            self.xla_compiled = False
            warn_once(self._owner, "xla-fallback", (
                f"amp_rewrite: XLA cannot compile the rewritten {self._name!r} ({reason}); it runs "
                "without XLA (jit_compile=True was asked for), with the same results"
            ))
            self._run = tf.function(self._python_run, autograph=False)
            self._run_concretes = {}

    def _call_run(self, args: list[Any]) -> Any:
        """Call the runner, through its concrete function when the arguments are eager tensors.

        The concrete function is what ``tf.function`` would pick for these shapes and dtypes
        (the runner captures no Python values and takes tensors only), and calling it skips
        ``tf.function``'s lookup, which hashes every captured variable on every call.  It
        keeps ``_XlaMustCompile``: a compiled runner stays compiled.
        """
        import tensorflow as tf

        if not tf.executing_eagerly() or not all(hasattr(a, "numpy") and isinstance(a, tf.Tensor) for a in args):
            return self._run(*args)
        key = tuple((a.dtype, tuple(a.shape)) for a in args)
        concrete = self._run_concretes.get(key)
        if concrete is None:
            concrete = self._run.get_concrete_function(*args)
            if len(self._run_concretes) < _MAX_CALL_KEYS:
                self._run_concretes[key] = concrete
        return concrete(*args)

    def executed_graphs(self) -> list[Any]:
        """The runner's traced graphs: what TensorFlow actually executes for this function."""
        # tf.function has no public list of its traces; this private one exists since TF 2.0.
        return [c.graph for c in self._run._list_all_concrete_functions()]  # noqa: SLF001

    def __call__(self, flat_args: Sequence[Any]) -> Any:
        import tensorflow as tf

        deferred = tf.nest.flatten([capture() for capture in self._deferred],
                                   expand_composites=True)
        # The check needs values: called while another function is traced, the compiled runner
        # is used unchecked (XLA's error, if any, surfaces when that function runs) and the
        # check waits for the first eager call.
        if not self._checked and tf.executing_eagerly():
            self._check_xla([*flat_args, *deferred])
        values = self._call_run([*flat_args, *deferred])
        flat_structure = tf.nest.flatten(self._structured_outputs, expand_composites=True)
        it = iter(values)
        packed = []
        for leaf in flat_structure:
            packed.append(None if leaf is None else next(it))
        leftover = list(it)
        if leftover:
            raise AmpRewriteError(
                f"internal error: {len(leftover)} more outputs than the traced structure holds"
            )
        return tf.nest.pack_sequence_as(self._structured_outputs, packed, expand_composites=True)


def _executing_eagerly() -> bool:
    import tensorflow as tf

    return tf.executing_eagerly()


def _out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is TensorFlow's out-of-memory error (a step's allocation failed)."""
    import tensorflow as tf

    return isinstance(error, tf.errors.ResourceExhaustedError)


def _sync_devices() -> None:
    """Wait until every device has run the work queued so far (a GPU runs a step
    asynchronously: a step's call returns before its kernels finish)."""
    import tensorflow as tf

    tf.test.experimental.sync_devices()


#: Call keys remembered per function (and concrete runners per runner): inputs whose shapes
#: change at every call (``reduce_retracing``) fall back to ``tf.function``'s lookup after this.
_MAX_CALL_KEYS = 256


def _call_key(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """A key that picks the same concrete function as ``tf.function`` would, or ``None``.

    Only for the plain case: called eagerly, outside any distribution strategy, with eager
    tensors (and hashable Python values, which ``tf.function`` keys by value) as the only
    leaves.  The key holds each tensor's dtype and full shape, the device scope and the global
    seed (``tf.random.set_seed`` retraces a ``tf.function``); anything else (variables,
    composite tensors, numpy arrays, unhashable values) takes ``tf.function``'s own lookup.
    Pure.

    Why: ``tf.function``'s lookup builds and hashes a function type over every captured
    variable, on every call; with ``fit`` calling the rewritten step every step, that was
    about 3 ms of host time per step for a 150-layer MLP on this CPU, paid twice (the traced
    and the runner function), while the step itself waits on the host.
    """
    import tensorflow as tf
    from tensorflow.python.eager import context

    if not tf.executing_eagerly() or tf.distribute.has_strategy():
        return None
    parts: list[Any] = [context.context().device_name, context.global_seed()]
    leaves = tf.nest.flatten((args, dict(kwargs)), expand_composites=False)
    for leaf in leaves:
        if isinstance(leaf, tf.Tensor) and not isinstance(leaf, tf.Variable):
            if not hasattr(leaf, "numpy"):  # a symbolic tensor: not an eager call
                return None
            parts.append(("T", leaf.dtype, tuple(leaf.shape)))
        elif leaf is None or isinstance(leaf, (bool, int, float, str)):
            parts.append(("V", type(leaf), leaf))
        else:
            return None
    # The structure matters too (a tuple and a list of the same tensors trace differently).
    return (repr(tf.nest.map_structure(lambda _: 0, (tuple(args), dict(kwargs)))), *parts)


def _flat_inputs(concrete: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any]:
    """The tensors ``concrete`` takes for ``args``/``kwargs``, in its placeholder order.

    This is what ``ConcreteFunction.__call__`` does before ``_call_flat`` (TensorFlow 2.21).
    """
    from tensorflow.python.eager.polymorphic_function import function_type_utils

    bound = function_type_utils.canonicalize_function_inputs(args, kwargs, concrete.function_type)
    return list(concrete.function_type.unpack_inputs(bound))


class Function:
    """A ``tf.function`` whose traced graphs are rewritten to mixed precision before they run.

    Build it with :func:`function`.  Calling it traces (once per input signature), rewrites,
    and runs the rewritten graph.  ``rewrite_results`` and ``executed_graphs()`` expose what
    was rewritten and what ran.  The first rewrite logs one INFO line (what was converted, how
    long it took), or one WARNING with the reason when nothing was converted; ``description``
    names the function in those lines (default: ``amp_rewrite.function 'name'``).
    """

    def __init__(
        self,
        python_function: Callable[..., Any],
        *,
        input_signature: Sequence[Any] | None = None,
        autograph: bool = True,
        reduce_retracing: bool = False,
        jit_compile: bool | None = None,
        rewrite_options: Mapping[str, Any] | None = None,
        description: str | None = None,
    ) -> None:
        import tensorflow as tf

        if jit_compile not in (None, True, False):
            raise AmpRewriteError(f"jit_compile must be None, True or False, not {jit_compile!r}")

        self._python_function = python_function
        # Explicit options win; without any, a step uses the options its loss-scaled
        # optimizer was given (noted while tracing), else the defaults.
        self._explicit = dict(rewrite_options or {})
        self._options = check_rewrite_options(self._explicit)
        self._traced_options: dict[str, list[dict[str, Any]]] = {}
        #: The traced signatures (concrete functions' names) whose loss a traced optimizer
        #: scaled (not one that leaves bfloat16 unscaled: ``loss_scale="auto"``).
        self._loss_scaled: set[str] = set()
        self._jit_compile = jit_compile
        # Traced with jit_compile too: tf.function then traces in XLA's context, where control
        # flow (while loops, TensorArrays) is built the way XLA needs it.  This function is
        # only traced, never run: the runner runs the rewritten graph.
        self._tf_function = tf.function(
            python_function, input_signature=input_signature, autograph=autograph,
            reduce_retracing=reduce_retracing, jit_compile=jit_compile,
        )
        #: The same Python function, traced without loss scaling for a signature whose rewrite
        #: converted nothing (:meth:`_unscaled`) or whose mixed step is priced against its
        #: float32 one (:meth:`_float32_if_faster`); built on first need.
        self._tf_function_unscaled: Any = None
        #: Per traced signature (the traced concrete function's name): the runner that runs it.
        self._runners: dict[str, _Runner] = {}
        #: Per traced signature: seconds its runner took to build (:attr:`rewrite_seconds`).
        self._build_seconds: dict[str, float] = {}
        #: Per traced signature with ``measure_steps``: the choice between the steps it may
        #: run, timed in its first calls (:meth:`_measured`).
        self._choices: dict[str, MeasuredChoice] = {}
        #: Traced signatures measured without the caller asking (:func:`auto_measure_steps`):
        #: where measuring cannot be done, that is said at INFO, not as a request not carried out.
        self._auto_measured: set[str] = set()
        #: Per measured signature: whether its planned step is the float32 one traced without
        #: loss scaling (its summary line, deferred to the choice, says so).
        self._planned_unscaled: dict[str, bool] = {}
        #: Per loss-scaled traced signature: reads the count of updates its optimizers skipped.
        self._skip_counts: dict[str, Callable[[], int]] = {}
        #: Measured signatures whose planned step's summary waits for the choice (a WARNING
        #: that it converts nothing, which the default lists' step may make untrue).
        self._summary_deferred: set[str] = set()
        #: (concrete, runner or timed choice) per call key (:func:`_call_key`): a training step
        #: calls the same signature every step, and tf.function's own lookup hashes every
        #: captured variable.
        self._calls: dict[tuple[Any, ...], tuple[Any, _Runner | MeasuredChoice]] = {}
        self._lock = threading.Lock()
        #: The exclude patterns already warned about for matching no node: warned once per
        #: pattern for this function, not for every graph it rewrites (:meth:`_runner`).
        self._unmatched_warned: set[str] = set()
        self._bound: weakref.WeakKeyDictionary[Any, Function] = weakref.WeakKeyDictionary()
        self._init_kwargs = dict(input_signature=input_signature, autograph=autograph,
                                 reduce_retracing=reduce_retracing, jit_compile=jit_compile,
                                 description=description)
        functools.update_wrapper(self, python_function)
        self._description = description or f"amp_rewrite.function {getattr(self, '__name__', 'step')!r}"

    @property
    def python_function(self) -> Callable[..., Any]:
        return self._python_function

    @property
    def rewrite_options(self) -> dict[str, Any]:
        """The options given to this function (with defaults), a copy.

        Without explicit options a traced step is rewritten with its loss-scaled optimizer's
        options; ``rewrite_results`` shows what was used.
        """
        return dict(self._options)

    @property
    def jit_compile(self) -> bool | None:
        """``jit_compile`` as given (whether a signature really compiled: ``xla_compiled()``)."""
        return self._jit_compile

    def xla_compiled(self) -> list[bool]:
        """Per traced signature so far: whether its rewritten graph runs under XLA."""
        with self._lock:
            return [r.xla_compiled for r in self._runners.values()]

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        # Decorating a method: one Function per instance, as tf.function does.
        if instance is None:
            return self
        bound = self._bound.get(instance)
        if bound is None:
            bound = Function(
                self._python_function.__get__(instance, owner), rewrite_options=self._explicit,
                **self._init_kwargs,
            )
            self._bound[instance] = bound
        return bound

    def get_concrete_function(self, *args: Any, **kwargs: Any) -> Any:
        """The traced (not rewritten) concrete function for these arguments.  Where its
        rewrite converts nothing, or the cost model finds its mixed step slower than the float32
        one, the step that runs is another trace, without loss scaling (``executed_graphs()``
        shows what ran)."""
        with rewrite_trace() as seen:
            concrete = self._tf_function.get_concrete_function(*args, **kwargs)
        if seen:
            with self._lock:
                self._traced_options[concrete.name] = seen.options
                if seen.scaled:
                    self._loss_scaled.add(concrete.name)
                    self._skip_counts[concrete.name] = seen.skipped_updates
        return concrete

    def _options_for(self, concrete: Any) -> dict[str, Any]:
        if self._explicit:
            return self._options
        seen = self._traced_options.get(concrete.name, [])
        if len(seen) > 1:
            raise AmpRewriteError(
                "the traced step uses loss-scaled optimizers with different rewrite options "
                f"({seen}); pass the options to amp_rewrite.function explicitly"
            )
        return check_rewrite_options(seen[0]) if seen else self._options

    def _plan_options(self, concrete: Any) -> dict[str, Any]:
        """The rewrite options for ``concrete``: under ``jit_compile=True`` the cost model
        prices the graph as XLA runs it (``compiled=True``) unless the options say otherwise;
        without ``measure_steps``, the steps are measured where :func:`auto_measure_steps`
        says so (logged, and remembered in :attr:`_auto_measured`)."""
        options = dict(self._options_for(concrete))
        if self._jit_compile is True:
            options.setdefault("compiled", True)
        # A training step (one that traced an optimizer of ours), not an evaluation or a
        # prediction, whose outputs would come from alternating candidates.
        if "measure_steps" not in options and concrete.name in self._traced_options:
            steps = auto_measure_steps(options, compiled=bool(options.get("compiled")) or self._jit_compile is True)
            if steps:
                options["measure_steps"] = steps
                self._auto_measured.add(concrete.name)
                log.info("amp_rewrite: %s: the optimal planner on this GPU without XLA, where the cost model's "
                         "whole-step estimates are least sure: its first steps choose between the steps it may "
                         "run by timing them (measure_steps=%d; measure_steps=0 trusts the estimate)",
                         self._description, steps)
        return options

    def _runner(self, concrete: Any) -> _Runner:
        """The runner of ``concrete``, built at its first call: it runs ``concrete`` rewritten,
        or the step traced again without loss scaling, where that rewrite converted nothing
        (:meth:`_unscaled`) or its mixed step is estimated no faster than that float32 step
        (:meth:`_float32_if_faster`).  Either takes ``concrete``'s inputs."""
        with self._lock, unmatched_warned_once(self._unmatched_warned, self._description):
            runner = self._runners.get(concrete.name)
            if runner is None:
                start = time.perf_counter()
                options = self._plan_options(concrete)
                # Measured steps replace the whole-step estimate where the caller asked for
                # them: the float32 step is one of the candidates, timed.  Measuring by default
                # keeps the check, for the step that cannot be timed (one first called inside
                # another tf.function runs as planned).
                measure = bool(options.get("measure_steps"))
                asked = measure and concrete.name not in self._auto_measured
                # Where the whole-step check may follow, the rewrite prices the mixed step from
                # its own import (a BERT-base step: seconds less than importing it again).
                check = self._may_check_step(concrete, options) and not asked
                first = {**options, "price_step": True} if check else options
                runner = _Runner(concrete, first, jit_compile=self._jit_compile,
                                 name=getattr(self, "__name__", "step"), owner=self)
                unscaled_runner = self._unscaled(concrete, runner, options)
                if unscaled_runner is None and not asked:
                    unscaled_runner = self._float32_if_faster(concrete, runner, options)
                runner = unscaled_runner or runner
                self._runners[concrete.name] = runner
                if concrete.name not in self._traced_options:
                    # No optimizer of ours was traced into the step: nothing scales its loss.
                    warn_if_float16_without_loss_scaling(
                        self, self._description, runner.result.report, runner.result.graph_def,
                        "wrap its optimizer with amp_rewrite.enable_mixed_precision_graph_rewrite, whose "
                        "scale_loss and apply (get_scaled_loss and get_unscaled_gradients for a TF1 optimizer) "
                        "scale the loss, or rewrite to bfloat16",
                        variable_names=[v.name for v in concrete.graph.variables])
                if measure:
                    choice = self._measured(concrete, runner, options)
                    if choice is not None:
                        self._choices[concrete.name] = choice
                self._build_seconds[concrete.name] = time.perf_counter() - start
                scale_not_needed = concrete.name in self._traced_options and concrete.name not in self._loss_scaled
                if concrete.name in self._choices:
                    self._planned_unscaled[concrete.name] = unscaled_runner is not None
                    if not runner.result.report.get("converted_nodes"):
                        # A WARNING that the step converts nothing waits for the choice: the
                        # default lists' step, if measured faster, does convert.
                        self._summary_deferred.add(concrete.name)
                        return runner
                # Built at the first call of each signature, so this is the first step's line.
                report_rewrite(self, self._description, runner.result.report, self._build_seconds[concrete.name],
                               unscaled=unscaled_runner is not None, scale_not_needed=scale_not_needed)
            return runner

    def _unscaled(self, concrete: Any, runner: _Runner, options: Mapping[str, Any]) -> _Runner | None:
        """Where ``concrete``'s rewrite (``runner``'s) converted nothing, a loss-scaled
        optimizer was traced into it and the step runs float32 whole: the runner of the step
        traced again, for ``concrete``'s input signature, with loss scaling off
        (:func:`._common.unscaled`); else ``None``.

        Loss scaling exists for float16 gradients.  A step that runs float32 whole would pay
        for it and gain nothing: an overflow scan of every gradient, and a conditional around
        the update that XLA runs as a host round trip on a GPU.  It stays where the step has
        float16 or bfloat16 ops of its own (the user's casts or layers), where it reduces
        across workers (every worker must run the same collectives, and each decides alone),
        where tracing again would create a variable or fails, and where the second trace's rewrite
        converts something (a plan is a function of the graph, and the graphs differ by the
        loss scale's ops only, so it should not).  Without loss scaling the step is the
        user's own float32 step: the same update, the loss-scale state left as it is.
        """
        if runner.result.report.get("converted_nodes") or concrete.name not in self._loss_scaled:
            return None
        why = _why_loss_scaling_stays(runner.result.graph_def)
        if why is not None:
            log.debug("amp_rewrite: %s keeps loss scaling: %s", self._description, why)
            return None
        traced = self._trace_unscaled(concrete)
        if traced is None:
            return None
        try:
            unscaled_runner = _Runner(traced, options, jit_compile=self._jit_compile,
                                      name=getattr(self, "__name__", "step"), owner=self)
        except Exception as exc:  # noqa: BLE001  (as a failed trace: the first step works)
            log.debug("amp_rewrite: %s keeps loss scaling: rewriting it again failed: %s", self._description, exc)
            return None
        if unscaled_runner.result.report.get("converted_nodes"):
            log.debug("amp_rewrite: %s keeps loss scaling: without it the rewrite converts %d nodes",
                      self._description, unscaled_runner.result.report["converted_nodes"])
            return None
        return unscaled_runner

    def _trace_unscaled(self, concrete: Any) -> Any:
        """``concrete``'s step traced again, for its input signature, with loss scaling off
        (:func:`._common.unscaled`); ``None`` (logged at DEBUG) where that trace fails.
        Creates ``self._tf_function_unscaled`` on first need (the traces are its)."""
        import tensorflow as tf

        if self._tf_function_unscaled is None:
            self._tf_function_unscaled = tf.function(
                unscaled(self._python_function), input_signature=self._init_kwargs["input_signature"],
                autograph=self._init_kwargs["autograph"], reduce_retracing=self._init_kwargs["reduce_retracing"],
                jit_compile=self._jit_compile)
        # The signature the first trace was made for (shapes relaxed as it relaxed them), so
        # that the second takes every input the first does, in the same order.
        args_spec, kwargs_spec = concrete.structured_input_signature
        try:
            with rewrite_trace():
                return self._tf_function_unscaled.get_concrete_function(*args_spec, **kwargs_spec)
        except Exception as exc:  # noqa: BLE001
            # The step as traced first works: a second trace that fails (a variable created
            # again, raised as VariableCreatedError and wrapped by autograph, or anything the
            # user's code does differently the second time) only costs the optimization.
            log.debug("amp_rewrite: %s keeps loss scaling: tracing it again failed: %s", self._description, exc)
            return None

    def _loss_scaled_without_xla(self, concrete: Any, options: Mapping[str, Any]) -> bool:
        """Whether ``concrete`` was traced with loss scaling and runs without XLA (``options``
        price it so too): the steps :meth:`_float32_if_faster` checks.

        Under XLA the loss scale's ops fuse: what they add is a read of every gradient (BERT-base:
        0.4 GB, about 1% of its step on an H100), within the planner's 3% margin, and no kernels
        of their own.  Not worth a second trace and a step estimate (BERT-base: 13-18 s more
        before the first step, here).  (A step whose XLA compile fails later runs without XLA
        and is not checked.)"""
        return (concrete.name in self._loss_scaled and not options.get("compiled")
                and self._jit_compile is not True)

    def _may_check_step(self, concrete: Any, options: Mapping[str, Any]) -> bool:
        """Whether :meth:`_float32_if_faster` may check ``concrete``'s rewrite (with
        ``options``): a loss-scaled step, without XLA, rewritten by the optimal planner."""
        return self._loss_scaled_without_xla(concrete, options) and _optimal_planner(options)

    def _float32_if_faster(self, concrete: Any, runner: _Runner, options: Mapping[str, Any]) -> _Runner | None:
        """Where the cost-aware planner converted part of ``concrete``, a loss-scaled step that
        runs without XLA (``runner`` runs it rewritten), and the float32 step without loss
        scaling is not estimated slower by the whole-step margin: the runner of that float32
        step (traced again as :meth:`_unscaled` traces it, every op kept float32 with both
        estimates as the reason); else ``None``.

        The planner's whole-step check compares the rewritten graph with the graph as traced,
        loss scaling in both, and graph by graph; what a user's step would otherwise run is the
        float32 step without loss scaling.  Loss scaling adds a scan of every gradient and moves
        the update into a conditional: without XLA on a GPU, where the executor spends host time
        on every kernel, that alone can cost more than float16 saves.  Kept as traced where
        loss scaling must stay (:func:`_why_loss_scaling_stays`) or the second trace fails."""
        result = runner.result
        if not result.report.get("converted_nodes") or not self._loss_scaled_without_xla(concrete, options):
            return None
        if not any(p.placement is not None and p.placement.objective == "optimal" for p in result.plans.values()):
            return None  # the lists decided, not the cost model: the user asked for what they convert
        if _why_loss_scaling_stays(concrete.graph.as_graph_def()) is not None:
            return None
        traced = self._trace_unscaled(concrete)
        if traced is None:
            return None
        try:
            mixed, float32, margin = _whole_step_estimates(result, concrete.graph, traced.graph, options)
        except Exception as exc:  # noqa: BLE001  (a step the model cannot price: the planner's decision stands)
            log.debug("amp_rewrite: %s keeps its mixed step: the whole step could not be priced: %s",
                      self._description, exc)
            return None
        log.debug("amp_rewrite: %s: the mixed step with loss scaling is estimated at %.1f us, the float32 step "
                  "without it at %.1f us", self._description, mixed / 1e3, float32 / 1e3)
        if float32 - mixed >= margin * float32:
            return None
        reason = (f"the whole mixed step, loss scaling included, is estimated at {_duration(mixed)} on "
                  f"{result.report.get('target')} against {_duration(float32)} for the float32 step "
                  f"without loss scaling (not {margin:.0%} faster)")
        try:
            float32_runner = _Runner(traced, {**options, "declined": reason}, jit_compile=self._jit_compile,
                                     name=getattr(self, "__name__", "step"), owner=self)
        except Exception as exc:  # noqa: BLE001  (the mixed step as traced works: keep it)
            log.debug("amp_rewrite: %s keeps its mixed step: the float32 step failed to build: %s",
                      self._description, exc)
            return None
        return float32_runner

    def _measured(self, concrete: Any, runner: _Runner, options: Mapping[str, Any]) -> MeasuredChoice | None:
        """The timed choice between the steps ``concrete`` may run (``options``'
        ``measure_steps``, :mod:`.step_choice`): ``runner``'s (as planned), the float32 step
        without loss scaling (:meth:`_float32_candidate`), and the step rewritten with the
        default lists where the cost-aware planner made the plan (:meth:`_default_lists_candidate`).
        ``None``, logged, where there is nothing to compare or the step reduces across workers
        (each worker would choose alone; all must run the same collectives)."""
        steps = options["measure_steps"]
        traced_def = concrete.graph.as_graph_def()  # read twice below: built once
        why = _cross_worker_reason(traced_def)
        if why is not None:
            if concrete.name in self._auto_measured:
                log.info("amp_rewrite: %s: its steps are not measured (%s): it runs the planned step",
                         self._description, why)
                return None
            warn_once(self, "measure-workers", (
                f"amp_rewrite: {self._description}: measure_steps={steps} was asked for, but {why}: "
                "it runs the planned step without measuring"))
            return None
        # A step of the traced (loss-scaled) step may skip its update: not timed then.
        skipped = self._skip_counts.get(concrete.name)
        candidates = [Candidate("planned", runner, skipped if runner.concrete is concrete else None)]
        for name, other in (("float32", self._float32_candidate(concrete, runner, options, traced_def)),
                            ("default lists", self._default_lists_candidate(concrete, runner, options))):
            if other is not None:
                candidates.append(Candidate(name, other, skipped if other.concrete is concrete else None))
        if len(candidates) == 1:
            log.info("amp_rewrite: %s: measure_steps=%d: no other step to measure against (the planned step "
                     "converts nothing, or is what the default lists convert)", self._description, steps)
            return None
        log.info("amp_rewrite: %s: timing %s over its first %d calls (one warm-up and %d timed steps each)",
                 self._description, ", ".join(c.name for c in candidates), len(candidates) * (steps + 1), steps)
        return MeasuredChoice(candidates, steps, sync=_sync_devices,
                              on_chosen=functools.partial(self._chosen, concrete.name),
                              droppable=_out_of_memory, on_dropped=self._dropped)

    def _dropped(self, candidate: Candidate, error: BaseException) -> None:
        # A WARNING: the dropped step may have updated some variables before it failed
        # (MeasuredChoice), so they take that batch's update twice.
        log.warning("amp_rewrite: %s: the %s step is not measured: it ran out of device memory (%s); the planned "
                    "step ran that batch again (had the failed step begun its update, variables it updated "
                    "took that batch's update twice)", self._description, candidate.name,
                    str(error).splitlines()[0][:200])

    def _float32_candidate(self, concrete: Any, runner: _Runner, options: Mapping[str, Any],
                           traced_def: Any) -> _Runner | None:
        """The float32 step to time against ``runner``'s mixed one: traced again without loss
        scaling where loss scaling may go (:meth:`_trace_unscaled`; ``traced_def`` is
        ``concrete``'s GraphDef), else ``concrete`` itself, every op kept float32; ``None``
        where ``runner`` converted nothing or it cannot be built (logged at DEBUG)."""
        if not runner.result.report.get("converted_nodes"):
            return None
        traced = concrete
        if concrete.name in self._loss_scaled and _why_loss_scaling_stays(traced_def) is None:
            traced = self._trace_unscaled(concrete) or concrete
        reason = "measure_steps: the float32 step, timed against the mixed one"
        # ``declined`` is the cost-aware planner's: it keeps every op float32, whatever the lists.
        float32 = {**options, "planner": "optimal", "declined": reason}
        try:
            # Its updates wait for its whole backward pass, as the loss-scaled planned step's
            # do: timed alike, and a float32 step that runs out of memory there (a batch sized
            # for mixed precision) has updated nothing when the planned step runs the batch.
            return _Runner(traced, float32, jit_compile=self._jit_compile,
                           name=getattr(self, "__name__", "step"), owner=self, gate_updates=True)
        except Exception as exc:  # noqa: BLE001  (the planned step works: measure without this one)
            log.debug("amp_rewrite: %s: the float32 step to measure failed to build: %s", self._description, exc)
            return None

    def _default_lists_candidate(self, concrete: Any, runner: _Runner, options: Mapping[str, Any]) -> _Runner | None:
        """Where the cost-aware planner made ``runner``'s plan: ``concrete`` rewritten with the
        default lists (the greedy planner, which converts what the lists allow whatever the
        estimate says), if that converts something and differs from ``runner``'s graph;
        else ``None``."""
        if not _optimal_planner(options):
            return None
        greedy = {k: v for k, v in options.items() if k not in ("planner", "lists_file")}
        greedy.update(lists="default", planner="greedy")
        try:
            other = _Runner(concrete, greedy, jit_compile=self._jit_compile,
                            name=getattr(self, "__name__", "step"), owner=self)
        except Exception as exc:  # noqa: BLE001  (the planned step works: measure without this one)
            log.debug("amp_rewrite: %s: the default lists' step to measure failed to build: %s",
                      self._description, exc)
            return None
        if not other.result.report.get("converted_nodes"):
            return None
        same = (other.result.graph_def.SerializeToString(deterministic=True)
                == runner.result.graph_def.SerializeToString(deterministic=True))
        return None if same else other

    def _chosen(self, signature: str, choice: MeasuredChoice) -> None:
        """Keep ``choice``'s winner as ``signature``'s runner, and say what was measured: INFO,
        or a WARNING where the planned mixed step lost to the float32 one (the rewrite asked for
        does not run)."""
        chosen = choice.chosen
        assert chosen is not None
        with self._lock:
            self._runners[signature] = chosen.run  # type: ignore[assignment]
        planned = choice.candidates[0]
        if chosen is not planned and chosen.name != "float32" or signature in self._summary_deferred:
            # The summary line of the step that runs, where _runner did not log it.
            self._log_summary(signature, chosen)
        if len(choice.candidates) == 1:
            log.info("amp_rewrite: %s: no other step could be measured; runs the planned step", self._description)
            return
        each = f"{choice.steps} step{'s' if choice.steps != 1 else ''} each"
        message = (f"amp_rewrite: {self._description}: measured {choice.summary()} (median of {each}); "
                   f"runs the {chosen.name} step")
        if chosen is planned:
            log.info("%s", message)
            return
        assert chosen.median_ms is not None and planned.median_ms is not None
        faster = f"{1 - chosen.median_ms / planned.median_ms:.0%} faster than the planned one"
        if chosen.name == "float32":
            warn_once(self, f"measured-float32-{signature}", f"{message}, {faster}: the rewrite does not run")
        else:
            # What the step that runs converts: the summary line logged for the planned step
            # describes that one (and a second summary of the same kind goes to DEBUG).
            report = chosen.run.result.report  # type: ignore[attr-defined]
            log.info("%s, %s: it converts %d of %d ops to %s, %d cast(s) to %s and %d to float32", message, faster,
                     report["converted_nodes"], report["total_nodes"], report.get("precision"),
                     report["casts_to_low"], report.get("precision"), report["casts_to_high"])

    def _log_summary(self, signature: str, candidate: Candidate) -> None:
        """Log the summary line (:func:`report_rewrite`) of ``candidate``, a measured
        signature's step (once: a deferred summary is then no longer pending)."""
        self._summary_deferred.discard(signature)
        report = candidate.run.result.report  # type: ignore[attr-defined]
        report_rewrite(self, self._description, report, self._build_seconds.get(signature, 0.0),
                       unscaled=candidate.name == "planned" and self._planned_unscaled.get(signature, False),
                       scale_not_needed=signature in self._traced_options and signature not in self._loss_scaled)

    def _unmeasured_call(self, signature: str, choice: MeasuredChoice, flat: Sequence[Any]) -> Any:
        """A call while another function is being traced (this step is called inside it): the
        planned step becomes part of that graph, and nothing can be timed there.  Says so once
        (a WARNING: the measuring asked for does not happen for that graph), with the planned
        step's summary where it was waiting for the choice."""
        planned = choice.candidates[0]
        message = (f"amp_rewrite: {self._description}: measure_steps={choice.steps} cannot time a step called "
                   "inside another tf.function (it becomes part of that function's graph): the planned step "
                   "runs there")
        if signature in self._auto_measured:
            log.info("%s", message)  # measured by default, not at the caller's request
        else:
            warn_once(self, f"measure-nested-{signature}", message)
        if signature in self._summary_deferred:
            self._log_summary(signature, planned)
        return planned.run(flat)

    @property
    def measured_choices(self) -> list[dict[str, Any]]:
        """Per traced signature measured so far (``measure_steps``): each candidate's median step
        time (ms; ``None`` before its first timed step) and the step chosen (``None`` while
        timing)."""
        with self._lock:
            choices = list(self._choices.values())
        return [{"candidates": {c.name: c.median_ms for c in ch.candidates},
                 "chosen": ch.chosen.name if ch.chosen is not None else None} for ch in choices]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = _call_key(args, kwargs)
        hit = self._calls.get(key) if key is not None else None
        if hit is None:
            concrete = self.get_concrete_function(*args, **kwargs)
            runner = self._runner(concrete)
            hit = (concrete, self._choices.get(concrete.name, runner))
            if key is not None and len(self._calls) < _MAX_CALL_KEYS:
                with self._lock:
                    self._calls[key] = hit
        concrete, step = hit
        flat = _flat_inputs(concrete, args, kwargs)
        if isinstance(step, MeasuredChoice) and step.deciding and not _executing_eagerly():
            return self._unmeasured_call(concrete.name, step, flat)
        return step(flat)

    @property
    def rewrite_results(self) -> list[Any]:
        """The :class:`~amp_rewrite.RewriteResult` of each traced signature so far."""
        with self._lock:
            return [r.result for r in self._runners.values()]

    @property
    def rewrite_seconds(self) -> float:
        """Seconds spent so far building the runners of the traced signatures, each at its first
        call: the rewrite, and where it happened the step traced again without loss scaling, its
        estimate and rewrite.  Not the first trace, nor TensorFlow's (or XLA's) compilation of
        the runner, which the first call pays after it."""
        with self._lock:
            return sum(self._build_seconds.values())

    def executed_graphs(self) -> list[Any]:
        """The graphs TensorFlow ran: the runner functions' graphs, rewritten ops inside.

        Inspect these (not the traced graph) to check which dtypes really executed.
        """
        with self._lock:
            runners = list(self._runners.values())
        return [g for r in runners for g in r.executed_graphs()]


def function(
    func: Callable[..., Any] | None = None,
    *,
    input_signature: Sequence[Any] | None = None,
    autograph: bool = True,
    reduce_retracing: bool = False,
    jit_compile: bool | None = None,
    **rewrite_options: Any,
) -> Any:
    """Like ``tf.function``, but the traced graph is rewritten to mixed precision first.

    Use it as ``@amp_rewrite.function`` or ``@amp_rewrite.function(target="gpu:8.0")``.
    ``rewrite_options`` go to :func:`amp_rewrite.rewrite_graph_def`; without any, the options
    of the loss-scaled optimizer used in the step (from
    :func:`amp_rewrite.enable_mixed_precision_graph_rewrite`) apply, else the defaults
    (``target="auto"``, this machine).  The function's outputs keep their dtypes (``fetches``
    adds nodes to keep).  Nothing global changes: other ``tf.function``s stay float32.

    ``jit_compile`` is ``tf.function``'s: ``True`` runs the *rewritten* graph under XLA (and
    plans the rewrite for it, ``compiled=True``); where XLA cannot compile it, one WARNING
    names the reason and the function runs without XLA.  ``False`` and ``None`` as in
    ``tf.function``.

    ``measure_steps=N`` (a training option beside the rewrite's) chooses the step by timing
    instead of trusting the cost model: the first calls of each traced signature run, in
    turn, the step as planned, the float32 step without loss scaling and (where the optimal
    planner made the plan) the step the default lists give, each one untimed warm-up and
    ``N`` timed steps; the fastest median is kept (the planned step unless another beats it
    by 2%), with one INFO line, or a WARNING where the float32 step won.  Every trial call
    is a real step.  Not done for a step that reduces across workers (each would choose
    alone).  See :mod:`amp_rewrite.training.step_choice`.

    Raises
    ------
    AmpRewriteError
        For an unknown rewrite option, a ``measure_steps`` that is not a whole number, or a
        ``jit_compile`` that is not None/True/False (at decoration time).
    """
    def decorate(f: Callable[..., Any]) -> Function:
        return Function(f, input_signature=input_signature, autograph=autograph,
                        reduce_retracing=reduce_retracing, jit_compile=jit_compile,
                        rewrite_options=rewrite_options)

    if func is None:
        return decorate
    return decorate(func)
