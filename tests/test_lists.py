"""Tests of amp_rewrite.plan.lists: the packaged op lists, the loader, the environment edits.

The ``tensorflow`` profile is checked against TensorFlow itself: TF writes the lists it uses to
a "paintbuckets" file when ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LOG_PATH`` is set (design doc
§6.1).  All TF runs happen in one subprocess (TF reads the list variables from the process
environment, so they must not leak into this process), started once per module.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from amp_rewrite.plan import lists as lists_mod
from amp_rewrite.errors import ListError
from amp_rewrite.plan.lists import (
    CATEGORIES,
    ListContext,
    ListEdit,
    OpLists,
    available_profiles,
    edits_from_environ,
    load_lists,
    supported_tf_versions,
    tf_major_minor,
)

REPO = Path(__file__).resolve().parent.parent
LISTS_DIR = REPO / "lists"
P = lists_mod.ENV_PREFIX

CUDA = ListContext("float16", "cuda")
CPU_EMULATION = ListContext("float16", "cuda", 10000, 8000)  # TF's auto_mixed_precision_cpu
FP16_ONEDNN = ListContext("float16", "onednn")
BF16 = ListContext("bfloat16", "onednn")


def installed() -> str:
    """The installed TensorFlow's release: the lists the oracle comparisons must match."""
    import tensorflow as tf

    return tf_major_minor(tf.__version__)

# The ops the default profile keeps in float32 on top of TensorFlow's lists.
DEFAULT_EXTRA_DENY = {
    "Softmax", "LogSoftmax", "Sum", "Mean", "Prod", "EuclideanNorm", "L2Loss", "Cumsum",
    "Cumprod", "CumulativeLogsumexp", "SoftmaxCrossEntropyWithLogits",
    "SparseSoftmaxCrossEntropyWithLogits",
}


def sets(op_lists: OpLists) -> dict[str, set[str]]:
    return {c: set(getattr(op_lists, c)) for c in CATEGORIES}


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def always_known(op: str) -> bool:
    return True


# ---------------------------------------------------------------------------------------------
# TensorFlow oracle
# ---------------------------------------------------------------------------------------------

# Runs TF's pass on a tiny graph with a MatMul (so it does not stop at "No allowlist ops found")
# once per configuration and prints {run id: {"lists": {...}} | {"error": str} | {"lists": None}}.
_HARNESS = r'''
import json, os, sys, tempfile
runs = json.loads(sys.argv[1])
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2, device_properties_pb2, rewriter_config_pb2
from tensorflow.python.grappler import cluster as gcluster, tf_optimizer
RC = rewriter_config_pb2.RewriterConfig
tf.compat.v1.disable_eager_execution()
g = tf.Graph()
with g.as_default():
    a = tf.compat.v1.placeholder(tf.float32, [4, 4], name="a")
    b = tf.compat.v1.placeholder(tf.float32, [4, 4], name="b")
    tf.identity(tf.linalg.matmul(a, b, name="mm"), name="out")
mg = tf.compat.v1.train.export_meta_graph(graph=g)
mg.collection_def["train_op"].node_list.value.append("out")

def device(kind, index, env=None):
    return device_properties_pb2.NamedDevice(
        name=f"/job:localhost/replica:0/task:0/device:{kind}:{index}",
        properties=device_properties_pb2.DeviceProperties(type=kind, environment=env or {}))

def parse(path):
    result, current = {}, None
    for line in open(path):
        line = line.strip()
        if line in ("AllowList:", "InferList:", "DenyList:", "ClearList:"):
            current = line[:-len("List:")].lower()
            result[current] = []
        elif line:
            result[current].append(line)
    return result

out = {}
for run in runs:
    devices = [device("CPU", 0)]
    if run["mode"] == "cuda":
        devices.append(device("GPU", 0, {"architecture": "8.0", "cuda": str(run["cuda"]),
                                         "cudnn": str(run["cudnn"])}))
    config = config_pb2.ConfigProto()
    ro = config.graph_options.rewrite_options
    ro.meta_optimizer_iterations = RC.ONE
    ro.min_graph_nodes = -1
    ro.fail_on_optimizer_errors = True
    if run["mode"] == "fp16_cpu":
        # No by-name entry for the oneDNN float16 mode: turn AMP on, everything else off.
        ro.auto_mixed_precision = RC.ON
        for name in ("layout_optimizer", "constant_folding", "shape_optimization", "remapping",
                     "arithmetic_optimization", "dependency_optimization", "loop_optimization",
                     "function_optimization", "debug_stripper", "scoped_allocator_optimization",
                     "pin_to_host_optimization", "implementation_selector",
                     "common_subgraph_elimination"):
            setattr(ro, name, RC.OFF)
        ro.memory_optimization = RC.NO_MEM_OPT
        ro.disable_model_pruning = True
    else:
        ro.optimizers.append({"cuda": "auto_mixed_precision",
                              "cpu": "auto_mixed_precision_cpu",
                              "bf16": "auto_mixed_precision_onednn_bfloat16"}[run["mode"]])
    logdir = tempfile.mkdtemp()
    env = dict(run.get("env", {}))
    env["TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LOG_PATH"] = logdir
    os.environ.update(env)
    try:
        tf_optimizer.OptimizeGraph(config, mg, cluster=gcluster.Cluster(devices=devices))
        error = None
    except Exception as exc:
        error = str(exc)
    finally:
        for key in env:
            del os.environ[key]
    dumps = [f for f in os.listdir(logdir) if f.startswith("paintbuckets")]
    if error is not None:
        out[run["id"]] = {"error": error}
    else:
        out[run["id"]] = {"lists": parse(os.path.join(logdir, dumps[0])) if dumps else None}
print("RESULT " + json.dumps(out))
'''

# Environment edits exercising every variable and TF's per-list order (new ADD, new REMOVE,
# legacy ADD, legacy REMOVE).  MatMul stays on allow, else TF returns before dumping.
ORACLE_EDIT_ENV = {
    f"{P}ALLOWLIST_ADD": "Exp,Cumsum,Tile",
    f"{P}ALLOWLIST_REMOVE": "Cumsum,Conv2D",
    f"{P}WHITELIST_ADD": "Conv2D",  # legacy ADD re-adds what the new REMOVE took away
    f"{P}WHITELIST_REMOVE": "Einsum",
    f"{P}DENYLIST_ADD": "Sqrt",
    f"{P}DENYLIST_REMOVE": "Exp",
    f"{P}INFERLIST_REMOVE": "Tanh,Sqrt",
    f"{P}GRAYLIST_ADD": "Tanh",
    f"{P}BLACKLIST_ADD": "Cumprod",
    f"{P}BLACKLIST_REMOVE": "SaveV2",
    f"{P}CLEARLIST_ADD": "Cumsum",
    f"{P}CLEARLIST_REMOVE": "Tile",
}

# TENSOR_CORES_ONLY: TF ignores the infer/deny/clear edits at this level but applies allow edits.
TCO_ENV = {
    f"{P}LEVEL": "tensor_cores_only",
    f"{P}INFERLIST_ADD": "Tanh",
    f"{P}DENYLIST_ADD": "Cumsum",
    f"{P}ALLOWLIST_ADD": "Exp",  # no conflict: deny is empty at this level
    f"{P}ALLOWLIST_REMOVE": "Conv2D",
}

ORACLE_RUNS = [
    {"id": "cuda", "mode": "cuda", "cuda": 12090, "cudnn": 91000},
    {"id": "cuda_9000_7000", "mode": "cuda", "cuda": 9000, "cudnn": 7000},
    {"id": "cuda_9010_7602", "mode": "cuda", "cuda": 9010, "cudnn": 7602},
    {"id": "cuda_9000_8000", "mode": "cuda", "cuda": 9000, "cudnn": 8000},
    {"id": "cpu", "mode": "cpu"},
    {"id": "bf16", "mode": "bf16"},
    {"id": "fp16_cpu", "mode": "fp16_cpu"},
    {"id": "cuda_edits", "mode": "cuda", "cuda": 12090, "cudnn": 91000, "env": ORACLE_EDIT_ENV},
    {"id": "cuda_tco", "mode": "cuda", "cuda": 12090, "cudnn": 91000,
     "env": TCO_ENV},
    {"id": "cpu_tco", "mode": "cpu", "env": {f"{P}LEVEL": "TENSOR_CORES_ONLY"}},
    {"id": "bf16_tco", "mode": "bf16", "env": {f"{P}LEVEL": "TENSOR_CORES_ONLY"}},
    {"id": "cuda_conflict", "mode": "cuda", "cuda": 12090, "cudnn": 91000,
     "env": {f"{P}ALLOWLIST_ADD": "Exp"}},
]


@pytest.fixture(scope="module")
def tf_dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    pytest.importorskip("tensorflow")
    script = tmp_path_factory.mktemp("oracle") / "harness.py"
    script.write_text(_HARNESS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(P)}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    proc = subprocess.run(
        [sys.executable, str(script), json.dumps(ORACLE_RUNS)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"TF harness failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def tf_lists(tf_dumps: dict[str, dict], run_id: str) -> dict[str, set[str]]:
    if run_id.startswith("bf16"):
        import tf_oracle

        tf_oracle.require_onednn_bf16()
    result = tf_dumps[run_id]
    assert "error" not in result, result
    assert result["lists"] is not None, f"TF wrote no paintbuckets file for {run_id}"
    return {c: set(result["lists"][c]) for c in CATEGORIES}


@pytest.mark.parametrize(
    "run_id, context",
    [
        ("cuda", CUDA),
        ("cuda_9000_7000", ListContext("float16", "cuda", 9000, 7000)),
        ("cuda_9010_7602", ListContext("float16", "cuda", 9010, 7602)),
        ("cuda_9000_8000", ListContext("float16", "cuda", 9000, 8000)),
        ("cpu", CPU_EMULATION),
        ("bf16", BF16),
    ],
)
def test_tensorflow_profile_matches_tensorflow(tf_dumps, run_id, context):
    expected = tf_lists(tf_dumps, run_id)
    assert sets(load_lists("tensorflow", context=context, tf_version=installed())) == expected


def _assert_refused(tmp_path: Path, cases: list[tuple[str, str]]) -> None:
    """Each ``(body, pattern)``: a list file of schema 1 with ``body`` is refused with a
    :class:`ListError` matching ``pattern``."""
    bad = tmp_path / "bad.toml"
    for body, pattern in cases:
        bad.write_text("schema_version = 1\n" + body)
        with pytest.raises(ListError, match=pattern):
            load_lists(str(bad), context=CUDA)


def test_fp16_onednn_matches_tensorflow_or_tensorflow_skips_for_the_cpu_flags(tf_dumps):
    from amp_rewrite.plan.targets import cpu_features

    result = tf_dumps["fp16_cpu"]
    if result.get("lists") is None:
        # TensorFlow runs its oneDNN float16 mode only with AMX-FP16 or AVX-NE-CONVERT; the
        # flags we read must explain why it did not run here.
        assert not cpu_features() & {"amx_fp16", "avx_ne_convert"}
    else:
        assert sets(load_lists("tensorflow", context=FP16_ONEDNN, tf_version=installed())) == tf_lists(
            tf_dumps, "fp16_cpu")


def test_version_gate_counts_match_tensorflow_and_spec(tf_dumps):
    # Spec §2.1 counts for TF 2.21: 39 with recent CUDA/cuDNN, 29 at 9000/7000, 36 at cudnn
    # 7602.  The installed release's dump must match its own lists (2.16 lacks VoxelMax).
    contexts = {"cuda": CUDA, "cuda_9000_7000": ListContext("float16", "cuda", 9000, 7000),
                "cuda_9010_7602": ListContext("float16", "cuda", 9010, 7602),
                "cuda_9000_8000": ListContext("float16", "cuda", 9000, 8000), "cpu": CPU_EMULATION}
    expected_counts = {"cuda": 39, "cuda_9000_7000": 29, "cuda_9010_7602": 36, "cuda_9000_8000": 37, "cpu": 39}
    for run_id, count in expected_counts.items():
        assert len(load_lists("tensorflow", context=contexts[run_id]).allow) == count, run_id
        ours = load_lists("tensorflow", context=contexts[run_id], tf_version=installed()).allow
        assert len(tf_lists(tf_dumps, run_id)["allow"]) == len(ours), run_id
    old = load_lists("tensorflow", context=ListContext("float16", "cuda", 9000, 7000)).allow
    assert len(old) == 29
    assert not old & {"BatchMatMul", "BatchMatMulV2", "Conv3D", "DepthwiseConv2dNative"}
    mid = load_lists("tensorflow", context=ListContext("float16", "cuda", 9010, 7602)).allow
    assert {"BatchMatMul", "Conv3D", "Conv3DBackpropInputV2"} <= mid and "DepthwiseConv2dNative" not in mid


def test_fp16_onednn_spec_contents():
    # FP16_CPU mode cannot run on every CPU; check the spec's description (§2.1) instead.
    got = load_lists("tensorflow", context=FP16_ONEDNN)
    cuda = load_lists("tensorflow", context=CUDA)
    assert len(got.allow) == 15 and len(got.infer) == 46 and len(got.deny) == 9 and len(got.clear) == 110
    assert got.infer - cuda.infer == {"Rsqrt", "Square", "SquaredDifference"}
    assert "CudnnRNN" not in got.allow and "Mha" not in got.allow
    # Version gates never apply on onednn, whatever the versions say.
    assert load_lists("tensorflow", context=ListContext("float16", "onednn", 0, 0)) == got


def test_environment_edits_match_tensorflow(tf_dumps):
    edits, level = edits_from_environ(ORACLE_EDIT_ENV)
    assert level is None
    got = load_lists("tensorflow", context=CUDA, edits=edits, tf_version=installed())
    assert sets(got) == tf_lists(tf_dumps, "cuda_edits")
    # Spot checks of what the order implies (so a wrong oracle cannot hide a wrong order).
    assert {"Conv2D", "Exp", "Tile"} <= got.allow and not {"Cumsum", "Einsum"} & got.allow
    assert got.infer >= {"Tanh"} and "Sqrt" in got.deny and "SaveV2" not in got.deny


def test_tensor_cores_only_matches_tensorflow(tf_dumps, caplog):
    edits, level = edits_from_environ(TCO_ENV)
    assert level == "TENSOR_CORES_ONLY"
    with caplog.at_level(logging.WARNING, logger="amp_rewrite.plan.lists"):
        got = load_lists("tensorflow", context=CUDA, edits=edits, level=level, tf_version=installed())
    assert sets(got) == tf_lists(tf_dumps, "cuda_tco")
    assert not got.infer and not got.deny and not got.clear
    assert got.allow == (load_lists("tensorflow", context=CUDA, tf_version=installed()).allow | {"Exp"}) - {"Conv2D"}
    assert any("ignoring edit(s): add Tanh" in r.getMessage() and "add Cumsum" in r.getMessage()
               for r in caplog.records)
    cpu = load_lists("tensorflow", context=CPU_EMULATION, level="TENSOR_CORES_ONLY", tf_version=installed())
    assert sets(cpu) == tf_lists(tf_dumps, "cpu_tco")
    bf16 = load_lists("tensorflow", context=BF16, level="TENSOR_CORES_ONLY", tf_version=installed())
    assert sets(bf16) == tf_lists(tf_dumps, "bf16_tco") == sets(
        load_lists("tensorflow", context=BF16, tf_version=installed()))


def test_conflict_is_an_error_like_tensorflow(tf_dumps):
    assert "conflicting" in tf_dumps["cuda_conflict"].get("error", "")
    edits, _ = edits_from_environ({f"{P}ALLOWLIST_ADD": "Exp"})
    with pytest.raises(ListError, match=r"Exp is on allow .* and deny"):
        load_lists("tensorflow", context=CUDA, edits=edits, tf_version=installed())


def test_unregistered_entries_are_exactly_the_ops_tensorflow_lacks(tf_dumps):
    from tensorflow.python.framework import op_def_registry

    tf_ops = {op for run in ("cuda", "bf16") for ops in tf_lists(tf_dumps, run).values() for op in ops}
    missing = {op for op in tf_ops if op_def_registry.get(op) is None}
    data = tomllib.loads((LISTS_DIR / "tensorflow.toml").read_text())
    # The 2.21 tables mark the unregistered ops; an older release lists a subset of them (2.16
    # lacks VoxelMax), which the registry check of the installed release's lists must accept.
    marked = {
        op
        for precision in ("float16", "bfloat16")
        for table in data[precision].values()
        for op, value in table.items()
        if isinstance(value, dict) and value.get("registered") is False
    }
    if installed() == data["tf_version"]:
        assert marked == missing
    else:
        assert missing <= marked
    assert "VoxelMax" in marked and "FusedConv2DBiasActivation" in marked


# ---------------------------------------------------------------------------------------------
# Packaged data
# ---------------------------------------------------------------------------------------------


def test_packaged_profiles_are_well_formed():
    assert available_profiles() == ["default", "optimal", "tensorflow"]
    for name in available_profiles():
        data = tomllib.loads((LISTS_DIR / f"{name}.toml").read_text())
        assert data["name"] == name and data["schema_version"] == 1
        for precision in ("float16", "bfloat16"):
            for table in data.get(precision, {}).values():
                for op, value in table.items():
                    reason = value if isinstance(value, str) else value["reason"]
                    assert reason.strip() and "\n" not in reason and len(reason) < 130, (name, op)


def test_optimal_profile_has_default_lists_and_optimal_planner():
    optimal = load_lists("optimal", context=CUDA)
    default = load_lists("default", context=CUDA)
    assert optimal.as_dict() == default.as_dict()
    assert optimal.planner == "optimal" and default.planner == "greedy"
    # But for Mean in bfloat16, inferred as in TensorFlow's lists (its kernels sum in float32).
    bf16, bf16_default = load_lists("optimal", context=BF16), load_lists("default", context=BF16)
    assert "Mean" in bf16.infer and "Mean" in bf16_default.deny
    moved = {c: set(getattr(bf16, c)) for c in CATEGORIES}
    moved["infer"].discard("Mean")
    moved["deny"].add("Mean")
    assert moved == sets(bf16_default)
    assert load_lists("tensorflow", context=CUDA).planner == "greedy"


def test_planner_key_is_validated_and_inherited(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('schema_version = 1\nplanner = "fastest"\n')
    with pytest.raises(ListError, match="planner"):
        load_lists(str(bad), context=CUDA)
    child = tmp_path / "child.toml"
    child.write_text('schema_version = 1\nextends = "optimal"\n[float16.deny]\nTanh = "mine"\n')
    assert load_lists(str(child), context=CUDA).planner == "optimal"
    back = tmp_path / "back.toml"
    back.write_text('schema_version = 1\nextends = "optimal"\nplanner = "greedy"\n')
    assert load_lists(str(back), context=CUDA).planner == "greedy"


def test_normalization_policy_is_validated_inherited_and_overridable(tmp_path):
    """``[normalization]`` says where a normalization's apply ops run: TensorFlow's profile
    leaves them to deny propagation (float32), the default profile fences them in float16
    (float32, but not what reads their output, as Keras's mixed policy), the optimal one runs
    them in low precision in both, and a later layer (a child profile or a user file layered
    on top) can set it back, per precision, with its own reason."""
    assert load_lists("tensorflow", context=CUDA).normalization_apply == "float32"
    assert load_lists("tensorflow", context=CUDA).normalization_reason == ""
    got = load_lists("default", context=CUDA)
    assert got.normalization_apply == "fenced" and "as Keras's mixed precision policies" in got.normalization_reason
    got = load_lists("optimal", context=CUDA)
    assert got.normalization_apply == "low" and "float32 statistics is bounded" in got.normalization_reason
    # In bfloat16 on a CPU the default profile leaves it to TensorFlow's rule (a CPU's bfloat16
    # element-wise kernels are slower than float32's); the optimal planner weighs it.  On a
    # GPU (backend cuda) it fences bfloat16 too, as Keras's mixed_bfloat16 policy does.
    assert load_lists("default", context=BF16).normalization_apply == "float32"
    assert load_lists("optimal", context=BF16).normalization_apply == "low"
    assert load_lists("default", context=ListContext("bfloat16", "cuda")).normalization_apply == "fenced"
    # A limit to some backends applies to that precision only.
    gpu_bf16 = tmp_path / "gpu_bf16.toml"
    gpu_bf16.write_text('schema_version = 1\nextends = "tensorflow"\n[normalization]\napply = "low"\nreason = "g"\n'
                        'backends = { bfloat16 = ["cuda"] }\n')
    assert load_lists(str(gpu_bf16), context=ListContext("bfloat16", "cuda")).normalization_apply == "low"
    assert load_lists(str(gpu_bf16), context=BF16).normalization_apply == "float32"
    assert load_lists(str(gpu_bf16), context=FP16_ONEDNN).normalization_apply == "low"
    _assert_refused(tmp_path, [
        ('[normalization]\napply = "low"\nreason = "r"\nprecisions = ["fp8"]\n', r"precisions: expected"),
        ('[normalization]\napply = "low"\nreason = "r"\nprecisions = []\n', r"precisions: expected"),
        ('[normalization]\napply = "low"\nreason = "r"\nprecisions = "float16"\n', r"precisions: expected"),
        ('[normalization]\napply = "low"\nreason = "r"\nprecisions = [{a = 1}]\n', r"precisions: expected"),
        ('[normalization]\napply = "low"\nreason = "r"\nprecisions = ["float16", "float16"]\n',
         r"precisions: expected"),
        ('[normalization]\napply = "half"\nreason = "r"\n', r"apply must be one of"),
        ('[normalization]\nreason = "r"\n', r"apply must be one of .*\(missing\)"),
        ('[normalization]\napply = "low"\n', r"reason must be a non-empty string"),
        ('[normalization]\napply = "low"\nreason = "  "\n', r"reason must be a non-empty string"),
        ('[normalization]\napply = "low"\nreason = "r"\nwhere = "gpu"\n', r"where"),
        ('[normalization]\napply = "low"\nreason = "r"\nbackends = ["cuda"]\n', r"backends: expected an inline table"),
        ('[normalization]\napply = "low"\nreason = "r"\nprecisions = ["float16"]\nbackends = { bfloat16 = ["cuda"] }\n',
         r"backends.bfloat16: only a precision the policy is for"),
        ('[normalization]\napply = "low"\nreason = "r"\nbackends = { float16 = ["gpu"] }\n',
         r"backends.float16: expected a non-empty list"),
        ('normalization = "low"\n', r"\[normalization\] must be a table"),
    ])
    strict = tmp_path / "strict.toml"
    strict.write_text('schema_version = 1\n[normalization]\napply = "float32"\nreason = "bit-exact with TF"\n')
    layered = load_lists("default", context=CUDA, user_file=strict)
    assert (layered.normalization_apply, layered.normalization_reason) == ("float32", "bit-exact with TF")
    assert layered.as_dict() == load_lists("default", context=CUDA).as_dict()
    child = tmp_path / "child.toml"
    child.write_text('schema_version = 1\nextends = "tensorflow"\n[normalization]\napply = "low"\nreason = "mine"\n')
    assert load_lists(str(child), context=CUDA).normalization_apply == "low"
    assert load_lists(str(child), context=BF16).normalization_apply == "low"  # both by default
    # A table for one precision leaves the other as the layers below have it.
    bf16_only = tmp_path / "bf16.toml"
    bf16_only.write_text('schema_version = 1\n[normalization]\napply = "low"\nreason = "bf16 too"\n'
                         'precisions = ["bfloat16"]\n')
    assert load_lists("default", context=BF16, user_file=bf16_only).normalization_reason == "bf16 too"
    assert "as Keras's" in load_lists("default", context=CUDA, user_file=bf16_only).normalization_reason
    fenced = tmp_path / "fenced.toml"
    fenced.write_text('schema_version = 1\nextends = "tensorflow"\n[normalization]\napply = "fenced"\nreason = "f"\n')
    assert load_lists(str(fenced), context=BF16).normalization_apply == "fenced"


def test_bf16_clear_list_relation_from_spec():
    fp16 = load_lists("tensorflow", context=CUDA)
    bf16 = load_lists("tensorflow", context=BF16)
    assert bf16.clear == (fp16.clear - {"MaxPool3DGradGrad", "OneHot", "Size"}) | {
        "ResizeBilinear", "ScatterNd", "StatelessWhile", "While"}
    assert {"Mean", "Sum"} <= bf16.infer and {"Mean", "Sum"} <= fp16.deny


@pytest.mark.parametrize("context", [CUDA, CPU_EMULATION, FP16_ONEDNN, BF16])
def test_default_profile_only_moves_the_listed_ops(context):
    base = load_lists("tensorflow", context=context)
    default = load_lists("default", context=context)
    assert default.profile == "default" and base.profile == "tensorflow"
    # In float16 the logarithms too (their input chains stay float32: [float16.float32_inputs]).
    extra = DEFAULT_EXTRA_DENY | ({"Log", "Log1p"} if context.precision == "float16" else set())
    assert extra <= default.deny
    assert set(default.float32_inputs) == ({"Log", "Log1p"} if context.precision == "float16" else set())
    for category in CATEGORIES:
        expected = getattr(base, category) - extra
        if category == "deny":
            expected |= extra
        assert getattr(default, category) == expected, category
    assert default.origins["Softmax"] == "profile default"
    assert default.origins["MatMul"] == "profile tensorflow"
    assert default.reasons["MatMul"] == base.reasons["MatMul"]


def test_op_lists_helpers():
    got = load_lists("tensorflow", context=CUDA)
    assert got.category_of("MatMul") == "allow" and got.category_of("Exp") == "deny"
    assert got.category_of("Relu") == "clear" and got.category_of("Tanh") == "infer"
    assert got.category_of("NoSuchOp") is None
    d = got.as_dict()
    assert list(d) == list(CATEGORIES) and d["deny"] == sorted(d["deny"]) and "Exp" in d["deny"]
    json.dumps(d)
    assert isinstance(hash(got), int)
    with pytest.raises(TypeError):
        got.reasons["MatMul"] = "x"  # type: ignore[index]
    assert set(got.reasons) == set(got.origins) == got.allow | got.infer | got.deny | got.clear


def test_fallback_to_source_tree_when_package_missing(monkeypatch):
    monkeypatch.setattr(lists_mod, "_PACKAGE", "amp_rewrite._no_such_lists_package")
    # Under a non-editable install the module lives in site-packages, where no lists/ folder
    # sits next to it; point the fallback at this checkout's lists/ as a source tree would.
    monkeypatch.setattr(lists_mod, "_SOURCE_TREE_LISTS", LISTS_DIR)
    found = lists_mod._lists_dir()
    assert Path(str(found)).resolve() == LISTS_DIR.resolve()
    assert available_profiles() == ["default", "optimal", "tensorflow"]
    assert len(load_lists("tensorflow", context=CUDA, is_known_op=always_known).allow) == 39
    monkeypatch.setattr(lists_mod, "_SOURCE_TREE_LISTS", LISTS_DIR / "no_such_dir")
    with pytest.raises(ListError, match="packaged op lists are missing"):
        available_profiles()


def test_installed_layout_finds_package_data(tmp_path):
    # Mimic a non-editable install: lists/ is shipped as amp_rewrite/_lists.
    package = tmp_path / "site" / "amp_rewrite"
    (package / "plan").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "plan" / "__init__.py").write_text("")
    shutil.copy(REPO / "amp_rewrite" / "errors.py", package / "errors.py")
    for source in (REPO / "amp_rewrite" / "plan").glob("lists*.py"):
        shutil.copy(source, package / "plan" / source.name)
    shutil.copytree(LISTS_DIR, package / "_lists")
    code = (
        "from amp_rewrite.plan import lists as m\n"
        "print(m._lists_dir())\n"
        "print(m.available_profiles())\n"
        "ctx = m.ListContext('float16', 'cuda')\n"
        "print(len(m.load_lists('default', context=ctx, is_known_op=lambda op: True).deny))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")}, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    where, profiles, deny = proc.stdout.splitlines()
    assert Path(where).resolve() == (package / "_lists").resolve()
    assert profiles == "['default', 'optimal', 'tensorflow']" and deny == "18"


# ---------------------------------------------------------------------------------------------
# Loader errors
# ---------------------------------------------------------------------------------------------

HEADER = "schema_version = 1\nname = \"t\"\n"


@pytest.mark.parametrize(
    "body, pattern",
    [
        ("colour = 1\n", r"unknown key.*'colour'.*top level"),
        ("[float16.allowed]\nMatMul = 'x'\n", r"unknown key.*'allowed'.*\[float16\]"),
        ("[float32.allow]\nMatMul = 'x'\n", r"unknown key.*'float32'"),
        ("[float16.allow]\nMatMul = { reason = 'x', min_cudaa = 1 }\n", r"unknown key.*'min_cudaa'.*MatMul"),
        ("[float16.allow]\nMatMul = { reason = 'x', min_cuda = '9010' }\n", r"float16\.allow\.MatMul\.min_cuda"),
        ("[float16.allow]\nMatMul = { reason = 'x', min_cuda = true }\n", r"min_cuda: expected a non-negative"),
        ("[float16.allow]\nMatMul = { reason = 'x', backends = ['rocm'] }\n", r"MatMul\.backends"),
        ("[float16.allow]\nMatMul = { reason = 'x', backends = 'cuda' }\n", r"MatMul\.backends"),
        ("[float16.allow]\nMatMul = { reason = 'x', registered = 'no' }\n", r"MatMul\.registered"),
        ("[float16.allow]\nMatMul = { min_cuda = 1 }\n", r"MatMul: missing 'reason'"),
        ("[float16.allow]\nMatMul = 3\n", r"MatMul: expected a reason string"),
        ("[float16.allow]\nMatMul = ''\n", r"MatMul: the reason must be a non-empty string"),
        ("[float16.allow]\n'Mat Mul' = 'x'\n", r"'Mat Mul' is not a valid op name"),
        ("float16 = 3\n", r"\[float16\] must be a table"),
        ("[float16]\nallow = 3\n", r"\[float16.allow\] must be a table"),
        ("description = 3\n", r"'description' must be a non-empty string"),
        ("[float16.allow]\nMatMul = 'x'\n[float16.deny]\nMatMul = 'y'\n", r"MatMul is on two float16 lists.*allow and deny"),
    ],
)
def test_invalid_files_are_rejected(tmp_path, body, pattern):
    path = write(tmp_path, "bad.toml", HEADER + body)
    with pytest.raises(ListError, match=pattern) as info:
        load_lists(path, context=CUDA, is_known_op=always_known)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("version_line", ["schema_version = 2\n", "schema_version = true\n", ""])
def test_schema_version_must_be_1(tmp_path, version_line):
    path = write(tmp_path, "v.toml", version_line + "[float16.allow]\nMatMul = 'x'\n")
    with pytest.raises(ListError, match="schema_version must be 1"):
        load_lists(path, context=CUDA, is_known_op=always_known)


def test_bad_toml_names_the_file(tmp_path):
    path = write(tmp_path, "broken.toml", HEADER + "[float16.allow\nMatMul = 'x'\n")
    with pytest.raises(ListError, match="invalid TOML") as info:
        load_lists(path, context=CUDA, is_known_op=always_known)
    assert "broken.toml" in str(info.value)
    user = write(tmp_path, "user.toml", "schema_version = = 1\n")
    with pytest.raises(ListError, match=r"user\.toml: invalid TOML"):
        load_lists("tensorflow", context=CUDA, user_file=user, is_known_op=always_known)


def test_unknown_op_names_are_rejected_by_default_registry(tmp_path):
    path = write(tmp_path, "typo.toml", HEADER + "[float16.allow]\nMatMull = 'x'\nMatMul = 'y'\n"
                 "[bfloat16.clear]\nRelo = { reason = 'z', backends = ['onednn'] }\n")
    with pytest.raises(ListError) as info:
        load_lists(path, context=CUDA)  # default is_known_op: TensorFlow's op registry
    message = str(info.value)
    assert "MatMull" in message and "Relo" in message and "'MatMul'" not in message
    ok = write(tmp_path, "ok.toml", HEADER + "[float16.allow]\nMatMull = { reason = 'x', registered = false }\n")
    assert load_lists(ok, context=CUDA).allow == {"MatMull"}


def test_custom_is_known_op_is_used(tmp_path):
    path = write(tmp_path, "p.toml", HEADER + "[float16.allow]\nMatMul = 'x'\nConv2D = 'y'\n")
    with pytest.raises(ListError, match="Conv2D"):
        load_lists(path, context=CUDA, is_known_op=lambda op: op == "MatMul")


def test_unknown_op_in_edit_is_rejected():
    with pytest.raises(ListError, match=r"NoSuchOp \(environment .*DENYLIST_ADD\)"):
        load_lists("tensorflow", context=CUDA,
                   edits=[ListEdit("add", "deny", "NoSuchOp", f"environment {P}DENYLIST_ADD")])
    # Ops the files name (even unregistered ones) may be edited.
    got = load_lists("tensorflow", context=CUDA, edits=[ListEdit("remove", "allow", "Mha")])
    assert "Mha" not in got.allow and "MatMul" in got.allow


def test_unknown_profile_lists_available():
    with pytest.raises(ListError, match=r"unknown profile 'nope'.*default, optimal, tensorflow"):
        load_lists("nope", context=CUDA)
    with pytest.raises(ListError, match="list file not found"):
        load_lists("/no/such/profile.toml", context=CUDA)


def test_unknown_level_is_rejected():
    with pytest.raises(ListError, match=r"unknown level 'FAST'.*TENSOR_CORES_ONLY"):
        load_lists("tensorflow", context=CUDA, level="FAST")  # type: ignore[arg-type]
    with pytest.raises(ListError, match=r"LEVEL='fast'.*accepted values: DEFAULT, TENSOR_CORES_ONLY"):
        edits_from_environ({f"{P}LEVEL": "fast"})


def test_conflict_message_names_every_op_and_both_lists():
    edits = [ListEdit("add", "allow", "Exp"), ListEdit("add", "clear", "Tanh")]
    with pytest.raises(ListError) as info:
        load_lists("tensorflow", context=CUDA, edits=edits)
    message = str(info.value)
    assert "Exp is on allow (from argument) and deny (from profile tensorflow)" in message
    assert "Tanh is on infer (from profile tensorflow) and clear (from argument)" in message


def test_context_and_edit_validation():
    with pytest.raises(ListError, match="precision"):
        ListContext("float64", "cuda")  # type: ignore[arg-type]
    with pytest.raises(ListError, match="backend"):
        ListContext("float16", "rocm")  # type: ignore[arg-type]
    with pytest.raises(ListError, match="cuda_version"):
        ListContext("float16", "cuda", -1)
    with pytest.raises(ListError, match="action"):
        ListEdit("insert", "allow", "MatMul", "x")  # type: ignore[arg-type]
    with pytest.raises(ListError, match="category"):
        ListEdit("add", "gray", "MatMul", "x")  # type: ignore[arg-type]
    with pytest.raises(ListError, match="invalid op name"):
        ListEdit("add", "allow", "", "x")


# ---------------------------------------------------------------------------------------------
# Layering
# ---------------------------------------------------------------------------------------------


def test_user_file_without_extends_is_layered_on_profile(tmp_path):
    user = write(tmp_path, "user.toml", HEADER + """
        [float16.allow]
        Softmax = "my model is fine with fp16 softmax"
        [float16.clear]
        Exp = { reason = "gated clear", backends = ["onednn"] }
        [float16.remove]
        Relu = "let it be"
        [bfloat16.infer]
        Cumsum = "ok in bf16"
    """)
    got = load_lists("default", context=CUDA, user_file=user)
    assert "Softmax" in got.allow and "Softmax" not in got.deny
    assert got.reasons["Softmax"] == "my model is fine with fp16 softmax"
    assert got.origins["Softmax"] == f"file {user.resolve()}"
    # Moved off deny even though the gate keeps it out of this backend's lists.
    assert got.category_of("Exp") is None
    assert got.category_of("Relu") is None
    assert got.profile == f"default + file {user.resolve()}"
    onednn = load_lists("default", context=FP16_ONEDNN, user_file=user)
    assert "Exp" in onednn.clear
    bf16 = load_lists("default", context=BF16, user_file=user)
    assert "Cumsum" in bf16.infer and "Cumsum" not in bf16.deny and "Softmax" in bf16.deny


def test_user_file_with_extends_replaces_profile(tmp_path):
    user = write(tmp_path, "user.toml", HEADER + 'extends = "tensorflow"\n[float16.deny]\nTanh = "x"\n')
    got = load_lists("default", context=CUDA, user_file=user)
    assert "Softmax" in got.infer  # from tensorflow, not default
    assert "Tanh" in got.deny and "Tanh" not in got.infer


def test_path_profile_with_relative_extends_chain(tmp_path):
    write(tmp_path, "base.toml", HEADER + 'extends = "tensorflow"\n[float16.allow]\nSoftmax = "b"\n')
    (tmp_path / "sub").mkdir()
    child = write(tmp_path, "sub/child.toml", HEADER + 'extends = "../base.toml"\n[float16.deny]\nSoftmax = "c"\n')
    got = load_lists(child, context=CUDA)
    assert "Softmax" in got.deny and got.reasons["Softmax"] == "c"
    assert got.origins["Softmax"] == f"file {child.resolve()}"


def test_extends_cycle_and_bad_remove(tmp_path):
    write(tmp_path, "a.toml", HEADER + 'extends = "b.toml"\n')
    b = write(tmp_path, "b.toml", HEADER + 'extends = "a.toml"\n')
    with pytest.raises(ListError, match="cycle"):
        load_lists(b, context=CUDA)
    root = write(tmp_path, "root.toml", HEADER + "[float16.remove]\nMatMul = 'x'\n")
    with pytest.raises(ListError, match=r"\[float16.remove\] is only allowed"):
        load_lists(root, context=CUDA, is_known_op=always_known)
    absent = write(tmp_path, "absent.toml", HEADER + "[float16.remove]\nCumsum = 'x'\n")
    with pytest.raises(ListError, match=r"on no list of the parent: Cumsum"):
        load_lists("tensorflow", context=CUDA, user_file=absent)
    both = write(tmp_path, "both.toml", HEADER + "[float16.remove]\nExp = 'x'\n[float16.allow]\nExp = 'y'\n")
    with pytest.raises(ListError, match=r"both removed and listed.*Exp"):
        load_lists("tensorflow", context=CUDA, user_file=both)


# ---------------------------------------------------------------------------------------------
# Edits and levels
# ---------------------------------------------------------------------------------------------


def test_edits_apply_in_order():
    add_then_remove = [ListEdit("add", "allow", "Cumsum"), ListEdit("remove", "allow", "Cumsum")]
    remove_then_add = list(reversed(add_then_remove))
    assert "Cumsum" not in load_lists("tensorflow", context=CUDA, edits=add_then_remove).allow
    got = load_lists("tensorflow", context=CUDA, edits=remove_then_add)
    assert "Cumsum" in got.allow
    assert got.reasons["Cumsum"] == "added by argument" and got.origins["Cumsum"] == "argument"
    # Re-adding an op keeps its entry's reason; removing an absent op is no error.
    again = load_lists("tensorflow", context=CUDA,
                       edits=[ListEdit("add", "allow", "MatMul", "x"), ListEdit("remove", "deny", "Tanh")])
    assert again.origins["MatMul"] == "profile tensorflow" and "Tanh" in again.infer
    # Moving an op needs both edits, like TensorFlow.
    moved = load_lists("tensorflow", context=CUDA,
                       edits=[ListEdit("remove", "deny", "Exp"), ListEdit("add", "infer", "Exp")])
    assert moved.category_of("Exp") == "infer"


def test_tensor_cores_only_empties_lists_only_for_fp16_cuda():
    edits = [ListEdit("add", "deny", "Exp"), ListEdit("add", "allow", "Cumsum")]
    got = load_lists("tensorflow", context=CUDA, level="TENSOR_CORES_ONLY", edits=edits)
    assert not got.deny and not got.infer and not got.clear
    assert got.allow == load_lists("tensorflow", context=CUDA).allow | {"Cumsum"}
    # Applies to TF's CPU-emulation mode too (it uses the GPU lists, use_cuda).
    assert not load_lists("tensorflow", context=CPU_EMULATION, level="TENSOR_CORES_ONLY").clear
    for context in (FP16_ONEDNN, BF16):
        assert load_lists("tensorflow", context=context, level="TENSOR_CORES_ONLY") == \
            load_lists("tensorflow", context=context)


def test_treat_infer_as_deny_applies_after_edits():
    base = load_lists("tensorflow", context=CUDA)
    got = load_lists("tensorflow", context=CUDA, level="TREAT_INFER_AS_DENY",
                     edits=[ListEdit("add", "infer", "Cumsum"), ListEdit("remove", "infer", "Tanh")])
    assert not got.infer
    assert got.deny == base.deny | (base.infer - {"Tanh"}) | {"Cumsum"}
    assert got.category_of("Tanh") is None
    assert "TREAT_INFER_AS_DENY" in got.reasons["Mul"]


def test_unsafe_force_all_leaves_lists_alone():
    assert sets(load_lists("default", context=CUDA, level="UNSAFE_FORCE_ALL")) == \
        sets(load_lists("default", context=CUDA))


# ---------------------------------------------------------------------------------------------
# Environment parsing
# ---------------------------------------------------------------------------------------------


def test_edits_from_environ_order_and_origins(caplog):
    environ = {
        f"{P}BLACKLIST_REMOVE": "B4",
        f"{P}BLACKLIST_ADD": "B3",
        f"{P}DENYLIST_REMOVE": "B2",
        f"{P}DENYLIST_ADD": "B1",
        f"{P}CLEARLIST_ADD": "C1",
        f"{P}WHITELIST_ADD": "A3",
        f"{P}ALLOWLIST_REMOVE": "A2",
        f"{P}ALLOWLIST_ADD": " A1 , A1b,,",
        f"{P}GRAYLIST_REMOVE": "I4",
        f"{P}INFERLIST_ADD": "I1",
        "UNRELATED": "X",
    }
    with caplog.at_level(logging.WARNING, logger="amp_rewrite.plan.lists"):
        edits, level = edits_from_environ(environ)
    assert level is None
    assert [(e.action, e.category, e.op) for e in edits] == [
        ("add", "allow", "A1"), ("add", "allow", "A1b"), ("remove", "allow", "A2"), ("add", "allow", "A3"),
        ("add", "infer", "I1"), ("remove", "infer", "I4"),
        ("add", "deny", "B1"), ("remove", "deny", "B2"), ("add", "deny", "B3"), ("remove", "deny", "B4"),
        ("add", "clear", "C1"),
    ]
    assert edits[3].origin == f"environment {P}WHITELIST_ADD"
    warned = {r.getMessage().split()[0] for r in caplog.records}
    assert warned == {f"{P}WHITELIST_ADD", f"{P}GRAYLIST_REMOVE", f"{P}BLACKLIST_ADD", f"{P}BLACKLIST_REMOVE"}


def test_edits_from_environ_levels_and_empty_values(caplog):
    with caplog.at_level(logging.WARNING, logger="amp_rewrite.plan.lists"):
        assert edits_from_environ({}) == ([], None)
    assert not caplog.records
    assert edits_from_environ({f"{P}LEVEL": ""}) == ([], None)
    assert edits_from_environ({f"{P}LEVEL": " treat_infer_as_deny "})[1] == "TREAT_INFER_AS_DENY"
    assert edits_from_environ({f"{P}LEVEL": "Unsafe_Force_All"})[1] == "UNSAFE_FORCE_ALL"
    assert edits_from_environ({f"{P}DENYLIST_ADD": " , ,"}) == ([], None)
    # clear has no legacy alias; the only legacy names are WHITE/GRAY/BLACK.
    assert edits_from_environ({f"{P}CLEARLIST_ADD": "Tanh", f"{P}REDLIST_ADD": "Exp"})[0] == [
        ListEdit("add", "clear", "Tanh", f"environment {P}CLEARLIST_ADD")]


def test_bounded_entries_are_validated_inherited_and_can_be_turned_off(tmp_path):
    """``[float16.bounded]``: a deny-list op inferred where its input is proven at most
    ``input_max`` (amp_rewrite.plan.ranges).  The default profile has Exp and Expm1 in float16,
    and in bfloat16 on a GPU (``backends``); TensorFlow's own lists have none; only ops left on
    the deny list keep an entry."""
    default = load_lists("default", context=CUDA)
    assert set(default.bounded) == {"Exp", "Expm1"} and default.bounded["Exp"][0] == 0.0
    assert "Exp" in default.deny  # not an op move: unproven Exps stay denied
    assert load_lists("optimal", context=CUDA).bounded == default.bounded
    assert not load_lists("tensorflow", context=CUDA).bounded
    assert not load_lists("default", context=BF16).bounded  # bfloat16 on a CPU: oneDNN
    gpu_bf16 = load_lists("default", context=ListContext("bfloat16", "cuda"))
    assert set(gpu_bf16.bounded) == {"Exp", "Expm1"} and "rounding error" in gpu_bf16.bounded["Exp"][1]
    # A later layer's entry for another backend overrides the parent's, as identity entries do.
    cpu_only = tmp_path / "cpu_only.toml"
    cpu_only.write_text('schema_version = 1\n[bfloat16.bounded]\n'
                        'Exp = { input_max = 0.0, reason = "oneDNN only", backends = ["onednn"] }\n')
    assert set(load_lists("default", context=ListContext("bfloat16", "cuda"), user_file=cpu_only).bounded) == {"Expm1"}
    assert load_lists("default", context=BF16, user_file=cpu_only).bounded["Exp"] == (0.0, "oneDNN only")
    assert not load_lists("default", context=CUDA, level="TREAT_INFER_AS_DENY").bounded
    assert "Exp" not in load_lists("default", context=CUDA, edits=[ListEdit("remove", "deny", "Exp")]).bounded
    _assert_refused(tmp_path, [
        ('[float16.bounded]\nExp = "reason"\n', r"expected an inline table"),
        ('[float16.bounded]\nExp = { reason = "r" }\n', r"input_max: expected a number .*\(missing\)"),
        ('[float16.bounded]\nExp = { input_max = "11", reason = "r" }\n', r"input_max: expected a number"),
        ('[float16.bounded]\nExp = { input_max = true, reason = "r" }\n', r"input_max: expected a number"),
        ('[float16.bounded]\nExp = { input_max = inf, reason = "r" }\n', r"input_max: expected a number"),
        ('[float16.bounded]\nExp = { input_max = nan, reason = "r" }\n', r"input_max: expected a number"),
        ('[float16.bounded]\nExp = { input_max = 1.0 }\n', r"reason must be a non-empty string"),
        ('[float16.bounded]\nExp = { input_max = 1.0, reason = "r", when = "gpu" }\n', r"when"),
        ('[float16.bounded]\nExp = { input_max = 1.0, reason = "r", backends = ["tpu"] }\n', r"backends"),
        ('[float16.bounded]\n"Exp!" = { input_max = 1.0, reason = "r" }\n', r"not a valid op name"),
        ('[float16.bounded]\nNoSuchOpAnywhere = { input_max = 1.0, reason = "r" }\n', r"unknown op name"),
        ('tf_version = "2.21"\n[versions."2.20".float16.bounded]\nExp = { input_max = 1.0, reason = "r" }\n',
         r"not versioned"),
    ])
    # -inf turns an entry off, and so does any later statement about the op: a user file that
    # lists it (on deny again: it means it), or an edit naming it.
    off = tmp_path / "off.toml"
    off.write_text('schema_version = 1\n[float16.bounded]\nExp = { input_max = -inf, reason = "always float32" }\n')
    layered = load_lists("default", context=CUDA, user_file=off)
    assert "Exp" not in layered.bounded and layered.bounded["Expm1"] == default.bounded["Expm1"]
    restated = tmp_path / "restated.toml"
    restated.write_text('schema_version = 1\n[float16.deny]\nExp = "mine: always float32"\n')
    assert set(load_lists("default", context=CUDA, user_file=restated).bounded) == {"Expm1"}
    assert set(load_lists("default", context=CUDA, edits=[ListEdit("add", "deny", "Exp")]).bounded) == {"Expm1"}
    mine = tmp_path / "mine.toml"
    mine.write_text('schema_version = 1\n[float16.bounded]\nExp = { input_max = -1.0, reason = "mine" }\n')
    assert load_lists("default", context=CUDA, user_file=mine).bounded["Exp"] == (-1.0, "mine")


def test_the_planner_a_rewrite_runs_is_the_options_or_the_lists(tmp_path: Path) -> None:
    """``resolve_planner`` says which planner ``rewrite_graph_def`` runs with the same options
    (the training path asks before rewriting, to price a step the optimal planner will check):
    ``planner`` where given, else the profile's or the list file's.  Bad options raise the
    rewrite's own errors."""
    from amp_rewrite.api import resolve_planner

    assert resolve_planner(target="gpu:9.0", use_env=False) == "greedy"
    assert resolve_planner(lists="optimal", target="gpu:9.0", use_env=False) == "optimal"
    assert resolve_planner(lists="optimal", planner="min-casts", target="gpu:9.0") == "min-casts"
    custom = tmp_path / "mine.toml"
    custom.write_text('schema_version = 1\nextends = "default"\nplanner = "optimal"\n')
    assert resolve_planner(lists=str(custom), target="gpu:9.0", use_env=False) == "optimal"
    with pytest.raises(ListError):
        resolve_planner(lists="no-such-profile", target="gpu:9.0", use_env=False)
    from amp_rewrite.errors import AmpRewriteError

    with pytest.raises(AmpRewriteError, match="planner"):
        resolve_planner(planner=3)  # type: ignore[arg-type]
    with pytest.raises(AmpRewriteError, match="planner must be one of"):
        resolve_planner(planner="fastest", target="gpu:9.0")
    with pytest.raises(ListError):  # the lists are resolved as the rewrite resolves them, planner given or not
        resolve_planner(planner="optimal", lists="no-such-profile", target="gpu:9.0", use_env=False)


def test_a_misspelled_rewrite_variable_is_warned_about_once(caplog):
    """``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_ALOWLIST_ADD`` is not a variable TensorFlow or
    amp_rewrite reads: the op meant to move stays where it was.  One WARNING (per process)
    names the variable meant; known variables get none."""
    from amp_rewrite.plan import lists_environ

    typo = "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_ALOWLIST_ADD"
    lists_environ._warned_unknown.discard(typo)
    environ = {typo: "Tanh", "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_DENYLIST_ADD": "Exp", "PATH": "/bin"}
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        for _ in range(2):
            edits, _level = lists_environ.edits_from_environ(environ)
    warned = [r.getMessage() for r in caplog.records if typo in r.getMessage()]
    assert len(warned) == 1 and "did you mean TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_ALLOWLIST_ADD" in warned[0]
    assert [(e.category, e.op) for e in edits] == [("deny", "Exp")]
    assert not [r for r in caplog.records if "DENYLIST_ADD is not" in r.getMessage()]
