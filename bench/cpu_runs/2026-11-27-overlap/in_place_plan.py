"""Where a thin optimal plan's estimated gain goes: every node's own time inside the step,
float32 against the optimal bfloat16 plan for this CPU's class, and the traced steps' wall
times, side by side.

``calibrate_in_place.py`` measures float32 against TensorFlow's rewrite, which converts all it
can; here the graph is the plan the optimal planner chose, Casts included, so the sums say
what the plan's converted nodes gained in place, what its Casts cost in place, how much the
unconverted nodes moved (what runs beside them changed), and whether the step's wall time
moved by as much.  The rounds alternate the two graphs and are spread over fresh pairs of
sessions (``--sessions``).  Also prints the cost model's estimate of the same sums, and the
ratio of the two graphs' makespans on two workers with the measured node times
(``makespan.py``).

Usage (from the repository root)::

    python bench/cpu_runs/2026-11-27-overlap/in_place_plan.py inceptionv3/training densenet121/training --rounds 12
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..", "..")
sys.path[:0] = [os.path.join(ROOT, "bench"), ROOT]

import tensorflow as tf  # noqa: E402

import amp_rewrite  # noqa: E402
import bench  # noqa: E402
from models import corpus, register, resolve_items  # noqa: E402

sys.path.insert(0, HERE)
from makespan import makespan  # noqa: E402


def traced(variants: dict, item, rounds: int, sessions: int) -> dict[str, dict]:
    """Per variant: each node's median own time (us) and the median traced step's wall time."""
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    times = {k: collections.defaultdict(list) for k in variants}
    walls = {k: [] for k in variants}
    per_session = math.ceil(rounds / sessions)
    done = 0
    while done < rounds:
        runners = {k: bench.Runner(v, item) for k, v in variants.items()}
        try:
            for r in runners.values():  # warm up: the first run allocates and lays out
                r.sess.run(r.fetches, r.feeds)
            for _ in range(min(per_session, rounds - done)):
                for k, r in runners.items():
                    meta = tf.compat.v1.RunMetadata()
                    t0 = time.perf_counter()
                    r.sess.run(r.fetches, r.feeds, options=options, run_metadata=meta)
                    walls[k].append((time.perf_counter() - t0) * 1e6)
                    for dev in meta.step_stats.dev_stats:
                        for ns in dev.node_stats:
                            times[k][ns.node_name].append(ns.op_end_rel_micros - ns.op_start_rel_micros)
                done += 1
        finally:
            for r in runners.values():
                r.close()
    return {k: {"nodes": {n: statistics.median(v) for n, v in times[k].items()},
                "wall_us": statistics.median(walls[k])} for k in variants}


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("items", nargs="+")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--sessions", type=int, default=3)
    args = ap.parse_args(argv)
    register()
    for name in resolve_items(args.items):
        item = corpus.build(name)
        plan = bench.optimal_bf16_for_this_cpu(item).graph_def
        got = traced({"f32": item.graph_def, "plan": plan}, item, args.rounds, args.sessions)
        f32, low = got["f32"]["nodes"], got["plan"]["nodes"]
        est = {k: amp_rewrite.estimate_node_times(g, target=bench.this_cpu_target(), precision="bfloat16",
                                                  variable_shapes=bench.variable_shapes(item)).get("", {})
               for k, g in (("f32", item.graph_def), ("plan", plan))}
        converted = {n for n, t in est["plan"].items() if t.precision == "low" and t.kind != "cast"}
        casts = {n for n, t in est["plan"].items() if t.kind == "cast"}

        def delta(nodes, table_f32, table_low, price=lambda t: t) -> float:
            return sum(price(table_low.get(n, 0.0)) - price(table_f32.get(n, 0.0)) for n in nodes)

        ns = lambda t: (t.ns + t.fixed_ns) / 1e3 if t else 0.0  # noqa: E731
        others = (set(f32) & set(low)) - converted
        row = {
            "name": name, "rounds": args.rounds,
            "wall_f32_ms": got["f32"]["wall_us"] / 1e3, "wall_plan_ms": got["plan"]["wall_us"] / 1e3,
            "wall_ratio": round(got["plan"]["wall_us"] / got["f32"]["wall_us"], 3),
            "sum_f32_ms": sum(f32.values()) / 1e3, "sum_plan_ms": sum(low.values()) / 1e3,
            "converted": len(converted), "casts": len(casts),
            "in_place_converted_ms": round(delta(converted, f32, low) / 1e3, 2),
            "in_place_casts_ms": round(sum(low.get(n, 0.0) for n in casts) / 1e3, 2),
            "in_place_others_ms": round(delta(others, f32, low) / 1e3, 2),
            "estimated_converted_ms": round(sum(ns(est["plan"].get(n)) - ns(est["f32"].get(n)) for n in converted) / 1e3, 2),
            "estimated_casts_ms": round(sum(ns(est["plan"][n]) for n in casts) / 1e3, 2),
            # The executor's two threads running the measured node times (makespan.py): what
            # the step would take if nodes overlapped as they can and cost only their own time.
            "makespan2_measured_ratio": round(makespan(plan, low, 2) / makespan(item.graph_def, f32, 2), 3),
        }
        by_op = collections.defaultdict(lambda: [0.0, 0.0, 0])
        ops = {n.name: n.op for n in item.graph_def.node}
        for n in converted:
            op = ops.get(n, "?")
            by_op[op][0] += (low.get(n, 0.0) - f32.get(n, 0.0)) / 1e3
            by_op[op][1] += (ns(est["plan"].get(n)) - ns(est["f32"].get(n))) / 1e3
            by_op[op][2] += 1
        row["by_op_ms_measured_estimated_nodes"] = {op: [round(a, 2), round(b, 2), c] for op, (a, b, c) in
                                                     sorted(by_op.items(), key=lambda kv: kv[1][1])}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
