"""What XLA really compiled: a summary of an XLA dump directory (``--xla_dump_to``).

Issue 22 asks for proof that a rewritten step ran under XLA, not only that ``jit_compile`` was
set.  Run the benchmark with ``XLA_FLAGS="--xla_dump_to=DIR --xla_dump_hlo_as_text"``; XLA then
writes every module it compiles, before and after its optimizations.  This script reads the
*after optimizations* text of each module and counts, per module, the work that matters for
mixed precision, split by element type:

* convolutions (cuDNN custom calls, or ``convolution`` instructions on backends without them),
* matrix products (cuBLAS/cuBLASLt custom calls, Triton GEMM fusions, ``dot`` instructions),
* fusions (how much element-wise work XLA merged) and ``convert`` instructions (Casts),
* ``conditional`` and ``while`` instructions: a conditional left in a GPU step runs as a copy of
  its predicate to the host and a wait (the loss scale's skip of a non-finite update must have
  become selects).

Usage::

    python bench/xla_dump_summary.py DIR [--json OUT]

Our rewritten steps are the modules whose name holds ``amp_rewrite_`` (the runner's function
name, see ``amp_rewrite/training/tf_function.py``); Keras's own steps hold ``train_function`` or
``predict_function`` (or ``one_step_on_data``).  Pure reading: the dump is not modified.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
from typing import Any

#: An HLO instruction line: ``%name = TYPE opcode(`` (TYPE may be a tuple in parentheses).
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<type>\(?[a-z0-9]+)\[?.*?\s(?P<op>[a-z\-]+)\(")
_ELEMENT = re.compile(r"\(?(?P<et>[a-z]+[0-9]*)")
_TARGET = re.compile(r'custom_call_target="(?P<target>[^"]+)"')
_KIND = re.compile(r'"kind":"(?P<kind>__[a-z_]+)"')

_FILE = re.compile(r"^module_\d+\.(?P<name>.+?)\.(?P<rest>.*)after_optimizations\.txt$")


def element_type(type_text: str) -> str:
    """``f16`` from ``f16[64,3]{1,0}`` or ``(f16[...], u8[0])``.  Pure."""
    m = _ELEMENT.match(type_text)
    return m.group("et") if m else "?"


def classify(line: str) -> tuple[str, str] | None:
    """``(kind, element type)`` of one HLO instruction line, for the kinds this summary counts
    (``conv``, ``matmul``, ``fusion``, ``convert``, ``conditional``, ``while``), else ``None``.
    Pure."""
    m = _INSTRUCTION.match(line)
    if not m:
        return None
    op, et = m.group("op"), element_type(m.group("type"))
    if op == "custom-call":
        target = _TARGET.search(line)
        t = target.group("target") if target else ""
        if "conv" in t.lower():
            return "conv", et
        if "gemm" in t.lower() or "matmul" in t.lower():
            return "matmul", et
        return None
    if op == "convolution":
        return "conv", et
    if op == "dot":
        return "matmul", et
    if op == "fusion":
        kind = _KIND.search(line)
        if kind and "gemm" in kind.group("kind"):
            return "matmul", et
        return "fusion", et
    if op == "convert":
        return "convert", et
    if op in ("conditional", "while"):
        return op, et
    return None


def summarize_module(text: str) -> dict[str, dict[str, int]]:
    """Counts per kind and element type in one module's HLO text (every computation of it:
    a fusion's body holds its converts).  Pure."""
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in text.splitlines():
        c = classify(line)
        if c:
            counts[c[0]][c[1]] += 1
    return {k: dict(sorted(v.items())) for k, v in sorted(counts.items())}


def summarize_dir(path: str) -> list[dict[str, Any]]:
    """One record per module XLA compiled (its after-optimizations text), in file order."""
    out = []
    for fname in sorted(os.listdir(path)):
        m = _FILE.match(fname)
        if not m:
            continue
        with open(os.path.join(path, fname), errors="replace") as f:
            text = f.read()
        out.append({"file": fname, "module": m.group("name"),
                    "amp_rewrite": "amp_rewrite_" in m.group("name"),
                    "counts": summarize_module(text)})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dump_dir")
    p.add_argument("--json", help="write the summary here (default: stdout)")
    args = p.parse_args(argv)
    if not os.path.isdir(args.dump_dir):
        print(f"no XLA dump at {args.dump_dir}: nothing was compiled with XLA", file=sys.stderr)
        return 2
    summary = summarize_dir(args.dump_dir)
    text = json.dumps(summary, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    else:
        print(text)
    for rec in summary:  # one short line each, for the device call's output tail
        c = rec["counts"]
        print(f"{rec['module'][:70]:70s} conv {c.get('conv', {})} matmul {c.get('matmul', {})} "
              f"fusions {sum(c.get('fusion', {}).values())} converts {sum(c.get('convert', {}).values())} "
              f"conditionals {sum(c.get('conditional', {}).values())}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
