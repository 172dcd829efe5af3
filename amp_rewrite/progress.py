"""A progress line for long work: drawn on a terminal, plain lines for long work elsewhere.

:class:`Progress` shows ``amp-rewrite: <stage> [#####-----] i/n  12.3s`` on one line of a
terminal and redraws it in place; a small daemon thread refreshes the elapsed time while a
long stage (one call into the core) runs, so the line never looks frozen.

When the stream is not a terminal (a pipe, a CI log, a test's capture) nothing is drawn:
:meth:`Progress.stage` writes nothing, so the output of a rewrite, which takes seconds,
stays clean.  Work that can take minutes (autotuning) reports through
:meth:`Progress.event` instead, which there writes plain lines, one per event, each ending
in a newline: every milestone (a new candidate, a new set of sessions), and other events
at most one per :data:`PLAIN_INTERVAL_S` seconds, so a log shows that the work goes on
without a line per step.  The library takes a ``Progress`` as an optional argument; only
the CLI creates one.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import TextIO

__all__ = ["Progress"]

log = logging.getLogger(__name__)

_BAR_WIDTH = 20
_REFRESH_S = 0.25
#: Off a terminal, the least time between two plain lines of events that are not milestones.
PLAIN_INTERVAL_S = 5.0


class Progress:
    """One progress line on ``stream`` (default ``sys.stderr``).

    ``enabled=None`` means "only if ``stream`` is a terminal".  ``plain`` says whether
    :meth:`event` writes plain lines; ``None`` means "when ``enabled`` was left to the
    stream and it is not a terminal" (so ``enabled=False``, e.g. ``--quiet``, silences
    everything).  ``plain_interval`` is the least time between two plain lines of events
    that are not milestones.  Use as a context manager or call :meth:`close`; closing erases
    the line.  Thread-safe for the calls below.  Not re-entrant: one ``Progress`` draws one
    line.
    """

    def __init__(self, stream: TextIO | None = None, *, enabled: bool | None = None,
                 plain: bool | None = None, plain_interval: float = PLAIN_INTERVAL_S) -> None:
        self.stream = stream if stream is not None else sys.stderr
        auto = enabled is None
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.plain = (auto and not enabled) if plain is None else plain
        self.plain_interval = plain_interval
        self._last_plain: float | None = None
        self._lock = threading.Lock()
        self._draw_lock = threading.Lock()  # the ticker thread and the caller both draw
        self._stage = ""
        self._done = 0
        self._total: int | None = None
        self._start = time.monotonic()
        self._width = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -------------------------------------------------------------------- public API

    def stage(self, label: str, done: int = 0, total: int | None = None) -> None:
        """Show ``label`` (and ``done``/``total`` as a bar when ``total`` is given)."""
        with self._lock:
            self._stage, self._done, self._total = label, done, total
        log.debug("progress: %s %s/%s", label, done, total)
        self._draw()
        self._ensure_ticker()

    def event(self, label: str, *, milestone: bool = True) -> None:
        """Report one event of long work (``label`` says what and how far, e.g. ``autotune:
        round 3/5, session 2/3``).  On a terminal it is shown as :meth:`stage` shows a
        label.  Otherwise, with ``plain``, it is written as a line of its own
        (``amp-rewrite: <label>  12.3s``) when it is a ``milestone`` or when
        ``plain_interval`` seconds have passed since the last line: one line per step of a
        fast loop would flood a log."""
        if self.enabled:
            self.stage(label)
            return
        if not self.plain:
            return
        now = time.monotonic()
        with self._lock:
            if not milestone and self._last_plain is not None and now - self._last_plain < self.plain_interval:
                return
            self._last_plain = now
        log.debug("progress event: %s", label)
        self._write(f"amp-rewrite: {label}  {now - self._start:.1f}s\n")

    def advance(self, n: int = 1) -> None:
        """Count ``n`` more units of the current stage as done."""
        with self._lock:
            self._done += n
        self._draw()

    def close(self) -> None:
        """Stop refreshing and erase the line.  Safe to call twice."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None
        with self._draw_lock:
            if self.enabled and self._width:
                self._write("\r" + " " * self._width + "\r")
                self._width = 0

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -------------------------------------------------------------------- drawing

    def render(self) -> str:
        """The current line, without carriage return.  Pure apart from reading the clock."""
        with self._lock:
            stage, done, total = self._stage, self._done, self._total
        elapsed = time.monotonic() - self._start
        text = f"amp-rewrite: {stage}"
        if total:
            filled = min(_BAR_WIDTH, _BAR_WIDTH * done // total)
            text += f" [{'#' * filled}{'-' * (_BAR_WIDTH - filled)}] {done}/{total}"
        return f"{text}  {elapsed:.1f}s"

    def _draw(self) -> None:
        if not self.enabled:
            return
        with self._draw_lock:
            line = self.render()
            # Pad with spaces so a shorter line fully covers the previous one.
            pad = max(0, self._width - len(line))
            self._width = len(line)
            self._write("\r" + line + " " * pad)

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            # A closed terminal or pipe must not turn into an error of the rewrite itself.
            self.enabled = self.plain = False

    def _ensure_ticker(self) -> None:
        if not self.enabled or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._tick, name="amp-rewrite-progress", daemon=True)
        self._thread.start()

    def _tick(self) -> None:
        while not self._stop.wait(_REFRESH_S):
            self._draw()
