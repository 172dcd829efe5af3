"""The library's entry points: the boundary where options, environment and TF meet.

:func:`rewrite_graph_def` runs the four stages (import -> decide -> rewrite -> export) on a
GraphDef and each function of its library and returns the new GraphDef with a report.
This module is the only one that reads environment variables (TensorFlow's
``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_*`` list edits and level) and the only one that
detects the local machine (``target="auto"``).

Overrides apply in one order: list profile -> list file -> environment variables ->
``allow=``/``deny=``/... arguments.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import gc
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterable, Iterator, Literal, Mapping, Sequence

import networkx as nx

from .plan.painter import DecideOptions, Painting, Placement, Plan
from .errors import AmpRewriteError, InvalidGraphError, ListError, RewriteError, TargetError
from .plan.exclude import NameMatcher, warn_unmatched
from .graph.io import (export_graph_def, functions_named_outside, import_graph_def, loop_functions, parse_graph_def,
                       reachable_functions)
from .plan.preserve import excluded_nodes, preserved_nodes
from .plan.normalization import find_normalizations
from .plan.lists import PLANNERS, ListContext, ListEdit, OpLists, edits_from_environ, load_lists, tf_major_minor
from .graph.op_registry import OpRegistry, default_registry
from .report.build import build_report
from .loop_hoist import HoistedCast, hoist_loop_invariant_casts, loop_invariant_tensors
from .rewrite import RewriteStats, apply_plan
from .rewrite_check import TypeCheckFailed, check_rewritten
from .step_check import checked_plan, device_costs
from .graph.shapes import assign_function_shapes, check_variable_shapes, graph_shapes
from .graph.training_ops import loss_scale_scope_nodes
from .option_types import (check_bool, check_list_edits, check_names, check_optional_str, check_path,
                           check_str)
from .plan.cost_model import DeviceCosts
from .plan.step_cost import NodeTime, StepEstimate, call_counts, estimate_graphs, estimate_parts, total_of
from .plan.targets import Target, detect_target, parse_target, resolve_precision
from .graph.validate import check_cycles

__all__ = ["RewriteResult", "StepEstimates", "rewrite_graph_def", "resolve_lists", "resolve_planner",
           "resolve_target", "installed_tf_version", "tensorflow_lists_version", "estimate_step_time"]

log = logging.getLogger(__name__)

Precision = Literal["float16", "bfloat16"]


@dataclass(frozen=True)
class StepEstimates:
    """The cost model's estimates of one run of a step (the graph and the functions it runs,
    as :func:`estimate_step_time` prices them) before and after a rewrite, priced from that
    rewrite's own import of the graph."""

    given: StepEstimate
    rewritten: StepEstimate


@dataclass(frozen=True)
class RewriteResult:
    """The rewritten GraphDef, the JSON-ready report, and the plan of every graph.

    ``plans`` maps ``""`` (the main graph) and each rewritten function name to its plan.
    """

    graph_def: Any
    report: dict[str, Any]
    plans: Mapping[str, Plan] = field(default_factory=dict)
    #: Seconds per stage (``lists``, ``import``, ``decide``, ``rewrite``, ``check`` (the rewritten
    #: graphs' type check, :mod:`amp_rewrite.rewrite_check`), ``export``, and ``price``
    #: where the call asked ``price_step``); kept out of the report so the report stays
    #: byte-identical across runs.
    timings: Mapping[str, float] = field(default_factory=dict)
    #: The nodes with at least one type attribute converted, per graph (``""`` and function
    #: names, as ``plans``): what per-signature summaries count
    #: (:func:`amp_rewrite.models.saved_model.signature_summaries`).
    converted: Mapping[str, frozenset[str]] = field(default_factory=dict)
    #: The whole step as given and as rewritten, where the call asked (``price_step``) and the
    #: step could be priced.
    step_estimates: StepEstimates | None = None


IGNORE_PERFORMANCE_VAR = "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_IGNORE_PERFORMANCE"


def ignore_performance_from_environ(environ: Mapping[str, str]) -> bool:
    """TensorFlow's ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_IGNORE_PERFORMANCE``, read as
    TensorFlow reads a boolean variable (``1``/``true`` or ``0``/``false``, any case; unset
    or empty is false).  Raises :class:`TargetError` for any other value, as TensorFlow
    refuses it too."""
    text = environ.get(IGNORE_PERFORMANCE_VAR, "").strip().lower()
    if text in ("", "0", "false"):
        return False
    if text in ("1", "true"):
        return True
    raise TargetError(f"{IGNORE_PERFORMANCE_VAR}={environ[IGNORE_PERFORMANCE_VAR]!r} is not a "
                      "boolean (expected 1, true, 0 or false)")


@functools.cache
def installed_tf_version() -> str:
    """The installed TensorFlow's ``__version__`` (``"2.16.2"``), read once per process: the
    release whose op lists the ``tensorflow`` profile (and those extending it) use."""
    import tensorflow as tf

    return str(tf.__version__)


# The release whose lists to use when a call names none (``tensorflow_lists_version``); None:
# the installed one.  A context variable, so one override (the CLI's --tf-version) reaches every
# rewrite of a command (SavedModels, training graphs) without each signature growing a parameter.
_LISTS_VERSION: contextvars.ContextVar[str | None] = contextvars.ContextVar("amp_rewrite_tf_version", default=None)


@contextlib.contextmanager
def tensorflow_lists_version(version: str | None) -> Iterator[None]:
    """Within the block, every rewrite that names no ``tf_version`` uses TensorFlow ``version``'s
    op lists (``"2.16"``) instead of the installed release's; ``None`` changes nothing.  For
    offline use: planning for a TensorFlow other than the one installed (``--tf-version``).
    Raises :class:`ListError` for a malformed version."""
    if version is None:
        yield
        return
    token = _LISTS_VERSION.set(tf_major_minor(version))  # validates before the block runs
    try:
        yield
    finally:
        _LISTS_VERSION.reset(token)


def resolve_target(target: str | Target) -> Target:
    """``"auto"`` detects this machine; anything else is parsed (see ``parse_target``)."""
    if not isinstance(target, (str, Target)):
        raise TargetError(f"target must be 'auto', 'cpu', 'gpu:X.Y' or a Target, not "
                          f"{type(target).__name__} {target!r}"[:200])
    if isinstance(target, str) and target.strip().lower() == "auto":
        return detect_target()
    return parse_target(target)


_CATEGORIES = ("allow", "infer", "deny", "clear")


def _edits(category: str, action: str, ops: Iterable[str] | str) -> list[ListEdit]:
    """Edits for ``add=``/``remove=`` arguments.

    Unlike TensorFlow's environment variables (where adding an op to a second list is an
    error), an argument that adds an op *moves* it: it is first removed from the other lists.
    """
    if isinstance(ops, str):
        ops = [o for o in (x.strip() for x in ops.split(",")) if o]
    if category not in _CATEGORIES:
        raise ListError(f"unknown list {category!r}; expected one of {', '.join(_CATEGORIES)}")
    edits = []
    for op in ops:
        if action == "add":
            edits += [ListEdit("remove", other, op, "argument") for other in _CATEGORIES  # type: ignore[arg-type]
                      if other != category]
        edits.append(ListEdit(action, category, op, "argument"))  # type: ignore[arg-type]
    return edits


def resolve_lists(
    lists: str | os.PathLike[str],
    *,
    target: Target,
    precision: Precision,
    lists_file: str | os.PathLike[str] | None = None,
    add: Mapping[str, Iterable[str] | str] | None = None,
    remove: Mapping[str, Iterable[str] | str] | None = None,
    level: str | None = None,
    environ: Mapping[str, str] | None = None,
    tf_version: str | None = None,
) -> tuple[OpLists, str]:
    """Build the effective lists (and level) for a target, in the documented order.

    ``precision`` is any spelling :func:`~amp_rewrite.plan.targets.parse_precision` accepts
    (``"auto"`` chooses for ``target``).  ``environ`` is read for TensorFlow's list
    variables; pass ``{}`` to ignore them.  ``tf_version`` (``"2.16"``) picks that TensorFlow
    release's lists; ``None``: the :func:`tensorflow_lists_version` in force, else the installed
    release (:func:`installed_tf_version`).
    """
    precision, _ = resolve_precision(precision, target)
    check_path("lists", lists)
    check_path("lists_file", lists_file, optional=True)
    check_optional_str("level", level, what="a level name (DEFAULT, TENSOR_CORES_ONLY, "
                       "TREAT_INFER_AS_DENY, UNSAFE_FORCE_ALL) or None")
    check_list_edits("add", add)
    check_list_edits("remove", remove)
    for ref in (lists, lists_file):
        if ref is not None and "\x00" in os.fspath(ref):
            raise ListError(f"list name or path {os.fspath(ref)!r} contains a NUL byte")
    env_edits, env_level = edits_from_environ(environ if environ is not None else {})
    arg_edits: list[ListEdit] = []
    for category, ops in (add or {}).items():
        arg_edits += _edits(category, "add", ops)
    for category, ops in (remove or {}).items():
        arg_edits += _edits(category, "remove", ops)
    effective_level = (level or env_level or "DEFAULT").upper()
    if effective_level not in ("DEFAULT", "TENSOR_CORES_ONLY", "TREAT_INFER_AS_DENY", "UNSAFE_FORCE_ALL"):
        raise ListError(
            f"unknown level {level!r}; expected DEFAULT, TENSOR_CORES_ONLY, TREAT_INFER_AS_DENY "
            "or UNSAFE_FORCE_ALL"
        )
    backend = "cuda" if target.kind == "gpu" else "onednn"
    if effective_level == "UNSAFE_FORCE_ALL" and backend == "onednn":
        raise ListError("level UNSAFE_FORCE_ALL cannot be used for CPU (oneDNN) targets, as in TensorFlow")
    context = ListContext(precision, backend, target.cuda_version, target.cudnn_version)
    version = tf_major_minor(tf_version or _LISTS_VERSION.get() or installed_tf_version())
    op_lists = _load_lists_cached(
        _file_key(lists), _file_key(lists_file) if lists_file is not None else None, context,
        tuple(env_edits + arg_edits), effective_level, version,
    )
    return op_lists, effective_level


def resolve_planner(
    *,
    planner: str | None = None,
    lists: str | os.PathLike[str] = "default",
    lists_file: str | os.PathLike[str] | None = None,
    target: str | Target = "auto",
    precision: str = "auto",
    add: Mapping[str, Iterable[str] | str] | None = None,
    remove: Mapping[str, Iterable[str] | str] | None = None,
    level: str | None = None,
    use_env: bool = True,
) -> str:
    """The planner :func:`rewrite_graph_def` runs with these options: ``planner`` where given,
    else the one the lists name (``"greedy"``, ``"optimal"`` or ``"min-casts"``).  Raises what
    the rewrite would raise for these options; reads the list files (cached) and, with
    ``use_env``, the environment."""
    check_optional_str("planner", planner, what="'greedy', 'optimal', 'min-casts' or None")
    op_lists = _target_and_lists(target, precision, lists, lists_file, add, remove, level, use_env)[3]
    chosen = planner if planner is not None else op_lists.planner
    if chosen not in PLANNERS:
        raise AmpRewriteError(f"planner must be one of {', '.join(PLANNERS)}, not {chosen!r}")
    return chosen


def _file_key(ref: str | os.PathLike[str]) -> tuple[str, float | None]:
    """A cache key for a profile name or list file: the name and, for a file, its mtime, so
    an edited file is read again."""
    text = os.fspath(ref)
    try:
        return text, os.stat(text).st_mtime
    except (OSError, ValueError):  # ValueError: a NUL byte in the name; the loader reports it
        return text, None


@functools.lru_cache(maxsize=64)
def _load_lists_cached(
    lists: tuple[str, float | None],
    lists_file: tuple[str, float | None] | None,
    context: ListContext,
    edits: tuple[ListEdit, ...],
    level: str,
    tf_version: str,
) -> OpLists:
    # Parsing and validating the TOML lists costs ~10 ms, more than rewriting a small graph;
    # the result is immutable, so repeated rewrites share it.
    return load_lists(
        lists[0], context=context, user_file=None if lists_file is None else lists_file[0],
        edits=edits, level=level, tf_version=tf_version,  # type: ignore[arg-type]
    )


def _placement(planner: str) -> Placement | None:
    """The :class:`~amp_rewrite.plan.painting.Placement` that runs ``planner`` after
    TensorFlow's passes: none for ``"greedy"``, the minimum cut for ``"optimal"`` and
    ``"min-casts"``."""
    if planner == "greedy":
        return None
    from .plan import optimal  # deferred: the cost model is not needed by the greedy planner

    return optimal.min_cut_placement


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: the IR allocates millions of small acyclic objects
    and the collector's repeated full scans would otherwise dominate the run time."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_PARAMETERS_DOC = """    Parameters
    ----------
    graph_def
        A ``tf.compat.v1.GraphDef`` or its serialized bytes.  Never modified.
    target
        ``"auto"`` (this machine), ``"gpu:8.0"`` (a GPU of that compute capability; several
        comma-separated capabilities describe GPU:0, GPU:1, ...), ``"cpu"``, or a
        :class:`~amp_rewrite.plan.targets.Target`.
    precision
        ``"auto"`` (the default: float16 on a GPU, bfloat16 on a CPU with fast bfloat16
        math; see :func:`~amp_rewrite.plan.targets.auto_precision`), ``"float16"`` or
        ``"bfloat16"``, in any usual spelling (``fp16``, ``half``, ``bf16``, ``tf.float16``).
        The report's ``precision`` and ``precision_reason`` say what was used and why.
    lists
        A packaged profile (``"default"``, ``"tensorflow"``) or a path to a list file;
        ``lists_file`` is layered on top.  ``add``/``remove`` map a category (``"allow"``,
        ``"infer"``, ``"deny"``, ``"clear"``) to op names and are applied last.
    fetches
        Nodes (or tensors) that must be preserved exactly, as Grappler's fetch set.  When
        ``None``, the graph's outputs (nodes nothing reads from) are preserved, so outputs
        keep their dtypes.
    level
        ``DEFAULT``, ``TENSOR_CORES_ONLY``, ``TREAT_INFER_AS_DENY`` or ``UNSAFE_FORCE_ALL``.
    exclude
        A regular expression, or a list of them; the nodes they match keep float32
        (preserved), in the main graph and in every function.  A pattern matches a node when
        it matches (:func:`re.fullmatch`, anchored) its whole name or one ``/``-separated
        component of it, such as a Keras layer name: ``"conv2d_1"`` excludes
        ``model/conv2d_1/Conv2D`` but not ``model/conv2d_10/Conv2D`` (see
        :mod:`amp_rewrite.plan.exclude`).  Each excluded node's reason names its pattern, and the
        report's ``excluded`` maps each pattern to the number of nodes it matched; a pattern
        that matched none is a WARNING.
    keep_float32
        Node names (exact) kept float32 like excluded nodes, in the main graph and every
        function; :func:`~amp_rewrite.models.saved_model.rewrite_model` passes what the selected
        signatures do not run.
    functions
        ``"all"`` rewrites every function of the library (a SavedModel's signatures may call
        functions the GraphDef itself does not); ``"reachable"`` only those the graph calls,
        as Grappler does.
    tensorflow_bugs
        Reproduce TensorFlow 2.21's known bugs (``KNOWN_DIFFERENCES.md``) for exact parity,
        even where its output cannot run.  Off by default.
    use_env
        Honour TensorFlow's ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_*`` variables.
    planner
        ``"greedy"`` (TensorFlow's passes), ``"optimal"`` (cost-aware minimum cut with
        normalization-aware safety) or ``"min-casts"`` (the same cut and safety, but every
        allow-list op converts and only Cast bytes are minimized); ``None`` takes the list
        profile's (``lists="optimal"`` selects the optimal planner).
    variable_shapes
        Shapes of the variables behind resource placeholders, by placeholder name (``None``
        for an unknown dimension).  A GraphDef records a captured variable as a
        ``Placeholder`` of dtype ``resource`` with no shape, so the sizes of everything
        computed from the weights are unknown to the cost-aware planners (and to the
        normalization safety rule, which needs the number of values a statistic averages).
        Used for shape inference only (the greedy planner's output does not depend on them).
        The ``tf.function`` training path passes them itself.
    compiled
        The graph will run under XLA (``jit_compile=True``, ``amp-rewrite rewrite --xla``):
        the cost-aware planners price Casts and element-wise ops as XLA fuses them
        (:func:`amp_rewrite.plan.cost_model.node_cost`).  The greedy planner ignores it.
    declined
        Keep every graph float32 and give this reason (the end of each kept op's reason, and
        of the report's ``skipped``): the caller priced the step as a whole and found that
        converting does not pay.  The training path passes it when the loss-scaled mixed
        step is estimated no faster than the float32 step without loss scaling, which no
        single graph's check can see (:mod:`amp_rewrite.training.tf_function`).  Cost-aware
        planners only: the greedy planner is TensorFlow's, which converts what its lists say.
    price_step
        Also estimate the whole step (the graph and the functions it runs, as
        :func:`estimate_step_time` prices them, for ``target``, ``precision`` and ``compiled``)
        as given and as rewritten: ``RewriteResult.step_estimates``.  Priced from this call's
        own import, so it costs a fraction of pricing the input and the output again (two
        imports).  Cost-aware planners only, whose import infers the tensor sizes a price needs.
        ``None``, with a WARNING, where the step cannot be priced (the rewrite stands).

"""


def rewrite_graph_def(
    graph_def: Any,
    *,
    target: str | Target = "auto",
    precision: Precision | Literal["auto"] | str = "auto",
    lists: str | os.PathLike[str] = "default",
    lists_file: str | os.PathLike[str] | None = None,
    fetches: Sequence[str] | None = None,
    add: Mapping[str, Iterable[str] | str] | None = None,
    remove: Mapping[str, Iterable[str] | str] | None = None,
    level: str | None = None,
    exclude: str | Sequence[str] | None = None,
    functions: Literal["all", "reachable"] = "all",
    tensorflow_bugs: bool = False,
    use_env: bool = True,
    registry: OpRegistry | None = None,
    planner: Literal["greedy", "optimal", "min-casts"] | None = None,
    variable_shapes: Mapping[str, Sequence[int | None] | None] | None = None,
    compiled: bool = False,
    keep_float32: Collection[str] | None = None,
    declined: str | None = None,
    price_step: bool = False,
) -> RewriteResult:
    """Rewrite a GraphDef (and its function library) to mixed precision.

    Returns
    -------
    RewriteResult
        ``.graph_def`` (a new GraphDef) and ``.report`` (a JSON-serializable dict).

    Raises
    ------
    AmpRewriteError
        For input that is not a valid graph, unknown lists or ops, or a bad target.
    RewriteError
        Where a rewritten graph fails amp_rewrite's own type check (a bug of ours:
        :func:`amp_rewrite.rewrite_check.check_rewritten`) even when made again with the nodes involved kept
        float32.  A failure that keeping them avoids is a WARNING, and their report reasons say so.
    """
    kept: dict[str, dict[str, str]] = {}
    with _gc_paused():
        for retry in range(_TYPE_CHECK_RETRIES + 1):
            try:
                result = _rewrite_graph_def(
                    graph_def, target=target, precision=precision, lists=lists, lists_file=lists_file,
                    fetches=fetches, add=add, remove=remove, level=level, exclude=exclude,
                    functions=functions, tensorflow_bugs=tensorflow_bugs, use_env=use_env, registry=registry,
                    planner=planner, variable_shapes=variable_shapes, compiled=compiled,
                    keep_float32=keep_float32, declined=declined, price_step=price_step, kept=kept,
                )
            except TypeCheckFailed as exc:
                if retry == _TYPE_CHECK_RETRIES or not _keep_after_type_check(exc, kept):
                    if kept:
                        n = sum(map(len, kept.values()))
                        raise RewriteError(f"{exc}.  Keeping {n} node(s) float32 that earlier tries involved did "
                                           "not avoid it", node=exc.node) from None
                    raise
            else:
                # After the retries, so once per rewrite: a pattern that matches nothing keeps
                # nothing float32, which the report's excluded count alone would not tell.
                warn_unmatched(result.report.get("excluded", {}))
                return result
    raise AssertionError("unreachable: the last retry returns or raises")


#: How many times a rewrite that fails its type check is made again, each time with the nodes
#: the failure involves kept float32, before the failure is raised.
_TYPE_CHECK_RETRIES = 2


def _keep_after_type_check(exc: TypeCheckFailed, kept: dict[str, dict[str, str]]) -> bool:
    """Add to ``kept`` (mutated) the nodes ``exc`` involves, with a WARNING that the rewrite is
    made again; ``False`` (and nothing done) where they are all kept already."""
    new = {graph: {n: r for n, r in nodes.items() if n not in kept.get(graph, {})}
           for graph, nodes in exc.keep.items()}
    new = {graph: nodes for graph, nodes in new.items() if nodes}
    if not new:
        return False
    names = ", ".join(repr(n) for nodes in new.values() for n in nodes)
    log.warning("amp_rewrite: the rewrite of %s failed its type check (%s); this is a bug in amp_rewrite, please "
                "report it with the graph.  Rewriting again with %s kept float32", exc.where, exc.reasons, names)
    for graph, nodes in new.items():
        kept.setdefault(graph, {}).update(nodes)
    return True


# The parameters' reference, appended to the docstring (help() and the API docs show the
# whole): kept here so that the function itself stays short enough to read.
rewrite_graph_def.__doc__ = (rewrite_graph_def.__doc__ or "").replace("    Returns\n", _PARAMETERS_DOC + "    Returns\n", 1)


def _rewrite_graph_def(
    graph_def: Any,
    *,
    target: str | Target,
    precision: Precision,
    lists: str | os.PathLike[str],
    lists_file: str | os.PathLike[str] | None,
    fetches: Sequence[str] | None,
    add: Mapping[str, Iterable[str] | str] | None,
    remove: Mapping[str, Iterable[str] | str] | None,
    level: str | None,
    exclude: str | Sequence[str] | None,
    functions: str,
    tensorflow_bugs: bool,
    use_env: bool,
    registry: OpRegistry | None,
    planner: str | None = None,
    variable_shapes: Mapping[str, Sequence[int | None] | None] | None = None,
    compiled: bool = False,
    keep_float32: Collection[str] | None = None,
    declined: str | None = None,
    price_step: bool = False,
    kept: Mapping[str, Mapping[str, str]] | None = None,
) -> RewriteResult:
    """:func:`rewrite_graph_def`, once.  ``kept``: per graph (``""``, a function's name), nodes
    an earlier try's type check kept float32, with their reasons."""
    kept = kept or {}
    check_optional_str("declined", declined, what="a reason or None")
    check_bool("price_step", price_step)
    graph_def, fetches = _checked_arguments(graph_def, compiled, tensorflow_bugs, use_env, functions, planner,
                                            fetches, registry)
    # The ops applying a loss scale stay float32 whatever the caller passed (LOSS_SCALE_SCOPE
    # says why): a training graph may reach this through any path (a session, a .meta file).
    scale_ops = loss_scale_scope_nodes(graph_def)
    if scale_ops:
        keep_float32 = sorted(scale_ops | set(keep_float32 or ()))
    registry = registry or default_registry()
    t_lists = time.perf_counter()
    tgt, precision, precision_reason, op_lists, lvl = _target_and_lists(
        target, precision, lists, lists_file, add, remove, level, use_env)
    excluder = NameMatcher.compile(exclude)
    scope_keep = frozenset(keep_float32 or ())
    excluded_counts = dict.fromkeys((text for text, _ in excluder.patterns), 0)

    chosen_planner = planner if planner is not None else op_lists.planner
    if chosen_planner not in PLANNERS:
        raise AmpRewriteError(f"planner must be one of {', '.join(PLANNERS)}, not {chosen_planner!r}")
    optimal = chosen_planner != "greedy"
    if declined is not None and not optimal:
        raise AmpRewriteError("declined needs a cost-aware planner ('optimal' or 'min-casts'); the greedy "
                              "planner converts what its lists say")
    if price_step and not optimal:
        # The greedy planner's import infers no shapes, and its plans must not depend on
        # whether the caller asked for prices (the normalization rule reads shapes it is given).
        raise AmpRewriteError("price_step needs a cost-aware planner ('optimal' or 'min-casts'); price a "
                              "greedy rewrite's input and output with estimate_step_time")
    if functions not in ("all", "reachable"):
        raise AmpRewriteError(f"functions must be 'all' or 'reachable', not {functions!r}")
    clock = time.perf_counter
    timings = dict.fromkeys(("lists", "import", "decide", "rewrite", "check", "export"), 0.0)
    t0 = clock()
    timings["lists"] = t0 - t_lists
    imported = _import(graph_def, registry, functions,
                       True if optimal else (lambda graphs: _profile_reads_shapes(op_lists, graphs)),
                       variable_shapes)
    ir_graphs = [imported.graph, *imported.functions.values()]  # to free at the end
    g = imported.graph
    preserve = preserved_nodes(g, fetches)
    if fetches is not None:
        g.graph["fetches"] = frozenset(preserve)  # what runs, for the cost model's step estimates
    t_price = clock()
    pricing = _StepPricing(imported, tgt, precision, registry, compiled) if price_step else None
    if pricing is not None:
        timings["price"] = clock() - t_price
    preserve |= scope_keep & set(g.nodes)
    excluded = excluded_nodes(g.nodes, excluder, preserve, excluded_counts)
    excluded.update(_still_kept(kept.get("", {}), g, preserve))
    preserve |= excluded.keys()

    options = _decide_options(lvl, preserve, excluded, tensorflow_bugs, chosen_planner, compiled, op_lists,
                              declined)
    plans: dict[str, Plan] = {}
    stats: dict[str, RewriteStats] = {}
    timings["import"] += clock() - t0 - timings.get("price", 0.0)
    if optimal and op_lists.hoist_loop_casts and not tensorflow_bugs:
        _mark_loop_invariants(imported, registry)
    stage = _Stage(op_lists, tgt, precision, registry, _placement(chosen_planner), not tensorflow_bugs, timings)
    plans[""], stats[""] = stage.run(g, options)
    skipped_functions = _rewrite_functions(imported, stage, options, excluder, scope_keep, excluded_counts,
                                           plans, stats, kept)
    hoisted = _hoist(imported, op_lists, tensorflow_bugs, registry, timings)
    step_estimates = None
    if pricing is not None:
        t_price = clock()
        step_estimates = pricing.estimates(imported)
        timings["price"] += clock() - t_price
    t3 = clock()
    out = export_graph_def(imported, registry)
    timings["export"] += clock() - t3
    report = build_report(
        imported, plans, stats, target=tgt, precision=precision, lists=op_lists, level=lvl,
        skipped_functions=skipped_functions,
    )
    report["precision_reason"] = precision_reason
    if hoisted:
        report["hoisted_casts"] = [h.as_dict() for h in hoisted]
    if excluder:
        report["excluded"] = excluded_counts
    # Free the IR now, by reference counting.  networkx graphs cache their views (g.nodes,
    # g.succ...), which point back at the graph: left alone, the IR would be a reference
    # cycle of hundreds of thousands of objects that the cyclic collector has to walk (and
    # free) once it runs again -- a fifth of the whole run on large graphs.  Nothing returned
    # refers to these graphs.
    for ir_graph in ir_graphs:
        ir_graph.clear()
    _log_outcome(report, precision, precision_reason, tgt, op_lists)
    converted = {name: frozenset(n for n, _ in s.converted) for name, s in stats.items()}
    return RewriteResult(out, report, plans, timings, converted, step_estimates)


def _mark_loop_invariants(imported: Any, registry: OpRegistry) -> None:
    """Tell the cost-aware planner which tensors of each loop body the rewrite will cast once,
    before the loop (:func:`~amp_rewrite.loop_hoist.loop_invariant_tensors`, as each body's
    ``loop_invariant`` graph attribute).  **Mutates** the bodies' graph attributes."""
    invariants = loop_invariant_tensors(
        imported.graph, imported.functions, registry,
        called_elsewhere=functions_named_outside(imported.source, set(imported.functions)))
    for fname, tensors in invariants.items():
        imported.functions[fname].graph["loop_invariant"] = tensors


def _hoist(imported: Any, op_lists: OpLists, tensorflow_bugs: bool, registry: OpRegistry,
           timings: dict[str, float]) -> list[HoistedCast]:
    """Hoist the rewrite's loop-invariant Casts out of loop bodies where the profile asks for it
    (its ``[loops]`` table) and TensorFlow's own graph was not asked for (``tensorflow_bugs``),
    adding the time to ``timings["rewrite"]``.  **Mutates** ``imported``'s IR."""
    if not op_lists.hoist_loop_casts or tensorflow_bugs:
        return []
    t0 = time.perf_counter()
    hoisted = hoist_loop_invariant_casts(
        imported.graph, imported.functions, registry,
        called_elsewhere=functions_named_outside(imported.source, set(imported.functions)))
    timings["rewrite"] += time.perf_counter() - t0
    return hoisted


class _StepPricing:
    """The whole step of an imported graph priced as given (at construction, before any stage
    changes the IR), and again once rewritten (:meth:`estimates`), with the same call counts:
    a rewrite changes types and adds Casts, never calls or loop trips.  A function the rewrite
    skipped is exported as given, so it keeps its price as given.  Where the step cannot be
    priced (a graph the model does not expect), the estimates are ``None``, with a WARNING:
    the rewrite itself stands."""

    def __init__(self, imported: Any, target: Target, precision: Precision, registry: OpRegistry,
                 compiled: bool) -> None:
        self._args = (device_costs(target, precision), registry)
        self._compiled = compiled
        self._given: dict[str, StepEstimate] | None = None
        try:
            self._counts = call_counts(imported.graph, imported.functions, registry)
            self._given = estimate_parts(imported.graph, imported.functions, *self._args, compiled=compiled,
                                         counts=self._counts)
        except Exception as exc:  # noqa: BLE001  (pricing is an extra: the rewrite goes on)
            _price_failed(exc)

    def estimates(self, rewritten: Any) -> StepEstimates | None:
        """The estimates of the step as given and as ``rewritten`` (the same import, after the
        stages), or ``None`` where it could not be priced.  Reads ``rewritten`` only."""
        if self._given is None:
            return None
        try:
            parts = estimate_parts(rewritten.graph, rewritten.functions, *self._args, compiled=self._compiled,
                                   counts=self._counts)
        except Exception as exc:  # noqa: BLE001
            _price_failed(exc)
            return None
        # In the given order, so that the sums are those estimate_step_time makes of the output.
        return StepEstimates(total_of(self._given),
                             total_of({name: parts.get(name, part) for name, part in self._given.items()}))


def _price_failed(exc: BaseException) -> None:
    log.warning("amp_rewrite: the step was rewritten but could not be priced (price_step): %s: %s",
                type(exc).__name__, exc)


def _rewrite_functions(imported: Any, stage: _Stage, options: DecideOptions, excluder: NameMatcher,
                       scope_keep: frozenset[str], excluded_counts: dict[str, int],
                       plans: dict[str, Plan], stats: dict[str, RewriteStats],
                       kept: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """Decide and rewrite every function of ``imported``, in name order, adding to ``plans``,
    ``stats`` and ``excluded_counts``; ``kept``: per function, nodes an earlier try's type
    check kept float32.  **Mutates** the functions' IR, and drops from ``imported.functions``
    each function that is not a valid graph.  Returns the skipped functions (name -> why),
    those import skipped included."""
    skipped_functions = dict(imported.skipped_functions)
    for fname in sorted(imported.functions):
        fg = imported.functions[fname]
        try:
            check_cycles(fg, f"function {fname}")
            keep = {n for n, d in fg.nodes(data=True) if d["synthetic"] == "retval"}
            keep |= {n for n in fg.graph["keep"] if n in fg}
            keep |= scope_keep & set(fg.nodes)
            f_excluded = excluded_nodes(fg.nodes, excluder, keep, excluded_counts)
            f_excluded.update(_still_kept(kept.get(fname, {}), fg, keep))
            keep |= f_excluded.keys()
            f_options = dataclasses.replace(options, preserve=frozenset(keep), preserve_reasons=f_excluded)
            plan, fstats = stage.run(fg, f_options)
        except InvalidGraphError as exc:
            # TensorFlow optimizes each function separately and keeps a function it cannot
            # optimize as it was; do the same, and say so in the report.
            log.warning("function %s left unchanged: %s", fname, exc)
            skipped_functions[fname] = str(exc)
            del imported.functions[fname]  # export then copies the original FunctionDef
            continue
        plans[fname] = plan
        stats[fname] = fstats
    return skipped_functions


def _decide_options(lvl: str, preserve: set[str], excluded: dict[str, str], tensorflow_bugs: bool,
                    planner: str, compiled: bool, op_lists: OpLists, declined: str | None = None) -> DecideOptions:
    """The main graph's :class:`DecideOptions`: normalization-aware where the profile runs a
    normalization's apply ops in low precision (its ``[normalization]`` table) and under the
    cost-aware planners (any ``planner`` but ``"greedy"``), fenced where the greedy passes
    keep them float32 but not what reads them (``apply = "fenced"``: the default profile and
    those extending it); ``declined`` as the caller gave it.  Pure."""
    optimal = planner != "greedy"
    return DecideOptions(force_all=lvl == "UNSAFE_FORCE_ALL", preserve=frozenset(preserve),
                         preserve_reasons=excluded,
                         tensorflow_bugs=tensorflow_bugs, planner=planner,  # type: ignore[arg-type]
                         normalization_aware=optimal or op_lists.normalization_apply == "low",
                         normalization_fenced=not optimal and op_lists.normalization_apply == "fenced",
                         compiled=compiled, declined=declined,
                         # Statistics stay float32 in every profile but TensorFlow's own
                         # (parity), also where the lists infer Mean (optimal, in bfloat16).
                         moments_float32=optimal or (op_lists.profile != "tensorflow"
                                                     and "Mean" not in op_lists.deny))


def _checked_arguments(graph_def: Any, compiled: object, tensorflow_bugs: object, use_env: object,
                       functions: object, planner: object, fetches: Sequence[str] | None,
                       registry: object) -> tuple[Any, list[str] | None]:
    """Check the arguments of :func:`rewrite_graph_def` that need no graph (raising
    :class:`AmpRewriteError` and its kinds), and return the GraphDef (parsed from bytes) and
    the checked fetches.  Pure."""
    if not isinstance(compiled, bool):
        raise AmpRewriteError(f"compiled must be True or False, not {compiled!r}")
    check_bool("tensorflow_bugs", tensorflow_bugs)
    check_bool("use_env", use_env)
    check_str("functions", functions, what="'all' or 'reachable'")
    check_optional_str("planner", planner, what="'greedy', 'optimal', 'min-casts' or None")
    fetches = check_names("fetches", fetches)
    if registry is not None and not (hasattr(registry, "op") and hasattr(registry, "kernels")):
        raise AmpRewriteError(f"registry must be an OpRegistry, not {type(registry).__name__}")
    if isinstance(graph_def, (bytes, bytearray)):
        graph_def = parse_graph_def(bytes(graph_def))
    elif not hasattr(graph_def, "node") or not hasattr(graph_def, "library"):
        raise AmpRewriteError(f"expected a GraphDef or its bytes, got {type(graph_def).__name__}")
    return graph_def, fetches


def _target_and_lists(target: str | Target, precision: str, lists: str | os.PathLike[str],
                      lists_file: str | os.PathLike[str] | None,
                      add: Mapping[str, Iterable[str] | str] | None,
                      remove: Mapping[str, Iterable[str] | str] | None,
                      level: str | None, use_env: bool) -> tuple[Target, Precision, str, OpLists, str]:
    """``(target, precision, why that precision, lists, level)`` of a call; reads the
    environment when ``use_env``."""
    tgt = resolve_target(target)
    if use_env and ignore_performance_from_environ(os.environ) and not tgt.ignore_performance:
        tgt = dataclasses.replace(tgt, ignore_performance=True,
                                  description=f"{tgt.description} (ignoring performance)")
    resolved, precision_reason = resolve_precision(precision, tgt)
    op_lists, lvl = resolve_lists(
        lists, target=tgt, precision=resolved, lists_file=lists_file, add=add, remove=remove,
        level=level, environ=os.environ if use_env else {},
    )
    return tgt, resolved, precision_reason, op_lists, lvl


def _profile_reads_shapes(op_lists: OpLists, graphs: Sequence[nx.MultiDiGraph]) -> bool:
    """Whether the greedy passes need static shapes for a rule of ``op_lists`` on ``graphs``
    (a graph and its functions, imported).  The normalization rule does, where it changes
    TensorFlow's painting (``[normalization] apply`` is not ``"float32"``) and some graph has
    a moment-based normalization: it leaves out normalizations over fewer than 16 values, and
    fences none upstream of a fragile one, and only shapes can tell.  The ``identity`` rule
    does, where some graph has a reduction it names: only shapes show that it reduces nothing.
    Shape inference imports the graph into TensorFlow (seconds on a large training step), so
    graphs without either skip it.  Reads ``graphs`` only."""
    if op_lists.identity and any(op in op_lists.identity for g in graphs for _, op in g.nodes(data="op")):
        return True
    if op_lists.normalization_apply == "float32":
        return False
    return any(find_normalizations(g).norms for g in graphs)


def _import(graph_def: Any, registry: OpRegistry, functions: str,
            shapes: bool | Callable[[Sequence[nx.MultiDiGraph]], bool],
            variable_shapes: Mapping[str, Sequence[int | None] | None] | None) -> Any:
    """Import ``graph_def`` (only the functions it calls, for ``functions="reachable"``),
    check the main graph's cycles, and where ``shapes`` says so (``True`` for the cost-aware
    planners; a function of the imported graphs, for a normalization rule that counts values:
    :func:`_profile_reads_shapes`) infer the shapes of the main graph and of every
    function.  Returns the imported graphs."""
    known_variables = check_variable_shapes(graph_def, variable_shapes)
    imported = import_graph_def(graph_def, registry)
    if functions == "reachable":
        keep = reachable_functions(graph_def)
        for fname in sorted(set(imported.functions) - keep):
            del imported.functions[fname]
    g = imported.graph
    check_cycles(g, "the graph")
    if shapes is True or (shapes and shapes([g, *imported.functions.values()])):
        # The cost model needs tensor sizes; TensorFlow's shape inference gives them.
        g.graph["shapes"] = graph_shapes(graph_def, known_variables, registry)
        fdefs = {f.signature.name: f for f in graph_def.library.function}
        bodies = loop_functions(graph_def)
        assign_function_shapes(imported.graph, imported.functions, fdefs, known_variables, registry)
        for fname, fg in imported.functions.items():
            fg.graph["loop_body"] = fname in bodies
    return imported


def estimate_step_time(
    graph_def: Any,
    *,
    target: str | Target,
    precision: Precision | str = "float16",
    compiled: bool = False,
    variable_shapes: Mapping[str, Sequence[int | None] | None] | None = None,
    registry: OpRegistry | None = None,
    costs: DeviceCosts | None = None,
    fetches: Sequence[str] | None = None,
) -> StepEstimate:
    """The cost model's estimate of one run of ``graph_def`` (and the functions it calls, a loop's
    body once per iteration) on ``target``, every node priced in the type it has
    (:mod:`amp_rewrite.plan.step_cost`): a float32 graph, a rewritten one, or one built in mixed
    precision.  ``precision`` picks the
    device class (bfloat16 and float16 price alike on a GPU); ``compiled``: the graph runs
    under XLA.  Without XLA a GPU's step takes the longer of its device time and the
    executor's host time per kernel (``StepEstimate.total_ns``).  ``costs`` prices every device with that class instead of the target's (what-if
    estimates, and calibration against a device whose rates differ from its family's: an
    H200 moves 4.3 TB/s where the Hopper class, an H100's, moves 3.0).  Only what runs is
    priced: a function's body without what neither its results nor its stateful ops need (as
    TensorFlow prunes it), and the main graph without what neither ``fetches`` (node or tensor
    names: a traced step's outputs) nor its stateful ops need; without ``fetches`` every node
    of the main graph counts.  Reads ``graph_def``, changes nothing; never runs it.

    Raises :class:`AmpRewriteError` for input that is not a valid graph, a bad target, or a
    fetch the graph does not have.
    """
    imported, costs_of, registry = _import_to_price(graph_def, target, precision, compiled, variable_shapes,
                                                    registry, costs, fetches)
    return estimate_graphs(imported.graph, imported.functions, costs_of, registry, compiled=compiled)


def _import_to_price(graph_def: Any, target: str | Target, precision: Precision | str, compiled: bool,
                     variable_shapes: Mapping[str, Sequence[int | None] | None] | None,
                     registry: OpRegistry | None, costs: DeviceCosts | None,
                     fetches: Sequence[str] | None) -> tuple[Any, Any, OpRegistry]:
    """The checked ``graph_def`` imported with shapes (and its main graph's ``fetches``), the
    device classes to price it with and the registry: what :func:`estimate_step_time` and
    :func:`estimate_node_times` share.  Raises :class:`AmpRewriteError`; reads ``graph_def``
    only."""
    graph_def, fetches = _checked_arguments(graph_def, compiled, False, False, "reachable", None, fetches, registry)
    registry = registry or default_registry()
    tgt = resolve_target(target)
    resolved, _ = resolve_precision(precision, tgt)
    imported = _import(graph_def, registry, "reachable", True, variable_shapes)
    if fetches is not None:
        imported.graph.graph["fetches"] = frozenset(preserved_nodes(imported.graph, fetches))
    return imported, device_costs(tgt, resolved, costs), registry


def estimate_node_times(
    graph_def: Any,
    *,
    target: str | Target,
    precision: Precision | str = "float16",
    compiled: bool = False,
    variable_shapes: Mapping[str, Sequence[int | None] | None] | None = None,
    registry: OpRegistry | None = None,
    costs: DeviceCosts | None = None,
    fetches: Sequence[str] | None = None,
) -> dict[str, dict[str, NodeTime]]:
    """:func:`estimate_step_time`, node by node: per graph (``""`` for the main graph, else a
    function's name) every priced node's :class:`~amp_rewrite.plan.step_cost.NodeTime` (op,
    kind, precision, estimated ns and the per-kernel fixed ns apart, output elements), per
    run of the step (a loop body's nodes times its iterations).  What a per-node calibration
    sets measured times against (``bench/calibrate_gpu_in_place.py``); a node that does not
    run is not priced.  Same arguments and errors; reads ``graph_def``, changes nothing; never
    runs it."""
    imported, costs_of, registry = _import_to_price(graph_def, target, precision, compiled, variable_shapes,
                                                    registry, costs, fetches)
    per_node: dict[str, dict[str, NodeTime]] = {}
    estimate_graphs(imported.graph, imported.functions, costs_of, registry, compiled=compiled, per_node=per_node)
    return per_node


@dataclass
class _Stage:
    """Decide and rewrite one graph after another with the same lists, target and planner,
    adding the seconds spent to ``timings`` (mutated)."""

    lists: OpLists
    target: Target
    precision: Precision
    registry: OpRegistry
    placement: Placement | None
    fold_casts: bool
    timings: dict[str, float]

    def run(self, g: nx.MultiDiGraph, options: DecideOptions) -> tuple[Plan, RewriteStats]:
        """Decide ``g``'s plan and carry it out.  **Mutates** ``g``.

        The optimal planner's plan is checked on the whole step
        (:func:`~amp_rewrite.step_check.checked_plan`), unless the caller declined it already."""
        t1 = time.perf_counter()
        painting = Painting(g, self.lists, self.target, self.precision, self.registry, options, self.placement)
        plan = painting.plan()
        if (plan.placement is not None and plan.placement.objective == "optimal" and options.declined is None
                and (plan.convert or options.compiled)):
            plan = checked_plan(g, painting, plan, self.target, self.registry, compiled=options.compiled,
                                fold_casts=self.fold_casts)
        t2 = time.perf_counter()
        self.timings["decide"] += t2 - t1
        stats = apply_plan(g, plan, fold_casts=self.fold_casts)
        t3 = time.perf_counter()
        self.timings["rewrite"] += t3 - t2
        if stats.converted or stats.casts:
            check_rewritten(g, plan.types, self.registry, parity=options.tensorflow_bugs)
        self.timings["check"] += time.perf_counter() - t3
        return plan, stats


def _still_kept(kept: Mapping[str, str], g: nx.MultiDiGraph, preserved: set[str]) -> dict[str, str]:
    """The nodes of ``kept`` (node -> reason) that ``g`` has and that are not ``preserved``
    already.  Pure."""
    return {name: reason for name, reason in kept.items() if name in g and name not in preserved}


def _log_outcome(report: Mapping[str, Any], precision: str, precision_reason: str, tgt: Target,
                 op_lists: OpLists) -> None:
    """Log what the call did (at info level)."""
    if report["skipped"]:
        log.info("amp_rewrite: graph unchanged: %s", report["skipped"])
    else:
        hoisted = len(report.get("hoisted_casts", ()))
        log.info(
            "amp_rewrite: converted %d of %d nodes to %s using %d cast(s) to %s and %d to float32%s "
            "(target %s, lists %s; %s: %s)",
            report["converted_nodes"], report["total_nodes"], precision, report["casts_to_low"],
            precision, report["casts_to_high"],
            f", {hoisted} of them hoisted out of loop bodies" if hoisted else "",
            tgt.description, op_lists.profile, precision, precision_reason,
        )
