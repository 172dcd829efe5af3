"""A long-lived Python helper process that answers requests, and survives nothing it runs.

Starting Python with TensorFlow takes seconds, so work that must run outside the caller's
process -- TensorFlow's shape inference on a graph from anyone (:mod:`.shape_process`), or a
rewrite under another ``PYTHONHASHSEED`` (:mod:`amp_rewrite.testing.hashseed`) -- goes to a
helper started once and reused.  :class:`HelperProcess` starts it at the first request
(``python -c <bootstrap> WORKER ...``, ``WORKER`` a ``module:function`` that answers
``(kind, payload)``), talks to it over two pipes of its own, and starts it again after it
dies: a crash (TensorFlow's ``CHECK`` failures abort) or a request not answered in time costs
that request, reported as ``("died", why)``, never the caller.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import threading
from typing import Any, Mapping

__all__ = ["HelperProcess"]

#: What the helper runs.  Not ``python -m``: that puts the current directory first on
#: ``sys.path``, so a file there named like a module the helper imports (``networkx.py`` next
#: to a downloaded model) would run in it, and runpy warns that the package, imported first,
#: already holds the module.  ``-c`` puts ``""`` (the current directory) first: removed.
_BOOTSTRAP = ("import sys\n"
              "if sys.path and sys.path[0] == '':\n"
              "    del sys.path[0]\n"
              "from amp_rewrite.graph.helper_process import _main\n"
              "sys.exit(_main(sys.argv[1:]))\n")
#: How much of the helper's standard error a death's reason quotes.
_STDERR_TAIL = 400
#: A fatal message of TensorFlow's logging (absl): ``F1128 12:00:00.000000 123 file.cc:42] ...``.
_FATAL_LINE = re.compile(r"^F\d{4} ")
#: Records the helper's own loggers emit while answering, sent back with the answer.
_FORWARDED_LOGGER = "amp_rewrite"


class _Records(logging.Handler):
    """Keeps the log records of one request (in the helper), as ``(logger, level, message)``."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[tuple[str, int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.name, record.levelno, record.getMessage()))


def _serve(requests: Any, answers: Any, worker: str) -> None:
    """The helper's loop: ``(id, kind, payload)`` requests in, ``(id, status, result, log
    records)`` out, until the requests' pipe closes.  ``worker`` names the function that
    answers (``module:function``)."""
    import importlib

    module, _, name = worker.partition(":")
    answer = getattr(importlib.import_module(module), name)
    records = _Records()
    logger = logging.getLogger(_FORWARDED_LOGGER)
    logger.addHandler(records)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # the caller re-emits them; nothing printed here
    while True:
        try:
            request_id, kind, payload = requests.recv()
        except (EOFError, OSError):
            return
        records.records = []
        try:
            status, result = "ok", answer(kind, payload)
        except Exception as exc:  # noqa: BLE001 - reported to the caller, which falls back
            status, result = "error", f"{type(exc).__name__}: {exc}"
        answers.send((request_id, status, result, records.records))


def _watch_parent(parent: int) -> None:
    """End this helper when its parent is gone (the parent killed, or ended without closing
    it): the requests' pipe would tell only a helper that is waiting for one, not one busy
    on a request that does not end."""
    import time

    while True:
        if os.getppid() != parent:
            os._exit(70)
        time.sleep(1.0)


class _StartFailed(Exception):
    """The helper's interpreter could not be started (no such executable, no process left)."""


class HelperProcess:
    """A helper process running ``worker`` (``module:function``, called with ``(kind,
    payload)``), started at the first request and again after it dies.  ``env``: variables
    set for it (over this process's environment); ``timeout_s``: how long one request may
    take (``None``: no limit).  Thread-safe: one request at a time (:meth:`submit` and
    :meth:`result` apart let a caller keep several helpers busy at once).

    It is a fresh interpreter talking over two pipes of its own, not a ``multiprocessing``
    child: that would import the caller's ``__main__`` again (a user's script without a main
    guard would run twice) or fork a process that runs TensorFlow (unsafe).  It imports what
    this process imports, from where this process found it (``sys.path``), and from the current
    directory only where this process does (``""`` on its path: a REPL, ``python -c``).  Its standard output and error go to a temporary file, so nothing a
    library prints there mixes with the caller's output; a death's reason quotes its end (an
    abort's message).  Log records of the ``amp_rewrite`` loggers it emits while answering
    are emitted again here, by the logger of the same name.

    Each request carries an id, and an answer to an earlier request (whose caller left
    :meth:`result` early) is never taken for the current one; a caller interrupted while
    waiting (``KeyboardInterrupt``, a signal handler's exception) ends the helper.  A helper
    that cannot start, or exits with an error before its first answer (its worker does not
    import), is not started again: every later request is answered ``("died", why)`` at once
    (:attr:`broken`).  The helper ends itself within a second of this process's end."""

    def __init__(self, worker: str, *, env: Mapping[str, str] | None = None,
                 timeout_s: float | None = None) -> None:
        self._worker = worker
        self._env = dict(env or {})
        self.timeout_s = timeout_s  #: how long one request may take (None: no limit)
        self._lock = threading.Lock()
        self._request_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._sent: int | None = None  #: the id of the request :meth:`result` answers
        self._pending: str | None = None  #: why that request never reached the helper
        self._process: Any = None
        self._requests: Any = None
        self._answers: Any = None
        self._stderr: Any = None
        self._answered_here = 0  #: answers from the running helper (0: it may not have started)
        #: Requests answered (ok or error), and how many times the helper died on one (a
        #: crash or a timeout).
        self.answered = 0
        self.deaths = 0
        self.starts = 0
        #: Why the helper cannot run at all (``None`` while it can).
        self.broken: str | None = None

    def _start(self) -> None:
        import subprocess
        import sys
        import tempfile
        from multiprocessing.connection import Connection

        theirs_in, ours_out = os.pipe()  # requests: we write, it reads
        ours_in, theirs_out = os.pipe()  # answers: it writes, we read
        env = {**os.environ, **self._env}
        # The parent's own path, with "" (a REPL's, ``python -c``'s: the current directory)
        # spelled out: where the parent imports from the current directory, so does the helper
        # (no more exposure than the parent's); where it does not (a console script, such as
        # the CLI), the helper does not either.
        env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
        stderr = tempfile.TemporaryFile()
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP, self._worker, str(theirs_in), str(theirs_out), str(os.getpid())],
                pass_fds=(theirs_in, theirs_out), env=env, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr,
                close_fds=True)
        except (OSError, ValueError) as exc:
            for fd in (ours_in, ours_out):
                os.close(fd)
            stderr.close()
            raise _StartFailed(f"could not start {sys.executable!r}: {exc}") from exc
        finally:
            os.close(theirs_in)
            os.close(theirs_out)
        self.starts += 1
        self._process, self._stderr, self._answered_here = process, stderr, 0
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
        for handle in (self._requests, self._answers, self._stderr):
            if handle is not None:
                handle.close()
        self._process = self._requests = self._answers = self._stderr = None

    def _stderr_tail(self) -> str:
        """What the helper wrote last to its standard error that says why it ended: its last
        fatal log line, else its last line ("" if none)."""
        if self._stderr is None:
            return ""
        try:
            size = os.fstat(self._stderr.fileno()).st_size
            self._stderr.seek(max(0, size - 4 * _STDERR_TAIL))
            text = self._stderr.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        # An abort's own line (absl's "F1128 ... Check failed: ..."), not the stack trace
        # printed after it; else the last line (a Python error's).
        fatal = [line for line in lines if _FATAL_LINE.match(line) or "Check failed" in line]
        return (fatal or lines or [""])[-1][:_STDERR_TAIL]

    def submit(self, kind: str, payload: Any) -> None:
        """Send one request (starting the helper if it is not running); :meth:`result` gets
        its answer.  A request to a helper that died on the way, or cannot start, is answered
        ``("died", ...)``."""
        with self._lock:
            self._sent = next(self._ids)
            self._pending = self.broken
            if self.broken is not None:
                return
            if self._process is None or self._process.poll() is not None:
                self._stop()
                try:
                    self._start()
                except _StartFailed as exc:
                    self.broken = self._pending = str(exc)
                    return
            try:
                self._requests.send((self._sent, kind, payload))
            except OSError as exc:
                self._pending = type(exc).__name__

    def result(self) -> tuple[str, Any]:
        """The answer to the last :meth:`submit`: ``("ok", result)``, ``("error", message)``
        where the worker raised, or ``("died", why)`` where the helper ended (a crash, or no
        answer in ``timeout_s``) -- then it is started again at the next request -- or cannot
        run (:attr:`broken`)."""
        with self._lock:
            try:
                return self._result()
            except BaseException:
                # The caller leaves while the helper works on its request: end it, so that
                # the next request does not wait behind this one.
                self._stop()
                raise

    def _result(self) -> tuple[str, Any]:
        import time

        why = self._pending
        if why is not None and self.broken is not None:
            return "died", why
        if why is None:
            deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
            try:
                while True:
                    left = None if deadline is None else max(0.0, deadline - time.monotonic())
                    if not self._answers.poll(left):
                        why = f"no answer in {self.timeout_s:.0f} s"
                        break
                    request_id, status, result, records = self._answers.recv()
                    if request_id != self._sent:
                        continue  # the answer to a request whose caller left: not this one's
                    self.answered += 1
                    self._answered_here += 1
                    _emit(records)
                    return status, result
            except (EOFError, OSError) as exc:
                if isinstance(exc, TimeoutError):
                    raise  # the caller's own (a signal handler's deadline), not the pipe's
                why = type(exc).__name__
        try:
            code = self._process.wait(timeout=1)
        except Exception:  # noqa: BLE001 - still running: it did not answer in time
            code = None
        if code is not None:
            why = f"exit code {code}" + (f" (signal {-code})" if code < 0 else "")
            tail = self._stderr_tail()
            if tail:
                why += f": {tail}"
            if code > 0 and self._answered_here == 0:
                # It exited with an error before answering anything: its interpreter or
                # worker cannot start here, and would not the next time either.
                self.broken = f"the helper process exited at its start ({why})"
        self.deaths += 1
        self._stop()
        return "died", why

    def request(self, kind: str, payload: Any) -> tuple[str, Any]:
        """:meth:`submit` and :meth:`result`, under one lock: one request, answered."""
        with self._request_lock:
            self.submit(kind, payload)
            return self.result()

    def close(self) -> None:
        """End the helper (started again at the next request, unless :attr:`broken`)."""
        with self._lock:
            self._stop()


def _emit(records: list[tuple[str, int, str]]) -> None:
    """Emit again here the log records the helper's loggers emitted while answering."""
    for name, level, message in records:
        logger = logging.getLogger(name)
        if logger.isEnabledFor(level):
            logger.log(level, "%s", message)


def _main(argv: list[str]) -> int:
    """The helper's entry point: ``WORKER REQUESTS_FD ANSWERS_FD PARENT_PID``."""
    import sys
    from multiprocessing.connection import Connection

    worker, requests_fd, answers_fd, parent = argv
    threading.Thread(target=_watch_parent, args=(int(parent),), daemon=True, name="watch-parent").start()
    # Anything printed goes to standard error: standard output is not the answers' pipe, but
    # a library writing to it should not mix with the caller's output either.
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _serve(Connection(int(requests_fd), writable=False), Connection(int(answers_fd), readable=False), worker)
    return 0
