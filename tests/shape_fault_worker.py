"""A shape helper that aborts, as a TensorFlow ``CHECK`` failure would, on any graph holding a
node named ``amp_rewrite_abort_here`` (``tests/test_shape_process.py``); otherwise it answers as
the real one does.  A few more kinds of request drive the helper's own tests: ``hang``,
``echo`` (the payload back), ``sleep`` (``(seconds, value)``: ``value`` after that long),
``log`` (logs the payload at INFO on an ``amp_rewrite`` logger, then echoes it) and
``scream`` (writes the payload to standard error, then aborts); ``call`` as the real one.  Imported in the helper
process only."""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

MARKER = b"amp_rewrite_abort_here"


def answer(kind: str, payload: Any) -> Any:
    if kind == "echo":
        return payload
    if kind == "sleep":
        seconds, value = payload
        time.sleep(seconds)
        return value
    if kind == "log":
        logging.getLogger("amp_rewrite.tests.fault_worker").info("from the helper: %s", payload)
        return payload
    if kind == "scream":
        print(payload, file=sys.stderr, flush=True)
        os.abort()
    if kind == "call":
        from amp_rewrite.graph.shape_worker import answer as real

        return real(kind, payload)
    serialized, _ = payload
    if MARKER in serialized:
        os.abort()
    if kind == "hang":
        time.sleep(3600)
    if kind not in ("graph", "function"):
        raise ValueError(f"unknown shape request {kind!r}")  # before TensorFlow's import: fast
    from amp_rewrite.graph.shapes import answer_shape_request

    return answer_shape_request(kind, payload)
