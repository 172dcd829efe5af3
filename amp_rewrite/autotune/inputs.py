"""Autotune's inputs from the caller: an ``.npz`` archive (read with ``allow_pickle=False``,
never unpickled) or a mapping of arrays, checked against the model's inputs by name, dtype
and shape.  Raises :class:`~amp_rewrite.errors.AutotuneInputError`, one line naming the file."""

from __future__ import annotations

import os
import stat
import zipfile
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import AutotuneInputError


@dataclass(frozen=True, eq=False)
class InputArrays:
    """Arrays to time with, keyed by input name, and where they came from: ``source`` names
    the file (or says they were the caller's arrays) in messages and in the report, ``path``
    is the file or ``None``.  The arrays are plain (no object dtype) and are not modified."""

    arrays: Mapping[str, np.ndarray]
    source: str
    path: str | None = None


#: The magic of a lone ``.npy`` array (numpy.save), told apart from an ``.npz`` archive.
_NPY_MAGIC = b"\x93NUMPY"


def load_inputs(path: str | os.PathLike[str]) -> InputArrays:
    """The arrays of the ``.npz`` archive at ``path`` (``numpy.savez``), keyed by its names.

    Reads with ``allow_pickle=False``: an archive that holds Python objects (an object
    array, stored as a pickle) is refused, never unpickled -- loading a pickle runs code
    chosen by whoever wrote the file.  Raises :class:`AutotuneInputError`, one line naming
    the file, for a missing path, something that is not a regular file, a file that is not
    an ``.npz`` archive (a lone ``.npy`` array included), a member that is not an array or
    cannot be read, and an archive with no arrays.  Reads the whole file; writes nothing.
    """
    p = os.fspath(path)
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        raise AutotuneInputError("no such file (autotune inputs)", path=p) from None
    except OSError as exc:
        raise AutotuneInputError(f"cannot read autotune inputs: {exc.strerror or exc}", path=p) from None
    # A FIFO or device would block or stream forever; a directory is a common slip.
    if not stat.S_ISREG(mode):
        what = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise AutotuneInputError(f"is {what}; autotune inputs are an .npz file (numpy.savez)", path=p)
    with open(p, "rb") as f:
        head = f.read(len(_NPY_MAGIC))
    if head == _NPY_MAGIC:
        raise AutotuneInputError("is a single .npy array; autotune inputs are an .npz archive of arrays "
                                 "keyed by input name (numpy.savez(FILE, x=..., ...))", path=p)
    if not zipfile.is_zipfile(p):
        raise AutotuneInputError("is not an .npz archive (numpy.savez); cannot read autotune inputs", path=p)
    arrays: dict[str, np.ndarray] = {}
    try:
        with np.load(p, allow_pickle=False) as npz:
            for name in npz.files:
                arrays[name] = _read_member(npz, name, p)
    except AutotuneInputError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise AutotuneInputError(f"is not a readable .npz archive: {_first_line(exc)}", path=p) from None
    if not arrays:
        raise AutotuneInputError("holds no arrays; autotune inputs need one per model input", path=p)
    return InputArrays(arrays, p, p)


def _read_member(npz: Any, name: str, path: str) -> np.ndarray:
    """One array of an open archive; raises :class:`AutotuneInputError` for a pickle or a
    member that is not a ``.npy`` array (``np.load`` returns such members as bytes)."""
    try:
        value = npz[name]
    except ValueError as exc:
        if "pickle" in str(exc).lower():
            raise AutotuneInputError(
                f"array {name!r} holds Python objects (stored as a pickle); autotune inputs are never "
                "unpickled -- save numeric arrays", path=path) from None
        raise AutotuneInputError(f"array {name!r} cannot be read: {_first_line(exc)}", path=path) from None
    if not isinstance(value, np.ndarray):
        raise AutotuneInputError(f"member {name!r} is not a .npy array", path=path)
    return value


def _input_arrays(inputs: str | os.PathLike[str] | Mapping[str, Any] | InputArrays) -> InputArrays:
    """:attr:`AutotuneOptions.inputs` as :class:`InputArrays` (a path is read with
    :func:`load_inputs`).  Raises :class:`AutotuneInputError` for object arrays or no arrays."""
    if isinstance(inputs, InputArrays):
        return inputs
    if isinstance(inputs, (str, os.PathLike)):
        return load_inputs(inputs)
    if not isinstance(inputs, Mapping):
        raise AutotuneInputError(f"autotune inputs must be an .npz path or a mapping of arrays, "
                                 f"not {type(inputs).__name__}")
    arrays = {}
    for name, value in inputs.items():
        array = np.asarray(value)
        if array.dtype.kind == "O":
            raise AutotuneInputError(f"autotune input {name!r} holds Python objects; give numeric arrays")
        arrays[str(name)] = array
    if not arrays:
        raise AutotuneInputError("autotune inputs hold no arrays; give one per model input")
    return InputArrays(arrays, "the caller's arrays")


def _dims_text(dims: Sequence[int | None] | None) -> str:
    """``(?, 4)`` for a signature's dims (unknown rank: ``<any shape>``).  Pure."""
    if dims is None:
        return "<any shape>"
    return "(" + ", ".join("?" if d is None or d < 0 else str(d) for d in dims) + (",)" if len(dims) == 1 else ")")


def _fit_inputs(given: InputArrays, specs: Mapping[str, tuple[Any, Sequence[int | None] | None]],
                required: Sequence[str], what: str) -> dict[str, np.ndarray]:
    """The caller's arrays checked against the model's inputs: ``specs`` maps each input
    name to ``(numpy dtype, dims or None)``, ``required`` lists those that need a value,
    ``what`` names the inputs in messages (``"signature 'serving_default'"``).  Returns the
    arrays by name (the same objects).  Raises :class:`AutotuneInputError`, one line, for an
    unknown or missing name, or a dtype, rank or shape the model does not take."""
    path = given.path
    names = ", ".join(sorted(specs)) or "none"
    unknown = sorted(set(given.arrays) - set(specs))
    if unknown:
        raise AutotuneInputError(f"autotune inputs name {', '.join(map(repr, unknown))}, not an input of the "
                                 f"{what} (its inputs: {names})", path=path)
    missing = sorted(set(required) - set(given.arrays))
    if missing:
        raise AutotuneInputError(f"autotune inputs lack {', '.join(map(repr, missing))} (inputs of the {what}: "
                                 f"{names})", path=path)
    for name, array in given.arrays.items():
        want, dims = specs[name]
        want = np.dtype(want)
        # TensorFlow's strings are numpy objects; fixed-width bytes or str arrays feed them.
        ok = array.dtype.kind in "SU" if want.kind == "O" else array.dtype == want
        if not ok:
            raise AutotuneInputError(f"autotune input {name!r} is {array.dtype}; the {what} takes "
                                     f"{'strings' if want.kind == 'O' else want}", path=path)
        if dims is None:
            continue
        if array.ndim != len(dims) or any(d is not None and d >= 0 and d != n for d, n in zip(dims, array.shape)):
            raise AutotuneInputError(f"autotune input {name!r} has shape {_dims_text(array.shape)}; the {what} "
                                     f"takes {_dims_text(dims)}", path=path)
    return dict(given.arrays)


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]
