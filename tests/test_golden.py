"""Golden and differential tests on tiny graphs: each one a rule of the pass.

Every test builds a small graph, rewrites it with our pass and with TensorFlow's own (run
offline against a virtual GPU), asserts that the converted (node, type attribute) sets are
identical, and then states the expected outcome itself.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.ops import list_ops

import amp_rewrite
from amp_rewrite.graph.op_registry import KernelSpec, TensorFlowRegistry
from graphs import converted, differential, graph_def, run, v1

F32 = tf.float32


def _ph(name: str, shape=(8, 8)):
    return v1.placeholder(F32, shape, name=name)


def test_simple_chain_matches_tensorflow_unit_test():
    # TensorFlow's own "Simple" test: only the Relu before the MatMul, the MatMul and what
    # follows up to the next allow op become half; the Exp->Relu->Sqrt chain stays float.
    def build():
        c = tf.constant(np.ones((8, 8), np.float32), name="c")
        e = tf.exp(c, name="exp")
        r1 = tf.nn.relu(e, name="r1")
        s = tf.sqrt(r1, name="sqrt")
        r2 = tf.nn.relu(s, name="r2")
        m = tf.matmul(r2, _ph("x"), name="mm")
        r3 = tf.nn.relu(m, name="r3")
        lg = tf.math.log(r3, name="log")
        r4 = tf.nn.relu(lg, name="r4")
        tf.identity(tf.nn.relu(tf.matmul(r4, r4, name="mm2"), name="r5"), name="out")

    ours = differential(graph_def(build), ["out"])
    assert converted(ours) == {"r2", "mm", "r3", "log", "r4", "mm2", "r5"}
    nodes = ours.report["nodes"]
    assert nodes["sqrt"]["color"] == "deny" and nodes["sqrt"]["deny_source"] == "exp"
    assert nodes["out"]["dtype"] == "float32"


def test_fetched_allow_op_is_preserved():
    def build():
        m = tf.matmul(_ph("a"), _ph("b"), name="mm")
        tf.matmul(tf.nn.relu(m, name="r"), _ph("c"), name="fetched")

    ours = differential(graph_def(build), ["fetched"])
    assert "fetched" not in converted(ours)
    assert "mm" in converted(ours)
    assert "preserved" in ours.report["nodes"]["fetched"]["reason"]


def test_graph_outputs_keep_dtype_without_fetches():
    def build():
        tf.matmul(_ph("a"), _ph("b"), name="last")

    gd = graph_def(build)
    result = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", use_env=False)
    out = {n.name: n for n in result.graph_def.node}
    assert out["last"].attr["T"].type == tf.float32.as_datatype_enum


def test_cpu_pinned_nodes_stay_float():
    def build():
        with tf.device("/device:GPU:0"):
            m = tf.matmul(_ph("a"), _ph("b"), name="gpu_mm")
            t = tf.tanh(m, name="tanh")
        with tf.device("/device:CPU:0"):
            tf.identity(tf.matmul(t, t, name="cpu_mm"), name="out")

    ours = differential(graph_def(build), ["out"])
    # TensorFlow 2.20 and later paint an infer op fed directly by an allow op (their pass 4)
    # in every mode, so the GPU Tanh goes to half; 2.16 to 2.19 do that only for bfloat16, so
    # there it stays float.  The CPU MatMul is never converted.
    release = tuple(int(part) for part in tf.__version__.split(".")[:2])
    assert "gpu_mm" in converted(ours)
    assert ("tanh" in converted(ours)) == (release >= (2, 20))
    assert "cpu_mm" not in converted(ours)
    assert "not eligible" in ours.report["nodes"]["cpu_mm"]["reason"]


def test_mixed_gpu_architectures_only_change_the_fast_gpu():
    def build():
        for i in (0, 1):
            with tf.device(f"/device:GPU:{i}"):
                tf.identity(tf.matmul(_ph(f"a{i}"), _ph(f"b{i}"), name=f"mm{i}"), name=f"out{i}")

    gd = graph_def(build)
    ours = differential(gd, ["out0", "out1"], gpus=("8.0", "6.1"))
    assert "mm0" in converted(ours) and "mm1" not in converted(ours)
    assert "not eligible" in ours.report["nodes"]["mm1"]["reason"]


def test_fused_batch_norm_becomes_v2_with_float_statistics():
    def build():
        x = v1.placeholder(F32, (2, 4, 4, 3), name="x")
        w = v1.placeholder(F32, (3, 3, 3, 3), name="w")
        conv = tf.nn.conv2d(x, w, 1, "SAME", name="conv")
        ones = tf.ones([3], name="ones")
        y = tf.raw_ops.FusedBatchNorm(x=conv, scale=ones, offset=ones, mean=ones, variance=ones,
                                      is_training=False, name="bn")[0]
        tf.identity(tf.nn.conv2d(tf.nn.relu(y), w, 1, "SAME", name="conv2"), name="out")

    ours = differential(graph_def(build), ["out"])
    bn = next(n for n in ours.graph_def.node if n.name == "bn")
    assert bn.op == "FusedBatchNormV2"
    assert bn.attr["T"].type == tf.float16.as_datatype_enum
    assert bn.attr["U"].type == tf.float32.as_datatype_enum


def test_existing_cast_feeding_only_allow_becomes_cast_to_half():
    def build():
        b = v1.placeholder(tf.bool, (8, 8), name="b")
        c = tf.cast(b, F32, name="cast")
        tf.identity(tf.matmul(c, _ph("x"), name="mm"), name="out")

    ours = differential(graph_def(build), ["out"])
    cast = next(n for n in ours.graph_def.node if n.name == "cast")
    assert cast.attr["DstT"].type == tf.float16.as_datatype_enum
    assert not any(n.name.startswith("cast-0-") for n in ours.graph_def.node)


def test_list_type_attrs_are_decided_per_element():
    def build():
        m = tf.matmul(_ph("a"), _ph("b"), name="mm")
        i = tf.identity_n([m, tf.exp(_ph("c"), name="exp")], name="idn")
        tf.identity(tf.matmul(i[0], i[0], name="mm2"), name="out0")
        tf.identity(i[1], name="out1")

    ours = differential(graph_def(build), ["out0", "out1"])
    idn = next(n for n in ours.graph_def.node if n.name == "idn")
    assert list(idn.attr["T"].list.type) == [tf.float16.as_datatype_enum, tf.float32.as_datatype_enum]


def test_tensor_list_painted_as_one_cluster():
    def build():
        m = tf.matmul(_ph("a"), _ph("b"), name="mm")
        lst = list_ops.tensor_list_reserve([8, 8], 2, F32, name="reserve")
        lst = list_ops.tensor_list_set_item(lst, 0, m, name="set")
        item = list_ops.tensor_list_get_item(lst, 0, F32, element_shape=[8, 8], name="get")
        tf.identity(tf.matmul(item, item, name="mm2"), name="out")

    ours = differential(graph_def(build), ["out"])
    assert {"mm", "set", "get", "reserve", "mm2"} <= converted(ours)


def test_tensor_list_through_a_boundary_stays_float():
    def build():
        m = tf.matmul(_ph("a"), _ph("b"), name="mm")
        handle = v1.placeholder(tf.variant, (), name="handle")
        lst = list_ops.tensor_list_set_item(handle, 0, m, name="set")
        tf.identity(list_ops.tensor_list_get_item(lst, 0, F32, element_shape=[8, 8], name="get"), name="out")

    ours = differential(graph_def(build), ["out"])
    assert {"set", "get"}.isdisjoint(converted(ours))
    assert "mm" in converted(ours)


def test_levels_match_tensorflow():
    def build():
        m = tf.matmul(_ph("a"), _ph("b"), name="mm")
        s = tf.sigmoid(m, name="sig")
        tf.identity(tf.matmul(s, s, name="mm2"), name="out")

    gd = graph_def(build)
    infer_as_deny = differential(gd, ["out"], env={"TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LEVEL": "TREAT_INFER_AS_DENY"},
                                 level="TREAT_INFER_AS_DENY")
    assert "sig" not in converted(infer_as_deny)
    default = differential(gd, ["out"])
    assert "sig" in converted(default)


def test_default_profile_keeps_softmax_float32_where_tensorflow_converts_it():
    def build():
        m = tf.matmul(_ph("a"), _ph("b"), name="mm")
        tf.identity(tf.matmul(tf.nn.softmax(m, name="softmax"), _ph("c"), name="mm2"), name="out")

    gd = graph_def(build)
    assert "softmax" in converted(differential(gd, ["out"]))
    ours = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="default", fetches=["out"], use_env=False)
    assert "softmax" not in converted(ours)
    assert ours.report["nodes"]["softmax"]["color"] == "deny"


class _NoHalfEinsumOnGpu(TensorFlowRegistry):
    """TensorFlow's registry without a GPU float16 Einsum kernel (as in some TF builds)."""

    def kernels(self, op: str, device_type: str) -> tuple[KernelSpec, ...]:
        found = super().kernels(op, device_type)
        if op == "Einsum" and device_type == "GPU":
            found = tuple(k for k in found if all(tf.float16.as_datatype_enum not in a for _, a in k.constraints))
        return found

    def __hash__(self) -> int:
        return id(self)


def test_allow_op_without_low_precision_kernel_stays_float32():
    # Known difference: TensorFlow converts it anyway and the graph cannot run.
    def build():
        e = tf.einsum("ij,jk->ik", _ph("a"), _ph("b"), name="einsum")
        tf.identity(tf.matmul(e, e, name="mm"), name="out")

    gd = graph_def(build)
    with_kernel = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", fetches=["out"], use_env=False)
    assert "einsum/Einsum" in converted(with_kernel)
    without = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", fetches=["out"], use_env=False,
                                            registry=_NoHalfEinsumOnGpu())
    assert "einsum/Einsum" not in converted(without)
    assert "no float16 kernel" in without.report["nodes"]["einsum/Einsum"]["reason"]
    assert "mm" in converted(without)


def test_unknown_op_stays_float32_with_one_warning(caplog: pytest.LogCaptureFixture):
    def build():
        m = tf.matmul(_ph("a"), _ph("b"), name="mm")
        tf.identity(m, name="feeds_custom")

    gd = graph_def(build)
    for i in range(2):
        node = gd.node.add(name=f"custom{i}", op="MyCustomOp")
        node.input.append("mm")
        node.attr["T"].type = tf.float32.as_datatype_enum
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        result = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", fetches=["feeds_custom"], use_env=False)
    assert sum("MyCustomOp" in r.getMessage() for r in caplog.records) == 1
    out = {n.name: n for n in result.graph_def.node}
    assert out["mm"].attr["T"].type == tf.float16.as_datatype_enum
    # Each custom node reads float32 through one cast back from half.
    cast = out["custom0"].input[0]
    assert out[cast].op == "Cast" and out[cast].attr["DstT"].type == tf.float32.as_datatype_enum
    assert out["custom1"].input[0] == cast
    assert result.report["unknown_ops"] == {"MyCustomOp": 2}


def test_one_cast_per_tensor_and_direction_shared_by_consumers():
    def build():
        x = _ph("x")
        m = tf.matmul(x, x, name="mm")
        for i in range(3):
            tf.identity(tf.exp(m, name=f"exp{i}"), name=f"out{i}")

    ours = differential(graph_def(build), ["out0", "out1", "out2"])
    casts = [n for n in ours.graph_def.node if n.op == "Cast" and n.input[0] == "mm"]
    assert len(casts) == 1
    assert casts[0].name == "mm-0-CastToFp32-0-AutoMixedPrecision"
    assert ours.report["casts_to_high"] == 1 and ours.report["casts_to_low"] == 1


def test_rewritten_tiny_graph_runs_close_to_float32():
    def build():
        x = _ph("x")
        h = tf.nn.relu(tf.matmul(x, _ph("w"), name="mm"), name="relu")
        tf.identity(tf.nn.softmax(tf.matmul(h, _ph("w2"), name="mm2")), name="out")

    gd = graph_def(build)
    result = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", fetches=["out"], use_env=False)
    rng = np.random.default_rng(0)
    feeds = {k + ":0": rng.standard_normal((8, 8)).astype(np.float32) for k in ("x", "w", "w2")}
    (ref,) = run(gd, feeds, ["out:0"])
    (got,) = run(result.graph_def, feeds, ["out:0"])
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=0, atol=5e-3)


def test_bfloat16_on_cpu_matches_tensorflow_onednn_mode():
    def build():
        x = v1.placeholder(F32, (2, 8, 8, 3), name="x")
        w = v1.placeholder(F32, (3, 3, 3, 4), name="w")
        c = tf.nn.bias_add(tf.nn.conv2d(x, w, 1, "SAME", name="conv"), tf.ones([4]), name="bias")
        r = tf.nn.relu(c, name="relu")
        tf.identity(tf.reduce_mean(r, axis=[1, 2], name="mean"), name="out")

    ours = differential(graph_def(build), ["out"], gpus=(), target="cpu", precision="bfloat16", mode="bf16")
    assert {"conv", "bias", "relu"} <= converted(ours)
    # The Relu becomes allow only in pass 5, after pass 4 looked at the Mean behind it.
    assert "mean" not in converted(ours)


def test_no_cast_chain_after_an_existing_cast():
    # A bool->float Cast feeding a MatMul and an Exp: TensorFlow chains a float->half Cast
    # after it; we cast bool->half directly (bool->float is exact, so values are the same).
    def build():
        c = tf.cast(v1.placeholder(tf.bool, (8, 8), name="b"), F32, name="cast")
        tf.identity(tf.matmul(c, _ph("x"), name="mm"), name="out")
        tf.identity(tf.exp(c, name="exp"), name="out2")

    gd = graph_def(build)
    ours = differential(gd, ["out", "out2"])
    nodes = {n.name: n for n in ours.graph_def.node}
    inserted = [n for n in ours.graph_def.node if n.name.endswith("AutoMixedPrecision")]
    assert all(nodes[n.input[0].split(":")[0]].op != "Cast" for n in inserted)
    to_half = next(n for n in inserted if n.attr["DstT"].type == tf.float16.as_datatype_enum and "cast" in n.name)
    assert to_half.input[0] == "b" and to_half.attr["SrcT"].type == tf.bool.as_datatype_enum
    feeds = {"b:0": np.eye(8, dtype=bool), "x:0": np.ones((8, 8), np.float32)}
    np.testing.assert_allclose(run(ours.graph_def, feeds, ["out:0"])[0], run(gd, feeds, ["out:0"])[0])


def test_no_cast_chain_before_an_existing_cast():
    # A half MatMul feeding a float->int32 Cast: the Cast reads half directly.
    def build():
        m = tf.matmul(_ph("a"), _ph("b"), name="mm")
        tf.identity(tf.cast(m, tf.int32, name="to_int"), name="out")
        tf.identity(tf.matmul(m, m, name="mm2"), name="out2")

    gd = graph_def(build)
    ours = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", fetches=["out", "out2"], use_env=False)
    nodes = {n.name: n for n in ours.graph_def.node}
    assert nodes["to_int"].input[0] == "mm"
    assert nodes["to_int"].attr["SrcT"].type == tf.float16.as_datatype_enum
    assert not any(n.name.startswith("mm-0-CastToFp32") for n in ours.graph_def.node)
    assert [c["source"] for c in ours.report["casts"] if c["dtype"] == "float32"] == ["mm2:0"]
    feeds = {"a:0": np.full((8, 8), 0.5, np.float32), "b:0": np.full((8, 8), 2.0, np.float32)}
    np.testing.assert_array_equal(run(ours.graph_def, feeds, ["out:0"])[0], run(gd, feeds, ["out:0"])[0])


@pytest.mark.parametrize(
    "target, precision, why",
    [("gpu:6.1", "float16", "compute capability >= 7.0"),
     ("gpu:7.5", "bfloat16", "compute capability >= 8.0"),
     (amp_rewrite.Target("cpu", (amp_rewrite.Device("CPU", 0, None, frozenset({"avx2"})),)), "float16",
      "amx_fp16 or avx512_fp16")],
)
def test_nothing_eligible_returns_graph_unchanged_with_one_log_line(target, precision, why, caplog):
    def build():
        tf.identity(tf.matmul(_ph("a"), _ph("b"), name="mm"), name="out")

    gd = graph_def(build)
    with caplog.at_level(logging.DEBUG, logger="amp_rewrite"):
        result = amp_rewrite.rewrite_graph_def(gd, target=target, precision=precision, use_env=False)
    assert result.graph_def.SerializeToString(deterministic=True) == gd.SerializeToString(deterministic=True)
    assert why in result.report["skipped"]
    records = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert len(records) == 1 and why in records[0].getMessage()
