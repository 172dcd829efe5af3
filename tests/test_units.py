"""Unit tests: tensor names, dtypes, type analysis, targets and device gating."""

from __future__ import annotations

import pytest

from amp_rewrite.graph import dtypes as dt
from amp_rewrite.errors import InvalidGraphError, TargetError
from amp_rewrite.graph.op_registry import default_registry
from amp_rewrite.plan.targets import Device, Target, detect_target, parse_device_name, parse_target
from amp_rewrite.graph.tensor_names import (
    CONTROL,
    TensorRef,
    format_graph_input,
    parse_function_input,
    parse_graph_input,
)
from amp_rewrite.graph.type_attrs import TypeAttr, node_types


@pytest.mark.parametrize(
    "text, ref",
    [("a", TensorRef("a", 0)), ("a:0", TensorRef("a", 0)), ("a/b:3", TensorRef("a/b", 3)),
     ("^c", TensorRef("c", CONTROL))],
)
def test_parse_graph_input(text, ref):
    assert parse_graph_input(text) == ref


@pytest.mark.parametrize("bad", ["", "^", "a:", ":1", "a:x", "^a:1"])
def test_parse_graph_input_rejects_malformed(bad):
    with pytest.raises(ValueError):
        parse_graph_input(bad)


def test_format_graph_input_is_canonical():
    assert format_graph_input(TensorRef("a", 0)) == "a"
    assert format_graph_input(TensorRef("a", 2)) == "a:2"
    assert format_graph_input(TensorRef("a", CONTROL)) == "^a"


def test_parse_function_input():
    assert parse_function_input("x") == ("x", None, 0, False)
    assert parse_function_input("mm:product:0") == ("mm", "product", 0, False)
    assert parse_function_input("split:output:2") == ("split", "output", 2, False)
    assert parse_function_input("^n").is_control
    with pytest.raises(ValueError):
        parse_function_input("a:b:c")


def test_dtype_names():
    assert dt.name(dt.HALF) == "float16" and dt.name(dt.FLOAT + dt.REF_OFFSET) == "float32_ref"
    assert dt.from_name("half") == dt.HALF and dt.base(101) == dt.FLOAT


def test_fused_batch_norm_v3_has_two_type_attrs():
    sig = default_registry().op("FusedBatchNormV3")
    nt = node_types("bn", "FusedBatchNormV3", {"T": dt.FLOAT, "U": dt.FLOAT}, {}, ("T", "U"), 5, sig)
    assert set(nt.attrs) == {TypeAttr("T", -1, 0), TypeAttr("U", -1, 0)}
    assert nt.inputs[0] == TypeAttr("T", -1, 0) and nt.inputs[1] == TypeAttr("U", -1, 0)
    assert nt.outputs[0] == TypeAttr("T", -1, 0) and nt.outputs[1] == TypeAttr("U", -1, 0)


def test_list_and_number_attrs_expand_ports():
    reg = default_registry()
    idn = node_types("i", "IdentityN", {"T": (dt.FLOAT, dt.INT32)}, {}, ("T",), 2, reg.op("IdentityN"))
    assert idn.inputs == (TypeAttr("T", 0, 0), TypeAttr("T", 1, 0))
    addn = node_types("a", "AddN", {"T": dt.FLOAT}, {"N": 3}, ("N", "T"), 3, reg.op("AddN"))
    assert addn.inputs == (TypeAttr("T", -1, 0),) * 3
    # Fixed-type ports get an id of their own (Conv2DBackpropInput's int32 input_sizes).
    cbi = node_types("c", "Conv2DBackpropInput", {"T": dt.FLOAT}, {}, ("T",), 3, reg.op("Conv2DBackpropInput"))
    assert cbi.inputs[0] == TypeAttr("", -1, dt.INT32)


def test_type_analysis_rejects_wrong_input_count_and_unknown_attr():
    sig = default_registry().op("MatMul")
    with pytest.raises(InvalidGraphError, match="2 data input"):
        node_types("m", "MatMul", {"T": dt.FLOAT}, {}, ("T",), 3, sig)
    with pytest.raises(InvalidGraphError, match="does not define"):
        node_types("m", "MatMul", {"T": dt.FLOAT}, {}, ("T", "bogus"), 2, sig)


@pytest.mark.parametrize(
    "text, type_, id_",
    [("/job:localhost/replica:0/task:0/device:GPU:1", "GPU", 1), ("/device:CPU:0", "CPU", 0),
     ("/gpu:0", "GPU", 0), ("/device:XLA_GPU:0", "XLA_GPU", 0), ("/device:GPU:*", "GPU", None)],
)
def test_parse_device_name(text, type_, id_):
    parsed = parse_device_name(text)
    assert parsed is not None and parsed.type == type_ and parsed.id == id_


def test_parse_target_and_gating():
    t = parse_target("gpu:8.0,6.1")
    assert [d.capability for d in t.devices if d.type == "GPU"] == [(8, 0), (6, 1)]
    assert t.node_is_eligible("", "float16")  # default device: GPU:0
    assert t.node_is_eligible("/device:GPU:0", "float16")
    assert not t.node_is_eligible("/device:GPU:1", "float16")
    assert not t.node_is_eligible("/device:CPU:0", "float16")
    assert not t.node_is_eligible("/device:GPU:*", "float16")  # no id: never processed
    assert t.node_is_eligible("/device:XLA_GPU:0", "float16")  # substring match, like TF
    assert not parse_target("gpu:7.5").node_is_eligible("", "bfloat16")  # bf16 needs 8.0
    assert parse_target("gpu:7.5").skip_reason("bfloat16") is not None
    assert parse_target("gpu:6.1").skip_reason("float16").startswith("no GPU can profit")
    assert parse_target("cpu").node_is_eligible("", "float16")
    assert not parse_target("cpu").node_is_eligible("/device:GPU:0", "float16")


@pytest.mark.parametrize("bad", ["gpu", "gpu:", "gpu:x", "tpu", "gpu:8.0.1.2x"])
def test_bad_targets(bad):
    with pytest.raises(TargetError):
        parse_target(bad)


def test_cpu_features_gate_the_cpu_target():
    plain = Target("cpu", (Device("CPU", 0, None, frozenset({"avx2"})),))
    bf16 = Target("cpu", (Device("CPU", 0, None, frozenset({"avx512_bf16"})),))
    assert plain.skip_reason("float16") and plain.skip_reason("bfloat16")
    assert bf16.skip_reason("float16") and bf16.skip_reason("bfloat16") is None


def test_detect_target_on_this_machine_is_consistent():
    import tensorflow as tf

    t = detect_target()
    if tf.config.list_physical_devices("GPU"):
        assert t.kind == "gpu"
    else:
        assert t.kind == "cpu" and t.devices[0].type == "CPU"


@pytest.mark.parametrize("tf32", [True, False])
def test_detect_target_tells_the_cost_model_whether_float32_is_tf32(tf32, monkeypatch):
    """A GPU of compute capability >= 8.0 runs float32 on TF32 unless TF32 is off; the detected
    device says so, and the cost model prices float32 as strict FP32 then (issue 22).  (No
    GPU here: TensorFlow's device list is answered for one H100 and one V100.)"""
    import tensorflow as tf

    from amp_rewrite.plan.cost_model import gpu_costs

    caps = {"GPU:0": (9, 0), "GPU:1": (7, 0)}
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: list(caps) if kind == "GPU" else [])
    monkeypatch.setattr(tf.config.experimental, "get_device_details",
                        lambda phys: {"compute_capability": caps[phys]})
    monkeypatch.setattr(tf.config.experimental, "tensor_float_32_execution_enabled", lambda: tf32)
    t = detect_target()
    hopper, volta = (d for d in t.devices if d.type == "GPU")
    assert t.kind == "gpu" and hopper.capability == (9, 0)
    assert gpu_costs(hopper).name == ("gpu-hopper" if tf32 else "gpu-hopper-fp32")
    assert gpu_costs(volta).name == "gpu-volta" and not volta.features  # no TF32 before 8.0


def test_a_gpu_without_tensor_cores_is_not_rewritten_for_whatever_its_capability(monkeypatch, caplog):
    """A GTX 1660 Ti has compute capability 7.5 but no Tensor Cores (TU116): float16 runs on
    its CUDA cores, and TensorFlow's users measured its mixed steps 2-4x slower.  Detected by
    its name, it is not eligible: the rewrite changes nothing and says why, with a WARNING-worthy
    reason; an RTX 2060 (TU106, Tensor Cores) of the same capability is rewritten.  (No GPU
    here: TensorFlow's device list is answered.)"""
    import logging

    import tensorflow as tf

    import amp_rewrite
    from amp_rewrite.plan.targets import NO_TENSOR_CORES

    names = {"GPU:0": "NVIDIA GeForce GTX 1660 Ti"}
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: list(names) if kind == "GPU" else [])
    monkeypatch.setattr(tf.config.experimental, "get_device_details",
                        lambda phys: {"compute_capability": (7, 5), "device_name": names[phys]})
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [64, 256], name="x")
        tf.identity(tf.matmul(tf.nn.relu(tf.matmul(x, tf.ones([256, 256]))), tf.ones([256, 8])), name="out")
    gtx = detect_target()
    assert NO_TENSOR_CORES in gtx.devices[0].features and "no Tensor Cores" in gtx.description
    report = amp_rewrite.rewrite_graph_def(graph.as_graph_def(), target=gtx, fetches=["out"], use_env=False).report
    assert report["converted_nodes"] == 0 and "without Tensor Cores" in report["skipped"], report["skipped"]
    names["GPU:0"] = "NVIDIA GeForce RTX 2060"
    rtx = detect_target()
    assert not rtx.devices[0].features
    assert amp_rewrite.rewrite_graph_def(graph.as_graph_def(), target=rtx, fetches=["out"],
                                         use_env=False).report["converted_nodes"] >= 2  # both MatMuls, at least
