"""The GPU classes' per-op tables without XLA, fitted to kernels measured node by node in
training steps on an H200 (``bench/gpu_runs/2026-11-28c-h200/``, ``bench/calibrate_gpu_in_place.py
--fit``), and what they leave alone: XLA's compiled pricing, and Conv2D (its measured ratio
spanned two layouts); and the host round trips of ops without a GPU kernel for their types."""

from __future__ import annotations

import math

import pytest

from amp_rewrite.plan.cost_model import (DEVICE_COSTS, GPU_CAST_TRAFFIC, GPU_KERNEL_OVERHEAD, GPU_LOW_ELEMENTWISE,
                                         cast_cost, compiled_compute_factor, node_cost)

HOPPER = DEVICE_COSTS["gpu-hopper"]
STRICT = DEVICE_COSTS["gpu-hopper-fp32"]
CPU = DEVICE_COSTS["cpu-avx512-bf16"]
ACT = (64, 56, 56, 144)  # a MobileNetV2 block's expanded activation, batch 64
N = math.prod(ACT)


def _memory_bound(elems: int, costs=HOPPER) -> float:
    return elems * 4 / costs.bandwidth


def test_unfused_batch_norm_kernels_cost_what_the_h200_measured():
    """Keras's unfused batch norm: its per-channel reductions and their gradient's Tile cost
    several times their bytes (Eigen's kernels), a broadcasting Sub more than a streaming op,
    and a Relu its bytes; unmeasured ops keep the memory-bound time and the generic ratio."""
    mean = node_cost("Mean", [ACT, (3,)], [(144,)], 2, HOPPER)
    assert mean.high == pytest.approx(_memory_bound(N + 3 + 144) * HOPPER.elementwise["Mean"][0])
    # Its float32 time was measured, not its float16 one (the rewrite keeps norms float32):
    # the generic ratio, and no gain the planner counts.
    assert mean.high > 5 * _memory_bound(N) and not mean.measured
    assert mean.low / mean.high == pytest.approx(GPU_LOW_ELEMENTWISE)
    relu = node_cost("Relu", [ACT], [ACT], 2, HOPPER)
    assert relu.high == pytest.approx(_memory_bound(2 * N) * HOPPER.elementwise["Relu"][0])
    assert relu.low / relu.high == pytest.approx(0.46) and relu.measured
    sub = node_cost("Sub", [ACT, (144,)], [ACT], 2, HOPPER)
    assert sub.high > 2 * relu.high  # the same bytes, broadcast
    other = node_cost("Maximum", [ACT, ACT], [ACT], 2, HOPPER)
    assert not other.measured and other.high == pytest.approx(_memory_bound(3 * N))
    assert other.low / other.high == pytest.approx(GPU_LOW_ELEMENTWISE) and GPU_LOW_ELEMENTWISE < 1.0


def test_depthwise_convolutions_take_their_measured_bands_and_conv2d_keeps_the_rates():
    """TensorFlow's own float32 depthwise kernels are several times their roofline and cuDNN's
    float16 ones a fraction of that (the TF32-off class takes the same band over its own
    roofline); Conv2D, whose measured ratio spanned two layouts, keeps the class's rates on
    every GPU class."""
    x, w = (64, 56, 56, 144), (3, 3, 144, 1)
    for costs in (HOPPER, STRICT):
        dw = node_cost("DepthwiseConv2dNativeBackpropFilter", [x, (4,), x], [w], 2, costs)
        bare = node_cost("DepthwiseConv2dNativeBackpropFilter", [x, (4,), x], [w], 2, _without_tables(costs))
        assert dw.high == pytest.approx(bare.high * 9.27) and dw.low / dw.high == pytest.approx(0.18)
        shapes = ([(64, 56, 56, 64), (1, 1, 64, 256)], [(64, 56, 56, 256)])
        assert node_cost("Conv2D", *shapes, 2, costs) == node_cost("Conv2D", *shapes, 2, _without_tables(costs))


def test_xla_pricing_ignores_the_tables_of_tensorflows_own_gpu_kernels():
    """Under XLA a GPU runs XLA's kernels: no reduction factor, no depthwise band; a CPU's
    compute factors are its ops' arithmetic and stay."""
    fused = node_cost("Mean", [ACT, (3,)], [(144,)], 2, HOPPER, compiled=True)
    assert fused.high == pytest.approx(144 * 4 / HOPPER.bandwidth)
    assert compiled_compute_factor(HOPPER, "Mean") == 1.0
    assert compiled_compute_factor(CPU, "Erfc") == CPU.elementwise["Erfc"][0] > 1.0
    x, w = (64, 56, 56, 144), (3, 3, 144, 1)
    compiled = node_cost("DepthwiseConv2dNative", [x, w], [x], 2, HOPPER, compiled=True)
    assert compiled == node_cost("DepthwiseConv2dNative", [x, w], [x], 2, _without_tables(HOPPER))
    # The whole-step estimate prices a compiled step's convolutions so too.
    import tensorflow as tf

    import amp_rewrite

    g = tf.Graph()
    with g.as_default():
        inp = tf.compat.v1.placeholder(tf.float32, x, name="x")
        tf.identity(tf.nn.depthwise_conv2d(inp, tf.ones(w), [1, 1, 1, 1], "SAME"), name="y")
    step = {c: amp_rewrite.estimate_step_time(g.as_graph_def(), target="gpu:9.0", fetches=["y"], compiled=c)
            for c in (False, True)}
    unfused = node_cost("DepthwiseConv2dNative", [x, w], [x], 2, HOPPER)
    assert step[True].dense_ns == pytest.approx(compiled.high)
    assert step[False].dense_ns == pytest.approx(unfused.high) and unfused.high > 3 * compiled.high


def test_a_gpu_cast_costs_a_kernels_fixed_time_and_the_measured_traffic():
    """A kernel's fixed time plus 2.08 times its bytes' memory-bound time: on the H200 (4.3
    TB/s), 0.0029 ns per element, the line fitted to the 1,187 Casts of our rewrite's
    profiled steps."""
    assert cast_cost(ACT, 2, HOPPER) == pytest.approx(GPU_KERNEL_OVERHEAD
                                                      + N * 6 / HOPPER.bandwidth * GPU_CAST_TRAFFIC)
    h200 = _with_bandwidth(HOPPER, 4300.0)
    per_element = (cast_cost(ACT, 2, h200) - GPU_KERNEL_OVERHEAD) / N
    assert per_element == pytest.approx(0.0029, rel=0.02)
    assert cast_cost(ACT, 2, CPU) == pytest.approx(CPU.cast_in_place[0] + N * CPU.cast_in_place[1])


def _without_tables(costs):
    import dataclasses

    return dataclasses.replace(costs, elementwise={}, dense={}, low_elementwise=1.0, cast_traffic=1.0)


def _with_bandwidth(costs, bandwidth):
    import dataclasses

    return dataclasses.replace(costs, bandwidth=bandwidth)


def test_the_tables_are_the_fit_of_the_committed_h200_profile():
    """Every entry of the GPU tables is what ``bench/calibrate_gpu_in_place.py --fit`` printed
    for the committed profile (``fit_tables.md``): the float32 scale and, where the rewrite
    converted such nodes, the low ratio (else the generic one); the Casts' line too."""
    import pathlib
    import re

    from amp_rewrite.plan.cost_model import GPU_DENSE, GPU_ELEMENTWISE

    text = (pathlib.Path(__file__).parent.parent / "bench/gpu_runs/2026-11-28c-h200/fit_tables.md").read_text()
    fitted, kinds = {}, {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 7 and cells[0] in ("elementwise", "dense"):
            fitted[cells[1]] = (float(cells[4]), None if cells[6] == "n/a" else float(cells[6]))
            kinds[cells[1]] = (cells[0], float(cells[3]))
    # ... and every op that took a millisecond of those steps has its entry (the convolutions
    # but the depthwise ones are left to the rates on purpose: their ratio spans two layouts).
    assert {op for op, (kind, ms) in kinds.items() if kind == "elementwise" and ms >= 1.0} <= set(GPU_ELEMENTWISE)
    assert {op for op, (kind, _) in kinds.items() if kind == "dense" and op.startswith("Depthwise")} == set(GPU_DENSE)
    for op, (scale, ratio) in GPU_ELEMENTWISE.items():
        assert scale == pytest.approx(fitted[op][0], abs=0.005), op
        assert ratio == pytest.approx(fitted[op][1] if fitted[op][1] is not None else GPU_LOW_ELEMENTWISE), op
    for op, (band,) in GPU_DENSE.items():
        assert (band.scale, band.ratio) == pytest.approx(fitted[op], abs=0.005), op
    pooled = float(re.search(r"Every converted element-wise node pooled: low / float32 ([\d.]+)", text).group(1))
    assert GPU_LOW_ELEMENTWISE == pytest.approx(pooled, abs=0.005)
    traffic = float(re.search(r"Casts \(\d+\): [\d.]+ us \+ [\d.]+ ns/element \(([\d.]+)x", text).group(1))
    assert GPU_CAST_TRAFFIC == pytest.approx(traffic, abs=0.005)
    # An op whose low ratio the profile did not measure is priced with the generic one and
    # not taken as measured; every op the fit gives a ratio is.
    from amp_rewrite.plan.cost_model import GPU_GUESSED_LOW

    assert GPU_GUESSED_LOW == {op for op in GPU_ELEMENTWISE if fitted[op][1] is None}
    assert GPU_GUESSED_LOW and not node_cost(next(iter(sorted(GPU_GUESSED_LOW))), [ACT], [ACT], 2, HOPPER).measured


def test_an_op_without_a_gpu_kernel_for_its_type_is_a_round_trip_through_the_host():
    """Keras's finite check of a sparse gradient: a bool ``TensorScatterUpdate`` (no GPU
    kernel for bool) between GPU ops.  The step pays both copies and the host op on top of
    the longer of its host and device times; a float32 one (a GPU kernel) pays nothing, nor
    does the same graph under XLA.  Two such ops in a row are one round trip; the int32
    indices cross no link (a GPU keeps int32 in host memory), nor is an int32-only op a host
    op."""
    import tensorflow as tf

    import amp_rewrite
    from amp_rewrite.graph.op_registry import default_registry
    from amp_rewrite.plan.host_trips import HOST_LINK_BANDWIDTH, HOST_OP_BANDWIDTH, runs_on_host

    def graph(dtype, scatters=1):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [4096, 1024], name="x")
            idx = tf.compat.v1.placeholder(tf.int32, [4096, 1], name="idx")
            flags = tf.math.is_finite(x) if dtype == tf.bool else x * 2.0
            dense = tf.fill([10000, 1024], tf.constant(True) if dtype == tf.bool else tf.constant(1.0))
            for i in range(scatters):
                dense = tf.tensor_scatter_nd_update(dense, idx, flags, name=f"scatter{i}")
            tf.identity(tf.reduce_all(dense) if dtype == tf.bool else tf.reduce_sum(dense), name="y")
            n = tf.compat.v1.placeholder(tf.int32, [4096], name="n")
            tf.identity(tf.reduce_mean(n * 2) + 1, name="count")
        return g.as_graph_def()

    registry = default_registry()
    assert runs_on_host("TensorScatterUpdate", {"T": 10, "Tindices": 3}, registry)
    assert not runs_on_host("TensorScatterUpdate", {"T": 1, "Tindices": 3}, registry)
    assert runs_on_host("Mean", {"T": 3, "Tidx": 3}, registry)  # on the host, but copies nothing
    fetches = ["y", "count"]
    trip = amp_rewrite.estimate_step_time(graph(tf.bool), target="gpu:9.0", fetches=fetches)
    two = amp_rewrite.estimate_step_time(graph(tf.bool, 2), target="gpu:9.0", fetches=fetches)
    none = amp_rewrite.estimate_step_time(graph(tf.float32), target="gpu:9.0", fetches=fetches)
    xla = amp_rewrite.estimate_step_time(graph(tf.bool), target="gpu:9.0", fetches=fetches, compiled=True)
    assert (trip.host_trips, two.host_trips, none.host_trips, xla.host_trips) == (1, 1, 0, 0)
    big, flags = 10000 * 1024, 4096 * 1024  # bool: a byte each
    assert trip.host_trip_ns == pytest.approx((2 * big + flags) / HOST_LINK_BANDWIDTH
                                              + (2 * big + flags) / HOST_OP_BANDWIDTH)
    # The second scatter reads the first's output and the same flags on the host, and writes
    # the output copied back: the flags cross once, and the host reads and writes more.
    assert two.host_trip_ns == pytest.approx((2 * big + flags) / HOST_LINK_BANDWIDTH
                                             + (4 * big + 2 * flags) / HOST_OP_BANDWIDTH)
    assert trip.total_ns == pytest.approx(max(trip.device_ns, trip.host_ns) + trip.host_trip_ns)
    assert trip.total_ns > none.total_ns and trip.as_dict()["host_trips"] == 1
