"""Property-based testing of cast placement: Hypothesis strategies and invariant checkers.

Import it explicitly (it needs ``hypothesis``, a test dependency)::

    from hypothesis import given
    import amp_rewrite
    from amp_rewrite.testing import graphs, check_rewrite

    @given(graphs(max_nodes=10))
    def test_my_lists(case):
        result = amp_rewrite.rewrite_graph_def(case.graph_def, target=case.target,
                                               fetches=case.fetches, add={"deny": ["Tanh"]})
        check_rewrite(case.graph_def, result.graph_def, result.report, feeds=case.feeds,
                      outputs=case.outputs, target=case.target, fetches=case.fetches,
                      add={"deny": ["Tanh"]})

Contents:

* **strategies** -- :func:`graphs` draws a :class:`GraphCase` (a runnable GraphDef with its
  feeds, outputs and the program it was built from); :func:`graph_defs` draws the GraphDef
  alone; :func:`graphs_with_options` draws a case with rewrite options; :data:`OPS` is the
  op mix; :data:`MULTI_DEVICES` device strings for multi-device
  graphs.
* **invariants** -- :func:`check_rewrite` checks them all; each is also a function of its
  own: :func:`check_valid`, :func:`check_allow_deny`, :func:`check_interface`,
  :func:`check_minimal_casts`, :func:`check_idempotent`, :func:`check_deterministic`,
  :func:`check_monotone`, :func:`check_numerics`, :func:`check_parity`.  A broken invariant
  raises :class:`InvariantError` (an ``AssertionError``) naming the invariant and the node.
* **reference** -- :func:`tensorflow_reference` runs TensorFlow's own pass for *parity*.
* **fuzzing** -- :func:`mutants` and :func:`rewrite_options` draw broken inputs;
  :func:`check_api_boundary` / :func:`check_cli_boundary` check that only the product's own
  error comes out.
* :func:`run_graph` runs a GraphDef on this machine's CPU (float16/bfloat16 kernels included).
"""

from __future__ import annotations

from .execute import graph_outputs, random_feeds, run_graph
from .fuzz import MUTATIONS, Mutant, check_api_boundary, check_cli_boundary, mutants, rewrite_options
from .invariants import (
    DEFAULT_INVARIANTS,
    INVARIANTS,
    NUMERIC_TOLERANCE,
    InvariantError,
    check_allow_deny,
    check_deterministic,
    check_idempotent,
    check_interface,
    check_minimal_casts,
    check_monotone,
    check_numerics,
    check_parity,
    check_rewrite,
    check_valid,
)
from .reference import tensorflow_reference
from .strategies import LIMIT, MULTI_DEVICES, OPS, GraphCase, graph_defs, graphs, graphs_with_options, precisions

__all__ = [
    "graphs",
    "graph_defs",
    "graphs_with_options",
    "GraphCase",
    "OPS",
    "LIMIT",
    "MULTI_DEVICES",
    "precisions",
    "check_rewrite",
    "check_valid",
    "check_allow_deny",
    "check_interface",
    "check_minimal_casts",
    "check_idempotent",
    "check_deterministic",
    "check_monotone",
    "check_numerics",
    "check_parity",
    "InvariantError",
    "INVARIANTS",
    "DEFAULT_INVARIANTS",
    "NUMERIC_TOLERANCE",
    "tensorflow_reference",
    "mutants",
    "rewrite_options",
    "Mutant",
    "MUTATIONS",
    "check_api_boundary",
    "check_cli_boundary",
    "run_graph",
    "graph_outputs",
    "random_feeds",
]
