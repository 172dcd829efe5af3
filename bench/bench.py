"""Benchmarks: amp_rewrite side by side with TensorFlow's own pass, in one process.

Usage::

    python bench/bench.py            # full corpus, 7 repeats   (~30-60 min on 2 cores)
    python bench/bench.py --quick    # 3 models, 3 repeats      (~5 min)
    python bench/bench.py --scaling-only --sizes 1000,10000,100000,1000000
    python bench/bench.py --scaling-only --sizes none --optimal-sizes 50000,100000,200000,400000

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
* numerics: relative error of the outputs vs float32 for every variant, as the median over
  ``--numerics-batches`` input batches (one batch's error on a batch-2 training loss swings
  by two orders of magnitude with the input).

Every step-time measurement includes an A/A control, the float32 graph timed a second time
in its own session (``float32_again``): its distance from ``float32`` is the graph's noise in
that run.  Each graph is benchmarked in a fresh process, so memory one graph's sessions keep
cannot starve the next, and its step times are spread over ``--processes`` fresh processes of
their own (a ratio between two graphs depends on the process that times them).

Then synthetic graphs of growing size measure the scaling of each stage (time and peak
memory, each size in a fresh subprocess): residual MLP blocks with the greedy planner
(``--sizes``), and one long free chain with the optimal planner (``--optimal-sizes``), whose
minimum cut is timed on its own (seconds per node should stay flat).  Results go to ``bench/RESULTS.md``,
``bench/results.json`` and PNG plots in ``bench/``.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from typing import Any, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# TensorFlow's bfloat16 column is its oneDNN pass, which exists only while oneDNN is on, and
# TensorFlow turns oneDNN on by default only on CPUs with AVX512-VNNI/BF16 or AMX.  Pinned on
# (unless set) so every machine runs the same comparison; machine_info records the state.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import amp_rewrite  # noqa: E402
from amp_rewrite.autotune import session_config  # noqa: E402
from amp_rewrite.plan.targets import cpu_features  # noqa: E402
from models import (ALL_MODELS, QUICK_MODELS, add_model_options, apply_model_options, corpus,  # noqa: E402
                    item_names, resolve_items)
from tf_oracle import (  # noqa: E402
    amp_cast_count,
    converted_type_attrs,
    onednn_bf16_pass_available,
    tf_amp_rewrite,
)

HALF = tf.float16.as_datatype_enum
BF16 = tf.bfloat16.as_datatype_enum
_KERNEL_LABEL = re.compile(r"[^=]*= (\S+?)\(")


def kernel_name(node_stats: Any) -> str:
    """The kernel a step-stats entry ran, from its timeline label (``"name = _MklNativeFusedConv2D(...)"``
    -> ``"_MklNativeFusedConv2D"``), or ``""`` where the label names none.  The calibration tools
    read Grappler's and oneDNN's fusions from it."""
    m = _KERNEL_LABEL.match(node_stats.timeline_label)
    return m.group(1) if m else ""


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
        "onednn": "on" if _onednn_enabled() else "off",
    }


def _onednn_enabled() -> bool:
    """Whether this TensorFlow runs with oneDNN (what TF_ENABLE_ONEDNN_OPTS and the CPU made of it)."""
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


# --------------------------------------------------------------------------- quality


def _shapes(graph_def, item=None) -> dict[str, list[list[int] | None]]:
    """Static output shapes of every main-graph node (TF shape inference on import).

    A training item's variables are captured resource placeholders, which carry no shape in
    the GraphDef; they are mapped to variables of the stored values (as ``Runner`` does), so
    the reads of weights and optimizer slots, and the Casts of them, get their real shapes.
    """
    g = tf.Graph()
    with g.as_default():
        input_map = {}
        for ph_name, value in (item.variables.items() if item is not None else ()):
            # A bare handle: shape inference needs only its dtype and shape, not the values.
            input_map[f"{ph_name}:0"] = tf.raw_ops.VarHandleOp(
                dtype=tf.as_dtype(value.dtype), shape=value.shape, shared_name=f"bench_var/{ph_name}")
        tf.graph_util.import_graph_def(graph_def, input_map=input_map or None, name="")
    out = {}
    for op in g.get_operations():
        out[op.name] = [t.shape.as_list() if t.shape.rank is not None else None for t in op.outputs]
    return out


def _numel(shape: list[int] | None) -> int | None:
    if shape is None or any(d is None for d in shape):
        return None
    return int(np.prod(shape)) if shape else 1


_SIZES = {tf.float32.as_datatype_enum: 4, HALF: 2, BF16: 2}


def quality(before, after, low: int, item=None) -> dict[str, Any]:
    """Cast count and bytes, converted attrs, low-precision share of MatMul/Conv FLOPs.

    ``item`` (the corpus entry) supplies the variables' shapes of a training graph.
    """
    shapes = _shapes(after, item)
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


def _variables(item) -> tuple[dict[str, Any], dict[str, Any], Any, dict[Any, np.ndarray]]:
    """Variables for ``item``'s captured resource placeholders, in the current graph.

    Returns (variables by placeholder name, the import ``input_map``, the initializer and the
    feed that initializes them).  The initial values are fed through placeholders rather than
    embedded as constants: a training graph's weights and optimizer slots (about 0.5 GB for
    VGG16 with Adam) would otherwise be copied into every imported graph.
    """
    variables, input_map, feed = {}, {}, {}
    for ph_name, value in item.variables.items():
        init_ph = tf.compat.v1.placeholder(tf.as_dtype(value.dtype), value.shape)
        var = tf.Variable(init_ph, name=f"bench_var/{ph_name}".replace(":", "_"))
        variables[ph_name] = var
        input_map[f"{ph_name}:0"] = var.handle
        feed[init_ph] = value
    return variables, input_map, tf.compat.v1.variables_initializer(list(variables.values())), feed


class Runner:
    """Imports a graph once and times ``session.run`` of its fetches (Grappler on, AMP off)."""

    def __init__(self, graph_def, item) -> None:
        self.graph = tf.Graph()
        with self.graph.as_default():
            variables, input_map, init, self._init_feed = _variables(item)
            self.variables = list(variables.values())
            self.fetches = tf.graph_util.import_graph_def(
                graph_def, input_map=input_map or None,
                return_elements=[f"{f}:0" for f in item.fetches], name="",
            )
            self.feeds = {self.graph.get_tensor_by_name(k): v for k, v in item.feeds.items()}
        # Grappler on, every mixed-precision pass off: as users run a rewritten graph.
        config = session_config()
        config.intra_op_parallelism_threads = os.cpu_count() or 1
        self.sess = tf.compat.v1.Session(graph=self.graph, config=config)
        if self.variables:
            self.sess.run(init, self._init_feed)
        self.sess.run(self.fetches, self.feeds)  # warm-up: kernel creation, oneDNN primitives

    def step(self) -> float:
        t = time.perf_counter()
        self.sess.run(self.fetches, self.feeds)
        return time.perf_counter() - t

    def close(self) -> None:
        self.sess.close()


def _interleaved_samples(graphs: dict[str, Any], item, repeats: int, iters: int, budget_s: float,
                         max_repeats: int, sessions: int) -> tuple[dict[str, list[float]], set[str], int]:
    """The rounds of :func:`interleaved_step_times`: every graph's per-round median seconds per
    step, the graphs that could not run, and the number of rounds."""
    names = list(graphs)
    samples: dict[str, list[float]] = {n: [] for n in names}
    failed: set[str] = set()
    rounds, total, per_session = 0, repeats, repeats
    while rounds < total:
        runners = {}
        for name in names:
            if name in failed:
                continue
            try:
                runners[name] = Runner(graphs[name], item)
            except Exception as exc:  # noqa: BLE001 - a rewrite that cannot run is a result
                print(f"    {name}: cannot run here: {str(exc).splitlines()[0][:120]}", flush=True)
                failed.add(name)
        t0, start = time.perf_counter(), rounds
        while rounds < total and rounds - start < per_session:
            for name, r in runners.items():
                samples[name].append(median([r.step() for _ in range(iters)]))
            rounds += 1
            if rounds == 1:
                # One round's length decides how many rounds fill the budget.
                per_round = time.perf_counter() - t0
                total = min(max_repeats, max(repeats, int(budget_s / max(per_round, 1e-9)) + 1))
                per_session = math.ceil(total / sessions)
        for r in runners.values():
            r.close()
        runners.clear()
        gc.collect()  # sessions and graphs hold reference cycles; a big training graph is GBs
    return samples, failed, rounds


def interleaved_step_times(graphs: dict[str, Any], item, repeats: int, iters: int,
                           budget_s: float = 0.0, max_repeats: int = 41,
                           sessions: int = 3) -> tuple[dict[str, float], int]:
    """Median seconds per step for each graph, measured round-robin, and the number of rounds.

    At least ``repeats`` rounds; fast graphs get more (up to ``max_repeats``), enough to fill
    about ``budget_s`` seconds, because their medians are the noisiest: a 10 ms step is hit
    harder by one descheduling than a 200 ms one.  The first round's length sets the count.

    The rounds are spread over ``sessions`` sets of fresh sessions: a graph's speed depends
    on the session it runs in, for that session's whole life (DenseNet121's training step ran
    87-102 ms per step in four sessions of one process), which rounds within one session
    cannot average out.  It also depends on the process (:func:`step_times_in_processes`).
    """
    samples, failed, rounds = _interleaved_samples(graphs, item, repeats, iters, budget_s, max_repeats, sessions)
    return {n: median(v) for n, v in samples.items() if n not in failed}, rounds


def step_times_in_processes(graphs: dict[str, Any], item, repeats: int, iters: int, budget_s: float = 0.0,
                            max_repeats: int = 41, processes: int = 3, sessions: int = 3) -> dict[str, Any]:
    """:func:`interleaved_step_times` spread over ``processes`` fresh processes, one set of
    sessions each, each with its share of the rounds and of the budget.

    Why processes: a ratio between two graphs also depends on the process that times them,
    for its whole life.  The same pair of ResNet50 training plans measured 1.028 in one
    process and 0.894-0.945 in four others, each with a small A/A gap of its own
    (``bench/cpu_runs/2026-11-27-wide``), though each process spread its rounds over three
    sets of fresh sessions.

    Returns ``median_s`` (each graph's median over every round of every process), ``rounds``
    (in all), ``processes`` and ``by_process`` (each process's medians, to show the spread).
    A graph that failed in any process is left out.  ``processes`` <= 1 times in this process,
    in ``sessions`` sets of fresh sessions.  The graphs, the item's feeds and variables are handed to
    the children in a temporary file this function writes and removes; mutates nothing.
    """
    if processes <= 1:
        times, rounds = interleaved_step_times(graphs, item, repeats, iters, budget_s, max_repeats, sessions=sessions)
        return {"median_s": times, "rounds": rounds, "processes": 1, "by_process": [times]}
    import pickle
    import tempfile

    job = {"graphs": {k: g.SerializeToString() for k, g in graphs.items()},
           "feeds": dict(item.feeds), "fetches": list(item.fetches), "variables": dict(item.variables),
           "repeats": math.ceil(repeats / processes), "iters": iters, "budget_s": budget_s / processes,
           "max_repeats": math.ceil(max_repeats / processes)}
    pooled: dict[str, list[float]] = {k: [] for k in graphs}
    failed: set[str] = set()
    by_process: list[dict[str, float]] = []
    rounds = 0
    with tempfile.TemporaryDirectory() as tmp:
        job_path, out_path = os.path.join(tmp, "job.pickle"), os.path.join(tmp, "samples.json")
        with open(job_path, "wb") as f:
            pickle.dump(job, f)  # our own data, read back only by this script's child
        for i in range(processes):
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--time-job", job_path,
                                   "--time-out", out_path])
            if proc.returncode != 0 or not os.path.exists(out_path):
                raise RuntimeError(f"timing process {i + 1} of {processes} failed (exit code {proc.returncode})")
            with open(out_path) as f:
                got = json.load(f)
            os.remove(out_path)
            failed.update(got["failed"])
            rounds += got["rounds"]
            for k, v in got["samples"].items():
                pooled[k].extend(v)
            by_process.append({k: median(v) for k, v in got["samples"].items() if v and k not in got["failed"]})
    medians = {k: median(v) for k, v in pooled.items() if v and k not in failed}
    by_process = [{k: v for k, v in p.items() if k not in failed} for p in by_process]
    return {"median_s": medians, "rounds": rounds, "processes": processes, "by_process": by_process}


def _time_job(job_path: str, out_path: str) -> None:
    """The child of :func:`step_times_in_processes`: time the job's graphs, write the samples."""
    import pickle
    from types import SimpleNamespace

    with open(job_path, "rb") as f:
        job = pickle.load(f)
    graphs = {}
    for k, data in job["graphs"].items():
        g = tf.compat.v1.GraphDef()
        g.ParseFromString(data)
        graphs[k] = g
    item = SimpleNamespace(feeds=job["feeds"], fetches=job["fetches"], variables=job["variables"])
    samples, failed, rounds = _interleaved_samples(graphs, item, job["repeats"], job["iters"], job["budget_s"],
                                                   job["max_repeats"], sessions=1)
    with open(out_path, "w") as f:
        json.dump({"samples": samples, "failed": sorted(failed), "rounds": rounds}, f)


def input_batches(item, count: int) -> list[dict[str, np.ndarray]]:
    """``count`` feed dicts for ``item``: its own feeds first, then fresh random batches.

    Only the model input ``x:0`` and the labels ``y:0`` change; captured constants stay.  An
    input of whole numbers (token ids) gets whole numbers in its range, anything else a
    standard normal; labels are classes in ``[0, NUM_CLASSES)``.  Seeded, so every variant
    sees the same batches.
    """
    batches = [dict(item.feeds)]
    for i in range(1, count):
        rng = np.random.RandomState(10_000 + i)
        feeds = dict(item.feeds)
        x = item.feeds.get("x:0")
        if x is not None:
            if np.all(np.mod(x, 1) == 0):
                feeds["x:0"] = rng.randint(int(x.min()), int(x.max()) + 1, size=x.shape).astype(x.dtype)
            else:
                feeds["x:0"] = rng.standard_normal(x.shape).astype(x.dtype)
        y = item.feeds.get("y:0")
        if y is not None:
            feeds["y:0"] = rng.randint(0, corpus.NUM_CLASSES, size=y.shape).astype(y.dtype)
        batches.append(feeds)
    return batches


def rounded_inputs(batches: list[dict[str, np.ndarray]], dtype) -> list[dict[str, np.ndarray]] | None:
    """``batches`` with the model input ``x:0`` rounded to ``dtype`` and back to its own
    type, or ``None`` when there is nothing to round (an input of whole numbers in every
    batch, such as token ids or pixel values, which feed lookups and rescaling that no
    rewrite converts; rounding an id above 256 to bfloat16 would pick a different token).

    Only ``x:0``: the other feeds (labels, a training graph's captured constants) are not
    activations a rewrite casts.
    """
    if all("x:0" not in feeds or feeds["x:0"].dtype.kind != "f" or np.all(np.mod(feeds["x:0"], 1) == 0)
           for feeds in batches):
        return None
    return [{k: tf.cast(tf.cast(v, dtype), v.dtype).numpy() if k == "x:0" and v.dtype.kind == "f" else v
             for k, v in feeds.items()} for feeds in batches]


def floor_errors(graph_def, item, batches: list[dict[str, np.ndarray]], ref: list[list[np.ndarray]]
                 ) -> dict[str, tuple[list[float | None] | None, list[float | None] | None]]:
    """The numerics floor: per batch, the error of the float32 graph run with its input
    rounded to bfloat16 (``f32_inputs_bf16``) and to float16 (``f32_inputs_fp16``) against
    ``ref``, the float32 outputs on the original inputs.  It measures how strongly the outputs
    react to a perturbation of the size that precision's rounding makes, a yardstick for the
    rewrites' errors (not a bound: a rewrite also rounds inside the graph).  Each value is
    ``(every output, the loss only)``; ``(None, None)`` where the graph could not run or the
    input has nothing to round.  Reads only.
    """
    out = {}
    for k, dtype in (("f32_inputs_bf16", tf.bfloat16), ("f32_inputs_fp16", tf.float16)):
        rounded = rounded_inputs(batches, dtype)
        got = None if rounded is None else outputs(graph_def, item, rounded)
        out[k] = (None, None) if got is None else (
            [rel_error(o, r) for o, r in zip(got, ref)], [rel_error(o[:1], r[:1]) for o, r in zip(got, ref)])
    return out


def median_error(errors: list[float | None] | None) -> float | None:
    """The median of per-batch errors, with NaN counted as the worst (``statistics.median``
    of a list holding NaN depends on the list's order)."""
    if not errors:
        return None
    return median([math.inf if e is None or math.isnan(e) else e for e in errors])


def nonfinite_count(errors: list[float | None] | None) -> int:
    """Batches whose error is not a finite number (an output overflowed or became NaN): a
    median cannot show them, so they are reported next to it."""
    return sum(1 for e in errors or () if e is None or not math.isfinite(e))


def outputs(graph_def, item, batches: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]] | None:
    """What ``corpus.run`` returns, for each feed dict of ``batches``: the graph is imported
    once and the variables are reset to their stored values before every batch, so each
    training step starts from the same weights.  ``None`` when the graph cannot run here.
    """
    try:
        g = tf.Graph()
        with g.as_default():
            variables, input_map, init, init_feed = _variables(item)
            fetched = tf.graph_util.import_graph_def(
                graph_def, input_map=input_map or None, return_elements=[f"{f}:0" for f in item.fetches], name="")
            reads = [variables[w].read_value() for w in item.watch]
        results = []
        with tf.compat.v1.Session(graph=g, config=corpus._session_config()) as sess:
            for feeds in batches:
                if variables:
                    sess.run(init, init_feed)
                values = list(sess.run(fetched, {g.get_tensor_by_name(k): v for k, v in feeds.items()}))
                if reads:
                    values += list(sess.run(reads))
                results.append([np.asarray(v) for v in values])
        return results
    except Exception:  # noqa: BLE001 - a rewrite that cannot run is a result
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


def variable_shapes(item) -> dict[str, Any]:
    """The shapes of ``item``'s stored variables, by resource placeholder: what the planners are
    told about a training graph (as the tf.function training path tells them its captures')."""
    return {ph: value.shape for ph, value in item.variables.items()}


def this_cpu_target() -> str:
    """The target that plans for *this* machine: ``"auto"`` (its own cost class) where it runs
    bfloat16, else ``"cpu"`` (a CPU with AMX), so that a machine without bfloat16 still gets a
    converted graph to time rather than the float32 graph under another name."""
    return "auto" if amp_rewrite.resolve_target("auto").skip_reason("bfloat16") is None else "cpu"


def optimal_bf16_for_this_cpu(item, **options: Any) -> Any:
    """The optimal planner's bfloat16 rewrite of ``item`` (a ``tests.corpus`` item), planned for
    this machine's class and told the variables' shapes; ``options`` go to ``rewrite_graph_def``
    (e.g. ``price_step=True``).  Returns its ``RewriteResult``; mutates nothing."""
    return amp_rewrite.rewrite_graph_def(item.graph_def, target=this_cpu_target(), precision="bfloat16",
                                         fetches=list(item.fetches), use_env=False, lists="optimal",
                                         variable_shapes=variable_shapes(item), **options)


def bf16_rewrites(item) -> dict[str, Any]:
    """The bfloat16 rewrites of ``item`` that ``bench.py`` times on this CPU, by column:
    TensorFlow's oneDNN pass (``tf_bf16``), the default profile for a CPU (``ours_bf16``) and
    the optimal planner for this CPU's class (``ours_opt_bf16``).  Reads ``item`` only."""
    gd, fetches = item.graph_def, list(item.fetches)
    return {"tf_bf16": tf_amp_rewrite(gd, fetches, mode="bf16"),
            "ours_bf16": amp_rewrite.rewrite_graph_def(gd, target="cpu", precision="bfloat16", fetches=fetches,
                                                       use_env=False, variable_shapes=variable_shapes(item)).graph_def,
            # The optimal planner's cost model is per device class: for the speed on *this*
            # machine it must plan for this CPU's class, not "cpu" (a CPU with AMX).
            "ours_opt_bf16": optimal_bf16_for_this_cpu(item).graph_def}


def fp16_rewrites(item) -> dict[str, Any]:
    """Our float16 rewrites of ``item`` for a GPU 8.0 that ``bench.py`` compares with
    TensorFlow's pass, by column, as :class:`amp_rewrite.RewriteResult`: the default profile's
    (``ours_fp16``) and the optimal planner's (``ours_opt_fp16``).  The variables' shapes are
    given, as the ``tf.function`` training path gives them.  Reads ``item`` only."""
    gd, fetches = item.graph_def, list(item.fetches)
    kw = dict(target="gpu:8.0", fetches=fetches, use_env=False, variable_shapes=variable_shapes(item))
    return {"ours_fp16": amp_rewrite.rewrite_graph_def(gd, **kw),
            "ours_opt_fp16": amp_rewrite.rewrite_graph_def(gd, lists="optimal", **kw)}


def estimated_step_ns(item, graph_def) -> float:
    """The cost model's time (ns) of one step of ``graph_def``, a graph of ``item``, priced for
    this CPU's class in bfloat16 with the item's variable shapes, running what its fetches
    need.  Raises :class:`amp_rewrite.AmpRewriteError` where it cannot be priced; reads its
    inputs only."""
    return amp_rewrite.estimate_step_time(graph_def, target=this_cpu_target(), precision="bfloat16",
                                          variable_shapes=variable_shapes(item),
                                          fetches=list(item.fetches)).total_ns


def estimated_ratios(item, graphs: dict[str, Any]) -> dict[str, float | None]:
    """The cost model's whole-step time of each of ``graphs`` (label -> GraphDef) over the
    float32 graph's, priced for this CPU's class in bfloat16
    (:func:`amp_rewrite.estimate_step_time`, with the item's variable shapes), every graph
    alike: what the planner expected, to set beside what the table measured.  ``None`` where
    a graph cannot be priced.  Mutates nothing."""
    def priced(graph_def) -> float | None:
        try:
            return estimated_step_ns(item, graph_def)
        except amp_rewrite.AmpRewriteError as exc:
            print(f"    cannot price: {exc}", flush=True)
            return None

    base = priced(item.graph_def)
    out: dict[str, float | None] = {}
    for label, graph_def in graphs.items():
        ns = priced(graph_def)
        out[label] = ns / base if ns is not None and base else None
    return out


def plan_summary(result: Any, low: str = "bfloat16") -> dict[str, Any]:
    """What a rewrite did, in three numbers: ``low_nodes`` (nodes it runs in ``low``),
    ``casts`` (both ways) and ``est_ratio`` (its estimated step time over the graph's as
    given; ``None`` unless it was asked to ``price_step``).  Reads ``result`` only."""
    est = result.step_estimates
    return {"low_nodes": sum(1 for n in result.report["nodes"].values() if n.get("dtype") == low),
            "casts": result.report["casts_to_low"] + result.report["casts_to_high"],
            "est_ratio": est.rewritten.total_ns / est.given.total_ns if est else None}


def ab_plans(item, plans: dict[str, Any], *, numerics: bool = False, timing: bool = True,
             repeats: int = 12, iters: int = 3, processes: int = 3) -> dict[str, Any]:
    """An A/B of rewritten graphs of ``item`` against its float32 graph: ``plans`` maps labels
    to GraphDefs (not ``"float32"``, which is the item's own).  ``numerics``: each plan's
    median error of the first output (a training step's loss) against float32 over the 16
    batches ``bench.py`` uses, as ``rel_error``.  ``timing``: float32, every plan and float32
    again, interleaved, the rounds spread over ``processes`` fresh processes
    (:func:`step_times_in_processes`; one process alone can rank two plans the wrong way), as
    ratios to float32 (``measured``, where ``float32_again`` is the A/A control), each
    process's own ratios (``measured_by_process``), ms per step (``ms``) and ``rounds``.
    Prints each result as it comes; mutates nothing."""
    out: dict[str, Any] = {}
    if numerics:
        batches = input_batches(item, 16)
        ref = outputs(item.graph_def, item, batches)
        out["rel_error"] = {label: median_error([rel_error(o[:1], r[:1]) for o, r in
                                                 zip(outputs(graph, item, batches), ref)])
                            for label, graph in plans.items()}
        print("  error", out["rel_error"], flush=True)
    if timing:
        graphs = {"float32": item.graph_def, **plans, "float32_again": item.graph_def}
        timed = step_times_in_processes(graphs, item, repeats, iters, processes=processes)
        times = timed["median_s"]
        out["measured"] = {k: v / times["float32"] for k, v in times.items()}
        out["measured_by_process"] = [{k: v / p["float32"] for k, v in p.items()} for p in timed["by_process"]]
        out["ms"] = {k: v * 1e3 for k, v in times.items()}
        out["rounds"] = rounds = timed["rounds"]
        print("  measured", {k: round(v, 3) for k, v in out["measured"].items()}, rounds, flush=True)
    return out


def ab_cost_classes(name: str, item, classes: dict[str, Any], class_name: str, **ab: Any) -> dict[str, Any]:
    """Versions of one device class compared on corpus item ``name`` (built as ``item``): each
    label of ``classes`` (a :class:`~amp_rewrite.plan.cost_model.DeviceCosts`) plans the optimal
    bfloat16 rewrite for this CPU (:func:`optimal_bf16_for_this_cpu`, step priced) with that
    class in place of the class named ``class_name``.  Returns each label's
    :func:`plan_summary`, ``same_plan`` (every rewritten graph byte-identical), and, where they
    differ, :func:`ab_plans` of the rewritten graphs with ``ab``'s options.  The class table is
    restored whatever happens; prints each result as it comes."""
    from amp_rewrite.plan import cost_model

    saved = cost_model.DEVICE_COSTS[class_name]
    out: dict[str, Any] = {}
    graphs: dict[str, Any] = {}
    try:
        for label, costs in classes.items():
            cost_model.DEVICE_COSTS[class_name] = costs
            result = optimal_bf16_for_this_cpu(item, price_step=True)
            out[label] = plan_summary(result)
            graphs[label] = result.graph_def
    finally:
        cost_model.DEVICE_COSTS[class_name] = saved
    out["same_plan"] = len({g.SerializeToString(deterministic=True) for g in graphs.values()}) == 1
    print(name, out, flush=True)
    if not out["same_plan"]:
        out.update(ab_plans(item, graphs, **ab))
    return out


def bench_item(name: str, repeats: int, iters: int, budget_s: float = 0.0,
               numerics_batches: int = 16, sessions: int = 3, processes: int = 3) -> dict[str, Any]:
    """Everything ``bench.py`` measures of corpus graph ``name``.  ``sessions``: the sets of
    fresh sessions autotune's own measurement is spread over (and the table's, with one
    process); ``processes``: the fresh processes the table's step times are spread over
    (:func:`step_times_in_processes`)."""
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

    # A training graph's variables are resource placeholders without shapes; the cost-aware
    # planner is told them, as the tf.function training path tells it (TF's pass is not: it
    # has no use for them).
    vs = variable_shapes(item)
    fp16 = fp16_rewrites(item)
    default, optimal = fp16["ours_fp16"], fp16["ours_opt_fp16"]
    res["quality_fp16"] = {
        "tensorflow": quality(gd, ref_gd, HALF, item),
        "ours_tensorflow_lists": quality(gd, ours.graph_def, HALF, item),
        "ours_default": quality(gd, default.graph_def, HALF, item),
        "ours_optimal": quality(gd, optimal.graph_def, HALF, item),
    }
    placement = optimal.plans[""].placement
    res["optimal_fp16"] = {
        "placement": placement.as_dict() if placement is not None else None,
        "normalized": len(optimal.report.get("normalized", {})),
    }

    # This CPU: bfloat16 (TF's oneDNN bfloat16 mode vs target="cpu").
    bf16 = bf16_rewrites(item)
    tf_bf16, ours_bf16, ours_opt_bf16 = bf16["tf_bf16"], bf16["ours_bf16"], bf16["ours_opt_bf16"]
    res["quality_bf16"] = {"tensorflow": quality(gd, tf_bf16, BF16, item), "ours_default": quality(gd, ours_bf16, BF16, item),
                           "ours_optimal": quality(gd, ours_opt_bf16, BF16, item)}
    force = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", fetches=fetches, use_env=False,
                                          lists="tensorflow", level="UNSAFE_FORCE_ALL").graph_def
    # --autotune: TensorFlow's lists, the default profile and the optimal planner, each
    # timed against float32 here (its own measurement, separate from the table's), fastest kept.
    def runner(graph):
        r = Runner(graph, item)
        return (lambda: r.sess.run(r.fetches, r.feeds)), r.close

    tuned = amp_rewrite.autotune(gd, fetches=fetches, runner=runner, target=this_cpu_target(), precision="bfloat16",
                                 use_env=False, repeats=max(3, repeats), steps=iters, variable_shapes=vs,
                                 sessions=sessions)
    res["autotune_bf16"] = {"choice": tuned.choice, "step_ms": dict(tuned.step_ms),
                            "rel_error": dict(tuned.rel_error), "same_as": dict(tuned.same_as),
                            "ratio_to_float32": dict(tuned.ratio_to_float32), "faster_rounds": dict(tuned.wins),
                            "rounds": tuned.rounds, "sessions": tuned.sessions}
    variants = {
        "float32": gd,
        # A/A control: float32 again, in its own session, timed in the same rounds.  How far
        # it lands from "float32" is this graph's measured noise in this run.
        "float32_again": gd,
        "tf_bf16": tf_bf16,
        "ours_bf16": ours_bf16,
        "ours_opt_bf16": ours_opt_bf16,
        "ours_auto_bf16": tuned.graph_def,
        "tf_fp16": ref_gd,
        "ours_fp16": default.graph_def,
        "ours_opt_fp16": optimal.graph_def,
        "force_all_fp16": force,
    }
    # A rewrite that changed nothing *is* the float32 graph: its gap to float32 in the timings
    # is the noise of timing one graph twice (the report judges it so).
    f32_bytes = gd.SerializeToString(deterministic=True)
    res["same_as_float32"] = sorted(k for k, v in variants.items() if k not in ("float32", "float32_again")
                                    and v.SerializeToString(deterministic=True) == f32_bytes)
    # What the cost model expected of each bfloat16 rewrite on this CPU, beside what is measured.
    res["estimated_bf16"] = estimated_ratios(item, bf16)
    timed = step_times_in_processes(variants, item, repeats, iters, budget_s, processes=processes, sessions=sessions)
    res["step_s"], res["step_rounds"], res["step_processes"] = timed["median_s"], timed["rounds"], timed["processes"]
    res["step_s_by_process"] = timed["by_process"]
    base = res["step_s"].get("float32")
    res["speedup_vs_fp32"] = {k: base / v for k, v in res["step_s"].items() if base and v}

    # Numerics over several input batches: at batch 2, batch normalization in a training step
    # normalizes over a handful of values, so one batch's loss error swings 10-100x with the
    # input (measured); the median over batches is what the goal is held to.
    batches = input_batches(item, numerics_batches)
    ref = outputs(gd, item, batches)
    if ref is not None:
        res["numerics_batches"] = len(batches)
        res["rel_error_batches"], res["loss_rel_error_batches"] = {}, {}
        for k, v in variants.items():
            if k in ("float32", "float32_again"):
                continue
            every, loss = column_errors(v, item, batches, ref)
            res["rel_error_batches"][k] = every
            if every is not None and loss is not None:
                res["loss_rel_error_batches"][k] = loss
        for k, (every, loss) in floor_errors(gd, item, batches, ref).items():
            res["rel_error_batches"][k] = every
            if item.kind == "training":
                res["loss_rel_error_batches"][k] = loss
        res["rel_error"] = {k: median_error(e) for k, e in res["rel_error_batches"].items()}
        res["nonfinite_batches"] = {k: nonfinite_count(e) for k, e in res["rel_error_batches"].items() if e}
        if item.kind == "training":
            res["loss_rel_error"] = {k: median_error(e) for k, e in res["loss_rel_error_batches"].items()}
        else:
            del res["loss_rel_error_batches"]
    print(f"    rewrite TF {res['rewrite_s']['tensorflow']*1e3:.0f} ms vs ours {res['rewrite_s']['ours']*1e3:.0f} ms; "
          f"step {json.dumps({k: round(v * 1e3, 2) for k, v in res['step_s'].items()})} ms", flush=True)
    return res


def column_errors(graph_def, item, batches: list[dict[str, np.ndarray]], ref: list[list[np.ndarray]]
                  ) -> tuple[list[float | None] | None, list[float | None] | None]:
    """One column's errors against the float32 outputs ``ref``, batch by batch: over every
    output, and for a training step over its loss alone (else ``None``); ``(None, None)``
    where ``graph_def`` cannot run here."""
    got = outputs(graph_def, item, batches)
    if got is None:
        return None, None
    every = [rel_error(o, r) for o, r in zip(got, ref)]
    gc.collect()
    # The loss alone (the step's forward result).  The weights after one Adam step move by
    # about +-lr whatever a gradient entry's size, so near-zero entries flip sign under any
    # rounding: that part of rel_error measures the optimizer, not the rewrite.
    loss = [rel_error(o[:1], r[:1]) for o, r in zip(got, ref)] if item.kind == "training" else None
    return every, loss


#: Columns whose plans ``--redo-numerics`` can make again: ours in float16 for a GPU 8.0, by
#: the key of their Cast quality in ``quality_fp16``.
REDO_COLUMNS = {"ours_fp16": "ours_default", "ours_opt_fp16": "ours_optimal"}


def redo_item(name: str, columns: Sequence[str], numerics_batches: int) -> dict[str, Any]:
    """For corpus graph ``name``, each of ``columns`` (keys of :data:`REDO_COLUMNS`) made again
    by this checkout's planner: its Cast quality, its errors over ``numerics_batches`` batches
    (:func:`column_errors`), and whether it is the float32 graph.  No timing."""
    item = corpus.build(name)
    graphs = {col: result.graph_def for col, result in fp16_rewrites(item).items()}
    batches = input_batches(item, numerics_batches)
    ref = outputs(item.graph_def, item, batches)
    f32_bytes = item.graph_def.SerializeToString(deterministic=True)
    out: dict[str, Any] = {}
    for col in columns:
        every, loss = column_errors(graphs[col], item, batches, ref) if ref is not None else (None, None)
        out[col] = {"quality": quality(item.graph_def, graphs[col], HALF, item), "every": every, "loss": loss,
                    "same_as_float32": graphs[col].SerializeToString(deterministic=True) == f32_bytes}
    return out


def apply_redone(g: dict[str, Any], col: str, redone: dict[str, Any]) -> None:
    """Puts one column's :func:`redo_item` result into graph ``g`` of a run: its Cast quality
    and errors replace the run's, and its step times go (the graph timed is not the plan any
    more).  Mutates ``g``."""
    g["quality_fp16"][REDO_COLUMNS[col]] = redone["quality"]
    for key in ("step_s", "speedup_vs_fp32"):
        g.get(key, {}).pop(col, None)
    for per_process in g.get("step_s_by_process") or []:
        per_process.pop(col, None)
    same = set(g.get("same_as_float32", [])) - {col}
    g["same_as_float32"] = sorted(same | ({col} if redone["same_as_float32"] else set()))
    if "rel_error_batches" not in g:
        return
    g["rel_error_batches"][col] = redone["every"]
    g["rel_error"][col] = median_error(redone["every"])
    g.setdefault("nonfinite_batches", {})[col] = nonfinite_count(redone["every"])
    if redone["loss"] is not None and "loss_rel_error" in g:
        g["loss_rel_error_batches"][col] = redone["loss"]
        g["loss_rel_error"][col] = median_error(redone["loss"])


def redo_numerics(path: str, columns: Sequence[str], args: argparse.Namespace) -> None:
    """Makes ``columns`` of the run in ``path`` (``results.json``) again with this checkout's
    planner, one fresh process per graph (:func:`redo_item`, at the run's batch, weights and
    number of batches), and writes the run's report again beside it: for a change of plans
    that moves errors and Casts, not the timed columns.  The redone columns lose their step
    times; ``numerics_redone`` records which columns, when and at which commit.  Changes
    ``path``."""
    unknown = sorted(set(columns) - set(REDO_COLUMNS))
    if unknown:
        raise SystemExit(f"--redo-numerics: cannot redo {', '.join(unknown)} (only {', '.join(REDO_COLUMNS)})")
    with open(path) as f:
        results = json.load(f)
    batches = results.get("numerics_batches", args.numerics_batches)
    for g in results.get("graphs", []):
        redone = _child_json(f"redoing {g['name']}", [
            "--redo-one", g["name"], "--redo-columns", ",".join(columns), "--numerics-batches", str(batches),
            *_run_model_flags(results, args)])
        for col in columns:
            apply_redone(g, col, redone[col])
        print(f"  {g['name']}: " + ", ".join(f"{c} error {g.get('rel_error', {}).get(c)}" for c in columns), flush=True)
    results.setdefault("numerics_redone", []).append(
        {"columns": list(columns), "date": datetime.date.today().isoformat(), "commit": _git_commit()})
    with open(path, "w") as f:
        json.dump(results, f, indent=1, default=str)
    from report import write_report

    write_report(results, os.path.dirname(os.path.abspath(path)))


# --------------------------------------------------------------------------- scaling

_SCALING_CHILD = r"""
import json, resource, sys, time, os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
sys.path.insert(0, {root!r}); sys.path.insert(0, {here!r})
from synthetic import optimal_chain_graph, synthetic_graph
import amp_rewrite
import amp_rewrite.plan.optimal
def hwm_kb():
    # VmHWM: this process's peak RSS.  (ru_maxrss survives exec, so after a fork from a big
    # parent it reports the parent's peak.)
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
n = int(sys.argv[1])
planner = sys.argv[2] if len(sys.argv) > 2 else "greedy"
# The optimal planner's own time: the API hands decide() the module's min_cut_placement,
# looked up when a rewrite starts, so wrapping it times every placement (building the cut
# problem and solving it).  Its CPU time too: on a shared machine the wall time also counts
# the other processes' turns.
planner_s = [0.0, 0.0]
_place = amp_rewrite.plan.optimal.min_cut_placement
def _timed_place(*args, **kwargs):
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        return _place(*args, **kwargs)
    finally:
        planner_s[0] += time.perf_counter() - t0
        planner_s[1] += time.process_time() - c0
amp_rewrite.plan.optimal.min_cut_placement = _timed_place
if planner == "optimal":
    # One long free chain of allow, infer and clear ops: the min cut's worst case for its size.
    gd = optimal_chain_graph(n)
    kwargs = dict(lists="optimal")
else:
    gd = synthetic_graph(n, seed=0)
    kwargs = {{}}
rss0 = hwm_kb()
ru0 = resource.getrusage(resource.RUSAGE_SELF)
t = time.perf_counter()
r = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", use_env=False, **kwargs)
total = time.perf_counter() - t
ru1 = resource.getrusage(resource.RUSAGE_SELF)
rss1 = hwm_kb()
# user vs system CPU time: the system part is mostly the kernel backing fresh memory (page
# faults), which on some virtual machines grows faster than the memory itself.
print(json.dumps({{"nodes": len(gd.node), "planner": planner, "total_s": total, "stages_s": dict(r.timings),
                  "planner_s": planner_s[0], "planner_cpu_s": planner_s[1],
                  "user_s": ru1.ru_utime - ru0.ru_utime, "sys_s": ru1.ru_stime - ru0.ru_stime,
                  "page_faults": ru1.ru_minflt - ru0.ru_minflt,
                  "peak_rss_mb": rss1 / 1024, "rss_growth_mb": (rss1 - rss0) / 1024,
                  "converted": r.report["converted_nodes"], "casts": r.report["casts_to_low"] + r.report["casts_to_high"]}}))
"""


def scaling(sizes: list[int], timeout: int, planner: str = "greedy") -> list[dict[str, Any]]:
    """Rewrite a synthetic graph of each size in a fresh process and return one row per size.

    ``planner="greedy"``: :func:`synthetic.synthetic_graph` (residual MLP blocks with deny-list
    side branches) with the default lists.  ``"optimal"``: :func:`synthetic.optimal_chain_graph`
    (one long free chain) with ``lists="optimal"``; its rows also give ``planner_s``, the
    time spent in the optimal planner, ``planner_cpu_s`` its CPU time, and both per node.  Runs
    subprocesses; mutates nothing.
    """
    code = _SCALING_CHILD.format(root=os.path.join(HERE, ".."), here=HERE)
    rows = []
    for n in sizes:
        print(f"  scaling ({planner} planner): {n} nodes", flush=True)
        try:
            out = subprocess.run([sys.executable, "-c", code, str(n), planner], capture_output=True, text=True,
                                 timeout=timeout, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["us_per_node"] = row["total_s"] / row["nodes"] * 1e6
            row["planner_us_per_node"] = row["planner_s"] / row["nodes"] * 1e6
            row["planner_cpu_us_per_node"] = row["planner_cpu_s"] / row["nodes"] * 1e6
            rows.append(row)
            print(f"    {row['total_s']:.1f}s, {row['us_per_node']:.1f} us/node"
                  + (f" (optimal planner {row['planner_s']:.1f}s, {row['planner_us_per_node']:.1f} us/node; "
                     f"CPU {row['planner_cpu_s']:.1f}s, {row['planner_cpu_us_per_node']:.1f} us/node)"
                     if planner == "optimal" else "")
                  + f", peak RSS {row['peak_rss_mb']:.0f} MB", flush=True)
        except subprocess.TimeoutExpired:
            rows.append({"nodes": n, "planner": planner, "error": f"timed out after {timeout}s"})
        except subprocess.CalledProcessError as exc:
            rows.append({"nodes": n, "planner": planner, "error": exc.stderr.strip().splitlines()[-1][:300]})
    return rows


# --------------------------------------------------------------------------- main


def estimate_item(name: str) -> dict[str, Any]:
    """The ``estimated_bf16`` of :func:`bench_item` alone (no timing): the same three bfloat16
    rewrites of corpus graph ``name``, priced.  Plans and prices are deterministic, so this
    adds the estimates to a run made without them by code whose planner and cost model are
    the same (``--add-estimates``)."""
    item = corpus.build(name)
    return estimated_ratios(item, bf16_rewrites(item))


def _run_model_flags(results: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """``--batch`` and ``--weights`` of an earlier run (``results``), else this command's:
    a child remaking part of that run builds its models as the run did.  Pure."""
    return ["--batch", str(results.get("batch", args.batch)), "--weights", results.get("weights", args.weights)]


def add_estimates(path: str, args: argparse.Namespace) -> None:
    """Adds :func:`estimate_item`'s ratios to each graph of the run in ``path``
    (``results.json``), one fresh process per graph, built at the run's batch and weights, and
    writes the run's report again beside it.  Changes ``path``: only its graphs'
    ``estimated_bf16`` (and ``estimates_added``)."""
    with open(path) as f:
        results = json.load(f)
    for g in results.get("graphs", []):
        g["estimated_bf16"] = _child_json(f"estimating {g['name']}", [
            "--estimate-one", g["name"], *_run_model_flags(results, args)])
        print(f"  {g['name']}: estimated {g['estimated_bf16']}", flush=True)
    results["estimates_added"] = {"date": datetime.date.today().isoformat(), "commit": _git_commit()}
    with open(path, "w") as f:
        json.dump(results, f, indent=1, default=str)
    from report import write_report

    write_report(results, os.path.dirname(os.path.abspath(path)))


def _git_commit() -> str | None:
    """This checkout's commit, or None outside a git checkout."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _child_json(what: str, flags: Sequence[str]) -> Any:
    """Runs this script in a fresh process with ``flags`` (one of its internal modes, which
    writes JSON to ``--one-out``) and returns what it wrote.  Raises ``SystemExit`` naming
    ``what`` when the child fails.  A training graph's sessions hold GBs that TensorFlow does
    not all give back, so each graph's work gets a process of its own."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "child.json")
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), *flags, "--one-out", out])
        if proc.returncode != 0 or not os.path.exists(out):
            raise SystemExit(f"{what} failed (exit code {proc.returncode})")
        with open(out) as f:
            return json.load(f)


def _bench_in_child(name: str, repeats: int, args: argparse.Namespace) -> dict[str, Any]:
    """``bench_item(name)`` in a fresh process (:func:`_child_json`): one process for the whole
    corpus ran out of memory (24 GB) by the 16th graph (VGG16 with Adam peaked at 11.7 GB)."""
    return _child_json(f"benchmark of {name}", [
        "--one", name, "--repeats", str(repeats), "--iters", str(args.iters), "--budget", str(args.budget),
        "--numerics-batches", str(args.numerics_batches), "--sessions", str(args.sessions),
        "--processes", str(args.processes), "--batch", str(args.batch), "--weights", args.weights])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 models, 3 repeats, sizes up to 100k")
    ap.add_argument("--models", help="comma-separated model names (default: all, or the quick set)")
    ap.add_argument("--repeats", type=int)
    ap.add_argument("--iters", type=int, default=5, help="steps per timing sample")
    ap.add_argument("--budget", type=float, default=30.0,
                    help="seconds of step timing per graph: fast graphs get more rounds than --repeats")
    ap.add_argument("--sessions", type=int, default=3,
                    help="sets of fresh sessions autotune's rounds are spread over "
                         "(and the table's, with --processes 1)")
    ap.add_argument("--processes", type=int, default=3,
                    help="fresh processes each graph's step timing is spread over (one set of sessions each)")
    ap.add_argument("--numerics-batches", type=int, default=16,
                    help="input batches the output errors are measured on (medians are reported)")
    ap.add_argument("--sizes", help="scaling sizes for the greedy planner, comma-separated, or 'none'")
    ap.add_argument("--optimal-sizes",
                    help="chain sizes for the optimal planner's scaling, comma-separated, or 'none' "
                         "(default 50000,100000,200000,400000; --quick: 50000,100000)")
    ap.add_argument("--scaling-only", action="store_true")
    ap.add_argument("--no-scaling", action="store_true")
    ap.add_argument("--out", default=HERE)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: bench one graph, write JSON to --one-out
    ap.add_argument("--one-out", help=argparse.SUPPRESS)
    ap.add_argument("--add-estimates", metavar="RESULTS_JSON",
                    help="add the cost model's estimated ratios to a run's results.json and write its report again")
    ap.add_argument("--estimate-one", help=argparse.SUPPRESS)  # internal: add_estimates's child
    ap.add_argument("--redo-numerics", metavar="RESULTS_JSON",
                    help="make the --redo-columns of an existing run again with this checkout's planner (Casts and "
                         "errors; their step times are dropped) and write its report again")
    ap.add_argument("--redo-columns", default="ours_fp16",
                    help=f"comma-separated columns for --redo-numerics, of {', '.join(REDO_COLUMNS)}")
    ap.add_argument("--redo-one", help=argparse.SUPPRESS)  # internal: redo_numerics's child
    ap.add_argument("--time-job", help=argparse.SUPPRESS)  # internal: step_times_in_processes's child
    ap.add_argument("--time-out", help=argparse.SUPPRESS)
    # RESULTS.md was measured with Keras's initial weights at the corpus' batch of 2;
    # ``--weights trained`` builds the frozen graphs a trained model has (models.trained_like).
    add_model_options(ap, weights="init")
    args = ap.parse_args(argv)
    apply_model_options(args)
    repeats = args.repeats or (3 if args.quick else 7)
    if args.time_job:
        _time_job(args.time_job, args.time_out)
        return 0
    if args.estimate_one:
        with open(args.one_out, "w") as f:
            json.dump(estimate_item(resolve_items([args.estimate_one])[0]), f)
        return 0
    if args.add_estimates:
        add_estimates(args.add_estimates, args)
        return 0
    if args.redo_one:
        with open(args.one_out, "w") as f:
            json.dump(redo_item(resolve_items([args.redo_one])[0], args.redo_columns.split(","),
                                args.numerics_batches), f)
        return 0
    if args.redo_numerics:
        redo_numerics(args.redo_numerics, args.redo_columns.split(","), args)
        return 0
    if args.one:
        res = bench_item(resolve_items([args.one])[0], repeats, args.iters, args.budget, args.numerics_batches,
                         args.sessions, args.processes)
        with open(args.one_out, "w") as f:
            json.dump(res, f, default=str)
        return 0
    if not args.scaling_only and not onednn_bf16_pass_available():
        # Its bfloat16 column would silently be the float32 graph.
        raise SystemExit("bench.py: TensorFlow's oneDNN bfloat16 pass is not available in this process "
                         f"(TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS')!r}); the "
                         "comparison with TensorFlow's bfloat16 rewrite needs it. Leave "
                         "TF_ENABLE_ONEDNN_OPTS unset or set it to 1.")
    models = tuple(args.models.split(",")) if args.models else (QUICK_MODELS if args.quick else ALL_MODELS)
    sizes = [] if args.sizes == "none" else [int(s) for s in args.sizes.split(",")] if args.sizes else (
        [1000, 10000, 100000] if args.quick else [1000, 10000, 100000, 1000000])
    if args.optimal_sizes:
        optimal_sizes = [] if args.optimal_sizes == "none" else [int(s) for s in args.optimal_sizes.split(",")]
    else:
        optimal_sizes = [50000, 100000] if args.quick else [50000, 100000, 200000, 400000]

    results: dict[str, Any] = {"machine": machine_info(), "repeats": repeats, "iters": args.iters,
                               "budget_s": args.budget, "quick": args.quick,
                               "numerics_batches": args.numerics_batches, "sessions": args.sessions,
                               "processes": args.processes,
                               "batch": args.batch, "weights": args.weights}
    print(json.dumps(results["machine"]), flush=True)
    if not args.scaling_only:
        results["graphs"] = []
        for name in item_names(models):
            results["graphs"].append(_bench_in_child(name, repeats, args))
    if not args.no_scaling:
        results["scaling"] = scaling(sizes, timeout=1800) if sizes else []
        if optimal_sizes:
            results["optimal_scaling"] = scaling(optimal_sizes, timeout=1800, planner="optimal")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    from report import write_report

    write_report(results, args.out)
    print(f"wrote {args.out}/RESULTS.md, results.json and plots", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
