"""Type checks of the library's options, at the API boundary.

Every public entry point takes plain Python values; a value of the wrong type must give the
product's own error naming the option, not a ``TypeError``/``AttributeError``/``KeyError``
from deep inside (``target=None``, ``lists=None``, ``level=5``, ``fetches=[1]``).  Pure.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import AmpRewriteError

__all__ = ["check_str", "check_optional_str", "check_path", "check_bool", "check_names",
           "check_list_edits"]


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_str(name: str, value: Any, *, what: str = "a string") -> str:
    """``value`` if it is a ``str``; else :class:`AmpRewriteError` naming ``name``."""
    if not isinstance(value, str):
        raise AmpRewriteError(f"{name} must be {what}, not {type(value).__name__} {_shown(value)}")
    return value


def check_optional_str(name: str, value: Any, *, what: str = "a string or None") -> str | None:
    return None if value is None else check_str(name, value, what=what)


def check_path(name: str, value: Any, *, optional: bool = False) -> Any:
    """A profile name or path: ``str`` or ``os.PathLike`` (or ``None`` when ``optional``)."""
    if value is None and optional:
        return None
    if not isinstance(value, (str, os.PathLike)):
        allowed = "a name or path" + (" or None" if optional else "")
        raise AmpRewriteError(f"{name} must be {allowed}, not {type(value).__name__} {_shown(value)}")
    return value


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise AmpRewriteError(f"{name} must be True or False, not {type(value).__name__} {_shown(value)}")
    return value


def check_names(name: str, value: Any, *, optional: bool = True) -> list[str] | None:
    """A sequence of names (not a single string, which would be read letter by letter)."""
    if value is None and optional:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise AmpRewriteError(f"{name} must be a list of names, not {type(value).__name__} {_shown(value)}")
    items = list(value)
    for item in items:
        if not isinstance(item, str):
            raise AmpRewriteError(f"{name} must hold names (strings), not {type(item).__name__} "
                                  f"{_shown(item)}")
    return items


def check_list_edits(name: str, value: Any) -> None:
    """``add=``/``remove=``: ``None`` or a mapping category -> op name or op names."""
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise AmpRewriteError(f"{name} must map a category (allow, infer, deny, clear) to op names, "
                              f"not {type(value).__name__} {_shown(value)}")
    for key, ops in value.items():
        check_str(f"{name} key", key, what="a category name")
        if not isinstance(ops, str):
            check_names(f"{name}[{key!r}]", ops, optional=False)
