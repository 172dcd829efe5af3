"""Property (differential): with the ``tensorflow`` lists, Grappler's choice of functions and
TensorFlow's bugs switched on, amp_rewrite converts exactly the (node, type attribute) pairs
TensorFlow 2.21's own pass converts on the same random graph, with no more casts.

Both GPU float16 (CUDA mode, with a GPU:1 of compute capability 6.1 when the graph uses it)
and CPU bfloat16 (oneDNN mode) are compared; TensorFlow runs offline (``tests/tf_oracle.py``).
"""

from __future__ import annotations

import pytest
import tensorflow as tf
from hypothesis import given, settings

import amp_rewrite
from amp_rewrite.testing import (MULTI_DEVICES, InvariantError, check_parity, check_valid, graphs,
                                 tensorflow_reference)
from amp_rewrite.testing.facts import converted_type_attrs, low_dtype
from conftest import examples
from tf_oracle import DT_BFLOAT16, tf_amp_rewrite

CASES = graphs(devices=MULTI_DEVICES, while_loops=True, functions=True)


def _oracle(case, **kwargs):
    """TensorFlow's rewrite of the case.  Where Grappler rejects it, the bfloat16 pass painted a
    functional loop's variables against its functions' signatures (KNOWN_DIFFERENCES.md KD-6):
    then the pass's own output, before Grappler's MLIR optimizer, which must be such a graph."""
    try:
        return tf_amp_rewrite(case.graph_def, list(case.fetches), **kwargs)
    except tf.errors.InvalidArgumentError:
        if kwargs.get("mode") != "bf16":
            raise
    painted = tf_amp_rewrite(case.graph_def, list(case.fetches), tfg=False, **kwargs)
    with pytest.raises(InvariantError, match="does not match the signature"):
        check_valid(case.graph_def, painted, run=False)
    return painted


def _check_against_tensorflow(case, kind):
    if kind == "gpu":
        target, precision = case.target, "float16"
        reference = _oracle(case, gpus=tuple(case.target[4:].split(",")))
    else:
        target, precision = "cpu", "bfloat16"
        reference = _oracle(case, mode="bf16")
    ours = amp_rewrite.rewrite_graph_def(
        case.graph_def, target=target, precision=precision, lists="tensorflow", functions="reachable",
        tensorflow_bugs=True, fetches=list(case.fetches), use_env=False)
    check_parity(case.graph_def, ours.graph_def, ours.report, reference=reference, precision=precision)


# GPU float16 and CPU bfloat16 are separate tests (not a drawn argument), so a failure of one
# precision (or of TensorFlow's bfloat16 oracle, tf_oracle.require_onednn_bf16) cannot stop
# the other's examples.
@settings(max_examples=examples(100))
@given(CASES)
def test_converted_set_equals_tensorflows_float16(case):
    _check_against_tensorflow(case, "gpu")


@settings(max_examples=examples(100))
@given(CASES)
def test_converted_set_equals_tensorflows_bfloat16(case):
    _check_against_tensorflow(case, "cpu")


@settings(max_examples=examples(8, deep=200))
@given(CASES)
def test_public_reference_agrees_with_the_test_oracle_float16(case):
    """``amp_rewrite.testing.tensorflow_reference`` (shipped for users) is the same pass."""
    ours = tensorflow_reference(case.graph_def, list(case.fetches), target=case.target)
    oracle = tf_amp_rewrite(case.graph_def, list(case.fetches), gpus=tuple(case.target[4:].split(",")))
    assert converted_type_attrs(case.graph_def, ours, low_dtype("float16")) == converted_type_attrs(
        case.graph_def, oracle, low_dtype("float16"))


@settings(max_examples=examples(8, deep=200))
@given(CASES)
def test_public_reference_agrees_with_the_test_oracle_bfloat16(case):
    bf16_ours = tensorflow_reference(case.graph_def, list(case.fetches), target="cpu", precision="bfloat16")
    bf16_oracle = _oracle(case, mode="bf16")
    assert converted_type_attrs(case.graph_def, bf16_ours, DT_BFLOAT16) == converted_type_attrs(
        case.graph_def, bf16_oracle, DT_BFLOAT16)
