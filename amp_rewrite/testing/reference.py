"""TensorFlow's own ``auto_mixed_precision`` Grappler pass, run offline, as a reference.

The Linux TensorFlow wheel registers its GPU kernels even without a GPU, so the pass runs on
a CPU-only machine against a *virtual cluster* that declares GPUs of the target's compute
capabilities (see ``shared/design/grappler_amp.md`` §0.3).  :func:`tensorflow_reference`
returns TensorFlow's rewrite of a GraphDef, for :func:`~amp_rewrite.testing.check_parity`.
Compare it with ``rewrite_graph_def(..., lists="tensorflow", functions="reachable",
tensorflow_bugs=True)``, which reproduces TensorFlow 2.21 exactly.
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["tensorflow_reference"]


def tensorflow_reference(graph_def: Any, fetches: Sequence[str], *, target: str = "gpu:8.0",
                         precision: str = "float16", cuda: str = "12090", cudnn: str = "91000") -> Any:
    """TensorFlow's rewrite of ``graph_def`` with ``fetches`` preserved.

    ``target``/``precision``: ``gpu:X.Y[,X.Y...]`` with ``float16`` (Grappler's CUDA mode), or
    ``cpu`` with ``bfloat16`` (its oneDNN bfloat16 mode).  Other combinations have no
    TensorFlow pass and raise ``ValueError``.  The graph is the pass's output as it painted it,
    even where that cannot run (KNOWN_DIFFERENCES.md).
    """
    from tensorflow.core.framework.graph_pb2 import GraphDef
    from tensorflow.core.protobuf import config_pb2, device_properties_pb2, meta_graph_pb2, rewriter_config_pb2
    from tensorflow.python.grappler import cluster as gcluster
    from tensorflow.python.grappler import tf_optimizer

    text = target.strip().lower()
    devices = []
    if text.startswith("gpu:") and precision == "float16":
        optimizer = "auto_mixed_precision"
        for i, cap in enumerate(c.strip() for c in text[4:].split(",") if c.strip()):
            props = device_properties_pb2.DeviceProperties(
                type="GPU", vendor="NVIDIA", environment={"architecture": cap, "cuda": cuda, "cudnn": cudnn})
            devices.append(device_properties_pb2.NamedDevice(
                name=f"/job:localhost/replica:0/task:0/device:GPU:{i}", properties=props))
    elif text == "cpu" and precision == "bfloat16":
        optimizer = "auto_mixed_precision_onednn_bfloat16"
    else:
        raise ValueError(f"TensorFlow has no mixed precision pass for target {target!r} with {precision}")
    devices.append(device_properties_pb2.NamedDevice(
        name="/job:localhost/replica:0/task:0/device:CPU:0",
        properties=device_properties_pb2.DeviceProperties(type="CPU")))
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(graph_def)
    meta.collection_def["train_op"].node_list.value.extend(list(fetches))
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    rewrite.min_graph_nodes = -1
    rewrite.optimizers.append(optimizer)
    # The pass's own output: Grappler's MLIR (TFG) optimizer, which runs after it, rejects the
    # graphs where the bfloat16 pass paints a functional loop's variables against its
    # functions' signatures (KNOWN_DIFFERENCES.md KD-6), and the reference would be lost.
    rewrite.disable_tfg_optimizer = True
    out = tf_optimizer.OptimizeGraph(config, meta, verbose=False, cluster=gcluster.Cluster(devices=devices))
    result = GraphDef()
    result.CopyFrom(out)
    return result
