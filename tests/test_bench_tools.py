"""Unit tests of the calibration tools in bench/ (their pure parts; the timings need a quiet
machine and run by hand, see CONTRIBUTING.md)."""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from graphs import graph_def, v1

import corpus  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

_MODELS, _INPUTS = dict(corpus.MODELS), corpus._inputs
import bench  # noqa: E402
import calibrate_casts  # noqa: E402
import calibrate_in_place  # noqa: E402


def test_importing_the_bench_tools_leaves_the_test_corpus_alone():
    """The benchmark's larger models join the corpus only when a tool's entry point calls
    ``models.register()``; other test files keep their own items."""
    assert corpus.MODELS == _MODELS and corpus._inputs is _INPUTS
    assert "densenet121" not in corpus.MODELS


def test_cast_candidates_are_float32_tensors_of_the_data_path():
    """``ShapeN`` has ``T=float`` but returns int32: a round trip through bfloat16 on it would
    not import.  Constants (folded) and fetched tensors are not candidates either."""
    def build():
        x = v1.placeholder(tf.float32, (2, 8), name="x")
        w = tf.constant(np.ones((8, 8), np.float32), name="w")
        h = tf.nn.relu(tf.matmul(x, w, name="mm"), name="relu")
        shape = tf.raw_ops.ShapeN(input=[h], name="shape_n")[0]
        tf.identity(tf.reshape(tf.multiply(h, 2.0, name="double"), shape, name="reshape"), name="out")

    gd = graph_def(build)
    names = [n for _, n in calibrate_casts._candidates(gd, {"out"})]
    assert "shape_n" not in names and "w" not in names and "out" not in names
    assert {"mm", "relu", "double"} <= set(names)
    wrapped = calibrate_casts.with_round_trips(gd, ["relu"])
    tf.graph_util.import_graph_def(wrapped, name="")  # imports: the types line up
    casts = [n for n in wrapped.node if n.op == "Cast"]
    assert [(c.attr["SrcT"].type, c.attr["DstT"].type) for c in casts] == [
        (tf.float32.as_datatype_enum, tf.bfloat16.as_datatype_enum),
        (tf.bfloat16.as_datatype_enum, tf.float32.as_datatype_enum)]
    assert len(gd.node) + 2 == len(wrapped.node)


def test_a_fused_node_is_charged_to_the_dense_op_at_its_head():
    """The remapper names Conv2D + BiasAdd + Relu after the Relu; the in-place calibration
    charges its time to the convolution, and a node that is no fusion to itself."""
    ops = {"conv": "Conv2D", "bias": "BiasAdd", "relu": "Relu", "x": "Placeholder", "add": "AddV2"}
    first = {"conv": "x", "bias": "conv", "relu": "bias", "add": "x"}
    assert calibrate_in_place._dense_head("relu", ops, first) == "conv"
    assert calibrate_in_place._dense_head("conv", ops, first) == "conv"
    assert calibrate_in_place._dense_head("add", ops, first) is None
    assert calibrate_in_place._FUSED_DENSE.search("_MklNativeFusedConv2D")
    assert not calibrate_in_place._FUSED_DENSE.search("_MklSwish")


def test_in_place_bands_are_the_cost_models_and_frozen_weights_are_recognized():
    """The calibration prints dense ops per the size bands the cost model keeps, and nets
    out the weight re-layout only where the model adds it (weights that are not constant)."""
    from amp_rewrite.plan.cost_model import X86_BF16_DENSE
    from amp_rewrite.graph.tensor_names import parse_graph_input

    for bands in X86_BF16_DENSE.values():
        edges = tuple(b.below_flops for b in bands[:-1])
        assert set(edges) <= set(calibrate_in_place.BAND_EDGES) and list(edges) == sorted(edges)
    assert [calibrate_in_place._band(f) for f in (1e6, 5e6, 1.9e8, 3e8)] == ["<5M", "<20M", "<200M", ">=200M"]

    def build():
        x = v1.placeholder(tf.float32, (2, 8, 8, 4), name="x")
        k = tf.identity(tf.constant(np.ones((1, 1, 4, 4), np.float32)), name="k")
        v = v1.placeholder(tf.float32, (1, 1, 4, 4), name="v")
        tf.nn.conv2d(x, k, 1, "SAME", name="frozen")
        tf.nn.conv2d(x, v, 1, "SAME", name="fed")

    gd = graph_def(build)
    ops = {n.name: n.op for n in gd.node}
    inputs = {n.name: [parse_graph_input(i) for i in n.input if not i.startswith("^")] for n in gd.node}
    assert calibrate_in_place._constant_weights("frozen", "Conv2D", ops, inputs)
    assert not calibrate_in_place._constant_weights("fed", "Conv2D", ops, inputs)
    assert not calibrate_in_place._constant_weights("frozen", "Conv2DBackpropFilter", ops, inputs)


def test_step_timing_spreads_its_rounds_over_fresh_sessions(monkeypatch):
    """A graph's speed follows the session it runs in, so the benchmark's rounds are spread
    over several sets of fresh sessions; every session is closed, and a graph that cannot
    run has no timing rather than a partial one."""
    opened, closed = [], []

    class FakeRunner:
        def __init__(self, graph, item):
            if graph == "broken" and len(opened) > 2:
                raise RuntimeError("no kernel for this op\nmore detail")
            opened.append(graph)
            self.graph = graph

        def step(self):
            return {"slow": 2.0, "fast": 1.0, "broken": 1.5}[self.graph]

        def close(self):
            closed.append(self.graph)

    monkeypatch.setattr(bench, "Runner", FakeRunner)
    med, rounds = bench.interleaved_step_times({"a": "slow", "b": "fast"}, None, repeats=7, iters=2,
                                               sessions=3)
    assert rounds == 7 and med == {"a": 2.0, "b": 1.0}
    assert opened == ["slow", "fast"] * 3 and sorted(closed) == sorted(opened)  # 3 + 3 + 1 rounds

    opened.clear()
    med, rounds = bench.interleaved_step_times({"a": "slow", "c": "broken"}, None, repeats=4, iters=1,
                                               sessions=2)
    assert rounds == 4 and med == {"a": 2.0}  # "broken" ran in the first set only: no timing


def test_resized_registers_an_image_model_at_another_input_size(monkeypatch):
    import models

    monkeypatch.setattr(corpus, "MODELS", dict(corpus.MODELS))
    monkeypatch.setattr(corpus, "_inputs", corpus._inputs)
    name = models.resized("vgg16", 32)
    assert name == "vgg16@32" and f"{name}/training" in corpus.corpus_names()
    model, shape, _ = corpus.MODELS[name][0]()
    assert shape == (32, 32, 3) and tuple(model.input_shape) == (None, 32, 32, 3)
    with pytest.raises(KeyError, match="not one of the resizable image models"):
        models.resized("bert_like", 32)


def test_check_cost_model_prices_a_dump_per_item_and_per_op():
    """``check_cost_model.py`` prices each dumped node with a class and sums measured against
    modelled, per item (and batch) and per op; a dump recorded without shapes is refused."""
    import check_cost_model
    from amp_rewrite.plan.cost_model import DEVICE_COSTS, node_cost

    costs = DEVICE_COSTS["cpu-avx512-bf16"]
    relu = {"item": "m@224/inference", "batch": 8, "op": "Relu", "f32_us": 30.0, "bf16_us": 45.0,
            "in_shapes": [[8, 56, 56, 64]], "out_shapes": [[8, 56, 56, 64]], "constant_weights": None}
    conv = {**relu, "op": "Conv2D", "f32_us": 500.0, "bf16_us": 250.0, "constant_weights": True,
            "in_shapes": [[8, 56, 56, 64], [3, 3, 64, 64]]}
    rows = check_cost_model.priced_rows([relu, conv], costs)
    assert "high_us" not in relu  # the rows are copied
    expected = node_cost("Relu", [(8, 56, 56, 64)], [(8, 56, 56, 64)], 2, costs)
    assert rows[0]["high_us"] == pytest.approx(expected.high / 1e3)
    assert rows[1]["low_us"] < rows[1]["high_us"]
    per_item = check_cost_model.summarize(rows)
    assert list(per_item) == ["m@224/inference b8"]
    assert per_item["m@224/inference b8"]["f32"] == 530.0 and per_item["m@224/inference b8"]["nodes"] == 2
    assert set(check_cost_model.summarize(rows, "op")) == {"Relu", "Conv2D"}
    with pytest.raises(ValueError, match="no shapes"):
        check_cost_model.priced_rows([{k: v for k, v in relu.items() if k != "in_shapes"}], costs)


def test_items_at_other_sizes_and_batches_register_without_building():
    """``model@side/kind`` names register the model at that input size (the corpus' own
    ResNet50 and MobileNetV2 too); ``set_batch`` changes every later build's batch, and
    refuses nonsense.  The test corpus is restored after."""
    import models

    saved_models, saved_inputs, saved_batch = dict(corpus.MODELS), corpus._inputs, corpus.BATCH
    try:
        names = models.resolve_items(["resnet50@224/inference", "mobilenetv2@96/training", "mlp/inference"])
        assert names == ["resnet50@224/inference", "mobilenetv2@96/training", "mlp/inference"]
        assert "resnet50@224" in corpus.MODELS and "mobilenetv2@96" in corpus.MODELS
        assert corpus.MODELS["resnet50@224"][1] is saved_models["resnet50"][1]  # the same optimizer
        with pytest.raises(KeyError, match="resizable"):
            models.resized("mlp", 32)
        models.set_batch(8)
        assert corpus.BATCH == 8
        with pytest.raises(ValueError, match="at least 1"):
            models.set_batch(0)
    finally:
        corpus.MODELS.clear()
        corpus.MODELS.update(saved_models)
        corpus._inputs = saved_inputs
        corpus.BATCH = saved_batch


def test_trained_like_weights_replace_the_zero_biases_deterministically():
    """Keras initializes biases and batch-norm shifts to zero, which Grappler drops (and with
    them the fusion of the activation behind the bias); ``trained_like`` gives them a trained
    model's values, the same for the same seed, and ``set_weights`` picks it for the corpus."""
    import keras
    import models

    def build():
        inp = keras.Input((4,))
        return keras.Model(inp, keras.layers.BatchNormalization()(keras.layers.Dense(3)(inp)))

    a, b = build(), build()
    models.trained_like(a)
    models.trained_like(b)
    values = {v.path.rsplit("/", 1)[-1]: np.asarray(v) for v in a.weights}
    assert np.all(values["bias"] != 0) and np.all(values["beta"] != 0) and np.all(values["moving_mean"] != 0)
    assert np.all((values["gamma"] >= 0.5) & (values["gamma"] <= 1.5))
    assert np.all((values["moving_variance"] >= 0.5) & (values["moving_variance"] <= 1.5))
    replaced = {"bias", "beta", "moving_mean", "gamma", "moving_variance"}
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a.weights, b.weights)
               if x.path.rsplit("/", 1)[-1] in replaced)
    saved = corpus.PREPARE_MODEL
    try:
        models.set_weights("trained")
        assert corpus.PREPARE_MODEL is models.trained_like
        models.set_weights("init")
        assert corpus.PREPARE_MODEL is None
        with pytest.raises(ValueError, match="weights"):
            models.set_weights("pretrained")
    finally:
        corpus.PREPARE_MODEL = saved


def test_sizes_check_tables_measured_against_estimated_ratios():
    import sizes_check

    row = {"item": "resnet50@224/inference", "batch": 8, "rounds": 9, "ms": {"float32": 340.0},
           "measured": {"float32": 1.0, "float32_again": 1.004, "tensorflow": 0.631, "optimal": 0.63},
           "estimated": {"tensorflow": 0.681, "optimal": 0.681}, "optimal_low_nodes": 495, "optimal_casts": 215}
    table = sizes_check.markdown([row])
    assert "| resnet50@224/inference | 8 | 340.0 (0.4%) | 0.631 / 0.681 | 0.630 / 0.681 | 495, 215 | 9 |" in table


def test_model_options_and_kernel_names():
    """The tools share ``--batch``/``--weights`` (``models.add_model_options``); the step
    breakdown charges oneDNN's fused kernels to the op at their head."""
    import argparse

    import models
    import step_breakdown

    ap = argparse.ArgumentParser()
    models.add_model_options(ap, batch=8, weights="trained")
    args = ap.parse_args([])
    assert (args.batch, args.weights) == (8, "trained")
    assert ap.parse_args(["--batch", "4", "--weights", "init"]).batch == 4
    with pytest.raises(SystemExit):
        ap.parse_args(["--weights", "pretrained"])
    assert [step_breakdown.kernel_op(k) for k in ("_MklNativeFusedConv2D", "_MklNativePadWithConv2D", "_MklMatMul",
                                                  "_MklNativeFusedMatMul", "Relu", "_MklSwish")] == [
        "Conv2D", "Conv2D", "MatMul", "MatMul", "Relu", "Sigmoid"]


def test_sizes_check_times_and_prices_one_small_item():
    """End to end on the smallest corpus item (one round in one set of sessions): the float32
    graph, its A/A copy, TensorFlow's bfloat16 rewrite and ours are timed, and both rewrites
    are priced by the cost model against the same float32 estimate."""
    import sizes_check

    row = sizes_check.check_item("mlp/inference", rounds=1, iters=1, sessions=1)
    assert set(row["measured"]) == {"float32", "float32_again", "tensorflow", "optimal"}
    assert row["measured"]["float32"] == 1.0 and all(v > 0 for v in row["ms"].values())
    assert set(row["estimated"]) == {"tensorflow", "optimal"} and all(v > 0 for v in row["estimated"].values())
    assert row["estimated_float32_ms"] > 0 and row["batch"] == corpus.BATCH and row["rounds"] == 1
    assert "| mlp/inference |" in sizes_check.markdown([row])


def test_bench_item_runs_every_variant_of_one_small_item():
    """``bench.py``'s per-graph benchmark end to end on the smallest corpus item, reduced (one
    rewrite repeat, one timing round per process in two fresh processes, two numerics batches,
    one set of sessions): every variant is timed and checked for errors, autotune chooses among
    its candidates, and TensorFlow's bfloat16 rewrite, which converts this MLP's MatMuls, is not
    the float32 graph."""
    res = bench.bench_item("mlp/inference", repeats=2, iters=1, budget_s=0.0, numerics_batches=2, sessions=1,
                           processes=2)
    variants = {"float32", "float32_again", "tf_bf16", "ours_bf16", "ours_opt_bf16", "ours_auto_bf16", "tf_fp16",
                "ours_fp16", "ours_opt_fp16", "force_all_fp16"}
    assert set(res["step_s"]) == variants and all(v > 0 for v in res["step_s"].values())
    # Timed in two child processes, one round each; the pooled median lies within their range.
    assert res["step_processes"] == 2 and res["step_rounds"] == 2 and len(res["step_s_by_process"]) == 2
    for k, v in res["step_s"].items():
        per = [p[k] for p in res["step_s_by_process"]]
        assert min(per) <= v <= max(per)
    assert res["autotune_bf16"]["choice"] in {"float32", "tensorflow", "greedy", "optimal"}
    assert "tf_bf16" not in res["same_as_float32"] and res["quality_bf16"]["tensorflow"]["casts"] > 0
    assert res["numerics_batches"] == 2 and set(res["rel_error"]) >= variants - {"float32", "float32_again"}
    assert res["rel_error"]["tf_bf16"] > 0  # converted: its output moved


def test_ab_cost_classes_plans_with_each_class_and_compares_only_differing_plans():
    """``bench.ab_cost_classes`` plans an item with each version of a class in turn, puts the
    class table back, and runs the A/B (here: numerics only) only where the plans differ."""
    import dataclasses

    from amp_rewrite.plan import cost_model
    from amp_rewrite.plan.targets import Device, Target

    name = "cpu-avx512-bf16"
    costs = cost_model.DEVICE_COSTS[name]
    # A class on which bfloat16 costs almost nothing: the MLP's MatMuls convert.
    cheap = dataclasses.replace(costs, low_flops=costs.f32_flops * 100, misaligned_low_flops=costs.f32_flops * 100,
                                dense={}, low_elementwise=0.1, op_overhead=0.0, cast_in_place=(0.0, 0.0),
                                low_dense_overhead=0.0)
    item = corpus.build("mlp/inference")
    with pytest.MonkeyPatch.context() as mp:
        # This machine's class whatever machine runs the test.
        cpu = Device("CPU", 0, None, frozenset({"avx512_bf16"}))
        mp.setattr(bench, "this_cpu_target", lambda: Target("cpu", (cpu,), description="test: CPU avx512_bf16"))
        same = bench.ab_cost_classes("mlp/inference", item, {"a": costs, "b": costs}, name, timing=False)
        differ = bench.ab_cost_classes("mlp/inference", item, {"as_is": costs, "cheap": cheap}, name,
                                       numerics=True, timing=False)
    assert cost_model.DEVICE_COSTS[name] is costs
    assert same["same_plan"] and "rel_error" not in same and same["a"] == same["b"]
    assert not differ["same_plan"] and differ["cheap"]["low_nodes"] > differ["as_is"]["low_nodes"]
    assert set(differ["rel_error"]) == {"as_is", "cheap"} and differ["rel_error"]["cheap"] > 0
    assert "measured" not in differ


def test_optimal_scaling_times_the_planner_itself():
    """The scaling rows of the optimal planner say how much of the rewrite its placement took
    (the issue-24 goal line is computed from it): a wrapper that no longer sits on the path
    the API calls would report zero."""
    (row,) = bench.scaling([2000], timeout=300, planner="optimal")
    assert "error" not in row, row
    assert 0 < row["planner_s"] < row["total_s"] and row["planner_cpu_s"] > 0
    assert row["nodes"] >= 1000 and row["planner_us_per_node"] > 0


def _conv_row(x, w, y, f32_us, bf16_us, constant=False, op="Conv2D"):
    return {"item": "m/training", "batch": 2, "op": op, "f32_us": f32_us, "bf16_us": bf16_us,
            "in_shapes": [list(x), list(w)], "out_shapes": [list(y)], "constant_weights": constant}


def test_fit_conv_bands_fits_sums_and_gives_small_groups_no_band_of_their_own():
    """``fit_conv_bands.py`` fits a band's scale and ratio as ratios of its group's sums (net
    of the class's fixed re-layout for variable weights); a positions tier with fewer nodes
    than ``min_nodes`` falls back to its range's wide band; ranges not asked for keep the
    class's bands, and ``_FusedConv2D`` shares Conv2D's."""
    import dataclasses
    import fit_conv_bands as F
    from types import MappingProxyType

    from amp_rewrite.plan.cost_model import DEVICE_COSTS, conv_positions, dense_band, node_cost

    costs = DEVICE_COSTS["cpu-avx512-bf16"]
    wide = ((2, 8, 8, 64), (3, 3, 64, 64), (2, 8, 8, 64))  # 128 positions
    skinny = ((2, 2, 2, 512), (1, 1, 512, 2048), (2, 2, 2, 2048))  # 8 positions
    roofline = dataclasses.replace(costs, dense=MappingProxyType({}))
    roof_wide = node_cost("Conv2D", [wide[0], wide[1]], [wide[2]], 2, roofline).high / 1e3
    roof_skinny = node_cost("Conv2D", [skinny[0], skinny[1]], [skinny[2]], 2, roofline).high / 1e3
    assert conv_positions("Conv2D", [wide[0], wide[1]], [wide[2]]) == 128
    rows = [_conv_row(*wide, f32_us=100.0 + i, bf16_us=80.0) for i in range(6)]
    rows += [_conv_row(*skinny, f32_us=200.0, bf16_us=400.0) for _ in range(2)]
    fixed = costs.low_dense_overhead / 1e3

    pooled = F.fit_bands(rows, costs, min_nodes=6, ranges=(2e7,))
    mid = [b for b in pooled["Conv2D"] if b.below_flops == 2e7]
    assert len(mid) == 1 and mid[0].below_positions == math.inf and mid[0].constant_weights is None
    f32 = sum(r["f32_us"] for r in rows)
    assert mid[0].scale == round(f32 / (6 * roof_wide + 2 * roof_skinny), 2)
    assert mid[0].ratio == round((6 * 80.0 + 2 * 400.0 - 8 * fixed) / f32, 2)
    # The other ranges are the class's own.
    assert [b for b in pooled["Conv2D"] if b.below_flops != 2e7] == \
        [b for b in costs.dense["Conv2D"] if b.below_flops != 2e7]
    assert pooled["Conv2DBackpropInput"] == costs.dense["Conv2DBackpropInput"]

    split = F.fit_bands(rows, costs, min_nodes=2, ranges=(2e7,))
    mid = [b for b in split["Conv2D"] if b.below_flops == 2e7]
    assert [b.below_positions for b in mid] == [16, math.inf]
    # A forward skinny tier fitted on variable weights applies to variable weights only.
    assert mid[0].ratio == round((400.0 - fixed) / 200.0, 2) and mid[0].constant_weights is False
    assert mid[1].scale == round(sum(100.0 + i for i in range(6)) / (6 * roof_wide), 2)
    cls = F.refitted(costs, split)
    assert cls.dense["_FusedConv2D"] == cls.dense["Conv2D"] == split["Conv2D"]
    others = lambda dense: {op: b for op, b in dense.items() if op not in F.OPS + ("_FusedConv2D",)}  # noqa: E731
    assert others(cls.dense) == others(costs.dense) and others(costs.dense)
    assert dense_band(cls, "Conv2D", 1e7, 8) == mid[0] and dense_band(cls, "Conv2D", 1e7, 128) == mid[1]
    assert DEVICE_COSTS["cpu-avx512-bf16"] is costs  # the class itself is left alone


def test_fit_conv_bands_splits_constant_from_variable_weights_only_with_enough_of_each():
    """A forward convolution's range gets a band per kind of weights when both kinds have
    ``min_nodes`` nodes (a frozen graph's constant filter is re-laid out once, a variable's
    every step); the constant one is fitted without the fixed re-layout."""
    import fit_conv_bands as F

    from amp_rewrite.plan.cost_model import DEVICE_COSTS, dense_band

    costs = DEVICE_COSTS["cpu-avx512-bf16"]
    wide = ((2, 8, 8, 64), (3, 3, 64, 64), (2, 8, 8, 64))
    rows = [_conv_row(*wide, f32_us=100.0, bf16_us=90.0) for _ in range(3)]
    rows += [_conv_row(*wide, f32_us=100.0, bf16_us=50.0, constant=True) for _ in range(3)]
    one = [b for b in F.fit_bands(rows, costs, min_nodes=4, ranges=(2e7,))["Conv2D"] if b.below_flops == 2e7]
    assert [b.constant_weights for b in one] == [None]
    both = F.fit_bands(rows, costs, min_nodes=3, ranges=(2e7,))["Conv2D"]
    mid = [b for b in both if b.below_flops == 2e7]
    assert [b.constant_weights for b in mid] == [False, True]
    assert mid[1].ratio == 0.5 and mid[0].ratio == round((90.0 - costs.low_dense_overhead / 1e3) / 100.0, 2)
    cls = F.refitted(costs, {"Conv2D": both})
    assert dense_band(cls, "Conv2D", 1e7, 128, constant_weights=True) == mid[1]
    assert dense_band(cls, "Conv2D", 1e7, 128) == mid[0]


def test_estimated_ratios_price_a_rewrite_against_the_float32_graph():
    """``bench.estimated_ratios``: the float32 graph itself is 1.0, and TensorFlow's bfloat16
    rewrite of the MLP, which converts its MatMuls and inserts Casts, is priced differently."""
    from tf_oracle import tf_amp_rewrite

    item = corpus.build("mlp/inference")
    tf_bf16 = tf_amp_rewrite(item.graph_def, list(item.fetches), mode="bf16")
    got = bench.estimated_ratios(item, {"same": item.graph_def, "tf_bf16": tf_bf16})
    assert got["same"] == pytest.approx(1.0)
    assert got["tf_bf16"] is not None and got["tf_bf16"] > 0 and got["tf_bf16"] != pytest.approx(1.0)


def test_report_shows_each_timing_process_and_the_estimates():
    """The report's per-process table gives each process's ratios to its own float32, and the
    estimated-against-measured table the optimal plan's median and largest miss; runs without
    those fields (older results.json) get neither table."""
    import report

    def graph(name, est_opt, processes):
        return {"name": name, "step_s": {"float32": 1.0, "float32_again": 1.02, "tf_bf16": 0.8, "ours_bf16": 0.9,
                                         "ours_opt_bf16": 0.7},
                "step_s_by_process": processes,
                "estimated_bf16": {"tf_bf16": 0.85, "ours_bf16": 0.9, "ours_opt_bf16": est_opt}}

    procs = [{"float32": 2.0, "float32_again": 2.2, "ours_opt_bf16": 1.0},
             {"float32": 1.0, "float32_again": 0.9, "ours_opt_bf16": 1.1}]
    graphs = [graph("a", 0.77, procs), graph("b", 0.63, procs)]
    per_process = "\n".join(report._by_process_lines(graphs))
    assert "| a | 1.10 / 0.90 | - / - | - / - | 0.50 / 1.10 | - / - |" in per_process
    estimated = "\n".join(report._estimated_lines(graphs))
    assert "| a | 2.0% | 0.800 / 0.850 | 0.900 / 0.900 | 0.700 / 0.770 |" in estimated
    assert "off by 10.0% of the measured ratio in the median over 2 graphs" in estimated
    assert "at most +10.0% (a)." in estimated
    old = [{"name": "a", "step_s": {"float32": 1.0}}]
    assert report._by_process_lines(old) == [] and report._estimated_lines(old) == []


def test_ab_plans_times_in_fresh_processes_and_gives_each_process_ratios():
    """``bench.ab_plans`` times float32, the plans and the A/A control in child processes (two
    here, one round each) and reports the pooled ratios to float32 and each process's own."""
    from tf_oracle import tf_amp_rewrite

    item = corpus.build("mlp/inference")
    plan = tf_amp_rewrite(item.graph_def, list(item.fetches), mode="bf16")
    out = bench.ab_plans(item, {"tf_bf16": plan}, repeats=2, iters=1, processes=2)
    assert set(out["measured"]) == {"float32", "tf_bf16", "float32_again"} and out["measured"]["float32"] == 1.0
    assert out["rounds"] == 2 and len(out["measured_by_process"]) == 2
    assert all(p["float32"] == 1.0 and p["tf_bf16"] > 0 for p in out["measured_by_process"])


def test_redo_numerics_replaces_a_columns_casts_and_errors_and_drops_its_step_times():
    """``bench.redo_item`` makes the default profile's float16 rewrite of a corpus graph again
    (Casts, errors per batch, whether it is the float32 graph); ``apply_redone`` puts it into a
    run's graph, whose timed column then goes (the graph timed was the old plan)."""
    item = corpus.build("transformer/inference")
    redone = bench.redo_item("transformer/inference", ["ours_fp16"], 2)["ours_fp16"]
    assert redone["quality"]["casts"] > 0 and not redone["same_as_float32"]
    assert len(redone["every"]) == 2 and all(e is not None and 0 < e < 1e-2 for e in redone["every"])
    assert redone["loss"] is None  # inference: no loss column
    g = {"name": item.name, "quality_fp16": {"ours_default": {"casts": -1}},
         "step_s": {"float32": 1.0, "ours_fp16": 2.0}, "speedup_vs_fp32": {"ours_fp16": 0.5},
         "step_s_by_process": [{"float32": 1.0, "ours_fp16": 2.0}], "same_as_float32": ["ours_fp16", "x"],
         "rel_error_batches": {"ours_fp16": [9.0]}, "rel_error": {"ours_fp16": 9.0}}
    bench.apply_redone(g, "ours_fp16", redone)
    assert g["quality_fp16"]["ours_default"] == redone["quality"]
    assert "ours_fp16" not in g["step_s"] and "ours_fp16" not in g["speedup_vs_fp32"]
    assert g["step_s_by_process"] == [{"float32": 1.0}] and g["same_as_float32"] == ["x"]
    assert g["rel_error_batches"]["ours_fp16"] == redone["every"]
    assert g["rel_error"]["ours_fp16"] == pytest.approx(float(np.median(redone["every"])))
    assert g["nonfinite_batches"]["ours_fp16"] == 0


def test_the_loop_hoist_bench_runs_in_its_reduced_form(tmp_path):
    """bench/loop_hoist.py --small: every variant runs, the hoisted and unhoisted decoders
    compute bitwise the same tokens, the hoisted graphs keep fewer Casts in their loops, and
    the tables are written."""
    import loop_hoist

    results = loop_hoist.run(rounds=1, calls=1, small=True)
    assert set(results) == {"lstm-train", "decode-b1", "decode-b8"}
    for name, r in results.items():
        assert set(r["ms"]) == set(loop_hoist.VARIANTS)
        left = r["casts_left_in_forward_bodies"]
        assert r["casts_hoisted"] > 0 and left["hoisted"] < left["unhoisted"], name
        if name.startswith("decode"):
            assert r["decoded_tokens_bitwise_equal"] is True
    loop_hoist.write(results, str(tmp_path), type("Args", (), {"rounds": 1, "calls": 1})())
    assert "hoisted/unhoisted" in (tmp_path / "results.md").read_text()
