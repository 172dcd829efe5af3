"""Property: inserted casts are minimal in form -- no Cast -> Cast chain through an exact
conversion, no dead Cast, at most one Cast per (tensor, dtype) -- and the report counts them."""

from __future__ import annotations

from hypothesis import given, settings

import amp_rewrite
from amp_rewrite.testing import MULTI_DEVICES, check_minimal_casts, graphs_with_options
from conftest import examples

CASES = graphs_with_options(devices=MULTI_DEVICES, while_loops=True, functions=True)


@settings(max_examples=examples(200))
@given(CASES)
def test_casts_are_minimal_in_form(drawn):
    case, options = drawn
    result = amp_rewrite.rewrite_graph_def(case.graph_def, **options)
    check_minimal_casts(case.graph_def, result.graph_def, result.report, target=options["target"],
                        precision=options["precision"], fetches=options["fetches"])
