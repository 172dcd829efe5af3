"""TensorFlow's ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_*`` environment variables as list
edits and a level, in TensorFlow's order.

Part of :mod:`amp_rewrite.plan.lists` (which re-exports these names).  Reads only the mapping
it is given; logs under the logger ``amp_rewrite.plan.lists``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Literal, cast

from ..errors import ListError
from .lists_types import CATEGORIES, LEVELS, Category, Level, ListEdit

# The messages belong to the list loader (amp_rewrite.plan.lists), whose logger users and tests
# configure; this module is an implementation detail of it.
logger = logging.getLogger(__package__ + ".lists")

#: Prefix of every TensorFlow environment variable this module understands.
ENV_PREFIX = "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_"

_ENV_LISTS: dict[Category, str] = {
    "allow": "ALLOWLIST",
    "infer": "INFERLIST",
    "deny": "DENYLIST",
    "clear": "CLEARLIST",
}
# TensorFlow's pre-2.4 names; clear never had one.
_ENV_LEGACY_LISTS: dict[Category, str] = {"allow": "WHITELIST", "infer": "GRAYLIST", "deny": "BLACKLIST"}


#: Every variable of TensorFlow's mixed-precision rewrite: those this package reads (here, and
#: ``..._IGNORE_PERFORMANCE`` at the API boundary), and TensorFlow's ``..._LOG_PATH``.
KNOWN_VARIABLES = frozenset(
    [f"{ENV_PREFIX}{name}_{suffix}" for name in (*_ENV_LISTS.values(), *_ENV_LEGACY_LISTS.values())
     for suffix in ("ADD", "REMOVE")]
    + [f"{ENV_PREFIX}LEVEL", f"{ENV_PREFIX}IGNORE_PERFORMANCE",
       # TensorFlow's dump directory for its own pass (amp_rewrite writes dumps to --dump-dir).
       f"{ENV_PREFIX}LOG_PATH"])
#: Unknown variables already warned about (once a process: every rewrite reads the environment).
_warned_unknown: set[str] = set()


def _warn_unknown(environ: Mapping[str, str]) -> None:
    """One WARNING per variable of ``environ`` that looks like one of TensorFlow's rewrite
    variables but is none (``..._ALOWLIST_ADD``): TensorFlow ignores it silently, and the op the
    user meant to move stays where it was.  Names the closest known one."""
    import difflib

    for name in sorted(environ):
        if not name.startswith("TF_AUTO_MIXED_PRECISION") or name in KNOWN_VARIABLES or name in _warned_unknown:
            continue
        _warned_unknown.add(name)
        close = difflib.get_close_matches(name, sorted(KNOWN_VARIABLES), n=1)
        logger.warning("environment variable %s is not one amp_rewrite reads, and is ignored%s", name,
                       f" (did you mean {close[0]}?)" if close else "")


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

    A variable that starts like these but is none of them (a typo) gets one WARNING per
    process, naming the closest one.  The level is ``..._LEVEL`` upper-cased and stripped; unset or empty gives ``None``; a value
    other than the accepted levels raises :class:`ListError` (TensorFlow silently ignores it).
    """
    _warn_unknown(environ)
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

