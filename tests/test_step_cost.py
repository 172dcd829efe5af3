"""The cost model's whole-step estimate (``amp_rewrite.estimate_step_time``): every node priced in
the type it has, so a float32 graph, our rewritten graph and a graph built in mixed precision
compare on one scale (issue 22's predicted-against-measured ratios)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

import amp_rewrite
from amp_rewrite.graph import dtypes as dt
from amp_rewrite.plan.cost_model import DEVICE_COSTS, cast_cost, node_cost
from amp_rewrite.plan.step_cost import StepEstimate, node_precision
from graphs import graph_def, v1

TARGET = "gpu:9.0"
N = 2048


def _mlp(dtype: tf.DType = tf.float32, frozen: bool = True) -> tf.compat.v1.GraphDef:
    """Two large MatMuls, each followed by a ReLU and a scaling, in ``dtype`` (float32, or
    float16 with Casts at the edges, as a graph built in mixed precision has them).  Their
    weights are constants (``frozen``), or fed as a variable's value is."""

    def build() -> None:
        x = v1.placeholder(tf.float32, [N, N], name="x")
        h = tf.cast(x, dtype) if dtype != tf.float32 else x
        for i in range(2):
            w = (tf.constant(np.full((N, N), 0.01, np.float32), name=f"w{i}") if frozen
                 else v1.placeholder(tf.float32, [N, N], name=f"w{i}"))
            h = tf.nn.relu(tf.matmul(h, tf.cast(w, dtype) if dtype != tf.float32 else w), name=f"relu{i}")
            h = tf.multiply(h, tf.constant(0.5, dtype), name=f"scale{i}")
        tf.identity(tf.cast(h, tf.float32) if dtype != tf.float32 else h, name="y")

    return graph_def(build)


def test_node_precision_reads_the_type_attributes():
    assert node_precision({"T": dt.HALF}) == "low"
    assert node_precision({"T": dt.BFLOAT16, "U": dt.FLOAT}) == "low"
    assert node_precision({"T": dt.FLOAT}) == "float32"
    assert node_precision({"Tin": (dt.INT32, dt.FLOAT)}) == "float32"
    assert node_precision({"T": dt.INT32}) is None
    assert node_precision({}) is None


@pytest.mark.parametrize("compiled", [False, True])
def test_the_rewritten_graph_is_estimated_faster_than_float32_and_every_part_is_priced(compiled):
    gd = _mlp(frozen=False)
    before = gd.SerializeToString(deterministic=True)
    f32 = amp_rewrite.estimate_step_time(gd, target=TARGET, compiled=compiled)
    result = amp_rewrite.rewrite_graph_def(gd, target=TARGET, precision="float16", fetches=["y"], use_env=False,
                                           compiled=compiled)
    low = amp_rewrite.estimate_step_time(result.graph_def, target=TARGET, compiled=compiled)
    assert gd.SerializeToString(deterministic=True) == before  # read, never changed
    # The rewrite converted both MatMuls: the estimate sees them in float16, and its Casts.
    assert f32.low_nodes == 0 and f32.casts == 0 and low.low_nodes >= 2 and low.casts >= 2
    costs = DEVICE_COSTS["gpu-hopper"]
    one = node_cost("MatMul", [(N, N), (N, N)], [(N, N)], 2, costs, compiled=compiled)
    assert f32.dense_ns == pytest.approx(2 * one.high)
    assert low.dense_ns == pytest.approx(2 * one.low)
    assert low.cast_ns >= cast_cost((N, N), 2, costs, compiled=compiled)
    assert low.total_ns < f32.total_ns
    # Kernels: every priced op without XLA.  Under XLA each ReLU fuses into the scaling that
    # reads it (same stage), and each scaling ends a kernel (a MatMul, or the step, reads it).
    assert f32.kernels == (4 if compiled else 6)
    # Memory: without XLA each of the four element-wise ops (two ReLUs, two scalings) reads
    # and writes a tensor, each at its kernel's measured factor (a ReLU streams, a scaling
    # broadcasts its scalar); under XLA only the two scalings' outputs reach memory, written
    # once (a MatMul prices its reads).
    tensor = N * N * 4 / costs.bandwidth
    eager = 4 * tensor * (costs.elementwise["Relu"][0] + costs.elementwise["Mul"][0])
    assert f32.elementwise_ns == pytest.approx(2 * tensor if compiled else eager, rel=1e-3)
    assert f32.overhead_ns == pytest.approx(f32.kernels * costs.kernel_overhead)
    assert f32.device_ns == pytest.approx(f32.dense_ns + f32.elementwise_ns + f32.cast_ns + f32.overhead_ns)
    # The executor's host time: one per kernel without XLA, none under XLA; this MLP's two
    # 2048^3 MatMuls keep the GPU busy longer than the host takes to launch six kernels.
    assert f32.host_ns == pytest.approx(0.0 if compiled else f32.kernels * costs.host_per_kernel)
    assert f32.total_ns == f32.device_ns


def _biased_mlp(frozen: bool) -> tf.compat.v1.GraphDef:
    """Two large MatMuls, each followed by a bias and a ReLU; weights and biases constants
    (``frozen``) or fed."""

    def build() -> None:
        h = v1.placeholder(tf.float32, [N, N], name="x")
        for i in range(2):
            w, b = ((tf.constant(np.full(shape, 0.01, np.float32)) if frozen else v1.placeholder(tf.float32, shape))
                    for shape in ((N, N), (N,)))
            h = tf.nn.relu(tf.nn.bias_add(tf.matmul(h, w), b), name=f"relu{i}")
        tf.identity(h, name="y")

    return graph_def(build)


def test_without_xla_the_affine_ops_grappler_folds_into_frozen_weights_cost_nothing():
    """On a CPU, Grappler fuses a constant bias into the frozen MatMul before it, and the
    activation behind that bias: with constant weights only the MatMuls run, as the planner
    prices it (:mod:`amp_rewrite.plan.grappler_folds`); with fed weights the four element-wise
    ops are kernels.  A GPU fuses nothing into a MatMul (cuBLASLt's fusion is off by default):
    there they run frozen or not.  A ReLU with no bias before it is not fused, and a scaling
    after a ReLU is not folded (``_mlp``).  Under XLA, XLA's fusion is priced instead, frozen
    or not."""
    cpu = dict(target="cpu", precision="bfloat16")
    frozen = amp_rewrite.estimate_step_time(_biased_mlp(True), **cpu)
    fed = amp_rewrite.estimate_step_time(_biased_mlp(False), **cpu)
    assert (frozen.kernels, frozen.elementwise_ns) == (2, 0.0)
    assert fed.kernels == 6 and fed.elementwise_ns > 0
    assert frozen.dense_ns == pytest.approx(fed.dense_ns)
    on_gpu = [amp_rewrite.estimate_step_time(_biased_mlp(f), target=TARGET) for f in (True, False)]
    assert on_gpu[0].kernels == on_gpu[1].kernels == 6
    assert on_gpu[0].elementwise_ns == pytest.approx(on_gpu[1].elementwise_ns) and on_gpu[0].elementwise_ns > 0
    unbiased = amp_rewrite.estimate_step_time(_mlp(), target=TARGET)
    assert unbiased.kernels == 6 and unbiased.elementwise_ns > 0
    xla = [amp_rewrite.estimate_step_time(_biased_mlp(f), target=TARGET, compiled=True) for f in (True, False)]
    assert xla[0].kernels == xla[1].kernels == 4


def test_a_gpu_prices_cudnns_one_fusion_of_a_frozen_convolution():
    """On a GPU a frozen 3x3 convolution's ``BiasAdd`` and ``Relu`` fuse into cuDNN's call, a
    batch norm's scale goes into its weights, and its shift and a ``Relu6`` run (a 1x1
    convolution fuses nothing): the step estimate counts the kernels that remain."""

    def build(kernel: int, activation) -> tf.compat.v1.GraphDef:
        def body() -> None:
            x = v1.placeholder(tf.float32, [8, 28, 28, 64], name="x")
            w = tf.constant(np.full((kernel, kernel, 64, 64), 0.01, np.float32))
            c = tf.nn.conv2d(x, w, 1, "SAME")
            scale, shift = (tf.constant(np.full(64, v, np.float32)) for v in (0.5, 1.0))
            biased = tf.nn.bias_add(c * scale, shift)
            tf.identity(activation(biased), name="y")

        return graph_def(body)

    def kernels(kernel: int, activation) -> int:
        return amp_rewrite.estimate_step_time(build(kernel, activation), target=TARGET).kernels

    assert kernels(3, tf.nn.relu) == 1  # the fused convolution
    assert kernels(1, tf.nn.relu) == kernels(3, tf.nn.relu6) == 3  # the convolution, the bias, the activation
    assert amp_rewrite.estimate_step_time(build(1, tf.nn.relu), target="cpu", precision="bfloat16").kernels == 1


def test_a_swish_is_one_fused_kernel_on_a_cpu_class_that_measured_it_and_three_on_a_gpu():
    """Grappler's swish fusion is oneDNN's: on the x86 bfloat16 classes ``x * sigmoid(x)`` is
    one kernel, priced as the fused kernel, as the planner prices it; a GPU runs the Sigmoid
    and the Mul apart."""

    def build() -> None:
        x = v1.placeholder(tf.float32, [8, 28, 28, 64], name="x")
        w = v1.placeholder(tf.float32, [1, 1, 64, 64], name="w")
        c = tf.nn.conv2d(x, w, 1, "SAME", name="conv")
        tf.identity(tf.multiply(c, tf.math.sigmoid(c, name="sigmoid"), name="swish"), name="y")

    gd = graph_def(build)
    cpu = amp_rewrite.estimate_step_time(gd, target="cpu", precision="bfloat16")
    gpu = amp_rewrite.estimate_step_time(gd, target=TARGET)
    assert (cpu.kernels, gpu.kernels) == (2, 3)
    swish = node_cost("_Swish", [(8, 28, 28, 64)], [(8, 28, 28, 64)], 2, DEVICE_COSTS["cpu-amx-bf16"])
    assert cpu.elementwise_ns == pytest.approx(swish.high)


def test_a_graph_built_in_mixed_precision_is_priced_as_it_is():
    """A graph whose ops were built in float16 (as Keras's ``mixed_float16`` builds them) is
    priced in float16 without any rewrite: the same dense time as our rewrite of the float32
    graph."""
    built = amp_rewrite.estimate_step_time(_mlp(tf.float16), target=TARGET, compiled=True)
    ours = amp_rewrite.estimate_step_time(
        amp_rewrite.rewrite_graph_def(_mlp(), target=TARGET, precision="float16", fetches=["y"], use_env=False,
                                      compiled=True).graph_def, target=TARGET, compiled=True)
    f32 = amp_rewrite.estimate_step_time(_mlp(), target=TARGET, compiled=True)
    # Both MatMuls, ReLUs and scalings; the Casts of x and y (those of the constant weights are folded
    # when the graph is loaded, and cost nothing).
    assert built.low_nodes == 6 and built.casts == 2
    assert built.dense_ns == pytest.approx(ours.dense_ns)
    assert built.total_ns < f32.total_ns
    # A strict-FP32 GPU (TF32 off) gains more from the same graph.
    strict = amp_rewrite.Target("gpu", (amp_rewrite.Device("GPU", 0, (9, 0), frozenset({"tf32_off"})),))
    f32_strict = amp_rewrite.estimate_step_time(_mlp(), target=strict, compiled=True)
    built_strict = amp_rewrite.estimate_step_time(_mlp(tf.float16), target=strict, compiled=True)
    assert built_strict.total_ns / f32_strict.total_ns < built.total_ns / f32.total_ns


def test_estimates_add_up():
    a = StepEstimate(1.0, 2.0, 3.0, 4.0, 5, 6, 7)
    assert (a + a).as_dict() == StepEstimate(2.0, 4.0, 6.0, 8.0, 10, 12, 14).as_dict()
    assert (a + a).total_ns == 20.0
    # Host and device times add up apart over a step's graphs; the step takes the longer.
    host_bound = StepEstimate(1.0, 2.0, 3.0, 4.0, 5, 6, 7, host_ns=30.0)
    assert (host_bound + a).total_ns == 30.0 and (host_bound + a).device_ns == 20.0
    assert host_bound.scaled(3).total_ns == 90.0 and host_bound.scaled(3).device_ns == 30.0
    assert {"host_us", "device_us", "total_us"} <= set(host_bound.as_dict())


def test_a_step_of_small_kernels_waits_for_the_host_without_xla():
    """Without XLA a GPU's executor spends host time on every kernel: a graph of many small
    element-wise ops is bound by it (its step time is the host's, and a rewrite's Casts would
    lengthen it); under XLA the host launches one executable and the device time is the step."""
    def build() -> None:
        h = v1.placeholder(tf.float32, [64, 64], name="x")
        for i in range(20):
            h = tf.nn.relu(h * 0.5 + 0.1, name=f"r{i}")
        tf.identity(h, name="y")

    gd = graph_def(build)
    plain = amp_rewrite.estimate_step_time(gd, target=TARGET)
    fused = amp_rewrite.estimate_step_time(gd, target=TARGET, compiled=True)
    assert plain.host_ns > plain.device_ns and plain.total_ns == plain.host_ns
    assert plain.host_ns == pytest.approx(plain.kernels * DEVICE_COSTS["gpu-hopper"].host_per_kernel)
    assert fused.host_ns == 0.0 and fused.total_ns == fused.device_ns


def test_bad_input_is_refused_with_the_products_error():
    with pytest.raises(amp_rewrite.AmpRewriteError):
        amp_rewrite.estimate_step_time(b"not a graph", target=TARGET)
    with pytest.raises(amp_rewrite.AmpRewriteError):
        amp_rewrite.estimate_step_time("nope", target=TARGET)
    with pytest.raises(amp_rewrite.AmpRewriteError):
        amp_rewrite.estimate_step_time(_mlp(), target="tpu:1")


def test_under_xla_a_tensor_read_again_after_a_dense_op_is_written_and_read_back():
    """XLA cannot fuse across a MatMul: a ReLU's output that a residual Add reads after the
    MatMul it feeds must be in memory -- written once, read back once -- while the same Add
    reading only the MatMul's output leaves the ReLU written once (for the MatMul)."""

    def block(residual: bool) -> tf.compat.v1.GraphDef:
        def build() -> None:
            x = v1.placeholder(tf.float32, [N, N], name="x")
            r = tf.nn.relu(x, name="r")
            m = tf.matmul(r, tf.constant(np.full((N, N), 0.01, np.float32)), name="m")
            tf.identity(tf.add(m, r if residual else tf.constant(1.0), name="add"), name="y")

        return graph_def(build)

    costs = DEVICE_COSTS["gpu-hopper"]
    tensor = N * N * 4 / costs.bandwidth
    plain = amp_rewrite.estimate_step_time(block(False), target=TARGET, compiled=True)
    skip = amp_rewrite.estimate_step_time(block(True), target=TARGET, compiled=True)
    # ReLU: written for the MatMul (and read back by the Add); Add: written as the step's result.
    assert plain.elementwise_ns == pytest.approx(2 * tensor, rel=1e-3)
    assert skip.elementwise_ns == pytest.approx(3 * tensor, rel=1e-3)
    assert plain.kernels == skip.kernels == 3  # the MatMul and two fusions
    # Without XLA both are three kernels reading and writing whole tensors.
    eager = amp_rewrite.estimate_step_time(block(True), target=TARGET, compiled=False)
    factor = {op: costs.elementwise[op][0] for op in ("Relu", "AddV2")}
    assert eager.kernels == 3
    assert eager.elementwise_ns == pytest.approx((2 * factor["Relu"] + 3 * factor["AddV2"]) * tensor, rel=1e-3)


def test_a_loop_body_counts_once_per_iteration_of_its_sequence():
    """A ``tf.while_loop`` over the rows of a tensor (how Keras runs an RNN) runs its body once
    per row: the MatMul inside is priced ``T`` times, not once; a function called once counts
    once, and one nothing calls not at all."""
    T, M = 7, 512

    @tf.function
    def step(x, w):
        rows = tf.TensorArray(tf.float32, size=T).unstack(x)

        def body(i, acc):
            return i + 1, acc + tf.matmul(rows.read(i), w)

        return tf.while_loop(lambda i, acc: i < T, body, (tf.constant(0), tf.zeros((M, M))))[1]

    gd = step.get_concrete_function(tf.TensorSpec((T, M, M)), tf.TensorSpec((M, M))).graph.as_graph_def()
    assert any(n.op in ("While", "StatelessWhile") for n in gd.node) and len(gd.library.function) >= 2
    est = amp_rewrite.estimate_step_time(gd, target=TARGET, compiled=False)
    one = node_cost("MatMul", [(M, M), (M, M)], [(M, M)], 2, DEVICE_COSTS["gpu-hopper"])
    assert est.dense_ns == pytest.approx(T * one.high)

    from amp_rewrite.plan.step_cost import call_counts

    main = nx_graph("main")
    body, unused = nx_graph("body"), nx_graph("unused")
    main.add_node("loop", op="While", funcs=("body",), order=(0, 0))
    main.add_node("call", op="PartitionedCall", funcs=("body",), order=(1, 0))
    assert call_counts(main, {"body": body, "unused": unused}) == {"body": 32 + 1, "unused": 0}

    # A backward loop (as Keras's LSTM gradient has it, beside its forward loop) is fed a list
    # of one row -- the last step's gradient -- and the forward loop's outputs: it runs as
    # often as the forward loop.
    from amp_rewrite.graph.ir import add_data_edge

    g = nx_graph("train")
    for i, (name, op, funcs) in enumerate([("seq", "Placeholder", ()), ("rows", "TensorListFromTensor", ()),
                                           ("fwd", "While", ("fwd_body",)), ("last", "Placeholder", ()),
                                           ("one", "TensorListFromTensor", ()), ("bwd", "While", ("bwd_body",))]):
        g.add_node(name, op=op, funcs=funcs, order=(i, 0))
    g.graph["shapes"] = {"seq": ((T, 4, 8),), "last": ((1, 4, 8),)}
    for src, dst, port in [("seq", "rows", 0), ("rows", "fwd", 0), ("last", "one", 0), ("one", "bwd", 0),
                           ("fwd", "bwd", 1)]:
        add_data_edge(g, src, 0, dst, port, None)
    counts = call_counts(g, {"fwd_body": nx_graph("fwd_body"), "bwd_body": nx_graph("bwd_body")})
    assert counts == {"fwd_body": T, "bwd_body": T}


def nx_graph(name: str):
    """An empty IR graph (a loop in it has an unknown trip count: no TensorList feeds it)."""
    import networkx as nx

    return nx.MultiDiGraph(name=name, signatures={}, shapes={})


def test_cudnn_rnn_is_priced_as_its_gemms_and_its_time_steps():
    """Keras 3's LSTM and GRU trace to ``CudnnRNNV3`` on a GPU: priced as the GEMMs of every
    gate and time step (gates read from the weights' size), whichever the major dimension,
    twice that backward, faster in float16 by the GEMM rates, and never faster than one kernel
    per time step."""
    from amp_rewrite.plan.cost_model import RNN_OPS, _rnn_work

    gpu = DEVICE_COSTS["gpu-hopper"]
    seq, batch, width, units = 16, 64, 256, 512
    for gates in (4, 3):  # LSTM, GRU: weights and two biases per gate block
        params = (gates * units * (width + units + 2),)
        time_major = [(seq, batch, width), (1, batch, units), (1, batch, units), params]
        batch_major = [(batch, seq, width), (batch, 1, units), (batch, 1, units), params]
        flops = 2.0 * seq * batch * gates * units * (width + units)
        for ins in (time_major, batch_major):
            assert _rnn_work(ins) == (flops, (batch, width + units, gates * units), seq)
        fwd = node_cost("CudnnRNNV3", time_major, [time_major[0][:2] + (units,)], 2, gpu)
        bwd = node_cost("CudnnRNNBackpropV3", time_major, [time_major[0]], 2, gpu)
        assert fwd.flops == flops and bwd.flops == 2 * flops
        assert fwd.low < fwd.high and bwd.low < bwd.high
        assert fwd.low > seq * gpu.kernel_overhead  # one time step after another
    assert "CudnnRNNV3" in RNN_OPS
    # The class's own recurrent figures (fitted to an H200's LSTM steps): a fixed time per
    # time step in either precision, and their own share of the GEMM rates, not the share the
    # class's other dense ops reach.
    ins = [(seq, batch, width), (1, batch, units), (1, batch, units), (4 * units * (width + units + 2),)]
    out = [(seq, batch, units)]
    flops = _rnn_work(ins)[0]
    mine = dataclasses.replace(gpu, rnn_step_time=50_000.0, rnn_efficiency=(0.5, 0.25))
    no_fit = dataclasses.replace(gpu, rnn_step_time=0.0, rnn_efficiency=None)
    fitted, plain = node_cost("CudnnRNNV3", ins, out, 2, mine), node_cost("CudnnRNNV3", ins, out, 2, no_fit)
    assert fitted.high - plain.high == pytest.approx(
        seq * (50_000.0 - gpu.kernel_overhead) + flops / (gpu.f32_flops * 0.5) - flops / (gpu.f32_flops * gpu.dense_efficiency))
    assert fitted.low - plain.low == pytest.approx(
        seq * (50_000.0 - gpu.kernel_overhead) + flops / (gpu.low_flops * 0.25) - flops / (gpu.low_flops * gpu.dense_efficiency))
    # A MatMul on the same class keeps the class's dense efficiency.
    assert node_cost("MatMul", [(256, 256), (256, 256)], [(256, 256)], 2, mine) == node_cost(
        "MatMul", [(256, 256), (256, 256)], [(256, 256)], 2, no_fit)
    # Unknown weights: an LSTM's four gates.
    assert _rnn_work([(seq, batch, width), (1, batch, units), (1, batch, units), None])[0] == (
        2.0 * seq * batch * 4 * units * (width + units))


def test_a_conditional_branch_takes_its_shapes_and_variable_shapes_from_its_call_site():
    """A ``tf.cond`` branch declares no argument shapes, and its resource arguments no value
    shapes: its body's shapes come from what the call site passes -- the tensor's shape, and
    the shape of the variable behind a captured resource (a training step's update inside
    the loss-scale conditional).  Without them its MatMul was priced at the cost model's
    default sizes."""
    from amp_rewrite import api
    from amp_rewrite.graph.op_registry import default_registry
    from amp_rewrite.graph.shapes import function_shapes
    from amp_rewrite.training.tf_function import captured_variable_shapes

    v = tf.Variable(tf.zeros([64, 32]))

    @tf.function
    def step(x, pred):
        return tf.cond(pred, lambda: tf.matmul(x, v), lambda: tf.zeros([8, 32]))

    graph = step.get_concrete_function(tf.TensorSpec([8, 64]), tf.TensorSpec([], tf.bool)).graph
    gd = graph.as_graph_def()
    # TensorFlow records the branch's tensor argument shapes as argument attributes; a graph
    # rewritten and exported by other tools may not keep them (ours did not): without them,
    # only the call site knows.
    for f in gd.library.function:
        for i in list(f.arg_attr):
            del f.arg_attr[i]
    branch = next(f for f in gd.library.function if any(n.op == "MatMul" for n in f.node_def))
    matmul = next(n.name for n in branch.node_def if n.op == "MatMul")
    read = next(n.name for n in branch.node_def if n.op == "ReadVariableOp")
    alone = function_shapes(branch)  # no call site: what the FunctionDef itself declares
    assert alone.get(read, (None,))[0] is None and alone[matmul][0] in (None, (None, None), (None, 32))
    imported = api._import(gd, default_registry(), "reachable", True, captured_variable_shapes(graph))
    shapes = imported.functions[branch.signature.name].graph["shapes"]
    assert shapes[read] == ((64, 32),) and shapes[matmul] == ((8, 32),)
    # Priced whole, the branch's MatMul is now the 8x64x32 product it is.
    est = amp_rewrite.estimate_step_time(gd, target="gpu:8.0", variable_shapes=captured_variable_shapes(graph))
    assert est.dense_ns == pytest.approx(node_cost("MatMul", [(8, 64), (64, 32)], [(8, 32)], 2,
                                                   DEVICE_COSTS["gpu-ampere"], constant_weights=False).high)


def test_call_sites_that_disagree_leave_an_argument_unknown():
    """A function called from two places takes only what both pass: a shape they agree on,
    ``None`` where they differ; nothing where a call passes another number of arguments or
    its arguments are unknown (a loop's body: ``None``)."""
    from amp_rewrite.graph.shapes import merge_call_arguments

    a = [((8, 64), None), ((), (64, 32))]
    b = [((4, 64), None), ((), (64, 32))]
    assert merge_call_arguments([a], 2) == a
    assert merge_call_arguments([a, b], 2) == [(None, None), ((), (64, 32))]
    assert merge_call_arguments([a, a[:1]], 2) is None and merge_call_arguments([], 2) is None
    assert merge_call_arguments([a, None], 2) is None


def _nested_cond_step() -> tuple[tf.Graph, tf.compat.v1.GraphDef, dict]:
    """A ``tf.function`` step calling another that holds a ``tf.cond`` whose true branch reads
    a captured 64x32 variable: ``(graph, its GraphDef, the variables' shapes)``."""
    from amp_rewrite.training.tf_function import captured_variable_shapes

    v = tf.Variable(tf.zeros([64, 32]))

    @tf.function
    def inner(x, pred):
        return tf.cond(pred, lambda: tf.matmul(x, v), lambda: tf.zeros([8, 32]))

    @tf.function
    def step(x, pred):
        return inner(x, pred) + 1.0

    graph = step.get_concrete_function(tf.TensorSpec([8, 64]), tf.TensorSpec([], tf.bool)).graph
    return graph, graph.as_graph_def(), captured_variable_shapes(graph)


def _branch_node(gd: tf.compat.v1.GraphDef, op: str) -> tuple[str, str]:
    """``(the branch function that holds a MatMul, the name of its node of ``op``)``."""
    branch = next(f for f in gd.library.function if any(n.op == "MatMul" for n in f.node_def))
    return branch.signature.name, next(n.name for n in branch.node_def if n.op == op)


def test_a_library_function_nothing_calls_does_not_hide_call_sites_from_its_callees():
    """Only callers reachable from the main graph count: a dead copy of a function in the
    library (imported with ``functions="all"``, as SavedModels are) must not keep the
    branch it calls from taking its variable's shape through the live caller (a nested
    ``tf.function`` around a ``tf.cond``)."""
    from amp_rewrite import api
    from amp_rewrite.graph.op_registry import default_registry

    _, gd, variables = _nested_cond_step()
    live = next(f for f in gd.library.function if "inner" in f.signature.name)
    dead = gd.library.function.add()
    dead.CopyFrom(live)
    dead.signature.name = "dead_copy_of_inner"
    branch, read = _branch_node(gd, "ReadVariableOp")
    for functions in ("reachable", "all"):
        imported = api._import(gd, default_registry(), functions, True, variables)
        assert imported.functions[branch].graph["shapes"][read] == ((64, 32),), functions


def test_shapes_reach_a_branch_through_a_function_that_calls_it():
    """A function body that itself calls a function (here a ``tf.function`` whose body holds
    a ``tf.cond``) has shapes too -- TensorFlow's conversion of a body wants every function it
    names registered, which the inert copy never needs -- so the call site inside it passes
    the tensor's shape on to the branch two levels down."""
    from amp_rewrite import api
    from amp_rewrite.graph.op_registry import default_registry
    from amp_rewrite.graph.shapes import function_shapes

    _, gd, variables = _nested_cond_step()
    for f in gd.library.function:  # only call sites tell shapes (see the test above)
        for i in list(f.arg_attr):
            del f.arg_attr[i]
    outer = next(f for f in gd.library.function if "inner" in f.signature.name)
    assert function_shapes(outer), "a body with a call gets shapes of its own nodes"
    branch, matmul = _branch_node(gd, "MatMul")
    imported = api._import(gd, default_registry(), "reachable", True, variables)
    assert imported.functions[branch].graph["shapes"][matmul] == ((8, 32),)


def test_node_times_add_up_to_the_step_estimate():
    """``estimate_node_times`` is ``estimate_step_time`` node by node: the nodes' times and their
    kernels' fixed times add up to the step's total, float32 and rewritten alike, and a
    rewritten graph's Casts and low-precision nodes are marked so."""
    float32 = _mlp()
    rewritten = amp_rewrite.rewrite_graph_def(float32, target="gpu:9.0", precision="float16", use_env=False,
                                              fetches=["y"]).graph_def
    for gd in (float32, rewritten):
        step = amp_rewrite.estimate_step_time(gd, target="gpu:9.0")
        nodes = amp_rewrite.estimate_node_times(gd, target="gpu:9.0")
        main = nodes[""]
        assert sum(t.ns + t.fixed_ns for t in main.values()) == pytest.approx(step.device_ns)
        assert sum(t.fixed_ns > 0 for t in main.values()) + step.casts == step.kernels
        assert sum(t.kind == "cast" for t in main.values()) == step.casts
        assert all(t.known_shape for t in main.values())
    kinds = {(t.op, t.kind, t.precision) for t in amp_rewrite.estimate_node_times(rewritten, target="gpu:9.0")[""].values()}
    assert ("MatMul", "dense", "low") in kinds and ("Cast", "cast", "low") in kinds


def _called_functions_step(M: int = N) -> tf.compat.v1.GraphDef:
    """A step that runs two library functions, each an ``M`` x ``M`` MatMul, and a loop whose
    body is one (seven rows): the main graph, functions and a loop body, all priced."""
    T = 7

    @tf.function
    def first(x, w):
        return tf.nn.relu(tf.matmul(x, w))

    @tf.function
    def second(x, w):
        return tf.matmul(x, w) * 0.5

    @tf.function
    def step(seq, x, w):
        rows = tf.TensorArray(tf.float32, size=T).unstack(seq)

        def body(i, acc):
            return i + 1, acc + tf.matmul(rows.read(i), w)

        looped = tf.while_loop(lambda i, acc: i < T, body, (tf.constant(0), tf.zeros((M, M))))[1]
        return second(first(x, w), w) + looped

    spec = tf.TensorSpec((M, M))
    return step.get_concrete_function(tf.TensorSpec((T, M, M)), spec, spec).graph.as_graph_def()


@pytest.mark.parametrize("compiled", [False, True])
def test_a_rewrite_prices_the_step_as_given_and_as_rewritten_as_estimate_step_time_does(compiled):
    """``price_step`` prices the whole step (main graph, called functions, a loop body per
    iteration) from the rewrite's own import, before and after the rewrite: the same estimates
    as pricing the input and the output again, which costs two imports more.  The rewrite
    converted something, so the two differ.  Cost-aware planners only; off by default."""
    gd = _called_functions_step()
    options = {"target": TARGET, "precision": "float16", "use_env": False, "compiled": compiled}
    result = amp_rewrite.rewrite_graph_def(gd, lists="optimal", price_step=True, **options)
    assert result.report["converted_nodes"] > 0
    estimates = result.step_estimates
    assert estimates.given == amp_rewrite.estimate_step_time(gd, target=TARGET, compiled=compiled)
    assert estimates.rewritten == amp_rewrite.estimate_step_time(result.graph_def, target=TARGET, compiled=compiled)
    assert estimates.given.low_nodes == 0 and estimates.rewritten.low_nodes > 0
    assert estimates.rewritten.dense_ns < estimates.given.dense_ns
    assert amp_rewrite.rewrite_graph_def(gd, lists="optimal", **options).step_estimates is None
    with pytest.raises(amp_rewrite.AmpRewriteError, match="price_step needs a cost-aware planner"):
        amp_rewrite.rewrite_graph_def(gd, lists="default", price_step=True, **options)
    with pytest.raises(amp_rewrite.AmpRewriteError, match="price_step"):
        amp_rewrite.rewrite_graph_def(gd, lists="optimal", price_step="yes", **options)


def test_a_function_the_rewrite_skips_keeps_its_price_as_given():
    """A library function the rewrite cannot take (here: a cycle not closed by a loop) is
    exported as it was, so the rewritten step prices it as given; the other function's MatMul
    is priced in float16.  (4096 x 4096: at 2048 a MatMul called alone gains less in float16
    than its three Casts cost, each 2.08x its bytes' time as an H200 ran them.)"""
    M = 4096
    gd = _called_functions_step(M)
    bodies = {f.signature.name: f for f in gd.library.function
              if any(n.op == "MatMul" for n in f.node_def) and not any(n.op == "Relu" for n in f.node_def)
              and any(n.op == "Mul" for n in f.node_def)}
    (name, broken), = bodies.items()
    for a, b in (("cycle_a", "cycle_b"), ("cycle_b", "cycle_a")):
        node = broken.node_def.add(name=a, op="Identity", input=[f"{b}:output:0"])
        node.attr["T"].type = dt.FLOAT
    result = amp_rewrite.rewrite_graph_def(gd, lists="optimal", price_step=True, target=TARGET,
                                           precision="float16", use_env=False)
    assert name in result.report["skipped_functions"]
    one = node_cost("MatMul", [(M, M), (M, M)], [(M, M)], 2, DEVICE_COSTS["gpu-hopper"],
                    constant_weights=False)
    given, rewritten = result.step_estimates.given, result.step_estimates.rewritten
    assert given == amp_rewrite.estimate_step_time(gd, target=TARGET)
    # TensorFlow cannot import the broken body to infer its shapes, so its MatMul is priced at
    # the model's default size (a few hundred ns): the other eight, converted, save high - low
    # each, and the broken one is in the rewritten step at its price as given.
    broken_ns = given.dense_ns - 8 * one.high
    assert 0 < broken_ns < one.low
    assert rewritten.dense_ns == pytest.approx(broken_ns + 8 * one.low, abs=1.0)
    assert rewritten == amp_rewrite.estimate_step_time(result.graph_def, target=TARGET)  # the same sums


def test_a_function_called_by_the_step_and_by_a_library_function_that_never_runs_counts_once():
    """The library may hold functions nothing runs (a SavedModel's other signatures): one that
    calls a function the step calls too must not hold back that function's count (it did, and
    the step then priced ``outer`` and ``inner`` at 0).  Priced from the rewrite's import of every
    function (``functions="all"``), the step is what ``estimate_step_time`` makes of it."""
    from amp_rewrite.plan.step_cost import call_counts

    @tf.function
    def inner(x, w):
        return tf.nn.relu(tf.matmul(x, w))

    @tf.function
    def outer(x, w):
        return inner(x, w) * 2.0

    @tf.function
    def step(x, w):
        return outer(x, w) + 1.0

    @tf.function
    def unused(x, w):
        return outer(x, w) - 1.0

    spec = tf.TensorSpec((N, N))
    gd = step.get_concrete_function(spec, spec).graph.as_graph_def()
    gd.library.function.add().CopyFrom(unused.get_concrete_function(spec, spec).function_def)
    result = amp_rewrite.rewrite_graph_def(gd, lists="optimal", target=TARGET, precision="float16", use_env=False,
                                           compiled=True, price_step=True, functions="all")
    one = node_cost("MatMul", [(N, N), (N, N)], [(N, N)], 2, DEVICE_COSTS["gpu-hopper"], constant_weights=False)
    assert result.step_estimates.given.dense_ns == pytest.approx(one.high)
    assert result.step_estimates.given == amp_rewrite.estimate_step_time(gd, target=TARGET, compiled=True)
    assert result.step_estimates.rewritten == amp_rewrite.estimate_step_time(result.graph_def, target=TARGET,
                                                                             compiled=True)
    main, a, b, c = nx_graph("main"), nx_graph("a"), nx_graph("b"), nx_graph("never")
    main.add_node("call", op="PartitionedCall", funcs=("a",), order=(0, 0))
    a.add_node("call", op="PartitionedCall", funcs=("b",), order=(0, 0))
    c.add_node("call", op="PartitionedCall", funcs=("a",), order=(0, 0))
    assert call_counts(main, {"a": a, "b": b, "never": c}) == {"a": 1, "b": 1, "never": 0}


def test_a_step_that_cannot_be_priced_is_still_rewritten_with_a_warning(caplog, monkeypatch):
    """Pricing is an extra: where it fails, the rewrite stands, ``step_estimates`` is ``None``
    and a WARNING says why (the training path then prices the step itself, or keeps its plan)."""
    from amp_rewrite import api

    def broken(*args, **kwargs):
        raise ValueError("a graph the model does not expect")

    monkeypatch.setattr(api, "estimate_parts", broken)
    with caplog.at_level("WARNING", logger="amp_rewrite"):
        result = amp_rewrite.rewrite_graph_def(_called_functions_step(), lists="optimal", target=TARGET,
                                               precision="float16", use_env=False, price_step=True)
    assert result.step_estimates is None and result.report["converted_nodes"] > 0
    assert any("could not be priced" in r.getMessage() and "does not expect" in r.getMessage()
               for r in caplog.records)


def test_the_shapes_of_a_graph_inferred_before_are_reused():
    """Shape inference runs TensorFlow's import (seconds on a training step); the training
    path's whole-step check prices a step and then rewrites it, and an autotune rewrites one
    graph per candidate.  The same bytes, variable shapes and registry give the same shapes
    without importing again, as a copy; anything else that differs is inferred anew."""
    from amp_rewrite.graph import shapes as shapes_module
    from amp_rewrite.graph.op_registry import TensorFlowRegistry

    shapes_module.clear_shape_memo()
    inferred = []
    infer = shapes_module._infer_graph_shapes  # noqa: SLF001
    infer_function = shapes_module._infer_function_shapes  # noqa: SLF001

    def counted(*args):
        inferred.append("graph")
        return infer(*args)

    def counted_function(*args):
        inferred.append("function")
        return infer_function(*args)

    import unittest.mock as mock

    gd = _mlp(frozen=False)
    with mock.patch.object(shapes_module, "_infer_graph_shapes", counted), \
            mock.patch.object(shapes_module, "_infer_function_shapes", counted_function):
        first = shapes_module.graph_shapes(gd)
        same_bytes = tf.compat.v1.GraphDef.FromString(gd.SerializeToString())
        again = shapes_module.graph_shapes(same_bytes)
        assert again == first and inferred == ["graph"]
        again["relu0"] = ((1,),)  # a copy: the memo is not changed through it
        assert shapes_module.graph_shapes(gd)["relu0"] == ((N, N),) and inferred == ["graph"]
        shapes_module.graph_shapes(gd, {"w0": (N, N)})
        assert inferred == ["graph"] * 2
        shapes_module.graph_shapes(gd, registry=TensorFlowRegistry())  # another registry
        assert inferred == ["graph"] * 3

        fdef = _called_functions_step().library.function[0]
        assert shapes_module.function_shapes(fdef) == shapes_module.function_shapes(fdef)
        assert inferred.count("function") == 1
        # Other call arguments (lists as well as tuples) are another inference.
        args = [[[N, N], None]] * len(fdef.signature.input_arg)
        assert shapes_module.function_shapes(fdef, call=args) == shapes_module.function_shapes(fdef, call=args)
        assert inferred.count("function") == 2
        # A message that cannot be serialized (over protobuf's 2 GB) is inferred each time.
        with mock.patch.object(shapes_module, "_serialized", lambda message: None):
            shapes_module.graph_shapes(gd)
            shapes_module.function_shapes(fdef)
        assert inferred.count("graph") == 4 and inferred.count("function") == 3
    shapes_module.clear_shape_memo()


def test_only_what_runs_is_priced():
    """TensorFlow prunes what nothing needs before it runs a graph (a traced training step
    computes and drops the gradients of constants): the estimate prices a function's body
    without what neither its results nor its stateful ops need, and a main graph without what
    its ``fetches`` and stateful ops do not need.  Without fetches any node of the main graph
    may be fetched, so every node counts."""
    M = 1024
    one = node_cost("MatMul", [(M, M), (M, M)], [(M, M)], 2, DEVICE_COSTS["gpu-hopper"]).high
    v = tf.Variable(tf.zeros((M, M)))

    @tf.function
    def inner(x, w):
        tf.nn.relu(tf.matmul(x, w * 3.0), name="dropped")  # read by nothing
        v.assign(tf.matmul(w, x))  # read by nothing, but a stateful op needs it
        return tf.matmul(x, w)

    spec = tf.TensorSpec((M, M))
    concrete = inner.get_concrete_function(spec, spec)
    fetches = [t.op.name for t in concrete.outputs]
    gd = concrete.graph.as_graph_def()
    every = amp_rewrite.estimate_step_time(gd, target=TARGET)
    run = amp_rewrite.estimate_step_time(gd, target=TARGET, fetches=fetches)
    assert every.dense_ns == pytest.approx(3 * one) and run.dense_ns == pytest.approx(2 * one)
    assert run.elementwise_ns < every.elementwise_ns and run.kernels < every.kernels
    nodes = amp_rewrite.estimate_node_times(gd, target=TARGET, fetches=fetches)[""]
    assert "dropped" not in nodes and sum(t.op == "MatMul" for t in nodes.values()) == 2
    assert "dropped" in amp_rewrite.estimate_node_times(gd, target=TARGET)[""]

    # A function's body always runs only what its results and stateful ops need.
    @tf.function
    def outer(x, w):
        return inner(x, w) + 1.0

    gd = outer.get_concrete_function(spec, spec).graph.as_graph_def()
    assert any(len(f.node_def) > 5 for f in gd.library.function)
    assert amp_rewrite.estimate_step_time(gd, target=TARGET).dense_ns == pytest.approx(2 * one)

    with pytest.raises(amp_rewrite.AmpRewriteError, match="does not exist"):
        amp_rewrite.estimate_step_time(concrete.graph.as_graph_def(), target=TARGET, fetches=["no_such_node"])


def test_under_xla_an_op_that_only_forwards_a_tensor_stands_for_its_readers():
    """XLA compiles ``Identity``/``IdentityN``/``Reshape`` to nothing (or a bitcast) and needs no
    value for a ``Shape``: a ReLU fused into the Mul that reads it stays in registers though an
    ``IdentityN`` also reads it, when nothing that runs reads that output of the ``IdentityN``
    (as TensorFlow's ``silu`` hands its input to its gradient).  Where a later stage reads the
    forwarded tensor, it is in memory; without fetches the unread output may be fetched, so
    the ReLU is written as a result."""

    def block(forward: str) -> tf.compat.v1.GraphDef:
        def build() -> None:
            x = v1.placeholder(tf.float32, [N, N], name="x")
            # After a MatMul: a ReLU of the input alone would be recomputed by a later reader.
            h = tf.matmul(x, tf.constant(np.full((N, N), 0.02, np.float32)), name="h")
            r = tf.nn.relu(h, name="r")
            m = tf.multiply(r, 2.0, name="m")
            y = tf.matmul(m, tf.constant(np.full((N, N), 0.01, np.float32)), name="y")
            if forward != "none":
                y, forwarded = tf.identity_n([y, r], name="idn")
                if forward == "read later":
                    tf.add(forwarded, y, name="later")
            tf.shape(r, name="shape")
            tf.identity(y, name="out")

        return graph_def(build)

    def elementwise(forward: str, **kw) -> float:
        return amp_rewrite.estimate_step_time(block(forward), target=TARGET, compiled=True, **kw).elementwise_ns

    tensor = N * N * 4 / DEVICE_COSTS["gpu-hopper"].bandwidth
    alone = elementwise("none", fetches=["out"])
    assert alone == pytest.approx(tensor, rel=1e-3)  # the Mul, written for the MatMul
    assert elementwise("unread", fetches=["out"]) == pytest.approx(alone)
    assert elementwise("unread") == pytest.approx(alone + tensor, rel=1e-3)  # idn:1 may be fetched
    # The ReLU written and read back after the MatMul, and the Add written as a result.
    assert elementwise("read later", fetches=["out", "later"]) == pytest.approx(alone + 3 * tensor, rel=1e-3)


def test_under_xla_an_op_of_inputs_alone_is_recomputed_by_a_later_reader():
    """An element-wise op with no dense op or reduction upstream (an optimizer's
    ``momentum * m``, a weight's Cast) is fused by XLA into a reader after a MatMul, which reads
    its input instead of its output: no kernel and no write of its own, one read.  The same op
    after a MatMul must be written for the later reader and read back; so must an expensive one
    (a ``Tanh``), which XLA's GPU fusion does not repeat in its readers."""

    def block(kind: str) -> tf.compat.v1.GraphDef:
        def build() -> None:
            x = v1.placeholder(tf.float32, [N, N], name="x")
            w = tf.constant(np.full((N, N), 0.01, np.float32))
            source = tf.matmul(x, w, name="first") if kind == "after a MatMul" else x
            s = tf.math.tanh(source, name="s") if kind == "expensive" else tf.multiply(source, 0.9, name="s")
            y = tf.matmul(source, w, name="y")
            tf.identity(tf.add(s, y, name="add"), name="out")

        return graph_def(build)

    def estimate(kind: str):
        return amp_rewrite.estimate_step_time(block(kind), target=TARGET, compiled=True, fetches=["out"])

    tensor = N * N * 4 / DEVICE_COSTS["gpu-hopper"].bandwidth
    recomputed = estimate("cheap")
    # The Add written as the result, and ``s``'s input read by the Add's kernel.
    assert recomputed.elementwise_ns == pytest.approx(2 * tensor, rel=1e-3)
    assert recomputed.kernels == 2  # the MatMul and the Add's fusion
    # ``s`` written and read back, the Add written.
    written = estimate("after a MatMul")
    assert written.elementwise_ns == pytest.approx(3 * tensor, rel=1e-3)
    assert written.kernels == 4  # two MatMuls, ``s``'s fusion and the Add's
    expensive = estimate("expensive")
    assert expensive.kernels == 3  # the MatMul, ``s``'s fusion and the Add's
    assert expensive.elementwise_ns > 3 * tensor * 0.999  # written and read back, and its arithmetic


def test_the_optimal_planner_gives_what_never_runs_no_time():
    """A node nothing needs costs no time (TensorFlow prunes it), so the optimal planner does
    not convert it to gain some -- nor adds Casts for it -- and says why; the MatMul that
    runs converts.  Without fetches every node of the main graph may run, and both convert.
    (4096 x 4096: at 2048 a MatMul alone gains less in float16 than its Casts cost on a GPU.)"""
    M = 4096

    @tf.function
    def step(x, w):
        tf.nn.relu(tf.matmul(x, w * 3.0, name="dropped"))
        return tf.nn.relu(tf.matmul(x, w, name="kept"))

    spec = tf.TensorSpec((M, M))
    concrete = step.get_concrete_function(spec, spec)
    fetches = [t.op.name for t in concrete.outputs]
    kw = dict(target=TARGET, precision="float16", lists="optimal", use_env=False)
    run = amp_rewrite.rewrite_graph_def(concrete.graph.as_graph_def(), fetches=fetches, **kw).report["nodes"]
    assert run["kept"]["dtype"] == "float16"
    assert run["dropped"]["dtype"] == "float32" and "never runs" in run["dropped"]["reason"]
    every = amp_rewrite.rewrite_graph_def(concrete.graph.as_graph_def(), **kw).report["nodes"]
    assert every["kept"]["dtype"] == every["dropped"]["dtype"] == "float16"
