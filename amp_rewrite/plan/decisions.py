"""What the decision stage produces: the :class:`Plan` of one graph and its per-attribute
decisions, and the :class:`DecideOptions` that steer it.

Pure data: nothing here paints (see :mod:`amp_rewrite.plan.painter`).  The names are
re-exported by :mod:`amp_rewrite.plan.painter`, where callers have always imported them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Literal, Mapping

from ..graph import dtypes as dt
from ..graph.type_attrs import NodeTypes, TypeAttr

__all__ = ["AttrDecision", "Color", "DecideOptions", "NodeDecision", "NodeDecisions", "Plan", "Precision"]

Precision = Literal["float16", "bfloat16"]
Color = Literal["allow", "deny", "infer", "clear", "none"]


@dataclass(frozen=True, slots=True)
class AttrDecision:
    """The decision for one type attribute: its colour, final dtype and why."""

    color: Color
    dtype: int
    reason: str
    source: str | None = None  # for a propagated deny: the deny node it came from


@dataclass(frozen=True, slots=True)
class NodeDecision:
    """The decisions for one node, and a one-line summary of them."""

    op: str
    category: str | None
    processed: bool
    attrs: Mapping[TypeAttr, AttrDecision]
    color: Color
    dtype: int
    reason: str


class NodeDecisions(Mapping[str, NodeDecision]):
    """Read-only mapping node name -> :class:`NodeDecision`, in graph order.

    Decisions are kept as flat per-vertex lists (strings and ints, which the garbage
    collector does not track) and a :class:`NodeDecision` is built when asked for: a plan for
    a million-node graph would otherwise hold millions of small objects that every full
    collection of the process has to walk.
    """

    __slots__ = ("_order", "_index", "_ops", "_cats", "_proc", "_start", "_vattr", "_vcolor",
                 "_vdtype", "_vreason", "_vsource", "_low")

    def __init__(self, order: list[str], ops: list[str], cats: list[str | None], proc: list[bool],
                 start: list[int], vattr: list[TypeAttr], vcolor: list[str], vdtype: list[int],
                 vreason: list[str], vsource: list[str | None], low: int,
                 index: dict[str, int] | None = None) -> None:
        self._order = order
        # ``index`` (name -> position in ``order``) when the caller has it already.
        self._index = index if index is not None else dict(zip(order, range(len(order))))
        self._ops, self._cats, self._proc, self._start = ops, cats, proc, start
        self._vattr, self._vcolor, self._vdtype = vattr, vcolor, vdtype
        self._vreason, self._vsource, self._low = vreason, vsource, low

    def __len__(self) -> int:
        return len(self._order)

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __getitem__(self, name: str) -> NodeDecision:
        i = self._index[name]
        attrs = {
            self._vattr[v]: AttrDecision(self._vcolor[v], self._vdtype[v], self._vreason[v], self._vsource[v])  # type: ignore[arg-type]
            for v in range(self._start[i], self._start[i + 1])
        }
        color, dtype, reason = self._summary(i)
        return NodeDecision(self._ops[i], self._cats[i], self._proc[i], attrs, color, dtype, reason)  # type: ignore[arg-type]

    def _summary(self, i: int) -> tuple[str, int, str]:
        """The node-level ``(color, dtype, reason)`` of node number ``i``: its first attribute
        that is allow in low precision, else its first deny one, else its first float one,
        else its first one.  Pure."""
        start, stop = self._start[i], self._start[i + 1]
        if start == stop:
            return "none", dt.INVALID, "node has no type attributes"
        color, dtype = self._vcolor, self._vdtype
        low = self._low
        for v in range(start, stop):
            if color[v] == "allow" and dtype[v] == low:
                return color[v], dtype[v], self._vreason[v]
        for v in range(start, stop):
            if color[v] == "deny":
                return color[v], dtype[v], self._vreason[v]
        for v in range(start, stop):
            if dtype[v] == dt.FLOAT or dtype[v] == low:
                return color[v], dtype[v], self._vreason[v]
        return color[start], dtype[start], self._vreason[start]

    def columns(self) -> tuple[list[str], list[str], list[int], list[TypeAttr], list[str], list[int],
                               list[str], list[str | None]]:
        """The flat lists behind the mapping, for readers of every node (the report):
        ``(order, ops, start, vattr, vcolor, vdtype, vreason, vsource)``; node ``i`` has the
        vertices ``range(start[i], start[i + 1])``.  Read-only."""
        return (self._order, self._ops, self._start, self._vattr, self._vcolor, self._vdtype,
                self._vreason, self._vsource)

    def summary(self, i: int) -> tuple[str, int, str]:
        """The node-level ``(color, dtype, reason)`` of node number ``i`` (see
        :meth:`columns`).  Pure."""
        return self._summary(i)

    def rows(self) -> Iterator[tuple[str, str, str, int, str, list[tuple[TypeAttr, str, int, str, str | None]]]]:
        """Every node as ``(name, op, color, dtype, reason, attrs)``, in graph order, with
        ``attrs`` a list of ``(type attr, color, dtype, reason, source)``: the content of
        ``self[name]`` without building its objects (the report reads every node).  Pure."""
        start = self._start
        vattr, vcolor, vdtype, vreason, vsource = (
            self._vattr, self._vcolor, self._vdtype, self._vreason, self._vsource)
        summary = self._summary
        for i, name in enumerate(self._order):
            attrs = [(vattr[v], vcolor[v], vdtype[v], vreason[v], vsource[v])
                     for v in range(start[i], start[i + 1])]
            color, dtype, reason = summary(i)
            yield name, self._ops[i], color, dtype, reason, attrs


@dataclass(frozen=True)
class DecideOptions:
    """Knobs of the decision stage that are not lists or targets."""

    force_all: bool = False
    #: Nodes that must keep every dtype (fetches, signature outputs, user exclusions).
    preserve: frozenset[str] = frozenset()
    #: The reason recorded for a preserved node that is not the generic one: the API puts
    #: here the ``--exclude`` pattern that excluded each node, so the report can name it.
    #: Reasons only; never changes what is decided.
    preserve_reasons: Mapping[str, str] = field(default_factory=dict, hash=False, compare=False)
    #: Reproduce TensorFlow 2.21's known bugs (KNOWN_DIFFERENCES.md) for exact parity,
    #: even where its output cannot run.
    tensorflow_bugs: bool = False
    #: ``"greedy"``: TensorFlow's passes.  ``"optimal"``: then re-colour the free vertices
    #: with the cost-aware minimum cut (:mod:`amp_rewrite.plan.optimal`).  ``"min-casts"``: the
    #: same cut, but every allow-list op converts (as in TensorFlow) and only the bytes moved
    #: by Casts are minimized.
    planner: Literal["greedy", "optimal", "min-casts"] = "greedy"
    #: Stop deny propagation at the apply ops of moment-based normalizations
    #: (:mod:`amp_rewrite.plan.normalization`).
    normalization_aware: bool = False
    #: Greedy passes only: a moment-based normalization's apply ops stay float32, but deny
    #: does not propagate from its output, and pass 3 treats that output as a low-precision
    #: source (its readers on a path to an allow-list op convert), as Keras's mixed policies
    #: cast a norm layer's float32 output (the profile's ``[normalization] apply = "fenced"``).
    normalization_fenced: bool = False
    #: Deny the ``Mean`` nodes of moment-based normalizations (mean and variance) even where
    #: the lists infer ``Mean``: every profile but TensorFlow's own keeps statistics float32.
    moments_float32: bool = False
    #: Let the cost model penalize matrices whose dimensions miss the device's multiple.
    shape_aware: bool = True
    #: The graph runs under XLA: the cost model prices Casts and element-wise ops as fused
    #: (:func:`amp_rewrite.plan.cost_model.node_cost`).  Only the cost-aware planners read it.
    compiled: bool = False
    #: Which colouring of its free vertices the optimal planner takes: its minimum cut, or the
    #: greedy passes' (with the same safety rules), which the API's whole-step check
    #: (:mod:`amp_rewrite.step_check`) weighs against the cut under XLA.
    colouring: Literal["min-cut", "greedy"] = "min-cut"
    #: Set by the whole-step check when no colouring was estimated faster than the graph as
    #: given: why, as a reason's end.  The optimal planner then keeps every vertex it could
    #: convert float32, with this reason.
    declined: str | None = None


@dataclass(frozen=True)
class Plan:
    """What the rewrite must do to one graph; produced by :func:`decide`, read-only.

    ``allow`` holds the painted vertices (node, type attr) that run in low precision when
    float32; ``convert`` those whose dtype changes.  ``renames`` maps nodes to their new op
    (FusedBatchNorm -> V2).  ``types`` gives the ports of every type attr.
    """

    graph_name: str
    precision: Precision
    target_dtype: int
    skipped: str | None
    types: Mapping[str, NodeTypes] = field(default_factory=dict)
    allow: frozenset[tuple[str, TypeAttr]] = frozenset()
    convert: tuple[tuple[str, TypeAttr], ...] = ()
    renames: Mapping[str, str] = field(default_factory=dict)
    nodes: Mapping[str, NodeDecision] = field(default_factory=dict)
    deny_parent: Mapping[tuple[str, TypeAttr], tuple[str, TypeAttr]] = field(default_factory=dict)
    #: Ops missing from the op registry (custom ops) and how many nodes use each.
    unknown_ops: Mapping[str, int] = field(default_factory=dict)
    #: The ``optimal`` planner's summary (:class:`amp_rewrite.plan.optimal.PlacementSummary`).
    placement: Any = None
    #: Normalization apply nodes exempted from deny propagation -> the reason.
    normalized: Mapping[str, str] = field(default_factory=dict)
    #: Deny-list nodes inferred because their input is proven in range -> the proof
    #: (:mod:`amp_rewrite.plan.ranges`).
    bounded: Mapping[str, str] = field(default_factory=dict)
    #: Deny-list reductions cleared because their static shapes show they reduce nothing ->
    #: the proof (``[<precision>.identity]``).
    identity: Mapping[str, str] = field(default_factory=dict)

    def deny_path(self, node: str, ta: TypeAttr) -> list[tuple[str, TypeAttr]]:
        """The chain of attributes from the deny-list op to ``(node, ta)``, in data-flow order."""
        path = [(node, ta)]
        seen = {path[0]}
        while path[-1] in self.deny_parent:
            prev = self.deny_parent[path[-1]]
            if prev in seen:
                break
            seen.add(prev)
            path.append(prev)
        path.reverse()
        return path
