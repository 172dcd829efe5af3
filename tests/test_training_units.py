"""Unit tests of the training API's pieces: loss-scale rule, option checking, wrappers' contracts.

Fast; no model is trained here (tests/test_training.py does that).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import amp_rewrite
from amp_rewrite.errors import AmpRewriteError
from amp_rewrite.training import loss_scale as ls


# -- loss scales --------------------------------------------------------------------------

def test_get_interprets_identifiers() -> None:
    assert ls.get("dynamic") == ls.DynamicLossScale(2.0**15, 2000, 2.0)
    assert ls.get(128) == ls.FixedLossScale(128)
    assert ls.get("128") == ls.FixedLossScale(128.0)  # command-line text
    custom = ls.DynamicLossScale(initial_loss_scale=8.0, increment_period=3)
    assert ls.get(custom) is custom
    for bad in (None, "static", "0.5", True, [1]):
        with pytest.raises(ValueError):
            ls.get(bad)
    with pytest.raises(ValueError):
        ls.FixedLossScale(0.5)
    with pytest.raises(ValueError):
        ls.DynamicLossScale(increment_period=0)
    with pytest.raises(ValueError):
        ls.DynamicLossScale(multiplier=1.0)


def test_get_converts_tensorflows_deprecated_loss_scales() -> None:
    import tensorflow as tf

    tf_scale = tf.compat.v1.mixed_precision.DynamicLossScale(
        initial_loss_scale=64, increment_period=7, multiplier=4
    )
    assert ls.get(tf_scale) == ls.DynamicLossScale(64.0, 7, 4.0)
    assert ls.get(tf.compat.v1.mixed_precision.FixedLossScale(16)) == ls.FixedLossScale(16.0)


def _run_rule(scale: ls.LossScale, flags: list[bool], start: float) -> list[tuple[float, int, int]]:
    import tensorflow as tf

    s, good, skipped = tf.constant(start), tf.constant(0, tf.int64), tf.constant(0, tf.int64)
    out = []
    for flag in flags:
        s, good, skipped = ls.next_state(scale, s, good, skipped, tf.constant(flag))
        out.append((float(s), int(good), int(skipped)))
    return out


def test_dynamic_rule_matches_tensorflow() -> None:
    rule = ls.DynamicLossScale(initial_loss_scale=8.0, increment_period=3, multiplier=2.0)
    states = _run_rule(rule, [True, True, True, False, True, False, False, False, False, False], 8.0)
    assert states[:3] == [(8.0, 1, 0), (8.0, 2, 0), (16.0, 0, 0)]  # grows on the 3rd finite step
    assert states[3] == (8.0, 0, 1)  # halves, resets the count, counts the skip
    assert states[4] == (8.0, 1, 1)
    # Halving stops at min_scale (1), as in TensorFlow's TF1 loss scale.
    assert [s for s, _, _ in states[5:]] == [4.0, 2.0, 1.0, 1.0, 1.0]
    assert states[-1][2] == 6


def test_growth_is_skipped_when_the_scale_would_overflow() -> None:
    rule = ls.DynamicLossScale(initial_loss_scale=3e38, increment_period=1)
    assert _run_rule(rule, [True], 3e38)[0][0] == pytest.approx(3e38)


def test_fixed_scale_never_changes() -> None:
    assert _run_rule(ls.FixedLossScale(4), [True, False], 4.0) == [(4.0, 0, 0), (4.0, 0, 0)]


def test_all_finite_sees_indexed_slices_and_skips_none() -> None:
    import tensorflow as tf

    slices = tf.IndexedSlices(tf.constant([[1.0, np.inf]]), tf.constant([0]), tf.constant([3, 2]))
    assert not bool(ls.all_finite([None, tf.ones(2), slices]))
    assert bool(ls.all_finite([None, tf.ones(2)]))
    assert bool(ls.all_finite([]))


def test_unscale_keeps_the_gradients_dtype_and_sparsity() -> None:
    import tensorflow as tf

    scale = tf.constant(1024.0)  # the loss scale is always float32
    dense = ls.unscale(tf.constant([2048.0, 512.0], tf.float16), scale)
    assert dense.dtype == tf.float16
    np.testing.assert_array_equal(dense.numpy(), np.array([2.0, 0.5], np.float16))
    slices = tf.IndexedSlices(tf.constant([[4096.0, 1024.0]]), tf.constant([2]), tf.constant([3, 2]))
    out = ls.unscale(slices, scale)
    assert isinstance(out, tf.IndexedSlices)  # not densified: embeddings stay sparse
    np.testing.assert_array_equal(out.values.numpy(), [[4.0, 1.0]])
    np.testing.assert_array_equal(out.indices.numpy(), [2])
    assert ls.unscale(None, scale) is None


def test_unscale_survives_a_scale_beyond_float16s_range() -> None:
    import tensorflow as tf

    # The dynamic scale doubles past 65504; dividing in float16 would make it inf and every
    # gradient zero.
    for scale in (2.0**16, 2.0**20):
        for dtype in (tf.float16, tf.bfloat16):
            got = ls.unscale(tf.constant([1000.0, 3.0], dtype), tf.constant(scale))
            assert got.dtype == dtype
            want = np.array([1000.0, 3.0], np.float32) / scale
            np.testing.assert_allclose(got.numpy().astype(np.float32), want, rtol=1e-2)
            assert np.all(got.numpy().astype(np.float32) > 0)

# -- the public entry points ----------------------------------------------------------------

def test_import_amp_rewrite_stays_light() -> None:
    code = ("import sys, amp_rewrite; assert callable(amp_rewrite.DynamicLossScale); "
            "print('tensorflow' in sys.modules, 'keras' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_enable_rejects_what_it_cannot_wrap() -> None:
    import tensorflow as tf

    with pytest.raises(TypeError, match=r"tf\.compat\.v1\.train\.Optimizer.*keras\.optimizers"):
        amp_rewrite.enable_mixed_precision_graph_rewrite(object())
    with pytest.raises(TypeError, match="tf.compat.v1.train.Optimizer"):
        amp_rewrite.enable_mixed_precision_graph_rewrite(tf.Module())
    with pytest.raises(AmpRewriteError, match="unknown rewrite option.*targte"):
        amp_rewrite.enable_mixed_precision_graph_rewrite(
            tf.compat.v1.train.GradientDescentOptimizer(0.1), targte="cpu")
    wrapped = amp_rewrite.enable_mixed_precision_graph_rewrite(
        tf.compat.v1.train.GradientDescentOptimizer(0.1))
    with pytest.raises(ValueError, match="already loss-scaled"):
        amp_rewrite.enable_mixed_precision_graph_rewrite(wrapped)
    with pytest.raises(ValueError):
        amp_rewrite.enable_mixed_precision_graph_rewrite(
            tf.compat.v1.train.GradientDescentOptimizer(0.1), loss_scale="static")


def test_enable_rejects_an_already_wrapped_keras_optimizer() -> None:
    import keras

    inner = keras.optimizers.SGD(0.1)
    with pytest.raises(ValueError, match="inner_optimizer"):
        amp_rewrite.enable_mixed_precision_graph_rewrite(keras.optimizers.LossScaleOptimizer(inner))
    wrapped = amp_rewrite.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError):
        amp_rewrite.enable_mixed_precision_graph_rewrite(wrapped)


def test_disable_is_a_harmless_no_op() -> None:
    import tensorflow as tf

    before = tf.config.optimizer.get_experimental_options()
    assert amp_rewrite.disable_mixed_precision_graph_rewrite() is None
    assert tf.config.optimizer.get_experimental_options() == before


def test_v1_wrapper_forwards_attributes_and_slots() -> None:
    import tensorflow as tf

    inner = tf.compat.v1.train.MomentumOptimizer(0.25, momentum=0.5)
    opt = amp_rewrite.enable_mixed_precision_graph_rewrite(inner, target="cpu")
    assert opt._learning_rate == 0.25 and opt._momentum == 0.5  # private hyperparameters
    assert opt.inner_optimizer is inner
    graph = tf.Graph()
    with graph.as_default():
        var = tf.Variable([1.0, 2.0])
        train = opt.minimize(tf.reduce_sum(var * var))
        # The slots are the inner optimizer's: listed there only, as TensorFlow's own wrapper
        # does (a checkpoint walks both, and a slot listed twice is an error).
        assert opt.get_slot_names() == [] and inner.get_slot_names() == ["momentum"]
        assert opt.get_slot(var, "momentum") is inner.get_slot(var, "momentum")
        names = {v.op.name for v in opt.variables()}
        assert "amp_loss_scale/current_loss_scale" in names and any("Momentum" in n for n in names)
        # The inner update lives in a tf.cond branch; TRAIN_OP must hold the graph's own op.
        assert graph.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP) == [train]
    assert amp_rewrite.training.optimizer.graph_rewrite_options(graph)["target"] == "cpu"
    with pytest.raises(AttributeError, match="nor the optimizer it wraps"):
        opt.no_such_attribute
    with pytest.raises(AttributeError):
        opt._some_private_bookkeeping


def test_keras_wrapper_forwards_attributes_and_serializes() -> None:
    import keras

    inner = keras.optimizers.Adam(learning_rate=0.125, beta_1=0.75)
    opt = amp_rewrite.enable_mixed_precision_graph_rewrite(
        inner, loss_scale=ls.DynamicLossScale(64.0, 5), target="cpu", precision="bfloat16")
    assert opt.beta_1 == 0.75 and opt.inner_optimizer is inner
    assert float(opt.learning_rate) == 0.125
    opt.learning_rate = 0.5  # the setter reaches the inner optimizer (LR schedules rely on it)
    assert float(inner.learning_rate) == 0.5
    assert float(opt.current_loss_scale) == 64.0 and int(opt.skipped_steps) == 0
    var = keras.Variable(np.ones(3, np.float32))
    opt.build([var])
    assert len(opt._momentums) == 1  # slot variables of the inner Adam
    config = opt.get_config()
    clone = type(opt).from_config(config)
    assert clone.loss_scale == ls.DynamicLossScale(64.0, 5)
    assert clone.rewrite_options == {"target": "cpu", "precision": "bfloat16"}
    assert clone.inner_optimizer.beta_1 == 0.75


def test_rename_functions_updates_every_reference() -> None:
    import tensorflow as tf

    from amp_rewrite.training.tf_function import rename_functions

    @tf.function
    def f(x):
        return tf.cond(x > 0, lambda: x * 2.0, lambda: x - 1.0)

    graph_def = f.get_concrete_function(tf.TensorSpec([], tf.float32)).graph.as_graph_def()
    names = {fd.signature.name for fd in graph_def.library.function}
    assert names
    renamed = rename_functions(graph_def, "_x")
    assert {fd.signature.name for fd in renamed.library.function} == {n + "_x" for n in names}
    text = str(renamed.node)
    assert all(n + "_x" in text for n in names)
    assert all(f'"{n}"' not in text for n in names)
    assert {fd.signature.name for fd in graph_def.library.function} == names  # input untouched


def test_enable_refuses_a_mixed_keras_global_policy() -> None:
    import keras

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with pytest.raises(ValueError, match="mixed_float16"):
            amp_rewrite.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1))
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_keras_config_keeps_every_option_json_can_hold() -> None:
    import keras

    opt = amp_rewrite.enable_mixed_precision_graph_rewrite(
        keras.optimizers.SGD(0.1), target="gpu:8.0", add={"allow": ("Exp",)}, fetches=("a", "b"))
    clone = type(opt).from_config(opt.get_config())
    assert clone.rewrite_options == {"target": "gpu:8.0", "add": {"allow": ["Exp"]}, "fetches": ["a", "b"]}
    target = amp_rewrite.resolve_target("gpu:8.0")
    bad = amp_rewrite.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1), target=target)
    with pytest.raises(AmpRewriteError, match="target=.*cannot be saved"):
        bad.get_config()  # dropping it would make a reloaded model train with another target


def test_nested_rewrite_traces_each_keep_their_options() -> None:
    from amp_rewrite.training._common import note_rewrite_options, rewrite_trace

    with rewrite_trace() as outer:
        with rewrite_trace() as inner:  # an equal (empty) record: removal must be by identity
            pass
        note_rewrite_options({"target": "cpu"}, scaled=False)
        note_rewrite_options({"target": "cpu"}, scaled=True)
    assert inner.options == [] and not inner.scaled
    assert outer.options == [{"target": "cpu"}] and outer.scaled


def test_v1_wrapper_checkpoints_its_slots_once_and_its_loss_scale() -> None:
    import tensorflow as tf

    w = tf.Variable([1.0, 2.0])
    opt = amp_rewrite.enable_mixed_precision_graph_rewrite(
        tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), loss_scale=ls.DynamicLossScale(8.0, 1),
        target="gpu:8.0")
    opt.minimize(lambda: tf.reduce_sum(w * w), var_list=[w])  # one good step: the scale doubles
    assert float(opt.current_loss_scale) == 16.0 and opt.get_slot(w, "momentum") is not None
    ckpt = tf.train.Checkpoint(optimizer=opt, w=w)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = ckpt.save(f"{tmp}/ckpt")  # the slot is listed once (by the inner optimizer)
        opt.current_loss_scale.assign(2.0)
        opt.get_slot(w, "momentum").assign([0.0, 0.0])
        ckpt.restore(path).assert_existing_objects_matched()
    assert float(opt.current_loss_scale) == 16.0
    assert np.all(opt.get_slot(w, "momentum").numpy() != 0.0)


def test_v1_wrapper_train_op_collection_under_v1_control_flow(monkeypatch: pytest.MonkeyPatch) -> None:
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    # TF1 code run with disable_v2_behavior() builds the wrapper's tf.cond with v1 control
    # flow: the inner update op is then in the graph itself, and must not stay a train op.
    monkeypatch.setattr(control_flow_util, "ENABLE_CONTROL_FLOW_V2", False)
    graph = tf.Graph()
    with graph.as_default():
        var = tf.Variable([1.0, 2.0])
        earlier = tf.no_op(name="earlier")
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, earlier)
        # "dynamic": the default ("auto") does not scale in bfloat16, the CPU's precision.
        opt = amp_rewrite.enable_mixed_precision_graph_rewrite(
            tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), loss_scale="dynamic", target="cpu")
        train = opt.minimize(tf.reduce_sum(var * var))
        assert any(op.type == "Switch" for op in graph.get_operations())  # v1 cond indeed
        assert graph.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP) == [earlier, train]


def test_a_traced_signature_is_found_again_without_tf_functions_lookup(monkeypatch) -> None:
    """``amp_rewrite.function`` remembers (concrete, runner) per argument signature, so a
    training loop calling the same signature every step does not pay ``tf.function``'s lookup,
    which hashes every captured variable (issue 22: host time a GPU step waits for).  A new
    shape, a new Python value or a new global seed still traces as ``tf.function`` would."""
    tf = pytest.importorskip("tensorflow")
    w = tf.Variable(np.ones((8, 8), np.float32))

    def step(x, scale):
        w.assign_add(0.0 * w)  # a captured variable
        return tf.reduce_sum(tf.matmul(x, w)) * scale

    f = amp_rewrite.function(step, target="gpu:8.0", precision="float16")
    lookups = []
    real = type(f).get_concrete_function
    monkeypatch.setattr(type(f), "get_concrete_function",
                        lambda self, *a, **k: lookups.append(1) or real(self, *a, **k))
    x = tf.ones((4, 8))
    assert [float(f(x, 2.0)) for _ in range(5)] == [512.0] * 5
    assert len(lookups) == 1  # traced and looked up once, then found by its key
    assert f.rewrite_results[0].report["converted_nodes"] > 0  # the rewritten graph ran
    assert float(f(tf.ones((2, 8)), 2.0)) == 256.0 and len(lookups) == 2  # a new shape
    assert float(f(x, 3.0)) == 768.0 and len(lookups) == 3  # a Python value keys by value
    tf.random.set_seed(7)
    assert float(f(x, 2.0)) == 512.0 and len(lookups) == 4  # tf.function retraces on a new seed
    assert float(f(x.numpy(), 2.0)) == 512.0 and len(lookups) == 5  # numpy: tf.function's lookup
    runner = next(iter(f._runners.values()))  # noqa: SLF001
    assert runner._run_concretes  # noqa: SLF001  the runner is called through its concrete function


# -- a step that converts nothing ---------------------------------------------------------

def test_loss_scaling_stays_for_own_low_precision_ops_and_collectives_across_workers() -> None:
    """A step whose rewrite converted nothing drops its loss scale unless it has float16 or
    bfloat16 ops of its own (in a library function too), or a collective on a cluster job's
    device (MultiWorkerMirroredStrategy: every worker must run the same collectives, and
    each decides alone).  A collective among one machine's devices (MirroredStrategy) is no
    reason."""
    from tensorflow.core.framework import graph_pb2, types_pb2

    from amp_rewrite.training.tf_function import _why_loss_scaling_stays

    def graph(op: str, device: str = "", dtype: int = types_pb2.DT_FLOAT, in_function: bool = False):
        gd = graph_pb2.GraphDef()
        node = gd.library.function.add().node_def.add() if in_function else gd.node.add()
        node.name, node.op, node.device = "n", op, device
        node.attr["T"].type = dtype
        return gd

    assert _why_loss_scaling_stays(graph("MatMul")) is None
    assert _why_loss_scaling_stays(graph("CollectiveReduceV2", "/job:localhost/replica:0/task:0/device:CPU:1")) is None
    assert "across workers" in _why_loss_scaling_stays(graph("CollectiveReduceV2",
                                                             "/job:worker/replica:0/task:1/device:GPU:0"))
    assert "of its own" in _why_loss_scaling_stays(graph("MatMul", dtype=types_pb2.DT_HALF))
    assert "of its own" in _why_loss_scaling_stays(graph("MatMul", dtype=types_pb2.DT_BFLOAT16, in_function=True))
    listed = graph("IdentityN")
    listed.node[0].attr["T"].list.type.extend([types_pb2.DT_FLOAT, types_pb2.DT_HALF])
    assert "of its own" in _why_loss_scaling_stays(listed)


def test_a_declined_steps_reason_states_its_estimates_in_readable_units() -> None:
    """The training path's whole-step reason gives each step's estimate in ms from 1 ms, and in
    us below, so a small step does not read "0.00 ms against 0.00 ms"."""
    from amp_rewrite.training.tf_function import _duration

    assert _duration(77_160_000.0) == "77.16 ms"
    assert _duration(1_000_000.0) == "1.00 ms"
    assert _duration(512_340.0) == "512.3 us"
