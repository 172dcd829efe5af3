#!/usr/bin/env bash
# The next GPU session's measurements for issue 22, one stage per device call.
#
# Each stage fits one call of the device tool (10 minutes at most; the stages below take
# 4-8 minutes on an H100 by the timings of bench/GPU_RESULTS.md) and writes its JSON and
# markdown under OUT, with one log.txt (the GPU's nvidia-smi line, every command's output, and
# each command's exit status).  A call brings back at most 8 files: no stage writes more
# than 6.  Install TensorFlow first (CONTRIBUTING.md, "The GPU benchmark"), then, while the
# machine is warm, one call per stage:
#
#     source .gpu/scripts/env.sh; bash bench/gpu_session.sh STAGE "$OUT"
#
# Stages, most wanted first (a session of 15 device minutes has room for about two after the
# install; since the third 2026-11-28 run, which ran `nodes`, ResNet50 b128's `more_xla`, half
# of `errors` and the LSTM's profile, `train` comes first (the optimal profile's no-XLA plans,
# which convert since the GPU classes were calibrated node by node, and the strict step alone),
# then `misses` (MobileNetV2 under XLA, the one step line 3 still misses), `errors` and `bf16`):
#   norm      Done-when line 1: ours as a user enables it against Keras's mixed_float16 + XLA
#             and float32 + XLA, BERT first, then ResNet50; five variants, so both workloads
#             fit the time budget (six left BERT out).  On the H200 (2026-11-27, second run,
#             code de33612) ours led Keras's on both (BERT in 5 of 5 rounds, ResNet50 in 4).
#   more      Five workloads without XLA in one call (float32 and its A/A twin,
#             float32_strict, TF's pass, ours_optimal; run on the H200 2026-11-28).
#   measure   Done-when line 2 on MobileNetV2 without XLA, where the optimal profile kept
#             float32 and TF's pass gained 3.4% (2026-11-28): ours_measured (the optimal
#             profile choosing its step by measure_steps=3 among the planned, float32 and
#             default lists' steps) against float32, its A/A twin, TF's pass, ours_default and
#             ours_tensorflow; then the LSTM (whose TF pass ran 1.48x float32) and EfficientNetB0.
#             Ran on the second 2026-11-28 run: ours_measured chose the default lists' step on
#             all three, 0.92-0.95 of float32's and 0.61-0.95 of TF's pass's step.
#   misses    What the cost model still misses, profiled: MobileNetV2 under XLA (float32 and
#             ours, kernel times per HLO instruction; 0.969 predicted, 0.797 measured).  (The
#             LSTM's profile ran in the third 2026-11-28 run: a host round trip, now modelled.)
#   more_xla  What the 2026-11-28 runs left under XLA: ResNet50 b128, with float32 and its
#             A/A twin for the run's noise (EfficientNetB0 ran in the second run; MobileNetV2,
#             the LSTM and ResNet50 b8 inference in the first).
#   bf16      bfloat16 on the GPU (never measured): Keras's mixed_bfloat16 + XLA against ours
#             with the default profile, which fences norms and clears reductions over no
#             element in bfloat16 on GPUs since 2026-11-27, and since 2026-11-28 trains
#             bfloat16 without loss scaling, as Keras's policy does (the default
#             loss_scale="auto"; forecast gpu_runs/forecast-2026-11-28-h200-bf16.md), and with
#             TensorFlow's lists painted TensorFlow's way (ours_tensorflow_xla); BERT, then
#             ResNet50.
#   train     The optimal profile's no-XLA training plans against float32 and its A/A gap,
#             TF's pass and the default lists: since the GPU classes were fitted to the third
#             2026-11-28 run's per-node times the planner converts MobileNetV2's and
#             EfficientNetB0's steps (predicted 0.814 and 0.800 of float32, where the default
#             lists' steps ran 0.94) and keeps ResNet50's float32 (forecast:
#             gpu_runs/forecast-2026-11-28d-h200-train.md); then ResNet50 with TF32 off in a
#             process of its own (in one process the strict step ran TF32's autotuned
#             algorithms: 96 TFLOP/s, above FP32's 67).
#   nodes     Per-node times without XLA (float32, TF's pass, ours default, TF32 off) for
#             bench/calibrate_gpu_in_place.py (--fit), which prices the same nodes here:
#             MobileNetV2, EfficientNetB0, ResNet50 and the LSTM; then which element-wise ops
#             Grappler folds into a frozen convolution (the probe's three 3x3 patterns).  Ran in
#             the third 2026-11-28 run: the GPU classes' tables without XLA are its fit; run it
#             again on another GPU family, or with BERT, to check them out of sample.
#   errors    Done-when line 2's error column for the default lists' steps, which `measure_steps`
#             chose on the second 2026-11-28 run (that stage had no float32_strict): the first
#             step's loss of ours_default, TF's pass and Keras's mixed_float16 against float32
#             with TF32 off, one repeat each, on EfficientNetB0 and ResNet50 b128 (the LSTM and
#             MobileNetV2 ran in the third 2026-11-28 run).  About 3 minutes (TF's pass takes
#             33 s to its first step).  Its speed rows (one repeat, no float32 baseline) are no
#             verdict on line 2's speed.
#   loops     Casts hoisted out of loop bodies (amp_rewrite/loop_hoist.py, 2026-11-28) on the
#             GPU: a recurrent decoder's greedy decoding at batch 1 and 8, float32 (TF32), the
#             Casts left in the loop (where TensorFlow's pass puts them), hoisted twice (A/A),
#             and the optimal profile.  On this CPU (bfloat16) the Casts in the loop made
#             decoding 1.2-1.8x slower than float32 and hoisted 0.67-0.90 of it.  About 3 min.
#   profile   Whatever still separates ours from Keras's mixed_float16 on BERT under XLA (on
#             2026-11-27, before the fixes, the float32 gradients into the layer norms): both
#             steps, and ours with reductions over no element denied again (the fence's input
#             side alone), under TensorFlow's profiler, each kernel's time set against its HLO
#             instruction and TensorFlow op; then ResNet50
#             inference at batch 1 under XLA (float32 through Keras and through our runner,
#             ours converted), whose steps the cost model prices 4-7x short.
#
# Afterwards, here: bench/gpu_predict.py (predicted against measured) and bench/gpu_done_when.py
# (done-when lines 1 and 2, judged within the A/A gap) on the returned JSON files.
#
# The benchmarks and profiles rewrite their files as they go (gpu_bench after each repeat,
# gpu_profile after each variant), so a command stopped by its timeout keeps what it finished.
# The stage's exit status is the first failing command's (0 when all succeeded).
set -u
stage=${1:?usage: bench/gpu_session.sh nodes|more_xla|misses|errors|measure|norm|more|bf16|train|loops|profile OUT}
out=${2:?usage: bench/gpu_session.sh STAGE OUT}
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 2
cd "$(dirname "$0")/.." || exit 2
log="$out/log.txt"
rc=0

# One command of the stage: its output into the log, its status remembered.
step() {
    echo "== $*" >> "$log"
    "$@" >> "$log" 2>&1
    local status=$?
    echo "== exit $status" >> "$log"
    if [ "$status" -ne 0 ] && [ "$rc" -eq 0 ]; then rc=$status; fi
}

nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv >> "$log" 2>&1

case "$stage" in
norm)
    step timeout 540 python3 bench/gpu_bench.py --workloads bert_base-train-b32,resnet50-train-b64 \
        --variants float32,float32_again,float32_xla,keras_mixed_xla,ours_user \
        --repeats 5 --steps 10 --warmup 2 --no-predict --time-budget 480 \
        --out "$out/gpu_norm.md"
    ;;
profile)
    # The compiled modules too (a fresh dump: a warm machine keeps /tmp between calls).
    rm -rf /tmp/xd_prof
    step env XLA_FLAGS="--xla_dump_to=/tmp/xd_prof --xla_dump_hlo_as_text" \
        timeout 320 python3 bench/gpu_profile.py --workloads bert_base-train-b32 \
        --variants keras_mixed_xla,ours_user,ours_identity_off \
        --extra-variant 'ours_identity_off=ours_user:{"lists": "bench/lists/identity_off.toml"}' \
        --steps 5 --out "$out/prof_bert.json"
    for ours in ours_user ours_identity_off; do
        echo "## keras_mixed_xla against $ours (ms per step)" >> "$out/prof_bert_times.md"
        timeout 10 python3 bench/xla_dump_summary.py /tmp/xd_prof --times "$out/prof_bert.json" \
            keras_mixed_xla "$ours" --top 80 >> "$out/prof_bert_times.md" 2>&1
    done
    step tar czf "$out/hlo_prof_bert.tgz" -C /tmp/xd_prof \
        $(cd /tmp/xd_prof 2>/dev/null && ls | grep 'one_step_on_data.*after_optimizations\.txt$')
    step timeout 190 python3 bench/gpu_profile.py --workloads resnet50-infer-b1 \
        --variants float32_xla,ours_optimal_xla,ours_user --steps 20 \
        --out "$out/prof_r50i1.json"
    ;;
misses)
    # MobileNetV2 under XLA, float32's step and ours, each kernel's time against its HLO
    # instruction: what the model misses there (6.5 ms of float32's 15.0, 3.8 of ours' 12.0).
    rm -rf /tmp/xd_mnv2
    step env XLA_FLAGS="--xla_dump_to=/tmp/xd_mnv2 --xla_dump_hlo_as_text" \
        timeout 330 python3 bench/gpu_profile.py --workloads mobilenetv2-train-b64 \
        --variants float32_xla,ours_user --steps 5 --out "$out/prof_mnv2.json"
    echo "## float32_xla against ours_user (ms per step)" >> "$out/prof_mnv2_times.md"
    timeout 10 python3 bench/xla_dump_summary.py /tmp/xd_mnv2 --times "$out/prof_mnv2.json" \
        float32_xla ours_user --top 80 >> "$out/prof_mnv2_times.md" 2>&1
    ;;
train)
    step timeout 440 python3 bench/gpu_bench.py \
        --workloads mobilenetv2-train-b64,efficientnetb0-train-b64,resnet50-train-b64 \
        --variants float32,float32_again,ours_optimal,tf_amp,ours_default \
        --repeats 5 --steps 10 --warmup 2 --no-predict --time-budget 380 \
        --out "$out/gpu_train.md"
    # TF32 off in a process of its own: TensorFlow's convolution autotune cache is keyed by
    # shapes and dtype, not by TF32 (ConvParameters, TF 2.21), so a strict step that follows a
    # TF32 one in the same process may reuse its TF32 algorithms (ResNet50's strict step
    # measured 0.996x float32, where the model says 1.8x).  Here it autotunes first.
    step timeout 140 python3 bench/gpu_bench.py --workloads resnet50-train-b64 --variants float32_strict \
        --repeats 3 --steps 10 --warmup 2 --no-predict --time-budget 100 \
        --out "$out/gpu_strict_alone.md"
    ;;
nodes)
    # The two depthwise networks line 3 misses, ResNet50 (dense-heavy), then the LSTM (TF's
    # pass ran 1.33-1.48x float32 there); a timeout keeps every finished variant.
    step timeout 430 python3 bench/gpu_profile.py \
        --workloads mobilenetv2-train-b64,efficientnetb0-train-b64,resnet50-train-b64,lstm-train-b64 \
        --variants float32,tf_amp,ours_default,float32_strict --nodes --steps 3 \
        --out "$out/nodes.json"
    # What Grappler folds into a frozen convolution on this GPU (amp_rewrite/plan/
    # grappler_folds.py encodes what it folds with oneDNN on a CPU; the planner applies it to
    # GPU targets too, unmeasured).
    step timeout 60 sh -c "python3 -u bench/fold_probe.py > '$out/fold_probe.txt'"
    ;;
bf16)
    step timeout 540 python3 bench/gpu_bench.py --precision bfloat16 \
        --workloads bert_base-train-b32,resnet50-train-b64 \
        --variants float32,float32_again,float32_xla,keras_mixed_xla,ours_default_xla,ours_tensorflow_xla \
        --repeats 5 --steps 10 --warmup 2 --no-predict --time-budget 480 \
        --out "$out/gpu_bf16.md"
    ;;
more)
    step timeout 560 python3 bench/gpu_bench.py \
        --workloads mobilenetv2-train-b64,efficientnetb0-train-b64,resnet50-train-b128,lstm-train-b64,resnet50-infer-b8 \
        --variants float32,float32_again,float32_strict,tf_amp,ours_optimal \
        --repeats 5 --steps 10 --warmup 2 --no-predict --time-budget 520 \
        --out "$out/gpu_more.md"
    ;;
more_xla)
    step timeout 560 python3 bench/gpu_bench.py --workloads resnet50-train-b128 \
        --variants float32,float32_again,float32_xla,keras_mixed_xla,ours_user \
        --repeats 5 --steps 10 --warmup 2 --no-predict --time-budget 520 \
        --out "$out/gpu_more_xla.md"
    ;;
measure)
    step timeout 560 python3 bench/gpu_bench.py \
        --workloads mobilenetv2-train-b64,lstm-train-b64,efficientnetb0-train-b64 \
        --variants float32,float32_again,tf_amp,ours_measured,ours_default,ours_tensorflow \
        --repeats 5 --steps 10 --warmup 2 --no-predict --time-budget 520 \
        --out "$out/gpu_measure.md"
    ;;
errors)
    step timeout 340 python3 bench/gpu_bench.py \
        --workloads efficientnetb0-train-b64,resnet50-train-b128 \
        --variants float32_strict,tf_amp,keras_mixed,ours_default \
        --repeats 1 --steps 3 --warmup 1 --no-predict --time-budget 290 \
        --out "$out/gpu_errors.md"
    ;;
loops)
    step timeout 300 python3 bench/loop_hoist.py --target auto --precision float16 \
        --only decode-b1,decode-b8 --rounds 9 --calls 5 --out "$out/loop_hoist"
    ;;
*)
    echo "unknown stage $stage: nodes, more_xla, misses, errors, measure, norm, more, bf16, train, loops or profile" >&2
    exit 2
    ;;
esac
echo "stage $stage: exit $rc" | tee -a "$log"
exit "$rc"
