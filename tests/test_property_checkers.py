"""The checkers catch what they promise to catch: each invariant, handed a deliberately broken
rewrite, raises an ``InvariantError`` that names the invariant and the node.  Plus regression
tests for the core issues the property tests found (at the bottom of the file)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings

import amp_rewrite
from amp_rewrite.testing import (
    DEFAULT_INVARIANTS,
    INVARIANTS,
    MULTI_DEVICES,
    GraphCase,
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
    graphs_with_options,
)
from conftest import examples

v1 = tf.compat.v1
OPTIONS = {"target": "gpu:8.0", "precision": "float16", "use_env": False}


def _small():
    """x -> Relu -> MatMul(w) -> Exp -> out, with a control edge and a second output."""
    g = tf.Graph()
    with g.as_default():
        x = v1.placeholder(tf.float32, (8, 8), name="x")
        w = tf.constant(np.random.default_rng(0).uniform(-0.1, 0.1, (8, 8)).astype(np.float32), name="w")
        r = tf.nn.relu(x, name="relu")
        m = tf.matmul(r, w, name="mm")
        with tf.control_dependencies([r.op]):
            e = tf.exp(m, name="exp")
        tf.identity(e, name="out")
        tf.identity(tf.tanh(m, name="tanh"), name="out2")
    return g.as_graph_def()


def _rewrite(gd, **kw):
    return amp_rewrite.rewrite_graph_def(gd, **{**OPTIONS, **kw})


def _node(gd, name):
    return next(n for n in gd.node if n.name == name)


def _copy(gd):
    out = type(gd)()
    out.CopyFrom(gd)
    return out


def _raises(invariant, node=None):
    class _Ctx:
        def __enter__(self):
            return self

        def __exit__(self, kind, exc, tb):
            assert kind is not None, f"the {invariant!r} checker let a broken rewrite pass"
            assert issubclass(kind, InvariantError), exc
            assert exc.invariant == invariant, str(exc)
            if node is not None:
                assert exc.node == node, str(exc)
            assert invariant in str(exc)
            return True

    return _Ctx()


def test_a_correct_rewrite_passes_every_invariant():
    gd = _small()
    result = _rewrite(gd)
    assert result.report["converted_nodes"] > 0
    check_rewrite(gd, result.graph_def, result.report, hash_seeds=(0, 4242), **OPTIONS)
    assert set(DEFAULT_INVARIANTS) < set(INVARIANTS)
    with pytest.raises(ValueError, match="parity"):
        check_rewrite(gd, result.graph_def, result.report, invariants=["parity"], **OPTIONS)
    with pytest.raises(ValueError, match="nope"):
        check_rewrite(gd, result.graph_def, result.report, invariants=["nope"], **OPTIONS)
    with pytest.raises(TypeError, match="tagret"):
        check_idempotent(gd, result.graph_def, tagret="gpu:8.0")
    assert issubclass(InvariantError, AssertionError)


def test_valid_catches_a_dtype_mismatch_and_a_graph_that_does_not_run():
    gd = _small()
    after = _copy(_rewrite(gd).graph_def)
    _node(after, "mm").attr["T"].type = tf.float32.as_datatype_enum  # its inputs are still half
    with _raises("valid", "mm"):
        check_valid(gd, after)
    broken = _copy(_rewrite(gd).graph_def)
    _node(broken, "relu").attr["T"].type = tf.int32.as_datatype_enum
    with _raises("valid", "relu"):
        check_valid(gd, broken)
    short = _copy(_rewrite(gd).graph_def)
    del _node(short, "mm").input[1]
    with _raises("valid", "mm"):
        check_valid(gd, short)


def test_allow_deny_catches_unconverted_allow_converted_deny_and_a_changed_ineligible_node():
    gd = _small()
    unconverted = _rewrite(gd, remove={"allow": ["MatMul"]})
    with _raises("allow/deny", "mm"):
        check_allow_deny(gd, unconverted.graph_def, None, **OPTIONS)
    deny_low = _rewrite(gd, add={"allow": ["Exp"]})
    with _raises("allow/deny", "exp"):
        check_allow_deny(gd, deny_low.graph_def, None, **OPTIONS)
    pinned = _copy(gd)
    for n in pinned.node:
        n.device = "/device:GPU:1"
    on_gpu1 = _rewrite(pinned, target="gpu:8.0")  # GPU:1 is not a device of gpu:8.0: default GPU:0
    with _raises("allow/deny"):
        check_allow_deny(pinned, on_gpu1.graph_def, None, **{**OPTIONS, "target": "gpu:8.0,6.1"})
    lying = json.loads(json.dumps(_rewrite(gd).report))
    lying["nodes"]["mm"]["color"] = "deny"
    with _raises("allow/deny", "mm"):
        check_allow_deny(gd, _rewrite(gd).graph_def, lying, **OPTIONS)


def test_interface_catches_lost_edges_new_nodes_and_changed_outputs():
    gd = _small()
    good = _rewrite(gd).graph_def
    no_ctrl = _copy(good)
    node = _node(no_ctrl, "exp")
    node.input[:] = [i for i in node.input if not i.startswith("^")]
    with _raises("interface", "exp"):
        check_interface(gd, no_ctrl)
    extra = _copy(good)
    extra.node.add().CopyFrom(_node(good, "relu"))
    extra.node[-1].name = "intruder"
    with _raises("interface", "intruder"):
        check_interface(gd, extra)
    rewired = _copy(good)
    _node(rewired, "tanh").input[0] = "relu"
    with _raises("interface", "tanh"):
        check_interface(gd, rewired)
    out_changed = _copy(good)
    _node(out_changed, "out").attr["T"].type = tf.float16.as_datatype_enum
    with _raises("interface"):
        check_interface(gd, out_changed)
    moved = _copy(good)
    _node(moved, "mm").device = "/device:CPU:0"
    with _raises("interface", "mm"):
        check_interface(gd, moved)


def test_minimal_casts_catches_duplicates_dead_casts_chains_and_wrong_counts():
    gd = _small()
    result = _rewrite(gd)
    good = result.graph_def
    cast = next(n for n in good.node if n.op == "Cast" and n.name.startswith("mm-0-CastToFp32"))
    dup = _copy(good)
    twin = dup.node.add()
    twin.CopyFrom(cast)
    twin.name = cast.name.replace("-0-AutoMixedPrecision", "-1-AutoMixedPrecision")
    _node(dup, "exp").input[0] = twin.name
    with _raises("minimal casts"):
        check_minimal_casts(gd, dup, target="gpu:8.0")
    dead = _copy(good)
    ghost = dead.node.add()
    ghost.CopyFrom(cast)
    ghost.name = "relu-0-CastToFp32-0-AutoMixedPrecision"
    ghost.input[0] = "relu"
    with _raises("minimal casts", ghost.name):
        check_minimal_casts(gd, dead, target="gpu:8.0")
    chain = _copy(good)
    back = chain.node.add()
    back.CopyFrom(cast)
    back.name = "mm-0-CastToFp16-0-AutoMixedPrecision"
    back.input[0] = cast.name
    back.attr["SrcT"].type, back.attr["DstT"].type = tf.float32.as_datatype_enum, tf.float16.as_datatype_enum
    extra_consumer = chain.node.add()
    extra_consumer.CopyFrom(_node(good, "out2"))
    extra_consumer.name = "reader"
    extra_consumer.input[:] = [back.name]
    with _raises("minimal casts"):
        check_minimal_casts(gd, chain, target="gpu:8.0")
    wrong_count = dict(result.report, casts_to_low=result.report["casts_to_low"] + 1)
    with _raises("minimal casts"):
        check_minimal_casts(gd, good, wrong_count, target="gpu:8.0")


def test_idempotent_and_deterministic_catch_a_graph_that_moves():
    gd = _small()
    good = _rewrite(gd)
    with _raises("idempotent"):
        check_idempotent(gd, gd, **OPTIONS)  # "after" is not a fixed point: it still converts
    reordered = _copy(good.graph_def)
    nodes = list(reordered.node)
    del reordered.node[:]
    reordered.node.extend(reversed(nodes))
    with _raises("deterministic"):
        check_deterministic(gd, reordered, good.report, **OPTIONS)
    other_report = dict(good.report, total_nodes=-1)
    with _raises("deterministic"):
        check_deterministic(gd, good.graph_def, other_report, **OPTIONS)
    with _raises("deterministic"):
        check_deterministic(gd, good.graph_def, other_report, hash_seeds=(3,), **OPTIONS)


def test_monotone_catches_a_pass_that_converts_more_when_an_op_moves_to_deny(monkeypatch):
    gd = _small()
    good = _rewrite(gd)
    real = amp_rewrite.rewrite_graph_def

    def perverse(graph_def, **kw):
        # Treat "deny" as "allow": moving Exp to deny makes it half.
        if kw.get("add", {}).get("deny") == ["Exp"]:
            kw = dict(kw, add={"allow": ["Exp"]})
        return real(graph_def, **kw)

    monkeypatch.setattr(amp_rewrite, "rewrite_graph_def", perverse)
    with _raises("monotone", "exp"):
        check_monotone(gd, good.graph_def, good.report, ops=["Relu", "Exp"], **OPTIONS)


def test_numerics_catches_a_wrong_value_and_a_lost_finite_output():
    gd = _small()
    good = _rewrite(gd)
    check_numerics(gd, good.graph_def, feeds=None, precision="float16")
    wrong = _copy(good.graph_def)
    w = _node(wrong, "w")
    values = tf.make_ndarray(w.attr["value"].tensor) * 1.5
    w.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(values))
    with _raises("numerics"):
        check_numerics(gd, wrong, precision="float16")
    blown = _copy(good.graph_def)
    w = _node(blown, "w")
    w.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.full((8, 8), 60000.0, np.float32)))
    with _raises("numerics"):
        check_numerics(gd, blown, precision="float16")


def test_parity_catches_a_different_converted_set_and_more_casts():
    gd = _small()
    ours = _rewrite(gd, lists="tensorflow")
    fewer = _rewrite(gd, lists="tensorflow", remove={"infer": ["Tanh"]})
    check_parity(gd, ours.graph_def, reference=ours.graph_def)
    with _raises("parity", "tanh"):
        check_parity(gd, ours.graph_def, reference=fewer.graph_def)
    more_casts = _copy(ours.graph_def)
    extra = more_casts.node.add()
    extra.CopyFrom(next(n for n in more_casts.node if n.op == "Cast"))
    extra.name = "surplus"
    with _raises("parity"):
        check_parity(gd, more_casts, reference=ours.graph_def)


@settings(max_examples=examples(10, deep=300))
@given(graphs_with_options(devices=MULTI_DEVICES, while_loops=True, functions=True))
def test_check_rewrite_runs_every_default_invariant(drawn):
    case, options = drawn
    result = amp_rewrite.rewrite_graph_def(case.graph_def, **options)
    invariants = [i for i in DEFAULT_INVARIANTS if i not in ("allow/deny", "numerics")]
    check_rewrite(case.graph_def, result.graph_def, result.report, invariants=invariants,
                  feeds=case.feeds, outputs=case.outputs, **options)
    check_rewrite(case.graph_def, result.graph_def, result.report, invariants=["numerics"],
                  feeds=case.feeds, outputs=case.smooth_outputs, **options)


# ----------------------------------------------------------------------------------------
# Core issues found by the property tests (fixed in the core; these keep them fixed).


def _cast_of_a_converted_tensor():
    """relu feeds a MatMul (so it becomes float16) and a float -> int32 Cast that is fetched
    and pinned to the CPU (so it must not change).  Found by test_property_allow_deny."""
    g = tf.Graph()
    with g.as_default():
        x = v1.placeholder(tf.float32, (8, 8), name="x")
        r = tf.nn.relu(x, name="relu")
        m = tf.matmul(r, r, name="mm")
        with tf.device("/device:CPU:0"):
            tf.cast(r, tf.int32, name="to_int")
        tf.identity(m, name="out")
    return g.as_graph_def()


def test_regression_cast_fold_leaves_unprocessed_casts_alone():
    """The Cast -> Cast fold used to change SrcT (float32 -> float16) of an existing Cast that is
    preserved (fetched) or on an ineligible device."""
    gd = _cast_of_a_converted_tensor()
    options = dict(OPTIONS, fetches=["out", "to_int"])
    result = _rewrite(gd, fetches=["out", "to_int"])
    check_allow_deny(gd, result.graph_def, result.report, **options)


def test_minimal_casts_keeps_the_chain_into_a_cast_that_must_not_change():
    gd = _cast_of_a_converted_tensor()
    for node in gd.node:
        node.device = ""  # to_int is only preserved (fetched), not on an ineligible device
    result = _rewrite(gd, fetches=["out", "to_int"])
    to_int = _node(result.graph_def, "to_int")
    assert to_int.input[0].endswith("-CastToFp32-0-AutoMixedPrecision")  # the chain stays
    check_minimal_casts(gd, result.graph_def, result.report, target="gpu:8.0", fetches=["out", "to_int"])
    with _raises("minimal casts", "to_int"):  # were to_int free to change, the chain would be waste
        check_minimal_casts(gd, result.graph_def, result.report, target="gpu:8.0", fetches=["out"])


def test_regression_graph_passes_every_invariant():
    for gd in (_cast_of_a_converted_tensor(), _cast_after_an_allow_op()):
        case = GraphCase.from_graph_def(gd)
        for fetches in (None, list(case.fetches)):
            options = dict(OPTIONS, fetches=fetches)
            result = _rewrite(gd, fetches=fetches)
            check_rewrite(gd, result.graph_def, result.report, feeds=case.feeds, **options)


def _cast_after_an_allow_op():
    """An existing float32 -> float16 Cast of a MatMul's output (the MatMul becomes float16).
    Found by test_property_allow_deny under the deep profile."""
    g = tf.Graph()
    with g.as_default():
        x = v1.placeholder(tf.float32, (8, 8), name="x")
        tf.identity(tf.cast(tf.matmul(x, x, name="mm"), tf.float16, name="to_half"), name="out")
    return g.as_graph_def()


def test_regression_report_shows_the_cast_fold():
    """After the fold rewires an existing Cast to read the float16 tensor (SrcT float32 ->
    float16), the report used to say SrcT was float32 (color none)."""
    gd = _cast_after_an_allow_op()
    result = _rewrite(gd)
    assert _node(result.graph_def, "to_half").attr["SrcT"].type == tf.float16.as_datatype_enum
    check_allow_deny(gd, result.graph_def, result.report, **OPTIONS)

