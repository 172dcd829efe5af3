"""Issue 22's done-when lines 1 and 2, judged from GPU benchmark runs.

``bench/gpu_bench.py`` writes every variant's step time per repeat (the variants of one repeat
run round robin, so a repeat's times are paired).  This script reads one or more of its JSON
files and says, per workload record, what the lines ask.  Records of one workload with the
same variants are splits of one run (a later file's wins, a partial one never over a finished
one, as ``gpu_bench --merge`` merges them); records with other variants (the same workload
without XLA in one call and under XLA in the next) are judged each on its own, since a
comparison pairs variants of one run only:

* **Line 1** (training steps measured with ``ours_user`` and ``keras_mixed_xla``): ours as a
  user enables it against Keras's ``mixed_float16`` + XLA, and against float32 + XLA, paired
  per repeat: the median of the per-repeat ratios, the range, and in how many repeats ours
  was faster.
* **Line 2**: the best (by median step) of our built-in variants (not ``--extra-variant``
  experiments) in each mode (without XLA: ``ours_default``, ``ours_optimal``,
  ``ours_tensorflow``, ``ours_autotune``, ``ours_measured``, and ``ours_user`` where it did not
  compile; with XLA: ``*_xla`` and ``ours_user`` where it compiled) against TensorFlow's pass
  and float32 in the same mode (TensorFlow's pass runs without XLA only): the median of the
  per-repeat ratios where both ran the same repeats, as line 1 pairs them, else the ratio of
  the medians; and the first step's error against ``float32_strict`` (where the run had it)
  next to TensorFlow's pass's and Keras's.

A comparison *holds* where ours is no slower than the other by more than the workload's A/A
gap (``float32_again`` against ``float32``; 2% where the run had no A/A pair, and then the
verdict says so), and an error holds where ours is at most the larger of TensorFlow's pass's
and Keras's.  Nothing here is measured: it only reads measurements.  Pure but for reading the
files.

Usage::

    python bench/gpu_done_when.py bench/gpu_runs/2026-11-27b-h200/gpu_norm.json \\
        bench/gpu_runs/2026-11-27b-h200/gpu_more.json [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gpu_bench  # noqa: E402  (loads no TensorFlow)

#: The slack a comparison gets where its run had no A/A pair to measure the noise by.
DEFAULT_NOISE = 0.02
#: Our variants that run without XLA on a GPU (``ours_user`` joins them where it did not compile).
OURS_NO_XLA = ("ours_default", "ours_optimal", "ours_tensorflow", "ours_autotune", "ours_measured")


def _compiled(name: str, record: dict[str, Any]) -> bool:
    """Whether variant ``name`` ran under XLA: from its record where it says (ours: the
    baseline the benchmark measured it against), else from its spec.  Pure."""
    baseline = record.get("measured_ratio_baseline")
    if baseline is not None:
        return baseline == "float32_xla"
    return gpu_bench.variant_spec(name).jit_compile is True


def _paired(a: dict[str, Any], b: dict[str, Any]) -> list[float]:
    """Per-repeat ratios of ``a``'s step over ``b``'s (repeats both ran).  Pure."""
    return [x / y for x, y in zip(a.get("step_ms_per_repeat") or [], b.get("step_ms_per_repeat") or []) if y]


def _noise(workload: dict[str, Any]) -> tuple[float, bool]:
    """The workload's A/A gap, and whether it was measured (else :data:`DEFAULT_NOISE`)."""
    aa = workload.get("aa_gap")
    return (aa, True) if aa is not None and math.isfinite(aa) else (DEFAULT_NOISE, False)


def _verdict(ratio: float | None, noise: float) -> str:
    if ratio is None or not math.isfinite(ratio):
        return "not measured"
    return "holds" if ratio <= 1.0 + noise else "fails"


def line1(workload: dict[str, Any]) -> dict[str, Any] | None:
    """Line 1 of a training workload that ran ``ours_user`` and ``keras_mixed_xla``, or
    ``None``.  Pure."""
    variants = workload["variants"]
    ours, keras = variants.get("ours_user"), variants.get("keras_mixed_xla")
    if not workload.get("train") or ours is None or keras is None:
        return None
    noise, measured = _noise(workload)
    row: dict[str, Any] = {"noise": noise, "noise_measured": measured}
    for label, other in (("keras", keras), ("float32_xla", variants.get("float32_xla"))):
        ratios = _paired(ours, other) if other else []
        median = statistics.median(ratios) if ratios else None
        row[label] = {"median": median, "min": min(ratios, default=None), "max": max(ratios, default=None),
                      "faster": sum(r < 1.0 for r in ratios), "repeats": len(ratios),
                      "verdict": _verdict(median, noise)}
    return row


def _best(variants: dict[str, Any], names: list[str]) -> tuple[str, float] | None:
    """The fastest (median step) of ``names`` that ran.  Pure."""
    ran = [(n, variants[n]["step_ms"]) for n in names if n in variants
           and variants[n].get("step_ms") is not None and math.isfinite(variants[n]["step_ms"])]
    return min(ran, key=lambda item: item[1]) if ran else None


def _ratio(ours: dict[str, Any], other: dict[str, Any]) -> float:
    """``ours``' step over ``other``'s: the median of the per-repeat ratios where both ran the
    same repeats (a repeat's variants ran round robin, so a drift of the machine's speed
    between repeats cancels, as in line 1), else the ratio of the medians.  Pure."""
    paired = _paired(ours, other)
    if paired and len(paired) == len(ours.get("step_ms_per_repeat") or []):
        return statistics.median(paired)
    return ours["step_ms"] / other["step_ms"]


def line2(workload: dict[str, Any]) -> dict[str, Any]:
    """Line 2 of one workload: per mode, our best variant against TensorFlow's pass and
    float32 in that mode, and the errors.  Pure."""
    variants = workload["variants"]
    noise, measured = _noise(workload)
    # Our built-in variants only: an --extra-variant is an experiment, not a profile a user has.
    ours_names = [n for n in variants if n.startswith("ours_") and n in gpu_bench.VARIANTS]
    modes: dict[str, Any] = {}
    for mode, f32 in (("no XLA", "float32"), ("XLA", "float32_xla")):
        compiled = mode == "XLA"
        names = [n for n in ours_names if _compiled(n, variants[n]) == compiled
                 and (compiled or n in OURS_NO_XLA or n == "ours_user")]
        best = _best(variants, names)
        entry: dict[str, Any] = {"ours": best[0] if best else None, "ours_ms": best[1] if best else None}
        for label, other in (("float32", f32), ("tf_amp", None if compiled else "tf_amp")):
            ref = variants.get(other) if other else None
            ratio = _ratio(variants[best[0]], ref) if best and ref and ref.get("step_ms") else None
            entry[label] = {"variant": other, "ratio": ratio,
                            "verdict": _verdict(ratio, noise) if other else "n/a"}
        modes[mode] = entry
    errors = {n: v.get("rel_err_vs_float32_strict") for n, v in variants.items()
              if v.get("rel_err_vs_float32_strict") is not None}
    ours_err = [(n, e) for n, e in errors.items() if n in ours_names]
    others = [errors[n] for n in errors if n == "tf_amp" or n.startswith("keras_mixed")]
    if not ours_err or not others:
        error = {"verdict": "not measured (no float32_strict in the run)" if not errors else "not measured"}
    else:
        worst_ours = max(ours_err, key=lambda item: item[1])
        error = {"ours": worst_ours, "others_max": max(others),
                 "verdict": "holds" if worst_ours[1] <= max(others) else "fails"}
    return {"noise": noise, "noise_measured": measured, "modes": modes, "error": error}


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "n/a" if value is None or not math.isfinite(value) else format(value, spec)


def read_runs(paths: list[str]) -> dict[str, Any]:
    """The workload records of ``paths`` (``gpu_bench`` JSON files, in order), each with its
    file's name under ``"run"``: one record per workload and variant set (a later file's wins,
    unless it is partial and the earlier one finished), in the order first seen.  Reads the
    files; mutates nothing it was given."""
    by_key: dict[tuple[str, tuple[str, ...]], dict[str, Any]] = {}
    sources = []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        sources.append({"file": path, "date": data.get("machine", {}).get("date")})
        for rec in data["workloads"]:
            key = (rec["workload"], tuple(sorted(rec["variants"])))
            earlier = by_key.get(key)
            if rec.get("partial") and earlier is not None and not earlier.get("partial"):
                continue  # a stopped run's partial record does not replace a finished one
            by_key[key] = {**rec, "run": os.path.basename(path)}
    return {"merged_from": sources, "workloads": list(by_key.values())}


def render(results: dict[str, Any]) -> str:
    """The judgement of every workload record of ``results`` (:func:`read_runs`) as markdown.
    Pure."""
    sources = [f"`{os.path.basename(m['file'])}` ({m.get('date') or 'undated'})" for m in results.get("merged_from", [])]
    lines = ["# Issue 22, done-when lines 1 and 2, from measured runs", "",
             *([f"Written by `bench/gpu_done_when.py` from {', '.join(sources)}; the code and machine are "
                "the runs' own (their markdown says which).", ""] if sources else []),
             "Ratios are ours over the other variant's step (below 1: ours faster); a comparison holds "
             "within the workload's A/A gap.", "", "## Line 1: ours as enabled, training, paired per repeat", "",
             "| workload | ours / Keras mixed + XLA (median, range, faster in) | verdict | ours / float32 + XLA "
             "(median, range) | verdict | A/A |", "|---|---|---|---|---|---|"]
    for w in results["workloads"]:
        row = line1(w)
        if row is None:
            continue
        k, f = row["keras"], row["float32_xla"]
        noise = f"{100 * row['noise']:.1f}%" + ("" if row["noise_measured"] else " (assumed: no A/A pair)")
        lines.append(f"| {w['workload']} | {_fmt(k['median'])} ({_fmt(k['min'])}-{_fmt(k['max'])}, "
                     f"{k['faster']} of {k['repeats']}) | {k['verdict']} | {_fmt(f['median'])} "
                     f"({_fmt(f['min'])}-{_fmt(f['max'])}) | {f['verdict']} | {noise} |")
    lines += ["", "## Line 2: our best variant per mode against TensorFlow's pass and float32 (median of the "
              "per-repeat ratios)", "",
              "| workload | run | mode | ours (best) | / float32 | verdict | / TF's pass | verdict | A/A |",
              "|---|---|---|---|---|---|---|---|---|"]
    errors = []
    for w in results["workloads"]:
        judged = line2(w)
        noise = f"{100 * judged['noise']:.1f}%" + ("" if judged["noise_measured"] else " (assumed)")
        for mode, entry in judged["modes"].items():
            if entry["ours"] is None:
                continue
            f32, amp = entry["float32"], entry["tf_amp"]
            lines.append(f"| {w['workload']} | {w.get('run', '')} | {mode} | {entry['ours']} ({_fmt(entry['ours_ms'], '.2f')} ms) | "
                         f"{_fmt(f32['ratio'])} | {f32['verdict']} | {_fmt(amp['ratio'])} | {amp['verdict']} | {noise} |")
        err = judged["error"]
        if "ours" in err:
            errors.append(f"| {w['workload']} | {w.get('run', '')} | {err['ours'][0]} {err['ours'][1]:.2e} | {err['others_max']:.2e} | "
                          f"{err['verdict']} |")
        else:
            errors.append(f"| {w['workload']} | {w.get('run', '')} | | | {err['verdict']} |")
    lines += ["", "Errors (first step's loss or outputs against `float32_strict`; ours: the largest of our "
              "variants'; others: the larger of TF's pass's and Keras's):", "",
              "| workload | run | ours (worst) | TF's pass / Keras (worst) | verdict |", "|---|---|---|---|---|",
              *errors]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", help="gpu_bench JSON files (a later file's record of a workload "
                   "with the same variants wins)")
    p.add_argument("--out", help="markdown file (default: stdout)")
    args = p.parse_args(argv)
    text = render(read_runs(args.results))
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
