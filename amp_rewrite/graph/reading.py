"""Reading GraphDefs: serialized bytes and ``.pb``/``.pbtxt`` files to GraphDef messages.

Part of :mod:`amp_rewrite.graph.io` (which re-exports these names).  Reads files and parses;
builds no IR.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import GraphFormatError


def _graph_def_class() -> Any:
    from tensorflow.core.framework import graph_pb2

    return graph_pb2.GraphDef


def parse_graph_def(data: bytes, *, path: str | None = None) -> Any:
    """Parse serialized GraphDef bytes.  :class:`GraphFormatError` if they are not one."""
    from google.protobuf.message import DecodeError

    gd = _graph_def_class()()
    try:
        gd.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise GraphFormatError(f"not a GraphDef (protobuf could not parse it: {exc})", path=path) from None
    except RecursionError:
        raise GraphFormatError("not a GraphDef: messages are nested too deeply", path=path) from None
    if data and not gd.node and not gd.library.function:
        # Random bytes sometimes parse as an empty message made of unknown fields.
        raise GraphFormatError("not a GraphDef (no nodes and no functions found)", path=path)
    return gd


def check_binary_readable(message: Any, *, path: str | None = None) -> None:
    """Raise :class:`GraphFormatError` if ``message`` (parsed from text) could not be read
    back from its binary form: the text parser accepts deeper nesting (``func`` attrs inside
    ``func`` attrs) than the binary decoder TensorFlow and this package use, so such a graph
    would fail later, or be written as an output nothing can read."""
    from google.protobuf.message import DecodeError

    try:
        type(message).FromString(message.SerializeToString())
    except (DecodeError, RecursionError, ValueError, RuntimeError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise GraphFormatError(f"messages are nested too deeply to be read in binary form ({detail})",
                               path=path) from None


def load_graph_def(path: str | os.PathLike[str]) -> Any:
    """Read a frozen GraphDef from ``.pb`` (binary) or ``.pbtxt`` (text) file."""
    from google.protobuf import text_format

    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise GraphFormatError(f"cannot read file: {exc.strerror}", path=p) from None
    if p.endswith((".pbtxt", ".txt")):
        gd = _graph_def_class()()
        try:
            text_format.Parse(data.decode("utf-8"), gd)
        except (text_format.ParseError, UnicodeDecodeError) as exc:
            raise GraphFormatError(f"not a text GraphDef: {exc}", path=p) from None
        except RecursionError:
            # The text parser recurses into nested messages (``func`` attrs in ``func`` attrs).
            raise GraphFormatError("not a text GraphDef: messages are nested too deeply", path=p) from None
        check_binary_readable(gd, path=p)
        return gd
    return parse_graph_def(data, path=p)

