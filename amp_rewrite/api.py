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
from typing import Any, Collection, Iterable, Iterator, Literal, Mapping, Sequence

import networkx as nx

from .plan.painter import DecideOptions, Plan, decide
from .errors import AmpRewriteError, InvalidGraphError, ListError, TargetError
from .plan.exclude import NameMatcher, keras_scoped
from .graph.io import export_graph_def, import_graph_def, loop_functions, parse_graph_def, reachable_functions
from .plan.lists import PLANNERS, ListContext, ListEdit, OpLists, edits_from_environ, load_lists, tf_major_minor
from .graph.op_registry import OpRegistry, default_registry
from .report.build import build_report
from .rewrite import RewriteStats, apply_plan
from .graph.shapes import check_variable_shapes, function_shapes, graph_shapes
from .option_types import (check_bool, check_list_edits, check_names, check_optional_str, check_path,
                           check_str)
from .plan.targets import Target, detect_target, parse_target, resolve_precision
from .graph.tensor_names import node_name

__all__ = ["RewriteResult", "rewrite_graph_def", "resolve_lists", "resolve_target", "installed_tf_version",
           "tensorflow_lists_version"]

log = logging.getLogger(__name__)

Precision = Literal["float16", "bfloat16"]


@dataclass(frozen=True)
class RewriteResult:
    """The rewritten GraphDef, the JSON-ready report, and the plan of every graph.

    ``plans`` maps ``""`` (the main graph) and each rewritten function name to its plan.
    """

    graph_def: Any
    report: dict[str, Any]
    plans: Mapping[str, Plan] = field(default_factory=dict)
    #: Seconds per stage (``lists``, ``import``, ``decide``, ``rewrite``, ``export``); kept out of
    #: the report so the report stays byte-identical across runs.
    timings: Mapping[str, float] = field(default_factory=dict)
    #: The nodes with at least one type attribute converted, per graph (``""`` and function
    #: names, as ``plans``): what per-signature summaries count
    #: (:func:`amp_rewrite.models.saved_model.signature_summaries`).
    converted: Mapping[str, frozenset[str]] = field(default_factory=dict)


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


def _check_cycles(g: nx.MultiDiGraph, where: str) -> None:
    """Raise unless every cycle of ``g`` goes through a NextIteration node.  Reads ``g``.

    One pass in node order marks *settled* every node whose inputs (but loop back edges,
    NextIteration's out-edges) are all settled already: such a node has only settled
    ancestors, so it lies on no forbidden cycle.  TensorFlow writes nodes in creation order,
    so nearly every node settles; the few left (a node listed before one of its inputs) go
    through Kahn's algorithm, and only if that finds a cycle does the full check below run,
    for its error message.  Linear in nodes + edges.
    """
    nodes = g._node  # networkx's dicts, read directly: the views cost a call per item
    settled: set[str] = set()
    left: list[str] = []
    for v, preds in g._pred.items():
        for u in preds:
            if u not in settled and nodes[u]["op"] != "NextIteration":
                left.append(v)
                break
        else:
            settled.add(v)
    if not left:
        return
    # Kahn's algorithm on the nodes left, counting only edges between them.
    pending = set(left)
    indegree = dict.fromkeys(left, 0)
    for v in left:
        for u, keyed in g._pred[v].items():
            if u in pending and nodes[u]["op"] != "NextIteration":
                indegree[v] += len(keyed)
    ready = [v for v in left if indegree[v] == 0]
    done = 0
    while ready:
        u = ready.pop()
        done += 1
        if nodes[u]["op"] == "NextIteration":
            continue
        for v, keyed in g._succ[u].items():
            if v in pending:
                indegree[v] -= len(keyed)
                if indegree[v] == 0:
                    ready.append(v)
    if done < len(left):
        _check_cycles_full(g, where)


def _check_cycles_full(g: nx.MultiDiGraph, where: str) -> None:
    """Raise unless every cycle of ``g`` goes through a NextIteration node.

    Kahn's algorithm on the graph without NextIteration's out-edges (loop back edges); the
    nodes left over all lie on or behind a forbidden cycle.  Linear in nodes + edges.
    """
    # Reads networkx's adjacency dicts directly (read-only): the public views cost a Python
    # call per item, several times the work done here.
    succ = g._succ
    nodes = g._node
    indegree = dict.fromkeys(nodes, 0)
    ops = {n: d["op"] for n, d in nodes.items()}
    for u, nbrs in succ.items():
        if ops[u] == "NextIteration":
            continue
        for v, keyed in nbrs.items():
            indegree[v] += len(keyed)
    ready = [n for n, k in indegree.items() if k == 0]
    seen = 0
    while ready:
        u = ready.pop()
        seen += 1
        if ops[u] == "NextIteration":
            continue
        for v, keyed in succ[u].items():
            indegree[v] -= len(keyed)
            if indegree[v] == 0:
                ready.append(v)
    if seen == len(indegree):
        return
    stuck = {n for n, k in indegree.items() if k > 0}
    view = nx.subgraph_view(
        g, filter_node=stuck.__contains__, filter_edge=lambda u, v, k: ops[u] != "NextIteration"
    )
    cycle = nx.find_cycle(view)
    names = " -> ".join(repr(u) for u, *_ in cycle[:8])
    raise InvalidGraphError(
        f"{where} has a cycle not closed by a NextIteration node: {names}", node=cycle[0][0]
    )


def _excluded(names: Iterable[str], excluder: NameMatcher, already: set[str],
              counts: dict[str, int]) -> dict[str, str]:
    """``{node: reason}`` for the nodes of ``names`` that ``excluder`` matches and that are
    not preserved ``already`` (a fetched node keeps the generic reason: it would be kept
    anyway).  Adds each match to ``counts[pattern]``, preserved already or not, so the
    report says what every pattern matched."""
    out: dict[str, str] = {}
    if not excluder:
        return out
    names = list(names)
    keras3 = keras_scoped(names)  # Keras 3 traces spell layer scopes with a _N suffix
    for name in names:
        hit = excluder.match(name, keras3)
        if hit is None:
            continue
        counts[hit[0]] += 1
        if name not in already:
            out[name] = excluder.reason(name, keras3) or ""
    return out


def _default_preserve(g: nx.MultiDiGraph) -> set[str]:
    """Graph outputs when no fetches are given: nodes nothing reads from."""
    return {n for n, nbrs in g._succ.items() if not nbrs}  # read-only use of networkx's dicts


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
) -> RewriteResult:
    """Rewrite a GraphDef (and its function library) to mixed precision.

    Parameters
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
        report's ``excluded`` maps each pattern to the number of nodes it matched.
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

    Returns
    -------
    RewriteResult
        ``.graph_def`` (a new GraphDef) and ``.report`` (a JSON-serializable dict).

    Raises
    ------
    AmpRewriteError
        For input that is not a valid graph, unknown lists or ops, or a bad target.
    """
    with _gc_paused():
        return _rewrite_graph_def(
            graph_def, target=target, precision=precision, lists=lists, lists_file=lists_file,
            fetches=fetches, add=add, remove=remove, level=level, exclude=exclude,
            functions=functions, tensorflow_bugs=tensorflow_bugs, use_env=use_env, registry=registry,
            planner=planner, variable_shapes=variable_shapes, compiled=compiled,
            keep_float32=keep_float32,
        )


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
) -> RewriteResult:
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
    registry = registry or default_registry()
    t_lists = time.perf_counter()
    tgt = resolve_target(target)
    if use_env and ignore_performance_from_environ(os.environ) and not tgt.ignore_performance:
        tgt = dataclasses.replace(tgt, ignore_performance=True,
                                  description=f"{tgt.description} (ignoring performance)")
    precision, precision_reason = resolve_precision(precision, tgt)
    op_lists, lvl = resolve_lists(
        lists, target=tgt, precision=precision, lists_file=lists_file, add=add, remove=remove,
        level=level, environ=os.environ if use_env else {},
    )
    excluder = NameMatcher.compile(exclude)
    scope_keep = frozenset(keep_float32 or ())
    excluded_counts = dict.fromkeys((text for text, _ in excluder.patterns), 0)

    chosen_planner = planner if planner is not None else op_lists.planner
    if chosen_planner not in PLANNERS:
        raise AmpRewriteError(f"planner must be one of {', '.join(PLANNERS)}, not {chosen_planner!r}")
    optimal = chosen_planner != "greedy"
    if functions not in ("all", "reachable"):
        raise AmpRewriteError(f"functions must be 'all' or 'reachable', not {functions!r}")
    clock = time.perf_counter
    timings = dict.fromkeys(("lists", "import", "decide", "rewrite", "export"), 0.0)
    t0 = clock()
    timings["lists"] = t0 - t_lists
    known_variables = check_variable_shapes(graph_def, variable_shapes)
    imported = import_graph_def(graph_def, registry)
    ir_graphs = [imported.graph, *imported.functions.values()]  # to free at the end
    if functions == "reachable":
        keep = reachable_functions(graph_def)
        for fname in sorted(set(imported.functions) - keep):
            del imported.functions[fname]
    g = imported.graph
    _check_cycles(g, "the graph")
    if optimal:
        # The cost model needs tensor sizes; TensorFlow's shape inference gives them.
        g.graph["shapes"] = graph_shapes(graph_def, known_variables, registry)
        fdefs = {f.signature.name: f for f in graph_def.library.function}
        bodies = loop_functions(graph_def)
        for fname, fg in imported.functions.items():
            fg.graph["shapes"] = function_shapes(fdefs[fname], registry) if fname in fdefs else {}
            fg.graph["loop_body"] = fname in bodies
    if fetches is None:
        preserve = _default_preserve(g)
    else:
        preserve = set()
        for f in fetches:
            try:
                name = node_name(f)
            except ValueError:
                raise InvalidGraphError(f"bad fetch name {f!r}") from None
            if name not in g:
                raise InvalidGraphError(f"fetch {f!r} names a node that does not exist", node=name)
            preserve.add(name)
    preserve |= scope_keep & set(g.nodes)
    excluded = _excluded(g.nodes, excluder, preserve, excluded_counts)
    preserve |= excluded.keys()

    options = DecideOptions(force_all=lvl == "UNSAFE_FORCE_ALL", preserve=frozenset(preserve),
                            preserve_reasons=excluded,
                            tensorflow_bugs=tensorflow_bugs, planner=chosen_planner,  # type: ignore[arg-type]
                            normalization_aware=optimal, compiled=compiled,
                            # Statistics stay float32 in every profile but TensorFlow's own
                            # (parity), also where the lists infer Mean (optimal, in bfloat16).
                            moments_float32=optimal or (op_lists.profile != "tensorflow"
                                                        and "Mean" not in op_lists.deny))
    plans: dict[str, Plan] = {}
    stats: dict[str, RewriteStats] = {}
    t1 = clock()
    timings["import"] += t1 - t0
    plans[""] = decide(g, op_lists, tgt, precision, registry, options)
    t2 = clock()
    timings["decide"] += t2 - t1
    stats[""] = apply_plan(g, plans[""], fold_casts=not tensorflow_bugs)
    timings["rewrite"] += clock() - t2
    skipped_functions = dict(imported.skipped_functions)
    for fname in sorted(imported.functions):
        fg = imported.functions[fname]
        try:
            _check_cycles(fg, f"function {fname}")
            keep = {n for n, d in fg.nodes(data=True) if d["synthetic"] == "retval"}
            keep |= {n for n in fg.graph["keep"] if n in fg}
            keep |= scope_keep & set(fg.nodes)
            f_excluded = _excluded(fg.nodes, excluder, keep, excluded_counts)
            keep |= f_excluded.keys()
            f_options = dataclasses.replace(options, preserve=frozenset(keep), preserve_reasons=f_excluded)
            t1 = clock()
            plan = decide(fg, op_lists, tgt, precision, registry, f_options)
            t2 = clock()
            timings["decide"] += t2 - t1
            fstats = apply_plan(fg, plan, fold_casts=not tensorflow_bugs)
            timings["rewrite"] += clock() - t2
        except InvalidGraphError as exc:
            # TensorFlow optimizes each function separately and keeps a function it cannot
            # optimize as it was; do the same, and say so in the report.
            log.warning("function %s left unchanged: %s", fname, exc)
            skipped_functions[fname] = str(exc)
            del imported.functions[fname]  # export then copies the original FunctionDef
            continue
        plans[fname] = plan
        stats[fname] = fstats
    t3 = clock()
    out = export_graph_def(imported, registry)
    timings["export"] += clock() - t3
    report = build_report(
        imported, plans, stats, target=tgt, precision=precision, lists=op_lists, level=lvl,
        skipped_functions=skipped_functions,
    )
    report["precision_reason"] = precision_reason
    if excluder:
        report["excluded"] = excluded_counts
    # Free the IR now, by reference counting.  networkx graphs cache their views (g.nodes,
    # g.succ...), which point back at the graph: left alone, the IR would be a reference
    # cycle of hundreds of thousands of objects that the cyclic collector has to walk (and
    # free) once it runs again -- a fifth of the whole run on large graphs.  Nothing returned
    # refers to these graphs.
    for ir_graph in ir_graphs:
        ir_graph.clear()
    if report["skipped"]:
        log.info("amp_rewrite: graph unchanged: %s", report["skipped"])
    else:
        log.info(
            "amp_rewrite: converted %d of %d nodes to %s using %d cast(s) to %s and %d to float32 "
            "(target %s, lists %s; %s: %s)",
            report["converted_nodes"], report["total_nodes"], precision, report["casts_to_low"],
            precision, report["casts_to_high"], tgt.description, op_lists.profile, precision,
            precision_reason,
        )
    converted = {name: frozenset(n for n, _ in s.converted) for name, s in stats.items()}
    return RewriteResult(out, report, plans, timings, converted)
