"""Property: output is byte-identical across runs, and across ``PYTHONHASHSEED`` values.

The hash-seed test rewrites in long-lived worker processes (one per seed, started once), so
each example costs a few milliseconds after the first; the ci profile still keeps it to a
handful of examples."""

from __future__ import annotations

from hypothesis import given, settings

import amp_rewrite
from amp_rewrite.testing import MULTI_DEVICES, check_deterministic, graphs_with_options
from conftest import examples

CASES = graphs_with_options(devices=MULTI_DEVICES, while_loops=True, functions=True)


@settings(max_examples=examples(150))
@given(CASES)
def test_output_is_deterministic_in_process(drawn):
    case, options = drawn
    result = amp_rewrite.rewrite_graph_def(case.graph_def, **options)
    check_deterministic(case.graph_def, result.graph_def, result.report, **options)


@settings(max_examples=examples(8))
@given(CASES)
def test_output_is_deterministic_across_hash_seeds(drawn):
    case, options = drawn
    result = amp_rewrite.rewrite_graph_def(case.graph_def, **options)
    check_deterministic(case.graph_def, result.graph_def, result.report, hash_seeds=(0, 1, 4242), **options)
