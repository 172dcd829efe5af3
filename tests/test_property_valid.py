"""Property: every rewrite of a random graph is valid -- dtypes agree across every edge and
the rewritten graph imports into TensorFlow and runs (on this CPU, float16/bfloat16 kernels
included).  Graphs have loops, function calls, control edges and several devices."""

from __future__ import annotations

from hypothesis import given, settings

import amp_rewrite
from amp_rewrite.testing import MULTI_DEVICES, check_valid, graphs_with_options
from conftest import examples

CASES = graphs_with_options(devices=MULTI_DEVICES, while_loops=True, functions=True)


@settings(max_examples=examples(200))
@given(CASES)
def test_rewritten_graph_is_valid_and_runs(drawn):
    case, options = drawn
    result = amp_rewrite.rewrite_graph_def(case.graph_def, **options)
    check_valid(case.graph_def, result.graph_def, result.report, feeds=case.feeds, outputs=case.outputs)
