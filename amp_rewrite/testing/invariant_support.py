"""What the invariant checkers share: :class:`InvariantError`, reading a GraphDef or its
bytes, running the rewrite again with checked options, deterministic serialization, and the
nodes a rewrite must preserve.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from .facts import Scope, parse_input, sinks

#: Keyword arguments of :func:`amp_rewrite.rewrite_graph_def` the checks pass through.
REWRITE_OPTIONS = (
    "target", "precision", "lists", "lists_file", "fetches", "add", "remove", "level",
    "exclude", "functions", "tensorflow_bugs", "use_env", "registry", "planner",
)


class InvariantError(AssertionError):
    """An invariant does not hold: ``invariant``, and where (``node`` in ``scope``)."""

    def __init__(self, invariant: str, message: str, *, node: str | None = None, scope: str = "") -> None:
        self.invariant = invariant
        self.node = node
        self.scope = scope
        where = ""
        if node is not None:
            where = f" node {node!r}" + (f" of function {scope!r}" if scope else "")
        super().__init__(f"invariant {invariant!r} broken at{where or ' graph'}: {message}")


def _graph_def(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        from amp_rewrite.graph.io import parse_graph_def

        return parse_graph_def(bytes(value))
    return value


def _rewrite(before: Any, options: Mapping[str, Any]) -> Any:
    import amp_rewrite

    return amp_rewrite.rewrite_graph_def(before, **options)


def _serialize(graph_def: Any) -> bytes:
    return graph_def.SerializeToString(deterministic=True)


def _options(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(kwargs) - set(REWRITE_OPTIONS))
    if unknown:
        raise TypeError(f"unknown rewrite option(s) {unknown}; expected some of {list(REWRITE_OPTIONS)}")
    return {k: v for k, v in kwargs.items() if v is not None or k == "fetches"}


def _preserved(scope: Scope, before: Any, fetches: Sequence[str] | None, exclude: str | None) -> set[str]:
    if scope.function is not None:
        keep = set(scope.function.control_ret.values())
    elif fetches is None:
        keep = set(sinks(before))
    else:
        keep = {parse_input(f)[0] for f in fetches}
    if exclude:
        pattern = re.compile(exclude)
        keep |= {n for n in scope.nodes if pattern.search(n)}
    return keep
