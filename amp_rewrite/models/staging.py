"""Atomic outputs: files and directories written to temporary siblings, renamed at the end.

:class:`Staging` collects every output of one command (the model, the report, dumps,
drawings, event files) as temporaries next to their final paths, then renames them all into
place in :meth:`Staging.commit`.  Leaving the ``with`` block without committing (an error,
Ctrl-C) deletes every temporary, so a failed command leaves nothing behind.  A missing parent
directory is staged as a whole too, so not even an empty directory appears early.  The commit
is all or nothing: if one rename fails, the ones already done are undone.

:func:`check_output` refuses outputs that would modify the input or replace something
without ``overwrite``; :func:`check_replaceable` refuses an existing path without
``overwrite`` and a device, FIFO or socket always; :func:`check_not_input` refuses outputs
that would replace an input; :func:`check_writable` refuses paths that cannot be created.
All are cheap and are called before any real work.  :class:`Staging` checks again when it
renames, since the file system may have changed while the command ran.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import logging
import os
import shutil
import stat
import tempfile
from typing import Callable, Iterable, Sequence, TypeVar

from ..errors import AmpRewriteError

__all__ = ["Staging", "check_not_input", "check_output", "check_replaceable", "check_writable", "is_within",
           "special_kind"]

log = logging.getLogger(__name__)

_TMP_PREFIX = ".amp-rewrite-"
_T = TypeVar("_T")
# What rename(2) of a directory says when the target exists and is not an empty directory.
_EXISTS_ERRNOS = frozenset({errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR})


class Staging:
    """Outputs written to temporary siblings and renamed into place together.

    ``add_file``/``add_tree`` write at once to a temporary name next to the final path
    (creating missing parent directories inside a temporary directory too, so nothing new
    is visible early).  :meth:`commit` renames everything into place, all or nothing;
    leaving the ``with`` block without committing (an error, Ctrl-C) deletes every
    temporary.  An existing final path is replaced only when its output was added with
    ``replace=True``, and never when it is a device, FIFO or socket; no output may be one
    of the ``protect`` paths (the command's inputs) or, for a directory, hold one.  OS
    errors become :class:`AmpRewriteError` naming the path.  Not thread-safe.
    """

    def __init__(self, protect: Iterable[str | os.PathLike[str]] = ()) -> None:
        # (temporary path, final path, replace an existing final path)
        self._moves: list[tuple[str, str, bool]] = []
        self._staged_dirs: dict[str, str] = {}  # final missing directory -> its temporary
        self._protect = [os.path.realpath(os.fspath(p)) for p in protect]
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

    def _guard(self, final: str, action: Callable[[], _T]) -> _T:
        try:
            return action()
        except AmpRewriteError:
            raise
        except OSError as exc:
            raise AmpRewriteError(f"cannot write {final}: {exc.strerror or exc}") from None

    def _check_final(self, final: str, *, replace: bool, tree: bool) -> None:
        """Refuse ``final`` before anything is written for it: an input (or, for a tree
        that would replace a directory, a directory holding one), something that exists
        when ``replace`` is off, or a device, FIFO or socket."""
        for src in self._protect:
            if is_within(final, src) or (tree and replace and is_within(src, final)):
                raise AmpRewriteError(f"cannot write {final}: it would replace the input {src}; "
                                      "an input is never modified")
        kind = special_kind(final)
        if kind:
            raise AmpRewriteError(f"cannot write {final}: it is a {kind}, which is never replaced")
        if not replace and os.path.lexists(final) and not (
                tree and os.path.isdir(final) and not os.path.islink(final) and not os.listdir(final)):
            raise AmpRewriteError(f"cannot write {final}: it exists; pass --overwrite to replace it")

    def add_file(self, path: str | os.PathLike[str], data: bytes, *, replace: bool = False) -> None:
        """Stage ``data`` for ``path``.  With ``replace`` an existing file there is replaced
        on commit; without, an existing one is an error, now or at commit."""
        final = os.path.abspath(os.fspath(path))

        def write() -> None:
            self._check_final(final, replace=replace, tree=False)
            where = self._where(final)
            if where != os.path.dirname(final):  # inside a staged new directory
                with open(os.path.join(where, os.path.basename(final)), "wb") as f:
                    f.write(data)
                return
            fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=where)
            self._moves.append((tmp, final, replace))
            os.chmod(tmp, self._file_mode)
            with os.fdopen(fd, "wb") as f:
                f.write(data)

        self._guard(final, write)

    def add_tree(self, path: str | os.PathLike[str], fill: Callable[[str], None], *, replace: bool) -> None:
        """Stage a directory: ``fill(tmp_dir)`` writes its content.  With ``replace`` an
        existing directory at ``path`` is swapped out on commit (and then deleted); without,
        only an empty directory may be there, now and at commit."""
        final = os.path.abspath(os.fspath(path))

        def make() -> None:
            self._check_final(final, replace=replace, tree=True)
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
        """Rename every staged output into place: all of them, or none.

        Outputs are moved in the reverse order they were added, so the first one added
        (the command's main output, by convention) lands last.  If a move fails (or is
        interrupted), the moves already done are undone: each new output is taken back
        and what it replaced is put back, so the final paths are as they were.  What was
        replaced is deleted only once every output is in place.
        """
        done: list[_Move] = []
        try:
            for tmp, final, replace in reversed(self._moves):
                if not os.path.exists(tmp):
                    # Staged inside a directory an earlier move took away: the output would be
                    # reported written and be gone (check_distinct_outputs keeps callers clear).
                    raise AmpRewriteError(f"cannot write {final}: its staging area was moved away by "
                                          "another output of this run")
                done.append(self._guard(final, functools.partial(_move, tmp, final, replace)))
        except BaseException:
            for move in reversed(done):
                move.undo()
            raise
        self._committed = True
        self._moves.clear()
        for move in done:
            if move.old is not None:
                _remove_old(move.old)

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


@dataclasses.dataclass(frozen=True)
class _Move:
    """One rename :meth:`Staging.commit` did: ``tmp`` to ``final``.  ``old`` is the
    ``.amp-rewrite-old-*`` sibling made for what ``final`` was, and ``aside`` where that is
    now (``old`` itself for a directory, else ``old/old``); both ``None`` if nothing was
    replaced.  ``was_empty_dir``: ``final`` was an empty directory that the new one took
    the place of."""

    tmp: str
    final: str
    is_dir: bool
    old: str | None = None
    aside: str | None = None
    was_empty_dir: bool = False

    def undo(self) -> None:
        """Put back what was at ``final`` and the new output at ``tmp`` (which
        :meth:`Staging.discard` deletes); works after a partial move too.  Best effort,
        never raises: what cannot be put back stays where it is and is named in the log,
        never deleted."""
        aside = self.aside
        try:
            if not os.path.lexists(self.tmp):  # the new output is in place: take it back
                if aside is not None and not self.is_dir and os.path.lexists(aside) and not os.path.isdir(aside):
                    os.replace(aside, self.final)  # a file over a file: back atomically
                else:
                    os.rename(self.final, self.tmp)
            if aside is not None and not os.path.lexists(self.final) and os.path.lexists(aside):
                os.rename(aside, self.final)
            elif self.was_empty_dir and not os.path.lexists(self.final):
                os.mkdir(self.final)
        except OSError as exc:
            kept = f"; what it replaced is kept at {aside}" if aside is not None else ""
            log.error("could not undo writing %s (%s)%s", self.final, exc.strerror or exc, kept)
            return
        if self.old is not None:
            # Now only the empty placeholder, or a second link to the file that is back.
            _remove_old(self.old)


def _move(tmp: str, final: str, replace: bool) -> _Move:
    """Rename ``tmp`` onto ``final``; return what was done, for the caller to undo or, once
    every output is in place, to delete ``old``.

    Without ``replace`` nothing is replaced but an empty directory (by a directory), so an
    output that appeared while the command ran is kept and this raises
    :class:`FileExistsError`.  On any error (or interruption) ``final`` is as it was and
    nothing is left behind but ``tmp``.
    """
    is_dir = os.path.isdir(tmp)
    if not replace or not os.path.lexists(final):
        was_empty_dir = is_dir and os.path.isdir(final) and not os.path.islink(final)
        _rename_new(tmp, final)
        return _Move(tmp, final, is_dir, was_empty_dir=was_empty_dir)
    kind = special_kind(final)  # checked before the work too; it may have changed since
    if kind:
        raise AmpRewriteError(f"cannot write {final}: it is a {kind}, which is never replaced")
    # The old one stays under a temporary sibling name until every output is in place, so
    # that a failed commit can put it back.  A sibling, because renaming a directory within
    # its parent needs no write permission on the directory itself (a read-only OUTPUT).
    old = tempfile.mkdtemp(prefix=_TMP_PREFIX + "old-", dir=os.path.dirname(final))
    final_is_dir = os.path.isdir(final) and not os.path.islink(final)
    aside = old if final_is_dir else os.path.join(old, "old")
    move = _Move(tmp, final, is_dir, old, aside)
    try:
        if final_is_dir or is_dir:
            # Directories cannot be replaced atomically (nor can rename(2) put one over a
            # file): the old one goes aside (a directory onto the empty placeholder, which
            # rename may replace), then the new one in.
            os.rename(final, aside)
        else:
            # A file is replaced atomically; a hard link keeps the old one for undo.
            try:
                os.link(final, aside, follow_symlinks=False)
            except OSError:  # a file system without hard links: move it aside instead
                os.rename(final, aside)
        os.replace(tmp, final)
    except BaseException:
        move.undo()  # Ctrl-C too: between the two renames OUTPUT would be missing
        raise
    return move


def _remove_old(path: str) -> None:
    """Delete ``path``, a ``.amp-rewrite-old-*`` entry holding a replaced output.  Best
    effort.  Read-only directories in it (an OUTPUT its owner made read-only) are made
    writable on the way: their entries cannot be deleted otherwise, and the old output would
    stay behind under its hidden name."""
    def retry(func: Callable[[str], object], failed: str, _exc: object) -> None:
        parent = os.path.dirname(failed)
        try:
            os.chmod(parent, os.stat(parent).st_mode | stat.S_IWUSR | stat.S_IXUSR)
            func(failed)
        except OSError:
            pass

    shutil.rmtree(path, onerror=retry)


def _rename_new(tmp: str, final: str) -> None:
    """Rename ``tmp`` onto ``final`` unless something is there (an empty directory may be
    replaced by a directory).  Raises :class:`FileExistsError` if something is."""
    appeared = FileExistsError(errno.EEXIST, "it appeared while the rewrite ran; pass --overwrite to replace it")
    if os.path.isdir(tmp):
        try:
            os.rename(tmp, final)  # fails unless final is missing or an empty directory
        except OSError as exc:
            if exc.errno in _EXISTS_ERRNOS:
                raise appeared from None
            raise
        return
    try:
        os.link(tmp, final)  # unlike rename, link never replaces: no check-then-act race
    except FileExistsError:
        raise appeared from None
    except OSError:
        # A file system without hard links: check, then rename.
        if os.path.lexists(final):
            raise appeared from None
        os.rename(tmp, final)
        return
    os.unlink(tmp)


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


def special_kind(path: str) -> str | None:
    """What ``path`` is if it is (or, through symbolic links, leads to) something other than
    a regular file or a directory: ``"character device"``, ``"FIFO"``...; else ``None``
    (also for a missing path or a dangling link)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    kinds = ((stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "FIFO"),
             (stat.S_ISSOCK, "socket"))
    return next((name for test, name in kinds if test(mode)), "special file")


def check_replaceable(path: str, *, overwrite: bool, what: str = "OUTPUT") -> None:
    """Refuse an output path that this command must not replace.

    A device, FIFO or socket, or a symbolic link to one, is refused even with
    ``overwrite``: it is no file of the user's (``/dev/null``, ``/dev/stdout``), and
    replacing it with a regular file would break whatever uses it.  Anything else that
    exists (a file, even an empty one, or a symbolic link, which would be replaced, never
    followed) needs ``overwrite``, except an empty directory.  Reads the file system only.
    """
    if not os.path.lexists(path):
        return
    kind = special_kind(path)
    if kind:
        raise AmpRewriteError(f"{what} {path} is a {kind}, not a file or directory; it is never replaced")
    if overwrite:
        return
    if os.path.isdir(path) and not os.path.islink(path):
        if os.listdir(path):
            raise AmpRewriteError(f"{what} {path} exists and is not empty; pass --overwrite to replace it")
        return
    raise AmpRewriteError(f"{what} {path} exists; pass --overwrite to replace it")


def check_not_input(outputs: Sequence[tuple[str, str, bool]], inputs: Sequence[tuple[str, str]]) -> None:
    """Refuse outputs that would replace an input, whatever ``--overwrite`` says.

    ``outputs``: ``(path, what, is_dir)`` as for :func:`check_distinct_outputs`;
    ``inputs``: ``(path, what)`` of every file the command reads (INPUT, list files...).
    An output may not be an input, and a directory output that is replaced as a whole
    (``is_dir``) may not hold one.  Files written *into* a directory (``--dump-dir``) are
    checked one by one when staged (``Staging(protect=...)``).  Reads the file system only.
    """
    for src, src_what in inputs:
        if not os.path.lexists(src):
            continue
        for path, what, is_dir in outputs:
            if os.path.realpath(path) == os.path.realpath(src):
                raise AmpRewriteError(f"{what} is the same as {src_what} {src}; an input is never modified")
            if is_dir and is_within(src, path):
                raise AmpRewriteError(f"{src_what} {src} is inside {what} {path}; an input is never modified")


def check_output(src: str, dst: str, *, overwrite: bool, what: str = "OUTPUT") -> None:
    """Refuse an output that would modify the input or replace something without
    ``overwrite`` (see :func:`check_replaceable`).  Called before any work, so bad requests
    fail at once."""
    if is_within(dst, src) and (os.path.isdir(src) or os.path.realpath(dst) == os.path.realpath(src)):
        raise AmpRewriteError(f"{what} {dst} is the same as (or inside) INPUT; the input is never modified")
    if overwrite and os.path.isdir(dst) and is_within(src, dst):
        raise AmpRewriteError(f"replacing {what} {dst} would delete INPUT {src}")
    check_replaceable(dst, overwrite=overwrite, what=what)
