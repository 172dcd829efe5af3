"""Property: the interface survives the rewrite -- outputs and fetches keep names and dtypes,
every original node keeps its op, device, control edges, attributes and inputs (through
inserted Casts), function signatures do not change, and the only new nodes are Casts."""

from __future__ import annotations

from hypothesis import given, settings

import amp_rewrite
from amp_rewrite.testing import MULTI_DEVICES, check_interface, graphs_with_options
from conftest import examples

CASES = graphs_with_options(devices=MULTI_DEVICES, while_loops=True, functions=True)


@settings(max_examples=examples(200))
@given(CASES)
def test_interface_is_preserved(drawn):
    case, options = drawn
    result = amp_rewrite.rewrite_graph_def(case.graph_def, **options)
    check_interface(case.graph_def, result.graph_def, result.report, fetches=options["fetches"])
