"""The cost model's estimate of whole steps without XLA by kind of work, to set against a GPU's
per-node times before they are measured (``bench/gpu_session.sh nodes``).

For each workload and variant, ``amp_rewrite.estimate_step_time`` of the step as
``bench/gpu_bench.py`` builds it (traced here, no GPU), priced as the GPU of a measured run
(its device class, with the run's measured memory bandwidth: ``gpu_predict.device_costs``):
total, whether the model takes it for host- or device-bound, and the device time by kind --
dense ops, element-wise ops, Casts, the layout optimizer's Transposes
(``amp_rewrite/plan/gpu_layout.py``), and the fixed time per kernel -- with the executor's host
time.  Prints a markdown table.

Usage::

    python bench/forecast_by_kind.py bench/gpu_runs/2026-11-28b-h200/gpu_measure.json \\
        --workloads mobilenetv2-train-b64,resnet50-train-b64 --variants float32,ours_default
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), HERE]


def main(argv: list[str] | None = None) -> int:
    import amp_rewrite
    import gpu_bench
    import gpu_predict

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a measured run's JSON (its machine prices the steps)")
    p.add_argument("--workloads", required=True)
    p.add_argument("--variants", default="float32,ours_default")
    args = p.parse_args(argv)
    with open(args.run) as f:
        machine = json.load(f)["machine"]
    target = f"gpu:{gpu_predict._capability(machine)}"
    costs = gpu_predict.device_costs(machine, target)  # None: the target's own class
    where = f"{costs.name} at {costs.bandwidth / 1e3:.1f} TB/s" if costs is not None else "its own class"
    print(f"Priced as {target}, {where}; ms per step.\n")
    print("| step | variant | total | bound | device | dense | element-wise | Casts | layout Transposes (count) "
          "| fixed per kernel | host (kernels) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for w in args.workloads.split(","):
        for v in args.variants.split(","):
            step = gpu_bench.variant_graph_def(w, v, target=target, precision="float16")
            if step.compiled:
                raise SystemExit(f"{v} runs under XLA: this prices steps without it")
            e = amp_rewrite.estimate_step_time(step.graph_def, target=target, precision="float16",
                                               variable_shapes=step.variable_shapes, costs=costs,
                                               fetches=step.fetches)
            ms = [f"{ns / 1e6:.2f}" for ns in (e.total_ns, e.device_ns, e.dense_ns, e.elementwise_ns, e.cast_ns,
                                                e.layout_ns, e.overhead_ns, e.host_ns)]
            bound = "host" if e.host_ns > e.device_ns else "device"
            if e.host_trips:  # serial round trips through the host come on top of either
                bound += f" + {e.host_trips} host round trip(s), {e.host_trip_ns / 1e6:.2f} ms"
            print(f"| {w} | {v} | {ms[0]} | {bound} | {ms[1]} | {ms[2]} | {ms[3]} | {ms[4]} | {ms[5]} ({e.transposes}) "
                  f"| {ms[6]} | {ms[7]} ({e.kernels}) |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
