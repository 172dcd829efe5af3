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
    python bench/xla_dump_summary.py DIR --compare KERAS_MODULE OURS_MODULE
    python bench/xla_dump_summary.py DIR --times PROFILE.json KERAS_VARIANT OURS_VARIANT

``--compare`` (each a substring of one module's name) weighs two modules' memory traffic:
what every instruction of the entry computation that launches a kernel (a fusion, a library
call, a copy) reads and writes, from the shapes of its operands and result, summed per kind
and per TensorFlow op (the ``op_type`` and ``op_name`` XLA keeps in each instruction's
metadata, with layer numbers folded so that the twelve layers of an encoder add up), with the
largest differences first; a conditional's or loop's bodies are counted apart, not weighed.
It is how bench/GPU_RESULTS.md weighed our BERT step against Keras's: a byte difference
explains at most its time at the GPU's bandwidth.  ``--times`` weighs the same instructions by
the time their kernels took instead, from a ``bench/gpu_profile.py`` JSON of the two variants
(its ``xla_ops``: per module and instruction, ms per step), and says how much of each step's
kernel time ran outside the entry computation (a conditional's branches, a loop's body).

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


_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f16": 2, "bf16": 2, "s16": 2, "u16": 2, "f32": 4,
          "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16}
_SHAPE = re.compile(r"\b(pred|bf16|f8e\w+|c64|c128|[fsu]\d+)\[([0-9,]*)\]")
_DEF = re.compile(r"^\s*(?:ROOT\s+)?%(?P<name>[\w.\-]+)\s*=\s*(?P<type>.*?)\s(?P<op>[a-z\-]+)\((?P<rest>.*)$")
#: Entry instructions that launch nothing: they name, regroup or reinterpret buffers.
_NO_KERNEL = frozenset({"parameter", "constant", "get-tuple-element", "tuple", "bitcast"})
#: Entry instructions whose kernels are in other computations (a branch, a loop body): their
#: own operands and results are buffers handed over, not traffic, and their bodies are not
#: weighed here (``compare`` counts them apart).
_CONTROL = frozenset({"conditional", "while", "call"})


def shape_bytes(type_text: str, scratch: bool = True) -> int:
    """Bytes of every array in an HLO type (``f16[32,128]{1,0}`` or a tuple of them).
    ``scratch=False`` leaves out byte arrays (``s8``/``u8``): a library call's workspace.
    Pure."""
    total = 0
    for et, dims in _SHAPE.findall(type_text):
        if not scratch and et in ("s8", "u8"):
            continue
        n = 1
        for d in dims.split(","):
            if d:
                n *= int(d)
        total += n * _BYTES.get(et, 1 if et.startswith("f8") else 4)
    return int(total)


def _operands(rest: str) -> list[str]:
    """The operand names of an instruction, from the text after its opcode's ``(``.  Pure."""
    depth = 0
    for i, ch in enumerate(rest):
        if ch == "(":
            depth += 1
        elif ch == ")":
            if depth == 0:
                return re.findall(r"%([\w.\-]+)", rest[:i])
            depth -= 1
    return []


def entry_traffic(text: str) -> list[dict[str, Any]]:
    """Every kernel-launching instruction of a module's entry computation with the bytes it
    reads (its operands' shapes) and writes (its result, without a library call's workspace),
    its kind (``classify``'s, else the opcode) and the TensorFlow op it came from.  Pure."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("ENTRY")), None)
    if start is None:
        return []
    sizes: dict[str, int] = {}
    out = []
    for line in lines[start + 1:]:
        if line.startswith("}"):
            break
        m = _DEF.match(line)
        if not m:
            continue
        op = m.group("op")
        written = shape_bytes(m.group("type"), scratch=op != "custom-call")
        sizes[m.group("name")] = written
        if op in _NO_KERNEL or op in _CONTROL:
            continue
        c = classify(line)
        kind = c[0] if c else op
        if kind == "fusion":
            k = re.search(r"kind=(k\w+)", line)
            kind = f"fusion.{k.group(1) if k else '?'}"
        op_type = re.search(r'op_type="([^"]+)"', line)
        op_name = re.search(r'op_name="([^"]+)"', line)
        out.append({"name": m.group("name"), "kind": kind, "op_type": op_type.group(1) if op_type else "?",
                    "op_name": op_name.group(1) if op_name else "?", "written": written,
                    "read": sum(sizes.get(o, 0) for o in _operands(m.group("rest")))})
    return out


def _control_count(text: str) -> int:
    """Entry instructions that hand over to other computations (:data:`_CONTROL`).  Pure."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("ENTRY")), None)
    n = 0
    for line in lines[start + 1:] if start is not None else []:
        if line.startswith("}"):
            break
        m = _DEF.match(line)
        n += bool(m and m.group("op") in _CONTROL)
    return n


def _op_key(rec: dict[str, Any]) -> str:
    """``op_type op_name`` with layer numbers and a leading ``amp_rewrite/`` scope folded, so
    that the same op of every layer, in Keras's graph and in ours, shares one key.  Pure."""
    name = re.sub(r"^amp_rewrite/", "", rec["op_name"])
    name = re.sub(r"_\d+(?=/|$)", "", name)
    return f"{rec['op_type']} {re.sub(r'[0-9]+', 'N', name)}"


def traffic_by(records: list[dict[str, Any]], key: Any) -> dict[str, dict[str, int]]:
    """Kernels and bytes summed per ``key(record)``.  Pure."""
    out: dict[str, dict[str, int]] = collections.defaultdict(lambda: {"kernels": 0, "read": 0, "written": 0})
    for r in records:
        agg = out[key(r)]
        agg["kernels"] += 1
        agg["read"] += r["read"]
        agg["written"] += r["written"]
    return dict(out)


def compare(a_text: str, b_text: str, top: int = 20) -> str:
    """A table of two modules' traffic: totals and kinds, then the ``top`` TensorFlow ops whose
    bytes differ most (``b`` minus ``a``).  Pure."""
    a, b = entry_traffic(a_text), entry_traffic(b_text)
    lines = ["| | kernels A | GB A | kernels B | GB B |", "|---|---|---|---|---|"]

    def row(label: str, x: dict[str, int] | None, y: dict[str, int] | None) -> str:
        x = x or {"kernels": 0, "read": 0, "written": 0}
        y = y or {"kernels": 0, "read": 0, "written": 0}
        return (f"| {label} | {x['kernels']} | {(x['read'] + x['written']) / 1e9:.3f} | {y['kernels']} | "
                f"{(y['read'] + y['written']) / 1e9:.3f} |")

    lines.append(row("**all** (entry computation)", traffic_by(a, lambda r: "")[""] if a else None,
                     traffic_by(b, lambda r: "")[""] if b else None))
    ka, kb = traffic_by(a, lambda r: r["kind"]), traffic_by(b, lambda r: r["kind"])
    lines += [row(k, ka.get(k), kb.get(k)) for k in sorted(set(ka) | set(kb))]
    ca, cb = _control_count(a_text), _control_count(b_text)
    if ca or cb:
        lines.append(f"| conditional/while/call (their bodies' kernels not weighed) | {ca} | | {cb} | |")
    oa, ob = traffic_by(a, _op_key), traffic_by(b, _op_key)

    def moved(d: dict[str, int] | None) -> int:
        return (d["read"] + d["written"]) if d else 0

    keys = sorted(set(oa) | set(ob), key=lambda k: (-abs(moved(ob.get(k)) - moved(oa.get(k))), k))
    lines += ["", "| TensorFlow op | GB A | GB B | B - A |", "|---|---|---|---|"]
    lines += [f"| {k} | {moved(oa.get(k)) / 1e9:.3f} | {moved(ob.get(k)) / 1e9:.3f} | "
              f"{(moved(ob.get(k)) - moved(oa.get(k))) / 1e9:+.3f} |" for k in keys[:top]]
    return "\n".join(lines) + "\n"


def module_key(name: str) -> str:
    """A module's name as both a dump and a profile can be matched by: without the ``(id)``
    a profiler may append, nor the ``.N`` unique id XLA appends to the name in the module's
    ``HloModule`` line (and which a dump's file name drops).  Pure."""
    return re.sub(r"\.\d+$", "", re.sub(r"\(\d+\)$", "", name.strip()))


def module_times(xla_ops: dict[str, dict[str, float]], module: str) -> dict[str, float]:
    """ms per step of each instruction of ``module`` (its name) in a profile's ``xla_ops``
    (``module/instruction`` -> ``{"ms": ...}``): the entries whose module is ``module``, as
    :func:`module_key` matches names.  Pure."""
    out: dict[str, float] = collections.defaultdict(float)
    for key, rec in xla_ops.items():
        mod, _, instruction = key.rpartition("/")
        if module_key(mod) == module_key(module):
            out[instruction] += rec["ms"]
    return dict(out)


def compare_times(a_text: str, b_text: str, times_a: dict[str, float], times_b: dict[str, float],
                  top: int = 20) -> str:
    """:func:`compare` weighed by time: each entry instruction's kernels' ms per step
    (``times_*``, :func:`module_times`), summed per kind and per TensorFlow op, with the time
    of instructions that are not the entry computation's (branches, loop bodies) apart.  Pure."""
    a, b = entry_traffic(a_text), entry_traffic(b_text)

    def by(records: list[dict[str, Any]], times: dict[str, float], key: Any) -> dict[str, float]:
        out: dict[str, float] = collections.defaultdict(float)
        for r in records:
            out[key(r)] += times.get(r["name"], 0.0)
        return dict(out)

    def outside(records: list[dict[str, Any]], times: dict[str, float]) -> float:
        names = {r["name"] for r in records}
        return sum(ms for name, ms in times.items() if name not in names)

    lines = ["| | ms A | ms B | B - A |", "|---|---|---|---|"]

    def row(label: str, x: float, y: float) -> str:
        return f"| {label} | {x:.3f} | {y:.3f} | {y - x:+.3f} |"

    lines.append(row("**all kernels**", sum(times_a.values()), sum(times_b.values())))
    lines.append(row("outside the entry computation (branches, loop bodies)", outside(a, times_a),
                     outside(b, times_b)))
    ka, kb = by(a, times_a, lambda r: r["kind"]), by(b, times_b, lambda r: r["kind"])
    lines += [row(k, ka.get(k, 0.0), kb.get(k, 0.0)) for k in sorted(set(ka) | set(kb))]
    oa, ob = by(a, times_a, _op_key), by(b, times_b, _op_key)
    keys = sorted(set(oa) | set(ob), key=lambda k: (-abs(ob.get(k, 0.0) - oa.get(k, 0.0)), k))
    lines += ["", "| TensorFlow op | ms A | ms B | B - A |", "|---|---|---|---|"]
    lines += [row(k, oa.get(k, 0.0), ob.get(k, 0.0)) for k in keys[:top]]
    return "\n".join(lines) + "\n"


def main_module(xla_ops: dict[str, dict[str, float]]) -> str:
    """The module that took most of a profile's kernel time (a variant's step), its name
    without the ``(id)`` the profiler may add.  Pure."""
    per_module: dict[str, float] = collections.defaultdict(float)
    for key, rec in xla_ops.items():
        per_module[module_key(key.rpartition("/")[0])] += rec["ms"]
    if not per_module:
        raise SystemExit("the profile has no XLA kernels")
    return max(sorted(per_module), key=per_module.__getitem__)


def _module_file_text(path: str, module: str) -> str:
    """The after-optimizations text of the module named ``module`` (as :func:`module_key`
    matches names) in the dump ``path``."""
    found = [f for f in sorted(os.listdir(path)) if (m := _FILE.match(f))
             and module_key(m.group("name")) == module_key(module)]
    if len(found) != 1:
        raise SystemExit(f"{len(found)} modules in {path} are named {module!r}")
    with open(os.path.join(path, found[0]), errors="replace") as f:
        return f.read()


def _module_name(path: str, part: str) -> str:
    """The name of the one module of the dump ``path`` whose file name holds ``part``."""
    found = [m.group("name") for f in sorted(os.listdir(path)) if (m := _FILE.match(f)) and part in f]
    if len(found) != 1:
        raise SystemExit(f"{len(found)} modules in {path} match {part!r}; name one")
    return found[0]


def _profile_ops(path: str, variant: str) -> dict[str, dict[str, float]]:
    """The ``xla_ops`` of ``variant`` in a ``gpu_profile.py`` JSON (its one workload that has
    the variant)."""
    with open(path) as f:
        data = json.load(f)
    found = [recs[variant] for recs in data["workloads"].values() if variant in recs]
    if len(found) != 1 or "xla_ops" not in found[0]:
        raise SystemExit(f"{path}: no one profile of {variant!r} with XLA instructions")
    return found[0]["xla_ops"]


def _module_text(path: str, part: str) -> str:
    """The after-optimizations text of the one module of the dump ``path`` whose name holds
    ``part``."""
    found = [f for f in sorted(os.listdir(path)) if _FILE.match(f) and part in f]
    if len(found) != 1:
        raise SystemExit(f"{len(found)} modules in {path} match {part!r}; name one")
    with open(os.path.join(path, found[0]), errors="replace") as f:
        return f.read()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dump_dir")
    p.add_argument("--json", help="write the summary here (default: stdout)")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"),
                   help="weigh two modules' memory traffic (substrings of their names) and exit")
    p.add_argument("--times", nargs=3, metavar=("PROFILE", "VARIANT_A", "VARIANT_B"),
                   help="weigh two variants' modules by the kernel times of a gpu_profile.py JSON (each "
                        "variant's module: --compare's, else the one that took most of its time) and exit")
    p.add_argument("--top", type=int, default=20,
                   help="TensorFlow ops listed by --compare and --times, largest difference first (default 20)")
    args = p.parse_args(argv)
    if not os.path.isdir(args.dump_dir):
        print(f"no XLA dump at {args.dump_dir}: nothing was compiled with XLA", file=sys.stderr)
        return 2
    if args.times:
        profile, *variants = args.times
        ops = [_profile_ops(profile, v) for v in variants]
        modules = ([_module_name(args.dump_dir, part) for part in args.compare] if args.compare
                   else [main_module(o) for o in ops])
        texts = [_module_file_text(args.dump_dir, m) for m in modules]
        print(compare_times(*texts, *(module_times(o, m) for o, m in zip(ops, modules)), top=args.top), end="")
        return 0
    if args.compare:
        print(compare(*(_module_text(args.dump_dir, part) for part in args.compare), top=args.top), end="")
        return 0
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
