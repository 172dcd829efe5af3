"""What Grappler folds into a frozen dense op (``amp_rewrite.plan.grappler_folds``): the rules
measured on TensorFlow 2.21 with oneDNN, one graph per row of the module's table, and the
walk's limits (long chains, several consumers, cycles)."""

from __future__ import annotations

import ast
import os
import sys

import networkx as nx
import numpy as np
import pytest
import tensorflow as tf

from amp_rewrite.graph.shapes import graph_shapes
from amp_rewrite.graph.tensor_names import parse_graph_input
from amp_rewrite.plan import grappler_folds
from graphs import graph_def, v1


def _const(*shape: int) -> tf.Tensor:
    return tf.constant(np.full(shape, 0.5, np.float32))


def _conv(x: tf.Tensor) -> tf.Tensor:
    return tf.nn.conv2d(x, _const(1, 1, 4, 4), 1, "SAME", name="conv")


#: The element-wise ops whose folding the tests check.
WATCHED = grappler_folds.FOLDABLE_AFFINE | grappler_folds.FUSABLE_ACTIVATIONS | {"Sub"}


def _constants(ops, inputs) -> frozenset:
    """Constants and Casts of them (a weight built in float16 is a Cast of a float32 one)."""
    return frozenset(n for n, op in ops.items()
                     if op == "Const" or (op == "Cast" and all(ops[src] == "Const" for src, _ in inputs[n])))


def _graph_parts(gd):
    """``(g, ops, inputs, consts)`` of ``gd`` as the fold rules take them: a graph with each
    node's ``T`` and the inferred shapes, the ops and data inputs by node, the constants."""
    ops = {n.name: n.op for n in gd.node}
    inputs = {n.name: [(parse_graph_input(i).node, parse_graph_input(i).port) for i in n.input
                       if not i.startswith("^")] for n in gd.node}
    g = nx.MultiDiGraph(shapes=graph_shapes(gd))
    for n in gd.node:
        g.add_node(n.name, dtypes={"T": n.attr["T"].type} if "T" in n.attr else {})
        for src, _ in inputs[n.name]:
            g.add_edge(src, n.name)
    return g, ops, inputs, _constants(ops, inputs)


def _answers(gd, onednn: bool = True) -> dict[str, tuple[str, bool]]:
    """``(op, is_folded)`` for every watched node of ``gd``, asked in topological order as the
    planner and the step estimate ask, by the CPU's rules (``onednn``) or a GPU's."""
    g, ops, inputs, consts = _graph_parts(gd)
    memo: dict = {}
    return {n: (ops[n], grappler_folds.is_folded(g, ops, inputs, n, consts, memo, lambda _: onednn))
            for n in nx.topological_sort(g) if ops[n] in WATCHED}


def _folded(build_tail, onednn: bool = True, dtype=tf.float32) -> dict[str, bool]:
    """``is_folded`` for every watched node of ``x -> build_tail(x) -> out``, ``x`` of ``dtype``."""
    def build() -> None:
        x = v1.placeholder(dtype, (1, 8, 8, 4), name="x")
        tf.identity(build_tail(x), name="out")

    return {n: folded for n, (_, folded) in _answers(graph_def(build), onednn).items()}


#: Chains both rule sets answer: ``(tail, by oneDNN's rules, by a GPU's)``.
SHARED_CHAINS = [
    # A frozen batch norm after a convolution without a bias (MobileNetV2): all of it with
    # oneDNN; on a GPU the scale goes into the weights, the add and the activation run.
    (lambda x: tf.nn.relu6(tf.add(tf.multiply(_conv(x), _const(4), name="s"), _const(4), name="t"), name="act"),
     {"s": True, "t": True, "act": True}, {"s": True, "t": False, "act": False}),
    # Two adds of constants become one bias (on a GPU one add, which runs).
    (lambda x: tf.nn.relu(tf.add(tf.add(_conv(x), _const(4), name="b1"), _const(4), name="b2"), name="act"),
     {"b1": True, "b2": True, "act": True}, {"b1": False, "b2": True, "act": False}),
    # A convolution's own bias, then a batch norm (ResNet50): only the bias with oneDNN,
    # nothing on a GPU.
    (lambda x: tf.nn.relu(tf.add(tf.multiply(tf.nn.bias_add(_conv(x), _const(4), name="b"), _const(4), name="s"),
                                 _const(4), name="t"), name="act"),
     {"b": True, "s": False, "t": False, "act": False}, {"b": False, "s": False, "t": False, "act": False}),
    # No bias: the scale folds into the weights, the activation does not fuse.
    (lambda x: tf.nn.relu(tf.multiply(_conv(x), _const(4), name="s"), name="act"),
     {"s": True, "act": False}, {"s": True, "act": False}),
]


@pytest.mark.parametrize("tail, expected", [(tail, cpu) for tail, cpu, _ in SHARED_CHAINS] + [
    # A Sub is not taken as a bias, and nothing after it folds.
    (lambda x: tf.nn.relu(tf.multiply(tf.subtract(_conv(x), _const(4), name="c"), _const(4), name="s"), name="act"),
     {"c": False, "s": False, "act": False}),
    (lambda x: tf.nn.relu(_conv(x), name="act"), {"act": False}),
    # After a bias a scale is not folded.
    (lambda x: tf.nn.relu(tf.multiply(tf.add(_conv(x), _const(4), name="b"), _const(4), name="s"), name="act"),
     {"b": True, "s": False, "act": False}),
    # Nothing folds into a depthwise convolution.
    (lambda x: tf.nn.relu6(tf.add(tf.multiply(tf.nn.depthwise_conv2d(x, _const(3, 3, 4, 1), [1, 1, 1, 1], "SAME"),
                                              _const(4), name="s"), _const(4), name="t"), name="act"),
     {"s": False, "t": False, "act": False}),
    # A bias and an activation fuse into a depthwise convolution without a scale before them.
    (lambda x: tf.nn.relu6(tf.add(tf.nn.depthwise_conv2d(x, _const(3, 3, 4, 1), [1, 1, 1, 1], "SAME"), _const(4),
                                  name="b"), name="act"),
     {"b": True, "act": True}),
    # A bias is a vector, a scale a vector or a scalar: a whole map runs, and so does a
    # constant numerator.
    (lambda x: tf.nn.relu(tf.add(tf.multiply(_conv(x), tf.constant(0.5), name="s"), _const(4), name="b"), name="act"),
     {"s": True, "b": True, "act": True}),
    (lambda x: tf.nn.relu(tf.add(_conv(x), tf.constant(0.5), name="b"), name="act"), {"b": False, "act": False}),
    (lambda x: tf.nn.relu(tf.add(tf.multiply(_conv(x), _const(1, 1, 1, 4), name="s"), _const(1, 1, 1, 4), name="b"),
                          name="act"),
     {"s": True, "b": True, "act": True}),
    (lambda x: tf.nn.relu(tf.add(tf.multiply(_conv(x), _const(1, 8, 8, 4), name="s"), _const(4), name="b"),
                          name="act"),
     {"s": False, "b": False, "act": False}),
    (lambda x: tf.nn.relu(tf.add(_conv(x), _const(1, 8, 8, 4), name="b"), name="act"), {"b": False, "act": False}),
    (lambda x: tf.nn.relu(tf.add(tf.math.divide(_const(4), _conv(x), name="d"), _const(4), name="b"), name="act"),
     {"d": False, "b": False, "act": False}),
    (lambda x: tf.nn.relu(tf.add(tf.math.divide(_conv(x), _const(4), name="d"), _const(4), name="b"), name="act"),
     {"d": True, "b": True, "act": True}),
    # A MatMul takes a bias and an activation, but no scale.
    (lambda x: tf.nn.relu(tf.add(tf.matmul(tf.reshape(x, (4, 64)), _const(64, 4)), _const(4), name="b"), name="act"),
     {"b": True, "act": True}),
    (lambda x: tf.nn.relu(tf.add(tf.multiply(tf.matmul(tf.reshape(x, (4, 64)), _const(64, 4)), _const(4), name="s"),
                                 _const(4), name="b"), name="act"),
     {"s": False, "b": False, "act": False}),
])
def test_what_grappler_folds_after_a_frozen_dense_op(tail, expected):
    assert _folded(tail) == expected


def test_a_fed_weight_or_a_second_reader_stops_the_fold():
    def fed(x):
        w = v1.placeholder(tf.float32, (1, 1, 4, 4), name="w")
        return tf.nn.relu(tf.add(tf.nn.conv2d(x, w, 1, "SAME"), _const(4), name="b"), name="act")

    assert _folded(fed) == {"b": False, "act": False}

    def shared(x):
        c = _conv(x)
        biased = tf.add(c, _const(4), name="b")
        return tf.nn.relu(biased, name="act") + tf.reduce_sum(c)

    folded = _folded(shared)
    assert folded["b"] is False and folded["act"] is False


def test_a_long_chain_is_answered_without_recursion():
    """A chain of 20,000 ops is a valid graph: the walk is iterative, and each answer stops
    at the previous one's (asked in order), so the whole chain costs linear time."""
    def tail(x):
        h = tf.add(_conv(x), _const(4), name="b")
        h = tf.nn.relu(h, name="act")
        for i in range(20_000):
            h = tf.nn.relu(h, name=f"r{i}")
        return h

    folded = _folded(tail)
    assert folded["b"] and folded["act"] and not folded["r0"] and not folded["r19999"]


def test_the_fold_rules_agree_with_grapplers_own_folding():
    """Differential: for every pattern of ``bench/fold_probe.py``, the element-wise kernels
    TensorFlow's Grappler leaves running (step stats of a session as users run one) are
    exactly the nodes ``is_folded`` says are not folded.  Small inputs, float32 (the probe
    found bfloat16 alike on TensorFlow 2.21)."""
    import collections
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
    import fold_probe

    shape = (1, 8, 8, 64)
    for name, pattern in fold_probe.PATTERNS.items():
        if "zero bias" in name:
            continue  # Grappler drops an add of zeros by its value, which the rules do not read
        graph, _, _ = fold_probe.build(pattern, tf.float32, shape)
        predicted = collections.Counter(op for op, folded in _answers(graph.as_graph_def()).values() if not folded)
        ran = {k: v for k, v in fold_probe.kernels(pattern, tf.float32, shape).items() if k in WATCHED}
        assert dict(predicted) == ran, name


def _conv3x3(x: tf.Tensor) -> tf.Tensor:
    return tf.nn.conv2d(x, tf.cast(_const(3, 3, 4, 4), x.dtype), 1, "SAME", name="conv3")


@pytest.mark.parametrize("tail, expected", [(tail, gpu) for tail, _, gpu in SHARED_CHAINS] + [
    # cuDNN's one fusion: a BiasAdd and a Relu on a 3x3 convolution (after a folded scale too) ...
    (lambda x: tf.nn.relu(tf.nn.bias_add(_conv3x3(x), _const(4), name="b"), name="act"), {"b": True, "act": True}),
    (lambda x: tf.nn.relu(tf.nn.bias_add(tf.multiply(_conv3x3(x), _const(4), name="s"), _const(4), name="b"),
                          name="act"),
     {"s": True, "b": True, "act": True}),
    # ... but not a Relu6, an Add taken as a bias, a 1x1 convolution, a bias alone, or a bias
    # followed by an add (which merges into it, as after a 1x1 convolution).
    (lambda x: tf.nn.relu6(tf.nn.bias_add(_conv3x3(x), _const(4), name="b"), name="act"), {"b": False, "act": False}),
    (lambda x: tf.nn.relu(tf.add(_conv3x3(x), _const(4), name="b"), name="act"), {"b": False, "act": False}),
    (lambda x: tf.nn.relu(tf.nn.bias_add(_conv(x), _const(4), name="b"), name="act"), {"b": False, "act": False}),
    (lambda x: tf.nn.bias_add(_conv3x3(x), _const(4), name="b"), {"b": False}),
    (lambda x: tf.nn.relu(tf.add(tf.nn.bias_add(_conv3x3(x), _const(4), name="b"), _const(4), name="t"), name="act"),
     {"b": False, "t": True, "act": False}),
    (lambda x: tf.nn.relu(tf.add(tf.nn.bias_add(_conv(x), _const(4), name="b"), _const(4), name="t"), name="act"),
     {"b": False, "t": True, "act": False}),
    # Nothing fuses into a MatMul or a depthwise convolution.
    (lambda x: tf.nn.relu(tf.nn.bias_add(tf.matmul(tf.reshape(x, (4, 64)), _const(64, 4)), _const(4), name="b"),
                          name="act"),
     {"b": False, "act": False}),
    (lambda x: tf.nn.relu6(tf.add(tf.nn.depthwise_conv2d(x, _const(3, 3, 4, 1), [1, 1, 1, 1], "SAME"), _const(4),
                                  name="b"), name="act"),
     {"b": False, "act": False}),
])
def test_what_grappler_folds_on_a_gpu(tail, expected):
    assert _folded(tail, onednn=False) == expected


#: What ``bench/fold_probe.py`` found running on an H200 (TensorFlow 2.21), committed.
GPU_PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "gpu_runs", "2026-11-28b-h200",
                         "fold_probe.txt")


def _probe_lines(path: str) -> dict[str, dict[str, int]]:
    """Pattern name -> the float32 kernels a probe run printed for it."""
    found = {}
    for line in open(path, encoding="utf-8"):
        name, sep, rest = line.partition(" float32 {")
        if sep:
            found[name.strip()] = ast.literal_eval("{" + rest.split("}")[0] + "}")
    return found


def test_the_gpu_fold_rules_agree_with_grappler_on_a_gpu():
    """Differential against the measured GPU: for every pattern the H200 ran, the element-wise
    kernels it ran are exactly the nodes ``is_folded`` by a GPU's rules says are not folded."""
    import collections

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
    import fold_probe

    measured = _probe_lines(GPU_PROBE)
    assert len(measured) >= 19
    for name, ran in measured.items():
        if "zero bias" in name:
            continue  # Grappler drops an add of zeros by its value, which the rules do not read
        graph, _, _ = fold_probe.build(fold_probe.PATTERNS[name], tf.float32, (1, 8, 8, 64))
        predicted = collections.Counter(op for op, folded in _answers(graph.as_graph_def(), onednn=False).values()
                                        if not folded)
        assert dict(predicted) == {k: v for k, v in ran.items() if k in WATCHED}, name


def test_cudnn_fuses_a_float32_convolution_only():
    """``remapper.cc`` fuses a bias and a Relu into a Conv2D on a GPU in float32 only: a float16
    convolution (what a rewrite converted) runs both as kernels, and :func:`float32_fusion`
    names the convolution whose conversion brings them back."""
    def tail(x):
        return tf.nn.relu(tf.nn.bias_add(_conv3x3(x), tf.cast(_const(4), x.dtype), name="b"), name="act")

    assert _folded(tail, onednn=False) == {"b": True, "act": True}
    assert _folded(tail, onednn=False, dtype=tf.float16) == {"b": False, "act": False}
    assert _folded(tail, onednn=True, dtype=tf.float16) == {"b": True, "act": True}  # oneDNN: any type

    def parts(dtype):
        def build() -> None:
            x = v1.placeholder(dtype, (1, 8, 8, 4), name="x")
            tf.identity(tail(x), name="out")

        return _graph_parts(graph_def(build))

    g, ops, inputs, consts = parts(tf.float32)
    memo: dict = {}
    fused = {n: grappler_folds.float32_fusion(g, ops, inputs, n, consts, memo, lambda _: False)
             for n in nx.topological_sort(g) if ops[n] in WATCHED}
    assert fused == {"b": "conv3", "act": "conv3"}
    # A filter whose shape only its Cast's input records (a Cast the rewrite inserted, which
    # shape inference never saw) is seen through.
    g, ops, inputs, _ = parts(tf.float16)
    filt = inputs["conv3"][1]
    assert ops[filt[0]] == "Cast" and grappler_folds._cudnn_fusable_filter(g, ops, inputs, filt)  # noqa: SLF001
    del g.graph["shapes"][filt[0]]
    assert grappler_folds._cudnn_fusable_filter(g, ops, inputs, filt)  # noqa: SLF001
    g.graph["shapes"][inputs[filt[0]][0][0]] = ((1, 1, 4, 4),)  # a 1x1 filter
    assert not grappler_folds._cudnn_fusable_filter(g, ops, inputs, filt)  # noqa: SLF001
