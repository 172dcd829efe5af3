"""Where a step's time goes on the GPU: device busy time, kernels and host gaps, per variant.

``bench/gpu_bench.py`` measures step times; this says *why* two of them differ.  It builds the
same variants (``gpu_bench.VariantRun``: same models, weights, batch, switches), runs each one's
first step and ``--warmup`` steps, then records ``--steps`` steps under TensorFlow's profiler
(``tf.profiler.experimental``, which reads the GPU's kernels through CUPTI) and reads the trace
it writes (an ``XSpace`` protobuf), per variant:

* the step's wall time (the host's ``train_on_batch``/``predict_on_batch`` call),
* the GPU's busy time: the union of every kernel and copy on the device's streams, so
  ``wall - busy`` is time the GPU waited -- for the host (TensorFlow's executor dispatching
  ops one by one without XLA, a function lookup) or for a copy to the host,
* the number of kernels per step, and the kernels grouped by the op they ran for (XLA's HLO
  instruction, else TensorFlow's op, else the kernel's name), largest first.

Two questions of issue 22 are what it is for: whether a step without XLA is bound by the host
(float32 and TF32-off took the same 96 ms on ResNet50's training step on an H100, so its
convolutions were not what it waited for), and where our BERT step under XLA spends the 1.9 ms
by which it trailed Keras's ``mixed_float16`` one although the two modules move about the same
bytes (bench/GPU_RESULTS.md).

Usage (on the lent GPU; see CONTRIBUTING.md)::

    python bench/gpu_profile.py --workloads bert_base-train-b32 \\
        --variants keras_mixed_xla,ours_user --steps 5 --out $OUT/profile.json
    python bench/gpu_profile.py --workloads resnet50-train-b64 \
        --variants float32,float32_strict,ours_default --nodes --out $OUT/nodes.json
    python bench/gpu_profile.py --reduced        # CPU smoke run (host times only; no device)

Writes JSON (``--out``) and prints a short table.  Without a GPU the device columns are empty:
the parser (:func:`summarize_space`) is what the CPU tests check.  ``--nodes`` adds every
TensorFlow node's time per step (:func:`node_times`: its kernels' time on the GPU, or, without
one, its kernel's time on the host), which ``bench/calibrate_gpu_in_place.py`` sets against
the cost model's estimate of the same node: the per-node calibration issue 22 asks for.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Iterable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), HERE]

#: Stats of a device event that name the op it ran for, most specific first (XLA's HLO op,
#: TensorFlow's op, else the annotation the kernel was launched under).
_OP_STATS = ("hlo_op", "tf_op", "kernel_annotation")
#: Device lines that are derived views, not streams (their events repeat or span the
#: streams'), in the names TensorFlow 2.21's profiler and earlier releases use.
_DERIVED_LINES = ("XLA Ops", "Async XLA Ops", "XLA Modules", "Framework Ops", "Framework Name Scope",
                  "TensorFlow Ops", "TensorFlow Name Scope", "Host Offload Ops", "Sparse Core Steps", "Steps",
                  "Launch Stats", "Source code", "_counters_")


def _stat_names(plane: Any) -> dict[int, str]:
    return {k: v.name for k, v in plane.stat_metadata.items()}


def _stat_value(stat: Any, plane: Any) -> str:
    """A stat's value as text (a reference points at a stat metadata's name)."""
    kind = stat.WhichOneof("value")
    if kind == "ref_value":
        return plane.stat_metadata[stat.ref_value].name if stat.ref_value in plane.stat_metadata else ""
    return str(getattr(stat, kind)) if kind else ""


def _union_ps(intervals: list[tuple[int, int]]) -> int:
    """Total length of the union of ``[start, end)`` intervals (picoseconds).  Pure."""
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def _stats_of(event: Any, plane: Any, stat_names: dict[int, str]) -> dict[str, str]:
    """The stats of a device event that say what it ran for (:data:`_OP_STATS` and
    ``hlo_module``), the event's own over its metadata's.  Reads ``plane`` only."""
    meta = plane.event_metadata[event.metadata_id] if event.metadata_id in plane.event_metadata else None
    found: dict[str, str] = {}
    for st in (list(meta.stats) if meta is not None else []) + list(event.stats):
        name = stat_names.get(st.metadata_id)
        if name in _OP_STATS or name == "hlo_module":
            found[name] = _stat_value(st, plane)
    return found


def _op_of(event: Any, plane: Any, stat_names: dict[int, str]) -> str:
    """The op a device event ran for: its ``hlo_op``, ``tf_op`` or ``kernel_annotation`` stat,
    else the event's name.  Reads ``plane`` (without inserting into its maps)."""
    found = _stats_of(event, plane, stat_names)
    for name in _OP_STATS:
        if found.get(name):
            return found[name]
    meta = plane.event_metadata[event.metadata_id] if event.metadata_id in plane.event_metadata else None
    return meta.name if meta is not None else f"event {event.metadata_id}"


_OP_TYPE = re.compile(r"[A-Z_][A-Za-z0-9_]*")


def parse_tf_op(text: str) -> tuple[str, str] | None:
    """``(node name, op type)`` of a TensorFlow op as the profiler names it (``"name:Type"``,
    possibly the last of an annotation stack joined by ``"::"``, with ``#key=value,...#``
    metadata), or ``None`` for anything else (an XLA instruction, a kernel's symbol, a
    runtime event such as ``ExecutorState::Process``).  Pure."""
    last = re.sub(r"#[^#]*#", "", text.split("::")[-1]).strip()
    name, sep, op = last.rpartition(":")
    if not sep or not name or not _OP_TYPE.fullmatch(op) or " " in name:
        return None
    return name, op


def node_times(space: Any, steps: int) -> tuple[dict[str, dict[str, Any]], str]:
    """Per TensorFlow node, its time per step and its events per step, from a profiled
    ``XSpace`` of ``steps`` steps, and where the times come from: ``"device"`` (every kernel
    the GPU ran for the node, on its streams) or, without a GPU plane, ``"host"`` (the op
    kernels' own events on the host's executor threads: what a CPU computes, the CPU smoke
    run's stand-in).  Only events that name a TensorFlow op (:func:`parse_tf_op`) count.  Keyed
    by node name (``name:Type`` where one name ran as two op types: nodes of two functions).
    Pure: reads ``space``."""
    times: collections.Counter[tuple[str, str]] = collections.Counter()
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    gpu_planes = [p for p in space.planes if p.name.startswith("/device:GPU:")]
    source = "device" if gpu_planes else "host"
    planes = gpu_planes or [p for p in space.planes if p.name.startswith("/host:")]
    for plane in planes:
        stat_names = _stat_names(plane)
        for line in plane.lines:
            if any(line.name.startswith(d) or line.display_name.startswith(d) for d in _DERIVED_LINES):
                continue
            if source == "host" and line.name == "python":
                continue  # the caller's thread: function calls, not op kernels
            for ev in line.events:
                text = (_op_of(ev, plane, stat_names) if source == "device"
                        else plane.event_metadata[ev.metadata_id].name if ev.metadata_id in plane.event_metadata else "")
                parsed = parse_tf_op(text)
                if parsed is None:
                    continue
                times[parsed] += ev.duration_ps
                counts[parsed] += 1
    # Keyed by name; a name that ran as two op types (two functions' nodes) by "name:Type".
    types_of: dict[str, set[str]] = collections.defaultdict(set)
    for name, op in times:
        types_of[name].add(op)
    return ({(name if len(types_of[name]) == 1 else f"{name}:{op}"):
             {"op": op, "ms": ps / 1e9 / steps, "events": counts[(name, op)] / steps}
             for (name, op), ps in sorted(times.items())}, source)


def summarize_space(space: Any, steps: int, top: int = 25) -> dict[str, Any]:
    """Per-step device figures of one profiled ``XSpace`` holding ``steps`` steps: busy time
    (union of the GPU streams' events), kernel count, time per op (top ``top``), and in
    ``xla_ops`` every XLA instruction's time (keyed ``module/instruction`` from the events'
    ``hlo_module`` and ``hlo_op`` stats), which ``bench/xla_dump_summary.py --times`` sets
    against the instructions of the compiled module.  Every GPU plane (``/device:GPU:N``)
    counts; a trace without one (a CPU run) gives ``None``s.  Pure: reads ``space``."""
    intervals: list[tuple[int, int]] = []
    per_op: collections.Counter[str] = collections.Counter()
    per_op_n: collections.Counter[str] = collections.Counter()
    per_hlo: collections.Counter[str] = collections.Counter()
    per_hlo_n: collections.Counter[str] = collections.Counter()
    events = 0
    gpu_planes = [p for p in space.planes if p.name.startswith("/device:GPU:")]
    for plane in gpu_planes:
        stat_names = _stat_names(plane)
        for line in plane.lines:
            if any(line.name.startswith(d) or line.display_name.startswith(d) for d in _DERIVED_LINES):
                continue
            base = line.timestamp_ns * 1000
            for ev in line.events:
                start = base + ev.offset_ps
                intervals.append((start, start + ev.duration_ps))
                found = _stats_of(ev, plane, stat_names)
                op = _op_of(ev, plane, stat_names)
                per_op[op] += ev.duration_ps
                per_op_n[op] += 1
                if found.get("hlo_op"):
                    key = f"{found.get('hlo_module', '')}/{found['hlo_op']}"
                    per_hlo[key] += ev.duration_ps
                    per_hlo_n[key] += 1
                events += 1
    if not gpu_planes:
        return {"device_busy_ms": None, "kernels": None, "first_to_last_ms": None, "ops": [], "xla_ops": {}}
    span = (max(e for _, e in intervals) - min(s for s, _ in intervals)) if intervals else 0
    return {
        "device_busy_ms": _union_ps(intervals) / 1e9 / steps,
        "kernels": events / steps,
        "first_to_last_ms": span / 1e9 / steps,
        "ops": [{"op": op, "ms": ps / 1e9 / steps, "events": per_op_n[op] / steps}
                for op, ps in per_op.most_common(top)],
        "xla_ops": {key: {"ms": ps / 1e9 / steps, "events": per_hlo_n[key] / steps}
                    for key, ps in sorted(per_hlo.items())},
    }


def read_space(logdir: str) -> Any:
    """The ``XSpace`` the profiler wrote under ``logdir`` (its newest run)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    files = sorted(glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")))
    if not files:
        raise FileNotFoundError(f"the profiler wrote no trace under {logdir}")
    space = xplane_pb2.XSpace()
    with open(files[-1], "rb") as f:
        space.ParseFromString(f.read())
    return space


def profile_variant(run: Any, steps: int, warmup: int, logdir: str, nodes: bool = False) -> dict[str, Any]:
    """Profile ``steps`` steps of a built ``gpu_bench.VariantRun`` (its first step done) after
    ``warmup`` unprofiled ones; wall times are taken around each call.  Writes the trace under
    ``logdir``.  ``nodes``: also every TensorFlow node's time per step (:func:`node_times`)."""
    import tensorflow as tf

    run.switches.enter(run.spec)
    try:
        for _ in range(warmup):
            run._call()
        walls = []
        tf.profiler.experimental.start(logdir)
        try:
            for i in range(steps):
                with tf.profiler.experimental.Trace("step", step_num=i, _r=1):
                    t = time.perf_counter()
                    run._call()
                    walls.append(time.perf_counter() - t)
        finally:
            tf.profiler.experimental.stop()
    finally:
        run.switches.leave(run.spec)
    rec = {"wall_ms": 1e3 * statistics.median(walls), "wall_ms_each": [1e3 * w for w in walls]}
    space = read_space(logdir)
    rec.update(summarize_space(space, steps))
    if nodes:
        rec["nodes"], rec["node_source"] = node_times(space, steps)
    if rec["device_busy_ms"] is not None:
        rec["device_idle_share"] = max(0.0, 1.0 - rec["device_busy_ms"] / rec["wall_ms"])
    return rec


def write_json(path: str, data: Any) -> None:
    """Write ``data`` to ``path`` whole or not at all (a temporary file renamed over it), so
    that a run killed at its time limit leaves the last complete record."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def run(workloads: Iterable[Any], variants: list[str], steps: int, warmup: int, precision: str,
        target: str, nodes: bool = False, out: str | None = None) -> dict[str, Any]:
    """Every variant of every workload, built as ``gpu_bench`` builds them, profiled; the
    record so far is written to ``out`` (JSON) after each variant."""
    import gpu_bench
    import tensorflow as tf

    keras = gpu_bench._keras()
    cfg = gpu_bench.Config(precision=precision, target=target, repeats=1, steps=steps, warmup=warmup,
                           predict=False, deadline=math.inf)
    switches = gpu_bench.Switches(precision)
    result: dict[str, Any] = {"machine": gpu_bench.machine_info(), "steps": steps, "warmup": warmup,
                              "precision": precision, "target": target, "workloads": {},
                              "extra_variants": {n: {"base": b, "options": o}
                                                 for n, (b, o) in gpu_bench.EXTRA_VARIANTS.items()}}
    for w in workloads:
        keras.utils.set_random_seed(gpu_bench.SEED)
        weights = w.build().get_weights()
        x_np, y_np = gpu_bench.make_batch(w)
        with tf.device("/GPU:0" if gpu_bench.gpu_available() else "/CPU:0"):
            x, y = tf.identity(tf.constant(x_np)), tf.identity(tf.constant(y_np))
        recs: dict[str, Any] = {}
        for name in variants:
            logdir = tempfile.mkdtemp(prefix=f"profile_{name}_")
            try:
                vr = gpu_bench.VariantRun(gpu_bench.variant_spec(name), w, weights, cfg, switches, x, y)
                vr.first_step()
                recs[name] = profile_variant(vr, steps, warmup, logdir, nodes)
                recs[name]["xla"] = vr.xla
            except Exception as exc:  # one variant's failure is reported; the others go on
                recs[name] = {"failed": f"{type(exc).__name__}: {exc}"[:400]}
            finally:
                shutil.rmtree(logdir, ignore_errors=True)
            print(f"[{w.name}] {name}: {_line(recs[name])}", flush=True)
            result["workloads"][w.name] = recs
            if out:
                write_json(out, result)
    return result


def _line(rec: dict[str, Any]) -> str:
    if "failed" in rec:
        return "FAILED " + rec["failed"]
    busy = rec.get("device_busy_ms")
    dev = "no device trace" if busy is None else (
        f"device busy {busy:.2f} ms ({rec['kernels']:.0f} kernels), idle {100 * rec['device_idle_share']:.0f}%")
    return f"wall {rec['wall_ms']:.2f} ms, {dev}"


def main(argv: list[str] | None = None) -> int:
    import gpu_bench

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", help="comma-separated gpu_bench workloads")
    p.add_argument("--variants", help="comma-separated gpu_bench variants (default: float32,float32_xla)")
    p.add_argument("--extra-variant", action="append", default=[], metavar="NAME=BASE[:JSON]",
                   help="as gpu_bench's: one of our variants with more rewrite options (repeatable)")
    p.add_argument("--steps", type=int, default=5, help="profiled steps per variant")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--precision", choices=("float16", "bfloat16"))
    p.add_argument("--reduced", action="store_true", help="CPU smoke run: the tiny CNN, bfloat16, target cpu")
    p.add_argument("--nodes", action="store_true",
                   help="also record every TensorFlow node's time per step (for bench/calibrate_gpu_in_place.py)")
    p.add_argument("--out", help="JSON file (default: stdout only)")
    args = p.parse_args(argv)
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    gpu = gpu_bench.gpu_available()
    if gpu:
        for g in tf.config.list_physical_devices("GPU"):
            tf.config.experimental.set_memory_growth(g, True)
    pool = gpu_bench.REDUCED_WORKLOADS if args.reduced else gpu_bench.FULL_WORKLOADS
    default_wl = gpu_bench.REDUCED_DEFAULT[0] if args.reduced else "resnet50-train-b64"
    workloads = gpu_bench._select(args.workloads or default_wl, pool, "workload")
    for text in args.extra_variant:
        gpu_bench.define_extra_variant(text)
    variants = (args.variants or "float32,float32_xla").split(",")
    for v in variants:
        gpu_bench.variant_spec(v)  # an unknown name fails here, before any model is built
    precision = args.precision or ("bfloat16" if args.reduced or not gpu else "float16")
    result = run(workloads, variants, args.steps, args.warmup, precision, "cpu" if args.reduced else "auto",
                 nodes=args.nodes, out=args.out)
    if args.out:
        write_json(args.out, result)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
