"""Benchmarks: amp_rewrite side by side with TensorFlow's own pass, in one process.

Usage::

    python bench/bench.py            # full corpus, 7 repeats   (~30-60 min on 2 cores)
    python bench/bench.py --quick    # 3 models, 3 repeats      (~5 min)
    python bench/bench.py --scaling-only --sizes 1000,10000,100000,1000000

For every corpus graph (tests/corpus.py plus bench/models.py) it measures, interleaving the
variants and repeating (medians are reported; these machines are shared and noisy):

* rewrite time: TensorFlow's Grappler pass (virtual GPU 8.0) vs ours (``gpu:8.0``, float16,
  ``lists="tensorflow"``), the ratio, and our time per stage;
* quality: Cast count, bytes moved by Casts (static shapes), share of MatMul/Conv FLOPs in
  low precision, attributes converted -- TensorFlow vs ours (tensorflow lists) vs ours
  (default lists) vs the optimal planner (``lists="optimal"``);
* step time on this machine: float32 vs TensorFlow's rewrite vs ours, for bfloat16 on this
  CPU (TF's ``auto_mixed_precision_onednn_bfloat16`` vs ``target="cpu"``) and for the
  float16 graphs made for a GPU, executed here; plus the ceiling (every float op forced to
  float16, TensorFlow's ``UNSAFE_FORCE_ALL``); the optimal planner plans bfloat16 for this
  machine's CPU class (``target="auto"``).  Graphs run with Grappler on and its
  mixed-precision passes off;
* numerics: relative error of the outputs vs float32 for both rewrites.

Then synthetic graphs of growing size measure the scaling of each stage (time and peak
memory, each size in a fresh subprocess).  Results go to ``bench/RESULTS.md``,
``bench/results.json`` and PNG plots in ``bench/``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.protobuf import rewriter_config_pb2  # noqa: E402

import amp_rewrite  # noqa: E402
from amp_rewrite.targets import cpu_features  # noqa: E402
from models import ALL_MODELS, QUICK_MODELS, corpus, item_names  # noqa: E402
from tf_oracle import amp_cast_count, converted_type_attrs, tf_amp_rewrite  # noqa: E402

HALF = tf.float16.as_datatype_enum
BF16 = tf.bfloat16.as_datatype_enum


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


# --------------------------------------------------------------------------- machine


def machine_info() -> dict[str, Any]:
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    flags = sorted(f for f in cpu_features() if f.startswith(("avx512", "amx", "avx_ne", "avx2", "fma")))
    gpus = tf.config.list_physical_devices("GPU")
    return {
        "date": datetime.date.today().isoformat(),
        "cpu": model,
        "cores": os.cpu_count(),
        "cpu_flags": flags,
        "gpus": [tf.config.experimental.get_device_details(g) for g in gpus],
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "amp_rewrite": amp_rewrite.__version__,
        "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default (on)"),
    }


# --------------------------------------------------------------------------- quality


def _shapes(graph_def) -> dict[str, list[list[int] | None]]:
    """Static output shapes of every main-graph node (TF shape inference on import)."""
    g = tf.Graph()
    with g.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    out = {}
    for op in g.get_operations():
        out[op.name] = [t.shape.as_list() if t.shape.rank is not None else None for t in op.outputs]
    return out


def _numel(shape: list[int] | None) -> int | None:
    if shape is None or any(d is None for d in shape):
        return None
    return int(np.prod(shape)) if shape else 1


_SIZES = {tf.float32.as_datatype_enum: 4, HALF: 2, BF16: 2}


def quality(before, after, low: int) -> dict[str, Any]:
    """Cast count and bytes, converted attrs, low-precision share of MatMul/Conv FLOPs."""
    shapes = _shapes(after)
    new = {n.name for n in after.node} - {n.name for n in before.node}
    cast_bytes = 0
    unknown = 0
    for node in after.node:
        if node.name in new and node.op == "Cast":
            n = _numel(shapes.get(node.name, [None])[0])
            if n is None:
                unknown += 1
                continue
            cast_bytes += n * (_SIZES.get(node.attr["SrcT"].type, 4) + _SIZES.get(node.attr["DstT"].type, 4))
    flops_total = 0.0
    flops_low = 0.0
    for node in after.node:
        if node.op not in ("MatMul", "BatchMatMulV2", "Conv2D", "DepthwiseConv2dNative", "Einsum",
                           "Conv2DBackpropInput", "Conv2DBackpropFilter"):
            continue
        out_n = _numel(shapes.get(node.name, [None])[0])
        if out_n is None:
            continue
        # 2 * output elements * reduction length; the reduction length is read off input 1.
        src = node.input[1].split(":")[0] if len(node.input) > 1 else None
        k = 1
        if src and src in shapes and shapes[src][0] is not None:
            w = shapes[src][0]
            if node.op in ("Conv2D", "Conv2DBackpropInput"):
                k = int(np.prod(w[:3])) if len(w) == 4 and None not in w[:3] else 1
            elif node.op == "DepthwiseConv2dNative":
                k = int(np.prod(w[:2])) if len(w) == 4 and None not in w[:2] else 1
            elif w and w[-2 if len(w) > 1 else -1] is not None:
                k = int(w[-2] if len(w) > 1 else w[-1])
        flops = 2.0 * out_n * k
        flops_total += flops
        if node.attr["T"].type == low:
            flops_low += flops
    return {
        "casts": amp_cast_count(before, after),
        "cast_bytes": cast_bytes,
        "casts_unknown_shape": unknown,
        "converted_attrs": len(converted_type_attrs(before, after, to_dtype=low)),
        "low_flop_share": flops_low / flops_total if flops_total else None,
    }


# --------------------------------------------------------------------------- step time


class Runner:
    """Imports a graph once and times ``session.run`` of its fetches (Grappler on, AMP off)."""

    def __init__(self, graph_def, item) -> None:
        self.graph = tf.Graph()
        with self.graph.as_default():
            input_map = {}
            self.variables = []
            for ph_name, value in item.variables.items():
                var = tf.Variable(value, name=f"bench_var/{ph_name}")
                self.variables.append(var)
                input_map[f"{ph_name}:0"] = var.handle
            self.fetches = tf.graph_util.import_graph_def(
                graph_def, input_map=input_map or None,
                return_elements=[f"{f}:0" for f in item.fetches], name="",
            )
            init = tf.compat.v1.variables_initializer(self.variables)
            self.feeds = {self.graph.get_tensor_by_name(k): v for k, v in item.feeds.items()}
        config = tf.compat.v1.ConfigProto()
        # Grappler stays on, as users run it (constant folding removes Casts of constants,
        # the remapper fuses ops), with every mixed-precision pass off so nothing is
        # rewritten a second time.
        ro = config.graph_options.rewrite_options
        off = rewriter_config_pb2.RewriterConfig.OFF
        ro.auto_mixed_precision = off
        ro.auto_mixed_precision_onednn_bfloat16 = off
        ro.auto_mixed_precision_mkl = off
        ro.auto_mixed_precision_cpu = off
        config.intra_op_parallelism_threads = os.cpu_count() or 1
        self.sess = tf.compat.v1.Session(graph=self.graph, config=config)
        if self.variables:
            self.sess.run(init)
        self.sess.run(self.fetches, self.feeds)  # warm-up: kernel creation, oneDNN primitives

    def step(self) -> float:
        t = time.perf_counter()
        self.sess.run(self.fetches, self.feeds)
        return time.perf_counter() - t

    def close(self) -> None:
        self.sess.close()


def interleaved_step_times(graphs: dict[str, Any], item, repeats: int, iters: int,
                           budget_s: float = 0.0, max_repeats: int = 41) -> tuple[dict[str, float], int]:
    """Median seconds per step for each graph, measured round-robin, and the number of rounds.

    At least ``repeats`` rounds; fast graphs get more (up to ``max_repeats``), enough to fill
    about ``budget_s`` seconds, because their medians are the noisiest: a 10 ms step is hit
    harder by one descheduling than a 200 ms one.
    """
    runners = {}
    for name, gd in graphs.items():
        try:
            runners[name] = Runner(gd, item)
        except Exception as exc:  # noqa: BLE001 - a rewrite that cannot run is a result
            print(f"    {name}: cannot run here: {str(exc).splitlines()[0][:120]}", flush=True)
    samples: dict[str, list[float]] = {n: [] for n in runners}
    rounds, t0 = 0, time.perf_counter()
    while rounds < repeats or (rounds < max_repeats and time.perf_counter() - t0 < budget_s):
        for name, r in runners.items():
            samples[name].append(median([r.step() for _ in range(iters)]))
        rounds += 1
    for r in runners.values():
        r.close()
    return {n: median(s) for n, s in samples.items()}, rounds


def outputs(graph_def, item) -> list[np.ndarray] | None:
    try:
        return corpus.run(graph_def, item)
    except Exception:  # noqa: BLE001
        return None


def rel_error(got: list[np.ndarray] | None, ref: list[np.ndarray]) -> float | None:
    if got is None:
        return None
    errs = []
    for g, r in zip(got, ref):
        scale = max(float(np.max(np.abs(r))), 1e-6)
        errs.append(float(np.max(np.abs(g.astype(np.float64) - r))) / scale)
    return max(errs)


# --------------------------------------------------------------------------- per graph


def bench_item(name: str, repeats: int, iters: int, budget_s: float = 0.0) -> dict[str, Any]:
    t0 = time.perf_counter()
    item = corpus.build(name)
    gd = item.graph_def
    fetches = list(item.fetches)
    res: dict[str, Any] = {"name": name, "nodes": len(gd.node), "functions": len(gd.library.function),
                           "build_s": time.perf_counter() - t0}
    print(f"  {name}: {res['nodes']} nodes, built in {res['build_s']:.1f}s", flush=True)

    # Rewrite time, interleaved.
    ours_kw = dict(target="gpu:8.0", precision="float16", lists="tensorflow", fetches=fetches,
                   functions="reachable", use_env=False)
    tf_times, our_times, stages = [], [], []
    ref_gd = ours = None
    for _ in range(repeats):
        t = time.perf_counter()
        ref_gd = tf_amp_rewrite(gd, fetches)
        tf_times.append(time.perf_counter() - t)
        t = time.perf_counter()
        ours = amp_rewrite.rewrite_graph_def(gd, **ours_kw)
        our_times.append(time.perf_counter() - t)
        stages.append(ours.timings)
    res["rewrite_s"] = {"tensorflow": median(tf_times), "ours": median(our_times)}
    res["rewrite_s"]["ratio_ours_over_tf"] = res["rewrite_s"]["ours"] / res["rewrite_s"]["tensorflow"]
    res["stages_s"] = {k: median([s[k] for s in stages]) for k in stages[0]}

    default = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", fetches=fetches, use_env=False)
    optimal = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", fetches=fetches, use_env=False,
                                            lists="optimal")
    res["quality_fp16"] = {
        "tensorflow": quality(gd, ref_gd, HALF),
        "ours_tensorflow_lists": quality(gd, ours.graph_def, HALF),
        "ours_default": quality(gd, default.graph_def, HALF),
        "ours_optimal": quality(gd, optimal.graph_def, HALF),
    }
    placement = optimal.plans[""].placement
    res["optimal_fp16"] = {
        "placement": placement.as_dict() if placement is not None else None,
        "normalized": len(optimal.report.get("normalized", {})),
    }

    # This CPU: bfloat16 (TF's oneDNN bfloat16 mode vs target="cpu").
    tf_bf16 = tf_amp_rewrite(gd, fetches, mode="bf16")
    ours_bf16 = amp_rewrite.rewrite_graph_def(gd, target="cpu", precision="bfloat16", fetches=fetches,
                                              use_env=False).graph_def
    # The optimal planner's cost model is per device class: for the speed on *this* machine it
    # must plan for this CPU (target="auto"); "cpu" means "a CPU with AMX".
    opt_target = "auto" if amp_rewrite.resolve_target("auto").skip_reason("bfloat16") is None else "cpu"
    ours_opt_bf16 = amp_rewrite.rewrite_graph_def(gd, target=opt_target, precision="bfloat16",
                                                  fetches=fetches, use_env=False, lists="optimal").graph_def
    res["quality_bf16"] = {"tensorflow": quality(gd, tf_bf16, BF16), "ours_default": quality(gd, ours_bf16, BF16),
                           "ours_optimal": quality(gd, ours_opt_bf16, BF16)}
    force = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", fetches=fetches, use_env=False,
                                          lists="tensorflow", level="UNSAFE_FORCE_ALL").graph_def
    # --autotune: TensorFlow's lists, the default profile and the optimal planner, each
    # timed against float32 here (its own measurement, separate from the table's), fastest kept.
    def runner(graph):
        r = Runner(graph, item)
        return (lambda: r.sess.run(r.fetches, r.feeds)), r.close

    tuned = amp_rewrite.autotune(gd, fetches=fetches, runner=runner, target=opt_target, precision="bfloat16",
                                 use_env=False, repeats=max(3, repeats), steps=iters)
    res["autotune_bf16"] = {"choice": tuned.choice, "step_ms": dict(tuned.step_ms),
                            "rel_error": dict(tuned.rel_error), "same_as": dict(tuned.same_as)}
    variants = {
        "float32": gd,
        "tf_bf16": tf_bf16,
        "ours_bf16": ours_bf16,
        "ours_opt_bf16": ours_opt_bf16,
        "ours_auto_bf16": tuned.graph_def,
        "tf_fp16": ref_gd,
        "ours_fp16": default.graph_def,
        "ours_opt_fp16": optimal.graph_def,
        "force_all_fp16": force,
    }
    res["step_s"], res["step_rounds"] = interleaved_step_times(variants, item, repeats, iters, budget_s)
    base = res["step_s"].get("float32")
    res["speedup_vs_fp32"] = {k: base / v for k, v in res["step_s"].items() if base and v}

    ref = outputs(gd, item)
    if ref is not None:
        outs = {k: outputs(v, item) for k, v in variants.items() if k != "float32"}
        res["rel_error"] = {k: rel_error(o, ref) for k, o in outs.items()}
        if item.kind == "training":
            # The loss alone (the step's forward result).  The weights after one Adam step
            # move by about +-lr whatever a gradient entry's size, so near-zero entries flip
            # sign under any rounding: that part of rel_error measures the optimizer, not
            # the rewrite.
            res["loss_rel_error"] = {k: rel_error(o[:1] if o is not None else None, ref[:1])
                                     for k, o in outs.items()}
    print(f"    rewrite TF {res['rewrite_s']['tensorflow']*1e3:.0f} ms vs ours {res['rewrite_s']['ours']*1e3:.0f} ms; "
          f"step {json.dumps({k: round(v * 1e3, 2) for k, v in res['step_s'].items()})} ms", flush=True)
    return res


# --------------------------------------------------------------------------- scaling

_SCALING_CHILD = r"""
import json, resource, sys, time, os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
sys.path.insert(0, {root!r}); sys.path.insert(0, {here!r})
from synthetic import synthetic_graph
import amp_rewrite
def hwm_kb():
    # VmHWM: this process's peak RSS.  (ru_maxrss survives exec, so after a fork from a big
    # parent it reports the parent's peak.)
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
n = int(sys.argv[1])
gd = synthetic_graph(n, seed=0)
rss0 = hwm_kb()
t = time.perf_counter()
r = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", use_env=False)
total = time.perf_counter() - t
rss1 = hwm_kb()
print(json.dumps({{"nodes": len(gd.node), "total_s": total, "stages_s": dict(r.timings),
                  "peak_rss_mb": rss1 / 1024, "rss_growth_mb": (rss1 - rss0) / 1024,
                  "converted": r.report["converted_nodes"], "casts": r.report["casts_to_low"] + r.report["casts_to_high"]}}))
"""


def scaling(sizes: list[int], timeout: int) -> list[dict[str, Any]]:
    code = _SCALING_CHILD.format(root=os.path.join(HERE, ".."), here=HERE)
    rows = []
    for n in sizes:
        print(f"  scaling: {n} nodes", flush=True)
        try:
            out = subprocess.run([sys.executable, "-c", code, str(n)], capture_output=True, text=True,
                                 timeout=timeout, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["us_per_node"] = row["total_s"] / row["nodes"] * 1e6
            rows.append(row)
            print(f"    {row['total_s']:.1f}s, {row['us_per_node']:.1f} us/node, peak RSS {row['peak_rss_mb']:.0f} MB",
                  flush=True)
        except subprocess.TimeoutExpired:
            rows.append({"nodes": n, "error": f"timed out after {timeout}s"})
        except subprocess.CalledProcessError as exc:
            rows.append({"nodes": n, "error": exc.stderr.strip().splitlines()[-1][:300]})
    return rows


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 models, 3 repeats, sizes up to 100k")
    ap.add_argument("--models", help="comma-separated model names (default: all, or the quick set)")
    ap.add_argument("--repeats", type=int)
    ap.add_argument("--iters", type=int, default=5, help="steps per timing sample")
    ap.add_argument("--budget", type=float, default=30.0,
                    help="seconds of step timing per graph: fast graphs get more rounds than --repeats")
    ap.add_argument("--sizes", help="scaling sizes, comma-separated")
    ap.add_argument("--scaling-only", action="store_true")
    ap.add_argument("--no-scaling", action="store_true")
    ap.add_argument("--out", default=HERE)
    args = ap.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 7)
    models = tuple(args.models.split(",")) if args.models else (QUICK_MODELS if args.quick else ALL_MODELS)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else (
        [1000, 10000, 100000] if args.quick else [1000, 10000, 100000, 1000000])

    results: dict[str, Any] = {"machine": machine_info(), "repeats": repeats, "iters": args.iters,
                               "budget_s": args.budget, "quick": args.quick}
    print(json.dumps(results["machine"]), flush=True)
    if not args.scaling_only:
        results["graphs"] = []
        for name in item_names(models):
            results["graphs"].append(bench_item(name, repeats, args.iters, args.budget))
    if not args.no_scaling:
        results["scaling"] = scaling(sizes, timeout=1800)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    from report import write_report

    write_report(results, args.out)
    print(f"wrote {args.out}/RESULTS.md, results.json and plots", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
