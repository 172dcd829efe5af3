"""A long-lived Python helper process that answers requests, and survives nothing it runs.

Starting Python with TensorFlow takes seconds, so work that must run outside the caller's
process -- TensorFlow's shape inference on a graph from anyone (:mod:`.shape_process`), or a
rewrite under another ``PYTHONHASHSEED`` (:mod:`amp_rewrite.testing.hashseed`) -- goes to a
helper started once and reused.  :class:`HelperProcess` starts it at the first request
(``python -m amp_rewrite.graph.helper_process WORKER ...``, ``WORKER`` a ``module:function``
that answers ``(kind, payload)``), talks to it over two pipes of its own, and starts it again
after it dies: a crash (TensorFlow's ``CHECK`` failures abort) or a request not answered in
time costs that request, reported as ``("died", why)``, never the caller.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Mapping

__all__ = ["HelperProcess"]


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


class HelperProcess:
    """A helper process running ``worker`` (``module:function``, called with ``(kind,
    payload)``), started at the first request and again after it dies.  ``env``: variables
    set for it (over this process's environment); ``timeout_s``: how long one request may
    take (``None``: no limit).  Thread-safe: one request at a time (:meth:`submit` and
    :meth:`result` apart let a caller keep several helpers busy at once).

    It is a fresh interpreter talking over two pipes of its own, not a ``multiprocessing``
    child: that would import the caller's ``__main__`` again (a user's script without a main
    guard would run twice) or fork a process that runs TensorFlow (unsafe).  It imports what
    this process imports, from where this process found it (``sys.path``).  Its standard
    output goes to standard error, so nothing a library prints can corrupt the answers."""

    def __init__(self, worker: str, *, env: Mapping[str, str] | None = None,
                 timeout_s: float | None = None) -> None:
        self._worker = worker
        self._env = dict(env or {})
        self._timeout = timeout_s
        self._lock = threading.Lock()
        self._request_lock = threading.Lock()
        self._pending: str | None = None
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
        env = {**os.environ, **self._env}
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

    def submit(self, kind: str, payload: Any) -> None:
        """Send one request (starting the helper if it is not running); :meth:`result` gets
        its answer.  A request to a helper that died on the way is answered ``("died", ...)``."""
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._stop()
                self._start()
            try:
                self._requests.send((kind, payload))
                self._pending = None
            except OSError as exc:
                self._pending = type(exc).__name__

    def result(self) -> tuple[str, Any]:
        """The answer to the last :meth:`submit`: ``("ok", result)``, ``("error", message)``
        where the worker raised, or ``("died", why)`` where the helper ended (a crash, or no
        answer in ``timeout_s``) -- then it is started again at the next request."""
        with self._lock:
            why = self._pending
            if why is None:
                try:
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

    def request(self, kind: str, payload: Any) -> tuple[str, Any]:
        """:meth:`submit` and :meth:`result`, under one lock: one request, answered."""
        with self._request_lock:
            self.submit(kind, payload)
            return self.result()

    def close(self) -> None:
        """End the helper (started again at the next request)."""
        with self._lock:
            self._stop()


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
