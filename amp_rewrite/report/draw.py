"""Pictures of a rewrite: SVG, HTML and Graphviz DOT drawings, and TensorBoard event files.

A drawing shows the *rewritten* graph with every node coloured by its decision (allow,
infer, deny, clear, unchanged), inserted Casts marked, and function arguments/results drawn
as boundary nodes.  One panel is drawn per graph that changed: the main graph and each
function of the library with a converted node or a Cast (a TF2 SavedModel's work happens in
its functions).  A panel with more than ``max_nodes`` nodes is collapsed by name scope: scopes
are opened from the top, largest first, while the drawing stays within ``max_nodes`` boxes
(:func:`collapse`), and each closed box shows how many of its nodes got each decision.

With a SavedModel's signatures (``render_file`` reads them from the report), each panel is
titled by the signature keys that run it.  Labels are shortened in the middle, keeping the
start and the layer and op at the end; the full name is in each box's ``<title>``.

The layout is a simple layered one computed here (no graphviz binary needed): cycles are
broken by reversing DFS back edges, layers come from longest paths (sources pulled down to
just above their first consumer), and nodes in a layer are ordered by a few barycentre
sweeps.  A tall drawing is wrapped into columns (the layer sequence read left to right) so
that it stays near 3:2.  Everything is deterministic: the same rewrite gives the same bytes.
The HTML page puts the summary and the decision tables first, then one drawing per panel.

Node names come from untrusted files, so every piece of text is escaped for its format
(XML/HTML escaping plus removal of characters XML forbids; DOT string escaping), and the HTML
page carries a Content-Security-Policy that allows no scripts.

TensorBoard: :func:`tensorboard_files` gives ``before/`` and ``after/`` event files (the
GraphDef before and after, the after graph's nodes annotated with an ``_amp_rewrite`` attr
holding their decision), which TensorBoard's graph dashboard opens as two runs.

This module reads a rewrite and writes one format (:func:`render_file`); the parts live in
:mod:`.boxes` (boxes, panels, kinds, label shortening), :mod:`.panels` and :mod:`.collapse`
(what to draw), :mod:`.layout`, :mod:`.svg`, :mod:`.page` (HTML), :mod:`.dot` and
:mod:`.tensorboard`.  What they read of a rewrite is :mod:`.drawable`'s protocols, so the
pictures import nothing of the model layer or the API.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

from ..errors import AmpRewriteError
# The drawing's parts live in their own modules; the names callers and tests use from here
# are re-exported.
from .boxes import _HUB, _LABEL_CHARS, DEFAULT_MAX_NODES, KINDS, DrawNode, Kind, Panel, _middle  # noqa: F401
from .collapse import collapse  # noqa: F401
from .dot import to_dot
from .drawable import DrawableModel, DrawableResult, _results
from .layout import _layout  # noqa: F401
from .page import _overview, _table, to_html
from .panels import panels_for
from .svg import BARS_LEGEND, legend_svg, panel_svg, to_svg  # noqa: F401
from .tensorboard import tensorboard_files  # noqa: F401

__all__ = [
    "DrawNode",
    "Panel",
    "KINDS",
    "panels_for",
    "to_svg",
    "to_html",
    "legend_svg",
    "panel_svg",
    "BARS_LEGEND",
    "to_dot",
    "graph_format",
    "render_file",
    "tensorboard_files",
]


def graph_format(path: str | os.PathLike[str]) -> str:
    """``"svg"``, ``"html"`` or ``"dot"`` from a file name; :class:`AmpRewriteError` otherwise."""
    ext = os.path.splitext(os.fspath(path))[1].lower()
    fmt = {".svg": "svg", ".html": "html", ".htm": "html", ".dot": "dot", ".gv": "dot"}.get(ext)
    if fmt is None:
        raise AmpRewriteError(f"--graph {os.fspath(path)}: unknown drawing format {ext or '(none)'!r}; "
                              "use .svg, .html or .dot")
    return fmt


def _heading(label: str, graph: str, sigs: Mapping[str, Sequence[str]]) -> tuple[tuple[str, ...], str]:
    """A decision table's heading: the signatures that run ``graph`` (sorted) and the text
    naming them and which graph it is."""
    keys = tuple(sorted(k for k, graphs in sigs.items() if graph in graphs))
    what = f"{label}: " + (f"function {graph}" if graph else "main graph")
    if not keys:
        return keys, what
    return keys, ("signature " if len(keys) == 1 else "signatures ") + ", ".join(keys) + f" ({what})"


def render_file(rewrite: DrawableModel | DrawableResult, path: str | os.PathLike[str], *,
                max_nodes: int = DEFAULT_MAX_NODES) -> bytes:
    """The drawing of ``rewrite`` (a model rewrite or one :class:`RewriteResult`) in the
    format ``path`` names, as bytes.  Writes nothing."""
    fmt = graph_format(path)
    results = _results(rewrite)
    panels = [p for label, r, sigs in results
              for p in panels_for(r, title=label, max_nodes=max_nodes, signatures=sigs)]
    report = rewrite.report
    title = f"amp_rewrite: {report.get('input', 'graph')}" if "input" in report else "amp_rewrite"
    if fmt == "svg":
        return to_svg(panels, title=title).encode("utf-8")
    if fmt == "dot":
        return to_dot(panels, title=title).encode("utf-8")
    summary = (f"converted {report['converted_nodes']} of {report['total_nodes']} nodes to "
               f"{report['precision']}; {report['casts_to_low']} cast(s) to {report['precision']}, "
               f"{report['casts_to_high']} to float32; target {report['target']}, lists {report['lists']}")
    tables = []
    for label, r, sigs in results:
        sections = [("", r.report), *r.report.get("functions", {}).items()]
        for graph, section in sections:
            keys, heading = _heading(label, graph, sigs)
            tables.append((not keys, keys[:1], len(tables), _table(heading, section)))
    # In the order of the drawings: by first signature key, graphs no signature runs last.
    return to_html(panels, title=title, summary=summary, tables=[t for *_, t in sorted(tables) if t],
                   overview=_overview(report)).encode("utf-8")
