"""``amp-rewrite demo``: save a small Keras model, rewrite it for this machine, compare both.

No files and no network are needed.  The demo

1. builds a small convolutional classifier in-process (random weights, fixed seed) and
   saves it with ``model.export`` as a TF2 SavedModel;
2. picks the best target this machine has (``target="auto"``) and the low-precision type it
   has fast math for (:func:`best_precision`: bfloat16 on a CPU with AMX-BF16/AVX512-BF16,
   float16 on a GPU with Tensor Cores).  If this machine has neither, it rewrites for a CPU
   that does and says plainly that this machine cannot run the result fast;
3. rewrites the SavedModel with :func:`amp_rewrite.models.saved_model.rewrite_saved_model`;
4. loads both with ``tf.saved_model.load`` and prints one table: nodes converted, casts,
   output difference, and the step time of float32 and of the rewritten model, measured
   side by side (interleaved calls, median of many).

It takes well under 30 seconds on two CPU cores, most of it importing TensorFlow.
"""

from __future__ import annotations

import functools
import os
import shutil
import statistics
import tempfile
import textwrap
import time
from typing import Any, Callable, TextIO

import numpy as np

from .errors import AmpRewriteError
from .models.staging import Staging, check_replaceable, check_writable
from .plan.targets import CPU_FEATURES, Target

__all__ = ["best_precision", "build_demo_model", "time_side_by_side", "run_demo"]

_BATCH = 64
_ROUNDS = 30


def best_precision(target: Target) -> str | None:
    """The low-precision type ``target`` has fast math for, or ``None``.

    CPUs prefer bfloat16 (float32's range, so no overflow; oneDNN's choice), GPUs float16
    (Tensor Cores from compute capability 7.0; Grappler's default).  Pure.
    """
    order = ("bfloat16", "float16") if target.kind == "cpu" else ("float16", "bfloat16")
    for precision in order:
        if target.skip_reason(precision) is None:  # type: ignore[arg-type]
            return precision
    return None


def build_demo_model(seed: int = 0) -> Any:
    """A small Keras CNN for 32x32x3 images with random (seeded) weights."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((32, 32, 3), name="image"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
        keras.layers.Softmax(),
    ])


def time_side_by_side(fns: dict[str, Callable[[], Any]], rounds: int = _ROUNDS,
                      warmup: int = 3) -> dict[str, float]:
    """Median seconds per call of each function, measured interleaved.

    Calls alternate (and swap order every round) so that clock changes, caches and other
    load hit every function alike.  Each function must block until its result is ready.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _machine(local: Target) -> str:
    """This machine in a few words: its GPUs, or its CPU's low-precision features."""
    if local.kind == "gpu":
        return local.description.removeprefix("auto: ")
    features = local.devices[0].features if local.devices else frozenset()
    wanted = [f for p in ("bfloat16", "float16") for f in CPU_FEATURES[p]]  # type: ignore[index]
    has = [f for f in wanted if f in features]
    lacks = [f for f in wanted if f not in features]
    if not has:
        return "a CPU with none of " + ", ".join(wanted)
    text = "a CPU with " + ", ".join(has)
    return text + (f" but no {', '.join(lacks[:-1])} or {lacks[-1]}" if len(lacks) > 1 else
                   f" but no {lacks[0]}" if lacks else "")


def _choose(target: str, precision: str) -> tuple[Target, str, str, list[str]]:
    """The target and precision to rewrite for, the ``--target`` text that names the target,
    and sentences saying why."""
    from .api import resolve_target
    from .plan.targets import detect_target

    local = detect_target()
    tgt = resolve_target(target)
    target_arg = target
    notes = []
    if precision == "auto":
        chosen = best_precision(tgt)
        if chosen is None:
            target_arg = "cpu" if tgt.kind == "cpu" else "gpu:8.0"
            tgt = resolve_target(target_arg)
            chosen = best_precision(tgt) or "bfloat16"
            notes.append(f"This machine ({_machine(local)}) has no fast float16 or bfloat16 math, so the "
                         f"model is rewritten for target '{target_arg}' ({_TARGET_WORDS[tgt.kind]}) instead.")
        elif target.strip().lower() == "auto":
            notes.append(f"This machine: {_machine(local)}, so the target is this "
                         f"{tgt.kind.upper()} and the precision {chosen}, the type it has fast math for.")
    else:
        chosen = precision
    if tgt.skip_reason(chosen) is None and (  # type: ignore[arg-type]
            tgt.kind != local.kind or local.skip_reason(chosen) is not None):  # type: ignore[arg-type]
        notes.append(f"This machine ({_machine(local)}) cannot run {chosen} fast: the timings below are "
                     f"from this machine and do not show what target '{target_arg}' would gain.")
    return tgt, chosen, target_arg, notes


_TARGET_WORDS = {"cpu": "a CPU with AMX or AVX512 float16/bfloat16 math", "gpu": "a GPU of compute capability 8.0"}


def _example_nodes(report: dict[str, Any]) -> list[str]:
    """A converted node and a denied one of the model's functions, to suggest to ``explain``."""
    found: dict[str, str] = {}
    for graph in report["graphs"]:
        for section in graph["functions"].values():
            for name, node in section["nodes"].items():
                if node["color"] in ("allow", "deny") and node["op"] not in ("Identity", "Cast"):
                    found.setdefault(node["color"], name)
    return [found[c] for c in ("allow", "deny") if c in found]


def _check_save(save: str, overwrite: bool) -> None:
    """Refuse ``--save DIR`` before any work: ``DIR`` must be a directory or not exist yet,
    and ``DIR/float32`` and ``DIR/rewritten`` are replaced only with ``overwrite`` (as
    :func:`~amp_rewrite.models.staging.check_replaceable` says; a device or FIFO never).  Reads
    the file system only."""
    if os.path.lexists(save) and not os.path.isdir(save):
        raise AmpRewriteError(f"--save {save} is not a directory; it names the directory to keep both models in")
    for name in ("float32", "rewritten"):
        path = os.path.join(save, name)
        check_writable(path)
        check_replaceable(path, overwrite=overwrite, what="--save")
        if os.path.lexists(path) and not os.path.isdir(path):
            raise AmpRewriteError(f"--save {path} exists and is not a directory")


def _copy_tree(source: str, dest: str) -> None:
    shutil.copytree(source, dest, symlinks=True, dirs_exist_ok=True)


def run_demo(out: TextIO, target: str = "auto", precision: str = "auto", save: str | None = None,
             overwrite: bool = False) -> int:
    """Run the demo, writing to ``out``.  Returns 0 (a process exit code).

    The models are built and rewritten in a temporary directory that is removed at the end.
    ``save`` keeps both SavedModels in that directory too (``float32/`` and
    ``rewritten/``), staged and renamed into place together once both are written, so a
    failure leaves neither.  ``save`` must be a directory or not exist yet, and an existing
    ``float32`` or ``rewritten`` there (other than an empty directory) is replaced only with
    ``overwrite``; both are checked before any work.  Raises :class:`AmpRewriteError`.
    """
    start = time.perf_counter()
    if save is not None:
        _check_save(save, overwrite)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tgt, chosen, target_arg, notes = _choose(target, precision)
    model = build_demo_model()
    report, ref, got, times = _rewrite_and_time(model, tgt, chosen, save, overwrite)
    _write_table(out, model.count_params(), report, ref, got, times, chosen=chosen, target_arg=target_arg,
                 notes=notes, save=save)
    w = out.write
    w(f"(built, saved, rewritten, loaded and timed in {time.perf_counter() - start:.1f} s)\n")
    return 0


def _rewrite_and_time(model: Any, tgt: Target, chosen: str, save: str | None,
                      overwrite: bool) -> tuple[dict[str, Any], np.ndarray, np.ndarray, dict[str, float]]:
    """Export ``model``, rewrite it for ``tgt`` and ``chosen``, keep both in ``save`` (if
    given), load both back and run and time them on one batch: ``(report, float32 outputs,
    rewritten outputs, seconds per call by name)``.  Works in a temporary directory, removed
    at the end."""
    import tensorflow as tf

    from .models.saved_model import rewrite_saved_model

    workdir = tempfile.mkdtemp(prefix="amp-rewrite-demo-")
    src, dst = os.path.join(workdir, "float32"), os.path.join(workdir, "rewritten")
    try:
        model.export(src, verbose=False)
        report = rewrite_saved_model(src, dst, target=tgt, precision=chosen, use_env=False)  # type: ignore[arg-type]
        if save is not None:
            with Staging() as staging:
                for name, path in (("float32", src), ("rewritten", dst)):
                    staging.add_tree(os.path.join(save, name), functools.partial(_copy_tree, path),
                                     replace=overwrite)
                staging.commit()
        before = tf.saved_model.load(src).signatures["serving_default"]
        after = tf.saved_model.load(dst).signatures["serving_default"]
        key = next(iter(before.structured_input_signature[1]))
        batch = tf.constant(np.random.default_rng(0).standard_normal((_BATCH, 32, 32, 3)).astype(np.float32))
        ref = next(iter(before(**{key: batch}).values())).numpy()
        got = next(iter(after(**{key: batch}).values())).numpy()
        times = time_side_by_side({
            "float32": lambda: next(iter(before(**{key: batch}).values())).numpy(),
            "rewritten": lambda: next(iter(after(**{key: batch}).values())).numpy(),
        })
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return report, ref, got, times


def _write_table(out: TextIO, n_params: int, report: dict[str, Any], ref: np.ndarray, got: np.ndarray,
                 times: dict[str, float], *, chosen: str, target_arg: str, notes: list[str],
                 save: str | None) -> None:
    """The demo's text, to ``out``: what was done, the notes, the table comparing both
    models, and (with ``save``) ``explain`` commands to try.  Reads its arguments only."""
    diff = float(np.max(np.abs(got.astype(np.float64) - ref)))
    scale = float(np.max(np.abs(ref))) or 1.0
    agree = int(np.sum(np.argmax(got, axis=1) == np.argmax(ref, axis=1)))
    ratio = times["float32"] / times["rewritten"]
    speed = f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"

    w = out.write
    w(f"amp-rewrite demo: a Keras CNN ({n_params:,} parameters, random weights) saved with "
      f"model.export,\nrewritten with target '{target_arg}' and precision {chosen}, both models loaded "
      "back with tf.saved_model.load.\n")
    for note in notes:
        w("\n" + textwrap.fill(note, 96) + "\n")
    if report["skipped"]:
        w(f"\nNothing was rewritten: {report['skipped']}\n")
    rows = [
        ("", "float32", f"rewritten ({chosen})"),
        ("nodes converted", "-", f"{report['converted_nodes']} of {report['total_nodes']}"),
        ("casts inserted", "-", f"{report['casts_to_low']} to {chosen}, {report['casts_to_high']} to float32"),
        ("output dtype", str(ref.dtype), str(got.dtype)),
        ("output difference", "-", f"max {diff:.1e} ({100 * diff / scale:.2f}% of max output); "
                                   f"same top-1 class {agree}/{len(ref)}"),
        (f"step time (batch {_BATCH})", f"{times['float32'] * 1e3:.2f} ms",
         f"{times['rewritten'] * 1e3:.2f} ms ({speed})"),
    ]
    w("\n")
    for label, a, b in rows:
        w(f"  {label:24s} {a:12s} {b}\n")
    w(f"\nStep times are medians of {_ROUNDS} interleaved calls on this machine. Gains depend on the\n"
      "hardware: CPUs with AMX and GPUs with Tensor Cores gain most.\n")
    if save is not None:
        w(f"\nSaved both models in {save}. Ask why a node got its type:\n")
        for node in _example_nodes(report):
            w(f"  amp-rewrite explain {os.path.join(save, 'float32')} {node} --target {target_arg} "
              f"--precision {chosen}\n")
