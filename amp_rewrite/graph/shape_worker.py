"""What the shape helper process (:class:`.shape_process.ShapeProcess`) runs: its answer to
each request.  A module of its own, imported only in the helper, so that the caller's side
(:mod:`.shape_process`) does not import the shape inference it sends away, which imports it.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["answer"]


def answer(kind: str, payload: Any) -> Any:  # pragma: no cover - runs in the helper
    """``("graph" | "function", ...)`` shape requests
    (:func:`~amp_rewrite.graph.shapes.answer_shape_request`), or ``("call", (function,
    payload))`` for :func:`~amp_rewrite.graph.shape_process.run_isolated`: ``function``
    (``module:function`` of this package) called with ``payload``."""
    if kind == "call":
        function, argument = payload
        module, _, name = function.partition(":")
        if not module.startswith("amp_rewrite."):
            raise ValueError(f"not a function of amp_rewrite: {function!r}")
        return getattr(importlib.import_module(module), name)(argument)
    from .shapes import answer_shape_request

    return answer_shape_request(kind, payload)
