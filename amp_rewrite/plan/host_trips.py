"""Ops a GPU step hands to its host, and what the round trip costs.

TensorFlow places a node on the GPU it is assigned to only where that GPU has a kernel for
the node's types; otherwise soft placement runs it on the host's CPU.  In a GPU step such a
node's inputs that the GPU produced are copied to the host, the node runs there, and its
outputs are copied back for the GPU ops that read them.  The round trip is serial: the copy to
the host waits for the GPU to finish the work queued before it (``CopyGPUTensorToCPU``), the
GPU ops after it wait for the copy back, and neither the host nor the GPU can run ahead
through it.  So a step pays it on top of the longer of its host and device times
(:attr:`~amp_rewrite.plan.step_cost.StepEstimate.host_trip_ns`).

Seen on an H200 (``bench/gpu_runs/2026-11-28c-h200/``): Keras 3's loss-scale optimizer checks
an embedding's sparse gradient by densifying it (``tf.fill`` of ``True`` and a
``TensorScatterUpdate`` of the finite flags), and ``TensorScatterUpdate`` has no GPU kernel
for ``bool``.  Its LSTM training step copied 10.2 MB down, 4.2 MB down and 10.2 MB back every
step, and ran 1.3-1.5x float32's step where our rewrite of the same model, whose finite check
reads only the gradient's values, ran 0.84-0.95x.

Pure functions of a graph and an op registry; they change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import networkx as nx

from ..graph import dtypes as dt
from ..graph.ir import consumers_by_port, data_inputs
from ..graph.op_registry import OpRegistry, kernel_accepts
from ..graph.shapes import Shape
from ..graph.type_attrs import output_dtypes
from .cost_model import elements

__all__ = ["HOST_LINK_BANDWIDTH", "HOST_MEMORY_TYPES", "HOST_OP_BANDWIDTH", "HostTrip", "host_round_trips",
           "runs_on_host"]

#: Host-device copies (bytes/ns): the H200's, in the profile above (10.24 MB in 0.188 ms, 4.19
#: MB in 0.079 ms: 53-54 GB/s).
HOST_LINK_BANDWIDTH = 54.0
#: Types a GPU kernel keeps in host memory (or that never leave it): a tensor of these types
#: crosses no link between a GPU op and a host op.
HOST_MEMORY_TYPES = frozenset({dt.INT32, dt.STRING, dt.RESOURCE, dt.VARIANT})
#: A host op's own time per byte it reads and writes (bytes/ns): that ``TensorScatterUpdate``
#: (a bool [10000, 1024] tensor, 4,096 rows updated: 24.7 MB) took 4.8 ms on this
#: repository's CPU (AMD EPYC, 2 cores, TensorFlow 2.21), standing in for the GPU's host.
HOST_OP_BANDWIDTH = 5.1
#: Ops that launch nothing or are placed by rules of their own (arguments, constants, which
#: the placer puts beside their readers, and control flow).  They are never host ops here, and
#: never the GPU side of a copy either: the placer puts them where their neighbours are.
_NOT_PLACED = frozenset({"_Arg", "_Retval", "Placeholder", "PlaceholderWithDefault", "Const", "HostConst", "NoOp",
                         "Identity", "IdentityN", "Switch", "Merge", "Enter", "Exit", "NextIteration", "LoopCond",
                         "If", "StatelessIf", "While", "StatelessWhile", "PartitionedCall",
                         "StatefulPartitionedCall", "VarHandleOp", "ReadVariableOp"})


@dataclass(frozen=True)
class HostTrip:
    """One group of connected nodes of a GPU step that run on the host (``nodes``, sorted; their
    ops in ``ops``): the bytes copied down for them and back up from them, and what they read
    and write there."""

    nodes: tuple[str, ...]
    ops: tuple[str, ...]
    down_bytes: int
    up_bytes: int
    host_bytes: int

    @property
    def ns(self) -> float:
        """The round trip's serial time: both copies and the host ops."""
        return (self.down_bytes + self.up_bytes) / HOST_LINK_BANDWIDTH + self.host_bytes / HOST_OP_BANDWIDTH


def runs_on_host(op: str, types: Mapping[str, int | tuple[int, ...]], registry: OpRegistry, label: str = "") -> bool:
    """Whether a node of ``op`` with type attributes ``types``, assigned to a GPU, runs on the
    host: a CPU kernel accepts it and neither a GPU kernel nor a device-default one does (as
    TensorFlow's kernel lookup falls back).  An op with no CPU kernel for them either (a
    function call, an unknown op) is not placed by kernels.  Pure."""
    if op in _NOT_PLACED or not kernel_accepts(registry.kernels(op, "CPU"), label, types):
        return False
    return not (kernel_accepts(registry.kernels(op, "GPU"), label, types)
                or kernel_accepts(registry.kernels(op, "DEFAULT"), label, types))


def host_round_trips(g: nx.MultiDiGraph, on_gpu: Callable[[str], bool], registry: OpRegistry, *,
                     shapes: Mapping[str, tuple[Shape, ...]], live: frozenset[str] | None = None
                     ) -> tuple[HostTrip, ...]:
    """The nodes of ``g`` assigned to a GPU (``on_gpu``) that run on its host
    (:func:`runs_on_host`), grouped where they feed one another, each group with both a tensor
    copied down from a GPU op and one copied back up to a GPU op: a :class:`HostTrip` each,
    ordered by their first node's name.  ``live``: the nodes that run (others ignored).  A
    tensor counts at its producer's output type and its shape from ``shapes`` (unknown
    dimensions as the cost model's defaults); one of :data:`HOST_MEMORY_TYPES` crosses no
    link.  An int32-only node is never a host op (a GPU keeps int32 tensors in host memory).
    Pure."""
    signatures = g.graph.get("signatures") or {}
    placed: dict[tuple[object, ...], bool] = {}

    def host(name: str) -> bool:
        node = g.nodes[name]
        op = node["op"]
        if op in _NOT_PLACED or op in signatures or not on_gpu(name) or (live is not None and name not in live):
            return False
        types = node.get("dtypes") or {}
        key = (op, node.get("label", ""), tuple(sorted(types.items())))
        if key not in placed:
            only_int32 = bool(types) and all(v == dt.INT32 or (isinstance(v, tuple) and set(v) <= {dt.INT32})
                                             for v in types.values())
            placed[key] = not only_int32 and runs_on_host(op, types, registry, node.get("label", ""))
        return placed[key]

    def nbytes(src: str, port: int) -> int:
        node = g.nodes[src]
        types = output_dtypes(registry.op(node["op"]), node.get("dtypes") or {}, node.get("ints") or {})
        dtype = types[port] if types and port < len(types) else None
        if dtype in HOST_MEMORY_TYPES:
            return 0
        out = shapes.get(src, ())
        return elements(out[port]) * dt.itemsize(dtype if dtype is not None else dt.FLOAT) if port < len(out) else 0

    hosts = {name for name in g.nodes if host(name)}

    def gpu_side(name: str) -> bool:
        return (name not in hosts and g.nodes[name]["op"] not in _NOT_PLACED and on_gpu(name)
                and (live is None or name in live))

    trips = []
    seen: set[str] = set()
    for start in sorted(hosts):
        if start in seen:
            continue
        group, stack = [], [start]
        seen.add(start)
        while stack:  # the host nodes connected to ``start`` by data edges
            name = stack.pop()
            group.append(name)
            neighbours = [src for src, _ in data_inputs(g, name)]
            neighbours += [reader for readers in consumers_by_port(g, name).values() for reader, _, _ in readers]
            for other in neighbours:
                if other in hosts and other not in seen:
                    seen.add(other)
                    stack.append(other)
        down = up = moved = 0
        copied: set[tuple[str, int]] = set()  # a tensor crosses once, whichever host ops read it
        for name in group:
            for src, port in data_inputs(g, name):
                b = nbytes(src, port)
                moved += b
                if gpu_side(src) and (src, port) not in copied:
                    copied.add((src, port))
                    down += b
            for port, readers in consumers_by_port(g, name).items():
                b = nbytes(name, port)
                moved += b
                up += b if any(gpu_side(reader) for reader, _, _ in readers) else 0
        if down and up:
            group.sort()
            trips.append(HostTrip(tuple(group), tuple(g.nodes[n]["op"] for n in group), down, up, moved))
    return tuple(trips)
