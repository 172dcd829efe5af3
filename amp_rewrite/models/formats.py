"""Reading model files: a SavedModel directory, a MetaGraphDef or a frozen GraphDef.

Formats are recognised by the path, never guessed from the bytes (:func:`model_format`), and
no file is opened before it is checked to be a regular file of at most 2 GiB: a device or a
FIFO put where a model should be would be read without end or block forever.
:func:`load_model` returns a :class:`ModelFile`, whose message everything downstream treats
as read-only.  TensorFlow's protos are imported lazily.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import GraphFormatError
from ..graph.io import check_binary_readable, load_graph_def
from .staging import is_within, special_kind

ModelFormat = Literal["saved_model", "meta_graph", "graph_def"]

SAVED_MODEL_PB = "saved_model.pb"
SAVED_MODEL_PBTXT = "saved_model.pbtxt"
FINGERPRINT_PB = "fingerprint.pb"
_TEXT_SUFFIXES = (".pbtxt", ".txt", ".prototxt")
_META_SUFFIXES = (".meta", ".meta.pbtxt", ".meta.txt")


@dataclass(frozen=True)
class ModelFile:
    """A model read from disk.  ``message`` is a ``SavedModel``, ``MetaGraphDef`` or
    ``GraphDef`` protobuf, treated as read-only by everything in this package."""

    path: str
    format: ModelFormat
    text: bool
    message: Any

    @property
    def meta_graphs(self) -> list[Any]:
        """The MetaGraphDefs (all of a SavedModel's, the one of a ``.meta``, none otherwise)."""
        if self.format == "saved_model":
            return list(self.message.meta_graphs)
        if self.format == "meta_graph":
            return [self.message]
        return []


def model_format(path: str | os.PathLike[str]) -> tuple[ModelFormat, bool]:
    """The format a path names and whether it is a text protobuf.  Looks at the name (and
    whether it is a directory) only; a path that does not exist yet is classified by name."""
    p = os.fspath(path)
    name = os.path.basename(os.path.normpath(p)).lower()
    if os.path.isdir(p):
        return "saved_model", os.path.exists(os.path.join(p, SAVED_MODEL_PBTXT)) and not \
            os.path.exists(os.path.join(p, SAVED_MODEL_PB))
    if name.endswith(_META_SUFFIXES):
        return "meta_graph", not name.endswith(".meta")
    if name.endswith(_TEXT_SUFFIXES):
        return "graph_def", True
    if not os.path.exists(p) and "." not in name:
        # A new path without an extension: the output of a SavedModel.
        return "saved_model", False
    return "graph_def", False


#: The most bytes read from one model file: protobuf cannot parse a message over 2 GiB.
MAX_FILE_BYTES = 2**31 - 1


def _check_input_file(path: str) -> None:
    """Refuse ``path`` unless it is (or a symbolic link leads to) a regular file of at most
    :data:`MAX_FILE_BYTES`: ``/dev/zero`` would be read until memory runs out, and a FIFO
    would block forever.  Looks at ``stat`` only; opens nothing."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise GraphFormatError(f"cannot read file: {exc.strerror}", path=path) from None
    _check_file_stat(st, path)


def _check_file_stat(st: os.stat_result, path: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = "directory" if stat.S_ISDIR(st.st_mode) else special_kind(path) or "special file"
        raise GraphFormatError(f"not a regular file (a {kind}); a model is read from a file or a "
                               "SavedModel directory", path=path)
    if st.st_size > MAX_FILE_BYTES:
        raise GraphFormatError(f"{st.st_size:,} bytes, over protobuf's 2 GiB limit for one message", path=path)


def _read(path: str) -> bytes:
    """The bytes of the regular file ``path`` (see :func:`_check_input_file`).  Opened
    without blocking (a FIFO put there meanwhile is refused, not waited on) and checked with
    ``fstat`` before reading, so what is read is the file that was checked."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise GraphFormatError(f"cannot read file: {exc.strerror}", path=path) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        _check_file_stat(st, path)
        try:
            # One byte more than fstat said, to notice a file that grows while it is read.
            data = f.read(st.st_size + 1)
        except OSError as exc:
            raise GraphFormatError(f"cannot read file: {exc.strerror}", path=path) from None
    if len(data) > st.st_size:
        raise GraphFormatError("the file grew while it was read", path=path)
    return data


def _saved_model_size(root: str) -> int:
    """The bytes held by the regular files of the SavedModel directory ``root``, after
    checking that a copy of it (the output is one) can neither leak nor run forever.

    Refuses, naming the path: a device, FIFO or socket (copying ``/dev/zero`` fills the
    disk, a FIFO blocks); a symbolic link that leads outside ``root`` (``assets/x ->
    /etc/shadow``, a link to ``/``) or to anything but a file or directory; and an absolute
    link, which the copy would keep pointing into the input.  A relative link inside the
    model is fine: it is copied as a link, so it leads to the copy's own file.  Reads the
    file system only (``lstat``, ``readlink``); follows no link while walking.
    """
    top = os.path.realpath(root)
    total = 0
    for parent, dirs, files in os.walk(root, onerror=_raise_walk_error):
        for name in dirs + files:
            path = os.path.join(parent, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                if os.path.isabs(os.readlink(path)):
                    raise GraphFormatError("an absolute symbolic link in the SavedModel; the copy would "
                                           "still point into the input (make it relative)", path=path)
                # Both the link's text and where it really leads must stay inside: a link
                # out and back in (``../../elsewhere/model/x``) would, in the copy, lead
                # back into the input.
                depth = len(os.path.relpath(parent, root).split(os.sep)) if parent != root else 0
                for part in os.readlink(path).split(os.sep):
                    depth += -1 if part == ".." else 0 if part in ("", ".") else 1
                    if depth < 0:
                        break
                if depth < 0 or not is_within(path, top):
                    raise GraphFormatError("a symbolic link that leads outside the SavedModel directory",
                                           path=path)
                kind = special_kind(path)
                if kind:
                    raise GraphFormatError(f"a symbolic link to a {kind}; a SavedModel holds only files "
                                           "and directories", path=path)
            elif stat.S_ISREG(st.st_mode):
                total += st.st_size
            elif not stat.S_ISDIR(st.st_mode):
                raise GraphFormatError(f"a {special_kind(path) or 'special file'} in the SavedModel; it holds "
                                       "only files and directories", path=path)
    return total


def _raise_walk_error(exc: OSError) -> None:
    raise GraphFormatError(f"cannot read directory: {exc.strerror}", path=exc.filename) from None


def _parse(cls: Any, data: bytes, text: bool, what: str, path: str) -> Any:
    """Parse ``data`` into a new ``cls`` message; :class:`GraphFormatError` if it is not one."""
    from google.protobuf import text_format
    from google.protobuf.message import DecodeError

    msg = cls()
    try:
        if text:
            text_format.Parse(data.decode("utf-8"), msg)
        else:
            msg.ParseFromString(data)
    except (DecodeError, text_format.ParseError, UnicodeDecodeError, ValueError, RuntimeError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise GraphFormatError(f"corrupt {what} (protobuf could not parse it: {detail})", path=path) from None
    except RecursionError:
        # The text parser recurses into nested messages (``func`` attrs inside ``func``
        # attrs); the binary parser stops at its own depth limit with a DecodeError.
        raise GraphFormatError(f"corrupt {what}: messages are nested too deeply", path=path) from None
    if text:
        check_binary_readable(msg, path=path)
    return msg


def load_model(path: str | os.PathLike[str]) -> ModelFile:
    """Read a SavedModel directory, a MetaGraphDef or a frozen GraphDef.

    Raises :class:`GraphFormatError` for a missing path, a directory that is not a SavedModel,
    a chunked (``.cpb``) SavedModel, a SavedModel :func:`_saved_model_size` refuses, a file
    that is not a regular file (a device, FIFO or socket, or a link to one) or is over 2 GiB,
    and files protobuf cannot parse.  Opens no file before checking what it is.
    """
    from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

    p = os.fspath(path)
    if not os.path.exists(p):
        raise GraphFormatError("no such file or directory", path=p)
    check_not_keras(p)
    if os.path.isdir(p):
        pb, pbtxt = os.path.join(p, SAVED_MODEL_PB), os.path.join(p, SAVED_MODEL_PBTXT)
        # lexists: a saved_model.pb that is no regular file is refused by name in _read.
        if os.path.lexists(pb):
            source, text = pb, False
        elif os.path.lexists(pbtxt):
            source, text = pbtxt, True
        elif os.path.exists(os.path.join(p, "saved_model.cpb")):
            raise GraphFormatError("chunked SavedModels (saved_model.cpb, over 2 GiB) are not supported", path=p)
        else:
            raise GraphFormatError("a directory, but not a SavedModel (it has no saved_model.pb)", path=p)
        _saved_model_size(p)  # before reading anything: links out of the model, FIFOs, devices
        sm = _parse(saved_model_pb2.SavedModel, _read(source), text, os.path.basename(source), p)
        if not sm.meta_graphs:
            raise GraphFormatError(f"corrupt {os.path.basename(source)}: it holds no MetaGraphDef", path=p)
        for mg in sm.meta_graphs:
            if not mg.graph_def.node and not mg.graph_def.library.function:
                raise GraphFormatError(
                    f"corrupt {os.path.basename(source)}: meta graph {list(mg.meta_info_def.tags)} "
                    "has an empty graph", path=p)
        return ModelFile(p, "saved_model", text, sm)
    if os.path.basename(p) in (SAVED_MODEL_PB, SAVED_MODEL_PBTXT):
        raise GraphFormatError("this is a SavedModel's own file; pass its directory instead", path=p)
    fmt, text = model_format(p)
    if fmt == "meta_graph":
        mg = _parse(meta_graph_pb2.MetaGraphDef, _read(p), text, "MetaGraphDef", p)
        if not mg.graph_def.node:
            raise GraphFormatError("not a MetaGraphDef (it holds no graph)", path=p)
        return ModelFile(p, "meta_graph", text, mg)
    _check_input_file(p)  # load_graph_def would read a FIFO or /dev/zero without end
    return ModelFile(p, "graph_def", text, load_graph_def(p))


#: File name endings of Keras model files, which hold Keras layers and weights, not a graph.
_KERAS_SUFFIXES = (".keras", ".h5", ".hdf5")


def check_not_keras(path: str | os.PathLike[str]) -> None:
    """Raise :class:`GraphFormatError` if ``path`` names a Keras model file (``.keras``,
    ``.h5``, ``.hdf5``): it has no TensorFlow graph to rewrite until it is exported.  Looks
    at the name only."""
    p = os.fspath(path)
    if p.lower().endswith(_KERAS_SUFFIXES) and not os.path.isdir(p):
        raise GraphFormatError(
            "a Keras model file, not a TensorFlow graph; export it with `model.export(dir)` first "
            "(a SavedModel directory; Keras 2: `model.save(dir)`) and rewrite that directory", path=p)
