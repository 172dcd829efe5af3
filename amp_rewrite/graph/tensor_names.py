"""Parsing and formatting of tensor names: the one place that knows their syntax.

Two syntaxes exist:

* GraphDef inputs: ``node`` (output 0), ``node:3`` (output 3), ``^node`` (control input).
* FunctionDef body inputs: ``arg`` (a function argument), ``node:out_arg:3`` (element 3 of
  the output argument ``out_arg`` of ``node``), ``^node`` (control input).  Turning
  ``out_arg:3`` into a flat output port needs the node's OpDef and is done by the importer
  with :func:`parse_function_input` giving the pieces.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "TensorRef",
    "FunctionInputRef",
    "CONTROL",
    "parse_graph_input",
    "format_graph_input",
    "parse_function_input",
    "format_function_input",
    "node_name",
    "MAX_PORTS",
]

#: Port number used for control edges.
CONTROL = -1

#: Most output ports a node may have: an input names a port below this, and a count attribute
#: (``Unpack``'s ``num``, ``AddN``'s ``N``) is at most this.  TensorFlow allows 2**31 - 1, but
#: it expands such a count into one list entry per port as it imports the node, as this
#: package does, so a NodeDef of a few bytes would claim gigabytes (and TensorFlow's import
#: then aborts the process).  A real model's nodes have a few thousand ports at most.
MAX_PORTS = 1 << 20


def _port(digits: str, text: str) -> int:
    """The port number ``digits`` (all digits) of the input ``text``; ``ValueError`` past
    :data:`MAX_PORTS`."""
    port = int(digits)
    if port >= MAX_PORTS:
        raise ValueError(f"input {text!r} reads output port {port}; amp_rewrite reads nodes of at most "
                         f"{MAX_PORTS} outputs")
    return port


class TensorRef(NamedTuple):
    """A reference to an output of a node in a GraphDef; ``port == CONTROL`` for ``^node``."""

    node: str
    port: int

    @property
    def is_control(self) -> bool:
        return self.port == CONTROL


class FunctionInputRef(NamedTuple):
    """A parsed FunctionDef input: ``node:out_arg:index``, ``arg`` or ``^node``.

    ``out_arg`` is ``None`` for a bare name (a function argument, or a body node referenced
    without an output arg, which TensorFlow reads as output 0) and for control inputs.
    """

    node: str
    out_arg: str | None
    index: int
    is_control: bool


def parse_graph_input(text: str) -> TensorRef:
    """Parse a GraphDef input string.  ``ValueError`` if it is malformed."""
    if not text:
        raise ValueError("empty input name")
    if text[0] == "^":
        if len(text) == 1 or ":" in text:
            raise ValueError(f"malformed control input {text!r}")
        return TensorRef(text[1:], CONTROL)
    head, sep, tail = text.rpartition(":")
    if not sep:
        return TensorRef(text, 0)
    if not head or not tail.isdigit():
        raise ValueError(f"malformed input {text!r}")
    return TensorRef(head, _port(tail, text))


def format_graph_input(ref: TensorRef) -> str:
    """Canonical GraphDef spelling: bare name for port 0, ``name:p`` otherwise, ``^name``."""
    if ref.port == CONTROL:
        return "^" + ref.node
    if ref.port == 0:
        return ref.node
    return f"{ref.node}:{ref.port}"


def parse_function_input(text: str) -> FunctionInputRef:
    """Parse a FunctionDef body input string.  ``ValueError`` if it is malformed."""
    if not text:
        raise ValueError("empty input name")
    if text[0] == "^":
        if len(text) == 1 or ":" in text:
            raise ValueError(f"malformed control input {text!r}")
        return FunctionInputRef(text[1:], None, 0, True)
    parts = text.split(":")
    if len(parts) == 1:
        return FunctionInputRef(text, None, 0, False)
    if len(parts) == 2:
        # ``node:out_arg`` means element 0 of that output argument.
        if not parts[0] or not parts[1]:
            raise ValueError(f"malformed input {text!r}")
        if parts[1].isdigit():
            # A GraphDef-style reference inside a function; treat as a flat port on an
            # unnamed output.  Only the importer can tell whether that is valid.
            return FunctionInputRef(parts[0], "", _port(parts[1], text), False)
        return FunctionInputRef(parts[0], parts[1], 0, False)
    if len(parts) == 3 and parts[0] and parts[1] and parts[2].isdigit():
        return FunctionInputRef(parts[0], parts[1], _port(parts[2], text), False)
    raise ValueError(f"malformed input {text!r}")


def format_function_input(node: str, out_arg: str | None, index: int) -> str:
    """Spell a FunctionDef body input (``out_arg=None`` gives a bare argument name)."""
    if out_arg is None:
        return node
    return f"{node}:{out_arg}:{index}"


def node_name(text: str) -> str:
    """The node part of a GraphDef input or fetch (``^a``, ``a:1`` and ``a`` all give ``a``)."""
    return parse_graph_input(text).node
