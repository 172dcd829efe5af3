"""Known differences from TensorFlow's pass (KNOWN_DIFFERENCES.md), each shown next to
what TensorFlow does."""

from __future__ import annotations

import tensorflow as tf

import amp_rewrite
from graphs import graph_def, v1
from tf_oracle import converted_type_attrs, tf_amp_rewrite

HALF = tf.float16.as_datatype_enum
FLOAT = tf.float32.as_datatype_enum


def test_fetched_cast_keeps_its_dtype():
    def build():
        b = v1.placeholder(tf.bool, (4, 4), name="b")
        c = tf.cast(b, tf.float32, name="cast")
        x = v1.placeholder(tf.float32, (4, 4), name="x")
        tf.identity(tf.matmul(c, x, name="mm"), name="out")

    gd = graph_def(build)
    fetches = ["out", "cast"]
    ref = tf_amp_rewrite(gd, fetches)
    assert ("", "cast", "DstT") in converted_type_attrs(gd, ref)  # TensorFlow retypes a fetch
    ours = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="tensorflow", fetches=fetches,
                                         use_env=False)
    cast = next(n for n in ours.graph_def.node if n.name == "cast")
    assert cast.attr["DstT"].type == FLOAT
    assert next(n for n in ours.graph_def.node if n.name == "mm").attr["T"].type == HALF
    exact = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="tensorflow", fetches=fetches,
                                          use_env=False, tensorflow_bugs=True)
    assert converted_type_attrs(gd, exact.graph_def) == converted_type_attrs(gd, ref)
