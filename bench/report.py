"""Turn ``results.json`` of bench/bench.py into ``RESULTS.md`` and PNG plots."""

from __future__ import annotations

import json
import os
import statistics
import sys
from typing import Any

__all__ = ["write_report"]


def _f(x: Any, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def _aa_gap(g: dict[str, Any]) -> float | None:
    """This graph's A/A gap: |float32_again / float32 - 1|, the same graph timed twice."""
    st = g["step_s"]
    if st.get("float32") and st.get("float32_again"):
        return abs(st["float32_again"] / st["float32"] - 1)
    return None


def _slower(graphs: list[dict[str, Any]], key: str, than: str, margin: float = 1.05) -> list[str]:
    """Graphs whose step time with ``key`` exceeds ``than``'s by more than ``margin``, each
    with the gap and, where measured, the graph's A/A gap (its noise in this run)."""
    out = []
    for g in graphs:
        st = g["step_s"]
        if st.get(key) and st.get(than) and st[key] > st[than] * margin:
            aa = _aa_gap(g)
            note = f"+{st[key] / st[than] - 1:.0%}" + (f", A/A {aa:.0%}" if aa is not None else "")
            out.append(f"{g['name']} ({note})")
    return out


def _is_float32(g: dict[str, Any], key: str) -> bool:
    """Whether variant ``key`` of graph ``g`` is the float32 graph itself: its rewrite changed
    nothing (``same_as_float32``, byte-compared by bench.py), or autotune kept float32."""
    if key in g.get("same_as_float32", ()):
        return True
    return key == "ours_auto_bf16" and (g.get("autotune_bf16") or {}).get("choice") == "float32"


def _split_same_as_float32(graphs: list[dict[str, Any]], key: str, slower: list[str]) -> tuple[list[str], list[str]]:
    """Split ``slower`` (from :func:`_slower` against float32) into the graphs whose ``key``
    variant differs from float32 and those where it *is* the float32 graph: a gap between
    two timings of one graph is the run's A/A noise, not a slower model."""
    same_names = {g["name"] for g in graphs if _is_float32(g, key)}
    same = [n for n in slower if n.split(" (")[0] in same_names]
    return [n for n in slower if n not in same], same


def _same_note(same: list[str]) -> str:
    return (f" Timed apart from float32 although the graph *is* the float32 graph (the rewrite kept "
            f"float32 throughout; the same graph timed twice, i.e. noise): {', '.join(same)}." if same else "")


def _errors(g: dict[str, Any]) -> dict[str, float | None]:
    """The error the numerics goal reads: outputs for inference, the loss for training (the
    weights after one Adam step carry only gradient signs; see bench.py)."""
    return g.get("loss_rel_error") or g.get("rel_error") or {}


#: Slack of the numerics goal on training losses.  The errors are medians over input batches
#: (bench.py's ``--numerics-batches``).  On the batch-2 training losses one batch's error
#: ranges over two orders of magnitude (mobilenetv2/training, TensorFlow's bfloat16 rewrite:
#: 1.6e-4 to 1.5e-1 over 16 batches), and its median over the first 6 of them was 3.7x below
#: the median over all 16 (measured 2026-11-22): medians that close are ties, not findings.
#: The goal lines still name every training graph inside this slack (``_near_error``).
ERROR_MARGIN = 1.10
#: Inference outputs do not swing that way with the input: 1%.
ERROR_MARGIN_INFERENCE = 1.01


def _margin(g: dict[str, Any]) -> float:
    return ERROR_MARGIN if "loss_rel_error" in g else ERROR_MARGIN_INFERENCE


#: Absolute slack of the error comparisons, for ties at zero: one float32 rounding of 1.  It
#: was 1e-6, which hid vgg16/training's optimal loss error of 4.7e-6 against TensorFlow's 4.1e-6
#: (15% more, past the 10% margin) in the 2026-11-27 run.
TIE_SLACK = 1.2e-7


def _worse_error(graphs: list[dict[str, Any]], ours: str, tf: str) -> list[str]:
    """Graphs where ``ours``'s (median) error exceeds TensorFlow's beyond the graph's margin
    (and :data:`TIE_SLACK` for exact ties at zero)."""
    out = []
    for g in graphs:
        e = _errors(g)
        if e.get(ours) is not None and e.get(tf) is not None and e[ours] > e[tf] * _margin(g) + TIE_SLACK:
            out.append(f"{g['name']} ({ours.rsplit('_', 1)[1]}{_paired(g, ours, tf)})")
    return out


def _near_error(graphs: list[dict[str, Any]], ours: str, tf: str) -> list[str]:
    """Training graphs where ``ours``'s median error is above TensorFlow's by more than 1% but
    inside ERROR_MARGIN: not counted against the goal, but named, so the slack hides nothing."""
    out = []
    for g in graphs:
        e = _errors(g)
        if ("loss_rel_error" in g and e.get(ours) is not None and e.get(tf) is not None
                and e[tf] * ERROR_MARGIN_INFERENCE + TIE_SLACK < e[ours] <= e[tf] * ERROR_MARGIN + TIE_SLACK):
            out.append(f"{g['name']} ({ours.rsplit('_', 1)[1]}, +{e[ours] / e[tf] - 1:.0%}{_paired(g, ours, tf)})")
    return out


def _error_goal(graphs: list[dict[str, Any]], pairs: list[tuple[str, str]]) -> str:
    worse = [x for ours, tf in pairs for x in _worse_error(graphs, ours, tf)]
    near = [x for ours, tf in pairs for x in _near_error(graphs, ours, tf)]
    text = "met." if not worse else "NOT met for " + ", ".join(worse) + "."
    if near:
        text += " Worse by less than the training-loss margin: " + ", ".join(near) + "."
    return text + (_FLOOR_NOTE if worse or near else "")


def _paired(g: dict[str, Any], ours: str, tf: str) -> str:
    """How often ``ours`` beat TensorFlow batch by batch: medians of heavy-tailed errors can
    rank two rewrites one way while the paired batches rank them the other."""
    per = g.get("loss_rel_error_batches") or g.get("rel_error_batches") or {}
    a, b = per.get(ours), per.get(tf)
    if not a or not b or len(a) != len(b):
        return ""
    lower = sum(x < y for x, y in zip(a, b))
    out = f"; lower error than TF on {lower} of {len(a)} batches"
    floor = _errors(g).get("f32_inputs_" + ours.rsplit("_", 1)[1])
    if floor:
        out += f"; floor {floor:.1e}"
    return out


_FLOOR_NOTE = (" (\"floor\": the error of the float32 graph with its input rounded to that precision, a "
               "measure of how strongly that output reacts to a perturbation of that size.)")


def _batches(graphs: list[dict[str, Any]]) -> str:
    counts = sorted({g.get("numerics_batches", 1) for g in graphs})
    return "/".join(str(c) for c in counts)


def _goal_lines(results: dict[str, Any]) -> list[str]:
    graphs = results.get("graphs", [])
    lines = []
    if graphs:
        ratios = sorted(g["rewrite_s"]["ratio_ours_over_tf"] for g in graphs)
        med = ratios[len(ratios) // 2]
        lines.append(f"- **Rewrite time at or below TensorFlow's on the median corpus graph:** median ratio "
                     f"ours/TF = {med:.2f} -> {'met' if med <= 1.0 else 'NOT met'}.")
        for key, label in (("ours_bf16", "default profile"), ("ours_auto_bf16", "`--autotune`")):
            if not any(g["step_s"].get(key) for g in graphs):
                continue
            slower_tf, slower_fp32 = _slower(graphs, key, "tf_bf16"), _slower(graphs, key, "float32")
            lines.append(f"- **Every corpus model at least as fast with our rewrite as with TensorFlow's** ({label}; "
                         "bfloat16 on this CPU, 5% noise margin): "
                         + ("met." if not slower_tf else "NOT met for " + ", ".join(slower_tf) + "."))
            slower_fp32, same = _split_same_as_float32(graphs, key, slower_fp32)
            lines.append(f"- **No corpus model slower than float32** ({label}; bfloat16 on this CPU, 5% margin): "
                         + ("met." if not slower_fp32 else "NOT met for " + ", ".join(slower_fp32) + ".")
                         + _same_note(same))
        lines.append("- **Relative output error no worse than TensorFlow's rewrite** (default profile, float16 and "
                     "bfloat16; medians over input batches; inference outputs with a 1% margin, training losses "
                     "with 10%): " + _error_goal(graphs, [("ours_fp16", "tf_fp16"), ("ours_bf16", "tf_bf16")]))
    if graphs and all("ours_optimal" in g["quality_fp16"] for g in graphs):
        more = [g["name"] for g in graphs
                if g["quality_fp16"]["ours_optimal"]["casts"] > g["quality_fp16"]["tensorflow"]["casts"]
                or g["quality_fp16"]["ours_optimal"]["cast_bytes"] > g["quality_fp16"]["tensorflow"]["cast_bytes"]]
        lines.append("- **[issue 7] Optimal planner: Cast count and Cast bytes no larger than TensorFlow's on every "
                     "corpus graph** (float16, GPU 8.0): " + ("met." if not more else "NOT met for " + ", ".join(more) + "."))
        for g in graphs:
            if g["name"] == "resnet50/training":
                t, o = g["quality_fp16"]["tensorflow"]["casts"], g["quality_fp16"]["ours_optimal"]["casts"]
                cut = 1 - o / t if t else 0.0
                lines.append(f"- **[issue 7] At least 30% fewer Casts on the Keras 3 ResNet50 training step:** "
                             f"{t} -> {o} ({cut:.0%} fewer) -> {'met' if cut >= 0.3 else 'NOT met'}.")
        slow_tf, slow_32 = _slower(graphs, "ours_opt_bf16", "tf_bf16"), _slower(graphs, "ours_opt_bf16", "float32")
        slow_32, same = _split_same_as_float32(graphs, "ours_opt_bf16", slow_32)
        lines.append("- **[issue 7] Optimal planner at least as fast as TensorFlow's rewrite and not slower than "
                     "float32** (bfloat16 on this CPU, 5% noise margin): "
                     + ("met." if not (slow_tf or slow_32) else
                        "NOT met: " + "; ".join(x for x in (
                            ("slower than TF for " + ", ".join(slow_tf)) if slow_tf else "",
                            ("slower than float32 for " + ", ".join(slow_32)) if slow_32 else "") if x) + ".")
                     + _same_note(same))
        lines.append("- **[issue 7] Optimal planner's output error no worse than TensorFlow's rewrite** (medians "
                     "over input batches; inference outputs with a 1% margin, training losses with 10%): "
                     + _error_goal(graphs, [("ours_opt_bf16", "tf_bf16"), ("ours_opt_fp16", "tf_fp16")]))
    rows = [r for r in results.get("scaling", []) if "total_s" in r]
    big = [r for r in rows if r["nodes"] >= 999_000]
    if big:
        r = big[0]
        ok = r["total_s"] < 60 and r["peak_rss_mb"] < 8192
        lines.append(f"- **1M nodes in under 60 s and 8 GB:** {r['total_s']:.1f} s, peak RSS {r['peak_rss_mb']:.0f} MB "
                     f"-> {'met' if ok else 'NOT met'}.")
    elif rows:
        lines.append("- **1M nodes in under 60 s and 8 GB:** not measured in this run (see the scaling table).")
    opt = [r for r in results.get("optimal_scaling", []) if "planner_cpu_s" in r]
    if opt:
        # CPU time, not wall time: on a shared machine the wall time counts other processes too.
        base = opt[0]
        worst = max(opt, key=lambda r: r["planner_cpu_us_per_node"])
        ok = worst["planner_cpu_us_per_node"] <= 2 * base["planner_cpu_us_per_node"]
        lines.append(f"- **[issue 24] Optimal planner linear on long chains** (CPU time per node within 2x of "
                     f"its time at {base['nodes']} nodes): {base['planner_cpu_us_per_node']:.1f} us/node at "
                     f"{base['nodes']}, at most {worst['planner_cpu_us_per_node']:.1f} us/node (at {worst['nodes']}) "
                     f"-> {'met' if ok else 'NOT met'}.")
    return lines


#: The columns of the per-process table: the A/A control and the bfloat16 rewrites.
_BY_PROCESS = (("float32_again", "float32 again (A/A)"), ("tf_bf16", "TF bf16"), ("ours_bf16", "ours bf16"),
               ("ours_opt_bf16", "optimal bf16"), ("ours_auto_bf16", "autotune bf16"))


def _by_process_lines(graphs: list[dict[str, Any]]) -> list[str]:
    """A table of each graph's ratios to float32 in each timing process (bench.py
    ``--processes``), or nothing where the step times came from one process.  The main table's
    medians pool every process's rounds; this shows how far the processes agreed."""
    timed = [g for g in graphs if len(g.get("step_s_by_process") or []) > 1]
    if not timed:
        return []
    lines = ["", "## Step time per timing process (ratio to float32 in the same process)", "",
             "Each graph's rounds were spread over fresh processes; the table above pools them.  Here each "
             "process's own medians, as ratios to its own float32, separated by `/`: where they straddle 1.00 "
             "one process alone would have ranked the rewrite the other way.", "",
             "| graph | " + " | ".join(label for _, label in _BY_PROCESS) + " |",
             "|---|" + "---|" * len(_BY_PROCESS)]
    for g in timed:
        cells = []
        for key, _ in _BY_PROCESS:
            ratios = [p[key] / p["float32"] if p.get(key) and p.get("float32") else None
                      for p in g["step_s_by_process"]]
            cells.append(" / ".join(_f(r) for r in ratios))
        lines.append(f"| {g['name']} | " + " | ".join(cells) + " |")
    return lines


#: The bfloat16 rewrites whose estimates the estimated-against-measured table shows.
_ESTIMATED = (("tf_bf16", "TF bf16"), ("ours_bf16", "ours bf16"), ("ours_opt_bf16", "optimal bf16"))


def _estimated_lines(graphs: list[dict[str, Any]]) -> list[str]:
    """The cost model's estimated ratio to float32 of each bfloat16 rewrite beside the measured
    one, with a summary of the optimal plan's error; nothing for a run without estimates."""
    rows = [g for g in graphs if g.get("estimated_bf16")]
    if not rows:
        return []
    lines = ["", "## Estimated against measured (bfloat16, this CPU's class)", "",
             "Each bfloat16 rewrite's step time over float32's: measured (the table above) / estimated by the "
             "cost model (`amp_rewrite.estimate_step_time` for this CPU's class, every graph priced alike).  "
             "The optimal planner converts only what this estimate says gains, and keeps float32 unless the "
             "whole step is estimated 3% faster.", "",
             "| graph | A/A gap | " + " | ".join(f"{label}: measured / estimated" for _, label in _ESTIMATED) + " |",
             "|---|---|" + "---|" * len(_ESTIMATED)]
    errors = []
    for g in rows:
        st, est = g["step_s"], g["estimated_bf16"]
        cells = []
        for key, _ in _ESTIMATED:
            measured = st[key] / st["float32"] if st.get(key) and st.get("float32") else None
            cells.append(f"{_f(measured, '{:.3f}')} / {_f(est.get(key), '{:.3f}')}")
            if key == "ours_opt_bf16" and measured and est.get(key):
                errors.append((est[key] / measured - 1, g["name"]))
        gap = _aa_gap(g)
        lines.append(f"| {g['name']} | {_f(gap * 100 if gap is not None else None, '{:.1f}%')} | "
                     + " | ".join(cells) + " |")
    if errors:
        worst = max(errors, key=lambda e: abs(e[0]))
        lines += ["", f"Optimal bf16: the estimate is off by {statistics.median(abs(e) for e, _ in errors):.1%} "
                      f"of the measured ratio in the median over {len(errors)} graphs (those it keeps float32 "
                      f"included: there the miss is timing noise), at most {worst[0]:+.1%} ({worst[1]})."]
    return lines


def write_report(results: dict[str, Any], out: str) -> None:
    m = results["machine"]
    lines = [
        "# Benchmark results",
        "",
        f"Measured {m['date']} on {m['cpu']} ({m['cores']} cores; CPU flags: {' '.join(m['cpu_flags'])}), "
        f"GPUs: {m['gpus'] or 'none'}; Python {m['python']}, TensorFlow {m['tensorflow']}, "
        f"amp_rewrite {m['amp_rewrite']}, oneDNN {m.get('onednn', '?')}. Rewrite time: {results['repeats']} repeats (medians). Step time: "
        f"variants interleaved round-robin, at least {results['repeats']} rounds"
        + (f" and more for fast graphs, to fill about {results['budget_s']:.0f} s per graph (up to 41)"
           if results.get("budget_s") else "")
        + (f", spread over {results['processes']} fresh processes with one set of sessions each (a ratio "
           "between two graphs also depends on the process that times them)" if results.get("processes", 1) > 1
           else f", spread over {results['sessions']} sets of fresh sessions (a graph's speed also depends on "
           "the session it runs in)" if results.get("sessions", 1) > 1 else "")
        + f"; {results['iters']} steps per sample; medians. Produced by `python bench/bench.py"
        f"{' --quick' if results.get('quick') else ''}`; raw numbers in `results.json`."
        + "".join(f" Made again after the run with the planner of commit {r.get('commit') or '?'} ({r['date']}; "
                  "`bench.py --redo-numerics`): the Casts and errors of " + ", ".join(f"`{c}`" for c in r["columns"])
                  + ", whose step times were dropped (the graphs timed were the old plans)."
                  for r in results.get("numerics_redone", [])),
        "",
        "## Where the goals stand",
        "",
        *_goal_lines(results),
        "",
    ]
    if results.get("notes"):
        lines += ["## Notes on this run", "", *[f"- {n}" for n in results["notes"]], ""]
    graphs = results.get("graphs", [])
    if graphs:
        lines += [
            "## Rewrite time (virtual GPU 8.0, float16, TensorFlow's lists)",
            "",
            "| graph | nodes | TF pass ms | ours ms | ours/TF | lists | import | decide | rewrite | export |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for g in graphs:
            r, s = g["rewrite_s"], g["stages_s"]
            lines.append(
                f"| {g['name']} | {g['nodes']} | {r['tensorflow']*1e3:.1f} | {r['ours']*1e3:.1f} | "
                f"{r['ratio_ours_over_tf']:.2f} | " + " | ".join(f"{s[k]*1e3:.1f}" for k in
                                                            ("lists", "import", "decide", "rewrite", "export")) + " |")
        lines += [
            "",
            "## Cast quality (float16 for a GPU 8.0)",
            "",
            "| graph | casts TF / ours(tf lists) / ours(default) / optimal | cast MB TF / ours / default / optimal | converted attrs TF / ours / default / optimal | low-precision FLOP share TF / ours / default / optimal |",
            "|---|---|---|---|---|",
        ]
        for g in graphs:
            q = g["quality_fp16"]
            cols = [q["tensorflow"], q["ours_tensorflow_lists"], q["ours_default"]]
            if "ours_optimal" in q:
                cols.append(q["ours_optimal"])
            lines.append(
                f"| {g['name']} | " + " / ".join(str(c["casts"]) for c in cols) + " | "
                + " / ".join(f"{c['cast_bytes']/1e6:.2f}" for c in cols) + " | "
                + " / ".join(str(c["converted_attrs"]) for c in cols) + " | "
                + " / ".join(_f(c["low_flop_share"]) for c in cols) + " |")
        lines += [
            "",
            "## Step time on this machine (ms per step, median) and speed-up vs float32",
            "",
            "bfloat16: TensorFlow's `auto_mixed_precision_onednn_bfloat16` vs ours (`target=\"cpu\"`). "
            "float16: the graphs rewritten for a GPU 8.0, executed on this CPU; `force_all_fp16` is the "
            "ceiling (every float op forced to float16).  `float32 again` is the float32 graph in a second "
            "session, timed in the same rounds: its distance from `float32` is the graph's noise in this run "
            "(the A/A gap the goal lines quote).",
            "",
            "| graph | float32 | float32 again (A/A) | TF bf16 | ours bf16 | optimal bf16 | autotune bf16 (choice) | TF fp16 | ours fp16 | optimal fp16 | force-all fp16 | optimal bf16 / TF bf16 speed | autotune bf16 / TF bf16 speed | autotune bf16 vs fp32 |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for g in graphs:
            st, sp = g["step_s"], g["speedup_vs_fp32"]
            cells = [_f(st.get(k), "{:.2f}") if st.get(k) is None else f"{st[k]*1e3:.2f}"
                     for k in ("float32", "float32_again", "tf_bf16", "ours_bf16", "ours_opt_bf16",
                               "ours_auto_bf16", "tf_fp16", "ours_fp16", "ours_opt_fp16", "force_all_fp16")]
            tuned = g.get("autotune_bf16") or {}
            if tuned.get("choice"):
                # Older results have no round count.
                cells[5] += f" ({tuned['choice']}" + (f", {tuned['rounds']} rounds)" if tuned.get("rounds") else ")")

            def vs_tf(k: str) -> float | None:
                return (st["tf_bf16"] / st[k]) if st.get("tf_bf16") and st.get(k) else None

            lines.append(f"| {g['name']} | " + " | ".join(cells) + f" | {_f(vs_tf('ours_opt_bf16'))}x | "
                         f"{_f(vs_tf('ours_auto_bf16'))}x | {_f(sp.get('ours_auto_bf16'))}x |")
        lines += _by_process_lines(graphs)
        lines += _estimated_lines(graphs)
        lines += [
            "",
            "## Numerics: max relative error of outputs vs float32",
            "",
            f"Median over {_batches(graphs)} input batches (the corpus's own and random ones; every variant sees "
            "the same).  Inference graphs: every output.  Training graphs: the loss, and in brackets every output "
            "(the loss and two weights after one Adam step, which carry gradient signs only: near 1 means a "
            "different step, not a wrong graph).  `floor`: the float32 graph itself with its input rounded to that "
            "precision, which shows how strongly the output reacts to a perturbation of that size (large on "
            "the chaotic batch-2 training losses); `-` where the input is whole numbers (token ids, pixel "
            "values) and nothing is rounded.",
            "",
            "| graph | floor bf16 | TF bf16 | ours bf16 | optimal bf16 | autotune bf16 | floor fp16 | TF fp16 | "
            "ours fp16 | optimal fp16 | force-all fp16 |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for g in graphs:
            e, full = _errors(g), g.get("rel_error", {})
            cells = []
            for k in ("f32_inputs_bf16", "tf_bf16", "ours_bf16", "ours_opt_bf16", "ours_auto_bf16",
                      "f32_inputs_fp16", "tf_fp16", "ours_fp16", "ours_opt_fp16", "force_all_fp16"):
                cell = _f(e.get(k), "{:.2e}")
                if "loss_rel_error" in g:
                    cell += f" ({_f(full.get(k), '{:.1e}')})"
                cells.append(cell)
            lines.append(f"| {g['name']} | " + " | ".join(cells) + " |")
        nonfinite = [f"{g['name']} {k} on {n} of {g.get('numerics_batches', '?')}"
                     for g in graphs for k, n in sorted((g.get("nonfinite_batches") or {}).items()) if n]
        if "nonfinite_batches" in graphs[0] or nonfinite:
            lines += ["", "Batches with a non-finite output (overflow or NaN), which a median cannot show: "
                      + ("; ".join(nonfinite) if nonfinite else "none") + "."]
    opt_rows = results.get("optimal_scaling", [])
    if opt_rows:
        lines += [
            "",
            "## Scaling of the optimal planner (one long free chain, `lists=\"optimal\"`; each size in a "
            "fresh process)",
            "",
            "`planner s`: time in the optimal planner alone (pricing, the minimum cut, the guard), wall "
            "and CPU; `decide` includes it.",
            "",
            "| nodes | total s | us/node | planner s | planner us/node | planner CPU s | planner CPU us/node "
            "| import | decide | peak RSS MB |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in opt_rows:
            if "error" in r:
                lines.append(f"| {r['nodes']} | {r['error']} | | | | | | | | |")
                continue
            s = r["stages_s"]
            lines.append(f"| {r['nodes']} | {r['total_s']:.2f} | {r['us_per_node']:.1f} | {r['planner_s']:.2f} | "
                         f"{r['planner_us_per_node']:.1f} | {r['planner_cpu_s']:.2f} | "
                         f"{r['planner_cpu_us_per_node']:.1f} | {s['import']:.2f} | {s['decide']:.2f} | "
                         f"{r['peak_rss_mb']:.0f} |")
    rows = results.get("scaling", [])
    if rows:
        lines += [
            "",
            "## Scaling (synthetic residual MLP blocks; each size in a fresh process)",
            "",
            "`user s` / `sys s`: CPU time of the rewrite in Python and in the kernel; the kernel's share is "
            "mostly backing fresh memory (page faults), which grows with the peak RSS, not with our code's "
            "per-node work (older runs did not record it: `-`).",
            "",
            "| nodes | total s | us/node | lists | import | decide | rewrite | export | user s | sys s | "
            "peak RSS MB | RSS growth MB |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['nodes']} | {r['error']} | | | | | | | | | | |")
                continue
            s = r["stages_s"]
            lines.append(f"| {r['nodes']} | {r['total_s']:.2f} | {r['us_per_node']:.1f} | " +
                         " | ".join(f"{s[k]:.2f}" for k in ("lists", "import", "decide", "rewrite", "export")) +
                         f" | {_f(r.get('user_s'), '{:.2f}')} | {_f(r.get('sys_s'), '{:.2f}')}"
                         f" | {r['peak_rss_mb']:.0f} | {r['rss_growth_mb']:.0f} |")
    with open(os.path.join(out, "RESULTS.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    _plots(results, out)


def _plots(results: dict[str, Any], out: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install '.[bench]'); skipping plots", file=sys.stderr)
        return
    graphs = results.get("graphs", [])
    if graphs:
        names = [g["name"] for g in graphs]
        keys = [("tf_bf16", "TF bf16"), ("ours_bf16", "ours bf16"), ("ours_opt_bf16", "optimal bf16"),
                ("ours_auto_bf16", "autotune bf16"), ("tf_fp16", "TF fp16"),
                ("ours_fp16", "ours fp16"), ("force_all_fp16", "force-all fp16")]
        fig, ax = plt.subplots(figsize=(max(8, len(names) * 0.9), 4.5))
        width = 0.8 / len(keys)
        for i, (k, label) in enumerate(keys):
            ax.bar([x + i * width for x in range(len(names))],
                   [g["speedup_vs_fp32"].get(k, 0) for g in graphs], width, label=label)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(names))])
        ax.set_xticklabels(names, rotation=45, ha="right", fontsize=8)
        ax.set_ylabel("speed-up vs float32 (higher is better)")
        ax.set_title("Step time on this machine")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "speedup.png"), dpi=110)
        plt.close(fig)
    rows = [r for r in results.get("scaling", []) if "total_s" in r]
    if rows:
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [r["nodes"] for r in rows]
        for k in ("import", "decide", "rewrite", "export"):
            ax.plot(xs, [r["stages_s"][k] / r["nodes"] * 1e6 for r in rows], marker="o", label=k)
        ax.plot(xs, [r["us_per_node"] for r in rows], marker="o", color="black", label="total")
        ax.set_xscale("log")
        ax.set_xlabel("nodes")
        ax.set_ylabel("microseconds per node")
        ax.set_title("Rewrite cost per node (flat = linear)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "scaling.png"), dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "results.json")) as fh:
        write_report(json.load(fh), here)
