"""What a step without XLA launches on a GPU: its nodes and kernels after Grappler, per variant.

Without XLA, TensorFlow's executor runs a step's graph as Grappler left it: the layout
optimizer's transposes (float32 convolutions on a GPU run NCHW), the remapper's fusions, the
Casts of a mixed-precision rewrite.  Each node costs the executor host time, and each kernel a
launch.  This script builds each variant's training or inference step here as
``bench/gpu_bench.py`` builds it (:func:`gpu_bench.variant_graph_def`), places it on a virtual
GPU of the given compute capability, runs Grappler's default optimizers on it (TensorFlow's
``tf_optimizer.OptimizeGraph``: no GPU needed; the graph is never run), and counts what is left:
nodes, kernels (nodes other than constants, identities, variable reads and shape ops), Casts
and Transposes, and the elements the Transposes move.  Set against the measured step times
(``bench/GPU_RESULTS.md``) it says how much of a step's time the per-kernel costs can be.

The layout optimizer (TensorFlow 2.21's ``generic_layout_optimizer.cc``) keeps a graph NHWC on
a GPU only where at least half its Conv2D/Conv3D nodes prefer it: float16 (compute capability
7.0 and up), bfloat16 (8.0 and up), or float32 with TF32 on (8.0 and up) in a graph with no
float32 convolution gradient.  So a float32 training step runs NCHW, with its Transposes, and a
float16 rewrite of it NHWC, without them.

Grappler is given the step as TensorFlow's runtime gives it a ``tf.function``'s body
(:func:`as_function_body`): its inputs are ``_Arg`` nodes, and those of its variables carry the
variables' shapes (``_handle_shapes``), as the runtime sets them from the resources it is
called with.  That matters: with them Grappler knows the rank of a batch norm's per-channel
operands and converts Keras's unfused batch norm with the convolutions around it (MobileNetV2's
float32 step with every sink kept: 211 Transposes; given as a graph of placeholders, whose
variables' shapes it does not know: 419).  ``--placeholders`` prices the graph as traced
instead.  Only what the step's
outputs need runs (its fetches: TensorFlow prunes a function's body so; Grappler kept every
dead branch when given every sink, and EfficientNetB0's float32 step then showed 460
Transposes moving 828M elements, where 361 moving 14.5M run).

``--layout`` also checks :mod:`amp_rewrite.plan.gpu_layout`, the cost model's own estimate of
the layout Transposes, against Grappler's, node for node: each Transpose is named by the tensor
it moves and the layout it moves it into (:func:`layout_transposes_of`).

Usage::

    python bench/grappler_counts.py --workloads resnet50-train-b64,bert_base-train-b32 \\
        --variants float32,tf_amp,ours_default [--capability 9.0] [--layout] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), HERE]

#: Ops that launch no kernel of their own (the executor still processes them).
NO_KERNEL = frozenset({
    "Const", "Identity", "IdentityN", "NoOp", "Placeholder", "_Arg", "_Retval", "ReadVariableOp", "Shape",
    "ShapeN", "Size", "Rank", "Reshape", "Squeeze", "ExpandDims", "StopGradient", "VarHandleOp",
    "PreventGradient", "Snapshot", "EnsureShape",
})
GPU_DEVICE = "/job:localhost/replica:0/task:0/device:GPU:0"


def as_function_body(graph_def: Any, variable_shapes: Any) -> Any:
    """A copy of ``graph_def`` (a traced step: its inputs and captured variables are
    ``Placeholder`` nodes) as TensorFlow's runtime hands a ``tf.function``'s body to Grappler:
    every ``Placeholder`` an ``_Arg`` of its own index, with its shape (``_output_shapes``), and
    a variable's also with its variable's dtype and shape (``_handle_dtypes``,
    ``_handle_shapes``; ``variable_shapes``: placeholder name -> shape).  Reads ``graph_def``.

    Offline, Grappler's item builder drops a data ``_Arg``'s ``_output_shapes`` (a
    ``Placeholder``'s shape it drops as a feed's): an input that only a binary op reads (a mask,
    a target) has no known rank here, whether or not it has one at run time."""
    from tensorflow.core.framework import types_pb2

    body = type(graph_def)()
    body.CopyFrom(graph_def)
    read_as = {n.input[0].split(":")[0]: n.attr["dtype"].type for n in body.node if n.op == "ReadVariableOp"}
    index = 0
    for n in body.node:
        if n.op != "Placeholder":
            continue
        dtype, shape = n.attr["dtype"].type, n.attr["shape"].shape
        for key in list(n.attr):
            del n.attr[key]
        n.op = "_Arg"
        n.attr["T"].type = dtype
        n.attr["index"].i = index
        index += 1
        if dtype != types_pb2.DT_RESOURCE:
            n.attr["_output_shapes"].list.shape.add().CopyFrom(shape)
        elif (variable_shapes or {}).get(n.name) is not None:
            n.attr["_handle_dtypes"].list.type.append(read_as.get(n.name, types_pb2.DT_FLOAT))
            handle = n.attr["_handle_shapes"].list.shape.add()
            for d in variable_shapes[n.name]:
                handle.dim.add().size = -1 if d is None else int(d)
    return body


def layout_transposes_of(graph_def: Any) -> dict[tuple[str, int, str], list[str]]:
    """The layout optimizer's Transposes in a GraphDef Grappler optimized: ``(producer, port,
    layout it moves the tensor into)`` -> the nodes that read the Transpose, sorted.  Pure."""
    readers: dict[str, list[str]] = collections.defaultdict(list)
    for n in graph_def.node:
        for i in n.input:
            readers[i.lstrip("^").split(":")[0]].append(n.name)
    found = {}
    for n in graph_def.node:
        if n.op == "Transpose" and n.name.endswith("-LayoutOptimizer"):
            node, _, port = n.input[0].partition(":")
            # "...-TransposeNHWCToNCHW-LayoutOptimizer" (5-D: NDHWCToNCDHW), keyed by the 4-D name
            into = n.name.split("-Transpose")[-1].split("To")[-1].split("-")[0].replace("D", "")
            found[(node, int(port or 0), into)] = sorted(readers[n.name])
    return found


def our_layout_transposes(graph_def: Any, variable_shapes: Any, capability: str,
                          fetches: Any = None) -> dict[tuple[str, int, str], Any]:
    """:func:`amp_rewrite.plan.gpu_layout.layout_transposes` of ``graph_def`` (a traced step)
    on a GPU of ``capability``, keyed as :func:`layout_transposes_of` keys Grappler's: a Transpose
    of a reshape Grappler removes is of the tensor that reshape hands on.  With ``fetches``
    (the step's outputs), only what runs counts, as in the step estimate.  Reads
    ``graph_def``."""
    from amp_rewrite.api import _import_to_price
    from amp_rewrite.graph.ir import data_inputs, ordered_nodes
    from amp_rewrite.plan import gpu_layout
    from amp_rewrite.plan.cost_model import constant_nodes

    from amp_rewrite.graph.liveness import live_nodes

    imported, costs_of, registry = _import_to_price(graph_def, f"gpu:{capability}", "float16", False,
                                                    variable_shapes, None, None, fetches)
    g = imported.graph

    def on_gpu(name: str) -> Any:
        return costs_of(g.nodes[name].get("device", ""))

    # What constant folding computes before the layout pass, as the step estimate folds it.
    order = ordered_nodes(g)
    consts = constant_nodes(order, {n: g.nodes[n]["op"] for n in order}, {n: data_inputs(g, n) for n in order},
                            registry)
    ours = gpu_layout.layout_transposes(g, on_gpu, constants=consts,
                                        live=live_nodes(g, registry, g.graph.get("fetches")))
    return {tensor + (t.to_format,): t for tensor, t in zip(gpu_layout.source_tensors(g, ours), ours)}


def grappler_optimized(graph_def: Any, capability: str, fetches: Any = None) -> Any:
    """``graph_def`` (a step's graph, every node placed on ``GPU:0`` of a virtual GPU of
    ``capability``) after Grappler's default optimizers, ``fetches`` kept (the step's outputs:
    what they need runs, as TensorFlow prunes a function's body to what its results and
    stateful ops need; by default every sink node, dead branches too).  Reads ``graph_def``;
    the copy it optimizes is its own."""
    from tensorflow.core.protobuf import config_pb2, device_properties_pb2, meta_graph_pb2
    from tensorflow.python.grappler import cluster as gcluster
    from tensorflow.python.grappler import tf_optimizer

    mg = meta_graph_pb2.MetaGraphDef()
    mg.graph_def.CopyFrom(graph_def)
    read = collections.Counter(i.lstrip("^").split(":")[0] for n in mg.graph_def.node for i in n.input)
    kept = set(fetches) if fetches else None
    for n in mg.graph_def.node:
        n.device = GPU_DEVICE
        if (n.name in kept) if kept is not None else not read[n.name]:
            mg.collection_def["train_op"].node_list.value.append(n.name)
    for f in mg.graph_def.library.function:
        for n in f.node_def:
            n.device = GPU_DEVICE
    gpu = device_properties_pb2.DeviceProperties(
        type="GPU", vendor="NVIDIA", environment={"architecture": capability, "cuda": "12090", "cudnn": "91000"})
    cluster = gcluster.Cluster(devices=[
        device_properties_pb2.NamedDevice(name="/job:localhost/replica:0/task:0/device:GPU:0", properties=gpu),
        device_properties_pb2.NamedDevice(name="/job:localhost/replica:0/task:0/device:CPU:0",
                                          properties=device_properties_pb2.DeviceProperties(type="CPU"))])
    config = config_pb2.ConfigProto()
    config.graph_options.rewrite_options.min_graph_nodes = -1
    return tf_optimizer.OptimizeGraph(config, mg, verbose=False, cluster=cluster)


def counts(graph_def: Any, variable_shapes: Any = None, traced: Any = None) -> dict[str, Any]:
    """Nodes, kernels, Casts and Transposes of a GraphDef's main graph and its functions'
    bodies, and its most frequent ops; and the elements the main graph's Transposes move
    (``transposed_elements``, from static shapes with ``variable_shapes`` behind its variable
    handles -- those of ``traced``, the graph before Grappler, where it has the tensor moved;
    ``transposes_unsized``: those whose input's shape is not fully known).  Pure."""
    import math

    from amp_rewrite.graph.shapes import graph_shapes
    from amp_rewrite.graph.tensor_names import parse_graph_input

    ops = collections.Counter(n.op for n in graph_def.node)
    ops.update(n.op for f in graph_def.library.function for n in f.node_def)
    moved, unsized = 0, 0
    transposes = [n for n in graph_def.node if n.op == "Transpose"]
    if transposes:
        shapes = graph_shapes(graph_def, variable_shapes)
        before = graph_shapes(traced, variable_shapes) if traced is not None else {}
        for n in transposes:
            src = parse_graph_input(n.input[0])
            found = before.get(src.node) or shapes.get(src.node) or ()
            shape = found[src.port] if src.port < len(found) else None
            if shape is None or any(d is None or d < 0 for d in shape):
                unsized += 1
            else:
                moved += math.prod(shape)
    return {"nodes": sum(ops.values()), "kernels": sum(c for o, c in ops.items() if o not in NO_KERNEL),
            "casts": ops.get("Cast", 0), "transposes": ops.get("Transpose", 0), "transposed_elements": moved,
            "transposes_unsized": unsized, "top_ops": ops.most_common(20)}


def layout_check(grappler: dict[tuple[str, int, str], Any], ours: dict[tuple[str, int, str], Any]) -> dict[str, Any]:
    """How :func:`our_layout_transposes` compares with Grappler's (:func:`layout_transposes_of`):
    the counts, how many are the same Transpose, the elements ours move, and the differing
    ones (``"missed"``: Grappler's, not ours; ``"extra"``: ours, not Grappler's).  Pure."""
    same = set(grappler) & set(ours)
    return {"grappler": len(grappler), "ours": len(ours), "same": len(same),
            "ours_elements": sum(t.elements or 0 for t in ours.values()),
            "missed": sorted("|".join(map(str, k)) for k in set(grappler) - same),
            "extra": sorted("|".join(map(str, k)) for k in set(ours) - same)}


def main(argv: list[str] | None = None) -> int:
    import gpu_bench

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", required=True, help="comma-separated gpu_bench workloads")
    p.add_argument("--variants", default="float32,tf_amp,ours_default", help="comma-separated variants (no XLA)")
    p.add_argument("--capability", default="9.0")
    p.add_argument("--placeholders", action="store_true",
                   help="optimize the step as traced (variables' shapes unknown), not as the runtime does")
    p.add_argument("--layout", action="store_true",
                   help="check amp_rewrite's estimate of the layout Transposes against Grappler's, node for node")
    p.add_argument("--json", help="write the counts here")
    args = p.parse_args(argv)
    out: dict[str, Any] = {"capability": args.capability, "counts": {}}
    for w in args.workloads.split(","):
        for v in args.variants.split(","):
            gd, variable_shapes, compiled, fetches = gpu_bench.variant_graph_def(
                w, v, target=f"gpu:{args.capability}", precision="float16")
            if compiled:
                raise SystemExit(f"{v} runs under XLA: its kernels are XLA's, not Grappler's nodes")
            body = gd if args.placeholders else as_function_body(gd, variable_shapes)
            optimized = grappler_optimized(body, args.capability, fetches)
            c = counts(optimized, variable_shapes, gd)
            line = (f"{w} {v}: {c['nodes']} nodes, {c['kernels']} kernels, {c['casts']} Casts, "
                    f"{c['transposes']} Transposes moving {c['transposed_elements'] / 1e6:.1f}M elements")
            if args.layout:
                c["layout_check"] = layout_check(layout_transposes_of(optimized),
                                                 our_layout_transposes(gd, variable_shapes, args.capability, fetches))
                lc = c["layout_check"]
                line += (f"; ours: {lc['ours']} layout Transposes, Grappler's {lc['grappler']}, "
                         f"{lc['same']} the same ({lc['ours_elements'] / 1e6:.1f}M elements)")
            out["counts"][f"{w}|{v}"] = c
            print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
