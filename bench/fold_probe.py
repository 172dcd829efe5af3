"""Which element-wise ops after a frozen convolution or MatMul does Grappler fold away?

Usage::

    python bench/fold_probe.py

Builds one small graph per pattern (a frozen batch norm after a convolution with and without a
bias of its own, a Sub, a scale without a bias, a depthwise convolution, a MatMul ...), runs
each through a session as users run one (Grappler on, every mixed-precision pass off), in
float32 and in bfloat16, and prints the kernels that ran besides the dense op, from the step
stats.  ``amp_rewrite/plan/grappler_folds.py`` encodes what this printed on TensorFlow 2.21
with oneDNN, and on an H200 (``bench/gpu_runs/2026-11-28b-h200/fold_probe.txt``, before the
three 3x3 patterns were added); run it again on another TensorFlow or GPU before trusting
that table there.
"""

from __future__ import annotations

import collections
import os
import sys
from typing import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), HERE]

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import bench  # noqa: E402  (kernel_name: what a step-stats entry ran)
from amp_rewrite.autotune import session_config  # noqa: E402

__all__ = ["PATTERNS", "build", "kernels", "main"]

v1 = tf.compat.v1
_QUIET = {"_Arg", "_Retval", "NoOp", "Const", "Cast", "_MklCast", "Identity"}


def _const(dtype: tf.DType, *shape: int, value: float = 0.5) -> tf.Tensor:
    return tf.constant(np.full(shape, value, np.float32), dtype=dtype)


def _conv(x: tf.Tensor) -> tf.Tensor:
    return tf.nn.conv2d(x, _const(x.dtype, 1, 1, 64, 64), 1, "SAME")


def _conv3x3(x: tf.Tensor) -> tf.Tensor:
    return tf.nn.conv2d(x, _const(x.dtype, 3, 3, 64, 64), 1, "SAME")


def _matmul(x: tf.Tensor) -> tf.Tensor:
    return tf.matmul(tf.reshape(x, (-1, 64)), _const(x.dtype, 64, 64))


#: name -> the ops after the input ``x`` (8x56x56x64); constants are 0.5 unless said.
PATTERNS: dict[str, Callable[[tf.Tensor], tf.Tensor]] = {
    "conv * s + t -> relu6 (frozen batch norm)":
        lambda x: tf.nn.relu6(_conv(x) * _const(x.dtype, 64) + _const(x.dtype, 64)),
    "conv + b1 + b2 -> relu": lambda x: tf.nn.relu(_conv(x) + _const(x.dtype, 64) + _const(x.dtype, 64)),
    "bias_add(conv, b) * s + t -> relu (bias, then batch norm)":
        lambda x: tf.nn.relu(tf.nn.bias_add(_conv(x), _const(x.dtype, 64)) * _const(x.dtype, 64) + _const(x.dtype, 64)),
    "(conv - m) * s + t -> relu": lambda x: tf.nn.relu((_conv(x) - _const(x.dtype, 64)) * _const(x.dtype, 64)
                                                       + _const(x.dtype, 64)),
    "conv * s -> relu (no bias)": lambda x: tf.nn.relu(_conv(x) * _const(x.dtype, 64)),
    "conv -> relu": lambda x: tf.nn.relu(_conv(x)),
    "bias_add(conv, 0) -> relu (a zero bias)":
        lambda x: tf.nn.relu(tf.nn.bias_add(_conv(x), _const(x.dtype, 64, value=0.0))),
    "(conv + b) * s -> relu": lambda x: tf.nn.relu((_conv(x) + _const(x.dtype, 64)) * _const(x.dtype, 64)),
    "depthwise * s + t -> relu6": lambda x: tf.nn.relu6(
        tf.nn.depthwise_conv2d(x, _const(x.dtype, 3, 3, 64, 1), [1, 1, 1, 1], "SAME") * _const(x.dtype, 64)
        + _const(x.dtype, 64)),
    "depthwise + b -> relu6": lambda x: tf.nn.relu6(
        tf.nn.depthwise_conv2d(x, _const(x.dtype, 3, 3, 64, 1), [1, 1, 1, 1], "SAME") + _const(x.dtype, 64)),
    "conv * scalar + b -> relu": lambda x: tf.nn.relu(_conv(x) * _const(x.dtype) + _const(x.dtype, 64)),
    "conv + scalar -> relu": lambda x: tf.nn.relu(_conv(x) + _const(x.dtype)),
    "conv * s[1,1,1,C] + t[1,1,1,C] -> relu (Keras's reshaped batch norm)":
        lambda x: tf.nn.relu(_conv(x) * _const(x.dtype, 1, 1, 1, 64) + _const(x.dtype, 1, 1, 1, 64)),
    "conv * map + b -> relu": lambda x: tf.nn.relu(_conv(x) * _const(x.dtype, 1, *x.shape[1:]) + _const(x.dtype, 64)),
    "conv + map -> relu (a whole feature map)": lambda x: tf.nn.relu(_conv(x) + _const(x.dtype, 1, *x.shape[1:])),
    "c / conv + b -> relu": lambda x: tf.nn.relu(_const(x.dtype, 64) / _conv(x) + _const(x.dtype, 64)),
    "conv / c + b -> relu": lambda x: tf.nn.relu(_conv(x) / _const(x.dtype, 64) + _const(x.dtype, 64)),
    "matmul + b -> relu": lambda x: tf.nn.relu(_matmul(x) + _const(x.dtype, 64)),
    "matmul * s + t -> relu": lambda x: tf.nn.relu(_matmul(x) * _const(x.dtype, 64) + _const(x.dtype, 64)),
    # A GPU's one fusion by TensorFlow's sources (cuDNN: a BiasAdd and a Relu on a convolution
    # that is not 1x1), and its neighbours; not yet run on a GPU (2026-11-28).
    "bias_add(conv3x3, b) -> relu": lambda x: tf.nn.relu(tf.nn.bias_add(_conv3x3(x), _const(x.dtype, 64))),
    "bias_add(conv3x3, b) -> relu6": lambda x: tf.nn.relu6(tf.nn.bias_add(_conv3x3(x), _const(x.dtype, 64))),
    "conv3x3 + b -> relu (an add, not a BiasAdd)": lambda x: tf.nn.relu(_conv3x3(x) + _const(x.dtype, 64)),
}


def build(pattern: Callable[[tf.Tensor], tf.Tensor], dtype: tf.DType,
          shape: tuple[int, ...] = (8, 56, 56, 64)) -> tuple[tf.Graph, tf.Tensor, tf.Tensor]:
    """A graph of ``pattern`` in ``dtype`` on a float32 input ``x`` of ``shape``: (graph, x, out)."""
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, shape, name="x")
        out = tf.identity(tf.cast(pattern(tf.cast(x, dtype) if dtype != tf.float32 else x), tf.float32), name="out")
    return graph, x, out


def kernels(pattern: Callable[[tf.Tensor], tf.Tensor], dtype: tf.DType,
            shape: tuple[int, ...] = (8, 56, 56, 64)) -> dict[str, int]:
    """The kernels one run of ``pattern`` in ``dtype`` launched, by kernel name (constants,
    Casts and the graph's edges left out)."""
    graph, x, out = build(pattern, dtype, shape)
    feed = {x: np.random.default_rng(0).random(shape, np.float32)}
    with v1.Session(graph=graph, config=session_config()) as sess:
        sess.run(out, feed)
        meta = v1.RunMetadata()
        sess.run(out, feed, options=v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE), run_metadata=meta)
    count: collections.Counter[str] = collections.Counter()
    for dev in meta.step_stats.dev_stats:
        for ns in dev.node_stats:
            kernel = bench.kernel_name(ns)
            if kernel and kernel not in _QUIET:
                count[kernel] += 1
    return dict(sorted(count.items()))


def main() -> int:
    print(f"TensorFlow {tf.__version__}")
    for name, pattern in PATTERNS.items():
        print(f"{name:58s} float32 {kernels(pattern, tf.float32)}  bfloat16 {kernels(pattern, tf.bfloat16)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
