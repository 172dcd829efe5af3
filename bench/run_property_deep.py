#!/usr/bin/env python
"""Run the property-based tests and the fuzzed boundary under the ``deep`` Hypothesis profile
and write the measured report to ``bench/property_report.md``.

    python bench/run_property_deep.py                 # the deep profile (about half an hour)
    python bench/run_property_deep.py --profile ci --report /tmp/ci_report.md
    python bench/run_property_deep.py --from-log      # rewrite the report from the last log

It runs ``pytest tests/test_property_*.py tests/test_fuzz.py`` with Hypothesis statistics on,
keeps the full log and a JUnit file in the temporary directory (``--log``), and writes one row
per property test: examples tried (passing / failing / invalid), time, outcome; then the
known core issues (strict xfails), the Hypothesis events and every failure with its
falsifying example.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Which invariant (or part of the boundary) each property test checks.
WHAT = {
    "test_rewritten_graph_is_valid_and_runs": "valid",
    "test_allow_and_deny_lists_are_honoured": "allow/deny",
    "test_interface_is_preserved": "interface",
    "test_casts_are_minimal_in_form": "casts are minimal in form",
    "test_rewrite_is_idempotent": "idempotent",
    "test_output_is_deterministic_in_process": "deterministic (in process)",
    "test_output_is_deterministic_across_hash_seeds": "deterministic (PYTHONHASHSEED 0, 1, 4242)",
    "test_moving_an_op_to_deny_never_converts_more": "monotone",
    "test_outputs_stay_close_to_float32": "numerics",
    "test_converted_set_equals_tensorflows": "parity (vs TensorFlow's pass)",
    "test_mutated_graphs_get_only_the_products_error_from_the_api": "fuzz: mutated graphs -> API",
    "test_garbage_options_get_only_the_products_error_from_the_api": "fuzz: garbage options -> API",
    "test_mutated_graph_files_get_one_line_from_the_cli": "fuzz: mutated graph files -> CLI",
    "test_garbage_cli_options_get_one_line_from_the_cli": "fuzz: garbage options -> CLI",
    "test_hostile_saved_model_layouts_are_refused_or_copied_safely": "fuzz: hostile SavedModel layouts -> CLI",
}
FUZZ = [k for k, v in WHAT.items() if v.startswith("fuzz")]

#: Core issues these tests found that have been fixed since; each is a regression test now.
FIXED = [
    "The Cast -> Cast fold rewrote `SrcT` of an existing Cast that is preserved or on an "
    "ineligible device (allow/deny; `test_property_checkers.py::"
    "test_regression_cast_fold_leaves_unprocessed_casts_alone`).",
    "The report did not show a Cast whose `SrcT` the fold changed (allow/deny, deep profile; "
    "`test_property_checkers.py::test_regression_report_shows_the_cast_fold`).",
    "A NUL byte in `lists` / `lists_file` let `ValueError: embedded null byte` escape the API "
    "(fuzzed options, deep profile; `test_fuzz.py::test_regression_nul_byte_in_a_list_path`).",
    "A list path with a line break made the CLI's error message two lines (fuzzed CLI options, "
    "deep profile; `test_fuzz.py::test_regression_line_break_in_a_list_path`).",
    "The optimal planner converted *more* when an op moved to deny: with `NextIteration` on the "
    "deny list a TF1 loop's plumbing, tied into one group, stayed in low precision while its MatMul "
    "went back to float32 (monotone, deep profile under every level and planner; "
    "`test_optimal.py::test_moving_next_iteration_to_deny_never_converts_a_loop_more`).",
    "The graph strategy itself: a loop body numbered its steps from 0, so a body Const could take "
    "the name of a captured outer value and shadow it, and the drawn graph could not be built "
    "(numerics, deep profile; "
    "`test_property_strategies.py::test_a_loop_body_never_reuses_a_name_of_its_program`).",
]


def _statistics(log: str) -> dict[str, dict[str, object]]:
    """Parse ``--hypothesis-show-statistics`` output: test id -> counts and seconds."""
    stats: dict[str, dict[str, object]] = {}
    current = None
    for line in log.splitlines():
        m = re.match(r"^(tests/\S+::\S+):\s*$", line.strip())
        if m:
            current = m.group(1)
            stats[current] = {"passing": 0, "failing": 0, "invalid": 0, "seconds": 0.0, "events": []}
            continue
        if current is None:
            continue
        m = re.search(r"during (\w+) phase \(([\d.]+) seconds\)", line)
        if m:
            stats[current]["seconds"] = float(stats[current]["seconds"]) + float(m.group(2))
            stats[current]["phase"] = m.group(1)
            continue
        m = re.search(r"(\d+) passing examples?, (\d+) failing examples?, (\d+) invalid examples?", line)
        if m and stats[current].get("phase") in ("generate", "explicit", "reuse"):
            for key, value in zip(("passing", "failing", "invalid"), m.groups()):
                stats[current][key] = int(stats[current][key]) + int(value)
            continue
        m = re.match(r"^\s*\*\s*([\d.]+%), (.*)$", line)
        if m:
            stats[current]["events"].append(f"{m.group(1)} {m.group(2)}")
    return stats


def _falsifying_examples(log: str) -> list[str]:
    """The "Falsifying example" blocks of a pytest log, without pytest's ``E`` prefixes."""
    blocks, current = [], None
    for line in log.splitlines():
        body = re.sub(r"^E\s{0,19}", "", line)
        if "Falsifying example" in body:
            current = [body.strip()]
        elif current is not None:
            current.append(body.rstrip())
            if "reproduce this example" in body or len(current) > 60:
                blocks.append("\n".join(current))
                current = None
    return blocks


def _junit(path: str) -> dict[str, tuple[str, float, str]]:
    """test id -> (outcome, seconds, xfail reason or failure message)."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        cid = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = "FAILED", (child.get("message") or "").splitlines()[0][:300]
            elif child.tag == "skipped":
                message = child.get("message") or ""
                outcome = "xfail" if "xfail" in (child.get("type", "") + message) else "skipped"
        out[cid] = (outcome, float(case.get("time", 0)), message)
    return out


def _run(profile: str, log_path: str, junit: str, extra: list[str]) -> tuple[list[str], int, float]:
    tests = sorted(glob.glob(os.path.join(ROOT, "tests", "test_property_*.py"))) + [
        os.path.join(ROOT, "tests", "test_fuzz.py")]
    cmd = [sys.executable, "-m", "pytest", *[os.path.relpath(t, ROOT) for t in tests], "-p", "no:cacheprovider",
           f"--hypothesis-profile={profile}", "--hypothesis-show-statistics", f"--junitxml={junit}",
           "-q", "-rA", *extra]
    env = dict(os.environ, HYPOTHESIS_PROFILE=profile)
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        code = subprocess.call(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    return cmd, code, time.perf_counter() - t0


def _report(profile: str, log_path: str, junit: str, wall: float, code: int | None) -> list[str]:
    import hypothesis
    import tensorflow as tf

    with open(log_path, errors="replace") as f:
        text = f.read()
    command = text.splitlines()[0][2:] if text.startswith("$ ") else (
        f"python -m pytest tests/test_property_*.py tests/test_fuzz.py -p no:cacheprovider "
        f"--hypothesis-profile={profile} --hypothesis-show-statistics --junitxml={junit} -q -rA")
    command = command.replace(sys.executable, "python").replace(ROOT + "/", "")
    stats = _statistics(text)
    outcomes = _junit(junit) if os.path.exists(junit) else {}
    summary = next((l for l in reversed(text.splitlines()) if re.search(r"\d+ (passed|failed)", l)), "")
    finished = datetime.datetime.fromtimestamp(os.path.getmtime(log_path), datetime.timezone.utc)
    lines = [
        "# Property-based tests: deep run",
        "",
        f"Measured report of `python bench/run_property_deep.py` (Hypothesis profile `{profile}`), "
        f"finished {finished:%Y-%m-%d %H:%M} UTC.",
        "",
        f"* command: `{command}`",
        f"* machine: {platform.machine()}, {os.cpu_count()} CPU cores, no GPU; "
        f"Python {platform.python_version()}, TensorFlow {tf.__version__}, "
        f"Hypothesis {hypothesis.__version__}",
        f"* wall time: {wall / 60:.1f} minutes; pytest: `{summary.strip('= ')}`"
        + (f" (exit status {code})" if code is not None else ""),
        "",
        "Examples are Hypothesis' counts (generate phase plus explicit `@example`s): each passing",
        "example is one random graph (or one fuzzed input) checked end to end.  Graphs are drawn",
        "with loops, function calls, control edges and four devices; precision, target (GPU or",
        "CPU), lists (`default` / `tensorflow` / `optimal`), planner (the profile's, `greedy`,",
        "`optimal`, `min-casts`), level (`DEFAULT`, `TENSOR_CORES_ONLY`, `TREAT_INFER_AS_DENY`,",
        "`UNSAFE_FORCE_ALL` on GPU targets) and fetches are drawn with them.  Fuzzed inputs include",
        "recursive and too-deep function libraries, hostile terminal strings in names and",
        "arguments of the wrong type.",
        "",
        "\"invalid\" counts draws Hypothesis abandoned before running the test (a draw over its size",
        "limit for one example, or a rejected value); they are neither checked nor counted above.",
        "",
        "| what | test | examples passing | failing | invalid | time (s) | outcome |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    total_fuzz = 0
    per_invariant = []
    for test_id, s in sorted(stats.items(), key=lambda kv: (WHAT.get(kv[0].split("::")[-1], "~"), kv[0])):
        name = test_id.split("::")[-1]
        outcome, seconds, _ = outcomes.get(test_id, ("?", float(s["seconds"]), ""))
        if name in FUZZ:
            total_fuzz += int(s["passing"])
        elif name in WHAT:
            per_invariant.append(int(s["passing"]))
        lines.append(f"| {WHAT.get(name, '(strategies / checkers)')} | `{test_id}` | {s['passing']} | "
                     f"{s['failing']} | {s['invalid']} | {seconds:.0f} | {outcome} |")
    lines += ["", f"Random graphs per invariant: at least **{min(per_invariant, default=0)}**. "
              f"Fuzzed inputs in all: **{total_fuzz}** (API and CLI)."]
    other = [(tid, o) for tid, o in sorted(outcomes.items()) if tid not in stats]
    if other:
        passed = sum(1 for _, (o, _, _) in other if o == "passed")
        rest = "" if passed == len(other) else ", the rest are listed below"
        lines += ["", f"Other tests of these files (unit tests, one test per op, regression tests): {passed} "
                  f"of {len(other)} passed{rest}."]
    known = [(tid, msg) for tid, (o, _, msg) in sorted(outcomes.items()) if o == "xfail"]
    if known:
        lines += ["", "## Known core issues (strict xfails)", ""]
        seen = set()
        for tid, msg in known:
            reason = re.sub(r"^reason:\s*", "", msg)
            if reason in seen:
                continue
            seen.add(reason)
            lines.append(f"* `{tid.split('::')[-1].split('[')[0]}`: {reason}")
    lines += ["", "## Found by these tests and fixed since (now regression tests)", ""]
    lines += [f"* {item}" for item in FIXED]
    events = [(tid, e) for tid, s in stats.items() for e in s["events"]]
    if events:
        lines += ["", "## Hypothesis events (share of examples)", ""]
        lines += [f"* `{tid.split('::')[-1]}`: {e}" for tid, e in events]
    failures = [(tid, msg) for tid, (o, _, msg) in sorted(outcomes.items()) if o == "FAILED"]
    lines += ["", "## Failures", ""]
    lines += [f"* `{tid}`: {msg}" for tid, msg in failures] or ["None."]
    for block in _falsifying_examples(text)[:5]:
        lines += ["", "```text", block, "```"]
    lines += ["", f"Full log of that run: `{log_path}` (JUnit: `{junit}`).", ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="deep")
    parser.add_argument("--report", default=os.path.join(ROOT, "bench", "property_report.md"))
    parser.add_argument("--log", default=os.path.join(tempfile.gettempdir(), "amp_rewrite_property_deep.log"))
    parser.add_argument("--from-log", action="store_true", help="only rewrite the report from --log")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    junit = os.path.splitext(args.log)[0] + ".junit.xml"
    if args.from_log:
        with open(args.log, errors="replace") as f:
            text = f.read()
        m = re.findall(r" in ([\d.]+)s", text)
        wall = float(m[-1]) if m else 0.0
        code = 1 if re.search(r"\d+ (failed|error)", text.splitlines()[-1] if text else "") else 0
    else:
        _, code, wall = _run(args.profile, args.log, junit, args.pytest_args)
    with open(args.report, "w") as f:
        f.write("\n".join(_report(args.profile, args.log, junit, wall, code)))
    print(f"wrote {args.report} ({wall / 60:.1f} min, exit {code})")
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
