"""The optimal planner: exact min cut, normalization-aware safety, cost model, shape awareness.

Unit and golden tests on tiny graphs; brute force over all colourings for optimality; the
corpus cast counts against TensorFlow's own pass; numerics of the rewritten corpus graphs.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import amp_rewrite
from amp_rewrite.plan.cost_model import (DEVICE_COSTS, NodeCost, alignment_efficiency, cast_cost, conv_positions,
                                         costs_for, dense_band, node_cost)
from amp_rewrite.graph.io import import_graph_def
from amp_rewrite.plan.normalization import find_normalizations, upstream_of_fragile
from amp_rewrite.graph.shapes import graph_shapes
from amp_rewrite.graph.op_registry import default_registry
from amp_rewrite.plan.mincut import FREE, HIGH, LOW, PlacementProblem, objective, solve
from amp_rewrite.plan.targets import Device, Target
from amp_rewrite.testing import MULTI_DEVICES, check_allow_deny, graphs_with_options
from graphs import graph_def, run, v1

GPU = DEVICE_COSTS["gpu-ampere"]  # what TensorFlow's oracle targets (gpu:8.0)
BF16_CPU = DEVICE_COSTS["cpu-avx512-bf16"]


# ------------------------------------------------------------------ the solver is exact


def _brute_force(problem: PlacementProblem) -> float:
    free = [v for v, f in enumerate(problem.fixed) if f == FREE]
    best = float("inf")
    for bits in itertools.product((False, True), repeat=len(free)):
        low = [f == LOW for f in problem.fixed]
        for v, b in zip(free, bits):
            low[v] = b
        best = min(best, objective(problem, low))
    return best


@st.composite
def problems(draw: st.DrawFn) -> PlacementProblem:
    n = draw(st.integers(2, 9))
    fixed = draw(st.lists(st.sampled_from([FREE, FREE, FREE, HIGH, LOW]), min_size=n, max_size=n))
    cost = st.integers(0, 50).map(float)
    high = draw(st.lists(cost, min_size=n, max_size=n))
    low = draw(st.lists(cost, min_size=n, max_size=n))
    tensors = draw(st.lists(
        st.tuples(st.lists(st.integers(0, n - 1), min_size=2, max_size=min(4, n), unique=True).map(tuple),
                  st.integers(1, 40).map(float)),
        max_size=12))
    # Uncuttable ties (a TensorList cluster, a loop back edge) among free vertices.
    free = [v for v, f in enumerate(fixed) if f == FREE]
    if len(free) >= 2:
        ties = draw(st.lists(st.lists(st.sampled_from(free), min_size=2, max_size=3, unique=True).map(tuple),
                             max_size=2))
        tensors += [(t, float("inf")) for t in ties]
    return PlacementProblem(fixed, high, low, tensors)


@settings(max_examples=300, deadline=None)
@given(problems())
def test_min_cut_equals_brute_force_on_random_problems(problem):
    low = solve(problem)
    for v, f in enumerate(problem.fixed):
        if f != FREE:
            assert low[v] == (f == LOW)
    assert objective(problem, low) == pytest.approx(_brute_force(problem), abs=1e-6)


def test_one_cast_serves_all_consumers():
    # Producer 0 fixed low, three consumers: two fixed high (a Cast is paid anyway), one free.
    problem = PlacementProblem([LOW, HIGH, HIGH, FREE], [0, 0, 0, 5.0], [0, 0, 0, 0.0],
                               [((0, 1, 2, 3), 10.0)])
    # The free consumer costs 5 in float32 and nothing in low, and the Cast exists anyway.
    assert solve(problem) == [True, False, False, True]
    assert objective(problem, [True, False, False, True]) == 10.0


def _small_graphs():
    """Small graphs where every colouring can be enumerated: chains and diamonds around
    MatMuls, with clear and infer ops between them."""
    def chain():
        x = v1.placeholder(tf.float32, (64, 64), name="x")
        w = tf.constant(np.ones((64, 64), np.float32), name="w")
        a = tf.matmul(x, w, name="mm1")
        b = tf.nn.relu(a, name="relu")
        c = tf.add(b, x, name="add")
        d = tf.matmul(c, w, name="mm2")
        e = tf.tanh(d, name="tanh")
        tf.identity(tf.add(e, b, name="add2"), name="out")

    def diamond():
        x = v1.placeholder(tf.float32, (128, 128), name="x")
        w = tf.constant(np.ones((128, 128), np.float32), name="w")
        a = tf.matmul(x, w, name="mm1")
        l = tf.nn.relu(a, name="left")
        r = tf.sigmoid(a, name="right")
        s = tf.add(l, r, name="sum")
        m = tf.matmul(s, w, name="mm2")
        tf.identity(tf.nn.softmax(tf.add(m, s, name="add")), name="out")

    return {"chain": graph_def(chain), "diamond": graph_def(diamond)}


@pytest.mark.parametrize("name", ["chain", "diamond"])
@pytest.mark.parametrize("target", ["gpu:8.0", "cpu"])
def test_min_cut_is_optimal_on_small_graphs_by_brute_force(name, target):
    gd = _small_graphs()[name]
    res = amp_rewrite.rewrite_graph_def(gd, target=target, lists="optimal", use_env=False,
                                        precision="float16" if target != "cpu" else "bfloat16")
    summary = res.plans[""].placement
    problem = summary.problem
    free = sum(1 for f in problem.fixed if f == FREE)
    assert 2 <= free <= 16, free
    best = _brute_force(problem)
    assert objective(problem, solve(problem)) == pytest.approx(best)
    # The plan is that optimum, unless the Cast guard traded it for fewer Casts (an
    # element-wise op measured slower in low precision can make the optimum split a tensor
    # TensorFlow's colouring keeps whole) or its gain was too small to trust.
    if not summary.guarded and not summary.below_margin:
        assert objective(problem, summary.solution) == pytest.approx(best)
    # ... and no worse than TensorFlow's greedy colouring or float32, on the same model.
    assert summary.optimal_us <= summary.greedy_us + 1e-9
    assert summary.optimal_us <= summary.float32_us + 1e-9


# ------------------------------------------------------------------ cost model


def test_cost_model_big_matmul_pays_small_one_does_not_on_gpu():
    # Against TF32, a 1024^3 product's gain about matches its three Casts (each 2.08x its
    # bytes' time, as measured on an H200); at 2048^3 the product grows 8x, the Casts 4x.
    big = node_cost("MatMul", [(2048, 2048), (2048, 2048)], [(2048, 2048)], 2, GPU)
    small = node_cost("MatMul", [(2, 16), (16, 8)], [(2, 8)], 2, GPU)
    assert big.high - big.low > 3 * cast_cost((2048, 2048), 2, GPU)
    assert small.high - small.low < 3 * cast_cost((2, 16), 2, GPU)
    # Against TF32 (TensorFlow's float32 from 8.0) float16 saves about half of a large
    # product's time; against Volta's FP32, about seven eighths.
    volta = node_cost("MatMul", [(4096, 4096), (4096, 4096)], [(4096, 4096)], 2, DEVICE_COSTS["gpu-volta"])
    ampere = node_cost("MatMul", [(4096, 4096), (4096, 4096)], [(4096, 4096)], 2, GPU)
    assert ampere.low / ampere.high == pytest.approx(0.5, abs=0.05)
    assert volta.low / volta.high == pytest.approx(1 / 8, abs=0.03)


def test_gpu_classes_by_compute_capability_and_tf32():
    """One class per family; float32 is TF32 from 8.0 unless TF32 is off; a capability
    unknown counts as the newest family."""
    from amp_rewrite.plan.cost_model import TF32_OFF, gpu_costs
    from amp_rewrite.plan.targets import Device

    names = {cap: gpu_costs(Device("GPU", 0, cap)).name for cap in ((7, 0), (7, 5), (8, 0), (8, 9), (9, 0), (10, 0))}
    assert names == {(7, 0): "gpu-volta", (7, 5): "gpu-volta", (8, 0): "gpu-ampere", (8, 9): "gpu-ampere",
                     (9, 0): "gpu-hopper", (10, 0): "gpu-hopper"}
    assert gpu_costs(Device("GPU", 0, None)).name == "gpu-hopper"
    strict = gpu_costs(Device("GPU", 0, (9, 0), frozenset({TF32_OFF})))
    tf32 = gpu_costs(Device("GPU", 0, (9, 0)))
    assert strict.name == "gpu-hopper-fp32" and strict.low_flops == tf32.low_flops
    assert tf32.low_flops / tf32.f32_flops < 2.5 < strict.low_flops / strict.f32_flops
    assert gpu_costs(Device("GPU", 0, (7, 0), frozenset({TF32_OFF}))).name == "gpu-volta"  # no TF32 there
    # Convolutions have rates of their own (cuDNN): the gain of float16 over TF32 is smaller.
    shape = [(64, 56, 56, 256), (3, 3, 256, 256)], [(64, 56, 56, 256)]
    conv = node_cost("Conv2D", *shape, 2, tf32)
    gemm = node_cost("MatMul", [(4096, 4096), (4096, 4096)], [(4096, 4096)], 2, tf32)
    assert gemm.low / gemm.high < conv.low / conv.high < 0.7


def test_small_depthwise_gains_nothing_on_a_cpu_without_amx_a_large_one_does():
    x = y = (2, 16, 16, 64)
    dw = node_cost("DepthwiseConv2dNative", [x, (3, 3, 64, 1)], [y], 2, BF16_CPU, constant_weights=True)
    conv = node_cost("Conv2D", [x, (3, 3, 64, 64)], [y], 2, BF16_CPU, constant_weights=True)
    assert dw.flops < 5e6 and dw.low >= dw.high  # measured in place at batch 2: no speed-up at all
    assert conv.low < 0.95 * conv.high
    # At batch 8 and 112x112 (measured there): a third faster, and far inside the small
    # ones' multiple of the roofline.
    big = (8, 112, 112, 96)
    large = node_cost("DepthwiseConv2dNative", [big, (3, 3, 96, 1)], [big], 2, BF16_CPU, constant_weights=True)
    assert large.flops > 2e7 and large.low < 0.7 * large.high
    assert large.high / large.flops < 0.2 * dw.high / dw.flops
    # Its gradients run a reference kernel in bfloat16: measured 2-3x slower, and more at
    # batch 8.
    for shape in (x, big):
        w = (3, 3, shape[-1], 1)
        dw_filter = node_cost("DepthwiseConv2dNativeBackpropFilter", [shape, (4,), shape], [w], 2, BF16_CPU)
        dw_input = node_cost("DepthwiseConv2dNativeBackpropInput", [(4,), w, shape], [shape], 2, BF16_CPU)
        assert dw_filter.low > 2 * dw_filter.high and dw_input.low > 2 * dw_input.high
    # Dense ops measured in place are priced from their measured ratios, not the flop rates,
    # for their size (and, for a convolution, its positions and kind of weights).
    band = dense_band(BF16_CPU, "Conv2D", conv.flops, 2 * 16 * 16, constant_weights=True)
    assert band is not None and conv.flops < band.below_flops
    assert conv.high == pytest.approx(band.scale * (conv.flops / BF16_CPU.f32_flops
                                                    + (2 * 2 * 16 * 16 * 64 + 9 * 64 * 64) * 4 / BF16_CPU.bandwidth))
    assert conv.low == pytest.approx(conv.high * band.ratio)


def test_measured_dense_ops_gain_more_when_larger():
    """A bfloat16 convolution's gain grows with its size (fixed costs do not shrink), and the
    filter gradient, no gain when small, gains when large: priced per size band."""
    def conv_grads(hw: int, channels: int):
        x = (2, hw, hw, channels)
        w = (3, 3, channels, channels)
        fwd = node_cost("Conv2D", [x, w], [x], 2, BF16_CPU)
        bpi = node_cost("Conv2DBackpropInput", [(4,), w, x], [x], 2, BF16_CPU)
        bpf = node_cost("Conv2DBackpropFilter", [x, (4,), x], [w], 2, BF16_CPU)
        return fwd, bpi, bpf

    small, large = conv_grads(8, 32), conv_grads(32, 256)
    assert small[0].flops < 5e6 and large[0].flops > 2e8
    for s, l in zip(small, large):
        assert l.low / l.high < s.low / s.high
    assert small[2].low >= small[2].high and large[2].low < 0.8 * large[2].high
    bands = BF16_CPU.dense["Conv2D"]
    assert [b.below_flops for b in bands] == sorted(b.below_flops for b in bands) and bands[-1].below_flops == math.inf


def test_conv_positions_are_the_output_positions_times_batch():
    x, w, y = (2, 8, 8, 512), (1, 1, 512, 256), (2, 4, 4, 256)  # stride 2
    assert conv_positions("Conv2D", [x, w], [y]) == 32
    assert conv_positions("Conv2DBackpropInput", [(4,), w, y], [x]) == 32
    assert conv_positions("Conv2DBackpropFilter", [x, (4,), y], [w]) == 32
    assert conv_positions("Conv3D", [(1, 4, 4, 4, 8), (1, 1, 1, 8, 8)], [(1, 2, 2, 2, 8)]) == 8
    assert conv_positions("Conv2D", [x, w], [(None, 4, 4, 256)]) is None
    assert conv_positions("MatMul", [(8, 512), (512, 256)], [(8, 256)]) is None


def test_skinny_convolutions_and_constant_weights_are_priced_apart_on_this_cpu():
    """A deep layer at a small batch (8 output positions reading a 1M-element filter) was
    measured to gain nothing in bfloat16 when its weights change every step, and a third when
    they are constant (their re-layout is done once); the same flops over many positions gain
    a quarter.  Its gradients differ too: the input gradient gains more when skinny, the
    filter gradient loses."""
    x, w, y = (2, 2, 2, 512), (1, 1, 512, 2048), (2, 2, 2, 2048)
    skinny = node_cost("Conv2D", [x, w], [y], 2, BF16_CPU)
    assert 5e6 < skinny.flops < 2e7
    assert skinny.low > 0.95 * skinny.high
    frozen = node_cost("Conv2D", [x, w], [y], 2, BF16_CPU, constant_weights=True)
    assert frozen.low < 0.75 * frozen.high
    wide_x, wide_w, wide_y = (2, 8, 8, 256), (1, 1, 256, 256), (2, 8, 8, 256)  # 128 positions, same flops
    wide = node_cost("Conv2D", [wide_x, wide_w], [wide_y], 2, BF16_CPU)
    assert wide.flops == skinny.flops and wide.low < 0.85 * wide.high
    # Skinny GEMMs run far above the roofline in float32: the same flops cost more.
    assert skinny.high > 1.5 * wide.high
    # Between 16 and 64 positions the gain is in between; unknown positions price a wide op.
    assert dense_band(BF16_CPU, "Conv2D", 1e7, 8).ratio > dense_band(BF16_CPU, "Conv2D", 1e7, 32).ratio \
        > dense_band(BF16_CPU, "Conv2D", 1e7, 64).ratio == dense_band(BF16_CPU, "Conv2D", 1e7).ratio
    for positions in (8, 32, 128):
        assert dense_band(BF16_CPU, "Conv2D", 1e7, positions, constant_weights=True).ratio \
            < dense_band(BF16_CPU, "Conv2D", 1e7, positions).ratio
    for op, skinny_gains_more in (("Conv2DBackpropInput", True), ("Conv2DBackpropFilter", False)):
        thin, broad = dense_band(BF16_CPU, op, 1e8, 8), dense_band(BF16_CPU, op, 1e8, 512)
        assert thin.below_positions == 16 and broad.below_positions == math.inf
        assert (thin.ratio < broad.ratio) == skinny_gains_more
    assert dense_band(BF16_CPU, "Conv2DBackpropFilter", 1e8, 8).ratio > 1 \
        > dense_band(BF16_CPU, "Conv2DBackpropFilter", 1e8).ratio
    # The GPU classes band only their depthwise convolutions (one band each): positions change
    # nothing there.
    assert dense_band(GPU, "Conv2D", skinny.flops, 8) is None
    assert dense_band(GPU, "DepthwiseConv2dNative", 1e8, 8) == GPU.dense["DepthwiseConv2dNative"][0]


def test_the_cpu_class_convolution_bands_are_the_fit_of_the_committed_calibration_dumps():
    """The 5-200 Mflop convolution bands of ``cpu-avx512-bf16`` are what
    ``bench/fit_conv_bands.py --ranges 2e7,2e8`` gives on the six dumps committed under
    ``bench/cpu_runs/`` (``CLASS_DUMPS``; so the table and its data cannot drift apart); the other ranges are the
    class's own, which the fit keeps."""
    import importlib
    import os
    import sys

    bench = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench")
    sys.path.insert(0, bench)
    try:
        fit = importlib.import_module("fit_conv_bands")
    finally:
        sys.path.remove(bench)
    assert len(fit.CLASS_DUMPS) == 6 and all(os.path.exists(d) for d in fit.CLASS_DUMPS)
    fitted = fit.fit_bands(fit.load(fit.CLASS_DUMPS), BF16_CPU, ranges=(2e7, 2e8))
    for op in fit.OPS:
        assert fitted[op] == BF16_CPU.dense[op], op
    assert BF16_CPU.dense["_FusedConv2D"] == BF16_CPU.dense["Conv2D"]
    assert any(b.constant_weights for b in BF16_CPU.dense["Conv2D"])


def test_misaligned_dims_are_reported_and_cost_more():
    aligned = node_cost("MatMul", [(256, 256), (256, 256)], [(256, 256)], 2, GPU)
    odd = node_cost("MatMul", [(256, 250), (250, 256)], [(256, 256)], 2, GPU)
    assert aligned.misaligned == () and odd.misaligned == (250,)
    assert odd.low / odd.flops > aligned.low / aligned.flops
    assert alignment_efficiency((16, 32), 16) == 1.0 and alignment_efficiency((17,), 16) == pytest.approx(17 / 32)


def test_small_matmul_surrounded_by_casts_stays_float32_with_the_reason():
    def build():
        x = v1.placeholder(tf.float32, (2, 4), name="x")
        w = v1.placeholder(tf.float32, (4, 4), name="w")
        tf.identity(tf.matmul(x, w, name="mm"), name="out")

    gd = graph_def(build)
    greedy = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", use_env=False)
    optimal = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="optimal", use_env=False)
    assert greedy.report["nodes"]["mm"]["color"] == "allow"
    node = optimal.report["nodes"]["mm"]
    assert node["dtype"] == "float32" and "cost model" in node["reason"]
    assert optimal.report["casts_to_low"] + optimal.report["casts_to_high"] == 0
    assert optimal.report["placement"]["estimated_us"]["optimal"] <= optimal.report["placement"]["estimated_us"]["greedy"]


def test_large_matmul_converts_and_planner_option_overrides_profile():
    def build():
        # 2048: against TF32 (gpu:8.0's float32) float16 halves a product's time, and each
        # Cast costs a kernel launch: a 512^3 product no longer pays for three of them.
        x = v1.placeholder(tf.float32, (2048, 2048), name="x")
        w = v1.placeholder(tf.float32, (2048, 2048), name="w")
        tf.identity(tf.matmul(tf.nn.relu(x), w, name="mm"), name="out")

    gd = graph_def(build)
    optimal = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="optimal", use_env=False)
    assert optimal.report["nodes"]["mm"]["dtype"] == "float16"
    greedy = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="optimal", planner="greedy",
                                           use_env=False)
    assert "placement" not in greedy.report
    with pytest.raises(amp_rewrite.AmpRewriteError, match="planner"):
        amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", planner="fast", use_env=False)


# Device classes by CPU features, as target="auto" resolves them on such a machine.
AVX512_BF16 = Target("cpu", (Device("CPU", 0, None, frozenset({"avx512f", "avx512_bf16"})),),
                     description="cpu (avx512_bf16)")


def test_transcendental_ops_are_priced_from_measurements_on_x86_bfloat16():
    shape = (128, 1024)  # under the large tensors' edge: the batch-2 table
    memory_bound = 2 * 128 * 1024 * 4 / BF16_CPU.bandwidth
    erfc = node_cost("Erfc", [shape], [shape], 2, BF16_CPU)
    add = node_cost("AddV2", [shape, shape], [shape], 2, BF16_CPU)
    # Erfc is compute bound in float32 too, and several times slower in bfloat16 there.
    assert erfc.high == pytest.approx(memory_bound * BF16_CPU.elementwise["Erfc"][0])
    assert erfc.low / erfc.high > 5
    # Plain arithmetic: measured in place, slower in bfloat16; unmeasured ops: generic.
    assert add.low / add.high == pytest.approx(BF16_CPU.elementwise["AddV2"][1]) and add.low > add.high
    maximum = node_cost("Maximum", [shape, shape], [shape], 2, BF16_CPU)
    assert maximum.low / maximum.high == pytest.approx(BF16_CPU.low_elementwise)
    # Ops that only forward or re-describe a tensor cost nothing in either precision.
    assert node_cost("Identity", [shape], [shape], 2, BF16_CPU) == node_cost("Reshape", [shape, (2,)], [shape], 2, GPU)
    assert node_cost("Identity", [shape], [shape], 2, BF16_CPU).high == 0.0
    # Ops that read only a shape cost nothing either (the data is never touched).
    for op in ("Shape", "ShapeN", "Size", "Rank"):
        assert node_cost(op, [shape], [], 2, BF16_CPU) == NodeCost(0.0, 0.0, 0.0)
    assert node_cost("Neg", [shape], [shape], 2, BF16_CPU).high > 0.0
    on_gpu = node_cost("Erfc", [shape], [shape], 2, GPU)
    assert on_gpu.low / on_gpu.high == pytest.approx(GPU.low_elementwise)
    # AMX multiplies in tiles; bfloat16 element-wise kernels are the same as without it.
    amx = Device("CPU", 0, None, frozenset({"amx_bf16", "amx_tile", "avx512_bf16"}))
    assert costs_for(amx, "bfloat16").elementwise == BF16_CPU.elementwise
    assert costs_for(amx, "bfloat16").low_flops == DEVICE_COSTS["cpu-amx"].low_flops
    assert costs_for(amx, "float16").name == "cpu-amx"
    assert costs_for(AVX512_BF16.devices[0], "bfloat16") is BF16_CPU
    assert len({BF16_CPU, GPU, costs_for(amx, "bfloat16")}) == 3  # still hashable


def test_large_element_wise_ops_are_priced_as_measured_at_their_size():
    """Element-wise ops on tensors past the class's edge take the table measured at batch 8:
    streaming arithmetic runs well inside the batch-2 price, Relu loses less in bfloat16, and
    pooling, unmeasured at batch 2 (the generic loss), gains from the halved bytes."""
    from amp_rewrite.plan.cost_model import X86_BF16_LARGE_ELEMENTS, X86_BF16_LARGE_ELEMENTWISE, elementwise_entry

    small, large = (2, 32, 32, 64), (8, 112, 112, 64)
    assert 2 * math.prod(small) < X86_BF16_LARGE_ELEMENTS <= 2 * math.prod(large)
    relu_small = node_cost("Relu", [small], [small], 2, BF16_CPU)
    relu_large = node_cost("Relu", [large], [large], 2, BF16_CPU)
    assert relu_small.low / relu_small.high == pytest.approx(BF16_CPU.elementwise["Relu"][1])
    assert relu_large.low / relu_large.high == pytest.approx(X86_BF16_LARGE_ELEMENTWISE["Relu"][1])
    per_element = [c.high / (2 * math.prod(s)) for c, s in ((relu_small, small), (relu_large, large))]
    assert per_element[1] < 0.5 * per_element[0]
    assert relu_small.measured and relu_large.measured
    pool_small = node_cost("MaxPool", [small], [small], 2, BF16_CPU)
    pool_large = node_cost("MaxPool", [large], [large], 2, BF16_CPU)
    assert not pool_small.measured and pool_small.low > pool_small.high  # the generic guess: a loss
    assert pool_large.measured and pool_large.low < 0.7 * pool_large.high
    # The edge counts inputs and outputs together; under it the batch-2 entry, or none.
    assert elementwise_entry(BF16_CPU, "MaxPool", X86_BF16_LARGE_ELEMENTS - 1) is None
    assert elementwise_entry(BF16_CPU, "MaxPool", X86_BF16_LARGE_ELEMENTS) == X86_BF16_LARGE_ELEMENTWISE["MaxPool"]
    # Classes without large measurements (GPUs) price every size alike; XLA's fused pricing
    # does not read the tables' ratios.
    gpu = node_cost("Relu", [large], [large], 2, GPU)
    gpu_small = node_cost("Relu", [small], [small], 2, GPU)
    assert gpu.low / gpu.high == pytest.approx(GPU.elementwise["Relu"][1]) == gpu_small.low / gpu_small.high
    assert gpu.measured
    fused = node_cost("Relu", [large], [large], 2, BF16_CPU, compiled=True)
    assert fused.low == pytest.approx(fused.high / 2)


def test_casts_and_per_step_weights_are_priced_as_measured_in_place_on_x86_bfloat16():
    from amp_rewrite.plan.cost_model import DEVICE_COSTS as costs

    shape = (2, 56, 56, 96)
    n = 2 * 56 * 56 * 96
    # In a model a Cast costs its elements (measured in place), not a chain's dispatch.
    fixed, per_element = BF16_CPU.cast_in_place
    assert cast_cost(shape, 2, BF16_CPU) == pytest.approx(fixed + n * per_element)
    # Of a tensor of unknown size (a loop body's), at the price of a chain of Casts.
    chained = BF16_CPU.op_overhead + 2 * 56 * 32 * 96 * 6 / BF16_CPU.bandwidth
    assert cast_cost((2, 56, None, 96), 2, BF16_CPU) == pytest.approx(chained)
    assert cast_cost(shape, 2, BF16_CPU) < 0.5 * (BF16_CPU.op_overhead + n * 6 / BF16_CPU.bandwidth)
    # On a GPU: a fixed time and its bytes at the traffic measured in place on an H200.
    assert cast_cost(shape, 2, GPU) == pytest.approx(GPU.op_overhead + n * 6 / GPU.bandwidth * GPU.cast_traffic)
    # A low-precision convolution whose filter is read every step pays a fixed re-layout; a
    # frozen filter does not, and a filter gradient always does.
    x, w, y = (2, 8, 8, 32), (1, 1, 32, 192), (2, 8, 8, 192)
    variable = node_cost("Conv2D", [x, w], [y], 2, BF16_CPU)
    frozen = node_cost("Conv2D", [x, w], [y], 2, BF16_CPU, constant_weights=True)
    assert variable.low - frozen.low == pytest.approx(BF16_CPU.low_dense_overhead) and variable.high == frozen.high
    # The re-layout eats nearly all of a small training convolution's gain in bfloat16;
    # frozen, it gains.
    assert variable.low > 0.95 * variable.high and frozen.low < 0.85 * frozen.high
    grad = node_cost("Conv2DBackpropFilter", [x, (4,), y], [w], 2, BF16_CPU, constant_weights=True)
    assert grad.low - grad.high >= BF16_CPU.low_dense_overhead  # re-laid out too, and no faster
    assert all(c.low_dense_overhead == 0.0 for name, c in costs.items() if name.startswith("gpu-"))


def _frozen_batch_norm_block():
    """Two frozen 1x1 convolutions of 64 channels on 8x16x16 maps with an inference batch
    norm (``x * s + t``: ``s = gamma * rsqrt(var + eps)``, a constant subgraph, and ``t =
    beta - mean * s``) and a Relu between them, as a frozen Keras model has it when the
    convolution has no bias of its own.  (Its tensors are under the CPU class's large
    tensors' edge: priced from the batch-2 tables.)"""
    def build():
        x = v1.placeholder(tf.float32, (8, 16, 16, 64), name="x")
        k = tf.constant(np.full((1, 1, 64, 64), 0.01, np.float32))
        c = tf.nn.conv2d(x, k, 1, "SAME", name="conv1")
        var = tf.constant(np.ones(64, np.float32))
        scale = tf.multiply(tf.math.rsqrt(var + 1e-3), tf.constant(np.ones(64, np.float32)), name="scale")
        scaled = tf.multiply(c, scale, name="scaled")
        shifted = tf.add(scaled, tf.constant(np.full(64, 0.1, np.float32)), name="shifted")
        r = tf.nn.relu(shifted, name="relu")
        tf.identity(tf.nn.conv2d(r, k, 1, "SAME", name="conv2"), name="out")

    return graph_def(build)


def test_a_frozen_batch_norm_costs_nothing_where_grappler_folds_it(monkeypatch):
    """Grappler folds an inference batch norm's affine ops into the frozen convolution before
    them and fuses the Relu: they never run, in either precision.  Priced as the kernels they
    would be (each slower in bfloat16 on this CPU), they would keep both convolutions
    float32."""
    import amp_rewrite.plan.grappler_folds as grappler_folds

    nodes = ("conv1", "scaled", "shifted", "relu", "conv2")

    def plan():
        report = amp_rewrite.rewrite_graph_def(_frozen_batch_norm_block(), target=AVX512_BF16,
                                               precision="bfloat16", lists="optimal", use_env=False).report
        return {n: report["nodes"][n]["dtype"] for n in nodes}

    assert set(plan().values()) == {"bfloat16"}
    monkeypatch.setattr(grappler_folds, "is_folded", lambda *args: False)
    assert set(plan().values()) == {"float32"}


def test_converting_a_convolution_cudnn_fuses_prices_its_bias_and_relu_back_in(monkeypatch):
    """On a GPU a frozen float32 3x3 convolution runs its BiasAdd and Relu inside cuDNN's call,
    but a float16 one runs them as kernels (``remapper.cc`` fuses float32 only): the planner
    prices them on the convolution's low colour, and nothing on its float32 one."""
    import amp_rewrite.plan.grappler_folds as grappler_folds

    def build():
        x = v1.placeholder(tf.float32, (8, 32, 32, 64), name="x")
        k = tf.constant(np.full((3, 3, 64, 64), 0.01, np.float32))
        b = tf.constant(np.full(64, 0.1, np.float32))
        tf.identity(tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, k, 1, "SAME"), b), name="relu"), name="out")

    def estimates():
        report = amp_rewrite.rewrite_graph_def(graph_def(build), target="gpu:9.0", precision="float16",
                                               lists="optimal", fetches=["out"], use_env=False).report
        return report["placement"]["estimated_us"]

    coupled = estimates()
    monkeypatch.setattr(grappler_folds, "float32_fusion", lambda *args: None)
    free = estimates()
    assert coupled["float32"] == pytest.approx(free["float32"])
    assert coupled["greedy"] > free["greedy"] + 1.0  # two kernels of 8x32x32x64 and their floors


def test_a_plan_whose_estimated_gain_is_within_the_models_error_stays_float32(monkeypatch):
    """A colouring estimated faster than float32 by less than ``MIN_ESTIMATED_GAIN`` is not
    taken: the estimate is within the cost model's error, and float32 is never slower."""
    import amp_rewrite.plan.optimal as optimal_module

    def plan():
        res = amp_rewrite.rewrite_graph_def(_frozen_batch_norm_block(), target=AVX512_BF16,
                                            precision="bfloat16", lists="optimal", use_env=False)
        summary = res.plans[""].placement
        return res.report["nodes"], summary

    nodes, summary = plan()
    gain = 1 - summary.optimal_us / summary.float32_us
    assert nodes["conv1"]["dtype"] == "bfloat16" and not summary.below_margin
    assert gain >= optimal_module.MIN_ESTIMATED_GAIN
    monkeypatch.setattr(optimal_module, "MIN_ESTIMATED_GAIN", gain + 0.01)
    nodes, summary = plan()
    assert summary.below_margin and summary.optimal_us == pytest.approx(summary.float32_us)
    assert {nodes[n]["dtype"] for n in ("conv1", "relu", "conv2")} == {"float32"}
    assert "within the cost model's error" in nodes["conv1"]["reason"]
    assert summary.as_dict()["below_margin"] is True


def _swish_block(beta: float | None):
    """Two frozen 1x1 convolutions of 64 channels around a swish (``x * sigmoid(x)``, or Keras
    3's ``x * sigmoid(x * beta)``) on 8x16x16 maps: in bfloat16 on AVX512-BF16 the
    convolutions gain less than an element-wise bfloat16 Sigmoid would lose (priced from the
    batch-2 tables: the tensors are under the class's large tensors' edge)."""
    def build():
        x = v1.placeholder(tf.float32, (8, 16, 16, 64), name="x")
        k = tf.constant(np.full((1, 1, 64, 64), 0.01, np.float32))
        c = tf.nn.conv2d(x, k, 1, "SAME", name="conv1")
        arg = c if beta is None else tf.multiply(c, tf.constant(beta), name="beta")
        h = tf.multiply(c, tf.math.sigmoid(arg, name="sigmoid"), name="swish")
        tf.identity(tf.nn.conv2d(h, k, 1, "SAME", name="conv2"), name="out")

    return graph_def(build)


@pytest.mark.parametrize("beta", [None, 1.0])
def test_a_swish_is_priced_as_the_fused_kernel_grappler_makes_of_it(beta, monkeypatch):
    """Grappler fuses ``x * sigmoid(x)`` into one oneDNN kernel, which has none of the
    element-wise bfloat16 Sigmoid's 3x loss on this CPU: the block converts.  Priced as a
    lone Sigmoid, it would stay float32."""
    import amp_rewrite.plan.grappler_folds as grappler_folds

    def plan():
        report = amp_rewrite.rewrite_graph_def(_swish_block(beta), target=AVX512_BF16, precision="bfloat16",
                                               lists="optimal", use_env=False).report
        return {n: report["nodes"][n]["dtype"] for n in ("conv1", "sigmoid", "swish", "conv2")}

    assert set(plan().values()) == {"bfloat16"}
    monkeypatch.setattr(grappler_folds, "swish_parts", lambda g, ops, inputs, name, consts: ())
    assert set(plan().values()) == {"float32"}
    sig = node_cost("Sigmoid", [(8, 16, 16, 64)], [(8, 16, 16, 64)], 2, BF16_CPU)
    swish = node_cost("_Swish", [(8, 16, 16, 64)], [(8, 16, 16, 64)], 2, BF16_CPU)
    assert sig.low / sig.high > 2 and swish.low / swish.high == pytest.approx(BF16_CPU.elementwise["_Swish"][1])


def _gelu_block():
    """MatMul -> two Erfc (GELU's function) -> MatMul on a batch of 8: the MatMuls gain a
    little in bfloat16 on an AVX512-BF16 CPU, the Erfcs between them lose more."""
    def build():
        x = v1.placeholder(tf.float32, (8, 256), name="x")
        w1 = tf.constant(np.full((256, 2048), 0.01, np.float32))
        w2 = tf.constant(np.full((2048, 256), 0.01, np.float32))
        h = tf.math.erfc(tf.math.erfc(tf.matmul(x, w1, name="mm1"), name="erfc"), name="erfc2")
        tf.identity(tf.matmul(h, w2, name="mm2"), name="out")

    return graph_def(build)


def test_guard_keeps_float32_when_every_colouring_within_the_cast_limit_is_slower():
    gd = _gelu_block()
    greedy = amp_rewrite.rewrite_graph_def(gd, target=AVX512_BF16, precision="bfloat16", use_env=False)
    assert greedy.report["nodes"]["erfc"]["dtype"] == "bfloat16"
    optimal = amp_rewrite.rewrite_graph_def(gd, target=AVX512_BF16, precision="bfloat16", lists="optimal",
                                            use_env=False)
    est = optimal.report["placement"]["estimated_us"]
    # Converting everything (the greedy colouring) is estimated slower than float32; keeping
    # only the Erfcs in float32 would be fastest but needs two Casts more than the greedy
    # colouring, which the guard refuses.  What remains best is float32 throughout.
    assert est["greedy"] > est["float32"]
    assert optimal.report["placement"]["guarded"]
    assert est["optimal"] <= est["float32"] + 1e-9
    assert {optimal.report["nodes"][n]["dtype"] for n in ("mm1", "erfc", "erfc2", "mm2")} == {"float32"}
    assert optimal.report["casts_to_low"] + optimal.report["casts_to_high"] == 0


def test_a_tied_loop_is_decided_as_a_unit():
    """A Keras LSTM and GRU at batch 2 (tests/corpus.py): TensorFlow's passes put the loops'
    TensorLists and back edges in low precision, tied together; the planner may keep each tied
    group in float32 as a whole, and on a CPU whose tiny bf16 MatMuls cannot pay for their
    Casts it does."""
    import corpus

    item = corpus.build("rnn/inference")
    kw = dict(target=AVX512_BF16, precision="bfloat16", fetches=list(item.fetches), use_env=False)
    greedy = amp_rewrite.rewrite_graph_def(item.graph_def, **kw)
    optimal = amp_rewrite.rewrite_graph_def(item.graph_def, lists="optimal", **kw)
    lists = [n for n, op in ((n.name, n.op) for n in item.graph_def.node) if op.startswith("TensorList")]
    assert any(greedy.report["nodes"][n]["dtype"] == "bfloat16" for n in lists)
    assert all(optimal.report["nodes"][n]["dtype"] == "float32" for n in lists)
    est = optimal.report["placement"]["estimated_us"]
    assert est["optimal"] < est["greedy"]
    assert optimal.report["casts_to_low"] + optimal.report["casts_to_high"] < (
        greedy.report["casts_to_low"] + greedy.report["casts_to_high"])
    # Still a valid graph that computes the same thing.
    for got, ref in zip(corpus.run(optimal.graph_def, item), corpus.run(item.graph_def, item)):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_uncuttable_ties_keep_their_members_together():
    # Vertices 0 and 1 are tied; 0 is cheaper low, 1 much cheaper high: they share one side.
    problem = PlacementProblem([FREE, FREE, LOW], [10.0, 0.0, 0.0], [0.0, 30.0, 0.0],
                               [((0, 1), float("inf")), ((1, 2), 1.0)])
    low = solve(problem)
    assert low[0] == low[1] and objective(problem, low) == pytest.approx(_brute_force(problem))
    with pytest.raises(ValueError, match="ties"):
        solve(PlacementProblem([FREE, LOW, HIGH], [0.0] * 3, [0.0] * 3, [((0, 1, 2), float("inf"))]))


# ------------------------------------------------------------------ normalization


def _batch_norm_graph(training: bool = True, shape: tuple[int, ...] = (16, 32, 32, 64)):
    """Conv -> moments-based batch norm (as Keras 3 emits it) -> ReLU -> residual add -> conv."""
    def build():
        x = v1.placeholder(tf.float32, shape, name="x")
        k = tf.constant(np.random.RandomState(0).standard_normal((3, 3, 64, 64)).astype(np.float32) * 0.05)
        gamma = tf.constant(np.ones(64, np.float32), name="gamma")
        beta = tf.constant(np.zeros(64, np.float32), name="beta")
        c = tf.nn.conv2d(x, k, 1, "SAME", name="conv1")
        mean, var = tf.nn.moments(c, axes=[0, 1, 2], keepdims=False, name="moments")
        inv = tf.math.rsqrt(var + 1e-3, name="rsqrt") * gamma
        y = tf.add(c * inv, beta - mean * inv, name="bn_out")
        r = tf.nn.relu(y, name="relu")
        s = tf.add(r, x, name="residual")
        tf.identity(tf.nn.conv2d(s, k, 1, "SAME", name="conv2"), name="out")

    return graph_def(build)


def test_moments_normalization_is_recognized():
    gd = _batch_norm_graph()
    g = import_graph_def(gd, default_registry()).graph
    # Without shapes the statistics' count is unknown, and the normalization counts.
    assert [n.mean for n in find_normalizations(g).norms] == [
        n.mean for n in find_normalizations(g, min_count=10**9).norms]
    g.graph["shapes"] = graph_shapes(gd)
    info = find_normalizations(g)
    assert len(info.norms) == 1
    assert info.norms[0].source == "conv1"
    assert "mul_1" in info.apply and "bn_out" in info.apply  # c * inv, and + offset
    assert "mul" in info.stats  # rsqrt(var + eps) * gamma is a statistic
    assert "moments/mean" in info.stats and "rsqrt" in info.stats


@pytest.fixture
def device_bound_gpus(monkeypatch):
    """The GPU classes without the executor's host time per kernel: the tests that use it
    check the planner's safety rules on graphs far too small for a GPU to be busy, which the
    real classes (rightly) keep float32 without XLA, their step waiting for its host."""
    import dataclasses

    for name, costs in list(DEVICE_COSTS.items()):
        if name.startswith("gpu-"):
            monkeypatch.setitem(DEVICE_COSTS, name, dataclasses.replace(costs, host_per_kernel=0.0))


def test_normalized_activation_runs_low_while_statistics_stay_float32(device_bound_gpus):
    """The optimal planner (its ``[normalization]`` table, ``apply = "low"``): TensorFlow's
    own lists keep the block float32."""
    gd = _batch_norm_graph()
    tf_rules = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="tensorflow", use_env=False)
    # The optimal planner converts the apply ops where that pays: under XLA, where their bytes
    # halve (without it a GPU's element-wise kernels gain nothing in float16).
    ours = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="optimal", use_env=False, compiled=True)
    t_nodes, o_nodes = tf_rules.report["nodes"], ours.report["nodes"]
    # TensorFlow's rules: the deny-listed Mean poisons the apply ops, the ReLU and the add.
    for name in ("bn_out", "relu", "residual"):
        assert t_nodes[name]["dtype"] == "float32", name
        assert o_nodes[name]["dtype"] == "float16", name
    for name in ("moments/mean", "moments/variance", "rsqrt"):
        assert o_nodes[name]["dtype"] == "float32", name
    assert "normalization-aware" in o_nodes["bn_out"]["reason"]
    assert "bn_out" in ours.report["normalized"] and not tf_rules.report.get("normalized")
    casts = lambda r: r.report["casts_to_low"] + r.report["casts_to_high"]  # noqa: E731
    assert casts(ours) < casts(tf_rules)
    # And it computes the same thing.
    x = np.random.RandomState(1).standard_normal((16, 32, 32, 64)).astype(np.float32)
    (ref,) = run(gd, {"x:0": x}, ["out:0"])
    (got,) = run(ours.graph_def, {"x:0": x}, ["out:0"])
    assert np.max(np.abs(got - ref)) / np.max(np.abs(ref)) < 2e-2


def test_default_profile_fences_a_normalization_as_keras_does():
    """The default profile in float16 (``apply = "fenced"``): the batch norm -- statistics
    and the ops applying them -- stays float32, as Keras 3's ``mixed_float16`` computes a norm
    layer, but deny stops at its output, so the ReLU and the residual add between it and the
    next convolution run in float16 (TensorFlow's rules keep them float32).  In bfloat16 it
    does the same on a GPU and keeps TensorFlow's rule on a CPU."""
    gd = _batch_norm_graph()
    tf_rules = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="tensorflow", use_env=False)
    ours = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", use_env=False)
    t_nodes, o_nodes = tf_rules.report["nodes"], ours.report["nodes"]
    # TensorFlow's pass 4 converts ``c * inv`` after the convolution; the fence keeps it float32.
    assert t_nodes["mul_1"]["dtype"] == "float16"
    for name in ("mul_1", "bn_out", "moments/mean", "moments/variance", "rsqrt"):
        assert o_nodes[name]["dtype"] == "float32", name
    assert "fenced, it runs in float32" in o_nodes["mul_1"]["reason"]
    for name in ("relu", "residual"):
        assert t_nodes[name]["dtype"] == "float32", name
        assert o_nodes[name]["dtype"] == "float16", name
        assert "from a normalization's output, cast to float16" in o_nodes[name]["reason"], name
    assert set(ours.report["normalized"]) == {"mul_1", "bn_out"}
    assert ours.report["casts_to_low"] + ours.report["casts_to_high"] < (
        tf_rules.report["casts_to_low"] + tf_rules.report["casts_to_high"])
    x = np.random.RandomState(1).standard_normal((16, 32, 32, 64)).astype(np.float32)
    (ref,) = run(gd, {"x:0": x}, ["out:0"])
    (got,) = run(ours.graph_def, {"x:0": x}, ["out:0"])
    err = np.max(np.abs(got - ref)) / np.max(np.abs(ref))
    assert 0 < err < 2e-2
    bf16_gpu = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", precision="bfloat16", use_env=False)
    assert bf16_gpu.report["nodes"]["relu"]["dtype"] == "bfloat16"
    assert set(bf16_gpu.report["normalized"]) == {"mul_1", "bn_out"}
    bf16_cpu = amp_rewrite.rewrite_graph_def(gd, target="cpu", precision="bfloat16", use_env=False)
    assert bf16_cpu.report["nodes"]["relu"]["dtype"] == "float32" and not bf16_cpu.report.get("normalized")
    assert bf16_cpu.report["converted_nodes"] > 0


def test_fence_is_left_out_for_few_values_and_upstream_of_a_fragile_normalization():
    """The default profile counts a normalization's values from static shapes, which the
    greedy passes otherwise never infer: a batch norm over two values per channel is not
    fenced (it keeps TensorFlow's painting), and neither is one whose output feeds a fragile
    normalization, whose sign flips with any rounding upstream."""
    few = amp_rewrite.rewrite_graph_def(_batch_norm_graph(shape=(2, 1, 1, 64)), target="gpu:8.0", use_env=False)
    assert not few.report.get("normalized")
    assert few.report["nodes"]["relu"]["dtype"] == "float32"

    def build():
        x = v1.placeholder(tf.float32, (2, 16, 16, 64), name="x")
        k = tf.constant(np.random.RandomState(0).standard_normal((3, 3, 64, 64)).astype(np.float32) * 0.05)
        c = tf.nn.conv2d(x, k, 1, "SAME", name="conv0")
        mean, var = tf.nn.moments(c, axes=[0, 1, 2], name="bn0")  # 512 values
        inv = tf.math.rsqrt(var + 1e-3)
        r = tf.nn.relu(tf.add(c * inv, tf.zeros(64) - mean * inv), name="relu0")
        c1 = tf.nn.conv2d(tf.add(r, x, name="residual"), k, 1, "SAME", name="conv1")
        if fragile_tail:
            p = tf.nn.avg_pool2d(c1, 16, 16, "VALID", name="pool")
            m1, v1_ = tf.nn.moments(p, axes=[0, 1, 2], name="bn1")  # 2 values: fragile
            c1 = tf.nn.conv2d(tf.nn.relu((p - m1) * tf.math.rsqrt(v1_ + 1e-3)), k, 1, "SAME")
        tf.identity(c1, name="out")

    for fragile_tail in (False, True):
        gd = graph_def(build)
        ours = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", use_env=False).report
        tf_rules = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="tensorflow", use_env=False).report
        assert tf_rules["nodes"]["relu0"]["dtype"] == "float32"
        assert ours["nodes"]["relu0"]["dtype"] == ("float32" if fragile_tail else "float16")
        assert bool(ours.get("normalized")) is not fragile_tail
        if fragile_tail:  # TensorFlow's painting throughout
            assert {n: d["dtype"] for n, d in ours["nodes"].items()} == {
                n: d["dtype"] for n, d in tf_rules["nodes"].items()}


def test_a_batch_norm_over_a_few_values_keeps_its_apply_float32():
    """Batch 2 on a 1x1 feature map: each statistic averages two values, so ``x * scale +
    offset`` cancels numbers far larger than its result; it stays float32 (as TensorFlow
    keeps it), while the same block at batch 16 on 32x32 maps runs in low precision."""
    few = _batch_norm_graph(shape=(2, 1, 1, 64))
    g = import_graph_def(few, default_registry()).graph
    g.graph["shapes"] = graph_shapes(few)
    assert find_normalizations(g).norms == ()
    assert len(find_normalizations(g, min_count=2).norms) == 1
    for gd, low in ((few, False), (_batch_norm_graph(), True)):
        report = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="optimal", use_env=False).report
        assert ("bn_out" in report.get("normalized", {})) is low
        if not low:
            assert report["nodes"]["bn_out"]["dtype"] == "float32"
            assert report["nodes"]["relu"]["dtype"] == "float32"


def _fragile_graph(batch: int):
    """Conv on 16x16 maps -> pooled to 1x1 -> moments batch norm -> ReLU -> conv: the
    statistics reduce ``batch`` values.  A control dependency hangs off the output."""
    def build():
        x = v1.placeholder(tf.float32, (batch, 16, 16, 64), name="x")
        rs = np.random.RandomState(0)
        k = tf.constant(rs.standard_normal((3, 3, 64, 64)).astype(np.float32) * 0.05)
        k1 = tf.constant(rs.standard_normal((1, 1, 64, 64)).astype(np.float32) * 0.05)
        c = tf.nn.conv2d(x, k, 1, "SAME", name="conv0")
        p = tf.nn.avg_pool2d(c, 16, 16, "VALID", name="pool")
        mean, var = tf.nn.moments(p, axes=[0, 1, 2], keepdims=False, name="moments")
        y = tf.multiply(p - mean, tf.math.rsqrt(var + 1e-3), name="normed")
        r = tf.nn.relu(y, name="relu")
        with tf.control_dependencies([tf.no_op(name="side")]):
            tf.identity(tf.nn.conv2d(r, k1, 1, "SAME", name="conv1"), name="out")

    return graph_def(build)


def test_upstream_of_a_fragile_normalization_follows_data_edges_only():
    for batch, fragile in ((1, False), (2, True), (3, True), (4, False)):
        gd = _fragile_graph(batch)
        g = import_graph_def(gd, default_registry()).graph
        g.graph["shapes"] = graph_shapes(gd)
        info = find_normalizations(g)
        assert [count for _, count in info.small] == [batch], batch
        up = upstream_of_fragile(g, info)
        if not fragile:
            assert up == {}, batch
            continue
        assert {"pool", "conv0", "x"} <= set(up), batch
        assert {norm.mean for norm, _ in up.values()} == {"moments/mean"}
        assert not {"side", "relu", "conv1", "normed", "out"} & set(up), batch


def test_nothing_upstream_of_a_fragile_normalization_runs_in_low_precision(device_bound_gpus):
    """Batch 2 on a 1x1 map: the normalization outputs the sign of two values' difference,
    so the optimal planner keeps what feeds it float32 (the greedy passes and TensorFlow's
    rewrite convert the convolution); at batch 4 the same convolution converts.  Planned for
    gpu:7.0, where float16 is ~8x FP32, so the small convolution pays wherever it is safe."""
    two = amp_rewrite.rewrite_graph_def(_fragile_graph(2), target="gpu:7.0", lists="optimal", use_env=False)
    node = two.report["nodes"]["conv0"]
    assert node["dtype"] == "float32"
    assert "upstream of normalization 'moments/mean'" in node["reason"], node["reason"]
    assert "only 2 values" in node["reason"]
    placement = two.report["placement"]
    assert placement["fragile_normalizations"] == 1 and placement["upstream_float32"] >= 1
    greedy = amp_rewrite.rewrite_graph_def(_fragile_graph(2), target="gpu:8.0", use_env=False)
    assert greedy.report["nodes"]["conv0"]["dtype"] == "float16"
    four = amp_rewrite.rewrite_graph_def(_fragile_graph(4), target="gpu:7.0", lists="optimal", use_env=False)
    assert four.report["nodes"]["conv0"]["dtype"] == "float16"
    assert four.report["placement"]["fragile_normalizations"] == 0
    # min-casts converts what TensorFlow converts.
    mc = amp_rewrite.rewrite_graph_def(_fragile_graph(2), target="gpu:8.0", lists="optimal",
                                       planner="min-casts", use_env=False)
    assert mc.report["nodes"]["conv0"]["dtype"] == "float16"


def _pool_graph(shape: tuple[int, ...], moments: bool):
    """Conv -> [moments batch norm ->] ReLU -> global average pool (a Mean) -> MatMul."""
    def build():
        x = v1.placeholder(tf.float32, shape, name="x")
        rs = np.random.RandomState(0)
        k = tf.constant(rs.standard_normal((3, 3, 64, 64)).astype(np.float32) * 0.05)
        w = tf.constant(rs.standard_normal((64, 64)).astype(np.float32) * 0.05)
        c = tf.nn.conv2d(x, k, 1, "SAME", name="conv1")
        if moments:
            mean, var = tf.nn.moments(c, axes=[0, 1, 2], keepdims=False, name="moments")
            c = (c - mean) * tf.math.rsqrt(var + 1e-3, name="rsqrt")
        pooled = tf.reduce_mean(tf.nn.relu(c, name="relu"), axis=[1, 2], name="pool")
        tf.identity(tf.matmul(pooled, w, name="head"), name="out")

    return graph_def(build)


def test_bfloat16_mean_is_inferred_by_the_optimal_lists():
    """TensorFlow's bfloat16 Mean kernels sum in float32 and round once, so the optimal
    profile infers Mean in bfloat16 as TensorFlow's lists do: a global average pool between
    two allow-list ops converts.  The default profile keeps it float32, and so does float16."""
    gd = _pool_graph((16, 16, 16, 64), moments=False)

    def pool(**kw):
        report = amp_rewrite.rewrite_graph_def(gd, target="cpu", use_env=False, **kw).report
        return report["nodes"]["pool"]["dtype"]

    assert pool(precision="bfloat16", lists="optimal", planner="greedy") == "bfloat16"
    assert pool(precision="bfloat16", lists="tensorflow") == "bfloat16"
    assert pool(precision="bfloat16") == "float32"
    assert pool(precision="float16", lists="optimal", planner="greedy") == "float32"
    res = amp_rewrite.rewrite_graph_def(gd, target="cpu", precision="bfloat16", lists="optimal",
                                        planner="greedy", use_env=False)
    x = np.random.RandomState(1).standard_normal((16, 16, 16, 64)).astype(np.float32)
    (ref,) = run(gd, {"x:0": x}, ["out:0"])
    (got,) = run(res.graph_def, {"x:0": x}, ["out:0"])
    assert np.max(np.abs(got - ref)) / np.max(np.abs(ref)) < 5e-2


@pytest.mark.parametrize("shape", [(16, 16, 16, 64), (2, 1, 1, 64)])
@pytest.mark.parametrize("planner", ["greedy", "optimal"])
def test_moments_stay_float32_where_the_lists_infer_mean(shape, planner):
    """A normalization's moments stay float32 under the optimal lists, which infer Mean in
    bfloat16 -- also those of a normalization over too few values, which the planner otherwise
    leaves alone; TensorFlow's profile (parity) converts them, as TensorFlow does."""
    gd = _pool_graph(shape, moments=True)
    nodes = amp_rewrite.rewrite_graph_def(gd, target="cpu", precision="bfloat16", lists="optimal",
                                          planner=planner, use_env=False).report["nodes"]
    assert nodes["moments/mean"]["dtype"] == nodes["moments/variance"]["dtype"] == "float32"
    assert nodes["moments/mean"]["color"] == "deny"
    assert "moment statistic" in nodes["moments/mean"]["reason"], nodes["moments/mean"]["reason"]
    tf_nodes = amp_rewrite.rewrite_graph_def(gd, target="cpu", precision="bfloat16", lists="tensorflow",
                                             use_env=False).report["nodes"]
    assert tf_nodes["moments/mean"]["dtype"] == "bfloat16"


def test_normalization_does_not_unblock_a_deny_on_the_data_path():
    def build():
        x = v1.placeholder(tf.float32, (8, 64), name="x")
        w = tf.constant(np.ones((64, 64), np.float32) * 0.01)
        e = tf.exp(tf.matmul(x, w), name="exp")  # deny: its output may overflow float16
        mean, var = tf.nn.moments(e, axes=[1], keepdims=True)
        y = tf.multiply(e - mean, tf.math.rsqrt(var + 1e-3), name="normed")
        tf.identity(tf.matmul(y, w, name="mm2"), name="out")

    optimal = amp_rewrite.rewrite_graph_def(graph_def(build), target="gpu:8.0", lists="optimal",
                                            use_env=False)
    nodes = optimal.report["nodes"]
    assert nodes["exp"]["dtype"] == "float32"
    assert nodes["normed"]["color"] == "deny" and nodes["normed"]["dtype"] == "float32"
    # The default profile's fence keeps the norm float32 whatever fed it, and the Exp too; past
    # the norm's output deny stops, since that output is bounded whatever fed it.
    fenced = amp_rewrite.rewrite_graph_def(graph_def(build), target="gpu:8.0", use_env=False).report
    assert fenced["nodes"]["exp"]["dtype"] == "float32" and fenced["nodes"]["normed"]["dtype"] == "float32"
    assert "normed" in fenced["normalized"] and fenced["nodes"]["mm2"]["dtype"] == "float16"


# ------------------------------------------------------------------ properties of the planner


def test_optimal_rewrite_is_deterministic_and_idempotent():
    from amp_rewrite.testing import check_deterministic, check_idempotent

    gd = _batch_norm_graph()
    res = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="optimal", use_env=False)
    check_deterministic(gd, res.graph_def, res.report, hash_seeds=(0, 7), target="gpu:8.0",
                        lists="optimal", use_env=False)
    check_idempotent(gd, res.graph_def, res.report, target="gpu:8.0", lists="optimal", use_env=False)


def test_optimal_profile_from_the_command_line(tmp_path):
    from amp_rewrite.cli import main

    src = tmp_path / "g.pb"
    src.write_bytes(_batch_norm_graph().SerializeToString())
    out = tmp_path / "o.pb"
    report = tmp_path / "r.json"
    assert main(["rewrite", str(src), str(out), "--target", "gpu:8.0", "--lists", "optimal",
                 "--report", str(report), "-q"]) == 0
    import json

    data = json.loads(report.read_text())
    (graph,) = data["graphs"]
    assert data["lists"] == "optimal" and "placement" in graph and graph["normalized"]
    assert main(["rewrite", str(src), str(tmp_path / "g2.pb"), "--target", "gpu:8.0", "--lists",
                 "optimal", "--planner", "greedy", "--report", str(tmp_path / "r2.json"), "-q"]) == 0
    assert "placement" not in json.loads((tmp_path / "r2.json").read_text())["graphs"][0]


@settings(max_examples=60, deadline=None)
@given(graphs_with_options(lists=("tensorflow", "default"), planners=("min-casts",),
                           devices=MULTI_DEVICES, while_loops=True, functions=True))
def test_min_casts_planner_is_optimal_and_beats_greedy_on_drawn_graphs(drawn):
    case, options = drawn
    res = amp_rewrite.rewrite_graph_def(case.graph_def, **options)
    for plan in res.plans.values():
        summary = plan.placement
        if summary is None:
            continue
        assert summary.optimal_us <= summary.greedy_us + 1e-9
        problem = summary.problem
        if sum(1 for f in problem.fixed if f == FREE) <= 12:
            assert objective(problem, summary.solution) == pytest.approx(_brute_force(problem))
    check_allow_deny(case.graph_def, res.graph_def, res.report, **options)


def _variable_batch_norm_step():
    """A tf.function's graph: a VALID 3x3 convolution of a captured variable on a 3x3 map at
    batch 2 (a 1x1 output), batch-normalized by moments.  Its GraphDef keeps the variable
    only as a resource placeholder, so without the variable's shape the map size is unknown."""
    kernel = tf.Variable(np.random.RandomState(0).standard_normal((3, 3, 64, 64)).astype(np.float32) * 0.05)

    @tf.function
    def step(x):
        c = tf.nn.conv2d(x, kernel, 1, "VALID", name="conv")
        mean, var = tf.nn.moments(c, axes=[0, 1, 2], keepdims=False, name="moments")
        inv = tf.math.rsqrt(var + 1e-3, name="rsqrt")
        y = tf.add(c * inv, -mean * inv, name="bn_out")
        return tf.nn.conv2d(tf.nn.relu(y, name="relu"), tf.ones((1, 1, 64, 8)), 1, "VALID", name="head")

    return step.get_concrete_function(tf.TensorSpec((2, 3, 3, 64), tf.float32)), kernel


def test_variable_shapes_size_the_reads_of_captured_variables():
    from amp_rewrite.graph.shapes import check_variable_shapes
    from amp_rewrite.training.tf_function import captured_variable_shapes

    concrete, kernel = _variable_batch_norm_step()
    gd = concrete.graph.as_graph_def()
    known = captured_variable_shapes(concrete.graph)
    assert list(known.values()) == [[3, 3, 64, 64]]
    (handle,) = known
    assert graph_shapes(gd)["conv"] == ((2, None, None, None),)  # TF's import drops the shape
    assert graph_shapes(gd, check_variable_shapes(gd, known))["conv"] == ((2, 1, 1, 64),)
    # The normalization averages 2 values per statistic: with the shape known, its apply
    # stays float32; without, the count is unknown and it runs in low precision.
    fetches = [n.name for n in gd.node if n.op == "Identity"] or None
    blind = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="optimal", use_env=False,
                                          fetches=fetches)
    told = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="optimal", use_env=False,
                                         fetches=fetches, variable_shapes=known)
    assert "bn_out" in blind.report.get("normalized", {})
    assert "bn_out" not in told.report.get("normalized", {})
    assert told.report["nodes"]["bn_out"]["dtype"] == "float32"
    # TensorFlow's greedy passes read no shapes: the same rewrite with or without them.
    greedy = [amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="tensorflow", use_env=False, fetches=fetches,
                                            variable_shapes=vs).graph_def.SerializeToString(deterministic=True)
              for vs in (None, known)]
    assert greedy[0] == greedy[1]
    # The default profile's fence counts the values too: told, it leaves this one out.
    fenced = [amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", use_env=False, fetches=fetches,
                                            variable_shapes=vs).report.get("normalized", {}) for vs in (None, known)]
    assert "bn_out" in fenced[0] and "bn_out" not in fenced[1]


def test_the_tf_function_path_passes_the_captured_variables_shapes():
    from amp_rewrite.training.tf_function import function

    kernel = tf.Variable(np.random.RandomState(0).standard_normal((3, 3, 64, 64)).astype(np.float32) * 0.05)

    def step(x):
        c = tf.nn.conv2d(x, kernel, 1, "VALID", name="conv")
        mean, var = tf.nn.moments(c, axes=[0, 1, 2], keepdims=False, name="moments")
        inv = tf.math.rsqrt(var + 1e-3, name="rsqrt")
        return tf.nn.relu(tf.add(c * inv, -mean * inv, name="bn_out"), name="relu")

    f = function(step, target="gpu:8.0", lists="optimal", use_env=False)
    x = np.random.RandomState(1).standard_normal((2, 3, 3, 64)).astype(np.float32)
    got = f(tf.constant(x)).numpy()
    (result,) = f.rewrite_results
    assert result.report["nodes"]["bn_out"]["dtype"] == "float32"
    assert "bn_out" not in result.report.get("normalized", {})
    np.testing.assert_allclose(got, tf.function(step)(tf.constant(x)).numpy(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("shapes, error, text", [
    ({"nope": [1]}, amp_rewrite.InvalidGraphError, "not a node"),
    ({"conv": [1]}, amp_rewrite.InvalidGraphError, "only resource placeholders"),
    ({"HANDLE": [3, -1]}, amp_rewrite.AmpRewriteError, "non-negative"),
    ({"HANDLE": 7}, amp_rewrite.AmpRewriteError, "sequence of dimensions"),
    ({"HANDLE": ["3"]}, amp_rewrite.AmpRewriteError, "non-negative"),
    ([("HANDLE", [3])], amp_rewrite.AmpRewriteError, "must map"),
])
def test_bad_variable_shapes_are_refused_with_the_products_error(shapes, error, text):
    from amp_rewrite.training.tf_function import captured_variable_shapes

    concrete, _ = _variable_batch_norm_step()
    gd = concrete.graph.as_graph_def()
    before = gd.SerializeToString(deterministic=True)
    (handle,) = captured_variable_shapes(concrete.graph)
    fix = lambda v: v if not isinstance(v, dict) else {handle if k == "HANDLE" else k: x for k, x in v.items()}  # noqa: E731
    shapes = fix(shapes) if isinstance(shapes, dict) else [(handle, s) for _, s in shapes]
    with pytest.raises(error, match=text):
        amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="optimal", use_env=False,
                                      variable_shapes=shapes)
    assert gd.SerializeToString(deterministic=True) == before


def _v1_matmul_loop(n: int) -> tf.compat.v1.GraphDef:
    """A TF1 while loop (control flow v1: Enter/Merge/Switch/NextIteration/Exit) whose float32
    state goes through one n x n MatMul per iteration."""
    from tensorflow.python.ops import control_flow_util

    was_v2 = control_flow_util.ENABLE_CONTROL_FLOW_V2
    tf.compat.v1.disable_control_flow_v2()
    try:
        def build() -> None:
            x = v1.placeholder(tf.float32, [n, n], name="x")
            w = v1.placeholder(tf.float32, [n, n], name="w")
            _, out = v1.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, tf.matmul(v, w)),
                                   [tf.constant(0), x])
            tf.identity(out, name="output")

        return graph_def(build)
    finally:
        if was_v2:
            tf.compat.v1.enable_control_flow_v2()


@pytest.mark.parametrize("n", [4, 512])
@pytest.mark.parametrize("level", ["DEFAULT", "TREAT_INFER_AS_DENY"])
@pytest.mark.parametrize("target, precision", [("gpu:7.0", "float16"), ("cpu", "bfloat16")])
def test_moving_next_iteration_to_deny_never_converts_a_loop_more(n, level, target, precision, device_bound_gpus):
    """Regression (issue 24, found by the deep property run): with NextIteration on the deny
    list, recurrent matching ties the loop's plumbing (Enter/Merge/Switch/NextIteration) into
    a group painted low.  The planner used to fix such a group low because a member is on the
    deny list, and its below-margin revert kept the undecided groups low too, so a larger deny
    list converted *more* (3-6 loop nodes newly in low precision).  Both loop sizes are
    checked: at n=4 nothing pays, at n=512 the MatMul does."""
    from amp_rewrite.testing import check_monotone

    gd = _v1_matmul_loop(n)
    options = dict(lists="optimal", target=target, precision=precision, level=level,
                   fetches=["output"], use_env=False)
    result = amp_rewrite.rewrite_graph_def(gd, **options)
    # The rewrite decided something real: at n=512 the loop's MatMul converts.
    matmuls = [k for k, v in result.report["nodes"].items() if v["op"] == "MatMul"]
    assert matmuls and all(result.report["nodes"][k]["dtype"] == (precision if n == 512 else "float32")
                           for k in matmuls)
    check_monotone(gd, result.graph_def, result.report, ops=["NextIteration"], **options)


def _layer_norm_training_graph() -> tf.compat.v1.GraphDef:
    """A layer norm in a training step: ``h = x @ w1`` (broadcasting), normalized over its 32
    features as Keras 3 normalizes, read by ``n @ w2`` and a residual add, and the gradients of the weights and of
    ``x`` (``tf.gradients``, with a loss scale)."""
    rng = np.random.RandomState(3)

    def build():
        x = v1.placeholder(tf.float32, (8, 16, 32), name="x")
        w1 = tf.constant(rng.standard_normal((32, 32)).astype(np.float32) * 0.2)
        w2 = tf.constant(rng.standard_normal((32, 32)).astype(np.float32) * 0.2)
        gamma = tf.constant(1.0 + 0.1 * rng.standard_normal(32).astype(np.float32))
        h = tf.matmul(x, w1, name="h")
        # As Keras 3's ops.layer_normalization computes it (TensorFlow backend).
        mean, var = tf.nn.moments(h, axes=[2], keepdims=True, name="ln")
        inv = tf.math.rsqrt(var + 1e-3) * gamma
        n = tf.add(h * inv, 0.1 - mean * inv, name="ln_out")
        o = tf.add(tf.matmul(n, w2, name="o_mm"), n, name="block_out")
        loss = tf.reduce_mean(tf.square(o))
        for i, g in enumerate(tf.gradients(loss * 1024.0, [x, w1, w2])):
            tf.identity(g / 1024.0, name=f"grad{i}")

    return graph_def(build)


def test_default_profile_fences_a_normalization_in_the_backward_pass_as_keras_does():
    """In the gradient, Keras's norm layer is float32 too, with its input gradient ``dy``
    arriving in float16 (the gradient of its float16 output) and cast up inside.  The default
    profile paints the sum of the gradients that reach the norm (an ``AddN`` of the two
    readers' gradients) as a fence writer: float16, where TensorFlow's rules keep it float32;
    ``dy * x``, which the norm sums for its statistics' gradient, stays float32."""
    gd = _layer_norm_training_graph()
    ours = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", use_env=False)
    tf_rules = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="tensorflow", use_env=False)
    o_nodes, t_nodes = ours.report["nodes"], tf_rules.report["nodes"]
    dy = [n.name for n in gd.node if n.op == "AddN" and {i.split(":")[0] for i in n.input} & {
        m.name for m in gd.node if m.name.startswith("gradients/o_mm") or m.name.startswith("gradients/block_out")}]
    assert dy, "the gradient of the norm's output is a sum of its readers' gradients"
    for name in dy:
        assert t_nodes[name]["dtype"] == "float32", name
        assert o_nodes[name]["dtype"] == "float16", (name, o_nodes[name])
        assert "to a normalization's input" in o_nodes[name]["reason"], name
    products = [n for n, d in o_nodes.items() if "multiplies the input of normalization" in d["reason"]]
    assert products and all(o_nodes[n]["dtype"] == "float32" for n in products)
    feeds = {"x:0": np.random.RandomState(4).standard_normal((8, 16, 32)).astype(np.float32)}
    fetches = [f"grad{i}:0" for i in range(3)]
    for ref, got in zip(run(gd, feeds, fetches), run(ours.graph_def, feeds, fetches)):
        err = np.max(np.abs(got - ref)) / np.max(np.abs(ref))
        assert 0 < err < 2e-2


def test_bfloat16_on_a_gpu_is_fenced_as_float16_is_and_on_a_cpu_keeps_tensorflows_rule():
    """Keras's ``mixed_bfloat16`` policy fences its norms as ``mixed_float16`` does, and on a
    GPU a bfloat16 element-wise op moves the bytes a float16 one does: the default profile's
    fence (both sides) and its identity rule hold for bfloat16 on a GPU.  On a CPU, where
    bfloat16's element-wise kernels are slower than float32's, it keeps TensorFlow's rule."""
    gd = _layer_norm_training_graph()
    gpu = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", precision="bfloat16", use_env=False)
    cpu = amp_rewrite.rewrite_graph_def(gd, target="cpu", precision="bfloat16", use_env=False)
    g_nodes, c_nodes = gpu.report["nodes"], cpu.report["nodes"]
    assert gpu.report["normalized"] and "normalized" not in cpu.report
    assert gpu.report.get("identity") and "identity" not in cpu.report  # the broadcasting matmul's x gradient
    dy = [n.name for n in gd.node if n.op == "AddN" and {i.split(":")[0] for i in n.input} & {
        m.name for m in gd.node if m.name.startswith("gradients/o_mm") or m.name.startswith("gradients/block_out")}]
    assert dy
    for name in dy:
        assert g_nodes[name]["dtype"] == "bfloat16" and "to a normalization's input" in g_nodes[name]["reason"], name
        assert c_nodes[name]["dtype"] == "float32", (name, c_nodes[name])
    # The norm's output, cast to bfloat16 for its readers on the GPU only.
    assert g_nodes["block_out"]["dtype"] == "bfloat16" and c_nodes["block_out"]["dtype"] == "float32"
    feeds = {"x:0": np.random.RandomState(4).standard_normal((8, 16, 32)).astype(np.float32)}
    fetches = [f"grad{i}:0" for i in range(3)]
    for ref, got in zip(run(gd, feeds, fetches), run(gpu.graph_def, feeds, fetches)):
        err = np.max(np.abs(got - ref)) / np.max(np.abs(ref))
        assert 0 < err < 5e-2


def test_a_batch_norms_input_product_stays_float32_in_its_gradient(monkeypatch):
    """In a batch norm's gradient, ``dy * x`` is summed over the batch and positions into the
    gradient of its scale (``x * inv``): the default profile keeps it float32 with the norm, as
    Keras does, where TensorFlow's pass 4 converts it once ``x`` (a convolution's output) is in
    float16.  ``dy`` itself, the gradient reaching the norm from the ReLU, runs in float16."""
    def build():
        x = v1.placeholder(tf.float32, (8, 16, 16, 32), name="x")
        k = tf.constant(np.random.RandomState(5).standard_normal((3, 3, 32, 32)).astype(np.float32) * 0.05)
        c = tf.nn.conv2d(x, k, 1, "SAME", name="conv1")
        mean, var = tf.nn.moments(c, axes=[0, 1, 2], name="moments")
        inv = tf.math.rsqrt(var + 1e-3) * tf.constant(np.ones(32, np.float32))
        y = tf.add(c * inv, 0.1 - mean * inv, name="bn_out")
        out = tf.nn.conv2d(tf.nn.relu(y, name="relu"), k, 1, "SAME", name="conv2")
        for i, g in enumerate(tf.gradients(tf.reduce_mean(tf.square(out)) * 1024.0, [x, k])):
            tf.identity(g / 1024.0, name=f"grad{i}")

    gd = graph_def(build)
    ours = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", use_env=False).report["nodes"]
    tf_rules = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="tensorflow", use_env=False).report["nodes"]
    products = [n for n, d in ours.items() if "multiplies the input of normalization" in d["reason"]]
    assert products, "dy * x of the scale's gradient is found"
    for name in products:
        assert ours[name]["dtype"] == "float32", name
    assert ours["gradients/relu_grad/ReluGrad"]["dtype"] == "float16"
    assert tf_rules["gradients/relu_grad/ReluGrad"]["dtype"] == "float32"
    # Without the rule, pass 4 converts it: it is fed by the convolution, and dy is float16.
    from amp_rewrite.plan import passes
    monkeypatch.setattr(passes, "_input_products", lambda state, norm, own: [])
    unruled = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", use_env=False).report["nodes"]
    assert all(unruled[name]["dtype"] == "float16" for name in products)
