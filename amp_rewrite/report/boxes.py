"""The vocabulary of a drawing: boxes (:class:`DrawNode`), panels (:class:`Panel`), the
decision kinds and their colours (:data:`KINDS`), the sizes every format shares, and
labels shortened in the middle (:func:`_middle`).  Pure data; imports nothing of the
package."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["DrawNode", "Panel", "KINDS", "Kind", "DEFAULT_MAX_NODES"]

Kind = Literal["allow", "infer", "deny", "clear", "unchanged", "cast", "io", "group"]

#: Fill colour and legend text per decision kind, in legend order.
KINDS: dict[str, tuple[str, str]] = {
    "allow": ("#66bb6a", "allow: runs in low precision"),
    "infer": ("#ffe082", "infer: on the infer list, kept float32"),
    "deny": ("#ef5350", "deny: kept float32 by a deny rule"),
    "clear": ("#90caf9", "clear: on the clear list, kept float32"),
    "unchanged": ("#eeeeee", "unchanged: on no list, or not float"),
    "cast": ("#ba68c8", "Cast inserted by the rewrite"),
    "io": ("#ffffff", "function argument / result"),
}

DEFAULT_MAX_NODES = 150
_W, _H, _GAP_X, _GAP_Y, _MARGIN = 188, 40, 22, 38, 16
_LABEL_CHARS = 29  # characters of a box's first line (11 px Helvetica in _W - 12 px)
_SUB_CHARS = 34  # characters of its second line (9.5 px)
_MIN_HEAD = 4  # characters a shortened label keeps of its start, at least
_HUB = 12  # a collapsed box with more control edges than this (in or out) is a hub
_MAX_ROW = 12  # boxes per line before a layer wraps


@dataclass(frozen=True)
class DrawNode:
    """One box: a node, a function boundary, or (``kind="group"``) a collapsed name scope.

    ``counts`` gives, for a group, how many member nodes got each kind.
    """

    id: str
    label: str
    sublabel: str
    kind: str
    detail: str
    counts: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Panel:
    """One graph to draw: boxes, edges ``(src, dst, is_control)`` and a note.

    ``signatures`` are the signature keys that run this graph (the title names them);
    ``subtitle`` says which graph it is (meta graph and function name)."""

    title: str
    nodes: tuple[DrawNode, ...]
    edges: tuple[tuple[str, str, bool], ...]
    note: str = ""
    subtitle: str = ""
    signatures: tuple[str, ...] = ()


def _middle(text: str, limit: int = _LABEL_CHARS) -> str:
    """``text`` shortened to ``limit`` characters by an ellipsis in the middle.  Pure.

    Both ends are kept, never cut: the start (the model or outer scope) and as many whole
    trailing path components as fit, at least the last two (the Keras layer and the op), so
    ``mobilenetv2_1.00_224_1/block_16_expand_BN_1/`` reads ``mobile\u2026/block_16_expand_BN_1/``.
    When even the last components do not fit, the head keeps ``_MIN_HEAD`` characters and
    the rest of the room goes to the end, the most specific part."""
    if len(text) <= limit:
        return text
    room = limit - 1  # the ellipsis takes one character
    # The longest suffix starting at a "/" that leaves _MIN_HEAD characters of the head and
    # holds the last two components (layer and op), or the last one of a two-part name.
    want = min(2, text.strip("/").count("/"))
    for i, ch in enumerate(text):
        if (ch == "/" and i >= _MIN_HEAD and len(text) - i <= room - _MIN_HEAD and text[i:].strip("/")
                and text[i:].strip("/").count("/") + 1 >= want):
            return text[:room - (len(text) - i)] + "\u2026" + text[i:]
    return text[:_MIN_HEAD] + "\u2026" + text[len(text) - (room - _MIN_HEAD):]
