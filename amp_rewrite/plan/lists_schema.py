"""One list file: its schema (version 1, described in :mod:`amp_rewrite.plan.lists`), its
parsed form (:class:`_Layer` of :class:`_Entry`), the validating parser, and the per-release
deltas of versioned files (``tf_version`` and ``[versions."X.Y"]``).

Part of :mod:`amp_rewrite.plan.lists` (which re-exports the names the loader and the tests
use).  Pure: parses already-read TOML documents; reads no files.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # only used in annotations; its module moved in 3.11
    from importlib.resources.abc import Traversable

from ..errors import ListError
from .lists_types import (_OP_NAME, BACKENDS, CATEGORIES, IDENTITY_REDUCTIONS, NORMALIZATION_APPLY, PLANNERS,
                          PRECISIONS, Category, ListContext)

_SCHEMA_VERSION = 1
_TOP_KEYS = frozenset({"schema_version", "name", "description", "source", "extends", "planner",
                       "normalization", "loops", "tf_version", "versions", *PRECISIONS})
_LOOPS_KEYS = frozenset({"hoist_invariant_casts", "reason"})
_NORMALIZATION_KEYS = frozenset({"apply", "reason", "precisions", "backends"})
_VERSION_KEYS = frozenset({"note", *PRECISIONS})
# A TensorFlow release as the lists are keyed: major.minor ("2.16"); the patch level never
# changes the op lists.
_TF_VERSION = re.compile(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)")
# What tf.__version__ may look like: "2.16.2", "2.21.0-rc1", "2.22.0-dev20260101", "2.16".
_TF_VERSION_PREFIX = re.compile(r"\s*(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[-+.a-zA-Z][-+.a-zA-Z0-9]*)?\s*")
_SECTION_KEYS = frozenset({*CATEGORIES, "remove", "bounded", "identity", "float32_inputs"})
_BOUNDED_KEYS = frozenset({"input_max", "reason", "backends"})
_ENTRY_KEYS = frozenset({"reason", "min_cuda", "min_cudnn", "backends", "registered"})
_IDENTITY_KEYS = frozenset({"reason", "backends"})


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


@dataclass(frozen=True)
class _Normalization:
    """A file's ``[normalization]`` policy: where a moment-based normalization's apply ops run,
    why, and for which precisions and backends."""

    apply: str
    reason: str
    precisions: frozenset[str]
    #: precision -> the backends it is limited to (a precision not here: every backend).
    backends: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def applies(self, context: ListContext) -> bool:
        """Whether the policy is for ``context``'s precision on its backend."""
        return (context.precision in self.precisions
                and context.backend in self.backends.get(context.precision, frozenset(BACKENDS)))


@dataclass(frozen=True)
class _Bounded:
    """One ``[<precision>.bounded]`` entry: the limit an input must be proven at most, why the
    op is safe then, and the backends it is for."""

    input_max: float
    reason: str
    backends: frozenset[str] = frozenset(BACKENDS)


@dataclass(frozen=True)
class _Identity:
    """One ``[<precision>.identity]`` entry: why the reduction is a copy when it reduces no
    element, and the backends it is for."""

    reason: str
    backends: frozenset[str] = frozenset(BACKENDS)


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
    # [normalization], or None.
    normalization: _Normalization | None = None
    # [loops]: (hoist_invariant_casts, reason), or None.
    loops: tuple[bool, str] | None = None
    # [<precision>.bounded]: precision -> op -> entry.
    bounded: dict[str, dict[str, _Bounded]] = field(default_factory=dict)
    # [<precision>.identity]: precision -> op -> entry.
    identity: dict[str, dict[str, _Identity]] = field(default_factory=dict)
    # [<precision>.float32_inputs]: precision -> op -> entry (an _Identity: a reason, backends).
    float32_inputs: dict[str, dict[str, _Identity]] = field(default_factory=dict)
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
    backends = _parse_backends(value.get("backends", list(BACKENDS)), f"{where}.backends", location)
    registered = value.get("registered", True)
    if not isinstance(registered, bool):
        raise ListError(f"{where}.registered: expected true or false, got {registered!r}", path=location)
    return _Entry(op, category, reason, label, backends, gates["min_cuda"], gates["min_cudnn"], registered)


def _parse_backends(backends: Any, where: str, location: str) -> frozenset[str]:
    """A ``backends`` value: a non-empty list of distinct names from :data:`BACKENDS`.  Pure."""
    if (
        not isinstance(backends, list)
        or not backends
        or not all(isinstance(b, str) and b in BACKENDS for b in backends)
        or len(set(backends)) != len(backends)
    ):
        raise ListError(
            f"{where}: expected a non-empty list of distinct values from {list(BACKENDS)}, got {backends!r}",
            path=location,
        )
    return frozenset(backends)


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
    normalization = _parse_normalization(data.get("normalization"), location)
    loops = _parse_loops(data.get("loops"), location)
    entries, removes = _parse_tables(data, "", label, location)
    bounded = _parse_bounded(data, location)
    identity = _parse_identity(data, location)
    float32_inputs = _parse_reason_tables(data, "float32_inputs", location)
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
        normalization=normalization,
        loops=loops,
        bounded=bounded,
        identity=identity,
        float32_inputs=float32_inputs,
        tf_version=tf_version,
        versions=versions,
    )


def _policy_table(table: Any, name: str, keys: frozenset[str], location: str) -> str | None:
    """Check a policy table (``[loops]``, ``[normalization]``): a table, only ``keys``, a
    non-empty ``reason``; return the reason, or ``None`` when the file has no such table.
    Pure."""
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ListError(f"[{name}] must be a table, got {type(table).__name__}", path=location)
    _check_keys(table, keys, f"[{name}]", location)
    reason = table.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise ListError(f"[{name}].reason must be a non-empty string (every policy says why), got {reason!r}",
                        path=location)
    return reason


def _parse_loops(table: Any, location: str) -> tuple[bool, str] | None:
    """The ``[loops]`` table (``hoist_invariant_casts``, a bool, and ``reason``, both
    required), or ``None`` when the file has none.  Pure."""
    reason = _policy_table(table, "loops", _LOOPS_KEYS, location)
    if reason is None:
        return None
    hoist = table.get("hoist_invariant_casts")
    if not isinstance(hoist, bool):
        raise ListError(f"[loops].hoist_invariant_casts must be true or false, got {hoist!r}"
                        + (" (missing)" if "hoist_invariant_casts" not in table else ""), path=location)
    return hoist, reason


def _parse_normalization(table: Any, location: str) -> _Normalization | None:
    """The ``[normalization]`` table (``apply`` and ``reason`` required; ``precisions`` a list,
    default both; ``backends`` an inline table limiting a listed precision to some backends,
    ``{ bfloat16 = ["cuda"] }``), or ``None`` when the file has none.  Pure."""
    reason = _policy_table(table, "normalization", _NORMALIZATION_KEYS, location)
    if reason is None:
        return None
    apply = table.get("apply")
    if apply not in NORMALIZATION_APPLY:
        raise ListError(f"[normalization].apply must be one of {', '.join(map(repr, NORMALIZATION_APPLY))}, "
                        f"got {apply!r}" + (" (missing)" if "apply" not in table else ""), path=location)
    precisions = table.get("precisions", list(PRECISIONS))
    if (not isinstance(precisions, list) or not precisions
            or any(not isinstance(p, str) or p not in PRECISIONS for p in precisions)
            or len(set(precisions)) != len(precisions)):
        raise ListError(f"[normalization].precisions: expected a non-empty list of distinct values from "
                        f"{list(PRECISIONS)}, got {precisions!r}", path=location)
    limits = table.get("backends", {})
    if not isinstance(limits, dict):
        raise ListError(f"[normalization].backends: expected an inline table precision -> backends, such as "
                        f"{{ bfloat16 = [\"cuda\"] }}, got {limits!r}", path=location)
    for precision in limits:
        if precision not in precisions:
            raise ListError(f"[normalization].backends.{precision}: only a precision the policy is for "
                            f"({', '.join(sorted(precisions))}) can be limited to some backends", path=location)
    backends = {p: _parse_backends(b, f"[normalization].backends.{p}", location) for p, b in limits.items()}
    return _Normalization(apply, reason, frozenset(precisions), MappingProxyType(backends))


def _table_entries(table: Any, name: str, location: str) -> Iterator[tuple[str, Any, str]]:
    """``(op, value, where)`` for each entry of the table ``[name]``, after checking that it
    is a table and each key a valid op name.  Raises :class:`ListError`.  Pure."""
    if not isinstance(table, dict):
        raise ListError(f"[{name}] must be a table, got {type(table).__name__}", path=location)
    for op, value in table.items():
        where = f"{name}.{op}"
        if not _OP_NAME.fullmatch(op):
            raise ListError(f"{where}: {op!r} is not a valid op name", path=location, op=op)
        yield op, value, where


def _parse_bounded(data: Mapping[str, Any], location: str) -> dict[str, dict[str, _Bounded]]:
    """The ``[float16.bounded]`` and ``[bfloat16.bounded]`` tables: per precision, op -> entry,
    each ``Op = { input_max = 11.0, reason = "..." }`` with a number (``-inf`` turns a parent's
    entry off), a non-empty reason and, optionally, ``backends = ["cuda"]``.  Pure."""
    bounded: dict[str, dict[str, _Bounded]] = {p: {} for p in PRECISIONS}
    for precision in PRECISIONS:
        section = data.get(precision, {})
        table = section.get("bounded", {}) if isinstance(section, dict) else {}
        for op, value, entry_where in _table_entries(table, f"{precision}.bounded", location):
            if not isinstance(value, dict):
                raise ListError(f"{entry_where}: expected an inline table {{ input_max = ..., reason = ... }}, "
                                f"got {type(value).__name__}", path=location, op=op)
            _check_keys(value, _BOUNDED_KEYS, entry_where, location)
            limit = value.get("input_max")
            # -inf is allowed: no input is ever proven below it, so it turns a parent's entry off.
            if isinstance(limit, bool) or not isinstance(limit, (int, float)) or math.isnan(limit) or limit == math.inf:
                raise ListError(f"{entry_where}.input_max: expected a number (or -inf: off), got {limit!r}"
                                + (" (missing)" if "input_max" not in value else ""), path=location, op=op)
            backends = (_parse_backends(value["backends"], f"{entry_where}.backends", location)
                        if "backends" in value else frozenset(BACKENDS))
            bounded[precision][op] = _Bounded(float(limit), _reason(value.get("reason"), f"{entry_where}.reason",
                                                                   location), backends)
    return bounded


def _parse_identity(data: Mapping[str, Any], location: str) -> dict[str, dict[str, _Identity]]:
    """The ``[float16.identity]`` and ``[bfloat16.identity]`` tables: per precision, op ->
    entry, each ``Sum = "..."`` (or ``{ reason = "...", backends = ["cuda"] }``) naming one of
    :data:`IDENTITY_REDUCTIONS`.  Pure."""
    identity = _parse_reason_tables(data, "identity", location)
    for precision, table in identity.items():
        for op in table:
            if op not in IDENTITY_REDUCTIONS:
                raise ListError(f"{precision}.identity.{op}: only a reduction whose output copies its input when "
                                f"it reduces no axis can be an identity ({', '.join(sorted(IDENTITY_REDUCTIONS))}), "
                                f"not {op}", path=location, op=op)
    return identity


def _parse_reason_tables(data: Mapping[str, Any], key: str, location: str) -> dict[str, dict[str, _Identity]]:
    """The ``[float16.<key>]`` and ``[bfloat16.<key>]`` tables of op -> ``"reason"`` (or
    ``{ reason = "...", backends = ["cuda"] }``) entries: per precision, op -> entry.  Pure."""
    tables: dict[str, dict[str, _Identity]] = {p: {} for p in PRECISIONS}
    for precision in PRECISIONS:
        section = data.get(precision, {})
        table = section.get(key, {}) if isinstance(section, dict) else {}
        for op, value, entry_where in _table_entries(table, f"{precision}.{key}", location):
            backends = frozenset(BACKENDS)
            if isinstance(value, dict):
                _check_keys(value, _IDENTITY_KEYS, entry_where, location)
                if "backends" in value:
                    backends = _parse_backends(value["backends"], f"{entry_where}.backends", location)
                value = value.get("reason")
            tables[precision][op] = _Identity(_reason(value, entry_where, location), backends)
    return tables


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
            if key in ("bounded", "identity", "float32_inputs"):
                if prefix:
                    raise ListError(f"{where}: {key} entries are not versioned; write them in the file's "
                                    f"own [{precision}.{key}]", path=location)
                continue  # _parse_bounded / _parse_reason_tables read them
            for op, value, entry_where in _table_entries(table, f"{prefix}{precision}.{key}", location):
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
