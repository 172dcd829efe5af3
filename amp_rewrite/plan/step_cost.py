"""The cost model's estimate of a whole step: every node of a graph priced in the type it has.

The planner (:mod:`amp_rewrite.plan.optimal`) sums only what a colouring can change, which is
enough to rank colourings but is not a step time.  To compare the model with measured step
times (issue 22: predicted against measured low/float32 ratios), this prices a graph *as it
is*: a float32 graph, our rewritten graph with its Casts, or a graph that was built in mixed
precision (Keras's ``mixed_float16``) alike, with the same per-node rules
(:func:`~amp_rewrite.plan.cost_model.node_cost`, :func:`~amp_rewrite.plan.cost_model.cast_cost`):

* a node runs in low precision when any of its type attributes is float16 or bfloat16;
* a ``Cast`` between float32 and a low type is priced as a Cast, of its output's shape (its
  input's, for a Cast the rewrite inserted into a graph not yet exported);
* ops that only hold, read or write a buffer (:data:`BUFFER_OPS`), forward a tensor or read
  its shape cost nothing; so does a node without a float type (shape arithmetic, counters),
  a stateless op whose data inputs are all constants (folded when the graph is loaded:
  the Casts of a frozen graph's weights), and, without XLA, what else Grappler removes as
  the planner knows it (:mod:`~amp_rewrite.plan.grappler_folds`: an inference batch norm's
  affine ops folded into a frozen convolution, and, on a CPU, a swish's Muls, its Sigmoid
  priced as the fused kernel); a dense op with constant weights pays no weight re-layout;
* only what runs counts (:mod:`amp_rewrite.graph.liveness`): TensorFlow prunes what neither a
  function's results nor its stateful ops need, such as the gradients of constants a traced
  training step computes and discards, and the main graph's nodes its fetches do not need
  where the caller named them (``g.graph["fetches"]``);
* a function's body counts once per call, and a loop's (``While``) once per iteration: as
  many as the rows of the tensor its ``TensorList`` was made from (an RNN's sequence), else
  :data:`~amp_rewrite.plan.cost_model.UNKNOWN_DIM` (:func:`call_counts`);
* without XLA every priced node is a kernel: its roofline time, plus the class's fixed time
  per kernel (:attr:`~amp_rewrite.plan.cost_model.DeviceCosts.kernel_overhead`; a Cast's
  price includes its own); and the executor spends host time on each
  (:attr:`~amp_rewrite.plan.cost_model.DeviceCosts.host_per_kernel`, a GPU's), which overlaps
  the device's work: the step takes the longer of the two (:attr:`StepEstimate.total_ns`);
  a node assigned to a GPU that has no GPU kernel for its types runs on the host instead, and
  where it reads a GPU tensor and a GPU op reads its result the round trip is paid on top, in
  neither's shadow (:mod:`.host_trips`);
* under XLA (``compiled=True``) dense ops are kernels as without it, and element-wise ops
  (Casts included) fuse.  Where fusions end is read from the graph: XLA cannot fuse across a
  dense op or a reduction (:data:`KERNEL_BOUNDARY_OPS`), so each node gets a *stage*, the
  most such ops on a path to it (:func:`_stages`).  An element-wise op whose every reader is
  an element-wise op of its own stage stays in registers and costs only the arithmetic
  beyond its memory-bound time; any other (read by a dense op, in a later stage -- an
  activation saved for the backward pass --, or a result of the step) is written once and
  read back once per later stage, and ends one kernel.  Readers are those that run; an op
  that only forwards a tensor (``Identity``, ``IdentityN``, ``Reshape``...) stands for the
  readers of what it forwards, and one that reads only a shape reads nothing
  (:func:`_forwarded_readers`).

This is deliberately coarser than XLA's fusion passes (multi-output and sibling fusions merge
kernels it counts apart); the whole-step ratios it gives were checked against an H200's
measured steps (``bench/gpu_predict.py``, ``bench/GPU_RESULTS.md``).

Pure: reads the graphs (their ``shapes``), changes nothing.  Imports nothing of TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping

import networkx as nx

from ..graph import dtypes as dt
from ..graph.ir import consumers_by_port, data_inputs, ordered_nodes
from ..graph.liveness import live_nodes
from ..graph.op_registry import OpRegistry
from ..graph.shapes import Shape
from . import grappler_folds
from .cost_model import (ALIAS_OPS, DENSE_OPS, METADATA_OPS, UNKNOWN_DIM, DeviceCosts, cast_cost,
                         compiled_compute_factor, constant_nodes, elements, node_cost)
from .gpu_layout import LAYOUT_SENSITIVE_OPS, LayoutTranspose, layout_transposes
from .host_trips import host_round_trips
from .inlined import inline_calls

__all__ = ["BUFFER_OPS", "KERNEL_BOUNDARY_OPS", "LOOP_OPS", "NodeTime", "StepCheck", "StepEstimate", "call_counts",
           "estimate_graph", "estimate_graphs", "estimate_parts", "loop_trips", "node_precision", "total_of"]

#: Ops that hold, read or write a buffer without a kernel computing anything a precision
#: changes: arguments and results, constants (folded when the graph is loaded), variables
#: (a read hands out the buffer; an assignment stores what its producer -- priced -- wrote),
#: and control flow markers.
BUFFER_OPS = frozenset({
    "_Arg", "_Retval", "_DeviceArg", "_DeviceRetval", "Placeholder", "PlaceholderWithDefault", "Const",
    "HostConst", "VarHandleOp", "VariableV2", "ReadVariableOp", "AssignVariableOp", "NoOp",
})

_LOW = frozenset({dt.HALF, dt.BFLOAT16})


@dataclass(frozen=True)
class StepEstimate:
    """A graph's estimated time (ns), by kind of work, and what was priced."""

    dense_ns: float = 0.0  #: MatMul, BatchMatMul, convolutions and their gradients
    elementwise_ns: float = 0.0  #: every other priced op, Casts excluded
    cast_ns: float = 0.0  #: Casts between float32 and a low type
    overhead_ns: float = 0.0  #: fixed cost per kernel (``DeviceCosts.kernel_overhead``)
    kernels: int = 0  #: nodes that paid ``overhead_ns``
    low_nodes: int = 0  #: priced nodes running in low precision (Casts excluded)
    casts: int = 0
    #: The executor's host time without XLA: ``DeviceCosts.host_per_kernel`` per kernel it
    #: launches.  It overlaps the device's work, so a step takes the longer of the two.
    host_ns: float = 0.0
    #: The layout optimizer's Transposes on a GPU without XLA (:mod:`.gpu_layout`): reading
    #: and writing what each moves (their fixed time is in ``overhead_ns``, their host time in
    #: ``host_ns``, and they count among ``kernels``).
    layout_ns: float = 0.0
    transposes: int = 0
    #: Round trips through the host without XLA (:mod:`.host_trips`): nodes assigned to a GPU
    #: that run on its host, each copying GPU tensors down and its results back.  Serial: added
    #: to the longer of the device's and the host's times.
    host_trip_ns: float = 0.0
    host_trips: int = 0

    @property
    def device_ns(self) -> float:
        """The device's time: dense, element-wise, Cast and layout work, and the kernels'
        fixed time."""
        return self.dense_ns + self.elementwise_ns + self.cast_ns + self.layout_ns + self.overhead_ns

    @property
    def total_ns(self) -> float:
        """The step's time: the device's, or the host's where the executor cannot keep the
        device busy (small kernels, many of them), plus the round trips through the host that
        neither can overlap."""
        return max(self.device_ns, self.host_ns) + self.host_trip_ns

    def __add__(self, other: "StepEstimate") -> "StepEstimate":
        return StepEstimate(*(a + b for a, b in zip(self._fields(), other._fields())))

    def scaled(self, times: int) -> "StepEstimate":
        """This estimate run ``times`` times (a loop body's per iteration)."""
        return StepEstimate(*(a * times for a in self._fields()))

    def _fields(self) -> tuple[float, ...]:
        return (self.dense_ns, self.elementwise_ns, self.cast_ns, self.overhead_ns, self.kernels,
                self.low_nodes, self.casts, self.host_ns, self.layout_ns, self.transposes, self.host_trip_ns,
                self.host_trips)

    def as_dict(self) -> dict[str, float]:
        """Microseconds per kind and the counts (for reports and JSON): ``device_us`` is the sum
        of the kinds, ``host_us`` the executor's, ``total_us`` the longer of the two plus
        ``host_trip_us``."""
        return {"total_us": round(self.total_ns / 1e3, 1), "device_us": round(self.device_ns / 1e3, 1),
                "dense_us": round(self.dense_ns / 1e3, 1),
                "elementwise_us": round(self.elementwise_ns / 1e3, 1), "cast_us": round(self.cast_ns / 1e3, 1),
                "overhead_us": round(self.overhead_ns / 1e3, 1), "host_us": round(self.host_ns / 1e3, 1),
                "layout_us": round(self.layout_ns / 1e3, 1), "kernels": self.kernels, "low_nodes": self.low_nodes,
                "casts": self.casts, "transposes": self.transposes,
                "host_trip_us": round(self.host_trip_ns / 1e3, 1), "host_trips": self.host_trips}


@dataclass(frozen=True)
class NodeTime:
    """One priced node of a step estimate: its op, kind (``"dense"``, ``"elementwise"``,
    ``"cast"``, or ``"layout"`` for a Transpose the layout optimizer adds, keyed by the name
    Grappler gives it), the precision it runs in (``"float32"`` or ``"low"``), its estimated time
    (ns) and, apart, the fixed time per kernel the step charges it (``kernel_overhead`` for a
    node that launches a kernel; a Cast's price already holds its own fixed time, so 0), its
    output elements and whether all its output shapes were known (else ``elements`` counts
    the cost model's defaults).  Times are per run of the step: a function's nodes times the
    function's runs per step."""

    op: str
    kind: str
    precision: str
    ns: float
    elements: int
    fixed_ns: float = 0.0
    known_shape: bool = True
    #: Other names the node may have where it runs (a layout Transpose's: Grappler keeps one of
    #: several).
    aliases: tuple[str, ...] = ()

    def scaled(self, times: int) -> "NodeTime":
        """This node run ``times`` times."""
        return replace(self, ns=self.ns * times, fixed_ns=self.fixed_ns * times)


@dataclass(frozen=True)
class StepCheck:
    """A plan's whole-step check: the step estimates (microseconds) of one graph as given and
    as each candidate colouring rewrites it (``rewritten_us``: colouring -> estimate, the
    preferred first, which wins a tie), on ``device_class``, and the least gain (a fraction
    of the estimate as given) for which a rewrite is kept.  Pure data."""

    given_us: float
    rewritten_us: Mapping[str, float]
    min_gain: float
    device_class: str

    @property
    def best(self) -> str:
        """The candidate estimated fastest."""
        return min(self.rewritten_us, key=self.rewritten_us.__getitem__)

    @property
    def kept(self) -> bool:
        """Whether the fastest candidate is estimated at least ``min_gain`` faster."""
        return self.given_us - self.rewritten_us[self.best] >= self.min_gain * self.given_us

    def reason(self) -> str:
        """Why a declined plan keeps its graph as given: the end of its nodes' reasons."""
        return (f"the rewritten graph's step estimate on {self.device_class} "
                f"({self.rewritten_us[self.best]:.1f} us) is not {self.min_gain:.0%} below the graph's as given "
                f"({self.given_us:.1f} us)")

    def as_dict(self) -> dict[str, object]:
        """For the report: the estimates, and the colouring taken (``"given"``: none)."""
        return {"given_us": round(self.given_us, 1),
                "rewritten_us": {name: round(us, 1) for name, us in self.rewritten_us.items()},
                "kept": self.kept, "chosen": self.best if self.kept else "given"}


def _types(value: int | tuple[int, ...]) -> tuple[int, ...]:
    return tuple(dt.base(v) for v in value) if isinstance(value, tuple) else (dt.base(value),)


def node_precision(dtypes: Mapping[str, int | tuple[int, ...]]) -> str | None:
    """``"low"`` when a type attribute of a node is float16 or bfloat16, ``"float32"`` when one
    is float32 (and none is low), ``None`` when it has no float type.  Pure."""
    seen = {t for v in dtypes.values() for t in _types(v)}
    if seen & _LOW:
        return "low"
    return "float32" if dt.FLOAT in seen else None


def _is_low_cast(dtypes: Mapping[str, int | tuple[int, ...]]) -> bool:
    """Whether a Cast's types make it one between float32 and float16/bfloat16.  Pure."""
    src, dst = dtypes.get("SrcT"), dtypes.get("DstT")
    if not isinstance(src, int) or not isinstance(dst, int):
        return False
    pair = {dt.base(src), dt.base(dst)}
    return dt.FLOAT in pair and bool(pair & _LOW)


def _folded(g: nx.MultiDiGraph, order: list[str], registry: OpRegistry, costs_of: Callable[[str], DeviceCosts],
            compiled: bool) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """What never runs as its own kernel once ``g`` is loaded: ``(constants, gone, swishes)``.
    ``constants``: :func:`~amp_rewrite.plan.cost_model.constant_nodes` (a frozen graph's
    weights and their Casts).  ``gone``: those and, without XLA (``compiled``: XLA fuses what
    it fuses, which the estimate prices itself), the element-wise ops Grappler folds into a
    frozen dense op and the Muls of a swish it fuses (:mod:`~amp_rewrite.plan.grappler_folds`,
    as the planner prices them).  ``swishes``: the Sigmoids that then run as one fused swish
    kernel, on a device (``costs_of``, by device string) that has the fusion.  ``order``: ``g``'s
    nodes in order.  Pure."""
    ops = {n: g.nodes[n]["op"] for n in order}
    inputs = {n: data_inputs(g, n) for n in order}
    consts = constant_nodes(order, ops, inputs, registry)
    if compiled:
        return consts, consts, frozenset()
    swishes = {n: parts for n in order
               if ops[n] == "Sigmoid" and grappler_folds.FUSED_SWISH in costs_of(g.nodes[n].get("device", "")).elementwise
               for parts in [grappler_folds.swish_parts(g, ops, inputs, n, consts)] if parts}
    memo: grappler_folds.FoldMemo = {}

    def onednn(dense: str) -> bool:
        return costs_of(g.nodes[dense].get("device", "")).fuses_bias_activation

    affine = {n for n in order
              if ops[n] not in DENSE_OPS and grappler_folds.is_folded(g, ops, inputs, n, consts, memo, onednn)}
    gone = consts | affine | {m for parts in swishes.values() for m in parts}
    return consts, frozenset(gone), frozenset(swishes)


def _priced(op: str, name: str, signatures: Mapping[str, object], folded: frozenset[str]) -> bool:
    return not (op in BUFFER_OPS or op in ALIAS_OPS or op in METADATA_OPS or op in signatures or name in folded)


#: Ops whose result XLA needs whole before any reader runs (reductions, windows, the
#: normalizations and losses that reduce): each ends a kernel, like a dense op.
KERNEL_BOUNDARY_OPS = frozenset({
    "Mean", "Sum", "Max", "Min", "Prod", "ArgMax", "ArgMin", "All", "Any", "EuclideanNorm", "L2Loss",
    "BiasAddGrad", "Softmax", "LogSoftmax", "SoftmaxCrossEntropyWithLogits",
    "SparseSoftmaxCrossEntropyWithLogits", "FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3",
    "FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3", "MaxPool", "AvgPool",
    "MaxPoolGrad", "AvgPoolGrad", "MaxPoolV2", "MaxPoolGradV2", "Cumsum", "TopKV2",
})


#: Element-wise ops XLA's GPU fusion counts as expensive (``IsExpensive``): it does not fuse such
#: a producer into a reader that would repeat it per element, so one computed from inputs alone
#: is not recomputed by its readers (:func:`_memory_reads`).  A division, square root, inverse
#: square root or exponential of float32 or float16 is cheap on a GPU; of bfloat16 it is not
#: (:data:`_CHEAP_UNLESS_BFLOAT16`).
XLA_EXPENSIVE_OPS = frozenset({
    "Log", "Log1p", "Tanh", "Sigmoid", "Pow", "Erf", "Erfc", "Sin", "Cos", "Tan", "Atan", "Atan2",
    "Asin", "Acos", "Sinh", "Cosh", "Expm1", "Lgamma", "Digamma", "FloorMod", "Mod", "TruncateMod",
})
_CHEAP_UNLESS_BFLOAT16 = frozenset({"Exp", "Sqrt", "Rsqrt", "RealDiv", "Div", "DivNoNan"})


def _expensive_for_xla(g: nx.MultiDiGraph, name: str) -> bool:
    """Whether XLA's GPU fusion counts node ``name`` expensive (:data:`XLA_EXPENSIVE_OPS`).  Pure."""
    op = g.nodes[name]["op"]
    if op in XLA_EXPENSIVE_OPS:
        return True
    return op in _CHEAP_UNLESS_BFLOAT16 and any(dt.BFLOAT16 in _types(v)
                                               for v in (g.nodes[name].get("dtypes") or {}).values())


def _stages(g: nx.MultiDiGraph, order: list[str]) -> dict[str, int]:
    """Under XLA, which kernel "stage" each node falls in: the most dense ops and kernel
    boundaries (:data:`KERNEL_BOUNDARY_OPS`) on a path to it.  Element-wise ops of one stage can
    share a fusion; a tensor read in a later stage must be in memory (an activation saved for
    the backward pass, a value used after a reduction of it).  ``order``: ``g``'s nodes in
    node order; assumes producers come before consumers in it (an input not seen yet -- a
    loop's back edge -- counts as stage 0).  Pure."""
    stage: dict[str, int] = {}
    for name in order:
        s = 0
        for src, _ in data_inputs(g, name):
            op = g.nodes[src]["op"]
            s = max(s, stage.get(src, 0) + (op in DENSE_OPS or op in KERNEL_BOUNDARY_OPS))
        stage[name] = s
    return stage


def _forwarded_readers(g: nx.MultiDiGraph, name: str, live: frozenset[str] | None,
                       results: frozenset[str]) -> tuple[list[str], bool]:
    """``(readers, is a result)`` of ``name``'s outputs as XLA sees them: the nodes that run
    (``live``; ``None``: all) and read one of them as data, where an op that only forwards a
    tensor (:data:`~amp_rewrite.plan.cost_model.ALIAS_OPS`: compiled to nothing, or a bitcast)
    stands for the readers of what it forwards, and an op that reads only a shape
    (:data:`~amp_rewrite.plan.cost_model.METADATA_OPS`: static under XLA) reads nothing.  Such
    an op with no reader that runs is a result of the step where ``results`` (the fetches)
    names it, or where ``live`` is ``None`` (nothing read it: it may be fetched); so is
    ``name`` itself where ``results`` names it.  Pure."""
    readers: dict[str, None] = {}
    result = name in results
    seen: set[tuple[str, int]] = set()
    todo: list[tuple[str, int | None]] = [(name, None)]
    while todo:
        x, port = todo.pop()
        by_port = consumers_by_port(g, x)
        edges = [e for es in by_port.values() for e in es] if port is None else by_port.get(port, [])
        forwarded = False
        for v, q, _ in edges:
            if live is not None and v not in live:
                continue
            forwarded = True
            op = g.nodes[v]["op"]
            if op in METADATA_OPS:
                continue
            if op in ALIAS_OPS and (op == "IdentityN" or q == 0):
                # IdentityN forwards input i to output i; the others their input 0.
                if (v, q) not in seen:
                    seen.add((v, q))
                    todo.append((v, q if op == "IdentityN" else 0))
            else:
                readers[v] = None
        if x != name and not forwarded and (live is None or x in results):
            result = True
    return list(readers), result


def _memory_reads(g: nx.MultiDiGraph, name: str, stage: Mapping[str, int], signatures: Mapping[str, object],
                  folded: frozenset[str], live: frozenset[str] | None,
                  results: frozenset[str]) -> tuple[bool, int]:
    """Under XLA, how the output of the element-wise node ``name`` meets its readers:
    ``(written, reads)``, whether it is written to memory (ending a kernel) and how many
    kernels of element-wise readers read it (or, recomputing it, its inputs) from memory: one
    per later stage.  Dense readers price their own reads.  A reader of its own stage fuses
    with it (no write, no read).  So does one of a later stage where ``name`` is of stage 0 (no
    dense op or reduction upstream: it computes from variables, constants and the step's inputs
    alone, such as an optimizer's ``momentum * m`` or a weight's Cast): XLA fuses such a cheap
    producer into each reader's kernel, which reads its inputs instead of its output; nothing
    waits on it, so it is not written for them.  Not an expensive one
    (:func:`_expensive_for_xla`), which XLA keeps apart rather than repeat.  Readers as
    :func:`_forwarded_readers` finds them (``live``, ``results`` as there).  Pure."""
    # A reduction's result is a kernel's output: always in memory.
    boundary = g.nodes[name]["op"] in KERNEL_BOUNDARY_OPS
    readers, result = _forwarded_readers(g, name, live, results)
    later: set[int] = set()
    # No reader that runs: a result of the step (a node that runs but nothing reads is a
    # result or a stateful op's input).
    in_memory = boundary or result or not readers
    for v in readers:
        op = g.nodes[v]["op"]
        if op in DENSE_OPS or not _priced(op, v, signatures, folded):
            in_memory = True
        elif boundary or stage[v] != stage[name]:
            later.add(stage[v])
    recomputed = not boundary and stage[name] == 0 and not _expensive_for_xla(g, name)
    return in_memory or (bool(later) and not recomputed), len(later)


def _fused_ns(g: nx.MultiDiGraph, name: str, op: str, outs: list[Shape], out_bytes: int, costs: DeviceCosts,
              stage: Mapping[str, int], signatures: Mapping[str, object], folded: frozenset[str],
              live: frozenset[str] | None, results: frozenset[str]) -> tuple[float, bool]:
    """Under XLA, ``(time, ends a kernel)`` of the element-wise node ``name`` (a Cast included),
    priced as ``op``: the arithmetic beyond its memory-bound time, and (:func:`_memory_reads`)
    writing its output where it must be in memory, and reading it back (or its inputs, where
    a later reader recomputes it) once per later stage.  Pure."""
    n = sum(elements(s) for s in outs)
    t = (compiled_compute_factor(costs, op) - 1.0) * n * 4 / costs.bandwidth
    written, reads = _memory_reads(g, name, stage, signatures, folded, live, results)
    return t + n * out_bytes * (written + reads) / costs.bandwidth, written


def estimate_graph(g: nx.MultiDiGraph, costs_of: Callable[[str], DeviceCosts], registry: OpRegistry, *,
                   compiled: bool, per_node: dict[str, NodeTime] | None = None, layout: bool = True) -> StepEstimate:
    """Price every node of ``g`` in the type it has (module docstring).  ``costs_of`` maps a
    node's device string to its class; ``registry`` says which ops are stateful (never folded).
    Needs ``g.graph["shapes"]`` (unknown shapes count as the cost model's defaults); function
    calls are priced as free here -- their bodies are separate graphs (:func:`estimate_graphs`).
    Only nodes that run are priced (:func:`~amp_rewrite.graph.liveness.live_nodes`: in a
    function what its results, control outputs and stateful ops need; in a main graph whose
    ``g.graph["fetches"]`` names its fetches, what they and its stateful ops need; else every
    node).  ``per_node``, when given, receives every priced node's :class:`NodeTime` (to set
    against measured per-node times: ``bench/calibrate_gpu_in_place.py``); the only thing
    mutated.  Without XLA the layout optimizer's Transposes in ``g`` are priced too, ``g`` taken
    as a graph of its own (``layout``; :func:`estimate_parts` prices them over the step with its
    calls inlined instead)."""
    order = ordered_nodes(g)
    shapes = _with_inserted_casts(g, order, g.graph.get("shapes") or {})
    signatures = g.graph.get("signatures") or {}
    consts, folded, swishes = _folded(g, order, registry, costs_of, compiled)
    stage = _stages(g, order) if compiled else {}
    fetches = g.graph.get("fetches")
    live = live_nodes(g, registry, fetches)
    results = frozenset(fetches or ())
    # Tensors of a loop body the same every iteration, whose Casts the rewrite hoists before
    # the loop (amp_rewrite.loop_hoist; set by api for a profile that hoists).
    invariant = g.graph.get("loop_invariant") or frozenset()
    ns = {"dense": 0.0, "elementwise": 0.0, "cast": 0.0, "overhead": 0.0, "host": 0.0}
    kernels = low_nodes = casts = 0
    # ``g`` taken alone (the whole-step check prices one graph at a time): estimate_parts
    # places the Transposes over the step with its calls inlined instead.
    on_gpu = _gpu_placement(g, costs_of)
    transposes = (() if compiled or not layout
                  else layout_transposes(g, on_gpu, live=live, results=results, shapes=shapes, constants=consts))
    moved = _priced_transposes(g, transposes, costs_of, per_node)
    # Nodes that run on the host for want of a GPU kernel: priced as their round trip, not as
    # GPU kernels.
    trips = () if compiled else host_round_trips(g, lambda n: on_gpu(n) is not None, registry, shapes=shapes,
                                                  live=live)
    on_host = frozenset(n for trip in trips for n in trip.nodes)
    for name in order:
        node = g.nodes[name]
        op = node["op"]
        if ((live is not None and name not in live) or not _priced(op, name, signatures, folded)
                or name in on_host):
            continue
        types = node.get("dtypes") or {}
        is_cast = op == "Cast" and _is_low_cast(types)
        precision = node_precision(types)
        if not is_cast and precision is None:
            continue
        outs = list(shapes.get(name, ()))
        costs = costs_of(node.get("device", ""))
        kind = "cast" if is_cast else "dense" if op in DENSE_OPS else "elementwise"
        if is_cast and invariant and node["proto"] is None and data_inputs(g, name)[0] in invariant:
            continue  # made once per run of the loop, before it: not priced per iteration
        casts += kind == "cast"
        low_nodes += kind != "cast" and precision == "low"
        if kind == "cast" and not compiled:
            # A Cast's price includes its fixed time (``op_overhead``): not charged again.
            t = cast_cost(outs[0] if outs else None, 2, costs)
            ns["cast"] += t
            ns["host"] += costs.host_per_kernel
            kernels += 1
            if per_node is not None:
                per_node[name] = NodeTime(op, kind, "low", t, elements(outs[0] if outs else None),
                                          known_shape=_known(outs[:1]))
            continue
        priced_op = grappler_folds.FUSED_SWISH if name in swishes else op
        if kind == "dense" or not compiled:
            ins_of = data_inputs(g, name)
            ins = [_shape_of(shapes, src, port) for src, port in ins_of]
            weights = ins_of[1][0] if kind == "dense" and len(ins_of) > 1 else None
            nc = node_cost(priced_op, ins, outs, 2, costs, constant_weights=weights in consts, compiled=compiled)
            t, launches = (nc.low if precision == "low" else nc.high), True
        else:
            low_out = types.get("DstT") != dt.FLOAT if kind == "cast" else precision == "low"
            t, launches = _fused_ns(g, name, priced_op, outs, 2 if low_out else 4, costs, stage, signatures,
                                    folded, live, results)
        ns[kind] += t
        if launches:
            ns["overhead"] += costs.kernel_overhead
            if not compiled:  # under XLA the host launches one executable, not each kernel
                ns["host"] += costs.host_per_kernel
            kernels += 1
        if per_node is not None:
            per_node[name] = NodeTime(op, kind, "low" if kind == "cast" else precision or "float32", t,
                                      sum(elements(s) for s in outs),
                                      costs.kernel_overhead if launches else 0.0, _known(outs))
    return moved + StepEstimate(ns["dense"], ns["elementwise"], ns["cast"], ns["overhead"], kernels, low_nodes,
                                casts, ns["host"], host_trip_ns=sum(t.ns for t in trips), host_trips=len(trips))


def _priced_transposes(g: nx.MultiDiGraph, transposes: tuple[LayoutTranspose, ...],
                       costs_of: Callable[[str], DeviceCosts], per_node: dict[str, NodeTime] | None) -> StepEstimate:
    """The layout optimizer's ``transposes`` in ``g`` priced: each a kernel reading and writing
    its tensor, with its fixed and host time.  ``per_node``, when given, receives each one's
    :class:`NodeTime` (the only thing mutated)."""
    layout = overhead = host = 0.0
    for t in transposes:
        costs = costs_of(g.nodes[t.node].get("device", ""))
        n = t.elements if t.elements is not None else elements(None)
        item = 2 if t.dtype in _LOW else 8 if t.dtype == dt.DOUBLE else 4
        moved = 2 * n * item / costs.bandwidth  # read once, written once
        layout += moved
        overhead += costs.kernel_overhead
        host += costs.host_per_kernel
        if per_node is not None:
            per_node[t.name] = NodeTime("Transpose", "layout", "low" if t.dtype in _LOW else "float32", moved, n,
                                        costs.kernel_overhead, t.elements is not None, t.names)
    return StepEstimate(overhead_ns=overhead, kernels=len(transposes), host_ns=host, layout_ns=layout,
                        transposes=len(transposes))


def _step_layout(main: nx.MultiDiGraph, functions: Mapping[str, nx.MultiDiGraph],
                 costs_of: Callable[[str], DeviceCosts], registry: OpRegistry,
                 per_node: dict[str, NodeTime] | None) -> StepEstimate:
    """The layout optimizer's Transposes in the step ``main`` runs, priced
    (:func:`_priced_transposes`): placed over ``main`` with its calls inlined, as TensorFlow
    inlines them before Grappler (:func:`~amp_rewrite.plan.inlined.inline_calls`), so one
    layout is decided for the whole, conversions cross function boundaries, and a failed
    pass leaves the whole unconverted.  None where a graph of that whole has a loop that
    converts something (:func:`_graphs_with_layout_loops`: not modelled), where inlining
    would copy too much (:data:`~amp_rewrite.plan.inlined.MAX_INLINED_NODES`), or where
    nothing runs on a GPU.  Pure but for ``per_node``."""
    if not any(costs_of(main.nodes[n].get("device", "")).layout_nhwc_types is not None for n in main.nodes):
        return StepEstimate()
    graphs = {"": main, **functions}

    def shapes_of(key: str) -> Mapping[str, tuple[Shape, ...]]:
        g = graphs[key]
        return _with_inserted_casts(g, ordered_nodes(g), g.graph.get("shapes") or {})

    def live_of(key: str) -> frozenset[str] | None:
        return live_nodes(graphs[key], registry, graphs[key].graph.get("fetches"))

    def constants_of(key: str) -> frozenset[str]:
        g = graphs[key]
        order = ordered_nodes(g)
        return constant_nodes(order, {n: g.nodes[n]["op"] for n in order}, {n: data_inputs(g, n) for n in order},
                              registry)

    view = inline_calls(main, functions, shapes_of, live_of, constants_of)
    if view is None or ({""} | view.functions) & _graphs_with_layout_loops(main, functions):
        return StepEstimate()
    g = view.graph
    transposes = layout_transposes(g, _gpu_placement(g, costs_of), live=view.live,
                                   results=frozenset(main.graph.get("fetches") or ()), shapes=view.shapes,
                                   constants=view.constants)
    return _priced_transposes(g, transposes, costs_of, per_node)


def _gpu_placement(g: nx.MultiDiGraph, costs_of: Callable[[str], DeviceCosts]) -> Callable[[str], DeviceCosts | None]:
    """A node of ``g`` -> its GPU's class, ``None`` where it does not run on a GPU."""
    def on_gpu(name: str) -> DeviceCosts | None:
        costs = costs_of(g.nodes[name].get("device", ""))
        return costs if costs.layout_nhwc_types is not None else None

    return on_gpu


def _known(shapes: list[Shape]) -> bool:
    """Whether every shape of ``shapes`` is fully known.  Pure."""
    return bool(shapes) and all(s is not None and all(d is not None for d in s) for s in shapes)


def _with_inserted_casts(g: nx.MultiDiGraph, order: list[str],
                         shapes: Mapping[str, tuple[Shape, ...]]) -> Mapping[str, tuple[Shape, ...]]:
    """``shapes`` and the output shape of every ``Cast`` shape inference never saw (those the
    rewrite inserted, when a rewritten graph is priced before export): its input's, walking
    ``g``'s nodes in ``order``.  Pure."""
    added: dict[str, tuple[Shape, ...]] = {}
    for name in order:
        if g.nodes[name]["op"] == "Cast" and name not in shapes:
            ins = data_inputs(g, name)
            if ins:
                src, port = ins[0]
                added[name] = (_shape_of(added, src, port) if src in added else _shape_of(shapes, src, port),)
    return {**shapes, **added} if added else shapes


def _shape_of(shapes: Mapping[str, tuple[Shape, ...]], src: str, port: int) -> Shape:
    s = shapes.get(src)
    return s[port] if s is not None and port < len(s) else None


#: Ops that run their functions once per iteration.
LOOP_OPS = frozenset({"While", "StatelessWhile", "_While"})
#: Ops whose inputs say how many iterations a loop fed by them runs: a ``TensorList`` made
#: from a tensor holds one element per row of it.
_LIST_FROM_ROWS = frozenset({"TensorListFromTensor"})


def loop_trips(g: nx.MultiDiGraph, name: str) -> int:
    """How many times the loop node ``name`` of ``g`` runs its body, read from its inputs: the
    most rows of any tensor a ``TensorListFromTensor`` feeding it was made from (an RNN's
    sequence length), or, for a backward loop, the count of the forward loop whose outputs
    (the intermediates it stacked) it reads; else :data:`~amp_rewrite.plan.cost_model.UNKNOWN_DIM`.
    A list of a single row does not count (a backward loop is fed the gradient of a last step
    only as one).  Pure."""
    shapes: Mapping[str, tuple[Shape, ...]] = g.graph.get("shapes") or {}
    trips = 0
    # Iterative over the loops met upstream (a visited set: a malformed graph may cycle).
    todo, seen = [name], {name}
    while todo:
        for src, _ in data_inputs(g, todo.pop()):
            op = g.nodes[src]["op"]
            if op in _LIST_FROM_ROWS:
                rows = data_inputs(g, src)
                shape = _shape_of(shapes, *rows[0]) if rows else None
                if shape and shape[0] is not None and int(shape[0]) > 1:
                    trips = max(trips, int(shape[0]))
            elif op in LOOP_OPS and src not in seen:
                seen.add(src)
                todo.append(src)
    return trips or UNKNOWN_DIM


def call_counts(main: nx.MultiDiGraph, functions: Mapping[str, nx.MultiDiGraph],
                registry: OpRegistry | None = None) -> dict[str, int]:
    """How many times each function of ``functions`` runs per run of ``main``: once per call,
    :func:`loop_trips` times per call from a loop (its body and condition), multiplied down
    nested calls; both branches of a conditional count (an upper bound).  A function nothing
    reachable from ``main`` calls runs 0 times (a library function nothing calls calls nothing
    either).  With ``registry``, a call that does not run
    (:func:`~amp_rewrite.graph.liveness.live_nodes`, as :func:`estimate_graph` prices) calls
    nothing; without it, every call counts.  Assumes the call graph has no cycle (checked on
    import).  Pure."""
    calls: dict[str, list[tuple[str, int]]] = {}  # caller ("" = main) -> [(callee, times)]
    for key, g in [("", main), *sorted(functions.items())]:
        signatures = g.graph.get("signatures") or {}
        out = calls.setdefault(key, [])
        live = live_nodes(g, registry, g.graph.get("fetches")) if registry is not None else None
        for n in ordered_nodes(g):
            if live is not None and n not in live:
                continue
            times = loop_trips(g, n) if g.nodes[n]["op"] in LOOP_OPS else 1
            out.extend((f, times) for f in sorted(_calls(g, n, signatures)) if f in functions)
    # Only callers that run count: a function called by main and by a library function that
    # never runs would otherwise wait for that caller forever and never pass its count on.
    reachable, todo = {""}, [""]
    while todo:
        for f, _ in calls.get(todo.pop(), ()):
            if f not in reachable:
                reachable.add(f)
                todo.append(f)
    # Kahn's algorithm from the main graph: a function's count is final once every caller's is.
    pending = {f: 0 for f in functions}
    for caller in reachable:
        for f, _ in calls.get(caller, ()):
            pending[f] += 1
    counts = dict.fromkeys(functions, 0)
    ready, runs = [""], {"": 1}
    while ready:
        caller = ready.pop()
        for f, times in calls.get(caller, ()):
            counts[f] += runs[caller] * times
            pending[f] -= 1
            if pending[f] == 0:
                runs[f] = counts[f]
                ready.append(f)
    return counts


def estimate_parts(main: nx.MultiDiGraph, functions: Mapping[str, nx.MultiDiGraph],
                   costs_of: Callable[[str], DeviceCosts], registry: OpRegistry, *, compiled: bool,
                   counts: Mapping[str, int] | None = None,
                   per_node: dict[str, dict[str, NodeTime]] | None = None) -> dict[str, StepEstimate]:
    """The parts of one run of ``main``'s step: ``""`` -> :func:`estimate_graph` of ``main``,
    then each function of ``functions`` that runs (``counts``, by default
    :func:`call_counts`) -> its estimate times the number of times it runs.  ``counts`` may name
    functions missing from ``functions`` (those are left out).  ``per_node``, when given,
    receives per graph its nodes' :class:`NodeTime`, per run of ``main`` (a loop body's times
    its iterations); the only thing mutated."""
    counts = call_counts(main, functions, registry) if counts is None else counts
    nodes: dict[str, NodeTime] | None = {} if per_node is not None else None
    parts = {"": estimate_graph(main, costs_of, registry, compiled=compiled, per_node=nodes, layout=False)}
    # Without XLA, the layout optimizer's Transposes of the whole step (its calls inlined)
    # count with the main graph's part.
    if not compiled:
        parts[""] = parts[""] + _step_layout(main, functions, costs_of, registry, nodes)
    if per_node is not None and nodes is not None:
        per_node[""] = nodes
    for name, times in counts.items():
        if times and name in functions:
            nodes = {} if per_node is not None else None
            parts[name] = estimate_graph(functions[name], costs_of, registry, compiled=compiled, per_node=nodes,
                                         layout=False).scaled(times)
            if per_node is not None and nodes is not None:
                per_node[name] = {n: t.scaled(times) for n, t in nodes.items()}
    return parts


def _graphs_with_layout_loops(main: nx.MultiDiGraph, functions: Mapping[str, nx.MultiDiGraph]) -> frozenset[str]:
    """The graphs (``""``: ``main``; else function names) with a loop whose body, or a function
    it calls, has a layout-sensitive op.  Pure."""
    out = set()
    for key, g in [("", main), *functions.items()]:
        for n in g.nodes:
            if g.nodes[n]["op"] in LOOP_OPS:
                body = _called_from(functions, list(g.nodes[n].get("funcs") or ()))
                if any(functions[f].nodes[m]["op"] in LAYOUT_SENSITIVE_OPS for f in body for m in functions[f].nodes):
                    out.add(key)
                    break
    return frozenset(out)


def _called_from(functions: Mapping[str, nx.MultiDiGraph], roots: list[str]) -> frozenset[str]:
    """``roots`` (those in ``functions``) and every function they call, transitively.  Pure."""
    todo = list(roots)
    found: set[str] = set()
    while todo:
        f = todo.pop()
        if f in found or f not in functions:
            continue
        found.add(f)
        g = functions[f]
        signatures = g.graph.get("signatures") or {}
        for n in g.nodes:
            todo.extend(_calls(g, n, signatures))
    return frozenset(found)


def _calls(g: nx.MultiDiGraph, name: str, signatures: Mapping[str, object]) -> set[str]:
    """The functions node ``name`` of ``g`` calls: those its attributes name (loop bodies,
    branches, a call's target) and its op where that is a function of ``signatures``.  Pure."""
    node = g.nodes[name]
    called = set(node.get("funcs") or ())
    if node["op"] in signatures:
        called.add(node["op"])
    return called


def total_of(parts: Mapping[str, StepEstimate]) -> StepEstimate:
    """The sum of ``parts`` (:func:`estimate_parts`), in their order.  Pure."""
    total = StepEstimate()
    for part in parts.values():
        total = total + part
    return total


def estimate_graphs(main: nx.MultiDiGraph, functions: Mapping[str, nx.MultiDiGraph],
                    costs_of: Callable[[str], DeviceCosts], registry: OpRegistry, *,
                    compiled: bool, per_node: dict[str, dict[str, NodeTime]] | None = None) -> StepEstimate:
    """:func:`estimate_graph` of ``main`` plus each function's times the number of times it
    runs per run of ``main`` (:func:`call_counts`: a loop body once per iteration): the total
    of :func:`estimate_parts`.  ``per_node`` as there; the only thing mutated."""
    return total_of(estimate_parts(main, functions, costs_of, registry, compiled=compiled, per_node=per_node))
