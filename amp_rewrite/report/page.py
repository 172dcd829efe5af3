"""The HTML page of a rewrite (:func:`to_html`): the summary, the per-signature overview
and the decision tables first, then the legend and one inline SVG drawing per panel.
Every string from the model is escaped; the page allows no scripts (CSP).  Pure."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .boxes import Panel
from .svg import _esc, legend_svg, panel_svg

__all__ = ["to_html"]


def _table(graph: str, section: Mapping[str, Any]) -> str:
    """An HTML table of a report section's allow and deny decisions and its casts, open,
    in a box that scrolls past 24 rows ("" when there is nothing to list)."""
    rows = []
    for name, node in section.get("nodes", {}).items():
        if node["color"] in ("allow", "deny"):
            rows.append(f"<tr class='k-{_esc(node['color'])}'><td>{_esc(name)}</td><td>{_esc(node['op'])}</td>"
                        f"<td>{_esc(node['color'])}</td><td>{_esc(node['dtype'])}</td>"
                        f"<td>{_esc(node['reason'])}</td></tr>")
    for cast in section.get("casts", ()):
        rows.append(f"<tr class='k-cast'><td>{_esc(cast['name'])}</td><td>Cast</td><td>inserted</td>"
                    f"<td>{_esc(cast['dtype'])}</td><td>reads {_esc(cast['source'])}</td></tr>")
    if not rows:
        return ""
    return (f"<details open class='decisions'><summary>{_esc(graph)}: {len(rows)} decisions "
            "(allow, deny, casts)</summary><div class='scroll'>"
            "<table><tr><th>node</th><th>op</th><th>decision</th><th>dtype</th><th>why</th></tr>"
            + "".join(rows) + "</table></div></details>")


def _overview(report: Mapping[str, Any]) -> str:
    """An HTML table with one row per served signature of a model report (see
    docs/report.md): what it runs and how much of it was converted ("" for a GraphDef)."""
    rows = []
    for key, row in report.get("signatures", {}).items():
        rows.append(f"<tr><td>{_esc(key)}</td><td>{_esc(row.get('graph', ''))}</td>"
                    f"<td>{_esc(row.get('function') or '(main graph)')}</td>"
                    f"<td>{int(row['converted'])} of {int(row['total'])}</td>"
                    f"<td>{int(row['casts_to_low'])}</td><td>{int(row['casts_to_high'])}</td></tr>")
    if not rows:
        return ""
    return ("<table class='overview'><tr><th>signature</th><th>graph</th><th>function</th>"
            "<th>nodes converted</th><th>casts to low</th><th>casts to float32</th></tr>"
            + "".join(rows) + "</table>")


_CSS = ("body{font-family:Helvetica,Arial,sans-serif;margin:20px;color:#212121}"
        "h2{font-size:18px;margin:22px 0 8px}h3{font-size:15px;margin:18px 0 2px}"
        ".sub{color:#616161;font-size:13px;margin:2px 0 6px}"
        "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;"
        "text-align:left}th{background:#f5f5f5;position:sticky;top:0}details{margin:8px 0}"
        ".scroll{max-height:30em;overflow:auto;border:1px solid #ddd;display:inline-block;max-width:100%}"
        ".k-allow td:nth-child(3){background:#66bb6a}"
        ".k-deny td:nth-child(3){background:#ef5350}.k-cast td:nth-child(3){background:#ba68c8}"
        ".drawing{overflow:auto;border:1px solid #ddd;max-height:95vh}")


def to_html(panels: Sequence[Panel], *, title: str = "amp_rewrite", summary: str = "",
            tables: Sequence[str] = (), overview: str = "") -> str:
    """A self-contained HTML page: the summary, the per-signature ``overview`` table and the
    decision ``tables`` first (HTML from :func:`_overview` / :func:`_table`), then the
    legend and one drawing per panel, each under its own heading.  Pure.

    Every string from the model is escaped; the page allows no scripts (CSP)."""
    drawings = []
    for k, panel in enumerate(panels):
        sub = " \u00b7 ".join(t for t in (panel.subtitle, panel.note) if t)
        drawings.append(f"<section><h3>{_esc(panel.title)}</h3>"
                        + (f"<p class='sub'>{_esc(sub)}</p>" if sub else "")
                        + f"<div class=\"drawing\">{panel_svg(panel, k)}</div></section>")
    decisions = "".join(tables) or "<p>No node was converted and no Cast inserted.</p>"
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; img-src data:\">"
        f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_esc(title)}</h1><p>{_esc(summary)}</p>{overview}"
        f"<h2>Decisions</h2>{decisions}"
        f"<h2>Drawings</h2><p class='sub'>One drawing per graph that changed, titled by the "
        "signatures that run it. Hover a box for its full name and decision.</p>"
        f"{legend_svg()}{''.join(drawings)}</body></html>\n"
    )
