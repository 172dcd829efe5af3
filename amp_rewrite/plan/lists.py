"""The op lists ("paint buckets") of the auto mixed precision rewrite: data files and loader.

The rewrite sorts ops into four lists (TensorFlow's names):

* ``allow`` -- always converted to the low precision (GEMMs, convolutions);
* ``infer`` -- converted unless fed, through infer/clear ops, by a ``deny`` op;
* ``deny`` -- kept in float32, and that float32-ness spreads downstream;
* ``clear`` -- numerically neutral; follows its neighbours.

The lists are data, kept in TOML *profiles*.  Three are shipped (``lists/`` in the repository,
installed as the package ``amp_rewrite._lists``):

* ``tensorflow`` -- TensorFlow's lists, exactly (tested against TF's own dump): 2.21's tables
  and per-release deltas for 2.16 to 2.20 (see "TensorFlow versions" below);
* ``default`` -- ``tensorflow`` plus softmax, arithmetic reductions and cross-entropy losses
  kept in float32, and, in float16 and in bfloat16 on a GPU, a moment-based normalization
  computed in float32 with deny stopping at its output (``[normalization] apply = "fenced"``,
  Keras's policy) and reductions over no element cleared (``[float16.identity]``,
  ``[bfloat16.identity]``);
* ``optimal`` -- ``default`` with the cost-aware planner.

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
    [normalization]                    # optional: where a moment-based normalization's apply
    apply = "fenced"                   # ops run: "float32" (deny propagates into them from the
    reason = "one-line reason"         # statistics, as in TensorFlow; the default), "fenced"
    precisions = ["float16", "bfloat16"]   # (float32, deny stops at the norm's output) or
    backends = { bfloat16 = ["cuda"] } # "low" (deny stops at the statistics); reason
                                       # required; precisions: those it is for (default
                                       # both); backends: limits a listed precision to some
                                       # backends (default all); per precision and backend,
                                       # the last layer of the chain (or a user file) with it
                                       # wins

    [loops]                            # optional: whether the rewrite hoists the Casts it
    hoist_invariant_casts = true       # puts in a loop body out of the loop where what they
    reason = "one-line reason"         # cast is the same every iteration (loop_hoist.py);
                                       # both keys required; the last layer with it wins;
                                       # without one (tensorflow): not hoisted

    [float16.bounded]                  # optional: a deny-list op inferred where its input 0
    Exp = { input_max = 0.0, reason = "..." }    # is proven at most input_max
                                       # (amp_rewrite.plan.ranges); -inf turns an entry off,
                                       # and so does a later layer or an edit naming the op;
                                       # not versioned; kept for ops left on deny only;
                                       # backends = ["cuda"] as for identity entries

    [float16.identity]                 # optional: a deny-list reduction (Sum, Mean, Prod, Max,
    Sum = "one-line reason"            # Min) cleared where static shapes show it reduces no
    Mean = { reason = "...", backends = ["cuda"] }   # element (a copy); same survival rules
                                       # as bounded; backends as for op entries; shapes are
                                       # inferred for it (painting.py)

    [float16.float32_inputs]           # optional: a deny-list op (Log) whose inputs stay
    Log = "one-line reason"            # float32 back to the nearest allow-list op: the infer
                                       # and clear ops between are denied with it; kept for ops
                                       # left on deny only (every level); not versioned

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

import importlib.resources
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomllib is 3.11+; tomli is the same parser.
    import tomli as tomllib  # type: ignore[no-redef]

if TYPE_CHECKING:  # only used in annotations; its module moved in 3.11
    from importlib.resources.abc import Traversable

from ..errors import ListError

# The parts of the loader, re-exported: every name below stays importable from this module.
from .lists_environ import _ENV_LEGACY_LISTS, _ENV_LISTS, ENV_PREFIX, _split, edits_from_environ  # noqa: F401
from .lists_merge import (  # noqa: F401
    _apply_edits,
    _check_conflicts,
    _check_known_ops,
    _deny_infer,
    _freeze_for_level,
    _gated_lists,
    _merge,
    _op_lists,
    _tensorflow_knows_op,
)
from .lists_schema import (  # noqa: F401
    _ENTRY_KEYS,
    _SCHEMA_VERSION,
    _SECTION_KEYS,
    _TF_VERSION,
    _TF_VERSION_PREFIX,
    _TOP_KEYS,
    _VERSION_KEYS,
    _check_keys,
    _Entry,
    _Layer,
    _parse_entry,
    _parse_layer,
    _parse_tables,
    _parse_versions,
    _reason,
    _version_key,
    _VersionDelta,
    tf_major_minor,
)
from .lists_types import (  # noqa: F401
    _OP_NAME,
    BACKENDS,
    CATEGORIES,
    LEVELS,
    PLANNERS,
    PRECISIONS,
    Backend,
    Category,
    Level,
    ListContext,
    ListEdit,
    OpLists,
    Precision,
)

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


# The package the list files are installed as (see pyproject.toml), and where they live in a
# source checkout, where that package does not exist (setuptools maps it from lists/ only when
# installing).
_PACKAGE = "amp_rewrite._lists"
_SOURCE_TREE_LISTS = Path(__file__).resolve().parents[2] / "lists"


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
    layers, profile_label = _profile_layers(profile, user_file)

    # The requested release's lists, before the registry check: an older release's delta may
    # name ops the installed TensorFlow lacks, and only the lists in effect must be known.
    layers = [layer.for_version(version) for layer in layers]
    _check_known_ops(layers, known)
    merged = _merge(layers)[context.precision]
    logger.debug("loaded %s for %s from %s", profile_label, context, [layer.location for layer in layers])

    lists = _gated_lists(merged, context)
    frozen = _freeze_for_level(lists, level, context)
    _apply_edits(lists, edits, known, merged, frozen)
    _check_conflicts(lists)
    if level == "TREAT_INFER_AS_DENY":
        _deny_infer(lists)
    return _op_lists(lists, profile_label, layers, version, context, level,
                     frozenset(e.op for e in edits))


def _profile_layers(
    profile: str | os.PathLike[str], user_file: str | os.PathLike[str] | None
) -> tuple[list[_Layer], str]:
    """The layers :func:`load_lists` merges, root first, and the label naming them
    (:attr:`OpLists.profile`): ``profile``'s chain, or with ``user_file`` that file on top of
    ``profile``'s chain or of its own ``extends`` chain.  Reads the files; pure."""
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
        return [*base, user_layer], f"{base[-1].name} + {user_label}"
    layers = _load_chain(profile, None)
    return layers, layers[-1].name


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

