"""TensorBoard event files of a rewrite (:func:`tensorboard_files`): ``before/`` and
``after/`` runs holding the GraphDef before and after, the after graph's nodes annotated
with an ``_amp_rewrite`` attr holding their decision."""

from __future__ import annotations

import os
import re
import tempfile
import time
from typing import Any, Iterable, Mapping

from .drawable import DrawableModel, DrawableResult, _results

__all__ = ["tensorboard_files"]


def _annotated(result: DrawableResult) -> Any:
    """A copy of the rewritten GraphDef whose nodes carry an ``_amp_rewrite`` string attr with
    their decision, which TensorBoard shows in the node's info panel."""
    gd = type(result.graph_def)()
    gd.CopyFrom(result.graph_def)

    def annotate(node_defs: Iterable[Any], section: Mapping[str, Any]) -> None:
        nodes = section.get("nodes", {})
        casts = {c["name"]: c for c in section.get("casts", ())}
        for nd in node_defs:
            if nd.name in casts:
                text = f"cast inserted by amp_rewrite (to {casts[nd.name]['dtype']})"
            elif nd.name in nodes:
                d = nodes[nd.name]
                text = f"{d['color']} {d['dtype']}: {d['reason']}"
            else:
                continue
            nd.attr["_amp_rewrite"].s = text.encode("utf-8")

    annotate(gd.node, result.report)
    functions = result.report.get("functions", {})
    for fdef in gd.library.function:
        if fdef.signature.name in functions:
            annotate(fdef.node_def, functions[fdef.signature.name])
    return gd


def _event_file(graph_def: Any, wall_time: float) -> bytes:
    """A TensorBoard event file (TFRecord of ``Event`` protos) holding ``graph_def``."""
    import tensorflow as tf
    from tensorflow.core.util import event_pb2

    events = [
        event_pb2.Event(wall_time=wall_time, file_version="brain.Event:2"),
        event_pb2.Event(wall_time=wall_time, step=0, graph_def=graph_def.SerializeToString(deterministic=True)),
    ]
    # TFRecord framing needs masked CRC32C; TensorFlow's writer provides it.
    with tempfile.TemporaryDirectory(prefix="amp-rewrite-tb-") as tmp:
        path = os.path.join(tmp, "events")
        with tf.io.TFRecordWriter(path) as writer:
            for event in events:
                writer.write(event.SerializeToString())
        with open(path, "rb") as f:
            return f.read()


def tensorboard_files(rewrite: DrawableModel | DrawableResult, *, before: Any = None,
                      wall_time: float | None = None) -> dict[str, bytes]:
    """Event files for TensorBoard's graph dashboard, keyed by path relative to the log dir:
    ``before/events.out.tfevents.<time>.amp-rewrite`` and ``after/...`` (one run each; with
    several meta graphs, ``before-<label>``...).  For a single :class:`RewriteResult`, pass
    the input GraphDef as ``before`` to get the ``before`` run.  Writes nothing."""
    wall = time.time() if wall_time is None else wall_time
    results = [(label, result) for label, result, _ in _results(rewrite)]
    graphs = getattr(rewrite, "graphs", None)
    befores = [g.before for g in graphs] if graphs is not None else [before]
    files: dict[str, bytes] = {}
    name = f"events.out.tfevents.{int(wall)}.amp-rewrite"
    for (label, result), source in zip(results, befores, strict=True):
        suffix = "" if len(results) == 1 else "-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_")
        if source is not None:
            files[f"before{suffix}/{name}"] = _event_file(source, wall)
        files[f"after{suffix}/{name}"] = _event_file(_annotated(result), wall)
    return files
