"""Property: rewriting a rewritten graph with the same options changes nothing."""

from __future__ import annotations

from hypothesis import given, settings

import amp_rewrite
from amp_rewrite.testing import MULTI_DEVICES, check_idempotent, graphs_with_options
from conftest import examples

CASES = graphs_with_options(devices=MULTI_DEVICES, while_loops=True, functions=True)


@settings(max_examples=examples(200))
@given(CASES)
def test_rewrite_is_idempotent(drawn):
    case, options = drawn
    result = amp_rewrite.rewrite_graph_def(case.graph_def, **options)
    check_idempotent(case.graph_def, result.graph_def, result.report, **options)
