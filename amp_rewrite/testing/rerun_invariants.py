"""The invariants that run the rewrite again: *idempotent* (rewriting the rewritten graph
changes nothing) and *deterministic* (the same input gives byte-identical output, also in
fresh processes with other hash seeds).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Sequence

from .facts import scopes
from .invariant_support import InvariantError, _graph_def, _options, _rewrite, _serialize


# ----------------------------------------------------------------------------- idempotent


def _first_difference(a: Any, b: Any) -> tuple[str | None, str]:
    sa, sb = scopes(a), scopes(b)
    for name in sorted(set(sa) | set(sb)):
        if name not in sa or name not in sb:
            return None, name
        na, nb = sa[name].nodes, sb[name].nodes
        for n in list(na) + [n for n in nb if n not in na]:
            if n not in na or n not in nb or _serialize(na[n]) != _serialize(nb[n]):
                return n, name
    return None, ""


def check_idempotent(before: Any, after: Any, report: Any = None, **rewrite_options: Any) -> None:
    """**idempotent**: rewriting the rewritten graph (same options) changes nothing."""
    after = _graph_def(after)
    again = _rewrite(after, _options(rewrite_options)).graph_def
    if _serialize(again) != _serialize(after):
        node, scope = _first_difference(after, again)
        raise InvariantError("idempotent", "a second rewrite changed the graph", node=node, scope=scope)


# ----------------------------------------------------------------------------- deterministic


def _digest(graph_def: Any, report: Any) -> tuple[str, str]:
    return (hashlib.sha256(_serialize(graph_def)).hexdigest(),
            hashlib.sha256(json.dumps(report, sort_keys=True).encode()).hexdigest())


def check_deterministic(before: Any, after: Any, report: Any, *, hash_seeds: Sequence[int] = (),
                        **rewrite_options: Any) -> None:
    """**deterministic**: the same input gives byte-identical output and an identical report,
    in this process and in fresh processes with each ``PYTHONHASHSEED`` of ``hash_seeds``.
    """
    before, after = _graph_def(before), _graph_def(after)
    options = _options(rewrite_options)
    again = _rewrite(before, options)
    if _serialize(again.graph_def) != _serialize(after):
        node, scope = _first_difference(after, again.graph_def)
        raise InvariantError("deterministic", "a second run gave a different graph", node=node, scope=scope)
    if report is not None and json.dumps(again.report, sort_keys=True) != json.dumps(report, sort_keys=True):
        raise InvariantError("deterministic", "a second run gave a different report")
    if hash_seeds:
        from .hashseed import rewrite_digests

        want = _digest(after, report if report is not None else again.report)
        for seed, got in rewrite_digests(_serialize(before), options, hash_seeds).items():
            if got != want:
                part = "graph" if got[0] != want[0] else "report"
                raise InvariantError("deterministic", f"with PYTHONHASHSEED={seed} the {part} differs")
