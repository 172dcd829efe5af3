"""Atomic outputs: files and directories written to temporary siblings, renamed at the end.

:class:`Staging` collects every output of one command (the model, the report, dumps,
drawings, event files) as temporaries next to their final paths, then renames them all into
place in :meth:`Staging.commit`.  Leaving the ``with`` block without committing (an error,
Ctrl-C) deletes every temporary, so a failed command leaves nothing behind.  A missing parent
directory is staged as a whole too, so not even an empty directory appears early.

:func:`check_output` refuses outputs that would modify the input or replace something
without ``overwrite``; :func:`check_writable` refuses paths that cannot be created.  Both
are cheap and are called before any real work.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
from typing import Callable, Sequence

from .errors import AmpRewriteError

__all__ = ["Staging", "check_output", "check_writable", "is_within"]

log = logging.getLogger(__name__)

_TMP_PREFIX = ".amp-rewrite-"


class Staging:
    """Outputs written to temporary siblings and renamed into place together.

    ``add_file``/``add_tree`` write at once to a temporary name next to the final path
    (creating missing parent directories inside a temporary directory too, so nothing new
    is visible early).  :meth:`commit` renames everything into place; leaving the ``with``
    block without committing (an error, Ctrl-C) deletes every temporary.  OS errors become
    :class:`AmpRewriteError` naming the path.  Not thread-safe.
    """

    def __init__(self) -> None:
        # (temporary path, final path, replace an existing final path)
        self._moves: list[tuple[str, str, bool]] = []
        self._staged_dirs: dict[str, str] = {}  # final missing directory -> its temporary
        self._committed = False
        # mkstemp/mkdtemp create private (0600/0700) entries; outputs get the usual modes.
        self._file_mode = 0o666 & ~_umask()
        self._dir_mode = 0o777 & ~_umask()

    def __enter__(self) -> "Staging":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if not self._committed:
            self.discard()

    def _where(self, final: str) -> str:
        """A directory to create a temporary in, so that the temporary ends up at a path
        that renames onto ``final`` (or onto its first missing ancestor)."""
        parent = os.path.dirname(final)
        check_writable(final)
        for missing, tmp in self._staged_dirs.items():
            if parent == missing or parent.startswith(missing + os.sep):
                path = os.path.join(tmp, os.path.relpath(parent, missing))
                os.makedirs(path, exist_ok=True)
                return path
        if os.path.isdir(parent):
            return parent
        missing = parent
        while not os.path.exists(os.path.dirname(missing)):
            missing = os.path.dirname(missing)
        top = os.path.dirname(missing)
        if not os.path.isdir(top):
            raise AmpRewriteError(f"cannot write {final}: {top} is not a directory")
        tmp = tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=top)
        os.chmod(tmp, self._dir_mode)
        self._staged_dirs[missing] = tmp
        self._moves.append((tmp, missing, False))
        path = os.path.join(tmp, os.path.relpath(parent, missing))
        os.makedirs(path, exist_ok=True)
        return path

    def _guard(self, final: str, action: Callable[[], None]) -> None:
        try:
            action()
        except AmpRewriteError:
            raise
        except OSError as exc:
            raise AmpRewriteError(f"cannot write {final}: {exc.strerror or exc}") from None

    def add_file(self, path: str | os.PathLike[str], data: bytes) -> None:
        """Stage ``data`` for ``path`` (an existing file there is replaced on commit)."""
        final = os.path.abspath(os.fspath(path))

        def write() -> None:
            where = self._where(final)
            if where != os.path.dirname(final):  # inside a staged new directory
                with open(os.path.join(where, os.path.basename(final)), "wb") as f:
                    f.write(data)
                return
            fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=where)
            self._moves.append((tmp, final, True))
            os.chmod(tmp, self._file_mode)
            with os.fdopen(fd, "wb") as f:
                f.write(data)

        self._guard(final, write)

    def add_tree(self, path: str | os.PathLike[str], fill: Callable[[str], None], *, replace: bool) -> None:
        """Stage a directory: ``fill(tmp_dir)`` writes its content.  With ``replace`` an
        existing directory at ``path`` is swapped out on commit (and then deleted)."""
        final = os.path.abspath(os.fspath(path))

        def make() -> None:
            where = self._where(final)
            if where != os.path.dirname(final):  # inside a staged new directory
                inner = os.path.join(where, os.path.basename(final))
                os.mkdir(inner)
                fill(inner)
                return
            tmp = tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=where)
            self._moves.append((tmp, final, replace))
            os.chmod(tmp, self._dir_mode)
            fill(tmp)

        self._guard(final, make)

    def commit(self) -> None:
        """Rename every staged output into place, in the order they were added."""
        for tmp, final, replace in self._moves:
            if not os.path.exists(tmp):
                # Staged inside a directory an earlier move took away: the output would be
                # reported written and be gone (check_distinct_outputs keeps callers clear).
                raise AmpRewriteError(f"cannot write {final}: its staging area was moved away by "
                                      "another output of this run")
            self._guard(final, functools.partial(self._move, tmp, final, replace))
        self._committed = True
        self._moves.clear()

    @staticmethod
    def _move(tmp: str, final: str, replace: bool) -> None:
        if os.path.isdir(tmp) and os.path.lexists(final):
            if not replace:
                raise FileExistsError(17, "it appeared while the rewrite ran")
            # Directories cannot be replaced atomically: move the old one aside first and
            # put it back if the rename fails.
            old = tempfile.mkdtemp(prefix=_TMP_PREFIX + "old-", dir=os.path.dirname(final))
            aside = os.path.join(old, "old")
            os.rename(final, aside)
            try:
                os.rename(tmp, final)
            except BaseException:
                # Ctrl-C too: between the two renames OUTPUT would be missing, the old one
                # parked under a temporary name.  (Interrupted after the rename, the new
                # output is in place, whole.)
                if not os.path.lexists(final):
                    os.rename(aside, final)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)

    def discard(self) -> None:
        """Delete every temporary.  Safe to call more than once."""
        for tmp, _, _ in reversed(self._moves):
            if os.path.isdir(tmp) and not os.path.islink(tmp):
                shutil.rmtree(tmp, ignore_errors=True)
            elif os.path.lexists(tmp):
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        self._moves.clear()
        self._staged_dirs.clear()


def _umask() -> int:
    """The process umask (read by setting and restoring it; done once per staging)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_writable(path: str) -> None:
    """Raise unless ``path`` could be created: its first existing ancestor must be a
    writable directory.  Cheap, so outputs are checked before any work."""
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise AmpRewriteError(f"cannot write {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise AmpRewriteError(f"cannot write {path}: {parent} is not writable")


def is_within(path: str, parent: str) -> bool:
    path, parent = os.path.realpath(path), os.path.realpath(parent)
    return path == parent or path.startswith(parent.rstrip(os.sep) + os.sep)


def check_distinct_outputs(outputs: Sequence[tuple[str, str, bool]]) -> None:
    """Refuse a set of outputs that would overwrite or hide one another.

    ``outputs``: ``(path, what, is_dir)`` per output, ``what`` naming it for the message
    (``"OUTPUT"``, ``"--report"``...).  Two outputs may not be the same path or one inside
    the other (a report written inside the model directory would be swapped out with the
    old directory, a report on OUTPUT would replace the model), and an output may not exist
    as the other kind (a directory where a file goes, or the reverse), which would fail only
    at commit, after the model was already in place.  Reads the file system only; called
    before any work.
    """
    for i, (path, what, is_dir) in enumerate(outputs):
        if is_dir and os.path.lexists(path) and not os.path.isdir(path):
            raise AmpRewriteError(f"{what} {path} exists and is not a directory")
        if not is_dir and os.path.isdir(path):
            raise AmpRewriteError(f"{what} {path} is a directory; it names a file to write")
        for other, other_what, _ in outputs[:i]:
            if os.path.realpath(path) == os.path.realpath(other):
                raise AmpRewriteError(f"{what} and {other_what} are the same path ({path})")
            if is_within(path, other) or is_within(other, path):
                inner, outer = (what, other_what) if is_within(path, other) else (other_what, what)
                raise AmpRewriteError(f"{inner} is inside {outer}; write them to separate places")


def check_output(src: str, dst: str, *, overwrite: bool, what: str = "OUTPUT") -> None:
    """Refuse an output that would modify the input or replace something without
    ``overwrite``.  Called before any work, so bad requests fail at once."""
    if is_within(dst, src) and (os.path.isdir(src) or os.path.realpath(dst) == os.path.realpath(src)):
        raise AmpRewriteError(f"{what} {dst} is the same as (or inside) INPUT; the input is never modified")
    if overwrite and os.path.isdir(dst) and is_within(src, dst):
        raise AmpRewriteError(f"replacing {what} {dst} would delete INPUT {src}")
    if os.path.isdir(dst):
        if os.listdir(dst) and not overwrite:
            raise AmpRewriteError(f"{what} {dst} exists and is not empty; pass --overwrite to replace it")
    elif os.path.lexists(dst) and os.path.getsize(dst) > 0 and not overwrite:
        raise AmpRewriteError(f"{what} {dst} exists; pass --overwrite to replace it")


