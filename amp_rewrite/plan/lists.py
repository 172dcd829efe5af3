"""The op lists ("paint buckets") of the auto mixed precision rewrite: data files and loader.

The rewrite sorts ops into four lists (TensorFlow's names):

* ``allow`` -- always converted to the low precision (GEMMs, convolutions);
* ``infer`` -- converted unless fed, through infer/clear ops, by a ``deny`` op;
* ``deny`` -- kept in float32, and that float32-ness spreads downstream;
* ``clear`` -- numerically neutral; follows its neighbours.

The lists are data, kept in TOML *profiles*.  Two are shipped (``lists/`` in the repository,
installed as the package ``amp_rewrite._lists``):

* ``tensorflow`` -- TensorFlow's lists, exactly (tested against TF's own dump): 2.21's tables
  and per-release deltas for 2.16 to 2.20 (see "TensorFlow versions" below);
* ``default`` -- ``tensorflow`` plus softmax, arithmetic reductions and cross-entropy losses
  kept in float32.

Profile schema (version 1)
--------------------------
::

    schema_version = 1                 # required; must be 1
    name = "tensorflow"                # optional strings: name, description, source
    description = "..."
    source = "..."
    extends = "tensorflow"             # optional: parent profile (packaged name or .toml path,
                                       # a relative path is taken from this file's folder)
    planner = "optimal"                # optional: "greedy" (TensorFlow's passes, the default)
                                       # or "optimal" (cost-aware min cut, normalization-aware);
                                       # inherited through extends

    [float16.allow]                    # tables: {float16,bfloat16}.{allow,infer,deny,clear}
    MatMul = "one-line reason"         # plain form: just the reason
    BatchMatMul = { reason = "...", min_cuda = 9010 }    # gates, checked for backend cuda only
    Conv3D = { reason = "...", min_cudnn = 7602 }
    CudnnRNN = { reason = "...", backends = ["cuda"] }   # subset of ["cuda", "onednn"];
                                                         # default: both
    Mha = { reason = "...", backends = ["cuda"], registered = false }
                                       # registered = false: not in OSS TF's op registry,
                                       # kept for parity (skips the op-name check)
    [float16.remove]                   # only in a file that has a parent:
    Softmax = "reason"                 # drop the op from every list of the parent

    tf_version = "2.21"                # optional: the TensorFlow release (major.minor) whose
                                       # lists the tables above are; required by [versions]
    [versions."2.16"]                  # how an older release's lists differ from those tables
    note = "..."                       # optional string; an empty table: "same lists"
    [versions."2.16".float16.infer]    # same entry syntax; an entry moves the op, as a child
    Foo = "reason"                     # profile's does
    [versions."2.16".float16.remove]   # drop an op of this file's own tables
    Bar = "reason"

An op may appear in at most one list per precision within one file.  Backends: ``cuda`` are
GPU targets (TensorFlow's CUDA and CPU-emulation modes, ``use_cuda``), ``onednn`` are CPU
targets (TensorFlow's oneDNN float16 mode, ``use_onednn``; and the bfloat16 mode).  Versions are
decimal like TensorFlow's: CUDA 12.9 is ``12090``, cuDNN 9.10.0 is ``91000``.

Layers and override order
-------------------------
1. The profile and its ``extends`` chain, root first.  Each layer *moves* ops: an entry in a
   child takes the op off whichever list of the parent had it and puts it on the child's list
   (with the child's reason and gates); ``remove`` drops it.
2. ``user_file`` (same schema).  If it has ``extends`` it replaces ``profile`` as the base (its
   own chain is used); otherwise it is layered on top of ``profile`` with the same move
   semantics.
3. Gates are evaluated for the :class:`ListContext` (precision, backend, CUDA/cuDNN versions).
4. Level ``TENSOR_CORES_ONLY`` with float16 on cuda empties infer, deny and clear (allow is
   unchanged) before the edits, and -- exactly like TensorFlow, which never reads those lists'
   environment variables at this level -- edits of infer, deny and clear are then ignored
   (with a warning); allow edits still apply.
5. ``edits`` in order: ``add`` inserts the op into a list, ``remove`` erases it from that list
   (and nothing else: like TensorFlow, an edit can leave an op on two lists).
6. Validation: an op on two lists is an error.
7. Level ``TREAT_INFER_AS_DENY`` moves every infer op to deny.  ``UNSAFE_FORCE_ALL`` does not
   change the lists (the painter handles it).

Environment edits (:func:`edits_from_environ`) read TensorFlow's
``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_*`` variables and reproduce TensorFlow's order.

TensorFlow versions
-------------------
TensorFlow's lists change between releases.  A file with ``tf_version`` holds the lists of that
release in its tables and, per older release it supports, a ``[versions."X.Y"]`` delta.  Loading
with ``tf_version="X.Y"`` applies that delta to the file's own tables (entries move the op,
``remove`` drops it) before any child layer; a versioned file that lacks the requested release
is an error (:func:`supported_tf_versions` says which releases the chain has).  Loading with
``tf_version=None`` uses every file's own tables.  Files without ``tf_version`` are the same for
every release.  Only the entries in effect for the requested release are checked against the
op registry: an older release's delta may name ops that the installed TensorFlow lacks.

Nothing in this module reads the environment except :func:`edits_from_environ`, and that only
reads the mapping it is given.  The installed TensorFlow's version is read by the caller (the
API boundary) and passed in as ``tf_version``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomllib is 3.11+; tomli is the same parser.
    import tomli as tomllib  # type: ignore[no-redef]

if TYPE_CHECKING:  # only used in annotations; its module moved in 3.11
    from importlib.resources.abc import Traversable

from ..errors import ListError

__all__ = [
    "Category",
    "CATEGORIES",
    "Level",
    "LEVELS",
    "Precision",
    "PRECISIONS",
    "Backend",
    "BACKENDS",
    "ENV_PREFIX",
    "ListContext",
    "ListEdit",
    "OpLists",
    "available_profiles",
    "load_lists",
    "supported_tf_versions",
    "tf_major_minor",
    "edits_from_environ",
]

logger = logging.getLogger(__name__)

Category = Literal["allow", "infer", "deny", "clear"]
CATEGORIES: tuple[Category, ...] = ("allow", "infer", "deny", "clear")
Level = Literal["DEFAULT", "TENSOR_CORES_ONLY", "TREAT_INFER_AS_DENY", "UNSAFE_FORCE_ALL"]
LEVELS: tuple[Level, ...] = cast("tuple[Level, ...]", get_args(Level))
Precision = Literal["float16", "bfloat16"]
PRECISIONS: tuple[Precision, ...] = ("float16", "bfloat16")
Backend = Literal["cuda", "onednn"]
BACKENDS: tuple[Backend, ...] = ("cuda", "onednn")

#: Prefix of every TensorFlow environment variable this module understands.
ENV_PREFIX = "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_"

# The package the list files are installed as (see pyproject.toml), and where they live in a
# source checkout, where that package does not exist (setuptools maps it from lists/ only when
# installing).
_PACKAGE = "amp_rewrite._lists"
_SOURCE_TREE_LISTS = Path(__file__).resolve().parents[2] / "lists"

_SCHEMA_VERSION = 1
_TOP_KEYS = frozenset({"schema_version", "name", "description", "source", "extends", "planner",
                       "tf_version", "versions", *PRECISIONS})
_VERSION_KEYS = frozenset({"note", *PRECISIONS})
# A TensorFlow release as the lists are keyed: major.minor ("2.16"); the patch level never
# changes the op lists.
_TF_VERSION = re.compile(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)")
# What tf.__version__ may look like: "2.16.2", "2.21.0-rc1", "2.22.0-dev20260101", "2.16".
_TF_VERSION_PREFIX = re.compile(r"\s*(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[-+.a-zA-Z][-+.a-zA-Z0-9]*)?\s*")
#: Values of the top-level ``planner`` key: TensorFlow's greedy passes, or the cost-aware
#: minimum cut with normalization-aware safety (``amp_rewrite.plan.optimal``).
PLANNERS = ("greedy", "optimal", "min-casts")
_SECTION_KEYS = frozenset({*CATEGORIES, "remove"})
_ENTRY_KEYS = frozenset({"reason", "min_cuda", "min_cudnn", "backends", "registered"})
# TensorFlow op names: a capital letter (or "_" for internal ops) then letters, digits, "_", ">".
_OP_NAME = re.compile(r"_?[A-Za-z][A-Za-z0-9_>]*")


# ---------------------------------------------------------------------------------------------
# Public value types
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ListContext:
    """Which lists to build: the low precision, the backend and (for cuda) the library versions.

    ``cuda_version`` / ``cudnn_version`` are decimal like TensorFlow's (CUDA 12.9 -> ``12090``,
    cuDNN 9.10.0 -> ``91000``); the defaults are what TF 2.21 wheels are built with.  They only
    matter for the cuda backend.  To mirror TensorFlow's modes: CUDA mode is
    ``("float16", "cuda", <GPU's versions>)``, the CPU fp16-emulation mode is
    ``("float16", "cuda", 10000, 8000)``, the oneDNN float16 mode is ``("float16", "onednn")``
    and the oneDNN bfloat16 mode is ``("bfloat16", "onednn")``.
    """

    precision: Precision
    backend: Backend
    cuda_version: int = 12090
    cudnn_version: int = 91000

    def __post_init__(self) -> None:
        # Validate eagerly: a typo here would otherwise silently select no gated entries.
        if self.precision not in PRECISIONS:
            raise ListError(f"unknown precision {self.precision!r}; expected one of {list(PRECISIONS)}")
        if self.backend not in BACKENDS:
            raise ListError(f"unknown backend {self.backend!r}; expected one of {list(BACKENDS)}")
        for label, value in (("cuda_version", self.cuda_version), ("cudnn_version", self.cudnn_version)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ListError(f"{label} must be a non-negative integer, got {value!r}")


@dataclass(frozen=True)
class ListEdit:
    """One edit of one list: ``add`` inserts ``op`` into ``category``, ``remove`` erases it.

    ``origin`` says where the edit came from, for messages and :attr:`OpLists.origins`
    (e.g. ``"argument"`` or ``"environment TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_DENYLIST_ADD"``).
    """

    action: Literal["add", "remove"]
    category: Category
    op: str
    origin: str = "argument"

    def __post_init__(self) -> None:
        if self.action not in ("add", "remove"):
            raise ListError(f"edit action must be 'add' or 'remove', got {self.action!r} ({self.origin})")
        if self.category not in CATEGORIES:
            raise ListError(
                f"edit category must be one of {list(CATEGORIES)}, got {self.category!r} ({self.origin})"
            )
        if not isinstance(self.op, str) or not _OP_NAME.fullmatch(self.op):
            raise ListError(f"edit names an invalid op name {self.op!r} ({self.origin})", op=str(self.op))


@dataclass(frozen=True)
class OpLists:
    """The effective lists for one :class:`ListContext`, after all layers, edits and the level.

    Immutable.  ``reasons`` maps every listed op to a one-line reason (ops added by an edit get
    ``"added by <origin>"``); ``origins`` maps every listed op to where its entry came from
    (``"profile tensorflow"``, ``"file /x.toml"`` or an edit's origin).  ``profile`` names the
    layers used (``"default"``, or ``"default + file /x.toml"`` with a user file).
    """

    allow: frozenset[str]
    infer: frozenset[str]
    deny: frozenset[str]
    clear: frozenset[str]
    # Mappings are not hashable; leave them out of __hash__ (they still take part in ==).
    reasons: Mapping[str, str] = field(default_factory=dict, hash=False)
    origins: Mapping[str, str] = field(default_factory=dict, hash=False)
    profile: str = ""
    #: The planner the profile asks for (``"greedy"`` or ``"optimal"``); the last layer of the
    #: ``extends`` chain that sets ``planner`` wins.
    planner: str = "greedy"
    #: The TensorFlow release (``"2.16"``) the lists were loaded for (versioned files gave
    #: that release's lists; the painter reproduces that release's pass), or ``None`` when
    #: loaded without one (each file's own tables; the newest pass).
    tf_version: str | None = None

    def category_of(self, op: str) -> Category | None:
        """The list ``op`` is on, or ``None`` when it is on none (the lists never overlap)."""
        for category in CATEGORIES:
            if op in getattr(self, category):
                return category
        return None

    def as_dict(self) -> dict[str, list[str]]:
        """A new ``{category: sorted op names}`` dict in the order allow, infer, deny, clear."""
        return {category: sorted(getattr(self, category)) for category in CATEGORIES}


# ---------------------------------------------------------------------------------------------
# Internal representation of the files
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    """One op entry of one file, before its gates are evaluated."""

    op: str
    category: Category
    reason: str
    origin: str
    backends: frozenset[str]
    min_cuda: int
    min_cudnn: int
    registered: bool

    def applies(self, context: ListContext) -> bool:
        """Whether the entry's gates admit ``context`` (version gates only bind on cuda)."""
        if context.backend not in self.backends:
            return False
        if context.backend == "cuda":
            return context.cuda_version >= self.min_cuda and context.cudnn_version >= self.min_cudnn
        return True


@dataclass
class _Layer:
    """One parsed list file."""

    label: str  # "profile tensorflow" or "file /abs/path.toml": the origin of its entries
    name: str
    location: str  # for error messages
    extends: str | None
    base_dir: Traversable | None  # where a relative ``extends`` path is resolved
    entries: dict[str, dict[str, _Entry]]  # precision -> op -> entry
    removes: dict[str, dict[str, str]]  # precision -> op -> reason
    planner: str | None = None
    tf_version: str | None = None  # the release the tables above are; None: unversioned
    # Older releases: version -> (entries, removes) relative to the tables above.
    versions: dict[str, _VersionDelta] = field(default_factory=dict)

    def supported_versions(self) -> list[str]:
        """The releases this file has lists for, oldest first (empty when unversioned)."""
        if self.tf_version is None:
            return []
        return sorted({self.tf_version, *self.versions}, key=_version_key)

    def for_version(self, tf_version: str | None) -> _Layer:
        """This layer with the delta of ``tf_version`` applied to its tables.  Pure.

        ``None``, an unversioned layer and the layer's own release return it unchanged; a
        release the layer has no lists for raises :class:`ListError`.
        """
        if tf_version is None or self.tf_version is None or tf_version == self.tf_version:
            return self
        delta = self.versions.get(tf_version)
        if delta is None:
            raise ListError(
                f"{self.name} has no op lists for TensorFlow {tf_version}; it has them for "
                f"{', '.join(self.supported_versions())}. Install a supported TensorFlow, or "
                "choose the lists of a supported release explicitly (tf_version= / --tf-version).",
                path=self.location,
            )
        entries: dict[str, dict[str, _Entry]] = {}
        for precision in PRECISIONS:
            table = {op: e for op, e in self.entries[precision].items() if op not in delta.removes[precision]}
            table.update(delta.entries[precision])  # keyed by op: an entry moves the op
            entries[precision] = table
        return dataclasses.replace(self, entries=entries, versions={}, tf_version=tf_version)


@dataclass(frozen=True)
class _VersionDelta:
    """How one older TensorFlow release's lists differ from a file's own tables."""

    entries: dict[str, dict[str, _Entry]]  # precision -> op -> entry (added or moved)
    removes: dict[str, dict[str, str]]  # precision -> op -> reason (dropped)


def _version_key(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


def tf_major_minor(version: str) -> str:
    """``"2.16"`` for a TensorFlow version string such as ``"2.16.2"``, ``"2.21.0-rc1"`` or
    ``"2.16"``: the part the op lists are keyed by.  Raises :class:`ListError` for anything
    that does not start with ``major.minor``."""
    match = _TF_VERSION_PREFIX.fullmatch(version) if isinstance(version, str) else None
    if match is None:
        raise ListError(f"not a TensorFlow version: {version!r}; expected major.minor such as '2.16'")
    return f"{int(match.group(1))}.{int(match.group(2))}"


# ---------------------------------------------------------------------------------------------
# Locating and reading files
# ---------------------------------------------------------------------------------------------


def _lists_dir() -> Traversable:
    """The folder of the packaged profiles.

    Prefers the installed package ``amp_rewrite._lists``; in a source checkout that package is
    not importable (setuptools maps ``lists/`` onto it only when installing), so fall back to the
    ``lists/`` folder next to the ``amp_rewrite`` package.  Pure lookup; mutates nothing.
    """
    try:
        return importlib.resources.files(_PACKAGE)
    except ModuleNotFoundError:
        logger.debug("%s is not importable; using the source tree's %s", _PACKAGE, _SOURCE_TREE_LISTS)
    if _SOURCE_TREE_LISTS.is_dir():
        return _SOURCE_TREE_LISTS
    raise ListError(
        f"the packaged op lists are missing: neither the package {_PACKAGE} nor the folder "
        f"{_SOURCE_TREE_LISTS} exists (is amp_rewrite installed correctly?)"
    )


def available_profiles() -> list[str]:
    """Sorted names of the packaged profiles (the ``*.toml`` files shipped with amp_rewrite)."""
    return sorted(
        item.name[: -len(".toml")]
        for item in _lists_dir().iterdir()
        if item.name.endswith(".toml") and item.is_file()
    )


def _read_toml(source: Traversable | Path, location: str) -> dict[str, Any]:
    """Parse one TOML file; any read or syntax problem becomes a ListError naming the file."""
    try:
        text = source.read_bytes().decode("utf-8")
        return tomllib.loads(text)
    except FileNotFoundError:
        raise ListError("list file not found", path=location) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ListError(f"cannot read list file: {exc}", path=location) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ListError(f"invalid TOML: {exc}", path=location) from exc
    except RecursionError:
        # tomllib parses nested arrays and tables recursively; a list file is flat.
        raise ListError("invalid list file: values are nested too deeply", path=location) from None


def _looks_like_path(ref: str) -> bool:
    return ref.endswith(".toml") or "/" in ref or os.sep in ref


def _resolve(
    ref: str | os.PathLike[str], base_dir: Traversable | None, *, path_only: bool = False
) -> tuple[Traversable | Path, str, str]:
    """Find a profile reference: ``(file, label, location)``.  Reads nothing but directories.

    A packaged name wins over a path (unless ``path_only``); anything else that looks like a
    path is a file, relative to ``base_dir`` (the extending file's folder) when given.
    """
    if not isinstance(ref, os.PathLike) and not path_only:
        if not isinstance(ref, str) or not ref:
            raise ListError(f"a profile must be a profile name or a path, got {ref!r}")
        names = available_profiles()
        if ref in names:
            source = _lists_dir() / f"{ref}.toml"
            return source, f"profile {ref}", str(source)
        if not _looks_like_path(ref):
            raise ListError(f"unknown profile {ref!r}; available profiles: {', '.join(names)}")
    path = Path(os.fspath(ref)).expanduser()
    if not path.is_absolute() and isinstance(base_dir, Path):
        path = base_dir / path
    path = path.resolve()
    if not path.is_file():
        raise ListError("list file not found", path=str(path))
    return path, f"file {path}", str(path)


# ---------------------------------------------------------------------------------------------
# Parsing and validating one file
# ---------------------------------------------------------------------------------------------


def _check_keys(table: Mapping[str, Any], allowed: frozenset[str], where: str, location: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ListError(
            f"unknown key(s) {', '.join(repr(k) for k in unknown)} in {where}; "
            f"allowed: {', '.join(sorted(allowed))}",
            path=location,
        )


def _reason(value: Any, where: str, location: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ListError(f"{where}: the reason must be a non-empty string, got {value!r}", path=location)
    return value.strip()


def _parse_entry(op: str, category: Category, value: Any, where: str, label: str, location: str) -> _Entry:
    """One ``Op = "reason"`` or ``Op = { reason = ..., ... }`` entry."""
    if isinstance(value, str):
        return _Entry(op, category, _reason(value, where, location), label, frozenset(BACKENDS), 0, 0, True)
    if not isinstance(value, dict):
        raise ListError(
            f"{where}: expected a reason string or an inline table, got {type(value).__name__}", path=location
        )
    _check_keys(value, _ENTRY_KEYS, where, location)
    if "reason" not in value:
        raise ListError(f"{where}: missing 'reason'", path=location)
    reason = _reason(value["reason"], f"{where}.reason", location)
    gates: dict[str, int] = {}
    for key in ("min_cuda", "min_cudnn"):
        number = value.get(key, 0)
        # bool is an int subclass; "true" is never a meaningful version.
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            raise ListError(f"{where}.{key}: expected a non-negative integer, got {number!r}", path=location)
        gates[key] = number
    backends = value.get("backends", list(BACKENDS))
    if (
        not isinstance(backends, list)
        or not backends
        or not all(isinstance(b, str) and b in BACKENDS for b in backends)
        or len(set(backends)) != len(backends)
    ):
        raise ListError(
            f"{where}.backends: expected a non-empty list of distinct values from {list(BACKENDS)}, "
            f"got {backends!r}",
            path=location,
        )
    registered = value.get("registered", True)
    if not isinstance(registered, bool):
        raise ListError(f"{where}.registered: expected true or false, got {registered!r}", path=location)
    return _Entry(op, category, reason, label, frozenset(backends), gates["min_cuda"], gates["min_cudnn"], registered)


def _parse_layer(data: dict[str, Any], label: str, location: str, base_dir: Traversable | None, default_name: str) -> _Layer:
    """Validate a parsed TOML document and turn it into a :class:`_Layer`.  Pure."""
    _check_keys(data, _TOP_KEYS, "the top level", location)
    version = data.get("schema_version")
    if isinstance(version, bool) or version != _SCHEMA_VERSION:
        raise ListError(
            f"schema_version must be {_SCHEMA_VERSION}, got {version!r}"
            + (" (missing)" if "schema_version" not in data else ""),
            path=location,
        )
    for key in ("name", "description", "source", "extends"):
        if key in data and (not isinstance(data[key], str) or not data[key]):
            raise ListError(f"{key!r} must be a non-empty string, got {data[key]!r}", path=location)
    if "planner" in data and data["planner"] not in PLANNERS:
        raise ListError(f"'planner' must be one of {', '.join(PLANNERS)}, got {data['planner']!r}",
                        path=location)
    entries, removes = _parse_tables(data, "", label, location)
    tf_version = data.get("tf_version")
    if tf_version is not None and (not isinstance(tf_version, str) or not _TF_VERSION.fullmatch(tf_version)):
        raise ListError(f"'tf_version' must be a TensorFlow release such as \"2.21\", got {tf_version!r}",
                        path=location)
    versions = _parse_versions(data.get("versions"), tf_version, entries, label, location)
    return _Layer(
        label=label,
        name=data.get("name", default_name),
        location=location,
        extends=data.get("extends"),
        base_dir=base_dir,
        entries=entries,
        removes=removes,
        planner=data.get("planner"),
        tf_version=tf_version,
        versions=versions,
    )


def _parse_tables(
    data: Mapping[str, Any], prefix: str, label: str, location: str
) -> tuple[dict[str, dict[str, _Entry]], dict[str, dict[str, str]]]:
    """The ``[float16.*]`` and ``[bfloat16.*]`` tables of ``data`` (the top level, or one
    ``[versions."X.Y"]`` table with ``prefix`` ``versions."X.Y".``): ``(entries, removes)``."""
    entries: dict[str, dict[str, _Entry]] = {p: {} for p in PRECISIONS}
    removes: dict[str, dict[str, str]] = {p: {} for p in PRECISIONS}
    for precision in PRECISIONS:
        section = data.get(precision, {})
        if not isinstance(section, dict):
            raise ListError(f"[{prefix}{precision}] must be a table, got {type(section).__name__}", path=location)
        _check_keys(section, _SECTION_KEYS, f"[{prefix}{precision}]", location)
        for key, table in section.items():
            where = f"[{prefix}{precision}.{key}]"
            if not isinstance(table, dict):
                raise ListError(f"{where} must be a table, got {type(table).__name__}", path=location)
            for op, value in table.items():
                entry_where = f"{prefix}{precision}.{key}.{op}"
                if not _OP_NAME.fullmatch(op):
                    raise ListError(f"{entry_where}: {op!r} is not a valid op name", path=location, op=op)
                if key == "remove":
                    if isinstance(value, dict):
                        _check_keys(value, frozenset({"reason"}), entry_where, location)
                        value = value.get("reason")
                    removes[precision][op] = _reason(value, entry_where, location)
                    continue
                category = cast(Category, key)
                previous = entries[precision].get(op)
                if previous is not None:
                    raise ListError(
                        f"op {op} is on two {precision} lists in one {'table' if prefix else 'file'}: "
                        f"{previous.category} and {category}",
                        path=location,
                        op=op,
                    )
                entries[precision][op] = _parse_entry(op, category, value, entry_where, label, location)
        both = sorted(set(removes[precision]) & set(entries[precision]))
        if both:
            raise ListError(
                f"op(s) both removed and listed in [{prefix}{precision}]: {', '.join(both)}", path=location
            )
    return entries, removes


def _parse_versions(
    value: Any, tf_version: str | None, base: Mapping[str, Mapping[str, _Entry]], label: str, location: str
) -> dict[str, _VersionDelta]:
    """The ``[versions."X.Y"]`` tables: per older release, its delta from the file's tables.

    A delta may only remove ops the file's own tables list (anything else is a typo or a
    stale entry), and may not restate an entry unchanged (it would hide nothing but noise).
    """
    if value is None:
        return {}
    if tf_version is None:
        raise ListError("[versions] needs 'tf_version': the release the file's own tables are", path=location)
    if not isinstance(value, dict):
        raise ListError(f"'versions' must be a table, got {type(value).__name__}", path=location)
    deltas: dict[str, _VersionDelta] = {}
    for version, table in value.items():
        if not _TF_VERSION.fullmatch(version):
            raise ListError(f"[versions.{version!r}]: not a TensorFlow release such as \"2.16\"", path=location)
        if version == tf_version:
            raise ListError(f"[versions.\"{version}\"] repeats the file's own tf_version", path=location)
        prefix = f'versions."{version}".'
        if not isinstance(table, dict):
            raise ListError(f"[{prefix[:-1]}] must be a table, got {type(table).__name__}", path=location)
        _check_keys(table, _VERSION_KEYS, f"[{prefix[:-1]}]", location)
        if "note" in table and (not isinstance(table["note"], str) or not table["note"].strip()):
            raise ListError(f"{prefix}note must be a non-empty string, got {table['note']!r}", path=location)
        entries, removes = _parse_tables(table, prefix, label, location)
        for precision in PRECISIONS:
            stale = sorted(op for op in removes[precision] if op not in base[precision])
            if stale:
                raise ListError(
                    f"[{prefix}{precision}.remove] names op(s) on no list of this file: {', '.join(stale)}",
                    path=location,
                )
            same = sorted(op for op, entry in entries[precision].items() if base[precision].get(op) == entry)
            if same:
                raise ListError(
                    f"[{prefix}{precision}] restates entries of this file unchanged: {', '.join(same)}",
                    path=location,
                )
        deltas[version] = _VersionDelta(entries, removes)
    return deltas


def _load_chain(ref: str | os.PathLike[str], base_dir: Traversable | None, seen: tuple[str, ...] = ()) -> list[_Layer]:
    """The layers of a profile and its ``extends`` ancestors, root first."""
    source, label, location = _resolve(ref, base_dir)
    if label in seen:
        raise ListError(f"'extends' cycle: {' -> '.join((*seen, label))}", path=location)
    stem = Path(location).stem
    layer = _parse_layer(_read_toml(source, location), label, location, _parent_of(source), stem)
    if layer.extends is None:
        return [layer]
    return [*_load_chain(layer.extends, layer.base_dir, (*seen, label)), layer]


def _parent_of(source: Traversable | Path) -> Traversable | None:
    # Only real files have a folder to resolve relative "extends" paths against; packaged
    # profiles extend each other by name.
    return source.parent if isinstance(source, Path) else None


def _merge(layers: Sequence[_Layer]) -> dict[str, dict[str, _Entry]]:
    """Apply the layers in order with move semantics.  Returns a new dict; inputs untouched."""
    merged: dict[str, dict[str, _Entry]] = {p: {} for p in PRECISIONS}
    for index, layer in enumerate(layers):
        for precision in PRECISIONS:
            if layer.removes[precision] and index == 0:
                raise ListError(
                    f"[{precision}.remove] is only allowed in a file that extends another "
                    f"(or a user file layered on a profile)",
                    path=layer.location,
                )
            missing = sorted(op for op in layer.removes[precision] if op not in merged[precision])
            if missing:
                raise ListError(
                    f"[{precision}.remove] names op(s) on no list of the parent: {', '.join(missing)}",
                    path=layer.location,
                )
            for op in layer.removes[precision]:
                del merged[precision][op]
            # Keyed by op, so a child's entry replaces (moves) the parent's, whatever its list.
            merged[precision].update(layer.entries[precision])
    return merged


# ---------------------------------------------------------------------------------------------
# Op-name checks
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _tensorflow_knows_op(op: str) -> bool:
    """Whether TensorFlow's global op registry has ``op``.  Imports TensorFlow on first use."""
    # Imported lazily: importing TensorFlow takes seconds, and callers that pass their own
    # is_known_op never need it.
    from tensorflow.python.framework import op_def_registry

    return op_def_registry.get(op) is not None


def _check_known_ops(layers: Sequence[_Layer], is_known_op: Callable[[str], bool]) -> None:
    """Every entry of every layer (gated or not) must name an op TensorFlow knows."""
    unknown: list[str] = []
    for layer in layers:
        for precision in PRECISIONS:
            for op, entry in sorted(layer.entries[precision].items()):
                if entry.registered and not is_known_op(op):
                    unknown.append(f"{op} ({layer.location}, {precision}.{entry.category})")
    if unknown:
        raise ListError(
            "unknown op name(s), not in TensorFlow's op registry: "
            + "; ".join(unknown)
            + ". Fix the spelling, or mark an op that OSS TensorFlow does not register with "
            "registered = false."
        )


# ---------------------------------------------------------------------------------------------
# The loader
# ---------------------------------------------------------------------------------------------


def load_lists(
    profile: str | os.PathLike[str] = "default",
    *,
    context: ListContext,
    user_file: str | os.PathLike[str] | None = None,
    edits: Sequence[ListEdit] = (),
    level: Level = "DEFAULT",
    is_known_op: Callable[[str], bool] | None = None,
    tf_version: str | None = None,
) -> OpLists:
    """Build the effective op lists for ``context``.

    ``profile`` is a packaged profile name (see :func:`available_profiles`) or a path to a
    ``.toml`` file; ``user_file`` an optional extra file; ``edits`` are applied in order; the
    override order is the one in the module docstring.  ``is_known_op`` decides which op names
    are valid (default: TensorFlow's op registry, which imports TensorFlow); entries marked
    ``registered = false`` skip it, and edits may also name any op the loaded files name.
    ``tf_version`` (``"2.16"``, or a full version string such as ``"2.16.2"``) selects that
    TensorFlow release's lists in versioned files (``None``: each file's own tables); the
    caller reads it from the installed TensorFlow.

    Reads the list files; mutates nothing (the result is a new immutable :class:`OpLists`).
    Raises :class:`ListError` for an unknown profile, a missing or invalid file, an unknown op
    name, an op left on two lists, an unknown level, or a release a versioned file has no
    lists for.
    """
    if level not in LEVELS:
        raise ListError(f"unknown level {level!r}; accepted values: {', '.join(LEVELS)}")
    known = is_known_op if is_known_op is not None else _tensorflow_knows_op
    version = tf_major_minor(tf_version) if tf_version is not None else None

    if user_file is not None:
        user_source, user_label, user_location = _resolve(user_file, None, path_only=True)
        user_layer = _parse_layer(
            _read_toml(user_source, user_location), user_label, user_location,
            _parent_of(user_source), Path(user_location).stem,
        )
        if user_layer.extends is not None:
            # The user file names its own base; ``profile`` is not used.
            logger.debug("%s extends %r; profile %r is not used", user_location, user_layer.extends, profile)
            base = _load_chain(user_layer.extends, user_layer.base_dir, (user_label,))
        else:
            base = _load_chain(profile, None)
        layers = [*base, user_layer]
        profile_label = f"{base[-1].name} + {user_label}"
    else:
        layers = _load_chain(profile, None)
        profile_label = layers[-1].name

    # The requested release's lists, before the registry check: an older release's delta may
    # name ops the installed TensorFlow lacks, and only the lists in effect must be known.
    layers = [layer.for_version(version) for layer in layers]
    _check_known_ops(layers, known)
    merged = _merge(layers)[context.precision]
    logger.debug("loaded %s for %s from %s", profile_label, context, [layer.location for layer in layers])

    # category -> op -> (reason, origin), for the entries whose gates admit this context.
    lists: dict[Category, dict[str, tuple[str, str]]] = {c: {} for c in CATEGORIES}
    for op, entry in merged.items():
        if entry.applies(context):
            lists[entry.category][op] = (entry.reason, entry.origin)

    # TENSOR_CORES_ONLY (float16 on cuda): TensorFlow returns empty infer, deny and clear lists
    # without even reading their environment edits, so edits of those lists are ignored too
    # (verified against TF 2.21); allow and its edits are unaffected.
    frozen: tuple[Category, ...] = ()
    if level == "TENSOR_CORES_ONLY" and context.precision == "float16" and context.backend == "cuda":
        frozen = ("infer", "deny", "clear")
        for category in frozen:
            lists[category].clear()

    _apply_edits(lists, edits, known, merged, frozen)
    _check_conflicts(lists)

    if level == "TREAT_INFER_AS_DENY":
        for op, (reason, origin) in lists["infer"].items():
            lists["deny"][op] = (f"{reason} [infer, denied by level TREAT_INFER_AS_DENY]", origin)
        lists["infer"].clear()

    reasons = {op: reason for table in lists.values() for op, (reason, _) in table.items()}
    origins = {op: origin for table in lists.values() for op, (_, origin) in table.items()}
    return OpLists(
        allow=frozenset(lists["allow"]),
        infer=frozenset(lists["infer"]),
        deny=frozenset(lists["deny"]),
        clear=frozenset(lists["clear"]),
        reasons=MappingProxyType(reasons),
        origins=MappingProxyType(origins),
        profile=profile_label,
        planner=next((layer.planner for layer in reversed(layers) if layer.planner), "greedy"),
        tf_version=version,
    )


def supported_tf_versions(profile: str | os.PathLike[str] = "tensorflow") -> list[str]:
    """The TensorFlow releases (``"2.16"``, ...) ``profile`` has op lists for, oldest first:
    those every versioned file of its ``extends`` chain has.  Empty when no file of the chain
    is versioned (its lists are the same for every release).  Reads the files; pure."""
    supported: set[str] | None = None
    for layer in _load_chain(profile, None):
        if layer.tf_version is not None:
            versions = set(layer.supported_versions())
            supported = versions if supported is None else supported & versions
    return sorted(supported or (), key=_version_key)


def _apply_edits(
    lists: dict[Category, dict[str, tuple[str, str]]],
    edits: Sequence[ListEdit],
    is_known_op: Callable[[str], bool],
    entries: Mapping[str, _Entry],
    frozen: Sequence[Category] = (),
) -> None:
    """Apply ``edits`` to ``lists`` in place, in order, skipping edits of ``frozen`` lists.

    Unknown op names are an error (even in skipped edits: a typo is a typo).
    """
    # An op the loaded files name (e.g. an unregistered internal op) may be edited too.
    # dict.fromkeys: one mention per op and origin (an argument that moves an op expands to
    # several edits of the same op).
    unknown = list(dict.fromkeys(
        f"{e.op} ({e.origin})" for e in edits if e.op not in entries and not is_known_op(e.op)))
    if unknown:
        raise ListError("list edit(s) name unknown op(s), not in TensorFlow's op registry: " + "; ".join(unknown))
    ignored = [f"{e.action} {e.op} ({e.origin})" for e in edits if e.category in frozen]
    if ignored:
        logger.warning(
            "level TENSOR_CORES_ONLY keeps the %s lists empty; ignoring edit(s): %s",
            "/".join(frozen), "; ".join(ignored),
        )
    for edit in edits:
        if edit.category in frozen:
            continue
        table = lists[edit.category]
        if edit.action == "add":
            # setdefault: re-adding an op keeps the reason of the entry already there.
            table.setdefault(edit.op, (f"added by {edit.origin}", edit.origin))
        elif table.pop(edit.op, None) is None:
            # Like TensorFlow, removing an absent op is not an error.
            logger.debug("%s: %s is not on the %s list; nothing to remove", edit.origin, edit.op, edit.category)


def _check_conflicts(lists: Mapping[Category, Mapping[str, tuple[str, str]]]) -> None:
    """TensorFlow refuses lists with an op on more than one list; so do we, naming them all."""
    where: dict[str, list[str]] = {}
    for category in CATEGORIES:
        for op, (_, origin) in lists[category].items():
            where.setdefault(op, []).append(f"{category} (from {origin})")
    conflicts = sorted((op, places) for op, places in where.items() if len(places) > 1)
    if conflicts:
        details = "; ".join(f"{op} is on {' and '.join(places)}" for op, places in conflicts)
        raise ListError(
            f"op lists have conflicting entries: {details}. Remove the op from the other list "
            "as well (e.g. with a matching *_REMOVE edit).",
            op=conflicts[0][0],
        )


# ---------------------------------------------------------------------------------------------
# Environment variables
# ---------------------------------------------------------------------------------------------

_ENV_LISTS: dict[Category, str] = {
    "allow": "ALLOWLIST",
    "infer": "INFERLIST",
    "deny": "DENYLIST",
    "clear": "CLEARLIST",
}
# TensorFlow's pre-2.4 names; clear never had one.
_ENV_LEGACY_LISTS: dict[Category, str] = {"allow": "WHITELIST", "infer": "GRAYLIST", "deny": "BLACKLIST"}


def _split(value: str) -> list[str]:
    # TensorFlow splits on "," and keeps whitespace and empty items; we strip and drop them,
    # so "MatMul, Conv2D," means what it looks like.
    return [item.strip() for item in value.split(",") if item.strip()]


def edits_from_environ(environ: Mapping[str, str]) -> tuple[list[ListEdit], Level | None]:
    """List edits and level from TensorFlow's ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_*`` variables.

    ``environ`` is any mapping (pass ``os.environ`` for the process environment); it is only
    read.  Per list, in the order allow, infer, deny, clear, the edits follow TensorFlow's order:
    ``<LIST>_ADD``, ``<LIST>_REMOVE``, then the legacy ``WHITELIST``/``GRAYLIST``/``BLACKLIST``
    ``_ADD`` and ``_REMOVE`` (a deprecation warning is logged when a legacy variable is set), so
    applying the edits in sequence gives TensorFlow's result.  Values are split on ``,``; unlike
    TensorFlow, items are stripped of whitespace and empty items are dropped.

    The level is ``..._LEVEL`` upper-cased and stripped; unset or empty gives ``None``; a value
    other than the accepted levels raises :class:`ListError` (TensorFlow silently ignores it).
    """
    edits: list[ListEdit] = []
    for category in CATEGORIES:
        names = [_ENV_LISTS[category]]
        if category in _ENV_LEGACY_LISTS:
            names.append(_ENV_LEGACY_LISTS[category])
        for name in names:
            for suffix, action in (("ADD", "add"), ("REMOVE", "remove")):
                variable = f"{ENV_PREFIX}{name}_{suffix}"
                if variable not in environ:
                    continue
                if name == _ENV_LEGACY_LISTS.get(category):
                    logger.warning(
                        "%s is deprecated; use %s%s_%s instead", variable, ENV_PREFIX, _ENV_LISTS[category], suffix
                    )
                for op in _split(environ[variable]):
                    edits.append(
                        ListEdit(cast(Literal["add", "remove"], action), category, op, f"environment {variable}")
                    )

    level: Level | None = None
    raw = environ.get(f"{ENV_PREFIX}LEVEL")
    if raw is not None and raw.strip():
        value = raw.strip().upper()
        if value not in LEVELS:
            raise ListError(
                f"{ENV_PREFIX}LEVEL={raw!r} is not a known level; accepted values: {', '.join(LEVELS)}"
            )
        level = cast(Level, value)
    return edits, level

