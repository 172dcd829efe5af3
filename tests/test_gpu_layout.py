"""The layout optimizer's Transposes (:mod:`amp_rewrite.plan.gpu_layout`), checked node for node
against Grappler's own output on a virtual GPU (TensorFlow's pass runs offline: no GPU needed),
and priced in the step estimate (:mod:`amp_rewrite.plan.step_cost`)."""

from __future__ import annotations

import os
import sys

import pytest
import tensorflow as tf

import amp_rewrite
from amp_rewrite.graph import dtypes as dt
from amp_rewrite.plan.cost_model import DEVICE_COSTS
from amp_rewrite.plan.gpu_layout import NCHW, NHWC, layout_formats
from amp_rewrite.training.tf_function import captured_variable_shapes

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

import grappler_counts  # noqa: E402

C = 8  # channels


def _step(low_convs: int = 0, train: bool = True, batch: int = 4, side: int = 12):
    """A traced step of a small CNN written as Keras 3 writes its layers: three convolutions
    (the first ``low_convs`` of them in float16, cast in and out), a batch norm of moments and
    per-channel variables, ReLU, a depthwise convolution, max and average pooling, a channel
    concatenation, a pad, a softsign (an op the optimizer does not convert), a bias add, global
    pooling and a softmax classifier.  A training step
    (gradients, SGD updates) or, with ``train=False``, the forward pass only.  Returns
    ``(GraphDef, variable shapes, fetches)``."""
    init = tf.random.stateless_normal
    shapes = {"k0": (3, 3, 3, C), "k1": (3, 3, C, C), "k2": (1, 1, 2 * C, C), "dw": (3, 3, C, 1),
              "gamma": (C,), "beta": (C,), "bias": (C,), "w": (C, 4)}
    v = {k: tf.Variable(init(s, seed=(i, 1)) * 0.1, name=k) for i, (k, s) in enumerate(sorted(shapes.items()))}

    def conv(x, k, i, **kw):
        if i < low_convs:
            y = tf.nn.conv2d(tf.cast(x, tf.float16), tf.cast(v[k], tf.float16), 1, "SAME", **kw)
            return tf.cast(y, tf.float32)
        return tf.nn.conv2d(x, v[k], 1, "SAME", **kw)

    def forward(x):
        h = conv(x, "k0", 0)
        mean, var = tf.nn.moments(h, [0, 1, 2], keepdims=True)
        h = (h - mean) * tf.math.rsqrt(tf.squeeze(var, [0, 1, 2]) + 1e-3) * v["gamma"] + v["beta"]
        h = tf.nn.relu(h)
        d = tf.nn.depthwise_conv2d(h, v["dw"], [1, 1, 1, 1], "SAME")
        h = tf.concat([tf.nn.max_pool2d(h, 2, 2, "VALID"), tf.nn.avg_pool2d(d, 2, 2, "VALID")], axis=3)
        # Softsign is not layout-agnostic: the regions on either side meet there.
        h = tf.nn.softsign(tf.pad(conv(h, "k2", 2), [[0, 0], [1, 1], [1, 1], [0, 0]]))
        h = tf.nn.relu6(tf.nn.bias_add(conv(h, "k1", 1), v["bias"]))
        return tf.nn.softmax(tf.matmul(tf.reduce_mean(h, [1, 2]), v["w"]))

    @tf.function
    def step(x):
        if not train:
            return forward(x)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(forward(x))
        for var, grad in zip(v.values(), tape.gradient(loss, list(v.values()))):
            var.assign_sub(0.01 * grad)
        return loss

    graph = step.get_concrete_function(tf.TensorSpec([batch, side, side, 3], tf.float32)).graph
    fetches = [t.op.name for t in graph.outputs]
    return graph.as_graph_def(), captured_variable_shapes(graph), fetches


def _compare(gd, variable_shapes, capability: str) -> tuple[dict, dict]:
    """Grappler's layout Transposes (the step given as the runtime gives a function's body) and
    ours, keyed alike."""
    grappler = grappler_counts.layout_transposes_of(
        grappler_counts.grappler_optimized(grappler_counts.as_function_body(gd, variable_shapes), capability))
    ours = grappler_counts.our_layout_transposes(gd, variable_shapes, capability)
    return grappler, ours


def test_a_float32_training_step_runs_nchw_and_ours_are_grapplers_transposes_node_for_node():
    gd, shapes, _ = _step()
    grappler, ours = _compare(gd, shapes, "9.0")
    optimized = grappler_counts.grappler_optimized(grappler_counts.as_function_body(gd, shapes), "9.0")
    # Each Transpose Grappler kept goes by one of the names ours gives it (measured per-node
    # times are matched to the estimate's by name).
    kept = {n.name for n in optimized.node if n.name.endswith("-LayoutOptimizer") and n.op == "Transpose"}
    assert kept and kept <= {name for t in ours.values() for name in t.names}
    # float32 convolution gradients keep TF32 convolutions out of the count: NCHW, with
    # Transposes where converted ops meet unconverted ones (the softsign, the gradients'
    # reshapes, ...).
    assert len(grappler) >= 8
    assert set(ours) == set(grappler)
    assert any(k[2] == NCHW for k in ours) and any(k[2] == NHWC for k in ours)
    assert all(t.elements and t.elements > 0 and t.dtype == dt.FLOAT for t in ours.values())


@pytest.mark.parametrize("low_convs, transposed", [(1, True), (2, False), (3, False)])
def test_the_layout_follows_the_share_of_float16_convolutions(low_convs, transposed):
    # One float16 convolution of three: still NCHW, that one converted too (it reads and
    # writes NCHW, cast around).  Two or three: at least half prefer NHWC, so the graph stays
    # as Keras wrote it and nothing is transposed.
    gd, shapes, _ = _step(low_convs=low_convs)
    grappler, ours = _compare(gd, shapes, "9.0")
    assert bool(grappler) is transposed
    assert set(ours) == set(grappler)
    if transposed:
        assert any(t.dtype == dt.HALF for t in ours.values()) or any(
            "Cast" in r for t in ours.values() for r in t.readers)


@pytest.mark.parametrize("capability, transposed", [("9.0", False), ("8.0", False), ("7.0", True)])
def test_float32_inference_stays_nhwc_where_tf32_runs_it(capability, transposed):
    # Without convolution gradients, TF32 (8.0 and up) makes float32 convolutions prefer NHWC;
    # a 7.x GPU has no TF32, so its float32 graph is converted: the input, and both sides of
    # the softsign.
    gd, shapes, _ = _step(train=False)
    grappler, ours = _compare(gd, shapes, capability)
    assert len(grappler) == (3 if transposed else 0)
    assert set(ours) == set(grappler)


def test_the_layout_decision_counts_only_convolutions_on_a_gpu():
    gd, shapes, _ = _step()
    g = amp_rewrite.api._import_to_price(gd, "gpu:9.0", "float16", False, shapes, None, None, None)[0].graph
    hopper, strict = DEVICE_COSTS["gpu-hopper"], DEVICE_COSTS["gpu-hopper-fp32"]
    assert layout_formats(g, lambda n: hopper) == (NHWC, NCHW)  # float32 gradients
    assert layout_formats(g, lambda n: None) is None  # nothing on a GPU: nothing converted
    fwd = amp_rewrite.api._import_to_price(_step(train=False)[0], "gpu:9.0", "float16", False, shapes, None, None,
                                           None)[0].graph
    assert layout_formats(fwd, lambda n: hopper) == (NCHW, NHWC)  # TF32 float32 prefers NHWC
    assert layout_formats(fwd, lambda n: strict) == (NHWC, NCHW)  # TF32 off: it does not
    assert layout_formats(fwd, lambda n: DEVICE_COSTS["gpu-pre-volta"]) == (NHWC, NCHW)


def test_the_step_estimate_prices_the_transposes_only_where_they_run():
    gd, shapes, fetches = _step(batch=32, side=32)
    kw = dict(variable_shapes=shapes, fetches=fetches, precision="float16")
    gpu = amp_rewrite.estimate_step_time(gd, target="gpu:9.0", **kw)
    nodes = amp_rewrite.estimate_node_times(gd, target="gpu:9.0", **kw)
    layout = {n: t for part in nodes.values() for n, t in part.items() if t.kind == "layout"}
    assert gpu.transposes == len(layout) >= 4
    assert gpu.layout_ns == pytest.approx(sum(t.ns for t in layout.values()))
    assert all(n.endswith("-LayoutOptimizer") and t.op == "Transpose" for n, t in layout.items())
    # Each moves its tensor through memory twice, and launches a kernel the host pays for.
    hopper = DEVICE_COSTS["gpu-hopper"]
    assert all(t.ns == pytest.approx(2 * 4 * t.elements / hopper.bandwidth) for t in layout.values())
    without = gpu.kernels - gpu.transposes
    assert gpu.host_ns == pytest.approx((without + gpu.transposes) * hopper.host_per_kernel)
    # Under XLA there is no layout optimizer, nor on a CPU.
    assert amp_rewrite.estimate_step_time(gd, target="gpu:9.0", compiled=True, **kw).transposes == 0
    assert amp_rewrite.estimate_step_time(gd, target="cpu", **kw).transposes == 0
    # A float16 rewrite of the step runs NHWC: none there.
    rewritten = amp_rewrite.rewrite_graph_def(gd, target="gpu:9.0", precision="float16", variable_shapes=shapes,
                                              fetches=fetches, use_env=False)
    assert rewritten.graph_def is not gd and any(n.op == "Cast" for n in rewritten.graph_def.node)
    low = amp_rewrite.estimate_step_time(rewritten.graph_def, target="gpu:9.0", **kw)
    assert low.transposes == 0 and low.low_nodes > 0


def test_int_attributes_and_constants_read_from_the_node_def():
    from amp_rewrite.graph.node_values import int_const_values, int_list_attr

    def node(build):
        g = tf.Graph()
        with g.as_default():
            build()
        return {n.name: {"op": n.op, "proto": n} for n in g.as_graph_def().node}

    nodes = node(lambda: (tf.constant([1, -2, 3], tf.int32, name="a"), tf.constant(7, tf.int64, name="b"),
                          tf.constant([5, 5, 5, 5], tf.int32, name="c"), tf.constant([1.5], name="f"),
                          tf.constant([[1, 2]], name="m"),
                          tf.squeeze(tf.zeros([1, 2, 1]), [0, 2], name="sq"), tf.squeeze(tf.zeros([1, 2]), name="s0")))
    assert int_const_values(nodes["a"]) == (1, -2, 3)
    assert int_const_values(nodes["b"]) == (7,)
    assert int_const_values(nodes["c"]) == (5, 5, 5, 5)  # stored as one repeated value
    assert int_const_values(nodes["f"]) is None  # not an integer
    assert int_const_values(nodes["m"]) is None  # not a vector
    assert int_const_values({"op": "Const", "proto": None}) is None
    bad = type(nodes["a"]["proto"])()
    bad.CopyFrom(nodes["a"]["proto"])
    bad.attr["value"].tensor.tensor_content = b"\x01\x00\x00\x00\x02"  # 5 bytes for 3 int32s
    assert int_const_values({"op": "Const", "proto": bad}) is None  # malformed: no value, no error
    assert int_list_attr(nodes["sq"], "squeeze_dims") == (0, 2)
    assert int_list_attr(nodes["s0"], "squeeze_dims") == ()
    assert int_list_attr(nodes["sq"], "T") is None  # a type, not a list


_K = {}


def _kernel(shape):
    """A variable of ``shape`` (one per shape, made once: tf.function captures it)."""
    if shape not in _K:
        _K[shape] = tf.Variable(tf.random.stateless_normal(shape, seed=(len(_K), 1)) * 0.1)
    return _K[shape]


def _conv(x, **kw):
    return tf.nn.relu(tf.nn.conv2d(x, _kernel((3, 3, 3, 8)), 1, "SAME", **kw))


_NHWC, _NCHW = tf.TensorSpec([4, 12, 12, 3]), tf.TensorSpec([4, 3, 12, 12])
#: Small inference graphs that exercise one rule each: (name, function, input, GPU).
_RULE_CASES = [
    # A scalar axis is not a vector: the mean is not converted.
    ("scalar reduction axis", lambda x: tf.reduce_mean(_conv(x), axis=-1), _NHWC, "7.0"),
    # ReverseV2 is converted whatever its axis operand.
    ("reverse", lambda x: tf.nn.relu(tf.reverse(_conv(x), [2])), _NHWC, "7.0"),
    # A converted Shape's output follows a transform (a permuted vector): so does the Fill.
    ("fill of a shape", lambda x: _conv(x) + tf.ones(tf.shape(_conv(x))), tf.TensorSpec([None, 12, 12, 3]), "7.0"),
    # 5-D: a Conv3D's global pooling over D, H and W is converted.
    ("conv3d pooling", lambda x: tf.reduce_mean(tf.nn.relu(tf.nn.conv3d(
        x, _kernel((3, 3, 3, 3, 8)), [1] * 5, "SAME")), axis=[1, 2, 3]) * 2.0, tf.TensorSpec([2, 6, 8, 8, 3]), "7.0"),
    # NCHW convolutions a 9.0 GPU runs NHWC (float32 inference): H, W and C are the source
    # layout's positions for reductions and squeezes.
    ("NCHW mean over H, W", lambda x: tf.reduce_mean(_conv(x, data_format="NCHW"), axis=[2, 3]) * 2.0, _NCHW, "9.0"),
    ("NCHW sum over C, H", lambda x: tf.reduce_sum(_conv(x, data_format="NCHW"), axis=[1, 2]) * 2.0, _NCHW, "9.0"),
    ("NCHW squeeze of H, W", lambda x: tf.squeeze(tf.reduce_mean(_conv(x, data_format="NCHW"), axis=[2, 3],
                                                                 keepdims=True), [2, 3]) * 2.0, _NCHW, "9.0"),
    # A SelectV2 of a 4-D tensor and a scalar (dropout makes one): TensorFlow's pass fails on
    # it and Grappler keeps the graph unconverted.
    ("select with a scalar", lambda x: tf.nn.relu(tf.where(_conv(x) > 0, _conv(x), 0.0)), _NHWC, "7.0"),
]


@pytest.mark.parametrize("name, fn, spec, capability", _RULE_CASES, ids=[c[0] for c in _RULE_CASES])
def test_each_rule_against_grappler(name, fn, spec, capability):
    graph = tf.function(fn).get_concrete_function(spec).graph
    gd, shapes = graph.as_graph_def(), captured_variable_shapes(graph)
    grappler, ours = _compare(gd, shapes, capability)
    assert set(ours) == set(grappler)
    # Each case converts something, but the one whose conversion TensorFlow abandons.
    assert bool(grappler) is (name != "select with a scalar")


def test_a_step_with_dropout_or_a_convolution_in_a_loop_is_priced_without_transposes():
    k0, k = _kernel((3, 3, 3, 8)), _kernel((3, 3, 8, 8))

    def step(loop: bool):
        @tf.function
        def train(x):
            with tf.GradientTape() as tape:
                h = tf.nn.conv2d(x, k0, 1, "SAME")
                if loop:  # a ConvLSTM-like loop: Grappler's pass fails on its frames
                    _, h = tf.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, tf.tanh(tf.nn.conv2d(h, k, 1, "SAME"))),
                                         [tf.constant(0), h], maximum_iterations=3)
                else:
                    h = tf.nn.dropout(tf.nn.relu(h), 0.2, seed=1)
                loss = tf.reduce_mean(tf.square(tf.reduce_mean(tf.nn.conv2d(h, k, 1, "SAME"), [1, 2])))
            for v, g in zip([k0, k], tape.gradient(loss, [k0, k])):
                v.assign_sub(0.01 * g)
            return loss

        graph = train.get_concrete_function(_NHWC).graph
        return graph.as_graph_def(), captured_variable_shapes(graph), [t.op.name for t in graph.outputs]

    # Dropout: a float32 training step, yet Grappler leaves no Transpose (its pass failed).
    gd, shapes, fetches = step(loop=False)
    grappler, ours = _compare(gd, shapes, "9.0")
    assert not grappler and not ours
    est = amp_rewrite.estimate_step_time(gd, target="gpu:9.0", variable_shapes=shapes, fetches=fetches)
    assert est.transposes == 0 and est.kernels > 0
    # A convolution in a loop: Grappler converts through the loop's frames (this one) or fails
    # on them (others); the model places no Transpose in a graph whose loop converts anything,
    # rather than a wrong one at every boundary of the loop's body, once per iteration.
    gd, shapes, fetches = step(loop=True)
    assert grappler_counts.our_layout_transposes(gd, shapes, "9.0")  # the main graph alone
    est = amp_rewrite.estimate_step_time(gd, target="gpu:9.0", variable_shapes=shapes, fetches=fetches)
    assert est.transposes == 0 and est.kernels > 0


def test_a_graph_saved_without_default_attributes_converts_as_with_them():
    gd, shapes, _ = _step()
    stripped = type(gd)()
    stripped.CopyFrom(gd)
    for n in stripped.node:
        if "data_format" in n.attr and n.attr["data_format"].s == b"NHWC":
            del n.attr["data_format"]  # the registered default, as a SavedModel strips it
    assert not any("data_format" in n.attr for n in stripped.node)
    assert set(grappler_counts.our_layout_transposes(stripped, shapes, "9.0")) == set(_compare(gd, shapes, "9.0")[1])


def test_a_called_function_is_inlined_into_the_step_before_its_layout_is_decided():
    """A SavedModel's signature calls the model's function; a Keras step may call nested
    functions.  TensorFlow inlines those calls before Grappler: one layout for the whole, no
    Transpose at a call's boundary but where the other side is not converted."""
    k1, k2 = _kernel((3, 3, 3, 8)), _kernel((3, 3, 8, 8))

    @tf.function
    def model(x):
        return tf.nn.relu(tf.nn.conv2d(tf.nn.relu(tf.nn.conv2d(x, k1, 1, "SAME")), k2, 1, "SAME"))

    @tf.function
    def serve(x):
        return model(x)

    @tf.function
    def features(x):  # the forward half alone: no convolution gradient, so NHWC by itself
        return tf.nn.relu(tf.nn.conv2d(x, k1, 1, "SAME"))

    @tf.function
    def train(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.reduce_mean(tf.nn.conv2d(features(x), k2, 1, "SAME"), [1, 2])))
        for v, g in zip([k1, k2], tape.gradient(loss, [k1, k2])):
            v.assign_sub(0.01 * g)
        return loss

    for fn, capability in ((serve, "7.0"), (train, "9.0")):
        graph = fn.get_concrete_function(_NHWC).graph
        gd, shapes, fetches = graph.as_graph_def(), captured_variable_shapes(graph), [t.op.name for t in graph.outputs]
        assert gd.library.function and any(n.op in ("PartitionedCall", "StatefulPartitionedCall") for n in gd.node)
        grappler, _ = _compare(gd, shapes, capability)
        nodes = amp_rewrite.estimate_node_times(gd, target=f"gpu:{capability}", variable_shapes=shapes,
                                                fetches=fetches)
        ours = [n for part in nodes.values() for n, t in part.items() if t.kind == "layout"]
        assert grappler and len(ours) == len(grappler)


def test_inlining_gives_up_rather_than_copy_an_exponential_call_tree(monkeypatch):
    from amp_rewrite.plan import inlined

    gd, shapes, fetches = _step()  # no calls: the main graph itself, never copied
    g = amp_rewrite.api._import_to_price(gd, "gpu:9.0", "float16", False, shapes, None, None, None)[0].graph
    view = inlined.inline_calls(g, {}, lambda k: {}, lambda k: None, lambda k: frozenset())
    assert view is not None and view.graph is g
    monkeypatch.setattr(inlined, "MAX_INLINED_NODES", len(g) - 1)
    assert inlined.inline_calls(g, {}, lambda k: {}, lambda k: None, lambda k: frozenset()) is None
    est = amp_rewrite.estimate_step_time(gd, target="gpu:9.0", variable_shapes=shapes, fetches=fetches)
    assert est.transposes == 0 and est.kernels > 0  # priced, without the Transposes it could not place
