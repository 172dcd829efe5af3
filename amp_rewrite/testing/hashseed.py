"""Rewrite in fresh Python processes with chosen ``PYTHONHASHSEED`` values.

Starting Python with TensorFlow takes seconds, so each seed gets one long-lived worker
process that rewrites any number of graphs; :func:`rewrite_digests` sends it a serialized
GraphDef and the rewrite options and gets back the SHA-256 of the output GraphDef and of the
report.  Workers are started on first use and stopped at exit (or by :func:`stop_workers`).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import pickle
import struct
import subprocess
import sys
import threading
from typing import Any, BinaryIO, Mapping, Sequence

__all__ = ["rewrite_digests", "stop_workers"]

_workers: dict[int, subprocess.Popen] = {}
_lock = threading.Lock()


def _send(stream: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _receive(stream: BinaryIO) -> Any:
    header = stream.read(8)
    if len(header) < 8:
        raise EOFError("the worker closed its output")
    (size,) = struct.unpack("<Q", header)
    return pickle.loads(stream.read(size))


def _worker(seed: int) -> subprocess.Popen:
    proc = _workers.get(seed)
    if proc is not None and proc.poll() is None:
        return proc
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONHASHSEED"] = str(seed)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    proc = subprocess.Popen([sys.executable, "-m", "amp_rewrite.testing.hashseed"], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    _workers[seed] = proc
    return proc


def rewrite_digests(graph_bytes: bytes, options: Mapping[str, Any], seeds: Sequence[int]) -> dict[int, tuple[str, str]]:
    """``{seed: (sha256 of the output GraphDef, sha256 of the report as sorted JSON)}``.

    A rewrite that raises gives ``("error", "<ExceptionType>: <message>")``.
    """
    out = {}
    with _lock:
        procs = {int(seed): _worker(int(seed)) for seed in seeds}  # start them all, then wait
        for proc in procs.values():
            assert proc.stdin is not None
            _send(proc.stdin, (graph_bytes, dict(options)))
        for seed, proc in procs.items():
            assert proc.stdout is not None
            out[seed] = _receive(proc.stdout)
    return out


@atexit.register
def stop_workers() -> None:
    """Stop every worker process."""
    with _lock:
        for proc in _workers.values():
            if proc.poll() is None and proc.stdin is not None:
                try:
                    proc.stdin.close()
                    proc.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    proc.kill()
        _workers.clear()


def _serve() -> None:  # pragma: no cover - runs in the worker process
    import amp_rewrite

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            graph_bytes, options = _receive(stdin)
        except EOFError:
            return
        try:
            result = amp_rewrite.rewrite_graph_def(graph_bytes, **options)
            reply = (hashlib.sha256(result.graph_def.SerializeToString(deterministic=True)).hexdigest(),
                     hashlib.sha256(json.dumps(result.report, sort_keys=True).encode()).hexdigest())
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            reply = ("error", f"{type(exc).__name__}: {exc}")
        _send(stdout, reply)


if __name__ == "__main__":  # pragma: no cover
    _serve()
