"""Which nodes of a graph run: what TensorFlow prunes before it runs a graph.

TensorFlow never runs a node that nothing needs.  When it instantiates a function (a
``tf.function``'s body, a loop's body, a Keras step) it keeps the nodes its outputs and its
control outputs need, and every stateful op with what that needs, and drops the rest
(``PruneFunctionBody``); a ``Session`` runs what its fetches need; XLA drops dead
instructions again.  A traced training step has such dead nodes: the gradient of a constant
that Keras or a custom gradient computes and then discards (TensorFlow's ``silu`` gradient
sums ``dy * x**2 * ...`` into the gradient of its constant ``beta`` in every activation of an
EfficientNet, 13% of the nodes of its training step), or the gradient of the first
convolution with respect to the input images.

The cost model prices only what runs (:mod:`amp_rewrite.plan.step_cost`), and reads its
readers' needs only from nodes that run.  Part of the import stage: reads the IR, imports
nothing above :mod:`amp_rewrite.graph`.
"""

from __future__ import annotations

from typing import Iterable

import networkx as nx

from .op_registry import OpRegistry

__all__ = ["live_nodes", "run_roots"]


def _stateful(g: nx.MultiDiGraph, name: str, registry: OpRegistry) -> bool:
    """Whether ``name`` counts as stateful, so TensorFlow runs it whether or not anything reads
    it: its op is registered stateful, or is unknown, or calls a function of the library by
    name (whose body may be; TensorFlow asks the body, which here is not looked into).
    Reads ``g``."""
    op = g.nodes[name]["op"]
    if op in (g.graph.get("signatures") or {}):
        return True
    sig = registry.op(op)
    return sig is None or sig.is_stateful


def run_roots(g: nx.MultiDiGraph, registry: OpRegistry, fetches: Iterable[str] | None = None) -> set[str] | None:
    """The nodes of ``g`` that run whatever reads them: in a function body its results
    (``_Retval``), its control outputs (``g.graph["keep"]``) and its stateful ops; in a main
    graph ``fetches`` (node names) and its stateful ops -- as a ``tf.function``'s graph runs; a
    ``Session`` runs only what the fetches need, so name every op it runs.  ``None`` for a main
    graph without ``fetches``: every node may be fetched, so every node counts as running.
    Reads ``g``."""
    if g.graph.get("kind") == "function":
        roots = {n for n, op in g.nodes(data="op") if op == "_Retval"} | set(g.graph.get("keep") or ())
    elif fetches is None:
        return None
    else:
        roots = set(fetches)
    roots.update(n for n in g.nodes if _stateful(g, n, registry))
    return roots & set(g.nodes)


def live_nodes(g: nx.MultiDiGraph, registry: OpRegistry, fetches: Iterable[str] | None = None) -> frozenset[str] | None:
    """The nodes of ``g`` that run (module docstring): :func:`run_roots` and everything they
    need, along data and control edges (a loop's back edges too).  ``None`` where every node
    counts as running (a main graph without ``fetches``).  Reads ``g``."""
    roots = run_roots(g, registry, fetches)
    if roots is None:
        return None
    live = set(roots)
    stack = list(roots)
    pred = g._pred  # noqa: SLF001  (networkx's adjacency, as the IR reads it)
    while stack:
        for u in pred[stack.pop()]:
            if u not in live:
                live.add(u)
                stack.append(u)
    return frozenset(live)
