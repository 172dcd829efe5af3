"""Rewrite in fresh Python processes with chosen ``PYTHONHASHSEED`` values.

Starting Python with TensorFlow takes seconds, so each seed gets one long-lived helper
process (:class:`amp_rewrite.graph.helper_process.HelperProcess`) that rewrites any number of
graphs; :func:`rewrite_digests` sends it a serialized GraphDef and the rewrite options and
gets back the SHA-256 of the output GraphDef and of the report.  Helpers are started on first
use and stopped at exit (or by :func:`stop_workers`).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import threading
from typing import Any, Mapping, Sequence

from ..graph.helper_process import HelperProcess

__all__ = ["rewrite_digests", "stop_workers"]

_workers: dict[int, HelperProcess] = {}
_lock = threading.Lock()


def _worker(seed: int) -> HelperProcess:
    helper = _workers.get(seed)
    if helper is None:
        helper = HelperProcess("amp_rewrite.testing.hashseed:answer",
                               env={"PYTHONHASHSEED": str(seed), "TF_CPP_MIN_LOG_LEVEL": "3"})
        _workers[seed] = helper
    return helper


def rewrite_digests(graph_bytes: bytes, options: Mapping[str, Any], seeds: Sequence[int]) -> dict[int, tuple[str, str]]:
    """``{seed: (sha256 of the output GraphDef, sha256 of the report as sorted JSON)}``.

    A rewrite that raises gives ``("error", "<ExceptionType>: <message>")``; a helper that
    died on it, ``("error", "the helper died: <why>")``.
    """
    out = {}
    with _lock:
        helpers = {int(seed): _worker(int(seed)) for seed in seeds}
        for helper in helpers.values():  # all of them at work, then each answer
            helper.submit("rewrite", (graph_bytes, dict(options)))
        for seed, helper in helpers.items():
            status, answer = helper.result()
            out[seed] = answer if status == "ok" else ("error", f"the helper {status}: {answer}")
    return out


@atexit.register
def stop_workers() -> None:
    """Stop every helper process."""
    with _lock:
        for helper in _workers.values():
            helper.close()
        _workers.clear()


def answer(kind: str, payload: Any) -> tuple[str, str]:  # pragma: no cover - runs in the helper
    """The helper's side: rewrite ``payload`` (GraphDef bytes, options) and digest it."""
    import amp_rewrite

    graph_bytes, options = payload
    try:
        result = amp_rewrite.rewrite_graph_def(graph_bytes, **options)
    except Exception as exc:  # noqa: BLE001 - reported to the caller
        return ("error", f"{type(exc).__name__}: {exc}")
    return (hashlib.sha256(result.graph_def.SerializeToString(deterministic=True)).hexdigest(),
            hashlib.sha256(json.dumps(result.report, sort_keys=True).encode()).hexdigest())
