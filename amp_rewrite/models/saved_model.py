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

This module holds the entry point and the writer; the stages live beside it, and every name
is importable from here as before:

* :mod:`.formats` -- reading model files (:func:`load_model`, :class:`ModelFile`);
* :mod:`.signatures` -- what a MetaGraphDef refers to, and so what must keep its dtypes;
* :mod:`.rewriting` -- :func:`rewrite_model` and :func:`mark_for_xla`;
* :mod:`.summary` -- the model's report, :func:`scope_summaries`, :func:`summary_line`, :func:`summary_table`;
* :mod:`.checks` -- :func:`check_options` and the output paths' rules;
* :mod:`.tuning` -- what ``autotune=`` must provide.

``autotune`` is passed in, never imported: :mod:`amp_rewrite.autotune` builds on this
package (it rewrites and stages each candidate with :func:`rewrite_model` and
:func:`stage_model`), so this package knows the tuner only by the methods it calls
(:class:`~.tuning.Autotuner`: ``check()`` and ``tune_model(...)``), which
:class:`~amp_rewrite.autotune.AutotuneOptions` has.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import stat
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..api import Precision
from ..errors import AmpRewriteError, GraphFormatError
from ..plan.targets import Target
from ..progress import Progress
from .checks import _DUMP_PREFIXES, check_autotune, check_options, check_paths, check_xla_input  # noqa: F401
from .formats import (FINGERPRINT_PB, MAX_FILE_BYTES, SAVED_MODEL_PB, SAVED_MODEL_PBTXT,  # noqa: F401
                      _KERAS_SUFFIXES, _META_SUFFIXES, _TEXT_SUFFIXES, ModelFile, ModelFormat,
                      _check_file_stat, _check_input_file, _parse, _raise_walk_error, _read, _saved_model_size,
                      check_not_keras, load_model, model_format)
from .results import _COUNTS, GraphRewrite, ModelRewrite  # noqa: F401
from .rewriting import (_XLA_ATTRS, _output_dtype, _restrict_to_functions, _rewrite_frozen_graph,  # noqa: F401
                        _rewrite_meta_graphs, _unchanged, _update_output_dtypes, mark_for_xla, rewrite_model)
from .signatures import (_VARIABLE_COLLECTIONS, _check_signatures, _check_tensors_exist, _closure,  # noqa: F401
                         _graph_outputs, _infrastructure_nodes, _node_of, _preserved_nodes, _select_meta_graphs,
                         _signature_nodes, _signature_scope, _tensor_names)
from .staging import Staging, check_output
from .summary import (GRAPH_ROW, OTHER_ROW, SAVE_RESTORE_ROW, _model_report, _reach, _scope_counts,  # noqa: F401
                      _signatures_summary, scope_summaries, summary_line, summary_table)
from .tuning import Autotuner, TunedModel, _float32_kept  # noqa: F401


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


def rewrite_saved_model(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], *,
    # The rewrite (rewrite_model's options):
    target: str | Target = "auto", precision: Precision | str = "auto", lists: str | os.PathLike[str] = "default",
    lists_file: str | os.PathLike[str] | None = None, add: Mapping[str, Iterable[str] | str] | None = None,
    remove: Mapping[str, Iterable[str] | str] | None = None, level: str | None = None,
    exclude: str | Sequence[str] | None = None, fetches: Sequence[str] | None = None,
    tags: Sequence[str] | None = None, signatures: Sequence[str] | None = None, keep_io_types: bool = True,
    tensorflow_bugs: bool = False, use_env: bool = True, planner: str | None = None,
    # What else is done and written:
    xla: bool = False, autotune: Autotuner | None = None, overwrite: bool = False,
    report_file: str | os.PathLike[str] | None = None, dump_dir: str | os.PathLike[str] | None = None,
    graph_file: str | os.PathLike[str] | None = None, tensorboard_dir: str | os.PathLike[str] | None = None,
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

    ``autotune`` (an :class:`~amp_rewrite.autotune.AutotuneOptions`, or anything with its
    :class:`~.tuning.Autotuner` methods) measures instead of
    trusting one plan: every candidate rewrite and the float32 original are timed on this
    machine with random inputs (:func:`~amp_rewrite.autotune.autotune_model`) and the
    fastest is written -- the input unchanged when float32 wins.  The report then has an
    ``autotune`` section (times, output errors, the choice).  The drawing and dump outputs
    describe one rewrite and are not available with it.

    ``xla`` (``--xla``) marks the functions of a TF2 SavedModel that its signatures call, and
    its ``tf.function`` endpoints (``serve``), for XLA compilation (:func:`mark_for_xla`), so
    ``tf.saved_model.load`` runs them under XLA; the rewrite is planned for it
    (``compiled=True``).  The report's ``xla`` section names the marked functions.  With
    ``autotune``, every candidate and the float32 model are marked and timed compiled, and the
    one written (float32 too, when it wins) is marked.  Not for a TF1 graph or a frozen
    GraphDef, which have no such functions.

    Everything is written atomically and together: on any error (or Ctrl-C) no output,
    extra or not, is left behind, and ``src`` is never modified.  Every output path is
    checked before any work (:func:`~.checks.check_paths` says what is refused).  Raises
    :class:`AmpRewriteError` (or a subclass) with a one-line message.

    The report is JSON-ready: ``input``, ``output``, ``format``, the settings, totals over
    every rewritten graph (``total_nodes``, ``converted_nodes``, ``casts_to_low``...,
    ``skipped``) and ``graphs``: one entry per rewritten graph (a SavedModel's MetaGraphDefs)
    with its ``tags``, ``signatures`` and the core report of
    :func:`~amp_rewrite.api.rewrite_graph_def` (``nodes``, ``casts``, ``functions``...).
    """
    src_s, dst_s = os.fspath(src), os.fspath(dst)
    options: dict[str, Any] = dict(
        target=target, precision=precision, lists=lists, lists_file=lists_file, add=add,
        remove=remove, level=level, exclude=exclude, fetches=fetches, signatures=signatures,
        keep_io_types=keep_io_types, tensorflow_bugs=tensorflow_bugs, use_env=use_env, planner=planner,
    )
    model, inputs = _check_and_load(src_s, dst_s, options, autotune=autotune, xla=xla, overwrite=overwrite,
                                    report_file=report_file, dump_dir=dump_dir, graph_file=graph_file,
                                    tensorboard_dir=tensorboard_dir)
    if xla:
        options["compiled"] = True  # plan for XLA's fusion (cost_model.node_cost)
    rewrite, tuned, xla_graphs = _rewrite_or_tune(model, tags, autotune, progress, options, xla=xla)
    report = _final_report(rewrite, tuned, xla=xla, signatures=signatures, dst=dst_s, xla_graphs=xla_graphs)
    if progress:
        progress.stage("writing the output")
    _write_outputs(rewrite, report, dst_s, protect=[path for path, _ in inputs], overwrite=overwrite,
                   report_file=report_file, dump_dir=dump_dir, graph_file=graph_file,
                   tensorboard_dir=tensorboard_dir)
    log.info("wrote %s: %s", dst_s, summary_line(report))
    return report


def _check_and_load(src: str, dst: str, options: Mapping[str, Any], *, autotune: Autotuner | None, xla: bool,
                    overwrite: bool, report_file: str | os.PathLike[str] | None,
                    dump_dir: str | os.PathLike[str] | None, graph_file: str | os.PathLike[str] | None,
                    tensorboard_dir: str | os.PathLike[str] | None) -> tuple[ModelFile, list[tuple[str, str]]]:
    """Every check of :func:`rewrite_saved_model` before any work, in this order: ``src``
    exists, the options (``options``: :func:`rewrite_model`'s), the paths
    (:func:`~.checks.check_paths`), autotune's, then the model is read and must suit ``xla``.
    Returns the model and the inputs to protect.  Raises :class:`AmpRewriteError` (or a
    subclass); writes nothing."""
    if not os.path.exists(src):
        raise GraphFormatError("no such file or directory", path=src)
    # Every option first: a bad one is reported as such, not as "OUTPUT exists".
    check_options(src, **{k: options[k] for k in (
        "target", "precision", "lists", "lists_file", "add", "remove", "level", "exclude", "planner", "use_env")})
    inputs = check_paths(src, dst, overwrite=overwrite, lists=options["lists"], lists_file=options["lists_file"],
                         report_file=report_file, graph_file=graph_file, dump_dir=dump_dir,
                         tensorboard_dir=tensorboard_dir)
    check_autotune(autotune, graph_file=graph_file, tensorboard_dir=tensorboard_dir, dump_dir=dump_dir)
    model = load_model(src)
    if xla:
        check_xla_input(model)
    return model, inputs


def _final_report(rewrite: ModelRewrite, tuned: TunedModel | None, *, xla: bool,
                  signatures: Sequence[str] | None, dst: str, xla_graphs: Any = None) -> dict[str, Any]:
    """The report :func:`rewrite_saved_model` returns and writes: ``rewrite``'s, with the
    ``xla`` section (marking the functions of ``xla_graphs``, by default ``rewrite``'s graphs,
    which mutates ``rewrite.message``), the ``autotune`` section and the output path."""
    report = dict(rewrite.report)
    if xla:
        report["xla"] = {"compiled_functions": mark_for_xla(rewrite, signatures, graphs=xla_graphs)}
    if tuned is not None:
        report["autotune"] = tuned.as_dict()
    report["output"] = os.path.abspath(dst)
    return report


def _rewrite_or_tune(model: ModelFile, tags: Sequence[str] | None, autotune: Autotuner | None,
                     progress: Progress | None, options: Mapping[str, Any], *, xla: bool = False
                     ) -> tuple[ModelRewrite, TunedModel | None, Any]:
    """The rewrite :func:`rewrite_saved_model` writes, the autotune result (``None`` without
    ``autotune``; with ``xla`` every candidate and float32 are timed compiled), and the graphs
    to mark for XLA when the rewrite has none of its own (``None``: its own).  When autotune
    keeps float32, the rewrite is the input unchanged (:func:`_unchanged`; a copy under
    ``xla``, to be marked with a rewrite's graphs), its report saying why.  Looks
    :func:`rewrite_model` up in this module at call time (tests replace it here).  ``model``
    is not modified."""
    if autotune is None:
        return rewrite_model(model, tags=tags, progress=progress, **options), None, None
    if progress:
        progress.stage("autotuning: rewriting and timing each candidate")
    # ``xla`` only when asked: a tuner written before it (the Autotuner protocol) still works.
    tuned = autotune.tune_model(model, tags=tags, **({"xla": True} if xla else {}), **options)
    if tuned.rewrite is not None:
        return tuned.rewrite, tuned, None
    reference = rewrite_model(model, tags=tags, **options)
    kept = _unchanged(model, reference, _float32_kept(tuned, autotune), copy=xla)
    return kept, tuned, reference.graphs if xla else None


def _write_outputs(rewrite: ModelRewrite, report: Mapping[str, Any], dst: str, *, protect: Sequence[str],
                   overwrite: bool, report_file: str | os.PathLike[str] | None,
                   dump_dir: str | os.PathLike[str] | None, graph_file: str | os.PathLike[str] | None,
                   tensorboard_dir: str | os.PathLike[str] | None) -> None:
    """Stage the model at ``dst`` and every extra output asked for, then commit them all
    together (:class:`~.staging.Staging`): on any error none is left.  ``protect`` are the
    inputs, which no output may replace.  Looks :func:`dump_files` up in this module at
    call time (tests replace it here)."""
    with Staging(protect=protect) as staging:
        # OUTPUT is staged first, so the commit moves it last (see Staging.commit).
        stage_model(staging, rewrite, dst, overwrite=overwrite)
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
