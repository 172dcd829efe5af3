"""Run a GraphDef on this machine's CPU, exactly as given.

The rewritten graph targets a GPU, but every op the strategies draw has CPU float16 and
bfloat16 kernels, so it runs here: nodes pinned to a GPU are placed on the CPU (soft
placement) and Grappler is off, so TensorFlow neither rewrites nor folds anything.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np

from .facts import output_dtypes, library_of, parse_input, sinks

__all__ = ["run_graph", "graph_outputs", "loop_frame_nodes", "random_feeds"]


def _session_config() -> Any:
    from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2

    config = config_pb2.ConfigProto(
        allow_soft_placement=True,
        device_count={"GPU": 0},
        intra_op_parallelism_threads=1,
        inter_op_parallelism_threads=1,
    )
    rewrite = config.graph_options.rewrite_options
    rewrite.disable_meta_optimizer = True
    rewrite.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    config.graph_options.optimizer_options.opt_level = -1  # L0: no constant folding
    config.graph_options.optimizer_options.do_constant_folding = False
    config.graph_options.optimizer_options.do_function_inlining = False
    return config


def run_graph(
    graph_def: Any, feeds: Mapping[str, np.ndarray] | None, outputs: Sequence[str]
) -> list[np.ndarray]:
    """Import ``graph_def`` into a fresh graph and evaluate ``outputs`` (tensor names).

    Raises whatever TensorFlow raises when the graph does not import or run.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=graph, config=_session_config()) as session:
        values = session.run(list(outputs), dict(feeds or {}))
    return [np.asarray(v) for v in values]


def loop_frame_nodes(graph_def: Any) -> set[str]:
    """Main-graph nodes inside a v1 while frame (between Enter and Exit); not fetchable."""
    consumers: dict[str, list[str]] = {}
    for node in graph_def.node:
        for text in node.input:
            consumers.setdefault(parse_input(text)[0], []).append(node.name)
    ops = {n.name: n.op for n in graph_def.node}
    inside: set[str] = set()
    stack = [n.name for n in graph_def.node if n.op == "Enter"]
    while stack:
        name = stack.pop()
        if name in inside:
            continue
        inside.add(name)
        if ops[name] == "Exit":
            continue
        stack.extend(consumers.get(name, ()))
    return {n for n in inside if ops[n] != "Exit"}


def graph_outputs(graph_def: Any) -> list[str]:
    """Tensor names of every output of every sink node outside a loop frame."""
    library = library_of(graph_def)
    frame = loop_frame_nodes(graph_def)
    by_name = {n.name: n for n in graph_def.node}
    out = []
    for name in sinks(graph_def):
        if name in frame:
            continue
        for port, _ in enumerate(output_dtypes(by_name[name], library)):
            out.append(f"{name}:{port}")
    return out


def random_feeds(graph_def: Any, seed: int = 0, low: float = -1.0, high: float = 1.0) -> dict[str, np.ndarray]:
    """Uniform values for every float32 Placeholder with a fully defined shape."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for node in graph_def.node:
        if node.op != "Placeholder":
            continue
        if node.attr["dtype"].type != 1:
            raise ValueError(f"cannot make a feed for non-float32 Placeholder {node.name!r}")
        dims = [d.size for d in node.attr["shape"].shape.dim]
        if node.attr["shape"].shape.unknown_rank or any(d < 0 for d in dims):
            raise ValueError(f"Placeholder {node.name!r} has no static shape; pass feeds=")
        feeds[f"{node.name}:0"] = rng.uniform(low, high, dims).astype(np.float32)
    return feeds
