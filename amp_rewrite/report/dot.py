"""Graphviz DOT text of panels (:func:`to_dot`): generated node ids, names only inside
escaped strings.  Pure."""

from __future__ import annotations

from typing import Sequence

from .boxes import KINDS, Panel
from .svg import _XML_BAD

__all__ = ["to_dot"]


def _dot_str(text: str) -> str:
    """A DOT double-quoted string.  Backslashes are doubled, so graphviz's escapes (``\\N``,
    ``\\l``...) cannot be injected; control characters are dropped."""
    text = _XML_BAD.sub("\ufffd", text.replace("\r", ""))
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(panels: Sequence[Panel], *, title: str = "amp_rewrite") -> str:
    """Graphviz DOT text, one cluster per panel.  Node ids are generated (``p0n3``), names
    only appear in escaped labels and tooltips.  Pure."""
    lines = ["digraph amp_rewrite {",
             f"  graph [label={_dot_str(title)}, labelloc=t, rankdir=TB, fontname=Helvetica];",
             '  node [shape=box, style="rounded,filled", fontname=Helvetica, fontsize=10];',
             "  edge [color=\"#9e9e9e\"];"]
    for p, panel in enumerate(panels):
        ids = {n.id: f"p{p}n{i}" for i, n in enumerate(panel.nodes)}
        label = panel.title + (f"\n{panel.note}" if panel.note else "")
        lines.append(f"  subgraph cluster_{p} {{")
        lines.append(f"    label={_dot_str(label)};")
        for n in panel.nodes:
            color = KINDS["unchanged" if n.kind == "group" else n.kind][0]
            if n.kind == "group" and n.counts:
                color = KINDS[max(n.counts, key=lambda kc: kc[1])[0]][0]
            extra = ", penwidth=2, color=\"#6a1b9a\"" if n.kind == "cast" else ""
            extra += ", peripheries=2" if n.kind == "group" else ""
            lines.append(f"    {ids[n.id]} [label={_dot_str(n.label + chr(10) + n.sublabel)}, "
                         f"fillcolor={_dot_str(color)}, tooltip={_dot_str(n.detail)}{extra}];")
        lines.append("  }")
        for u, v, control in panel.edges:
            style = " [style=dashed]" if control else ""
            lines.append(f"  {ids[u]} -> {ids[v]}{style};")
    lines.append("}")
    return "\n".join(lines) + "\n"
