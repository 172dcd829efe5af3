"""The GPU benchmark (bench/gpu_bench.py) in its CPU smoke mode, so CI keeps it runnable for the
session that gets a GPU: every variant and model runs, times are finite, the A/A control is
there, and our variants really rewrote the Keras train step."""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "bench"))

import gpu_bench  # noqa: E402  (importing it loads no TensorFlow: its models build lazily)


def test_variant_names_map_to_their_settings():
    """Each variant name says what it runs; an unknown one is refused."""
    assert gpu_bench.variant_spec("float32_strict").tf32 is False
    assert gpu_bench.variant_spec("tf_amp").tf_amp is True
    assert gpu_bench.variant_spec("keras_mixed_xla") == gpu_bench.VariantSpec(
        "keras_mixed_xla", policy="mixed", jit_compile=True)
    assert gpu_bench.variant_spec("ours_optimal_xla").lists == "optimal"
    assert gpu_bench.variant_spec("ours_optimal_xla").jit_compile is True
    assert gpu_bench.variant_spec("ours_default").jit_compile is False
    # The optimal planner's own plan (not measured, so priced), and an extra variant on it too.
    assert gpu_bench.variant_spec("ours_optimal").options == {"measure_steps": 0}
    assert gpu_bench.variant_spec("ours_optimal_xla").options == {"measure_steps": 0}
    assert not gpu_bench.variant_spec("ours_optimal").measured and gpu_bench.variant_spec("ours_measured").measured
    gpu_bench.define_extra_variant('opt_exp=ours_optimal:{"remove": {"deny": ["Exp"]}}')
    try:
        assert gpu_bench.variant_spec("opt_exp").options == {"measure_steps": 0, "remove": {"deny": ["Exp"]}}
    finally:
        gpu_bench.EXTRA_VARIANTS.pop("opt_exp")
    assert gpu_bench.variant_spec("ours_autotune_xla") == gpu_bench.VariantSpec(
        "ours_autotune_xla", jit_compile=True, autotune=True)
    assert gpu_bench.variant_spec("ours_autotune").ours and not gpu_bench.variant_spec("ours_autotune").jit_compile
    with pytest.raises(ValueError):
        gpu_bench.variant_spec("ours_magic")
    with pytest.raises(ValueError, match="not one of our built-in"):  # autotune has no rewrite options
        gpu_bench.define_extra_variant('x=ours_autotune:{"lists": "optimal"}')
    with pytest.raises(ValueError, match="by measurement"):  # nothing to price
        gpu_bench.variant_graph_def("small_cnn-infer-b8", "ours_autotune", target="cpu", precision="bfloat16")


def test_placement_estimates_sum_every_planned_graph():
    """The live report's placement estimates are summed over every section the optimal planner
    priced."""
    section = {"placement": {"estimated_us": {"float32": 10.0, "greedy": 8.0, "optimal": 6.0}}}
    report = {**section, "functions": {"f": section, "g": {"nodes": {}}}}
    assert gpu_bench.placement_estimates(report) == {"float32": 20.0, "greedy": 16.0, "optimal": 12.0}
    assert gpu_bench.placement_estimates({"functions": {}}) is None


def test_merge_keeps_each_workload_once(tmp_path):
    """Runs split over device calls merge into one table; a later record of a workload wins."""
    def run(name: str, workloads: list[str], step: float) -> str:
        rec = {"workload": None, "train": True, "batch": 2, "repeats": 1, "steps": 1, "warmup": 0,
               "variants": {}, "failed": {}, "aa_gap": 0.01, "seconds": 1.0}
        data = {"machine": {"date": "d"}, "config": {"precision": "float16", "target": "auto", "repeats": 1,
                                                    "steps": 1, "warmup": 0, "reduced": False},
                "workloads": [{**rec, "workload": w, "seconds": step} for w in workloads],
                "skipped_workloads": ["b"]}
        path = tmp_path / name
        path.write_text(json.dumps(data))
        return str(path)

    merged = gpu_bench.merge([run("1.json", ["a"], 1.0), run("2.json", ["a", "b"], 2.0)])
    assert [r["workload"] for r in merged["workloads"]] == ["a", "b"]
    assert all(r["seconds"] == 2.0 for r in merged["workloads"])
    assert merged["skipped_workloads"] == []
    assert "## a" in gpu_bench.render_markdown(merged)


def test_merge_keeps_a_finished_workload_over_a_later_partial_one(tmp_path):
    """A device call stopped by its time limit leaves a partial record; merged with an earlier
    run that finished the workload, the finished one stays, and a partial record on its own is
    kept and marked as such in the table."""
    def run(name: str, partial: bool, step: float) -> str:
        rec = {"workload": "a", "train": True, "batch": 2, "repeats": 1 if partial else 2, "steps": 1,
               "warmup": 0, "variants": {}, "failed": {}, "aa_gap": None, "seconds": step,
               "partial": partial}
        data = {"machine": {"date": "d"}, "config": {"precision": "float16", "target": "auto", "repeats": 2,
                                                    "steps": 1, "warmup": 0, "reduced": False},
                "workloads": [rec], "skipped_workloads": []}
        path = tmp_path / name
        path.write_text(json.dumps(data))
        return str(path)

    finished, stopped = run("1.json", False, 1.0), run("2.json", True, 2.0)
    assert gpu_bench.merge([finished, stopped])["workloads"][0]["seconds"] == 1.0
    assert gpu_bench.merge([stopped, finished])["workloads"][0]["seconds"] == 1.0
    alone = gpu_bench.merge([stopped])
    assert alone["workloads"][0]["partial"] is True
    assert "**Partial**: the run stopped during this workload, written after 1 of 2 repeats" in \
        gpu_bench.render_markdown(alone)
    assert "Partial" not in gpu_bench.render_markdown(gpu_bench.merge([finished]))


def test_a_workload_hands_over_what_it_measured_after_the_first_steps_and_each_repeat():
    """``run_workload``'s progress records: one once every variant has had its first step (no
    step times yet), one after each repeat but the last, all partial and unpriced; the record
    it returns is whole.  On the GPU a variant's XLA compile takes a minute, and a call's time
    limit stopped a MobileNetV2 workload with nothing written (2026-11-27, second run)."""
    import math as _math

    w = gpu_bench.workload_named("small_cnn-train-b8")
    cfg = gpu_bench.Config(precision="bfloat16", target="cpu", repeats=3, steps=1, warmup=0,
                           predict=True, deadline=_math.inf)
    seen: list[dict] = []
    final = gpu_bench.run_workload(w, ["float32", "ours_default"], cfg, gpu_bench.Switches("bfloat16"),
                                   progress=lambda rec: seen.append(json.loads(json.dumps(rec))))
    assert [r["repeats"] for r in seen] == [0, 1, 2]
    assert all(r["partial"] for r in seen)
    first = seen[0]["variants"]
    assert set(first) == {"float32", "ours_default"}
    assert all(v["first_step_s"] > 0 and v["step_ms_per_repeat"] == [] for v in first.values())
    assert [len(r["variants"]["float32"]["step_ms_per_repeat"]) for r in seen] == [0, 1, 2]
    assert all("predicted_ratio" not in r["variants"]["ours_default"] for r in seen)
    assert seen[0]["variants"]["ours_default"]["rewrite"]["converted_nodes"] > 0
    assert final["partial"] is False and final["repeats"] == 3
    assert final["variants"]["ours_default"]["predicted_ratio"] > 0
    assert len(final["variants"]["float32"]["step_ms_per_repeat"]) == 3


def test_reduced_run_measures_every_variant_and_model(tmp_path):
    """``--reduced`` end to end in a subprocess, as CI and CONTRIBUTING.md run it."""
    out = tmp_path / "GPU_RESULTS.md"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "gpu_bench.py"), "--reduced", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "GPU_RESULTS.json").read_text())
    assert "A/A gap" in out.read_text()
    # Our variants' first step shows the rewrite's share of it, in brackets.
    assert re.search(r"\| ours_default \| [^|]+ \| [^|]+ \| [^|]+ \| [\d.]+ \([\d.]+\) \|", out.read_text())

    names = list(gpu_bench.REDUCED_DEFAULT)
    assert [r["workload"] for r in results["workloads"]] == names
    assert results["machine"]["tensorflow"] and results["machine"]["keras"]
    for rec in results["workloads"]:
        where = rec["workload"]
        assert rec["failed"] == {}, where
        autotuned = {"ours_autotune", "ours_autotune_xla"}  # inference only: listed, not run
        assert set(rec["variants"]) == set(gpu_bench.VARIANTS) - autotuned, where
        assert set(rec["not_applicable"]) == autotuned, where
        assert rec["repeats"] == 2 and rec["partial"] is False
        assert rec["aa_gap"] is not None and math.isfinite(rec["aa_gap"]), where
        for name, v in rec["variants"].items():
            assert math.isfinite(v["step_ms"]) and v["step_ms"] > 0, (where, name)
            assert len(v["step_ms_per_repeat"]) == 2, (where, name)
            assert math.isfinite(v["first_step_s"]) and v["first_step_s"] > 0, (where, name)
            assert v["peak_mem_mib"] is None  # no GPU here: reported as n/a, never invented
            err = v["rel_err_vs_float32_strict"]
            assert err is not None and math.isfinite(err), (where, name)
        assert rec["variants"]["float32_strict"]["rel_err_vs_float32_strict"] == 0.0
        for name, v in rec["variants"].items():
            if not name.startswith("ours_"):
                assert "rewrite" not in v
                continue
            rw = v["rewrite"]
            if "autotune_choice" not in rw:  # a live rewrite: its share of the first step, apart
                assert 0 < rw["rewrite_s"] < v["first_step_s"], (where, name)
            if name == "ours_user":
                # As a user enables it: target and precision "auto" (this machine), and Keras's
                # jit_compile="auto", which Keras resolves to no XLA on a CPU-only machine.
                assert rw["target"].startswith("auto"), (where, rw["target"])
                assert rw["xla_compiled"] == [False], where
                assert rw["converted_nodes"] > 0 or rw["skipped"], where
                continue
            assert rw["target"].startswith("cpu") and rw["precision"] == "bfloat16", (where, name)
            assert rw["total_nodes"] > 0, (where, name)
            assert v["measured_ratio"] is not None and math.isfinite(v["measured_ratio"]), (where, name)
            if name == "ours_measured":
                # Its step is chosen by timing: no one plan to price; what was timed is recorded.
                assert v["predicted_ratio"] is None and "measurement" in v["predicted_source"], where
                for measured in rw["measured_choices"]:
                    assert "planned" in measured["candidates"], (where, measured)
                    # Chosen before the timed repeats: they time the chosen step alone.
                    assert measured["chosen"] in measured["candidates"], (where, measured)
                assert rw["measure_calls"] > 0 and rw["measure_s"] > 0, where
            else:
                assert v["predicted_ratio"] is not None and v["predicted_ratio"] > 0, (where, name)
            assert rw["xla_compiled"] == [name.endswith("_xla")], (where, name)
            if "optimal" in name:
                # The optimal planner may keep a tiny step float32 (estimated gain under its
                # margin): then the report must say so, and its estimates must exist.
                assert rw["converted_nodes"] > 0 or rw["skipped"], (where, name)
                assert rw["placement_estimated_us"] is not None, (where, name)
            elif name == "ours_measured":  # the float32 step may be the one measured fastest
                assert rw["converted_nodes"] > 0 or rw["skipped"], (where, name)
            else:
                assert rw["converted_nodes"] > 0, (where, name)
        # A rewrite changes the arithmetic: TensorFlow's lists convert the dense ops, so the
        # loss moves off float32's (a variant that silently ran float32 would show 0).
        assert rec["variants"]["ours_tensorflow"]["rel_err_vs_float32_strict"] > 0, where
        assert rec["variants"]["keras_mixed"]["rel_err_vs_float32_strict"] > 0, where


def test_reduced_inference_run_autotunes_the_exported_model_with_and_without_xla(tmp_path):
    """``ours_autotune`` / ``ours_autotune_xla`` on an inference workload: the float32 model
    exported, autotuned on this machine (``--xla`` for the second: every graph timed
    compiled, the written model marked), loaded and served beside Keras's own predict step;
    the table says what autotune chose and how it decided."""
    out = tmp_path / "r.md"
    variants = "float32,float32_again,float32_strict,float32_xla,ours_autotune,ours_autotune_xla"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "gpu_bench.py"), "--reduced", "--workloads",
         "small_cnn-infer-b8", "--variants", variants, "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (rec,) = json.loads((tmp_path / "r.json").read_text())["workloads"]
    assert rec["failed"] == {} and rec["not_applicable"] == {}
    for name, xla in (("ours_autotune", False), ("ours_autotune_xla", True)):
        v = rec["variants"][name]
        rw = v["rewrite"]
        assert rw["autotune_choice"] in ("float32", "tensorflow", "greedy", "optimal"), name
        assert rw["autotune_summary"].startswith("autotune over "), name
        assert rw["xla_compiled"] is xla, name
        assert v["measured_ratio_baseline"] == ("float32_xla" if xla else "float32"), name
        assert math.isfinite(v["step_ms"]) and v["step_ms"] > 0, name
        # The served model computes what the Keras model does (float32 kept, or a rewrite's rounding).
        assert v["rel_err_vs_float32_strict"] is not None and v["rel_err_vs_float32_strict"] < 0.1, name
        assert v["predicted_source"].startswith("not priced"), name
    assert "| ours_autotune_xla |" in out.read_text()


def test_xla_dump_summary_counts_what_xla_compiled(tmp_path):
    """``bench/xla_dump_summary.py`` reads XLA's after-optimizations dumps: convolutions and
    matrix products by element type (cuDNN/cuBLAS custom calls, Triton GEMM fusions, plain
    instructions), fusions and converts; our modules are those named ``amp_rewrite_``.  The
    lines are the shapes XLA's GPU dumps have (bench/gpu_runs/2026-11-26-h200)."""
    import xla_dump_summary as xs

    ours = "\n".join([
        "HloModule a_inference_amp_rewrite_one_step_on_data_1__XlaMustCompile_true",
        "ENTRY %main (p: f32[4,4]) -> f16[4,4] {",
        '  %c = (f16[64,56,56,256]{3,2,1,0}, u8[0]{0}) custom-call(f16[64,56,56,256]{3,2,1,0} %a, '
        'f16[3,3,256,256]{3,2,1,0} %b), custom_call_target="__cudnn$convForward"',
        '  %g = f16[128,768]{1,0} custom-call(f16[128,768]{1,0} %x), custom_call_target="__cublas$gemm"',
        '  %t = f16[8,8]{1,0} fusion(f16[8,8]{1,0} %x), kind=kCustom, calls=%f, '
        'backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}',
        "  %l = f32[8,8]{1,0} fusion(f32[8,8]{1,0} %x), kind=kLoop, calls=%g",
        "  %k = (f32[8,8]{1,0}, s32[]) conditional(pred[] %q, (f32[8,8]{1,0}) %t1, (f32[8,8]{1,0}) %t2), "
        "branch_computations={%b1, %b2}",
        "  ROOT %v = f16[4,4]{1,0} convert(f32[4,4]{1,0} %p)",
        "}",
    ])
    theirs = "ENTRY %main {\n  %d = f32[2,2]{1,0} dot(f32[2,2]{1,0} %a, f32[2,2]{1,0} %b)\n}\n"
    (tmp_path / "module_0001.a_inference_amp_rewrite_step_1.sm_9.0a_gpu_after_optimizations.txt").write_text(ours)
    (tmp_path / "module_0002.a_inference_one_step_2.sm_9.0a_gpu_after_optimizations.txt").write_text(theirs)
    (tmp_path / "module_0001.a_inference_amp_rewrite_step_1.before_optimizations.txt").write_text(theirs)
    summary = xs.summarize_dir(str(tmp_path))
    assert [r["amp_rewrite"] for r in summary] == [True, False]  # before-optimization files skipped
    assert summary[0]["counts"] == {"conditional": {"f32": 1}, "conv": {"f16": 1}, "convert": {"f16": 1},
                                    "fusion": {"f32": 1}, "matmul": {"f16": 2}}
    assert summary[1]["counts"] == {"matmul": {"f32": 1}}
    out = tmp_path / "summary.json"
    assert xs.main([str(tmp_path), "--json", str(out)]) == 0
    assert json.loads(out.read_text()) == summary
    assert xs.main([str(tmp_path / "missing")]) == 2  # no dump: said, not an empty success


def test_gpu_predict_prices_every_measured_variant_against_its_float32_here(tmp_path):
    """``bench/gpu_predict.py`` traces each measured variant's step here (no GPU) -- Keras's
    mixed precision as built, TensorFlow's pass, ours rewritten -- prices each whole, and puts
    the ratio to float32 in the same mode next to the measured one; an H200 is priced with its
    measured bandwidth."""
    import gpu_predict

    steps = {"float32": 2.0, "float32_xla": 1.0, "tf_amp": 1.8, "keras_mixed_xla": 0.8, "ours_optimal_xla": 0.9}
    record = {"machine": {"gpus": [{"compute_capability": [9, 0], "device_name": "NVIDIA H200"}]},
              "workloads": [{"workload": "small_cnn-train-b8",
                             "variants": {k: {"step_ms": v} for k, v in steps.items()}}]}
    record["workloads"][0]["variants"]["ours_measured"] = {
        "step_ms": 1.7, "rewrite": {"measured_choices": [{"chosen": "default lists"}]}}
    src = tmp_path / "run.json"
    src.write_text(json.dumps(record))
    out = tmp_path / "predicted.md"
    assert gpu_predict.main([str(src), "--out", str(out)]) == 0
    rows = {line.split(" | ")[2]: line for line in out.read_text().splitlines()[2:]}
    # float32 ones are baselines; a step measure_steps chose is priced as the step it ran
    assert set(rows) == {"tf_amp", "keras_mixed_xla", "ours_optimal_xla", "ours_measured (ran ours_default)"}
    assert "| float32 | 0.900 |" in rows["tf_amp"] and "| float32_xla | 0.800 |" in rows["keras_mixed_xla"]
    # The step itself, measured and estimated: the model's absolute error shows.
    assert rows["tf_amp"].split(" | ")[7] == "1.80" and float(rows["tf_amp"].split(" | ")[8].rstrip(" |")) > 0
    # A step chosen by measure_steps is priced as the step it chose.
    assert gpu_predict.chosen_step("ours_measured", {"rewrite": {"measured_choices": [
        {"candidates": {"planned": 2.1, "default lists": 1.9}, "chosen": "default lists"}]}}) == "ours_default"
    assert gpu_predict.chosen_step("ours_measured", {"rewrite": {"measured_choices": [
        {"chosen": "planned"}, {"chosen": "float32"}]}}) is None  # two signatures, two choices
    assert gpu_predict.chosen_step("ours_autotune", {}) is None
    # A forecast, for a workload not measured yet: predicted only, said so.
    fc = tmp_path / "forecast.md"
    assert gpu_predict.main(["--forecast", "--workloads", "small_cnn-train-b8", "--variants",
                             "keras_mixed_xla,float32_xla", "--out", str(fc)]) == 0
    forecast = fc.read_text().splitlines()[2:]
    assert len(forecast) == 1 and "| keras_mixed_xla | float32_xla | not measured |" in forecast[0]
    assert forecast[0].split(" | ")[7] == "not measured"
    assert forecast[0].split(" | ")[8] == rows["keras_mixed_xla"].split(" | ")[8]
    assert forecast[0].split(" | ")[5] == rows["keras_mixed_xla"].split(" | ")[5]  # same estimate
    # In bfloat16 (Keras's mixed_bfloat16, our bfloat16 rewrite): said so, and priced as such.
    fc_bf16 = tmp_path / "forecast_bf16.md"
    assert gpu_predict.main(["--forecast", "--precision", "bfloat16", "--workloads", "small_cnn-train-b8",
                             "--variants", "ours_default_xla", "--out", str(fc_bf16)]) == 0
    (bf16_row,) = fc_bf16.read_text().splitlines()[2:]
    assert bf16_row.startswith("| forecast (NVIDIA H200, bfloat16) | small_cnn-train-b8 | ours_default_xla |")
    assert float(bf16_row.split(" | ")[5]) > 0
    with pytest.raises(SystemExit):
        gpu_predict.main(["--forecast", "--workloads", "small_cnn-train-b8"])  # which variants?
    costs = gpu_predict.device_costs(record["machine"], "gpu:9.0")
    assert costs.name == "gpu-hopper" and costs.bandwidth == 4_300.0
    assert gpu_predict.device_costs({"gpus": [{"device_name": "NVIDIA A100"}]}, "gpu:8.0") is None
    # The graphs priced are the variants' own: float32's has no low-precision node, Keras's
    # mixed one and our default rewrite convert the convolutions (their dense time drops), and
    # a tiny model's step is dominated by per-kernel time, so both are estimated slower than
    # float32 here -- as small models run on a GPU.  So the optimal planner's whole-step check
    # keeps the graph float32, and the step, which converts nothing, is traced again without
    # loss scaling (as fit runs it): it is priced as Keras's own float32 step.
    import amp_rewrite

    est = {}
    for name in ("float32_xla", "keras_mixed_xla", "ours_default_xla", "ours_optimal_xla"):
        gd, shapes, compiled, fetches = gpu_bench.variant_graph_def("small_cnn-train-b8", name, target="gpu:9.0",
                                                                    precision="float16")
        assert compiled is True
        est[name] = amp_rewrite.estimate_step_time(gd, target="gpu:9.0", compiled=True, variable_shapes=shapes,
                                                   costs=costs, fetches=fetches)
    assert est["float32_xla"].low_nodes == 0 and est["float32_xla"].casts == 0
    for name in ("keras_mixed_xla", "ours_default_xla"):
        assert est[name].low_nodes > 0 and est[name].casts > 0
        assert est[name].dense_ns < est["float32_xla"].dense_ns
        assert est[name].total_ns > est["float32_xla"].total_ns
    assert est["ours_optimal_xla"].low_nodes == 0 and est["ours_optimal_xla"].casts == 0
    assert est["ours_optimal_xla"].dense_ns == pytest.approx(est["float32_xla"].dense_ns)
    assert est["ours_optimal_xla"].total_ns == pytest.approx(est["float32_xla"].total_ns, rel=1e-3)
    for name in ("keras_mixed_xla", "ours_optimal_xla"):
        ratio = float(rows[name].split(" | ")[5])
        assert ratio == pytest.approx(est[name].total_ns / est["float32_xla"].total_ns, abs=1e-3)


def test_predictions_trace_keras_as_on_a_gpu():
    """A prediction of a GPU run prices the GPU's graph: Keras's LSTM traces to cuDNN's fused
    kernel there (here, on a CPU, to a loop of its cell), which opts the model out of XLA, so
    ``jit_compile="auto"`` -- and ``True`` -- come to no XLA; our rewrite converts the cuDNN
    calls (allow-listed for CUDA)."""
    import keras
    import tensorflow as tf

    def ops_of(gd):
        return {n.op for n in gd.node} | {n.op for f in gd.library.function for n in f.node_def}

    for name in ("ours_user", "float32_xla"):
        gd, _, compiled, _ = gpu_bench.variant_graph_def("tiny_lstm-train-b4", name, target="gpu:9.0",
                                                         precision="float16")
        assert compiled is False, name
        assert {"CudnnRNNV3", "CudnnRNNBackpropV3"} <= ops_of(gd), name
        assert not {"While", "StatelessWhile"} & ops_of(gd)
    rnn = [n for n in gd.node if n.op == "CudnnRNNV3"]
    assert rnn and all(n.attr["T"].type == tf.float32.as_datatype_enum for n in rnn)  # float32's graph
    ours = gpu_bench.variant_graph_def("tiny_lstm-train-b4", "ours_user", target="gpu:9.0",
                                       precision="float16").graph_def
    rnn = [n for n in ours.node if n.op == "CudnnRNNV3"]
    assert rnn and all(n.attr["T"].type == tf.float16.as_datatype_enum for n in rnn)
    # Outside the predictions, Keras on this CPU builds the loop, and the check is restored.
    model = gpu_bench.workload_named("tiny_lstm-train-b4").build()
    assert model.get_layer("lstm_0").supports_jit
    keras.backend.clear_session()


def test_gpu_dense_calibration_runs_here_on_tiny_shapes(tmp_path):
    """``bench/calibrate_gpu_dense.py --reduced``: the tiny CNN's training step traced, every
    dense op (forward, both convolution gradients, the classifier's MatMuls) collected with
    its shapes, and each timed in float32 (TF32 on and off) and float16, here on the CPU."""
    import calibrate_gpu_dense as cal

    out = tmp_path / "dense.json"
    assert cal.main(["--reduced", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    ops = {r["op"] for r in data["ops"]}
    assert {"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "MatMul"} <= ops
    assert sum(r["count"] for r in data["ops"]) >= 9  # 2 convolutions x 3 + the classifier's 3 products
    for r in data["ops"]:
        assert all(math.isfinite(r[k]) and r[k] > 0 for k in ("tf32_ms", "fp32_ms", "low_ms", "estimate_ms", "flops"))
    assert {s["op"] for s in data["summary"]} == ops and data["class"] == "gpu-hopper"
    assert data["device"] == "/CPU:0" and data["gpus"] == []  # said, not passed off as a GPU's


def test_gpu_profile_reads_device_busy_time_kernels_and_ops_from_a_trace():
    """``bench/gpu_profile.py`` reads the profiler's ``XSpace``: on each GPU plane the stream
    lines' events (derived lines such as "XLA Ops" repeat them and are skipped); busy time is
    the union of their intervals per step, events are grouped by their ``hlo_op``/``tf_op``
    stat (a reference to a stat name, as the profiler stores them) else the kernel's name."""
    import gpu_profile
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    host = space.planes.add(name="/host:CPU")
    host.lines.add(name="python").events.add(metadata_id=1, offset_ps=0, duration_ps=10**9)
    gpu = space.planes.add(name="/device:GPU:0")
    gpu.stat_metadata[1].name = "hlo_op"
    gpu.stat_metadata[2].name = "fusion.7"  # a string kept once, referenced by events
    gpu.stat_metadata[3].name = "hlo_module"
    gpu.stat_metadata[4].name = "a_inference_step_7"
    gpu.event_metadata[10].name = "loop_fusion_kernel"
    gpu.event_metadata[11].name = "sm90_xmma_gemm"
    stream = gpu.lines.add(name="Stream #7(Compute)", timestamp_ns=1000)
    # Two steps: [0, 2) and [1, 3) us overlap (one busy interval of 3 us); then [5, 6) us.
    ev = stream.events.add(metadata_id=10, offset_ps=0, duration_ps=2_000_000)
    ev.stats.add(metadata_id=1, ref_value=2)
    ev.stats.add(metadata_id=3, ref_value=4)
    stream.events.add(metadata_id=11, offset_ps=1_000_000, duration_ps=2_000_000)
    stream.events.add(metadata_id=11, offset_ps=5_000_000, duration_ps=1_000_000)
    for view in ("XLA Ops", "Framework Ops"):  # derived views (TF 2.21 names the second so)
        derived = gpu.lines.add(name=view, timestamp_ns=1000)
        derived.events.add(metadata_id=10, offset_ps=0, duration_ps=50_000_000)
    s = gpu_profile.summarize_space(space, steps=2)
    assert s["device_busy_ms"] == pytest.approx(4e-3 / 2)  # 3 us + 1 us over two steps, in ms
    assert s["kernels"] == 1.5 and s["first_to_last_ms"] == pytest.approx(6e-3 / 2)
    assert [(o["op"], o["events"]) for o in s["ops"]] == [("sm90_xmma_gemm", 1.0), ("fusion.7", 0.5)]
    assert s["ops"][0]["ms"] == pytest.approx(3e-3 / 2)
    # Every XLA instruction's time, by module: what --times sets against the compiled module.
    assert s["xla_ops"] == {"a_inference_step_7/fusion.7": {"ms": pytest.approx(2e-3 / 2), "events": 0.5}}
    # A CPU run's trace has no GPU plane: no device figures, not zeros.
    del space.planes[1]
    assert gpu_profile.summarize_space(space, steps=2)["device_busy_ms"] is None


def test_gpu_profile_smoke_runs_a_variant_on_the_cpu_and_calibrates_per_node(tmp_path):
    """The profiler run end to end on the CPU (the tiny CNN, one profiled step, float32 and our
    bfloat16 rewrite): wall time measured, no device figures, every node's time (from the
    host's op kernels: a CPU has no device plane), and the per-node calibration reading that
    JSON: nodes matched to the traced graphs by name (ours behind its ``amp_rewrite/``
    prefix), the float32 convolutions set against their estimates and the rewrite's low
    nodes against float32's."""
    import calibrate_gpu_in_place as cal
    import gpu_profile

    out = tmp_path / "p.json"
    assert gpu_profile.main(["--reduced", "--steps", "1", "--warmup", "0", "--variants", "float32,ours_default",
                             "--nodes", "--out", str(out)]) == 0
    profile = json.loads(out.read_text())
    recs = profile["workloads"]["small_cnn-train-b8"]
    rec = recs["float32"]
    assert rec["wall_ms"] > 0 and rec["device_busy_ms"] is None and rec["xla"] is False
    assert rec["node_source"] == "host" and len(rec["nodes"]) > 50
    assert any(n.startswith("amp_rewrite/") for n in recs["ours_default"]["nodes"])
    result = cal.calibrate(profile, target="cpu", precision="bfloat16", low_variants=("ours_default",))
    r = result["workloads"]["small_cnn-train-b8"]
    for variant in ("float32", "ours_default"):
        c = r["coverage"][variant]
        assert c["matched_nodes"] > 50 and c["matched_ms"] > 0.8 * c["measured_ms"]
    assert any(t["op"].startswith("Conv2D ") and t["estimated_ms"] > 0 for t in r["scale"]["float32"])
    low = {t["op"].split()[0] for t in r["low_over_float32"]["ours_default"]}
    assert {"Conv2D", "Conv2DBackpropFilter"} <= low  # the rewrite's bfloat16 convolutions
    assert "| Conv2D" in cal.markdown(result)


def test_profile_names_and_node_times_from_a_trace():
    """A TensorFlow op's profiler name is ``name:Type`` (maybe the last of an annotation stack,
    with ``#...#`` metadata); runtime events and kernel symbols are not ops.  On a GPU plane a
    node's time is its kernels' on the streams (derived lines skipped); without one, its op
    events on the host's executor threads (not the Python thread's)."""
    import gpu_profile
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    parse = gpu_profile.parse_tf_op
    assert parse("model/conv/Conv2D:Conv2D") == ("model/conv/Conv2D", "Conv2D")
    assert parse("__inference_step_9::amp_rewrite/dense/MatMul:MatMul#id=3,step=1#") == (
        "amp_rewrite/dense/MatMul", "MatMul")
    for other in ("ExecutorState::Process", "fusion.7", "sm90_xmma_gemm", "a:b c", "x:lower", ":Conv2D"):
        assert parse(other) is None, other

    space = xplane_pb2.XSpace()
    host = space.planes.add(name="/host:CPU")
    host.event_metadata[1].name = "step_fn:MatMul"
    host.lines.add(name="python").events.add(metadata_id=1, offset_ps=0, duration_ps=10**9)
    gpu = space.planes.add(name="/device:GPU:0")
    gpu.stat_metadata[1].name = "tf_op"
    gpu.stat_metadata[2].name = "dense/MatMul:MatMul"
    gpu.event_metadata[10].name = "sm90_xmma_gemm"
    stream = gpu.lines.add(name="Stream #7(Compute)", timestamp_ns=0)
    for offset in (0, 5_000_000):  # two kernels of one node, 2 us each, over two steps
        stream.events.add(metadata_id=10, offset_ps=offset, duration_ps=2_000_000).stats.add(metadata_id=1, ref_value=2)
    gpu.lines.add(name="Framework Ops").events.add(metadata_id=10, offset_ps=0, duration_ps=10**8)
    nodes, source = gpu_profile.node_times(space, steps=2)
    assert source == "device" and nodes == {"dense/MatMul": {"op": "MatMul", "ms": pytest.approx(2e-3), "events": 1.0}}
    del space.planes[1]
    executor = space.planes[0].lines.add(name="tf_Compute/1")
    host.event_metadata[2].name = "conv/Conv2D:Conv2D"
    executor.events.add(metadata_id=2, offset_ps=0, duration_ps=3_000_000)
    nodes, source = gpu_profile.node_times(space, steps=1)
    assert source == "host" and set(nodes) == {"conv/Conv2D"}  # the Python thread's event is no op kernel


def test_per_node_calibration_arithmetic():
    """The calibration's sums: measured over estimated per op (dense per size band), low over
    float32 only over nodes float32 in one run and low in the other, a least-squares Cast line,
    and the small kernels' median."""
    import calibrate_gpu_in_place as cal

    M = cal.Matched
    f32 = [M("float32", "c1", "Conv2D", "dense", "float32", 1.0, 2.0, 100, 1e6),
           M("float32", "c2", "Conv2D", "dense", "float32", 3.0, 2.0, 100, 3e8),
           M("float32", "r", "Relu", "elementwise", "float32", 0.5, 1.0, 10**6, 0),
           M("float32", "tiny", "AddV2", "elementwise", "float32", 0.001, 0.004, 10, 0)]
    low = [M("low", "c1", "Conv2D", "dense", "low", 0.5, 1.0, 100, 1e6),
           M("low", "r", "Relu", "elementwise", "float32", 0.5, 1.0, 10**6, 0),  # not converted: left out
           M("low", "k1", "Cast", "cast", "low", 0.0, 0.003, 1000, 0),
           M("low", "k2", "Cast", "cast", "low", 0.0, 0.005, 3000, 0)]
    scale = {t["op"]: t for t in cal.per_op_scale(f32)}
    assert scale["Conv2D <5M"]["measured_over_estimate"] == 2.0
    assert scale["Conv2D >=200M"]["measured_over_estimate"] == pytest.approx(2 / 3)
    ratios = {t["op"]: t["low_over_float32"] for t in cal.low_over_float32(f32, low)}
    assert ratios == {"Conv2D <5M": 0.5}
    line = cal.cast_line(low)
    assert line["fixed_us"] == pytest.approx(2.0) and line["ns_per_element"] == pytest.approx(1.0)
    assert cal.small_kernel_floor(f32) == {"nodes": 1, "median_us": pytest.approx(4.0)}
    assert cal.cast_line(low[:3]) is None  # one Cast: no line
    matched, unmatched = cal.match({"amp_rewrite/c1": {"ms": 1.0}, "gone": {"ms": 0.5}},
                                   {"": {"c1": __import__("amp_rewrite").plan.step_cost.NodeTime(
                                       "Conv2D", "dense", "low", 5e5, 100)}}, "low", {"c1": 1e6})
    assert [(m.name, m.estimated_ms, m.flops) for m in matched] == [("c1", 0.5, 1e6)] and unmatched == 0.5


def test_xla_dump_summary_weighs_two_modules_memory_traffic():
    """``--compare``: each entry instruction that launches a kernel reads its operands' bytes
    and writes its result's (a library call's ``s8`` workspace left out; parameters, tuples
    and bitcasts launch nothing); bytes are summed per kind and per TensorFlow op, the op
    names' layer numbers and our ``amp_rewrite/`` scope folded, largest difference first."""
    import xla_dump_summary as xs

    def module(cast_type: str, scope: str) -> str:
        return "\n".join([
            "HloModule m",
            "%fused_computation (p: f32[8]) -> f16[8] {",
            "  %p = f32[8]{0} parameter(0)",  # a fusion's body: not an entry instruction
            "}",
            "ENTRY %main (a: f32[1024], w: f16[32,32]) -> f16[1024] {",
            "  %a = f32[1024]{0} parameter(0)",
            "  %w = f16[32,32]{1,0} parameter(1)",
            "  %b = f32[32,32]{1,0} bitcast(f32[1024]{0} %a)",
            f'  %c = {cast_type}[32,32]{{1,0}} fusion(%b), kind=kLoop, calls=%fused_computation, '
            f'metadata={{op_type="Cast" op_name="{scope}model/layer_3/Cast"}}',
            '  %g = (f16[32,32]{1,0}, s8[4096]{0}) custom-call(%c, %w), custom_call_target="__cublas$gemm", '
            f'metadata={{op_type="MatMul" op_name="{scope}model/layer_3/MatMul"}}',
            "  ROOT %t = f16[32,32]{1,0} get-tuple-element(%g), index=0",
            "}",
        ])

    keras, ours = module("f16", ""), module("f32", "amp_rewrite/")
    rows = xs.entry_traffic(keras)
    assert [(r["kind"], r["read"], r["written"]) for r in rows] == [
        ("fusion.kLoop", 4096, 2048),          # reads f32[32,32] through the bitcast, writes f16
        ("matmul", 2048 + 2048, 2048)]         # the workspace is not traffic
    table = xs.compare(keras, ours)
    assert "| **all** (entry computation) | 2 | 0.000 | 2 | 0.000 |" in table
    assert "conditional" not in table  # no control flow in these modules
    op_rows = table.split("| TensorFlow op |")[1].splitlines()[2:]
    # Same op keys in both modules (scope and layer number folded); the Cast differs first.
    assert op_rows[0].startswith("| Cast model/layer/Cast | 0.000 | 0.000 | +0.000 |")
    assert xs.entry_traffic("HloModule m\n") == []
    diff = {r["op_type"]: r for r in xs.entry_traffic(ours)}
    assert diff["Cast"]["written"] == 4096 and diff["MatMul"]["read"] == 4096 + 2048
    # A conditional hands its operands to a branch: no traffic of its own, counted apart.
    branching = ours.replace("  ROOT %t", "  %k = (f32[32,32]{1,0}) conditional(pred[] %a, (f32[32,32]{1,0}) %c), "
                                          "true_computation=%x, false_computation=%y\n  ROOT %t")
    assert xs.entry_traffic(branching) == xs.entry_traffic(ours)
    assert "| conditional/while/call (their bodies' kernels not weighed) | 0 | | 1 | |" in xs.compare(keras, branching)

    # --times: the same instructions weighed by their kernels' measured ms per step (a
    # gpu_profile.py JSON's xla_ops, keyed module/instruction; a "(id)" suffix ignored), with
    # the time of instructions outside the entry computation (a branch's fusion) apart.
    profile = {"m.12(3)/c": {"ms": 0.25}, "m.12(3)/g": {"ms": 1.0}, "other/c": {"ms": 9.0}}
    assert xs.module_key("m.12(3)") == xs.module_key("m.12") == "m"
    times_a = xs.module_times(profile, "m")
    assert times_a == {"c": 0.25, "g": 1.0}
    times_b = {"c": 0.5, "g": 1.0, "fusion.9": 0.125}
    table = xs.compare_times(keras, ours, times_a, times_b)
    assert "| **all kernels** | 1.250 | 1.625 | +0.375 |" in table
    assert "| outside the entry computation (branches, loop bodies) | 0.000 | 0.125 | +0.125 |" in table
    assert "| fusion.kLoop | 0.250 | 0.500 | +0.250 |" in table and "| matmul | 1.000 | 1.000 | +0.000 |" in table
    op_rows = table.split("| TensorFlow op |")[1].splitlines()[2:]
    assert op_rows[0] == "| Cast model/layer/Cast | 0.250 | 0.500 | +0.250 |"



def test_xla_dump_summary_times_two_variants_of_a_profile_from_the_command_line(tmp_path, capsys):
    """``DIR --times PROFILE VA VB`` finds each variant's kernel times in the profile and its
    module in the dump (``--compare``'s, else the module its kernels ran in), and refuses a
    variant the profile lacks."""
    import xla_dump_summary as xs

    text = "\n".join(["HloModule m", "ENTRY %main (a: f32[8]) -> f32[8] {", "  %a = f32[8]{0} parameter(0)",
                      '  ROOT %c = f32[8]{0} fusion(%a), kind=kLoop, calls=%f, metadata={op_type="Relu" op_name="r"}',
                      "}"])
    names = {"keras": "a_inference_one_step_on_data_1__XlaMustCompile_",
             "ours": "a_inference_amp_rewrite_one_step_on_data_2__XlaMustCompile_"}
    # As XLA names them: the dump's file name drops the ".N" unique id that the HloModule line,
    # and so the profiler's hlo_module stat, keep (the profiler may add a "(program id)" too).
    for i, (name, uid) in enumerate(zip(names.values(), (514, 511))):
        (tmp_path / f"module_000{i}.{name}.{uid}.sm_9.0a_gpu_after_optimizations.txt").write_text(text)
    profile = {"workloads": {"w": {"va": {"xla_ops": {f"{names['keras']}.514/c": {"ms": 1.0}}},
                                   "vb": {"xla_ops": {f"{names['ours']}.511(7)/c": {"ms": 0.75}}}}}}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    args = [str(tmp_path), "--compare", "_data_1_", "amp_rewrite", "--times", str(path), "va", "vb"]
    assert xs.main(args) == 0
    assert "| Relu r | 1.000 | 0.750 | -0.250 |" in capsys.readouterr().out
    # Without --compare each variant's module is the one its kernels ran in.
    assert xs.main(args[:1] + args[4:]) == 0
    assert "| Relu r | 1.000 | 0.750 | -0.250 |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        xs.main(args[:-1] + ["vc"])


def test_extra_variants_are_our_variants_with_more_rewrite_options(monkeypatch):
    """``--extra-variant NAME=BASE:JSON`` defines one of our variants with more options (a
    hypothesis measured side by side); its spec keeps the base's mode and lists and carries the
    options; malformed definitions and bases that are not ours are refused."""
    monkeypatch.setattr(gpu_bench, "EXTRA_VARIANTS", {})
    name = gpu_bench.define_extra_variant('ours_noexp_xla=ours_default_xla:{"remove": {"deny": ["Exp"]}}')
    spec = gpu_bench.variant_spec(name)
    assert (spec.name, spec.jit_compile, spec.lists, spec.ours) == ("ours_noexp_xla", True, "default", True)
    assert spec.options == {"remove": {"deny": ["Exp"]}}
    assert gpu_bench.variant_spec("ours_default_xla").options == {}  # the base is unchanged
    user = gpu_bench.variant_spec(gpu_bench.define_extra_variant("ours_user_again=ours_user"))
    assert user.user_defaults and user.options == {}
    for bad in ("float32_x=float32", "ours_user=ours_default", "no_base", "x=ours_user:[1]", "a b=ours_user"):
        with pytest.raises(ValueError):
            gpu_bench.define_extra_variant(bad)


def test_grappler_counts_what_a_step_without_xla_launches():
    """``bench/grappler_counts.py``: a step placed on a virtual GPU, after Grappler's default
    optimizers, counted.  Float32 convolutions on a GPU run NCHW (the layout optimizer's
    transposes); a float16 rewrite keeps NHWC and adds Casts, and so more kernels."""
    import grappler_counts

    got = {}
    for variant in ("float32", "ours_default"):
        step = gpu_bench.variant_graph_def("small_cnn-train-b8", variant, target="gpu:9.0", precision="float16")
        got[variant] = grappler_counts.counts(grappler_counts.grappler_optimized(step.graph_def, "9.0"),
                                              step.variable_shapes)
    assert got["float32"]["transposes"] > 0 and got["ours_default"]["transposes"] == 0
    assert got["float32"]["transposed_elements"] > 0 and got["float32"]["transposes_unsized"] == 0
    assert got["ours_default"]["casts"] > got["float32"]["casts"]
    assert got["ours_default"]["kernels"] > got["float32"]["kernels"] > 0
    assert all(c["nodes"] > c["kernels"] for c in got.values())


def test_the_gpu_session_script_names_only_known_workloads_and_variants_and_fits_a_device_call(monkeypatch):
    """``bench/gpu_session.sh`` is what the next session with a GPU runs, one stage per device
    call (at most 600 s, 8 files back): a typo found there costs device time, so every
    workload, variant and extra variant it names must exist here, each command's ``timeout``
    must end the call in time, a bench's ``--time-budget`` leave room before its timeout, a
    stage write few enough files, and bash must parse it."""
    import re
    import shlex

    monkeypatch.setattr(gpu_bench, "EXTRA_VARIANTS", {})
    path = os.path.join(ROOT, "bench", "gpu_session.sh")
    subprocess.run(["bash", "-n", path], check=True)
    text = open(path).read().replace("\\\n", " ")
    commands = [line[line.index("timeout "):] for line in text.splitlines()
                if re.search(r"timeout \d+ python3 bench/gpu_(bench|profile)\.py", line)]
    assert len(commands) >= 4
    stages = re.findall(r"^(\w+)\)$", text, flags=re.M)
    assert stages == ["norm", "profile", "misses", "train", "nodes", "bf16", "more", "more_xla", "measure", "errors",
                      "loops"]
    # bench/loop_hoist.py's workloads too (the loops stage).
    import loop_hoist

    for command in re.findall(r"timeout \d+ python3 bench/loop_hoist\.py[^\n]*", text):
        only = shlex.split(command)[shlex.split(command).index("--only") + 1]
        assert set(only.split(",")) <= set(loop_hoist.WORKLOADS), command
    for command in commands:
        words = shlex.split(command.split(">")[0])
        timeout = int(words[1])
        # Each option with its value (the last one where repeated); flags have none.
        args = {w: v for w, v in zip(words, words[1:]) if w.startswith("--") and not v.startswith("--")}
        for i, word in enumerate(words):
            if word == "--extra-variant":
                gpu_bench.define_extra_variant(words[i + 1])
        for name in args["--workloads"].split(","):
            assert gpu_bench.workload_named(name).name == name
        for name in args["--variants"].split(","):
            assert gpu_bench.variant_spec(name).name == name
        if "--time-budget" in args:
            assert float(args["--time-budget"]) + 30 <= timeout, command
    per_stage = re.split(r"^\w+\)$", text, flags=re.M)[1:]
    for stage, body in zip(stages, per_stage):
        total = sum(int(m) for m in re.findall(r"timeout (\d+) ", body))
        assert total <= 590, (stage, total)
        # A call brings back at most 8 files: the stage's own, gpu_bench's JSON beside each
        # markdown it writes, and the log.
        files = set(re.findall(r'"\$out/([\w.\-]+)"', body))
        files |= {f[:-3] + ".json" for f in files if f.endswith(".md") and "gpu_bench.py" in body}
        assert len(files | {"log.txt"}) <= 7, (stage, sorted(files))


def test_the_list_files_the_gpu_session_names_load_and_differ_from_the_default_as_they_say():
    """``bench/gpu_session.sh profile`` runs ``ours_identity_off`` with
    ``bench/lists/identity_off.toml``: a list file that stopped loading would cost a GPU call.
    The other files of ``bench/lists`` were measured in earlier runs (``--extra-variant``, see
    CONTRIBUTING.md): each is the default profile with one rule taken back, and nothing else."""
    import amp_rewrite

    target = amp_rewrite.resolve_target("gpu:9.0")
    lists_dir = os.path.join(ROOT, "bench", "lists")
    with open(os.path.join(ROOT, "bench", "gpu_session.sh")) as f:
        session = f.read()
    named = set(re.findall(r"bench/lists/([\w.]+\.toml)", session))
    assert named and named <= set(os.listdir(lists_dir))
    # ``identity_off``: the default profile with its [float16.identity] entries dropped.
    off, _ = amp_rewrite.resolve_lists(os.path.join(lists_dir, "identity_off.toml"), target=target,
                                       precision="float16", environ={})
    default_lists, _ = amp_rewrite.resolve_lists("default", target=target, precision="float16", environ={})
    assert default_lists.identity and not off.identity
    assert off.as_dict() == default_lists.as_dict() and off.bounded == default_lists.bounded
    denied, _ = amp_rewrite.resolve_lists(os.path.join(lists_dir, "exp_denied.toml"), target=target,
                                          precision="float16", environ={})
    default, _ = amp_rewrite.resolve_lists("default", target=target, precision="float16", environ={})
    assert "Exp" in default.bounded and "Exp" not in denied.bounded and "Exp" in denied.deny
    assert (denied.allow, denied.infer, denied.clear, denied.planner) == \
        (default.allow, default.infer, default.clear, default.planner)
    # ``norm`` runs ``ours_default_low_xla``: the default profile with the normalization rule
    # of 2026-11-26 (apply ops in float16) instead of the fence, and nothing else.
    low, _ = amp_rewrite.resolve_lists(os.path.join(lists_dir, "normalization_low.toml"), target=target,
                                       precision="float16", environ={})
    assert (default.normalization_apply, low.normalization_apply) == ("fenced", "low")
    assert low.as_dict() == default.as_dict() and low.bounded == default.bounded


def test_done_when_judges_lines_1_and_2_from_paired_repeats_within_the_aa_gap(tmp_path):
    """``bench/gpu_done_when.py`` reads measured runs only: line 1 pairs ours with Keras's
    mixed + XLA and float32 + XLA repeat by repeat; line 2 takes our best variant per mode
    against TF's pass and float32 in that mode; a comparison holds within the A/A gap (2%,
    said so, where the run had no A/A pair); errors hold up to the larger of TF's and Keras's."""
    import gpu_done_when

    def v(steps, err=None, baseline=None):
        rec = {"step_ms": statistics.median(steps), "step_ms_per_repeat": steps, "rel_err_vs_float32_strict": err}
        if baseline:
            rec["measured_ratio_baseline"] = baseline
        return rec

    train = {"workload": "w-train", "train": True, "aa_gap": 0.01, "variants": {
        "float32": v([100.0, 100.0, 100.0]), "float32_again": v([101.0, 101.0, 101.0]),
        "float32_strict": v([150.0, 150.0, 150.0], err=0.0), "float32_xla": v([40.0, 40.0, 40.0]),
        "tf_amp": v([110.0, 110.0, 110.0], err=4e-4), "keras_mixed_xla": v([30.0, 30.0, 30.0], err=5e-4),
        "ours_user": v([29.0, 31.5, 29.5], err=3e-4, baseline="float32_xla"),
        "ours_optimal": v([100.5, 100.5, 100.5], err=0.0, baseline="float32"),
        "ours_default": v([120.0, 120.0, 120.0], err=6e-4, baseline="float32"),
        # An --extra-variant experiment is not a profile: never "ours (best)", nor ours' error.
        "ours_experiment_xla": v([1.0, 1.0, 1.0], err=1e-2, baseline="float32_xla")}}
    row = gpu_done_when.line1(train)
    assert row["keras"]["faster"] == 2 and row["keras"]["repeats"] == 3
    assert row["keras"]["median"] == pytest.approx(29.5 / 30.0) and row["keras"]["verdict"] == "holds"
    judged = gpu_done_when.line2(train)
    no_xla, xla = judged["modes"]["no XLA"], judged["modes"]["XLA"]
    assert no_xla["ours"] == "ours_optimal" and no_xla["float32"]["verdict"] == "holds"  # 0.5% < 1% A/A
    assert no_xla["tf_amp"]["ratio"] == pytest.approx(100.5 / 110.0)
    assert xla["ours"] == "ours_user" and xla["tf_amp"]["verdict"] == "n/a"
    # The worst of ours (ours_default, 6e-4) is above both TF's pass's and Keras's: fails.
    assert judged["error"]["ours"] == ("ours_default", 6e-4) and judged["error"]["verdict"] == "fails"

    # Line 2 pairs repeats as line 1 does: the machine slowed between repeats, and ours was
    # faster in two of three; the ratio of the medians (92 / 90) would say 2.2% slower.
    drift = {"workload": "w-drift", "train": True, "aa_gap": 0.01, "variants": {
        "float32": v([100.0, 90.0, 80.0]), "ours_optimal": v([98.0, 92.0, 79.0], baseline="float32")}}
    entry = gpu_done_when.line2(drift)["modes"]["no XLA"]["float32"]
    assert entry["ratio"] == pytest.approx(79.0 / 80.0) and entry["verdict"] == "holds"

    # Slower than Keras by more than the A/A gap, with no A/A pair (2% assumed): fails.
    slow = {"workload": "w2", "train": True, "aa_gap": None, "variants": {
        "keras_mixed_xla": v([10.0, 10.0]), "ours_user": v([10.5, 10.4], baseline="float32_xla")}}
    row = gpu_done_when.line1(slow)
    assert row["keras"]["verdict"] == "fails" and not row["noise_measured"]
    assert row["float32_xla"]["verdict"] == "not measured"
    assert gpu_done_when.line1({**slow, "train": False}) is None  # line 1 is about training steps
    runs = []
    for i, w in enumerate((train, slow)):
        path = tmp_path / f"{i}.json"
        path.write_text(json.dumps({"machine": {"date": "d"}, "config": {}, "workloads": [w]}))
        runs.append(str(path))
    out = tmp_path / "done.md"
    assert gpu_done_when.main([*runs, "--out", str(out)]) == 0
    text = out.read_text()
    assert "| w-train | 0.983 (0.967-1.050, 2 of 3) | holds |" in text
    assert "| w2 | 1.045 (1.040-1.050, 0 of 2) | fails |" in text and "(assumed: no A/A pair)" in text
    assert "| w-train | 0.json | ours_default 6.00e-04 | 5.00e-04 | fails |" in text

    # The same workload without XLA in one call and under XLA in the next: both judged, each
    # against its own run's float32; a later split of one run (same variants) replaces it.
    xla_only = {"workload": "w-train", "train": True, "aa_gap": None, "variants": {
        "float32_xla": v([40.0, 40.0]), "ours_user": v([44.0, 44.0], baseline="float32_xla")}}
    later = tmp_path / "2.json"
    later.write_text(json.dumps({"machine": {"date": "d"}, "config": {}, "workloads": [xla_only]}))
    records = gpu_done_when.read_runs([*runs, str(later), str(later)])["workloads"]
    assert [(r["workload"], r["run"]) for r in records] == [("w-train", "0.json"), ("w2", "1.json"),
                                                             ("w-train", "2.json")]
    assert gpu_done_when.main([*runs, str(later), "--out", str(out)]) == 0
    text = out.read_text()
    assert "| w-train | 0.json | no XLA | ours_optimal (100.50 ms) | 1.005 | holds |" in text
    assert "| w-train | 2.json | XLA | ours_user (44.00 ms) | 1.100 | fails |" in text


def test_forecast_by_kind_prices_a_step_by_kind_with_its_layout_transposes(tmp_path, capsys):
    """``bench/forecast_by_kind.py`` (run before the ``nodes`` stage measures the same steps):
    here on the reduced CNN, a float32 training step carries the layout Transposes a GPU
    without XLA runs it with, and its float16 rewrite none."""
    import forecast_by_kind

    run = tmp_path / "run.json"
    run.write_text(json.dumps({"machine": {"gpus": [{"device_name": "a GPU", "compute_capability": [9, 0]}]}}))
    assert forecast_by_kind.main([str(run), "--workloads", "small_cnn-train-b8",
                                  "--variants", "float32,ours_default"]) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if "small_cnn" in line]
    by_variant = {r[1].strip(): r for r in rows}
    assert set(by_variant) == {"float32", "ours_default"}
    transposes = {v: int(r[8].split("(")[1].rstrip(") ")) for v, r in by_variant.items()}
    assert transposes["float32"] > 0 and transposes["ours_default"] == 0
    assert all(float(r[2]) > 0 for r in rows)
