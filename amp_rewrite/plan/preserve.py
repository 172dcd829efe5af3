"""Which nodes keep their dtypes: the fetches (or the graph's outputs) and the nodes the
user's ``--exclude`` patterns and ``keep_float32`` name.  Reads graphs only; the API turns the
answers into :class:`~amp_rewrite.plan.decisions.DecideOptions`.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import networkx as nx

from ..errors import InvalidGraphError
from ..graph.tensor_names import node_name
from .exclude import NameMatcher, keras_scoped

__all__ = ["excluded_nodes", "preserved_nodes"]


def excluded_nodes(names: Iterable[str], excluder: NameMatcher, already: set[str],
              counts: dict[str, int]) -> dict[str, str]:
    """``{node: reason}`` for the nodes of ``names`` that ``excluder`` matches and that are
    not preserved ``already`` (a fetched node keeps the generic reason: it would be kept
    anyway).  Adds each match to ``counts[pattern]``, preserved already or not, so the
    report says what every pattern matched."""
    out: dict[str, str] = {}
    if not excluder:
        return out
    names = list(names)
    keras3 = keras_scoped(names)  # Keras 3 traces spell layer scopes with a _N suffix
    for name in names:
        hit = excluder.match(name, keras3)
        if hit is None:
            continue
        counts[hit[0]] += 1
        if name not in already:
            out[name] = excluder.reason(name, keras3) or ""
    return out


def _default_preserve(g: nx.MultiDiGraph) -> set[str]:
    """Graph outputs when no fetches are given: nodes nothing reads from."""
    return {n for n, nbrs in g._succ.items() if not nbrs}  # read-only use of networkx's dicts


def preserved_nodes(g: nx.MultiDiGraph, fetches: Sequence[str] | None) -> set[str]:
    """The nodes of ``g`` that ``fetches`` names (the graph's outputs when ``None``); raises
    :class:`InvalidGraphError` for a bad or unknown fetch.  Reads ``g``."""
    if fetches is None:
        return _default_preserve(g)
    preserve = set()
    for f in fetches:
        try:
            name = node_name(f)
        except ValueError:
            raise InvalidGraphError(f"bad fetch name {f!r}") from None
        if name not in g:
            raise InvalidGraphError(f"fetch {f!r} names a node that does not exist", node=name)
        preserve.add(name)
    return preserve
