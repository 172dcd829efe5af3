"""Summaries of a rewritten model: the JSON report of a model, the per-signature counts, and
the one-line and table forms the CLI prints.  Everything here is pure: it reads the input
GraphDef, the core's results and reports, and returns new values."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from ..api import RewriteResult
from .formats import ModelFile
from .results import _COUNTS, GraphRewrite
from .signatures import _closure, _node_of, _tensor_names


def _signatures_summary(meta: Any) -> dict[str, Any]:
    """``{signature: {"inputs": {key: dtype}, "outputs": {key: dtype}}}`` for the report."""
    from tensorflow.core.framework import types_pb2

    def dtype(info: Any) -> str:
        return types_pb2.DataType.Name(info.dtype).removeprefix("DT_").lower() if info.dtype else "composite"

    return {
        key: {
            "method": sig.method_name,
            "inputs": {k: dtype(v) for k, v in sorted(sig.inputs.items())},
            "outputs": {k: dtype(v) for k, v in sorted(sig.outputs.items())},
        }
        for key, sig in sorted(meta.signature_def.items())
    }


#: Row names of :func:`scope_summaries` besides the signature keys.
SAVE_RESTORE_ROW = "(save/restore)"


OTHER_ROW = "(other)"


GRAPH_ROW = "(graph)"


def _scope_counts(before: Any, result: RewriteResult, main_nodes: Iterable[str], functions: Iterable[str],
                  kind: str, function: str | None = None) -> dict[str, Any]:
    """Counts for the part of one rewritten graph that runs ``main_nodes`` (main-graph node
    names) and ``functions`` (library function names): nodes converted and in all, per op
    type, and the Casts the rewrite added there.  Pure."""
    by_op: dict[str, dict[str, int]] = {}
    converted = total = 0

    def tally(node_defs: Iterable[Any], done: frozenset[str]) -> None:
        nonlocal converted, total
        for nd in node_defs:
            counts = by_op.get(nd.op)
            if counts is None:
                counts = by_op[nd.op] = {"converted": 0, "total": 0}
            counts["total"] += 1
            total += 1
            if nd.name in done:
                counts["converted"] += 1
                converted += 1

    main = set(main_nodes)
    tally((nd for nd in before.node if nd.name in main), result.converted.get("", frozenset()))
    fdefs = {f.signature.name: f for f in before.library.function}
    names = sorted(f for f in functions if f in fdefs)
    to_low = to_high = 0
    for cast in result.report.get("casts", ()):
        if cast["source"].rpartition(":")[0] in main:
            to_high += cast["dtype"] == "float32"
            to_low += cast["dtype"] != "float32"
    sections = result.report.get("functions", {})
    for fname in names:
        tally(fdefs[fname].node_def, result.converted.get(fname, frozenset()))
        to_low += sections.get(fname, {}).get("casts_to_low", 0)
        to_high += sections.get(fname, {}).get("casts_to_high", 0)
    return {
        "kind": kind,
        "function": function,
        "functions": names,
        "converted": converted,
        "total": total,
        "casts_to_low": to_low,
        "casts_to_high": to_high,
        "by_op": dict(sorted(by_op.items())),
    }


def _reach(graph_def: Any, roots: Iterable[str]) -> tuple[set[str], set[str]]:
    """The main-graph nodes ``roots`` depend on and the library functions those call."""
    from ..graph.io import _calls_closure, called_functions

    closure = _closure(graph_def, roots)
    library = {f.signature.name for f in graph_def.library.function}
    called = called_functions((nd for nd in graph_def.node if nd.name in closure), library)
    return closure, _calls_closure(graph_def, called)


def scope_summaries(before: Any, result: RewriteResult, meta: Any = None) -> dict[str, dict[str, Any]]:
    """What one rewritten graph runs, counted per signature: ``{row: counts}`` (see
    :func:`_scope_counts`).

    With a MetaGraphDef ``meta``, one row per served signature (keys starting with ``__``,
    such as ``__saved_model_init_op``, are not served): the main-graph nodes its outputs
    depend on and every function those call, directly or not; ``function`` is the function
    its outputs come from (a TF2 signature's ``StatefulPartitionedCall``), ``None`` for a
    TF1 signature of main-graph tensors.  Signatures may share nodes.  Then
    :data:`SAVE_RESTORE_ROW`: what the saver's save and restore ops run that no signature
    does (a TF2 model's ``_traced_save``/``_traced_restore`` functions), and
    :data:`OTHER_ROW`: everything else.  Without ``meta`` (a frozen GraphDef) the one row
    :data:`GRAPH_ROW` counts the whole graph.  The last two rows count only what no
    signature runs, so they partition the
    graph with the signatures: the nodes of at least one signature, plus those two rows, are
    ``total_nodes``.  Pure.
    """
    all_main = [nd.name for nd in before.node]
    all_functions = {f.signature.name for f in before.library.function}
    if meta is None:
        return {GRAPH_ROW: _scope_counts(before, result, all_main, all_functions, "graph")}
    rows: dict[str, dict[str, Any]] = {}
    used_main: set[str] = set()
    used_functions: set[str] = set()
    calls = {nd.name: nd for nd in before.node if nd.op in ("StatefulPartitionedCall", "PartitionedCall")}
    for key, sig in sorted(meta.signature_def.items()):
        if key.startswith("__"):
            continue
        roots = {n for info in sig.outputs.values() for t in _tensor_names(info) if (n := _node_of(t))}
        main, functions = _reach(before, roots)
        called = sorted({calls[r].attr["f"].func.name for r in roots if r in calls})
        rows[key] = _scope_counts(before, result, main, functions, "signature",
                                  called[0] if len(called) == 1 else None)
        used_main |= main
        used_functions |= functions
    saver = meta.saver_def
    roots = {n for text in (saver.save_tensor_name, saver.restore_op_name) if text and (n := _node_of(text))}
    main, functions = _reach(before, roots)
    main -= used_main
    functions -= used_functions
    rows[SAVE_RESTORE_ROW] = _scope_counts(before, result, main, functions, "save_restore")
    rows[OTHER_ROW] = _scope_counts(before, result, set(all_main) - used_main - main,
                                    all_functions - used_functions - functions, "other")
    return rows


def _model_report(model: ModelFile, graphs: Sequence[GraphRewrite], message: Any = None) -> dict[str, Any]:
    """The JSON-ready report of a model: totals over its graphs and one core report each."""
    entries = []
    signatures: dict[str, Any] = {}
    excluded: dict[str, int] = {}
    for g in graphs:
        entry: dict[str, Any] = {"label": g.label, "tags": list(g.tags)}
        meta = None
        if g.index is not None and message is not None:
            meta = message.meta_graphs[g.index] if model.format == "saved_model" else message
            entry["signatures"] = _signatures_summary(meta)
        entry.update(g.result.report)
        entry["summary"] = scope_summaries(g.before, g.result, meta)
        for key, row in entry["summary"].items():
            if row["kind"] != "signature":
                continue
            entry["signatures"][key]["function"] = row["function"]
            # A key that more than one meta graph serves is told apart by its graph's label.
            signatures[key if len(graphs) == 1 else f"{g.label}: {key}"] = {"graph": g.label, **row}
        for pattern, count in g.result.report.get("excluded", {}).items():
            excluded[pattern] = excluded.get(pattern, 0) + count
        entries.append(entry)
    first = graphs[0].result.report
    skipped = [g.result.report["skipped"] for g in graphs]
    return {
        "input": model.path,
        "format": model.format,
        "target": first["target"],
        "precision": first["precision"],
        "lists": first["lists"],
        "level": first["level"],
        **{k: sum(g.result.report[k] for g in graphs) for k in _COUNTS},
        "skipped": skipped[0] if all(skipped) else None,
        **({"excluded": excluded} if any("excluded" in g.result.report for g in graphs) else {}),
        "signatures": signatures,
        "graphs": entries,
    }


def summary_line(report: Mapping[str, Any]) -> str:
    """One line: ``converted N of M nodes, K cast(s) to float16, J to float32 ...``."""
    line = (f"converted {report['converted_nodes']} of {report['total_nodes']} nodes, "
            f"{report['casts_to_low']} cast(s) to {report['precision']}, {report['casts_to_high']} to float32 "
            f"(target {report['target']}, lists {report['lists']})")
    if report["skipped"]:
        line += f"; nothing rewritten: {report['skipped']}"
    tuned = report.get("autotune")
    if tuned:
        # The autotune section's own summary names each candidate's rounds won and the rule
        # that decided; a bare list of times and ratios read as self-contradictory.
        line += f"; {tuned['summary']}" if "summary" in tuned else f"; autotune chose {tuned['choice']}"
    return line


def summary_table(report: Mapping[str, Any], *, top_ops: int = 6) -> list[str]:
    """Lines of a short table per rewritten graph: for each signature (then save/restore and
    the rest; a frozen GraphDef has one row) the nodes converted out of those it runs, the
    Casts added, the function it calls, and the op types converted most.  ``[]`` when the
    report has no rows (autotune kept float32 and nothing was rewritten).  Pure."""
    lines: list[str] = []
    graphs = report.get("graphs", [])
    low = report.get("precision", "low")
    for g in graphs:
        rows = g.get("summary") or {}
        if not rows:
            continue
        if len(graphs) > 1:
            lines.append(f"[{g['label']}]")
        width = max(len("signature"), *(len(k) for k in rows))
        lines.append(f"  {'signature':{width}}  {'converted/total':>15}  {'casts to ' + low:>18}  "
                     f"{'to float32':>10}  function")
        for key, row in rows.items():
            n_funcs = len(row["functions"])
            where = row["function"] or (f"{n_funcs} function(s)" if n_funcs else "main graph")
            lines.append(f"  {key:{width}}  {row['converted']:>7}/{row['total']:<7}  {row['casts_to_low']:>18}  "
                         f"{row['casts_to_high']:>10}  {where}")
            ops = sorted(((c["converted"], op, c["total"]) for op, c in row["by_op"].items() if c["converted"]),
                         key=lambda t: (-t[0], t[1]))
            if ops:
                shown = ", ".join(f"{op} {conv}/{tot}" for conv, op, tot in ops[:top_ops])
                more = f", {len(ops) - top_ops} more op type(s)" if len(ops) > top_ops else ""
                lines.append(f"  {'':{width}}    converted by op: {shown}{more}")
    return lines
