"""Property: moving an op from any list to deny never grows the set of low-precision nodes.

Every op type of the drawn graph is moved in turn (``add={"deny": [op]}``)."""

from __future__ import annotations

from hypothesis import given, settings

import amp_rewrite
from amp_rewrite.testing import MULTI_DEVICES, check_monotone, graphs_with_options
from conftest import examples

CASES = graphs_with_options(devices=MULTI_DEVICES, while_loops=True, functions=True)


@settings(max_examples=examples(100))
@given(CASES)
def test_moving_an_op_to_deny_never_converts_more(drawn):
    case, options = drawn
    result = amp_rewrite.rewrite_graph_def(case.graph_def, **options)
    check_monotone(case.graph_def, result.graph_def, result.report, **options)
