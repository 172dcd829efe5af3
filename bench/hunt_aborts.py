#!/usr/bin/env python
"""Flip every byte of some fuzz graphs, one at a time, and feed each mutant to the API in a
worker process that is restarted when a mutant kills it: find the inputs that crash the
process (a CHECK in TensorFlow's C++, an abort, memory exhaustion), which a Hypothesis run
cannot report because it dies with them.

    PYTHONPATH=. python bench/hunt_aborts.py --out /tmp/hunt                 # 15 graphs, ~10 min
    PYTHONPATH=. python bench/hunt_aborts.py --out /tmp/hunt --graphs 60 --seed 2
    PYTHONPATH=. python bench/hunt_aborts.py --out /tmp/hunt --built     # shape plumbing, tf.function
    PYTHONPATH=. python bench/hunt_aborts.py --out /tmp/hunt --graph model.pb   # your own graphs

The graphs are :func:`amp_rewrite.testing.fuzz.base_graphs` (what the fuzz tests mutate),
drawn with Hypothesis from ``--seed``; each byte of a serialized graph takes the values 0x00,
0x01, 0x02, 0x08, 0x10, 0x7f, 0x80, 0xff and its own value plus or minus one and xor one
(enum values, lengths, field tags and varint continuation bits).  Each mutant goes through
:func:`amp_rewrite.estimate_step_time` for a GPU: the import stage, TensorFlow's shape
inference on the inert copy (where TensorFlow's C++ runs on untrusted input), and the cost
model.  A mutant must be refused with :class:`~amp_rewrite.AmpRewriteError` or priced; any
other exception is an *escape*, a dead worker a *crash*.

Writes ``OUT/report.md`` (counts, and every crash and escape with the mutated byte and the
last line TensorFlow logged), ``OUT/crashes/<index>.bin`` (the mutant) and ``.err`` (the
worker's stderr tail).  A worker's memory is capped (``--memory-gb``, ``RLIMIT_AS``) so that a
mutant that claims gigabytes fails in its worker instead of waking the OOM killer.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pickle
import resource
import subprocess
import sys
import time
from typing import Iterator

VALUES = (0x00, 0x01, 0x02, 0x08, 0x10, 0x7F, 0x80, 0xFF)


def mutants(graphs: list[bytes]) -> Iterator[tuple[int, int, int, bytes]]:
    """``(graph index, byte position, new value, mutant)`` for every single-byte change of
    :data:`VALUES` and the byte's neighbours, in a fixed order (the worker's index)."""
    for gi, base in enumerate(graphs):
        for pos, old in enumerate(base):
            for value in sorted((set(VALUES) | {old ^ 1, (old + 1) & 0xFF, (old - 1) & 0xFF}) - {old}):
                yield gi, pos, value, base[:pos] + bytes([value]) + base[pos + 1:]


def draw_graphs(count: int, seed: int) -> list[bytes]:
    """``count`` distinct serialized graphs of :func:`~amp_rewrite.testing.fuzz.base_graphs`,
    smallest first (Hypothesis, derandomized by ``seed``)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hypothesis_seed

    from amp_rewrite.testing.fuzz import base_graphs

    drawn: list[bytes] = []

    @hypothesis_seed(seed)
    @settings(max_examples=count, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(base_graphs())
    def collect(case) -> None:
        drawn.append(case.graph_def.SerializeToString())

    collect()
    return sorted(set(drawn), key=lambda b: (len(b), b))[:count]


def built_graphs() -> list[bytes]:
    """Two graphs built with TensorFlow, for what the drawn ones lack: shape plumbing whose
    values the shape refiner computes (``Shape``, ``StridedSlice``, ``Pack``, ``Fill``,
    ``Pad``, ``Slice``, ``Split``, ``Tile``, ``GatherV2``, ``Range``, ``OneHot``,
    ``BroadcastTo``, ...), and a ``tf.function`` step with a functional ``While``, an ``If`` and
    a nested call (bodies in the function library)."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (None, 8, 6), name="x")
        idx = tf.compat.v1.placeholder(tf.int32, (None,), name="idx")
        batch = tf.strided_slice(tf.shape(x), [0], [1], [1], shrink_axis_mask=1)
        h = tf.matmul(tf.reshape(x, tf.stack([batch, -1])), tf.fill(tf.stack([48, 16]), 0.5))
        h = tf.slice(tf.pad(h, [[0, 0], [1, 1]]), [0, 0], tf.stack([batch, 16]))
        left, right = tf.split(h, 2, axis=1)
        h = tf.squeeze(tf.expand_dims(tf.tile(tf.concat([right, left], axis=1), tf.constant([1, 2])), 1), [1])
        h = tf.gather(h, tf.range(0, 32, 2), axis=1)
        h = h + tf.broadcast_to(tf.reduce_sum(tf.one_hot(idx, 16), 0), tf.shape(h))
        h = tf.transpose(tf.reshape(h, tf.concat([tf.shape(h)[:1], [4, 4]], 0)), [0, 2, 1])
        tf.reduce_mean(tf.linalg.matmul(h, h), name="out")

    @tf.function
    def inner(h):
        return tf.reshape(tf.matmul(h, tf.transpose(h)), tf.stack([tf.shape(h)[0], -1]))

    @tf.function(input_signature=[tf.TensorSpec((None, 8), tf.float32)])
    def step(x):
        def body(i, h):
            return i + 1, tf.nn.relu(tf.matmul(h, tf.ones((8, 8)) * 0.1))

        _, h = tf.while_loop(lambda i, h: i < 3, body, [tf.constant(0), x])
        h = tf.cond(tf.reduce_sum(h) > 0, lambda: h * 2.0, lambda: h - 1.0)
        return tf.reduce_mean(tf.nn.softmax(inner(h)))

    return [graph.as_graph_def().SerializeToString(deterministic=True),
            step.get_concrete_function().graph.as_graph_def().SerializeToString(deterministic=True)]


def worker(out: str, start: int) -> None:
    """Feed every mutant from index ``start`` on to the API, writing the index about to run to
    ``OUT/progress`` first (a crash leaves it there) and escapes to ``OUT/escapes.txt``."""
    import logging

    import amp_rewrite
    from amp_rewrite.errors import AmpRewriteError

    logging.disable(logging.CRITICAL)
    with open(os.path.join(out, "graphs.pkl"), "rb") as f:
        graphs = pickle.load(f)
    priced = refused = escaped = 0
    with open(os.path.join(out, "progress"), "w") as progress:

        def note(index: int | str) -> None:
            # Fixed width, so each write covers the last; a crash leaves the mutant that killed
            # the worker and the counts before it.
            progress.seek(0)
            progress.write(f"{index:>12} {priced:12d} {refused:12d} {escaped:12d}\n")
            progress.flush()

        for index, (gi, pos, value, data) in enumerate(mutants(graphs)):
            if index < start:
                continue
            note(index)
            try:
                amp_rewrite.estimate_step_time(data, target="gpu:8.0")
                priced += 1
            except AmpRewriteError:
                refused += 1
            except Exception as exc:  # noqa: BLE001 - what the hunt looks for
                escaped += 1
                with open(os.path.join(out, "escapes.txt"), "a") as f:
                    f.write(f"{index}\tgraph {gi} byte {pos} -> {value:#04x}\t{type(exc).__name__}: "
                            f"{str(exc)[:300]!r}\n")
        note("done")


def _last_log_line(err: str) -> str:
    """The line a dying TensorFlow logged (a failed CHECK, an F-level line), else the last."""
    lines = [line for line in err.splitlines() if line.strip()]
    for line in lines:
        if "Check failed" in line or line.startswith("F0000") or "terminate called" in line:
            return line.strip()[:300]
    return lines[-1].strip()[:300] if lines else ""


def supervise(out: str, memory_gb: float) -> tuple[list[dict[str, object]], dict[str, int], float]:
    """Run workers until every mutant has been fed, restarting after each crash from the next
    mutant.  Returns the crashes, the other mutants' outcomes and the wall time."""
    crashes: list[dict[str, object]] = []
    counts = {"priced": 0, "refused": 0, "escaped": 0}
    start, t0 = 0, time.perf_counter()
    os.makedirs(os.path.join(out, "crashes"), exist_ok=True)
    limit = int(memory_gb * 2**30)

    def cap_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    while True:
        err_path = os.path.join(out, "worker.err")
        with open(err_path, "w") as err:
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", str(start), "--out", out],
                                  stdout=subprocess.DEVNULL, stderr=err, preexec_fn=cap_memory,
                                  env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        with open(os.path.join(out, "progress")) as f:
            last, *numbers = f.read().split()
        for key, value in zip(counts, numbers):
            counts[key] += int(value)
        if last == "done":
            return crashes, counts, time.perf_counter() - t0
        index = int(last)
        with open(err_path, errors="replace") as f:
            tail = f.read()[-20000:]
        with open(os.path.join(out, "crashes", f"{index}.err"), "w") as f:
            f.write(tail)
        crashes.append({"index": index, "returncode": proc.returncode, "log": _last_log_line(tail)})
        print(f"crash at mutant {index} (exit {proc.returncode}): {crashes[-1]['log']}", flush=True)
        start = index + 1


def report(out: str, graphs: list[bytes], crashes: list[dict[str, object]], counts: dict[str, int],
           seconds: float, source: str) -> str:
    """The markdown report of a hunt, with each crash's mutated byte.  Also saves each crashing
    mutant as ``OUT/crashes/<index>.bin``."""
    total = sum(1 for _ in mutants(graphs))
    escapes = []
    if os.path.exists(os.path.join(out, "escapes.txt")):
        with open(os.path.join(out, "escapes.txt")) as f:
            escapes = f.read().splitlines()
    by_index = {c["index"]: c for c in crashes}
    lines = [f"# Byte-flip hunt for process crashes ({datetime.date.today()})", "",
             f"`python bench/hunt_aborts.py {source}`: {len(graphs)} distinct graphs "
             f"({sum(map(len, graphs))} bytes), {total} mutants through "
             f"`amp_rewrite.estimate_step_time(target=\"gpu:8.0\")` in {seconds / 60:.1f} min.", "",
             "| outcome | mutants |", "|---|---|",
             f"| priced | {counts['priced']} |", f"| refused (`AmpRewriteError`) | {counts['refused']} |",
             f"| escaped (another exception) | {counts['escaped']} |", f"| crashed the process | {len(crashes)} |",
             ""]
    if crashes:
        lines += ["| mutant | graph | byte | old -> new | exit | last log line |", "|---|---|---|---|---|---|"]
        for index, (gi, pos, value, data) in enumerate(mutants(graphs)):
            crash = by_index.get(index)
            if crash is None:
                continue
            with open(os.path.join(out, "crashes", f"{index}.bin"), "wb") as f:
                f.write(data)
            lines.append(f"| {index} | {gi} | {pos} | {graphs[gi][pos]:#04x} -> {value:#04x} | "
                         f"{crash['returncode']} | `{crash['log']}` |")
        lines.append("")
    if escapes:
        lines += ["Escapes (index, mutation, exception):", "", "```text", *escapes[:50], "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for the report and the crashing mutants")
    parser.add_argument("--graphs", type=int, default=15, help="graphs to mutate (default 15)")
    parser.add_argument("--seed", type=int, default=1, help="Hypothesis seed of the graphs (default 1)")
    parser.add_argument("--graph", action="append", default=[],
                        help="a GraphDef file (.pb or .pbtxt) to mutate instead of drawn graphs (repeatable)")
    parser.add_argument("--built", action="store_true",
                        help="mutate the two graphs of built_graphs() (shape plumbing, functional control flow) "
                             "instead of drawn graphs")
    parser.add_argument("--memory-gb", type=float, default=8.0, help="address-space cap of a worker (default 8)")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker(args.out, args.worker)
        return 0
    os.makedirs(args.out, exist_ok=True)
    for name in ("escapes.txt", "progress"):
        if os.path.exists(os.path.join(args.out, name)):
            os.remove(os.path.join(args.out, name))
    if args.graph:
        import amp_rewrite

        graphs = [amp_rewrite.load_graph_def(path).SerializeToString(deterministic=True) for path in args.graph]
    elif args.built:
        graphs = built_graphs()
    else:
        graphs = draw_graphs(args.graphs, args.seed)
    with open(os.path.join(args.out, "graphs.pkl"), "wb") as f:
        pickle.dump(graphs, f)
    crashes, counts, seconds = supervise(args.out, args.memory_gb)
    source = (" ".join(f"--graph {path}" for path in args.graph) if args.graph
              else "--built" if args.built else f"--graphs {args.graphs} --seed {args.seed}")
    text = report(args.out, graphs, crashes, counts, seconds, source)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(text)
    print(text)
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
