"""Tiny hand-built graphs for golden and differential tests, and comparison helpers."""

from __future__ import annotations

import os
from typing import Callable, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import amp_rewrite  # noqa: E402
from tf_oracle import amp_cast_count, converted_type_attrs, tf_amp_rewrite  # noqa: E402

v1 = tf.compat.v1


def graph_def(build: Callable[[], None]) -> tf.compat.v1.GraphDef:
    """Run ``build`` inside a fresh ``tf.Graph`` and return its GraphDef."""
    g = tf.Graph()
    with g.as_default():
        build()
    return g.as_graph_def()


def differential(
    gd: tf.compat.v1.GraphDef,
    fetches: Sequence[str],
    *,
    gpus: Sequence[str] = ("8.0",),
    target: str | None = None,
    precision: str = "float16",
    mode: str = "cuda",
    env: dict[str, str] | None = None,
    **kwargs: object,
) -> amp_rewrite.RewriteResult:
    """Rewrite with TensorFlow's pass and ours (``tensorflow`` lists) and assert parity.

    Returns our result.  Parity: the same (node, type attr) pairs converted, no more casts.
    """
    ref = tf_amp_rewrite(gd, list(fetches), gpus=gpus, mode=mode, env=env)
    low = tf.float16.as_datatype_enum if precision == "float16" else tf.bfloat16.as_datatype_enum
    target = target or "gpu:" + ",".join(gpus)
    ours = amp_rewrite.rewrite_graph_def(
        gd, target=target, precision=precision, lists="tensorflow", fetches=list(fetches),
        functions="reachable", use_env=False, **kwargs,
    )
    theirs_set = converted_type_attrs(gd, ref, to_dtype=low)
    ours_set = converted_type_attrs(gd, ours.graph_def, to_dtype=low)
    assert ours_set == theirs_set, (
        f"only TensorFlow converted {sorted(theirs_set - ours_set)}; "
        f"only we converted {sorted(ours_set - theirs_set)}"
    )
    assert amp_cast_count(gd, ours.graph_def) <= amp_cast_count(gd, ref)
    return ours


def converted(result: amp_rewrite.RewriteResult) -> set[str]:
    """Names of main-graph nodes whose colour in the report is allow with a low dtype."""
    return {n for n, d in result.report["nodes"].items() if d["color"] == "allow" and d["dtype"] != "float32"}


def run(gd: tf.compat.v1.GraphDef, feeds: dict[str, np.ndarray], fetches: Sequence[str]) -> list[np.ndarray]:
    """Run tensors of ``gd`` in a session (Grappler off, so the graph runs as given)."""
    g = tf.Graph()
    with g.as_default():
        tf.graph_util.import_graph_def(gd, name="")
    config = v1.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    with v1.Session(graph=g, config=config) as sess:
        return [np.asarray(x) for x in sess.run(list(fetches), feeds)]


class SmallModule(tf.Module):
    """A TF2 module for SavedModel tests: ``y = softmax(relu(x) @ w)`` with seeded weights."""

    def __init__(self) -> None:
        super().__init__()
        self.w = tf.Variable(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
    def __call__(self, x):
        return {"y": tf.nn.softmax(tf.matmul(tf.nn.relu(x), self.w))}
