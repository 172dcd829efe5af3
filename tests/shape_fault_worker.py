"""A shape helper that aborts, as a TensorFlow ``CHECK`` failure would, on any graph holding a
node named ``amp_rewrite_abort_here`` (``tests/test_shape_process.py``); otherwise it answers as
the real one does.  Imported in the helper process only."""

from __future__ import annotations

import os
from typing import Any

MARKER = b"amp_rewrite_abort_here"


def answer(kind: str, payload: Any) -> Any:
    serialized, _ = payload
    if MARKER in serialized:
        os.abort()
    if kind == "hang":
        import time

        time.sleep(3600)
    if kind not in ("graph", "function"):
        raise ValueError(f"unknown shape request {kind!r}")  # before TensorFlow's import: fast
    from amp_rewrite.graph.shapes import answer_shape_request

    return answer_shape_request(kind, payload)
