"""Rewriting a model in memory: every selected graph of a :class:`~.formats.ModelFile` through
:func:`amp_rewrite.api.rewrite_graph_def`, with what the MetaGraphDef refers to preserved;
and marking a rewritten TF2 SavedModel's served functions for XLA (:func:`mark_for_xla`).
The input model is never modified."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Iterable, Mapping, Sequence

from ..api import Precision, RewriteResult, resolve_lists, resolve_target, rewrite_graph_def
from ..errors import AmpRewriteError
from ..graph.tensor_names import parse_graph_input
from ..graph.training_ops import float16_training_unscaled
from ..plan.targets import Target
from ..progress import Progress
from .formats import ModelFile
from .results import _COUNTS, GraphRewrite, ModelRewrite
from .signatures import (_check_signatures, _check_tensors_exist, _graph_outputs, _node_of, _preserved_nodes,
                         _select_meta_graphs, _signature_scope, _tensor_names)
from .summary import _model_report

# mark_for_xla logs under the name it always had (the CLI prints logger names).
log = logging.getLogger("amp_rewrite.models.saved_model")


def _restrict_to_functions(result: RewriteResult, before: Any, keep: set[str]) -> RewriteResult:
    """Undo the rewrite of every function not in ``keep`` and drop it from report and plans.

    Function signatures never change, so any mix of rewritten and original functions runs.
    Returns a new result; ``result`` is not modified.
    """
    gd = type(result.graph_def)()
    gd.CopyFrom(result.graph_def)
    originals = {f.signature.name: f for f in before.library.function}
    for i, fdef in enumerate(gd.library.function):
        name = fdef.signature.name
        if name not in keep and name in originals:
            gd.library.function[i].CopyFrom(originals[name])
    report = dict(result.report)
    functions = report["functions"]
    main = {k: report[k] - sum(f[k] for f in functions.values()) for k in _COUNTS}
    kept = {n: f for n, f in functions.items() if n in keep}
    for k in _COUNTS:
        report[k] = main[k] + sum(f[k] for f in kept.values())
    report["functions"] = kept
    report["skipped_functions"] = {n: r for n, r in report["skipped_functions"].items() if n in keep}
    if report["skipped"] is None and report["converted_attrs"] == 0:
        report["skipped"] = "nothing to convert in the selected signatures"
    plans = {n: p for n, p in result.plans.items() if n == "" or n in keep}
    converted = {n: c for n, c in result.converted.items() if n == "" or n in keep}
    return dataclasses.replace(result, graph_def=gd, report=report, plans=plans, converted=converted)


def _output_dtype(result: RewriteResult, tensor: str) -> int | None:
    """The dtype of a main-graph tensor after the rewrite, from the plan (``None`` if the
    node was not painted)."""
    ref = parse_graph_input(tensor)
    plan = result.plans.get("")
    if plan is None or ref.node not in plan.nodes or ref.node not in plan.types:
        return None
    outputs = plan.types[ref.node].outputs
    if ref.port >= len(outputs):
        return None
    ta = outputs[ref.port]
    if ta.is_fixed:
        return ta.fixed
    decision = plan.nodes[ref.node].attrs.get(ta)
    return None if decision is None else decision.dtype


def rewrite_model(
    model: ModelFile,
    *,
    target: str | Target = "auto",
    precision: Precision | str = "auto",
    lists: str | os.PathLike[str] = "default",
    lists_file: str | os.PathLike[str] | None = None,
    add: Mapping[str, Iterable[str] | str] | None = None,
    remove: Mapping[str, Iterable[str] | str] | None = None,
    level: str | None = None,
    exclude: str | Sequence[str] | None = None,
    fetches: Sequence[str] | None = None,
    tags: Sequence[str] | None = None,
    signatures: Sequence[str] | None = None,
    keep_io_types: bool = True,
    tensorflow_bugs: bool = False,
    use_env: bool = True,
    planner: str | None = None,
    progress: Progress | None = None,
    compiled: bool = False,
) -> ModelRewrite:
    """Rewrite every selected graph of ``model`` in memory.  ``model`` is not modified.

    ``tags`` selects the MetaGraphDefs of a SavedModel by their exact tag set (others are
    kept as they are).  ``signatures`` restricts the rewrite to what those signatures run:
    the library functions they call (directly or not), and, for TF1-style graphs whose
    signatures name main-graph tensors, the main-graph nodes they depend on; everything
    else is kept float32.  ``keep_io_types`` (default) keeps the dtypes of every signature
    input and output and of a frozen graph's outputs; without it outputs may become low
    precision and the signature defs are updated to match (TF2 function signatures never
    change).  ``fetches`` adds main-graph nodes to preserve.  The other options are
    :func:`~amp_rewrite.api.rewrite_graph_def`'s.

    Raises :class:`AmpRewriteError` (or a subclass) for unknown tags or signatures, broken
    signature tensors and everything ``rewrite_graph_def`` rejects.
    """
    tgt = resolve_target(target)
    op_lists, _ = resolve_lists(
        lists, target=tgt, precision=precision, lists_file=lists_file, add=add, remove=remove,
        level=level, environ=os.environ if use_env else {},
    )
    options: dict[str, Any] = dict(
        target=tgt, precision=precision, lists=lists, lists_file=lists_file, add=add, remove=remove,
        level=level, tensorflow_bugs=tensorflow_bugs, use_env=use_env, functions="all",
        planner=planner, compiled=compiled,
    )
    if model.format == "graph_def":
        if tags is not None:
            _select_meta_graphs(model, tags)  # raises: a GraphDef has no tags
        if signatures:
            _check_signatures(model, [], signatures)  # raises likewise
        graph = _rewrite_frozen_graph(model, options, exclude=exclude, fetches=fetches,
                                      keep_io_types=keep_io_types, progress=progress)
        return ModelRewrite(model, graph.result.graph_def, (graph,), _model_report(model, [graph]), op_lists, tgt)

    indices = _select_meta_graphs(model, tags)
    if signatures:
        _check_signatures(model, indices, signatures)
    message = type(model.message)()
    message.CopyFrom(model.message)
    graphs = _rewrite_meta_graphs(model, indices, message, options, exclude=exclude, fetches=fetches,
                                  signatures=signatures, keep_io_types=keep_io_types, progress=progress)
    return ModelRewrite(model, message, tuple(graphs), _model_report(model, graphs, message), op_lists, tgt)


def _rewrite_frozen_graph(model: ModelFile, options: Mapping[str, Any], *, exclude: str | Sequence[str] | None,
                          fetches: Sequence[str] | None, keep_io_types: bool,
                          progress: Progress | None) -> GraphRewrite:
    """:func:`rewrite_model` of a frozen GraphDef: its one graph, with the graph's outputs
    (unless not ``keep_io_types``) and ``fetches`` preserved.  ``options`` are
    :func:`~amp_rewrite.api.rewrite_graph_def`'s.  ``model`` is not modified."""
    if progress:
        progress.stage("rewriting the graph")
    if keep_io_types:
        # The graph's outputs keep their dtypes; fetches are preserved on top of them.
        keep = sorted(_graph_outputs(model.message) | set(fetches or ()))
    else:
        keep = list(fetches or ())  # TensorFlow's behaviour: only fetches are preserved
    result = rewrite_graph_def(model.message, exclude=exclude, fetches=keep, **options)
    preserved = frozenset(n for k in keep if (n := _node_of(k)))
    return GraphRewrite("graph", None, (), model.message, result, preserved)


def _rewrite_meta_graphs(model: ModelFile, indices: Sequence[int], message: Any, options: Mapping[str, Any], *,
                         exclude: str | Sequence[str] | None, fetches: Sequence[str] | None,
                         signatures: Sequence[str] | None, keep_io_types: bool,
                         progress: Progress | None) -> list[GraphRewrite]:
    """:func:`rewrite_model` of the MetaGraphDefs ``indices`` of a SavedModel or ``.meta``:
    each rewritten graph replaces its graph in ``message`` (a copy of ``model.message``,
    which this mutates; with ``keep_io_types`` off, the signature outputs' dtypes too).
    Returns one :class:`GraphRewrite` per index.  ``model`` is not modified."""
    metas_out = list(message.meta_graphs) if model.format == "saved_model" else [message]
    graphs: list[GraphRewrite] = []
    for step, i in enumerate(indices):
        meta = model.meta_graphs[i]
        tags_i = tuple(meta.meta_info_def.tags)
        label = "graph" if model.format == "meta_graph" else f"meta graph {i} [{','.join(tags_i)}]"
        if progress:
            progress.stage(f"rewriting {label}", step, len(indices))
        _check_tensors_exist(meta, model.path)
        preserve = _preserved_nodes(meta, keep_io_types, fetches)
        scope_keep: set[str] | None = None
        keep_functions = None
        if signatures:
            keep_functions, scope_keep = _signature_scope(meta, signatures)
        result = rewrite_graph_def(meta.graph_def, fetches=sorted(preserve), exclude=exclude,
                                   keep_float32=scope_keep, **options)
        if keep_functions is not None:
            result = _restrict_to_functions(result, meta.graph_def, keep_functions)
        out_meta = metas_out[i]
        out_meta.graph_def.CopyFrom(result.graph_def)
        if not keep_io_types:
            _update_output_dtypes(out_meta, result)
        graphs.append(GraphRewrite(label, i, tags_i, meta.graph_def, result, frozenset(preserve)))
        _warn_if_training_without_loss_scaling(label, meta.graph_def, result.report)
    if progress:
        progress.stage("rewrote the model", len(indices), len(indices))
    return graphs


def _warn_if_training_without_loss_scaling(label: str, graph_def: Any, report: Mapping[str, Any]) -> None:
    """One WARNING where ``graph_def`` (a model's graph before the rewrite) trains -- updates
    variables from gradients, as an exported TF1 training graph does -- and the rewrite put it
    in float16 without anything scaling its loss: trained so, gradients below float16's
    smallest value become 0.  Pure but for the log."""
    if not float16_training_unscaled(report, graph_def):
        return
    log.warning("amp_rewrite: %s trains (it updates variables from gradients) and was rewritten to float16 without "
                "loss scaling: gradients smaller than float16's smallest value (6e-8) become 0 when it trains; "
                "rewrite it with loss scaling (amp-rewrite rewrite --loss-scale dynamic, or "
                "amp_rewrite.rewrite_training_meta_graph), or to bfloat16", label)


def _update_output_dtypes(meta: Any, result: RewriteResult) -> None:
    """Set each dense signature output's dtype to what the rewrite made it.  Mutates ``meta``."""
    for sig in meta.signature_def.values():
        for info in sig.outputs.values():
            if info.WhichOneof("encoding") == "name":
                new = _output_dtype(result, info.name)
                if new is not None and new != info.dtype:
                    info.dtype = new


#: FunctionDef attributes ``tf.function(jit_compile=True)`` sets: compile with XLA, and never
#: inline the function into an uncompiled caller (which would drop the compilation).
_XLA_ATTRS = ("_XlaMustCompile", "_noinline")


def mark_for_xla(rewrite: ModelRewrite, signatures: Sequence[str] | None = None,
                 graphs: Sequence[GraphRewrite] | None = None) -> dict[str, list[str]]:
    """Mark the functions a rewritten TF2 SavedModel serves for XLA compilation.

    In every rewritten MetaGraphDef of ``rewrite``, the function each signature's outputs
    come from (the main graph's ``StatefulPartitionedCall``/``PartitionedCall`` into the
    library) gets ``_XlaMustCompile=true`` and ``_noinline=true``, as
    ``tf.function(jit_compile=True)`` sets them; so do the concrete functions of the object
    graph's ``tf.function`` endpoints (``model.export``'s ``serve``), unless ``signatures``
    restricts the marking to those signatures.  Functions they call are compiled as part of
    them.  Signatures whose key starts with ``__`` (``__saved_model_init_op``) are not
    served.  Mutates ``rewrite.message`` (the new message, never the input's) and returns,
    per graph label, the marked function names, sorted.

    ``graphs`` names the MetaGraphDefs to mark (their ``label`` and ``index``), by default
    ``rewrite.graphs``: a model kept unchanged (:func:`_unchanged` with ``copy=True``, which
    has none) is marked with those of a rewrite of the same model.

    Assumes the rewrite kept function names (it does).  XLA compiles a marked function when
    it is first called: one with an op XLA has no kernel for fails then, not here.

    Raises
    ------
    AmpRewriteError
        If a rewritten MetaGraphDef has no such function (a TF1-style graph, whose
        signatures name main-graph tensors run by a Session).
    """
    message = rewrite.message
    metas = list(message.meta_graphs) if rewrite.source.format == "saved_model" else [message]
    if message is rewrite.source.message:
        raise AmpRewriteError("internal error: refusing to mark the input model's own message for XLA")
    out: dict[str, list[str]] = {}
    for graph in rewrite.graphs if graphs is None else graphs:
        meta = metas[graph.index if graph.index is not None else 0]
        nodes = {n.name: n for n in meta.graph_def.node}
        names: set[str] = set()
        for key, sig in meta.signature_def.items():
            if key.startswith("__") or (signatures and key not in signatures):
                continue
            for info in sig.outputs.values():
                for tensor in _tensor_names(info):
                    node = nodes.get(_node_of(tensor) or "")
                    if node is not None and node.op in ("StatefulPartitionedCall", "PartitionedCall"):
                        names.add(node.attr["f"].func.name)
        if not signatures and meta.HasField("object_graph_def"):
            for obj in meta.object_graph_def.nodes:
                if obj.WhichOneof("kind") == "function":
                    names.update(obj.function.concrete_functions)
        library = {f.signature.name: f for f in meta.graph_def.library.function}
        names &= set(library)
        if not names:
            raise AmpRewriteError(
                f"--xla: {graph.label} has no signature function to compile (its signatures name "
                "main-graph tensors, run by a TF1 Session); XLA marking needs a TF2 SavedModel")
        for name in sorted(names):
            for attr in _XLA_ATTRS:
                library[name].attr[attr].b = True
        out[graph.label] = sorted(names)
    log.info("marked for XLA: %s", "; ".join(f"{k}: {', '.join(v)}" for k, v in out.items()))
    return out


def _unchanged(model: ModelFile, reference: ModelRewrite, reason: str, *, copy: bool = False) -> ModelRewrite:
    """``model`` as it is, as a :class:`ModelRewrite` whose report says why: settings and
    node count from ``reference`` (a rewrite of the same model), no conversions, no casts.
    Its message is the input's own unless ``copy`` (then a copy, which may be changed: marked
    for XLA)."""
    report = {k: v for k, v in reference.report.items() if k != "graphs"}
    report.update({k: 0 for k in _COUNTS if k != "total_nodes"}, skipped=reason, graphs=[])
    # The signatures run the float32 model: the reference's totals, nothing converted.
    report["signatures"] = {key: {**row, "converted": 0, "casts_to_low": 0, "casts_to_high": 0,
                                  "by_op": {op: {**c, "converted": 0} for op, c in row["by_op"].items()}}
                            for key, row in reference.report.get("signatures", {}).items()}
    message = model.message
    if copy:
        message = type(model.message)()
        message.CopyFrom(model.message)
    return ModelRewrite(model, message, (), report, reference.lists, reference.target)
