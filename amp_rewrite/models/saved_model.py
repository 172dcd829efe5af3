"""Model files: read a SavedModel, MetaGraphDef or frozen GraphDef, rewrite it, write it back.

:func:`rewrite_saved_model` is the library function behind ``amp-rewrite rewrite``.  It reads
``src``, rewrites every graph in it with :func:`amp_rewrite.api.rewrite_graph_def`, and
writes ``dst`` in the same form, atomically.

Formats are recognised by the path, never guessed from the bytes:

* a directory holding ``saved_model.pb`` (or ``saved_model.pbtxt``): a **SavedModel**.  Every
  MetaGraphDef (or the ones ``tags`` selects) is rewritten, including every function of its
  library, so TF2 signatures (``StatefulPartitionedCall`` into the library) are rewritten
  too.  The output directory is a copy of the input (``variables/``, ``assets/``, extra files)
  with a new ``saved_model.pb``: tags, signature defs, the saver, collections and the object
  graph are kept, and ``fingerprint.pb`` is regenerated (see :func:`_fingerprint`);
* a ``*.meta`` file: a binary **MetaGraphDef** (``*.meta.pbtxt`` / ``*.meta.txt``: text);
* any other file: a frozen **GraphDef**, text when it ends in ``.pbtxt``/``.txt``/``.prototxt``.

Signature interfaces never change.  Function signatures are kept by the core (``_Arg`` and
``_Retval`` are preserved); in the main graph the nodes a MetaGraphDef refers to (signature
inputs and outputs, the saver, collections, variable definitions, assets) are passed to the
core as fetches, so they keep their dtypes.

Output is written through :class:`~amp_rewrite.models.staging.Staging`: everything goes to temporary siblings first and is
renamed into place only when all of it has been written, so a failure or Ctrl-C leaves no
output behind.  The input is never modified.  TensorFlow is imported lazily.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Mapping, Sequence

from ..api import Precision, RewriteResult, resolve_lists, resolve_target, rewrite_graph_def
from ..errors import AmpRewriteError, GraphFormatError, InvalidGraphError
from ..graph.io import check_binary_readable, load_graph_def, reachable_functions
from ..plan.lists import OpLists
from ..progress import Progress
from .staging import (Staging, check_distinct_outputs, check_not_input, check_output, check_replaceable,
                      check_writable, is_within, special_kind)
from ..plan.targets import Target
from ..graph.tensor_names import parse_graph_input

if TYPE_CHECKING:  # autotune imports this module; at run time it is imported where used
    from ..autotune import AutotuneOptions

__all__ = [
    "ModelFile",
    "GraphRewrite",
    "ModelRewrite",
    "load_model",
    "rewrite_model",
    "rewrite_saved_model",
    "mark_for_xla",
    "stage_model",
    "model_format",
    "dump_files",
    "summary_line",
    "summary_table",
    "scope_summaries",
    "check_options",
    "check_not_keras",
]

log = logging.getLogger(__name__)

ModelFormat = Literal["saved_model", "meta_graph", "graph_def"]

SAVED_MODEL_PB = "saved_model.pb"
SAVED_MODEL_PBTXT = "saved_model.pbtxt"
FINGERPRINT_PB = "fingerprint.pb"
_TEXT_SUFFIXES = (".pbtxt", ".txt", ".prototxt")
_META_SUFFIXES = (".meta", ".meta.pbtxt", ".meta.txt")
#: Collections of serialized VariableDefs (tf.compat.v1.GraphKeys); their nodes keep dtypes.
_VARIABLE_COLLECTIONS = frozenset({
    "variables", "trainable_variables", "local_variables", "model_variables",
    "moving_average_variables", "metric_variables", "concatenated_variables",
})


# ------------------------------------------------------------------------------ reading


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


# ------------------------------------------------------------------------------ what to keep


def _tensor_names(info: Any) -> list[str]:
    """The tensor names a ``TensorInfo`` refers to (dense, sparse or composite)."""
    kind = info.WhichOneof("encoding")
    if kind == "name":
        return [info.name]
    if kind == "coo_sparse":
        c = info.coo_sparse
        return [n for n in (c.values_tensor_name, c.indices_tensor_name, c.dense_shape_tensor_name) if n]
    if kind == "composite_tensor":
        return [n for comp in info.composite_tensor.components for n in _tensor_names(comp)]
    return []


def _node_of(text: str) -> str | None:
    try:
        return parse_graph_input(text).node
    except ValueError:
        return None


def _signature_nodes(meta: Any, names: Iterable[str] | None = None) -> tuple[set[str], set[str]]:
    """Nodes of the signature inputs and outputs (of ``names``, or of every signature)."""
    inputs: set[str] = set()
    outputs: set[str] = set()
    for key, sig in meta.signature_def.items():
        if names is not None and key not in names:
            continue
        for info in sig.inputs.values():
            inputs.update(n for t in _tensor_names(info) if (n := _node_of(t)))
        for info in sig.outputs.values():
            outputs.update(n for t in _tensor_names(info) if (n := _node_of(t)))
    return inputs, outputs


def _infrastructure_nodes(meta: Any) -> set[str]:
    """Nodes the MetaGraphDef refers to outside its signatures: the saver, collections,
    variable definitions and asset tensors.  TensorFlow looks them up by name when it
    loads the model, so their dtypes must not change."""
    from tensorflow.core.framework import variable_pb2

    names: set[str] = set()
    saver = meta.saver_def
    for text in (saver.filename_tensor_name, saver.save_tensor_name, saver.restore_op_name):
        if text and (n := _node_of(text)):
            names.add(n)
    for key, coll in meta.collection_def.items():
        kind = coll.WhichOneof("kind")
        if kind == "node_list":
            names.update(n for t in coll.node_list.value if (n := _node_of(t)))
        elif kind == "bytes_list" and key in _VARIABLE_COLLECTIONS:
            for raw in coll.bytes_list.value:
                var = variable_pb2.VariableDef()
                try:
                    var.ParseFromString(raw)
                except Exception:  # noqa: BLE001 - a foreign payload is simply not a VariableDef
                    continue
                for text in (var.variable_name, var.initial_value_name, var.initializer_name,
                             var.snapshot_name):
                    if text and (n := _node_of(text)):
                        names.add(n)
    for asset in meta.asset_file_def:
        names.update(n for t in _tensor_names(asset.tensor_info) if (n := _node_of(t)))
    return names


def _graph_outputs(graph_def: Any) -> set[str]:
    """Main-graph nodes that nothing reads (data or control)."""
    read = {n for node in graph_def.node for t in node.input if (n := _node_of(t))}
    return {node.name for node in graph_def.node} - read


def _closure(graph_def: Any, roots: Iterable[str]) -> set[str]:
    """``roots`` and every main-graph node they depend on (data and control inputs)."""
    inputs = {node.name: node.input for node in graph_def.node}
    seen = {r for r in roots if r in inputs}
    todo = list(seen)
    while todo:
        for text in inputs[todo.pop()]:
            n = _node_of(text)
            if n is not None and n in inputs and n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


# ------------------------------------------------------------------------------ rewriting


@dataclass(frozen=True)
class GraphRewrite:
    """One rewritten graph of a model: a MetaGraphDef's graph, or the frozen GraphDef.

    ``label`` names it in messages and dump files (``graph``, ``meta graph 0 [serve]``);
    ``before`` is the input GraphDef (read-only); ``result`` holds the new GraphDef, the
    report and the plans (only the functions ``signatures`` selected, when given).
    """

    label: str
    index: int | None
    tags: tuple[str, ...]
    before: Any
    result: RewriteResult
    preserved: frozenset[str]


@dataclass(frozen=True)
class ModelRewrite:
    """A model rewritten in memory: the new protobuf and one :class:`GraphRewrite` per graph.

    ``message`` is a new message of the same type as ``source.message``.  ``lists`` are the
    effective op lists that were used (for ``lists`` output and dumps).
    """

    source: ModelFile
    message: Any
    graphs: tuple[GraphRewrite, ...]
    report: dict[str, Any]
    lists: OpLists
    target: Target


def _select_meta_graphs(model: ModelFile, tags: Sequence[str] | None) -> list[int]:
    metas = model.meta_graphs
    if tags is None:
        return list(range(len(metas)))
    if model.format == "graph_def":
        raise AmpRewriteError("--tags applies to SavedModels and MetaGraphDefs, not to a frozen GraphDef")
    want = frozenset(t.strip() for t in tags if t.strip())
    hits = [i for i, mg in enumerate(metas) if frozenset(mg.meta_info_def.tags) == want]
    if not hits:
        have = "; ".join(",".join(sorted(mg.meta_info_def.tags)) or "(no tags)" for mg in metas)
        raise GraphFormatError(f"no meta graph has the tags {','.join(sorted(want))!r} (it has: {have})",
                               path=model.path)
    return hits


def _check_signatures(model: ModelFile, indices: Sequence[int], signatures: Sequence[str]) -> None:
    if model.format == "graph_def":
        raise AmpRewriteError("--signature applies to SavedModels and MetaGraphDefs, not to a frozen GraphDef")
    for i in indices:
        mg = model.meta_graphs[i]
        missing = [s for s in signatures if s not in mg.signature_def]
        if missing:
            have = ", ".join(sorted(k for k in mg.signature_def if not k.startswith("__"))) or "none"
            raise GraphFormatError(
                f"no signature {missing[0]!r} in meta graph {list(mg.meta_info_def.tags)} (it has: {have})",
                path=model.path,
            )


def _check_tensors_exist(meta: Any, path: str) -> None:
    """Every signature tensor must name a node of the graph (a broken model is refused here,
    with the signature named, rather than deep in the core)."""
    nodes = {n.name for n in meta.graph_def.node}
    for key, sig in sorted(meta.signature_def.items()):
        for side, infos in (("input", sig.inputs), ("output", sig.outputs)):
            for arg, info in sorted(infos.items()):
                for text in _tensor_names(info):
                    if _node_of(text) not in nodes:
                        raise GraphFormatError(
                            f"signature {key!r} {side} {arg!r} names tensor {text!r}, which is not in the graph",
                            path=path,
                        )


_COUNTS = ("total_nodes", "converted_nodes", "converted_attrs", "casts_to_low", "casts_to_high")


def _restrict_to_functions(result: RewriteResult, before: Any, keep: set[str]) -> RewriteResult:
    """Undo the rewrite of every function not in ``keep`` and drop it from report and plans.

    Function signatures never change, so any mix of rewritten and original functions runs.
    Returns a new result; ``result`` is not modified.
    """
    gd = type(result.graph_def)()
    gd.CopyFrom(result.graph_def)
    originals = {f.signature.name: f for f in before.library.function}
    for i, fdef in enumerate(gd.library.function):
        name = fdef.signature.name
        if name not in keep and name in originals:
            gd.library.function[i].CopyFrom(originals[name])
    report = dict(result.report)
    functions = report["functions"]
    main = {k: report[k] - sum(f[k] for f in functions.values()) for k in _COUNTS}
    kept = {n: f for n, f in functions.items() if n in keep}
    for k in _COUNTS:
        report[k] = main[k] + sum(f[k] for f in kept.values())
    report["functions"] = kept
    report["skipped_functions"] = {n: r for n, r in report["skipped_functions"].items() if n in keep}
    if report["skipped"] is None and report["converted_attrs"] == 0:
        report["skipped"] = "nothing to convert in the selected signatures"
    plans = {n: p for n, p in result.plans.items() if n == "" or n in keep}
    converted = {n: c for n, c in result.converted.items() if n == "" or n in keep}
    return dataclasses.replace(result, graph_def=gd, report=report, plans=plans, converted=converted)


def _output_dtype(result: RewriteResult, tensor: str) -> int | None:
    """The dtype of a main-graph tensor after the rewrite, from the plan (``None`` if the
    node was not painted)."""
    ref = parse_graph_input(tensor)
    plan = result.plans.get("")
    if plan is None or ref.node not in plan.nodes or ref.node not in plan.types:
        return None
    outputs = plan.types[ref.node].outputs
    if ref.port >= len(outputs):
        return None
    ta = outputs[ref.port]
    if ta.is_fixed:
        return ta.fixed
    decision = plan.nodes[ref.node].attrs.get(ta)
    return None if decision is None else decision.dtype


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


def rewrite_model(
    model: ModelFile,
    *,
    target: str | Target = "auto",
    precision: Precision | str = "auto",
    lists: str | os.PathLike[str] = "default",
    lists_file: str | os.PathLike[str] | None = None,
    add: Mapping[str, Iterable[str] | str] | None = None,
    remove: Mapping[str, Iterable[str] | str] | None = None,
    level: str | None = None,
    exclude: str | Sequence[str] | None = None,
    fetches: Sequence[str] | None = None,
    tags: Sequence[str] | None = None,
    signatures: Sequence[str] | None = None,
    keep_io_types: bool = True,
    tensorflow_bugs: bool = False,
    use_env: bool = True,
    planner: str | None = None,
    progress: Progress | None = None,
    compiled: bool = False,
) -> ModelRewrite:
    """Rewrite every selected graph of ``model`` in memory.  ``model`` is not modified.

    ``tags`` selects the MetaGraphDefs of a SavedModel by their exact tag set (others are
    kept as they are).  ``signatures`` restricts the rewrite to what those signatures run:
    the library functions they call (directly or not), and, for TF1-style graphs whose
    signatures name main-graph tensors, the main-graph nodes they depend on; everything
    else is kept float32.  ``keep_io_types`` (default) keeps the dtypes of every signature
    input and output and of a frozen graph's outputs; without it outputs may become low
    precision and the signature defs are updated to match (TF2 function signatures never
    change).  ``fetches`` adds main-graph nodes to preserve.  The other options are
    :func:`~amp_rewrite.api.rewrite_graph_def`'s.

    Raises :class:`AmpRewriteError` (or a subclass) for unknown tags or signatures, broken
    signature tensors and everything ``rewrite_graph_def`` rejects.
    """
    tgt = resolve_target(target)
    op_lists, _ = resolve_lists(
        lists, target=tgt, precision=precision, lists_file=lists_file, add=add, remove=remove,
        level=level, environ=os.environ if use_env else {},
    )
    options: dict[str, Any] = dict(
        target=tgt, precision=precision, lists=lists, lists_file=lists_file, add=add, remove=remove,
        level=level, tensorflow_bugs=tensorflow_bugs, use_env=use_env, functions="all",
        planner=planner, compiled=compiled,
    )
    if model.format == "graph_def":
        if tags is not None:
            _select_meta_graphs(model, tags)  # raises: a GraphDef has no tags
        if signatures:
            _check_signatures(model, [], signatures)  # raises likewise
        if progress:
            progress.stage("rewriting the graph")
        if keep_io_types:
            # The graph's outputs keep their dtypes; fetches are preserved on top of them.
            keep = sorted(_graph_outputs(model.message) | set(fetches or ()))
        else:
            keep = list(fetches or ())  # TensorFlow's behaviour: only fetches are preserved
        result = rewrite_graph_def(model.message, exclude=exclude, fetches=keep, **options)
        preserved = frozenset(n for k in keep if (n := _node_of(k)))
        graph = GraphRewrite("graph", None, (), model.message, result, preserved)
        return ModelRewrite(model, result.graph_def, (graph,), _model_report(model, [graph]), op_lists, tgt)

    indices = _select_meta_graphs(model, tags)
    if signatures:
        _check_signatures(model, indices, signatures)
    message = type(model.message)()
    message.CopyFrom(model.message)
    metas_out = list(message.meta_graphs) if model.format == "saved_model" else [message]
    graphs: list[GraphRewrite] = []
    for step, i in enumerate(indices):
        meta = model.meta_graphs[i]
        tags_i = tuple(meta.meta_info_def.tags)
        label = "graph" if model.format == "meta_graph" else f"meta graph {i} [{','.join(tags_i)}]"
        if progress:
            progress.stage(f"rewriting {label}", step, len(indices))
        _check_tensors_exist(meta, model.path)
        preserve = _preserved_nodes(meta, keep_io_types, fetches)
        scope_keep: set[str] | None = None
        keep_functions = None
        if signatures:
            keep_functions, scope_keep = _signature_scope(meta, signatures)
        result = rewrite_graph_def(meta.graph_def, fetches=sorted(preserve), exclude=exclude,
                                   keep_float32=scope_keep, **options)
        if keep_functions is not None:
            result = _restrict_to_functions(result, meta.graph_def, keep_functions)
        out_meta = metas_out[i]
        out_meta.graph_def.CopyFrom(result.graph_def)
        if not keep_io_types:
            _update_output_dtypes(out_meta, result)
        graphs.append(GraphRewrite(label, i, tags_i, meta.graph_def, result, frozenset(preserve)))
    if progress:
        progress.stage("rewrote the model", len(indices), len(indices))
    return ModelRewrite(model, message, tuple(graphs), _model_report(model, graphs, message), op_lists, tgt)


def _preserved_nodes(meta: Any, keep_io_types: bool, fetches: Sequence[str] | None) -> set[str]:
    """Main-graph nodes whose dtypes must not change: what the MetaGraphDef refers to by
    name, the graph's outputs, the signature outputs unless ``keep_io_types`` is off, and
    ``fetches``."""
    gd = meta.graph_def
    nodes = {n.name for n in gd.node}
    sig_in, sig_out = _signature_nodes(meta)
    preserve = _infrastructure_nodes(meta) | sig_in
    outputs = _graph_outputs(gd)
    preserve |= (outputs | sig_out) if keep_io_types else (outputs - sig_out)
    for f in fetches or ():
        name = _node_of(f)
        if name is None or name not in nodes:
            raise InvalidGraphError(f"fetch {f!r} names a node that does not exist", node=name)
        preserve.add(name)
    return preserve & nodes


def _signature_scope(meta: Any, signatures: Sequence[str]) -> tuple[set[str], set[str] | None]:
    """What ``signatures`` run: the library functions they reach, and the names of the rest
    of a TF1-style main graph, to keep float32 (``None`` when there is nothing to keep)."""
    gd = meta.graph_def
    _, roots = _signature_nodes(meta, signatures)
    closure = _closure(gd, roots)
    sub = type(gd)()
    sub.library.CopyFrom(gd.library)
    sub.node.extend(n for n in gd.node if n.name in closure)
    keep_functions = reachable_functions(sub)
    if meta.HasField("object_graph_def"):
        # TF2: the main graph holds only placeholders, variables and calls; nothing to keep.
        return keep_functions, None
    # TF1 style: the signatures' nodes live in the main graph.  Keep the rest float32 by
    # exact name (``keep_float32``, which names function body nodes too; that can only keep
    # more nodes float32, which is safe), never through the user's --exclude patterns, which
    # also match path components.
    others = {n.name for n in gd.node} - closure
    return keep_functions, (others or None)


def _update_output_dtypes(meta: Any, result: RewriteResult) -> None:
    """Set each dense signature output's dtype to what the rewrite made it.  Mutates ``meta``."""
    for sig in meta.signature_def.values():
        for info in sig.outputs.values():
            if info.WhichOneof("encoding") == "name":
                new = _output_dtype(result, info.name)
                if new is not None and new != info.dtype:
                    info.dtype = new


#: FunctionDef attributes ``tf.function(jit_compile=True)`` sets: compile with XLA, and never
#: inline the function into an uncompiled caller (which would drop the compilation).
_XLA_ATTRS = ("_XlaMustCompile", "_noinline")


def mark_for_xla(rewrite: ModelRewrite, signatures: Sequence[str] | None = None) -> dict[str, list[str]]:
    """Mark the functions a rewritten TF2 SavedModel serves for XLA compilation.

    In every rewritten MetaGraphDef of ``rewrite``, the function each signature's outputs
    come from (the main graph's ``StatefulPartitionedCall``/``PartitionedCall`` into the
    library) gets ``_XlaMustCompile=true`` and ``_noinline=true``, as
    ``tf.function(jit_compile=True)`` sets them; so do the concrete functions of the object
    graph's ``tf.function`` endpoints (``model.export``'s ``serve``), unless ``signatures``
    restricts the marking to those signatures.  Functions they call are compiled as part of
    them.  Signatures whose key starts with ``__`` (``__saved_model_init_op``) are not
    served.  Mutates ``rewrite.message`` (the new message, never the input's) and returns,
    per graph label, the marked function names, sorted.

    Assumes the rewrite kept function names (it does).  XLA compiles a marked function when
    it is first called: one with an op XLA has no kernel for fails then, not here.

    Raises
    ------
    AmpRewriteError
        If a rewritten MetaGraphDef has no such function (a TF1-style graph, whose
        signatures name main-graph tensors run by a Session).
    """
    message = rewrite.message
    metas = list(message.meta_graphs) if rewrite.source.format == "saved_model" else [message]
    out: dict[str, list[str]] = {}
    for graph in rewrite.graphs:
        meta = metas[graph.index if graph.index is not None else 0]
        nodes = {n.name: n for n in meta.graph_def.node}
        names: set[str] = set()
        for key, sig in meta.signature_def.items():
            if key.startswith("__") or (signatures and key not in signatures):
                continue
            for info in sig.outputs.values():
                for tensor in _tensor_names(info):
                    node = nodes.get(_node_of(tensor) or "")
                    if node is not None and node.op in ("StatefulPartitionedCall", "PartitionedCall"):
                        names.add(node.attr["f"].func.name)
        if not signatures and meta.HasField("object_graph_def"):
            for obj in meta.object_graph_def.nodes:
                if obj.WhichOneof("kind") == "function":
                    names.update(obj.function.concrete_functions)
        library = {f.signature.name: f for f in meta.graph_def.library.function}
        names &= set(library)
        if not names:
            raise AmpRewriteError(
                f"--xla: {graph.label} has no signature function to compile (its signatures name "
                "main-graph tensors, run by a TF1 Session); XLA marking needs a TF2 SavedModel")
        for name in sorted(names):
            for attr in _XLA_ATTRS:
                library[name].attr[attr].b = True
        out[graph.label] = sorted(names)
    log.info("marked for XLA: %s", "; ".join(f"{k}: {', '.join(v)}" for k, v in out.items()))
    return out


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
    from ..graph.io import _called_functions, _calls_closure

    closure = _closure(graph_def, roots)
    library = {f.signature.name for f in graph_def.library.function}
    called = _called_functions((nd for nd in graph_def.node if nd.name in closure), library)
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


# ------------------------------------------------------------------------------ writing


def _serialize(message: Any, text: bool) -> bytes:
    if text:
        from google.protobuf import text_format

        return text_format.MessageToString(message).encode("utf-8")
    return message.SerializeToString(deterministic=True)


def _fingerprint(directory: str, old: bytes | None) -> bytes | None:
    """A fingerprint for the SavedModel in ``directory`` (with its new ``saved_model.pb``).

    TensorFlow does not check ``fingerprint.pb`` on load, but reads it as the model's
    identity (metrics, ``tf.saved_model.experimental.read_fingerprint``, caches keyed on
    its singleprint).  A stale one would say the rewritten model is the original, so it is
    recomputed the way ``tf.saved_model.save`` does.  TensorFlow puts a random UUID in it;
    here the UUID is derived from the old UUID and the new checksum, so the same input and
    options give the same bytes.  When ``saved_model.pb`` is unchanged (its checksum is the
    old one) the model is the same, and so is its UUID: rewriting a rewritten model again
    then gives the same bytes, not a new identity on every pass.  Returns ``None`` (and the
    file is dropped) if TensorFlow cannot fingerprint the directory.
    """
    from tensorflow.core.protobuf import fingerprint_pb2
    from tensorflow.python.saved_model.pywrap_saved_model import fingerprinting

    try:
        fp = fingerprint_pb2.FingerprintDef.FromString(fingerprinting.CreateFingerprintDef(directory))
    except Exception as exc:  # noqa: BLE001 - pybind raises its own exception types
        log.warning("fingerprint.pb dropped: TensorFlow could not fingerprint the output (%s)", exc)
        return None
    old_fp = fingerprint_pb2.FingerprintDef()
    if old:
        try:
            old_fp = fingerprint_pb2.FingerprintDef.FromString(old)
        except Exception:  # noqa: BLE001
            old_fp = fingerprint_pb2.FingerprintDef()
    if old_fp.uuid and old_fp.saved_model_checksum == fp.saved_model_checksum:
        fp.uuid = old_fp.uuid
    else:
        digest = hashlib.sha256(f"{old_fp.uuid}:{fp.saved_model_checksum}".encode()).digest()
        fp.uuid = str(int.from_bytes(digest[:16], "big"))
    return fp.SerializeToString(deterministic=True)


def _copy_regular(source: str, dest: str) -> None:
    """``shutil.copy2`` for regular files only: a FIFO or device put into the model since
    :func:`_saved_model_size` checked it would block the copy or never end it."""
    if not stat.S_ISREG(os.lstat(source).st_mode):
        raise GraphFormatError("not a regular file; a SavedModel holds only files and directories", path=source)
    shutil.copy2(source, dest)


def _fill_saved_model(src: str, message: Any, text: bool) -> Callable[[str], None]:
    """The ``fill`` for :meth:`Staging.add_tree`: a copy of the SavedModel ``src`` (checked
    by :func:`_saved_model_size`) with ``message`` as its ``saved_model.pb`` (``.pbtxt``
    if ``text``) and a new ``fingerprint.pb``.  Writes only into the directory it is given."""
    def fill(tmp: str) -> None:
        skip = {SAVED_MODEL_PB, SAVED_MODEL_PBTXT, FINGERPRINT_PB}
        # Copy everything else: variables/, assets/, assets.extra/, and unknown files.  Links
        # are copied as links, never followed (they stay inside the model, relative).
        shutil.copytree(src, tmp, symlinks=True, dirs_exist_ok=True, copy_function=_copy_regular,
                        ignore=lambda d, names: [n for n in names if d == src and n in skip])
        name = SAVED_MODEL_PBTXT if text else SAVED_MODEL_PB
        with open(os.path.join(tmp, name), "wb") as f:
            f.write(_serialize(message, text))
        old_fp = os.path.join(src, FINGERPRINT_PB)
        if os.path.exists(old_fp) and not text:
            with open(old_fp, "rb") as f:
                new_fp = _fingerprint(tmp, f.read())
            if new_fp is not None:
                with open(os.path.join(tmp, FINGERPRINT_PB), "wb") as f:
                    f.write(new_fp)

    return fill


def stage_model(staging: Staging, rewrite: ModelRewrite, dst: str | os.PathLike[str], *,
                overwrite: bool = False) -> None:
    """Stage the rewritten model at ``dst`` in the input's form.  Writes only temporaries.

    Without ``overwrite`` an existing ``dst`` (other than an empty directory) is refused,
    now or, if it appears while the command runs, at commit.  A SavedModel's directory is
    checked (:func:`_saved_model_size`), and its size against the free space, before
    anything is copied.
    """
    src = rewrite.source
    out = os.fspath(dst)
    check_output(src.path, out, overwrite=overwrite)
    if src.format == "saved_model":
        if os.path.lexists(out) and not os.path.isdir(out):
            raise AmpRewriteError(f"OUTPUT {out} is a file, but the output is a SavedModel directory")
        size = _saved_model_size(src.path)
        where = os.path.dirname(os.path.abspath(out))
        while not os.path.isdir(where):
            where = os.path.dirname(where)
        free = shutil.disk_usage(where).free
        if size > free:
            raise AmpRewriteError(f"OUTPUT {out}: the copy of the model needs {size / 1e6:,.0f} MB and "
                                  f"only {free / 1e6:,.0f} MB are free there")
        staging.add_tree(out, _fill_saved_model(src.path, rewrite.message, src.text), replace=overwrite)
        return
    if os.path.isdir(out):
        raise AmpRewriteError(f"OUTPUT {out} is a directory, but the output is a single file")
    _, text = model_format(out)
    staging.add_file(out, _serialize(rewrite.message, text), replace=overwrite)


#: How the files :func:`dump_files` writes begin: a --dump-dir holding such files would have
#: them replaced by the next run.
_DUMP_PREFIXES = ("graphdef_preop_", "graphdef_AutoMixedPrecision_", "paintbuckets_AutoMixedPrecision_")


def _safe_label(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_") or "graph"


def dump_files(rewrite: ModelRewrite) -> dict[str, bytes]:
    """The graph before and after, as text protos, named like TensorFlow's LOG_PATH dumps:
    ``graphdef_preop_<id>.pb.txt``, ``graphdef_AutoMixedPrecision_<id>.pb.txt`` and
    ``paintbuckets_AutoMixedPrecision_<id>.txt`` (the effective lists).  No timestamps, so
    the same input gives the same files.  Pure."""
    from google.protobuf import text_format

    buckets = []
    for title, category in (("AllowList", "allow"), ("DenyList", "deny"), ("InferList", "infer"),
                            ("ClearList", "clear")):
        buckets.append(f"{title}:\n" + "".join(f"{op}\n" for op in sorted(getattr(rewrite.lists, category))))
    files = {}
    for g in rewrite.graphs:
        gid = _safe_label(g.label)
        files[f"graphdef_preop_{gid}.pb.txt"] = text_format.MessageToString(g.before).encode()
        files[f"graphdef_AutoMixedPrecision_{gid}.pb.txt"] = text_format.MessageToString(
            g.result.graph_def).encode()
        files[f"paintbuckets_AutoMixedPrecision_{gid}.txt"] = "\n".join(buckets).encode()
    return files


def _unchanged(model: ModelFile, reference: ModelRewrite, reason: str) -> ModelRewrite:
    """``model`` as it is, as a :class:`ModelRewrite` whose report says why: settings and
    node count from ``reference`` (a rewrite of the same model), no conversions, no casts."""
    report = {k: v for k, v in reference.report.items() if k != "graphs"}
    report.update({k: 0 for k in _COUNTS if k != "total_nodes"}, skipped=reason, graphs=[])
    # The signatures run the float32 model: the reference's totals, nothing converted.
    report["signatures"] = {key: {**row, "converted": 0, "casts_to_low": 0, "casts_to_high": 0,
                                  "by_op": {op: {**c, "converted": 0} for op, c in row["by_op"].items()}}
                            for key, row in reference.report.get("signatures", {}).items()}
    return ModelRewrite(model, model.message, (), report, reference.lists, reference.target)


def _float32_kept(tuned: Any, opts: Any) -> str:
    """Why autotune kept the float32 model (the report's ``skipped``)."""
    if opts.max_rel_error is not None and tuned.rel_error and all(e > opts.max_rel_error for e in tuned.rel_error.values()):
        return f"autotune: no candidate's outputs are within {opts.max_rel_error:g} of float32's"
    return (f"autotune: no rewrite was faster than float32 by {opts.min_gain:.0%} beyond chance in "
            f"{tuned.rounds} rounds on this machine")


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


def check_options(
    src: str | os.PathLike[str],
    *,
    target: str | Target = "auto",
    precision: str = "auto",
    lists: str | os.PathLike[str] = "default",
    lists_file: str | os.PathLike[str] | None = None,
    add: Mapping[str, Iterable[str] | str] | None = None,
    remove: Mapping[str, Iterable[str] | str] | None = None,
    level: str | None = None,
    exclude: str | Sequence[str] | None = None,
    planner: str | None = None,
    use_env: bool = True,
) -> None:
    """Check the rewrite options and the kind of ``src`` without reading the model or
    looking at any output path: an unknown target, precision, list profile, level, list edit
    or planner, a bad ``exclude`` pattern, and a Keras model file, raise
    :class:`AmpRewriteError` (or a subclass).  :func:`rewrite_saved_model` and the CLI call
    it first, so a bad option is reported as such even when OUTPUT exists already.

    List *files* (``lists`` naming a file, ``lists_file``) are not read here: one may also be
    named as an output, and refusing that ("an input is never modified") comes first; they
    are read, and checked, by the rewrite itself."""
    from ..plan.exclude import NameMatcher
    from ..plan.lists import PLANNERS
    from ..plan.targets import resolve_precision

    check_not_keras(src)
    tgt = resolve_target(target)
    chosen, _ = resolve_precision(precision, tgt)
    if lists_file is None and not os.path.isfile(os.fspath(lists)):
        resolve_lists(lists, target=tgt, precision=chosen, add=add, remove=remove,
                      level=level, environ=os.environ if use_env else {})
    NameMatcher.compile(exclude)
    if planner is not None and planner not in PLANNERS:
        raise AmpRewriteError(f"planner must be one of {', '.join(PLANNERS)}, not {planner!r}")


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


def rewrite_saved_model(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    target: str | Target = "auto",
    precision: Precision | str = "auto",
    lists: str | os.PathLike[str] = "default",
    lists_file: str | os.PathLike[str] | None = None,
    add: Mapping[str, Iterable[str] | str] | None = None,
    remove: Mapping[str, Iterable[str] | str] | None = None,
    level: str | None = None,
    exclude: str | Sequence[str] | None = None,
    fetches: Sequence[str] | None = None,
    tags: Sequence[str] | None = None,
    signatures: Sequence[str] | None = None,
    keep_io_types: bool = True,
    tensorflow_bugs: bool = False,
    use_env: bool = True,
    planner: str | None = None,
    xla: bool = False,
    autotune: "AutotuneOptions | None" = None,
    overwrite: bool = False,
    report_file: str | os.PathLike[str] | None = None,
    dump_dir: str | os.PathLike[str] | None = None,
    graph_file: str | os.PathLike[str] | None = None,
    tensorboard_dir: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Rewrite the model at ``src`` to mixed precision and write it to ``dst``; return the report.

    ``src`` is a SavedModel directory, a MetaGraphDef (``.meta``) or a frozen GraphDef
    (``.pb``/``.pbtxt``); ``dst`` is written in the same form (a GraphDef or MetaGraphDef
    output is text when its name ends in ``.pbtxt``/``.txt``).  The rewrite options
    (``target`` ... ``use_env``) are :func:`rewrite_model`'s.

    Optional extra outputs: ``report_file`` (the report as JSON), ``dump_dir`` (see
    :func:`dump_files`), ``graph_file`` (a drawing: ``.svg``, ``.html`` or ``.dot``, see
    :mod:`amp_rewrite.report.draw`) and ``tensorboard_dir`` (before/after event files).
    ``progress`` draws a progress line (see :class:`~amp_rewrite.progress.Progress`).

    ``autotune`` (an :class:`~amp_rewrite.autotune.AutotuneOptions`) measures instead of
    trusting one plan: every candidate rewrite and the float32 original are timed on this
    machine with random inputs (:func:`~amp_rewrite.autotune.autotune_model`) and the
    fastest is written -- the input unchanged when float32 wins.  The report then has an
    ``autotune`` section (times, output errors, the choice).  The drawing and dump outputs
    describe one rewrite and are not available with it.

    ``xla`` (``--xla``) marks the functions of a TF2 SavedModel that its signatures call, and
    its ``tf.function`` endpoints (``serve``), for XLA compilation (:func:`mark_for_xla`), so
    ``tf.saved_model.load`` runs them under XLA; the rewrite is planned for it
    (``compiled=True``).  The report's ``xla`` section names the marked functions.  Not with
    ``autotune``, which times the models as they are, nor for a TF1 graph or a frozen
    GraphDef, which have no such functions.

    Everything is written atomically and together: on any error (or Ctrl-C) no output,
    extra or not, is left behind.  ``src`` is never modified; ``dst`` equal to or inside
    ``src``, or an existing non-empty ``dst`` without ``overwrite``, is refused before any
    work.  So are an existing ``report_file`` or ``graph_file`` without ``overwrite``, a
    ``dump_dir`` holding dumps without it, any output that is a device, FIFO or socket
    (even with it), and any output that would replace an input (``src``, ``lists_file``,
    ``lists`` when it is a file).  A file of ``dump_dir`` or ``tensorboard_dir`` that
    exists is replaced only with ``overwrite``.  Raises :class:`AmpRewriteError` (or a
    subclass) with a one-line message.

    The report is JSON-ready: ``input``, ``output``, ``format``, the settings, totals over
    every rewritten graph (``total_nodes``, ``converted_nodes``, ``casts_to_low``...,
    ``skipped``) and ``graphs``: one entry per rewritten graph (a SavedModel's MetaGraphDefs)
    with its ``tags``, ``signatures`` and the core report of
    :func:`~amp_rewrite.api.rewrite_graph_def` (``nodes``, ``casts``, ``functions``...).
    """
    src_s, dst_s = os.fspath(src), os.fspath(dst)
    if not os.path.exists(src_s):
        raise GraphFormatError("no such file or directory", path=src_s)
    # Every option first: a bad one is reported as such, not as "OUTPUT exists".
    check_options(src_s, target=target, precision=precision, lists=lists, lists_file=lists_file, add=add,
                  remove=remove, level=level, exclude=exclude, planner=planner, use_env=use_env)
    check_output(src_s, dst_s, overwrite=overwrite)
    check_writable(dst_s)
    for extra, what in ((report_file, "--report"), (graph_file, "--graph"), (dump_dir, "--dump-dir"),
                        (tensorboard_dir, "--tensorboard")):
        if extra is not None and is_within(os.fspath(extra), src_s) and os.path.isdir(src_s):
            raise AmpRewriteError(f"{what} {os.fspath(extra)} is inside INPUT; the input is never modified")
        if extra is not None and os.path.realpath(os.fspath(extra)) == os.path.realpath(src_s):
            raise AmpRewriteError(f"{what} is the same as INPUT; the input is never modified")
        if extra is not None:
            check_writable(os.fspath(extra))
    # Extra files follow OUTPUT's rule.  --dump-dir and --tensorboard are directories written
    # into, not replaced: their files are checked one by one when staged (an existing one
    # needs overwrite), and a dump directory holding an earlier run's dumps, whose names
    # every run repeats, is refused here already.
    for extra, what in ((report_file, "--report"), (graph_file, "--graph")):
        if extra is not None:
            check_replaceable(os.fspath(extra), overwrite=overwrite, what=what)
    if dump_dir is not None and not overwrite and os.path.isdir(dump_dir):
        dumps = sorted(n for n in os.listdir(dump_dir) if n.startswith(_DUMP_PREFIXES))
        if dumps:
            raise AmpRewriteError(f"--dump-dir {os.fspath(dump_dir)} holds dumps already ({dumps[0]}...); "
                                  "pass --overwrite to replace them")
    outputs = [(os.path.abspath(os.fspath(path)), what, is_dir) for path, what, is_dir in (
        (dst_s, "OUTPUT", os.path.isdir(src_s)), (report_file, "--report", False), (graph_file, "--graph", False),
        (dump_dir, "--dump-dir", True), (tensorboard_dir, "--tensorboard", True)) if path is not None]
    # Every file read is protected, even with overwrite: INPUT, and the list files.
    inputs = [(src_s, "INPUT")]
    if lists_file is not None:
        inputs.append((os.fspath(lists_file), "--lists-file"))
    if os.path.isfile(os.fspath(lists)):
        inputs.append((os.fspath(lists), "--lists"))
    # Only OUTPUT is replaced as a whole; the extra directories are written into.
    check_not_input([(p, w, d and w == "OUTPUT") for p, w, d in outputs], inputs)
    check_distinct_outputs(outputs)
    if graph_file is not None:
        from ..report.draw import graph_format

        graph_format(graph_file)  # an unknown extension fails before the work
    if autotune is not None:
        if graph_file is not None or tensorboard_dir is not None or dump_dir is not None:
            raise AmpRewriteError("--autotune writes the fastest model and its report; --graph, "
                                  "--tensorboard and --dump-dir describe a single rewrite and cannot go with it")
        autotune.check()
    if xla and autotune is not None:
        raise AmpRewriteError("--xla cannot go with --autotune: autotune times the candidates "
                              "without XLA, so its choice would not hold for the compiled model")
    model = load_model(src_s)
    if xla and model.format != "saved_model":
        raise AmpRewriteError(f"--xla marks a TF2 SavedModel's functions for XLA; INPUT is a "
                              f"{model.format.replace('_', ' ')}, which has none")
    options: dict[str, Any] = dict(
        target=target, precision=precision, lists=lists, lists_file=lists_file, add=add,
        remove=remove, level=level, exclude=exclude, fetches=fetches, signatures=signatures,
        keep_io_types=keep_io_types, tensorflow_bugs=tensorflow_bugs, use_env=use_env, planner=planner,
    )
    if xla:
        options["compiled"] = True  # plan for XLA's fusion (cost_model.node_cost)
    tuned = None
    if autotune is None:
        rewrite = rewrite_model(model, tags=tags, progress=progress, **options)
    else:
        from ..autotune import autotune_model

        if progress:
            progress.stage("autotuning: rewriting and timing each candidate")
        tuned = autotune_model(model, autotune, tags=tags, **options)
        rewrite = tuned.rewrite if tuned.rewrite is not None else _unchanged(
            model, rewrite_model(model, tags=tags, **options), _float32_kept(tuned, autotune))
    report = dict(rewrite.report)
    if xla:
        report["xla"] = {"compiled_functions": mark_for_xla(rewrite, signatures)}
    if tuned is not None:
        report["autotune"] = tuned.as_dict()
    report["output"] = os.path.abspath(dst_s)
    if progress:
        progress.stage("writing the output")
    with Staging(protect=[path for path, _ in inputs]) as staging:
        # OUTPUT is staged first, so the commit moves it last (see Staging.commit).
        stage_model(staging, rewrite, dst_s, overwrite=overwrite)
        if report_file is not None:
            staging.add_file(report_file, json.dumps(report, indent=1).encode("utf-8") + b"\n", replace=overwrite)
        if dump_dir is not None:
            for name, data in dump_files(rewrite).items():
                staging.add_file(os.path.join(os.fspath(dump_dir), name), data, replace=overwrite)
        if graph_file is not None:
            from ..report.draw import render_file

            staging.add_file(graph_file, render_file(rewrite, graph_file), replace=overwrite)
        if tensorboard_dir is not None:
            from ..report.draw import tensorboard_files

            for rel, data in tensorboard_files(rewrite).items():
                staging.add_file(os.path.join(os.fspath(tensorboard_dir), rel), data, replace=overwrite)
        staging.commit()
    log.info("wrote %s: %s", dst_s, summary_line(report))
    return report
