"""The cost model's forecast for a GPU of the default profile's normalization rules: the
fenced rule (statistics and apply float32, readers of the output free: Keras's policy), the
rule it replaced (apply ops in float16), TensorFlow's pass and Keras's ``mixed_float16``,
each step's estimate over float32's in the same mode (without XLA, and under XLA).

No GPU: the steps are traced as ``bench/gpu_bench.py`` builds them on a GPU
(:func:`gpu_bench.predicted_step_ratio`) and priced by the Hopper class.  A forecast, to be
checked by the next GPU run (``bench/gpu_session.sh norm``).

Usage (from the repository root)::

    python bench/cpu_runs/2026-11-27-keras-norm/gpu_forecast.py resnet50-train-b64 bert_base-train-b32
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..", "..")
sys.path[:0] = [os.path.join(ROOT, "bench"), ROOT]

import gpu_bench  # noqa: E402

LOW = os.path.join(ROOT, "bench", "lists", "normalization_low.toml")

if __name__ == "__main__":
    gpu_bench.define_extra_variant("ours_default_low=ours_default:" + json.dumps({"lists": LOW}))
    gpu_bench.define_extra_variant("ours_default_low_xla=ours_default_xla:" + json.dumps({"lists": LOW}))
    for workload in sys.argv[1:]:
        row = {"workload": workload, "target": "gpu:9.0"}
        for variant, base in (("tf_amp", "float32"), ("keras_mixed", "float32"), ("ours_default", "float32"),
                              ("ours_default_low", "float32"), ("keras_mixed_xla", "float32_xla"),
                              ("ours_default_xla", "float32_xla"), ("ours_default_low_xla", "float32_xla")):
            row[variant] = round(gpu_bench.predicted_step_ratio(workload, variant, base, target="gpu:9.0",
                                                                precision="float16"), 3)
            print(json.dumps(row), file=sys.stderr, flush=True)
        print(json.dumps(row), flush=True)
