"""Property: the rewritten graph computes what the float32 graph computes, within a
tolerance scaled to the number of low-precision ops on the way, and stays finite wherever
float32 is finite.  Only outputs that depend continuously on the inputs are compared (the
strategies mark those that go through comparisons or float -> int casts)."""

from __future__ import annotations

from hypothesis import given, settings

import amp_rewrite
from amp_rewrite.testing import MULTI_DEVICES, check_numerics, graphs_with_options
from conftest import examples

CASES = graphs_with_options(devices=MULTI_DEVICES, while_loops=True, functions=True)


@settings(max_examples=examples(200))
@given(CASES)
def test_outputs_stay_close_to_float32(drawn):
    case, options = drawn
    result = amp_rewrite.rewrite_graph_def(case.graph_def, **options)
    check_numerics(case.graph_def, result.graph_def, result.report, feeds=case.feeds,
                   outputs=case.smooth_outputs, precision=options["precision"])
