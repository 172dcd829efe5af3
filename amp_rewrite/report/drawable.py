"""What drawing reads of a rewrite, as protocols: a rewritten graph's GraphDef, report
and plans (:class:`DrawableResult`, which :class:`amp_rewrite.api.RewriteResult`
satisfies) and a model's report and rewritten graphs (:class:`DrawableModel`, which
:class:`amp_rewrite.models.saved_model.ModelRewrite` satisfies).  The pictures need
graphs, plans and reports, not the model layer: this module imports nothing of it."""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence

__all__ = ["DrawableGraph", "DrawableModel", "DrawableResult"]


class DrawableResult(Protocol):
    """One rewritten GraphDef: ``graph_def`` (a ``GraphDef``), its JSON-ready ``report`` and
    ``plans``, ``""`` (the main graph) and function names to a plan whose ``nodes`` map node
    names to decisions (``color``, ``dtype``, ``reason``) and whose ``skipped`` says why
    nothing was painted."""

    @property
    def graph_def(self) -> Any: ...

    @property
    def report(self) -> Mapping[str, Any]: ...

    @property
    def plans(self) -> Mapping[str, Any]: ...


class DrawableGraph(Protocol):
    """One rewritten graph of a model: its ``label``, the input GraphDef (``before``) and
    the ``result``."""

    @property
    def label(self) -> str: ...

    @property
    def before(self) -> Any: ...

    @property
    def result(self) -> DrawableResult: ...


class DrawableModel(Protocol):
    """A model rewrite: its ``report`` (with one ``graphs`` entry per rewritten graph, whose
    ``summary`` rows name the signatures) and its rewritten ``graphs``."""

    @property
    def report(self) -> Mapping[str, Any]: ...

    @property
    def graphs(self) -> Sequence[DrawableGraph]: ...


def _results(rewrite: DrawableModel | DrawableResult) -> list[tuple[str, DrawableResult, dict[str, list[str]]]]:
    """``(label, result, {signature key: graphs it runs})`` per rewritten graph; the graphs
    are function names and ``""`` for the main graph (see :func:`panels_for`)."""
    graphs = getattr(rewrite, "graphs", None)
    if graphs is None:
        return [("graph", rewrite, {})]  # type: ignore[list-item]
    entries = rewrite.report.get("graphs", [])
    out = []
    for k, g in enumerate(graphs):
        rows = entries[k].get("summary", {}) if k < len(entries) else {}
        # A TF1 signature (no function) names main-graph tensors.
        sigs = {key: list(row["functions"]) + ([""] if row["function"] is None else [])
                for key, row in rows.items() if row["kind"] == "signature"}
        out.append((g.label, g.result, sigs))
    return out
