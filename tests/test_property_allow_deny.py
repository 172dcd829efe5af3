"""Property: allow ops on eligible devices with a low-precision kernel are low precision, deny
ops never are, and nothing on an ineligible device or preserved changes (the report agrees).

The two ``@example`` graphs are regressions this test found: the Cast -> Cast fold used to
rewrite ``SrcT`` of a preserved or ineligible Cast, and the report used to miss the fold.
"""

from __future__ import annotations

import tensorflow as tf
from hypothesis import example, given, settings, strategies as st

import amp_rewrite
from amp_rewrite.testing import MULTI_DEVICES, GraphCase, check_allow_deny, graphs_with_options
from conftest import examples

CASES = graphs_with_options(devices=MULTI_DEVICES, while_loops=True, functions=True)


def _fetched_cast_of_a_converted_tensor():
    """Regression (found by this test): a fetched, CPU-pinned float -> int32 Cast of a tensor
    that becomes float16 must keep its SrcT."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (8, 8), name="x")
        r = tf.nn.relu(x, name="relu")
        with tf.device("/device:CPU:0"):
            tf.cast(r, tf.int32, name="to_int")
        tf.identity(tf.matmul(r, r, name="mm"), name="out")
    return GraphCase.from_graph_def(g.as_graph_def(), description="fetched Cast of a converted tensor")


def _cast_after_an_allow_op():
    """Regression (found by this test, deep profile): an existing float32 -> float16 Cast of a
    MatMul's output; the fold makes it read float16, and the report must say so."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (8, 8), name="x")
        tf.identity(tf.cast(tf.matmul(x, x, name="mm"), tf.float16, name="to_half"), name="out")
    return GraphCase.from_graph_def(g.as_graph_def(), description="Cast to float16 after a MatMul")


_GPU_F16 = {"target": "gpu:8.0", "precision": "float16", "lists": "default", "fetches": None, "use_env": False}


@settings(max_examples=examples(200))
@given(CASES, st.one_of(st.none(), st.integers(0, 1000)))
@example((_fetched_cast_of_a_converted_tensor(), _GPU_F16), None)
@example((_cast_after_an_allow_op(), _GPU_F16), None)
def test_allow_and_deny_lists_are_honoured(drawn, move):
    case, options = drawn
    op = None if move is None else case.ops[move % len(case.ops)]
    if op is not None and op not in ("Placeholder", "Const"):
        options = dict(options, add={"deny": [op]})  # any op of the graph, moved to deny
    result = amp_rewrite.rewrite_graph_def(case.graph_def, **options)
    check_allow_deny(case.graph_def, result.graph_def, result.report, **options)
