"""TensorFlow's own auto_mixed_precision Grappler pass, run offline as a reference ("oracle").

The standard Linux ``tensorflow`` wheel is a CUDA build: GPU kernels are registered even with no
GPU or driver present, so the CUDA mode of the pass can run on a CPU-only machine against a
*virtual cluster* that declares fake GPUs (design doc §0.3).  :func:`tf_amp_rewrite` builds

* a ``MetaGraphDef`` holding a copy of the GraphDef (with its function library) and the fetch
  node names in collection ``train_op`` (this is what Grappler's item builder turns into the
  fetch / nodes-to-preserve set),
* a ``ConfigProto`` whose rewrite options run only the AMP optimizer, once
  (``meta_optimizer_iterations=ONE``, ``min_graph_nodes=-1``),
* a ``tensorflow.python.grappler.cluster.Cluster`` of ``NamedDevice`` protos: one GPU per entry
  of ``gpus`` (``environment = {architecture, cuda, cudnn}``) plus ``CPU:0``,

and returns ``tf_optimizer.OptimizeGraph``'s GraphDef.  Nodes with an empty device string are
placed by Grappler's virtual placer on the default device: the GPU with the smallest id if the
cluster has one, else ``CPU:0``.

Modes:

* ``"cuda"``: by-name optimizer ``auto_mixed_precision`` (CUDA mode, target ``DT_HALF``).
* ``"bf16"``: by-name ``auto_mixed_precision_onednn_bfloat16`` (target ``DT_BFLOAT16``; this
  wheel is a oneDNN build, so it runs).
* ``"fp16_cpu"``: there is no by-name entry for the oneDNN float16 mode, so the toggle
  ``auto_mixed_precision = ON`` is used with every other default optimizer turned OFF
  (``disable_model_pruning`` too); the meta optimizer then runs FP16_CPU mode *and then* CUDA
  mode (the latter is a no-op without GPUs in the cluster).
* ``"cpu"`` (extra): by-name ``auto_mixed_precision_cpu`` (fp16 emulation on CPU by default).

``gpus=None`` (the default) means ``("8.0",)`` in ``"cuda"`` mode and no GPU in the CPU modes
(a CPU-only cluster, so empty-device nodes land on ``CPU:0``).  Pass ``gpus`` explicitly to
override (e.g. ``gpus=("8.0",)`` in ``"bf16"`` mode places empty-device nodes on the GPU, where
BF16 mode does not process them).

Function libraries — observed with TF 2.21.0 on the corpus (``tests/corpus.py``):

* The returned GraphDef carries a function library, and **the functions reachable from the main
  graph are rewritten too**: the meta optimizer optimizes each reachable, non-parametrized
  function as a separate ``GrapplerFunctionItem`` with the same optimizer list (its ``_Arg`` /
  ``_Retval`` boundaries stay float32, casts are inserted next to them, signatures never
  change).  In ``rnn/training`` the ``While``/``StatelessWhile`` bodies
  ``rnn_1_{lstm,gru}_1_while_body_NNN_rewritten`` (forward) and ``..._body_NNN_grad_NNN``
  (backward) get their MatMuls etc. converted; in ``rnn/inference_v2`` the two
  ``..._while_body_frozen_NNN`` functions.  The cond functions (no allowlisted op) come back
  unchanged.
* Functions **not** reachable from the main graph are **deleted** from the returned library
  ("Deleted N unreachable functions"), even when AMP changes nothing (``rnn/training``: 12
  functions in, 8 out; the four non-``_rewritten`` originals are gone).
* The ``While`` nodes of the main graph are boundaries (their ``T`` list stays float), but a
  TensorList whose handle goes *through* a ``While`` (``TensorListReserve -> While ->
  TensorListStack``) is still painted as one cluster in the main graph while the body function,
  optimized separately, keeps ``element_dtype: float``.  TF's own output for ``rnn/training`` and
  ``rnn/inference_v2`` therefore fails to execute ("Invalid data types; op elements float but
  list elements half" in ``TensorListGetItem``/``SetItem``).  The lowered ``rnn/inference``
  (v1 frames, no functions) runs fine.

Other observations (same TF build, this machine):

* Even when AMP changes nothing, the output is not byte-identical to the input: the meta
  optimizer topologically sorts the graph, Grappler's item builder re-encodes constant tensors
  (``tensor_content`` <-> repeated ``*_val``, zeros dropped) and reassigns colocation groups
  (``_class``).  Compare with :func:`same_nodes` / :func:`rewritten_functions`, which ignore
  node order, tensor encoding and ``_class``.
* ``mode="fp16_cpu"`` is a no-op here: TF logs "No support for
  auto_mixed_precision_onednn_float16 graph optimizer on CPU" (this CPU has no AMX-FP16 /
  AVX-NE-CONVERT), then CUDA mode finds no GPU.
* ``mode="cpu"`` (fp16 emulation) raises ``IndexError: absl::container_internal::raw_hash_map<>
  ::at`` from C++ on the control-flow-v1 graph ``while_v1`` (emulation needs a topologically
  ordered graph, design doc §6.4 #10); it works on the acyclic graphs.
* ``mode="bf16"`` works (oneDNN build).  With ``gpus=("8.0",)`` added in bf16 mode nothing is
  converted: empty-device nodes are then placed on the GPU, which BF16 mode does not process.

Environment variables (``env=``): TF reads ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_*`` variables
once per process and caches them: the value seen by the first AMP call of the process sticks
(verified with ``..._IGNORE_PERFORMANCE=1`` and a "6.1" GPU: honoured when passed on the first
call, ignored after an earlier call without it, and still in force on later calls without it).
Run such cases in a subprocess.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Iterator, Literal, Mapping, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tensorflow.core.framework import types_pb2  # noqa: E402
from tensorflow.core.framework.graph_pb2 import GraphDef  # noqa: E402
from tensorflow.core.protobuf import (  # noqa: E402
    config_pb2,
    device_properties_pb2,
    meta_graph_pb2,
    rewriter_config_pb2,
)
from tensorflow.python.grappler import cluster as gcluster  # noqa: E402
from tensorflow.python.grappler import tf_optimizer  # noqa: E402

__all__ = [
    "tf_amp_rewrite",
    "converted_type_attrs",
    "amp_cast_count",
    "rewritten_functions",
    "same_nodes",
    "IGNORED_ATTRS",
    "make_cluster",
    "GPU_NAME",
    "CPU_NAME",
    "DT_FLOAT",
    "DT_HALF",
    "DT_BFLOAT16",
]

DT_FLOAT = types_pb2.DT_FLOAT
DT_HALF = types_pb2.DT_HALF
DT_BFLOAT16 = types_pb2.DT_BFLOAT16

GPU_NAME = "/job:localhost/replica:0/task:0/device:GPU:{}"
CPU_NAME = "/job:localhost/replica:0/task:0/device:CPU:0"

Mode = Literal["cuda", "bf16", "fp16_cpu", "cpu"]

_RC = rewriter_config_pb2.RewriterConfig

# Toggle fields of RewriterConfig that name default-pipeline optimizers (turned OFF for fp16_cpu).
_DEFAULT_TOGGLES = (
    "layout_optimizer",
    "constant_folding",
    "shape_optimization",
    "remapping",
    "common_subgraph_elimination",
    "arithmetic_optimization",
    "dependency_optimization",
    "loop_optimization",
    "function_optimization",
    "debug_stripper",
    "scoped_allocator_optimization",
    "pin_to_host_optimization",
    "implementation_selector",
    "auto_mixed_precision_mkl",
    "auto_mixed_precision_onednn_bfloat16",
    "auto_mixed_precision_cpu",
    "use_plugin_optimizers",
    "experimental_conditional_code_motion",
)


def make_cluster(gpus: Sequence[str], *, cuda: str = "12090", cudnn: str = "91000",
                 cpu: bool = True) -> gcluster.Cluster:
    """A virtual Grappler cluster: ``GPU:i`` with ``architecture=gpus[i]`` (+ cuda/cudnn), then
    ``CPU:0``."""
    devices = []
    for i, arch in enumerate(gpus):
        props = device_properties_pb2.DeviceProperties(
            type="GPU",
            vendor="NVIDIA",
            environment={"architecture": str(arch), "cuda": str(cuda), "cudnn": str(cudnn)},
        )
        devices.append(device_properties_pb2.NamedDevice(name=GPU_NAME.format(i), properties=props))
    if cpu:
        devices.append(
            device_properties_pb2.NamedDevice(
                name=CPU_NAME, properties=device_properties_pb2.DeviceProperties(type="CPU")
            )
        )
    return gcluster.Cluster(devices=devices)


def _config(mode: Mode, fail_on_optimizer_errors: bool, tfg: bool = True) -> config_pb2.ConfigProto:
    config = config_pb2.ConfigProto()
    ro = config.graph_options.rewrite_options
    ro.meta_optimizer_iterations = _RC.ONE
    ro.min_graph_nodes = -1
    ro.fail_on_optimizer_errors = fail_on_optimizer_errors
    if not tfg:
        ro.disable_tfg_optimizer = True
    if mode == "cuda":
        ro.optimizers.append("auto_mixed_precision")
    elif mode == "bf16":
        ro.optimizers.append("auto_mixed_precision_onednn_bfloat16")
    elif mode == "cpu":
        ro.optimizers.append("auto_mixed_precision_cpu")
    elif mode == "fp16_cpu":
        for name in _DEFAULT_TOGGLES:
            setattr(ro, name, _RC.OFF)
        ro.disable_model_pruning = True
        ro.disable_tfg_optimizer = True
        ro.memory_optimization = _RC.NO_MEM_OPT
        ro.auto_mixed_precision = _RC.ON
    else:
        raise ValueError(f"unknown mode {mode!r}")
    return config


@contextlib.contextmanager
def _environ(env: Mapping[str, str] | None) -> Iterator[None]:
    if not env:
        yield
        return
    saved = {k: os.environ.get(k) for k in env}
    try:
        os.environ.update({k: str(v) for k, v in env.items()})
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@functools.cache
def onednn_bf16_pass_available() -> bool:
    """Whether this process's TensorFlow runs ``auto_mixed_precision_onednn_bfloat16``.

    The meta optimizer registers that pass only while oneDNN is on (``TF_ENABLE_ONEDNN_OPTS``,
    read once when TensorFlow loads; by default on only on CPUs with AVX512-VNNI/BF16 or AMX).
    Otherwise it logs "Can't register an optimizer by name" and returns the graph unchanged,
    which a parity test would misread as TensorFlow converting nothing.  Probed on a one-MatMul
    graph, which the pass always converts.
    """
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 8], name="x")
        tf.identity(tf.linalg.matmul(x, x, name="mm"), name="y")
    after = tf_amp_rewrite(graph.as_graph_def(), ["y"], mode="bf16", _probe=True)
    return any(n.op == "Cast" for n in after.node)


def require_onednn_bf16() -> None:
    """Fails the calling test when TensorFlow's oneDNN bfloat16 pass is missing (a TensorFlow
    that renamed or changed the pass, a build without oneDNN): a missing oracle would
    otherwise read as TensorFlow converting nothing.  ``tests/conftest.py`` turns oneDNN on."""
    if onednn_bf16_pass_available():
        return
    import pytest

    pytest.fail("TensorFlow's auto_mixed_precision_onednn_bfloat16 pass did not convert a lone MatMul "
                f"with TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS')!r}: the oracle for "
                "the bf16 parity tests is missing or changed in this TensorFlow", pytrace=False)


def tf_amp_rewrite(
    graph_def: GraphDef,
    fetches: Sequence[str],
    *,
    gpus: Sequence[str] | None = None,
    cuda: str = "12090",
    cudnn: str = "91000",
    mode: Mode = "cuda",
    env: Mapping[str, str] | None = None,
    fail_on_optimizer_errors: bool = False,
    tfg: bool = True,
    _probe: bool = False,
) -> GraphDef:
    """Runs TF's real AMP pass on a copy of ``graph_def`` and returns the optimized GraphDef.

    ``fetches``: node names (a ``:0`` suffix is accepted) that Grappler must preserve.
    ``gpus``: compute capabilities of the fake GPUs (``None``: ``("8.0",)`` for ``"cuda"``,
    none for the CPU modes).  ``env``: environment variables set for the duration of the call
    (``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_*``).  ``fail_on_optimizer_errors``: raise instead
    of TF's default (log the error and keep the unoptimized graph).  ``tfg=False`` skips
    Grappler's MLIR (TFG) optimizer, which runs after the pass and rejects a graph whose loop
    variables no longer match the loop's functions (KNOWN_DIFFERENCES.md KD-6): the pass's
    own output is returned as it painted it.  The input is not mutated.
    In ``"bf16"`` mode the calling test fails when the pass is not registered
    (:func:`require_onednn_bf16`).
    """
    if mode == "bf16" and not _probe:
        require_onednn_bf16()
    if gpus is None:
        gpus = ("8.0",) if mode == "cuda" else ()
    if isinstance(gpus, str):
        gpus = (gpus,)
    mg = meta_graph_pb2.MetaGraphDef()
    mg.graph_def.CopyFrom(graph_def)  # copy: the caller's proto is never touched
    train_op = mg.collection_def["train_op"].node_list.value
    for f in fetches:
        train_op.append(f)
    config = _config(mode, fail_on_optimizer_errors, tfg)
    cluster = make_cluster(tuple(gpus), cuda=cuda, cudnn=cudnn)
    with _environ(env):
        out = tf_optimizer.OptimizeGraph(config, mg, verbose=False, cluster=cluster)
    result = GraphDef()
    result.CopyFrom(out)
    return result


# ----------------------------------------------------------------------------------------
# Comparison helpers


def _scopes(gd: GraphDef) -> dict[str, dict[str, object]]:
    """scope -> {node name -> NodeDef}; scope "" is the main graph, else a function name."""
    scopes: dict[str, dict[str, object]] = {"": {n.name: n for n in gd.node}}
    for f in gd.library.function:
        scopes[f.signature.name] = {n.name: n for n in f.node_def}
    return scopes


def converted_type_attrs(before: GraphDef, after: GraphDef, *,
                         to_dtype: int = DT_HALF) -> set[tuple[str, str, str]]:
    """``(scope, node, attr)`` for every type attr that is ``DT_FLOAT`` in ``before`` and
    ``to_dtype`` in ``after``, over nodes present in both (matched by name within the main
    graph, scope ``""``, or within the same-named FunctionDef).  list(type) attrs are reported
    per element as ``"Tin[2]"``."""
    out: set[tuple[str, str, str]] = set()
    b_scopes, a_scopes = _scopes(before), _scopes(after)
    for scope, b_nodes in b_scopes.items():
        a_nodes = a_scopes.get(scope)
        if a_nodes is None:
            continue
        for name, b in b_nodes.items():
            a = a_nodes.get(name)
            if a is None:
                continue
            for key, bv in b.attr.items():
                if key not in a.attr:
                    continue
                av = a.attr[key]
                kind = bv.WhichOneof("value")
                if kind == "type":
                    if av.WhichOneof("value") == "type" and bv.type == DT_FLOAT and av.type == to_dtype:
                        out.add((scope, name, key))
                elif kind == "list" and len(bv.list.type) and av.WhichOneof("value") == "list":
                    for i, (bt, at) in enumerate(zip(bv.list.type, av.list.type)):
                        if bt == DT_FLOAT and at == to_dtype:
                            out.add((scope, name, f"{key}[{i}]"))
    return out


def amp_cast_count(before: GraphDef, after: GraphDef) -> int:
    """Number of ``Cast`` nodes in ``after`` (main graph and every function body) whose names
    do not exist in the same scope of ``before``."""
    b_scopes = _scopes(before)
    count = 0
    for scope, nodes in _scopes(after).items():
        known = b_scopes.get(scope, {})
        count += sum(1 for name, n in nodes.items() if n.op == "Cast" and name not in known)
    return count


def _attr_key(v) -> tuple:
    if v.WhichOneof("value") == "tensor":
        # Grappler re-encodes constant tensors (tensor_content <-> repeated *_val, trailing
        # zeros dropped): compare decoded values instead of the encoding.
        from tensorflow.python.framework import tensor_util

        arr = tensor_util.MakeNdarray(v.tensor)
        return ("tensor", int(v.tensor.dtype), arr.shape, arr.tobytes())
    return ("attr", v.SerializeToString(deterministic=True))


# Attrs rewritten by Grappler's item construction itself, whatever the optimizers do: colocation
# groups (`_class: ["loc:@..."]`) are re-assigned to a canonical member of each group.
IGNORED_ATTRS = frozenset({"_class"})


def _node_key(n) -> tuple:
    """Encoding-insensitive identity of a NodeDef (name, op, inputs, device, attrs other than
    :data:`IGNORED_ATTRS`)."""
    return (
        n.name,
        n.op,
        tuple(n.input),
        n.device,
        tuple(sorted((k, _attr_key(v)) for k, v in n.attr.items() if k not in IGNORED_ATTRS)),
        n.experimental_debug_info.SerializeToString(deterministic=True),
    )


def _function_fingerprint(f) -> tuple:
    """Order-insensitive view of a FunctionDef (signature, attrs, body node set, returns)."""
    return (
        f.signature.SerializeToString(deterministic=True),
        tuple(sorted((k, v.SerializeToString(deterministic=True)) for k, v in f.attr.items())),
        tuple(sorted(_node_key(n) for n in f.node_def)),
        tuple(sorted(f.ret.items())),
        tuple(sorted(f.control_ret.items())),
    )


def same_nodes(a: GraphDef, b: GraphDef) -> bool:
    """True iff the main graphs hold the same set of NodeDefs (node order and the encoding of
    constant tensors ignored)."""
    return sorted(_node_key(n) for n in a.node) == sorted(_node_key(n) for n in b.node)


def rewritten_functions(before: GraphDef, after: GraphDef) -> list[str]:
    """Names of the functions of ``after`` that are new or whose signature / body node set /
    returns differ from ``before`` (node order inside a body is ignored)."""
    b = {f.signature.name: f for f in before.library.function}
    changed = []
    for f in after.library.function:
        old = b.get(f.signature.name)
        if old is None or _function_fingerprint(old) != _function_fingerprint(f):
            changed.append(f.signature.name)
    return sorted(changed)
