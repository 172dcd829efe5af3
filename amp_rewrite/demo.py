"""``amp-rewrite demo``: rewrite a small Keras model built in-process and show what changed.

Builds a small convolutional classifier (no download), freezes it to a GraphDef, rewrites
it for a GPU of compute capability 8.0 and for this machine, prints the report's summary
and a few decisions with their reasons, then runs the float32 and the rewritten graph in
TensorFlow on the same batch and prints how far apart their outputs are.
"""

from __future__ import annotations

import os
from typing import Any, TextIO

import numpy as np

from . import dtypes as dt
from .api import rewrite_graph_def

__all__ = ["build_demo_graph", "run_graph", "run_demo"]


def build_demo_graph(seed: int = 0) -> tuple[Any, str, str]:
    """A frozen Keras CNN: returns ``(graph_def, input tensor name, output node name)``."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((16, 16, 3)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same"),
        keras.layers.Activation("relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
        keras.layers.Softmax(),
    ])
    fn = tf.function(lambda x: model(x, training=False))
    concrete = fn.get_concrete_function(tf.TensorSpec([None, 16, 16, 3], tf.float32, name="x"))
    frozen = convert_variables_to_constants_v2(concrete)
    graph_def = frozen.graph.as_graph_def()
    input_name = frozen.inputs[0].name
    output_node = frozen.outputs[0].name.split(":")[0]
    return graph_def, input_name, output_node


def run_graph(graph_def: Any, feeds: dict[str, np.ndarray], fetch: str) -> np.ndarray:
    """Run ``fetch`` (a tensor name) of ``graph_def`` in TensorFlow with ``feeds``."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=graph) as sess:
        return np.asarray(sess.run(fetch, feeds))


def run_demo(out: TextIO, target: str = "gpu:8.0", precision: str = "float16") -> int:
    """Run the demo, writing to ``out``.  Returns 0 (a process exit code)."""
    graph_def, input_name, output_node = build_demo_graph()
    out.write(f"Built a Keras CNN in-process: {len(graph_def.node)} nodes in its frozen GraphDef.\n")
    result = rewrite_graph_def(graph_def, target=target, precision=precision,  # type: ignore[arg-type]
                               fetches=[output_node])
    r = result.report
    out.write(
        f"\nRewrite for target {r['target']} ({precision}, lists '{r['lists']}'):\n"
        f"  converted {r['converted_nodes']} of {r['total_nodes']} nodes, "
        f"{r['casts_to_low']} cast(s) to {precision}, {r['casts_to_high']} to float32\n"
    )
    if r["skipped"]:
        out.write(f"  skipped: {r['skipped']}\n")
    out.write("\n  node                                     op            colour  dtype     why\n")
    for name, node in r["nodes"].items():
        if node["op"] == "Const":
            continue
        out.write(
            f"  {name[-40:]:40s} {node['op'][:13]:13s} {node['color']:7s} {node['dtype']:9s} "
            f"{node['reason'][:70]}\n"
        )
    for cast in r["casts"]:
        out.write(f"  + {cast['name']} ({cast['source']} -> {cast['dtype']})\n")

    batch = np.random.default_rng(0).standard_normal((4, 16, 16, 3)).astype(np.float32)
    ref = run_graph(graph_def, {input_name: batch}, output_node + ":0")
    got = run_graph(result.graph_def, {input_name: batch}, output_node + ":0")
    err = float(np.max(np.abs(got.astype(np.float64) - ref)) / max(1e-12, float(np.max(np.abs(ref)))))
    out.write(
        f"\nRan both graphs on this machine: output dtype {got.dtype} (float32 before: "
        f"{ref.dtype}); max relative difference vs float32 = {err:.2e}\n"
    )
    local = rewrite_graph_def(graph_def, target="auto", precision=precision,  # type: ignore[arg-type]
                              fetches=[output_node]).report
    out.write(
        f"\nFor this machine ({local['target']}): "
        + (f"skipped: {local['skipped']}\n" if local["skipped"] else
           f"converted {local['converted_nodes']} of {local['total_nodes']} nodes\n")
    )
    return 0
