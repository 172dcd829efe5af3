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

import contextlib
import contextvars
import logging
import os
import threading
from typing import Any, Iterator

__all__ = ["TIMEOUT_S", "ShapeProcess", "isolated_shape_inference", "isolation_active", "shape_process"]

log = logging.getLogger(__name__)

#: Seconds one request may take in the helper (importing TensorFlow there included).
TIMEOUT_S = 300.0

_ISOLATED: contextvars.ContextVar[bool] = contextvars.ContextVar("amp_rewrite_isolated_shapes", default=False)


@contextlib.contextmanager
def isolated_shape_inference() -> Iterator[None]:
    """Infer static shapes in the helper process while inside (this thread and the tasks it
    starts).  For services that rewrite models they did not make; the command line uses it."""
    token = _ISOLATED.set(True)
    try:
        yield
    finally:
        _ISOLATED.reset(token)


def isolation_active() -> bool:
    """Whether shapes are inferred in the helper process here (:func:`isolated_shape_inference`)."""
    return _ISOLATED.get()


def _serve(requests: Any, answers: Any, worker: str) -> None:
    """The helper's loop: ``(kind, payload)`` requests in, results out, until the requests'
    pipe closes.  ``worker`` names the function that answers (``module:function``)."""
    import importlib

    module, _, name = worker.partition(":")
    answer = getattr(importlib.import_module(module), name)
    while True:
        try:
            kind, payload = requests.recv()
        except (EOFError, OSError):
            return
        try:
            answers.send(("ok", answer(kind, payload)))
        except Exception as exc:  # noqa: BLE001 - reported to the caller, which falls back
            answers.send(("error", f"{type(exc).__name__}: {exc}"))


class ShapeProcess:
    """The helper process, started at the first request (:meth:`infer`) and again after it
    dies.  Thread-safe: one request at a time.

    It is a fresh interpreter (``python -m amp_rewrite.graph.shape_process``) talking over
    two pipes of its own, not a ``multiprocessing`` child: that would import the caller's
    ``__main__`` again (a user's script without a main guard would run twice) or fork a
    process that runs TensorFlow (unsafe).  Its standard output goes to standard error, so
    nothing a library prints can corrupt the answers."""

    def __init__(self, worker: str = "amp_rewrite.graph.shapes:answer_shape_request",
                 timeout_s: float = TIMEOUT_S) -> None:
        self._worker = worker
        self._timeout = timeout_s
        self._lock = threading.Lock()
        self._process: Any = None
        self._requests: Any = None
        self._answers: Any = None
        #: Requests answered (ok or error), and how many times the helper died on one (a
        #: crash or a timeout).
        self.answered = 0
        self.deaths = 0

    def _start(self) -> None:
        import subprocess
        import sys
        from multiprocessing.connection import Connection

        theirs_in, ours_out = os.pipe()  # requests: we write, it reads
        ours_in, theirs_out = os.pipe()  # answers: it writes, we read
        env = dict(os.environ)
        # The helper needs no device, and must not take GPU memory from the caller's steps.
        env["CUDA_VISIBLE_DEVICES"] = ""
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        # It imports what this process imports, from where this process found it.
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", __name__, self._worker, str(theirs_in), str(theirs_out)],
                pass_fds=(theirs_in, theirs_out), env=env, stdin=subprocess.DEVNULL, close_fds=True)
        finally:
            os.close(theirs_in)
            os.close(theirs_out)
        self._requests = Connection(ours_out, readable=False)
        self._answers = Connection(ours_in, writable=False)

    def _stop(self) -> None:
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            try:
                self._process.wait(timeout=10)
            except Exception:  # noqa: BLE001 - a process that will not die is the OS's now
                pass
        for conn in (self._requests, self._answers):
            if conn is not None:
                conn.close()
        self._process = self._requests = self._answers = None

    def infer(self, kind: str, payload: Any) -> tuple[str, Any]:
        """Send one request; ``("ok", result)``, ``("error", message)`` where the helper raised,
        or ``("died", why)`` where it ended (TensorFlow aborted it, or it did not answer in
        time) -- then it is started again at the next request."""
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._stop()
                self._start()
            try:
                self._requests.send((kind, payload))
                if self._answers.poll(self._timeout):
                    answer = self._answers.recv()
                    self.answered += 1
                    return answer
                why = f"no answer in {self._timeout:.0f} s"
            except (EOFError, OSError) as exc:
                why = type(exc).__name__
            try:
                code = self._process.wait(timeout=1)
            except Exception:  # noqa: BLE001 - still running: it did not answer in time
                code = None
            if code is not None:
                why = f"exit code {code}" + (f" (signal {-code})" if code < 0 else "")
            self.deaths += 1
            self._stop()
            return "died", why

    def close(self) -> None:
        """End the helper (started again at the next request)."""
        with self._lock:
            self._stop()


_PROCESS: ShapeProcess | None = None
_PROCESS_LOCK = threading.Lock()


def shape_process() -> ShapeProcess:
    """The process-wide helper (not started until its first request)."""
    global _PROCESS
    with _PROCESS_LOCK:
        if _PROCESS is None:
            _PROCESS = ShapeProcess()
        return _PROCESS


def _main(argv: list[str]) -> int:
    """The helper's entry point: ``WORKER REQUESTS_FD ANSWERS_FD``."""
    import sys
    from multiprocessing.connection import Connection

    worker, requests_fd, answers_fd = argv
    # Anything printed goes to standard error: standard output is not the answers' pipe, but
    # a library writing to it should not mix with the caller's output either.
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _serve(Connection(int(requests_fd), writable=False), Connection(int(answers_fd), readable=False), worker)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_main(sys.argv[1:]))
