"""SVG drawings: a standalone document of panels (:func:`to_svg`) and the legend and panel
elements the HTML page inlines (:func:`legend_svg`, :func:`panel_svg`).  Every piece of
text is XML-escaped (:func:`_esc`), characters XML forbids replaced.  Pure."""

from __future__ import annotations

import html
import re
from typing import Sequence

from .boxes import _GAP_Y, _H, _MARGIN, _SUB_CHARS, _W, KINDS, Panel, _middle
from .layout import _COL_GAP, _Layout, _layout

__all__ = ["to_svg", "legend_svg", "panel_svg", "BARS_LEGEND"]

_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff\ufffe\uffff]")


def _esc(text: str) -> str:
    """Escape for XML/HTML text and attributes; characters XML forbids become U+FFFD."""
    return html.escape(_XML_BAD.sub("\ufffd", text), quote=True)


_STYLE = (
    "text{font-family:Helvetica,Arial,sans-serif;font-size:11px;fill:#212121}"
    ".sub{font-size:9.5px;fill:#424242}.title{font-size:14px;font-weight:bold}"
    ".note{font-size:11px;fill:#616161}.edge{fill:none;stroke:#9e9e9e;stroke-width:1.2}"
    ".control{stroke-dasharray:4 3}rect.box{stroke:#616161;stroke-width:1}"
    "rect.cast{stroke:#6a1b9a;stroke-width:2}rect.group{stroke:#37474f;stroke-width:1.5}"
)


#: What a collapsed box's bars mean, shown in the legend next to a sample box.
BARS_LEGEND = ("collapsed box: a name scope (for a Keras model, one layer) drawn as one box; "
               "each coloured bar is as wide as the share of its nodes with that decision")
_BARS_SAMPLE = (("allow", 5), ("infer", 2), ("unchanged", 2), ("cast", 1))


def _group_box(x: float, y: float, counts: Sequence[tuple[str, int]], w: float = _W) -> str:
    """A collapsed box at ``(x, y)``: one bar per kind, as wide as its share of ``counts``."""
    total = sum(c for _, c in counts) or 1
    out = []
    cx = x
    for kind, count in counts:
        bar = w * count / total
        out.append(f'<rect x="{cx:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{_H}" fill="{KINDS[kind][0]}"/>')
        cx += bar
    out.append(f'<rect class="box group" x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{_H}" rx="6" fill="none"/>')
    return "".join(out)


def _legend_svg(y: float, max_width: float) -> tuple[str, float, float]:
    """The legend at ``y``: one swatch per kind in a grid no wider than ``max_width``
    (two columns at least), then a sample collapsed box explaining the bars.  Returns
    ``(markup, width, height)``."""
    cell = 24 + 6.2 * max(len(text) for _, text in KINDS.values())
    per_line = max(2, int((max_width - 2 * _MARGIN) // cell))
    parts = []
    for k, (color, text) in enumerate(KINDS.values()):
        x, yy = _MARGIN + (k % per_line) * cell, y + (k // per_line) * 20
        parts.append(f'<rect x="{x:.1f}" y="{yy}" width="14" height="14" fill="{color}" stroke="#616161"/>'
                     f'<text x="{x + 19:.1f}" y="{yy + 11}">{_esc(text)}</text>')
    top = y + -(-len(KINDS) // per_line) * 20 + 6
    parts.append(_group_box(_MARGIN, top, _BARS_SAMPLE, 120))
    parts.append(f'<text class="sub" x="{_MARGIN + 6}" y="{top + 16}">example/layer/</text>'
                 f'<text class="sub" x="{_MARGIN + 6}" y="{top + 31}">10 nodes</text>')
    bars = ", ".join(f"{c} {k}" for k, c in _BARS_SAMPLE)
    parts.append(f'<text x="{_MARGIN + 130}" y="{top + 16}">{_esc(BARS_LEGEND)}</text>'
                 f'<text x="{_MARGIN + 130}" y="{top + 31}">{_esc(f"(here {bars}); hover a box for its counts")}'
                 '</text>')
    width = max(min(per_line, len(KINDS)) * cell, 130 + 6.2 * len(BARS_LEGEND)) + 2 * _MARGIN
    return "".join(parts), width, top + _H - y


def _edge_path(lay: _Layout, u: str, v: str, y0: float, lane: int) -> str:
    """The SVG path of an edge ``u -> v``: a curve within a column; between columns, out
    below ``u``, along the gap after its column (or before, going back), over the columns
    in between along the top strip, and into ``v`` from above.  ``lane`` spreads parallel
    runs in a gap a few px apart."""
    (x1, y1), (x2, y2) = lay.pos[u], lay.pos[v]
    sx, sy, ex, ey = x1 + _W / 2, y0 + y1 + _H, x2 + _W / 2, y0 + y2
    a, b = lay.column[u], lay.column[v]
    if a == b:
        if ey <= sy:  # an edge going up (a broken cycle): leave from the side
            sx, sy = x1 + _W, y0 + y1 + _H / 2
        mid = (sy + ey) / 2
        return f"M{sx:.1f},{sy:.1f} C{sx:.1f},{mid:.1f} {ex:.1f},{mid:.1f} {ex:.1f},{ey:.1f}"
    shift = (lane % 7 - 3) * 3
    out_x = (lay.columns[a][1] + _COL_GAP / 2 if b > a else lay.columns[a][0] - _COL_GAP / 2) + shift
    in_x = lay.columns[b][0] - _COL_GAP / 2 + shift
    below, above = sy + _GAP_Y / 2 + shift / 3, ey - _GAP_Y / 2 + shift / 3
    points = [(sx, sy), (sx, below), (out_x, below)]
    if out_x != in_x:
        strip = y0 + _MARGIN / 2 + shift / 3
        points += [(out_x, strip), (in_x, strip)]
    points += [(in_x, above), (ex, above), (ex, ey)]
    return "M" + " L".join(f"{px:.1f},{py:.1f}" for px, py in points)


def _panel_svg(panel: Panel, top: float, *, header: bool = True,
               arrow: str = "arrow") -> tuple[str, float, float]:
    """SVG elements of one panel starting at ``top``, with its title, subtitle and note
    unless ``header`` is off; edges end in the marker ``arrow``.  Returns (markup, width,
    height)."""
    lay = _layout(panel)
    lines = [(cls, text) for cls, text in (("title", panel.title), ("note", panel.subtitle),
                                           ("note", panel.note)) if text and header]
    out = [f'<text class="{cls}" x="{_MARGIN}" y="{top + 16 + 16 * k}">{_esc(text)}</text>'
           for k, (cls, text) in enumerate(lines)]
    y0 = top + (8 + 16 * len(lines) if lines else 0)
    for lane, (u, v, control) in enumerate(panel.edges):
        if u not in lay.pos or v not in lay.pos:
            continue
        cls = "edge control" if control else "edge"
        out.append(f'<path class="{cls}" marker-end="url(#{arrow})" d="{_edge_path(lay, u, v, y0, lane)}"/>')
    for n in panel.nodes:
        x, y = lay.pos[n.id]
        y += y0
        out.append(f'<g class="node k-{n.kind}"><title>{_esc(n.detail)}</title>')
        if n.kind == "group":
            out.append(_group_box(x, y, n.counts))
        else:
            cls = "box cast" if n.kind == "cast" else "box"
            out.append(f'<rect class="{cls}" x="{x}" y="{y}" width="{_W}" height="{_H}" rx="6" '
                       f'fill="{KINDS[n.kind][0]}"/>')
        out.append(f'<text x="{x + 6}" y="{y + 16}">{_esc(n.label)}</text>'
                   f'<text class="sub" x="{x + 6}" y="{y + 31}">{_esc(_middle(n.sublabel, _SUB_CHARS))}</text></g>')
    return "".join(out), lay.width, y0 - top + lay.height


def _svg_document(body: str, width: float, height: float, standalone: bool, arrow: str = "arrow") -> str:
    """An ``<svg>`` element (a document when ``standalone``) around ``body``, defining the
    arrow head marker ``arrow`` (ids must differ between the SVGs of one HTML page)."""
    head = ('<?xml version="1.0" encoding="UTF-8"?>\n' if standalone else "")
    return (
        f'{head}<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}">'
        f'<style>{_STYLE}</style>'
        f'<defs><marker id="{arrow}" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#9e9e9e"/>'
        '</marker></defs>'
        f'<rect width="100%" height="100%" fill="#ffffff"/>{body}</svg>' + ("\n" if standalone else "")
    )


def to_svg(panels: Sequence[Panel], *, title: str = "amp_rewrite", standalone: bool = True) -> str:
    """One SVG document with a legend and the panels stacked vertically.  Pure."""
    legend, width, legend_h = _legend_svg(_MARGIN + 22, 900)
    body = [f'<text class="title" x="{_MARGIN}" y="{_MARGIN + 12}">{_esc(title)}</text>', legend]
    top = _MARGIN + 22 + legend_h + 16
    for panel in panels:
        markup, w, h = _panel_svg(panel, top)
        body.append(markup)
        width = max(width, w)
        top += h + 20
    return _svg_document("".join(body), width, top, standalone)


def legend_svg() -> str:
    """The legend alone as an ``<svg>`` element (for the HTML page).  Pure."""
    legend, width, height = _legend_svg(4, 900)
    return _svg_document(legend, width, height + 8, standalone=False, arrow="arrow-legend")


def panel_svg(panel: Panel, number: int = 0) -> str:
    """One panel alone, without its header, as an ``<svg>`` element (for the HTML page,
    where it is panel ``number``).  Pure."""
    arrow = f"arrow-{number}"
    markup, width, height = _panel_svg(panel, 0, header=False, arrow=arrow)
    return _svg_document(markup, width, height, standalone=False, arrow=arrow)
