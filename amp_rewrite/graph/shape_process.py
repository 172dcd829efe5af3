"""TensorFlow's shape inference in a process of its own, for graphs from untrusted files.

Static shapes come from TensorFlow's own shape functions (:mod:`amp_rewrite.graph.shapes`),
run on an inert copy of the graph, so that no kernel of the input runs.  A shape function is
still C++ that reads the graph's attributes, and some compute with an attribute before they
check it: TensorFlow 2.21's ``GatherV2`` with a large ``batch_dims`` asks for a shape of
negative rank and fails a ``CHECK``, which aborts the process (``bench/hunt_report.md``).
The inert copy leaves out every case a hunt has found; an op family no hunt has covered may
hold another.

Inside :func:`isolated_shape_inference` (the command line runs every command that reads a
file inside it)
the shapes are inferred in a helper process instead: started at the first graph, reused for
every later one, and started again after it dies.  Where TensorFlow kills it, the graph gets
the shapes its exporter recorded (``_output_shapes``), as for any graph TensorFlow cannot
import, with one WARNING; the caller's process lives on.  The helper imports TensorFlow once
(3.3 s and 660 MB resident here, ResNet50's graph its first), sees no GPU, and is given
each graph serialized (later graphs cost milliseconds more than in process); a
request it does not answer in :data:`TIMEOUT_S` (a shape function that loops) ends it too.
A custom op registry cannot be sent to it: graphs imported with one are inferred in process.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import logging
import threading
from typing import Any, Iterator

from .helper_process import HelperProcess

__all__ = ["TIMEOUT_S", "ShapeProcess", "isolated_shape_inference", "isolation_active", "run_isolated",
           "shape_process"]

log = logging.getLogger(__name__)

#: Seconds one request may take in the helper (importing TensorFlow there included).
TIMEOUT_S = 300.0

_ISOLATED: contextvars.ContextVar[bool] = contextvars.ContextVar("amp_rewrite_isolated_shapes", default=False)


@contextlib.contextmanager
def isolated_shape_inference() -> Iterator[None]:
    """Infer static shapes in the helper process while inside (this thread, and the asyncio
    tasks it starts; a thread it starts, or a pool's worker thread, does not inherit it: enter
    it there).  For services that rewrite models they did not make; the command line uses it."""
    token = _ISOLATED.set(True)
    try:
        yield
    finally:
        _ISOLATED.reset(token)


def isolation_active() -> bool:
    """Whether shapes are inferred in the helper process here (:func:`isolated_shape_inference`)."""
    return _ISOLATED.get()


class ShapeProcess(HelperProcess):
    """The helper that infers shapes (:func:`.shape_worker.answer`, or another ``worker`` in
    tests), and runs
    whatever else imports a graph from anyone into TensorFlow (:func:`run_isolated`): it needs
    no device, and must not take GPU memory from the caller's steps, so it sees none."""

    def __init__(self, worker: str = "amp_rewrite.graph.shape_worker:answer",
                 timeout_s: float = TIMEOUT_S) -> None:
        # TensorFlow's start-up lines (no GPU found ...) would only clutter the caller's
        # standard error; an abort's own message is printed whatever the level.
        super().__init__(worker, env={"CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3"},
                         timeout_s=timeout_s)
        #: Whether the WARNING that the helper cannot start was logged (once a process).
        self.warned_broken = False

    def infer(self, kind: str, payload: Any) -> tuple[str, Any]:
        """One request, answered (:meth:`HelperProcess.request`)."""
        return self.request(kind, payload)


_PROCESS: ShapeProcess | None = None
_PROCESS_LOCK = threading.Lock()


def shape_process() -> ShapeProcess:
    """The process-wide helper (not started until its first request)."""
    global _PROCESS
    with _PROCESS_LOCK:
        if _PROCESS is None:
            _PROCESS = ShapeProcess()
            atexit.register(_PROCESS.close)
        return _PROCESS



def run_isolated(function: str, payload: Any) -> tuple[str, Any]:
    """``function`` (``module:function`` of this package) called with ``payload`` in the shape
    helper process, for work that imports a graph from anyone into TensorFlow (whose shape
    functions run at the import, and may abort): ``("ok", result)``, ``("error", "<Type>:
    <message>")`` where it raised, or ``("died", why)``.  ``payload`` and the result are
    pickled."""
    return shape_process().infer("call", (function, payload))

