"""The ``optimal`` planner: re-decide the free vertices of a painted graph with a minimum cut.

TensorFlow's passes (run first, by :mod:`amp_rewrite.plan.painter`) fix what safety requires:
deny-list ops and the paths deny propagates along stay float32, and only ops on the four
lists can change type.  Within those rules TensorFlow colours greedily.  Here the *free*
vertices -- allow-list attributes (they may stay float32 where converting does not pay) and
the infer/clear attributes connected to them that TensorFlow could also have painted -- are
coloured to minimize the estimated time of the graph (:mod:`amp_rewrite.plan.cost_model`): node
costs in each precision plus one Cast per (tensor, direction), solved exactly as a minimum
cut (:mod:`amp_rewrite.plan.mincut`).  Only what runs costs time
(:mod:`amp_rewrite.graph.liveness`): a node that nothing its graph's results, fetches or
stateful ops need is pruned by TensorFlow, and so is a Cast that only it would read.

Vertices whose colour TensorFlow ties to others (TensorList clusters, loop back edges) are
decided together, as one unit, where the greedy passes put the whole group in low precision
(float32 for all of it is always valid), and keep the greedy decision otherwise (always,
under ``goal="min-casts"``, which converts what TensorFlow converts).  Existing
Casts are re-matched after the cut (by the painter, after every placement).

Under ``goal="optimal"``, everything upstream of a normalization whose statistics reduce
two or three values (:func:`amp_rewrite.plan.normalization.upstream_of_fragile`) stays float32:
rounding what feeds it can flip the signs it outputs, so no estimated gain is worth it.
TensorFlow's rewrite does not know this, and ``min-casts`` follows TensorFlow.

The planner plugs into the painter as a :class:`~amp_rewrite.plan.painting.Placement`:
:func:`min_cut_placement`, which the API hands to :func:`amp_rewrite.plan.painter.decide`.  It
reads only the documented interface of :class:`~amp_rewrite.plan.painting.PaintingState`, and
mutates the state it is given (its ``allow`` set and reasons) and nothing else.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import networkx as nx

from ..graph import ir
from ..graph.liveness import live_nodes
from .cost_model import DENSE_OPS, DeviceCosts, cast_cost, constant_nodes, costs_for, elements, node_cost
from . import grappler_folds
from .normalization import upstream_of_fragile
from .step_cost import BUFFER_OPS, StepCheck
from .mincut import FREE, HIGH, LOW, PlacementProblem, objective, solve
from ..graph.shapes import Shape
from ..graph.type_attrs import TypeAttr
from .cut_guard import _CAST_PENALTIES, _cast_metrics, _guard  # noqa: F401  (tests and tools read them here)
from .decisions import DecideOptions
from .painting import PaintingState

__all__ = ["PlacementSummary", "min_cut_placement", "place_optimally"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlacementSummary:
    """Estimated cost (microseconds) of the graph under three colourings, and what changed."""

    float32_us: float
    greedy_us: float
    optimal_us: float
    free_vertices: int
    to_low: int  #: vertices the cut converts that the greedy passes left float32
    to_high: int  #: vertices the greedy passes converted that the cut keeps float32
    misaligned: dict[str, tuple[int, ...]]  #: allow-list nodes whose dims miss the multiple
    #: The problem solved and its solution (for tests and tools; not in the report).
    problem: PlacementProblem | None = field(default=None, repr=False, compare=False)
    solution: tuple[bool, ...] = field(default=(), repr=False, compare=False)
    objective: str = "optimal"
    #: The time-optimal cut would have added Casts or Cast bytes over the greedy colouring,
    #: so the fastest colouring that does not was taken instead (see ``_guard``).
    guarded: bool = False
    #: The best colouring's estimated gain over float32 was below :data:`MIN_ESTIMATED_GAIN`,
    #: so every free vertex stays float32.
    below_margin: bool = False
    #: Fragile normalizations found (:func:`amp_rewrite.plan.normalization.upstream_of_fragile`), and
    #: the free vertices kept float32 because they feed one (or reach allow-list ops only
    #: through vertices that do).
    fragile_normalizations: int = 0
    upstream_float32: int = 0
    #: The colouring taken: the cut's (``"min-cut"``), the greedy passes' (``"greedy"``, the
    #: whole-step check's other candidate), or ``"float32"`` (the check declined the plan).
    #: The ``optimal`` estimate, ``to_low`` and ``to_high`` are of this colouring.
    colouring: str = "min-cut"
    #: The API's whole-step check of the plan (:class:`~amp_rewrite.plan.step_cost.StepCheck`),
    #: added after the cut (``None`` before, and for plans it did not check).
    step_check: StepCheck | None = None

    def as_dict(self) -> dict[str, Any]:
        # Under "min-casts" the three figures are kilobytes moved by Casts, not microseconds.
        key = "estimated_cast_kb" if self.objective == "min-casts" else "estimated_us"
        return {
            "objective": self.objective,
            key: {"float32": round(self.float32_us, 1), "greedy": round(self.greedy_us, 1),
                  "optimal": round(self.optimal_us, 1)},
            "free_vertices": self.free_vertices,
            "guarded": self.guarded,
            "below_margin": self.below_margin,
            "fragile_normalizations": self.fragile_normalizations,
            "upstream_float32": self.upstream_float32,
            "to_low": self.to_low,
            "to_high": self.to_high,
            "misaligned": {k: list(v) for k, v in sorted(self.misaligned.items())},
            **({"colouring": self.colouring, "step_check": self.step_check.as_dict()}
               if self.step_check is not None else {}),
        }


#: The least estimated gain, as a fraction of the float32 estimate, for which the planner
#: converts anything.  The cost model ranks colourings well but its error on a whole step is
#: several percent: in the 2026-11-25 benchmark run a MobileNetV2 training step estimated 2.6%
#: faster ran 10% slower than float32, while every graph estimated at least 3.3% faster ran
#: faster (by 1-35%).  "Never slower than float32" is worth more than a gain that small.
MIN_ESTIMATED_GAIN = 0.03


def _spread_freedom(tg: Any, cat: list[str], elig: list[bool], free_groups: list[list[int]]) -> list[bool]:
    """Free vertices: the eligible ones connected, through eligible vertices, to an eligible
    allow-list vertex (TensorFlow never converts an infer op that no allow op reaches, and
    neither do we), and the members of ``free_groups``."""
    n = len(elig)
    free = [False] * n
    for r in range(n):
        if not elig[r] or cat[r] != "allow" or free[r]:
            continue
        free[r] = True
        stack = [r]
        while stack:
            x = stack.pop()
            for y in tg.fanin[x] + tg.fanout[x]:
                if elig[y] and not free[y]:
                    free[y] = True
                    stack.append(y)
    for g in free_groups:
        for v in g:
            free[v] = True
    return free


def _tied_groups(p: PaintingState, clusters: list[list[str]]) -> list[list[int]]:
    """Groups of vertices TensorFlow forces to one type, which no Cast can separate: the
    element types of a TensorList cluster (they pass a variant handle) and the two ends of a
    loop back edge (NextIteration -> Merge).  Overlapping groups are merged; each group is
    sorted, and the groups are in order of their first vertex.  Pure."""
    ties = nx.Graph()
    for members in clusters:
        nx.add_path(ties, [v for v in (p.tl_float(m) for m in members) if v is not None])
    t_attr = TypeAttr("T", -1, 0)
    for name in p.order:
        if p.ops[name] == "NextIteration":
            ends = [p.tg.index.get((x, t_attr)) for x in [name] + [dst for dst, _, _ in ir.consumers(p.g, name, 0)]]
            nx.add_path(ties, [v for v in ends if v is not None])
    return sorted((sorted(g) for g in nx.connected_components(ties)), key=lambda g: g[0])


def _constant_nodes(p: PaintingState) -> frozenset[str]:
    """:func:`~amp_rewrite.plan.cost_model.constant_nodes` of ``p``'s graph, from the facts
    ``p`` holds already.  Pure."""
    return constant_nodes(p.order, p.ops, p.inputs, p.registry)


class _Pricing:
    """Tensor shapes and per-device costs for one graph, looked up once per device.

    Under a loop body (``g.graph["loop_body"]``) the ops run one after another, once per
    iteration: there a Cast costs what it costs in a chain, not the in-place price measured
    among a model's parallel branches, so ``cast_in_place`` is dropped.  Mutates only its
    cache."""

    def __init__(self, p: PaintingState) -> None:
        self.p = p
        self.shapes: dict[str, tuple[Shape, ...]] = p.g.graph.get("shapes") or {}
        self.serial = bool(p.g.graph.get("loop_body"))
        self._device_costs: dict[str, DeviceCosts] = {}

    def out_shape(self, src: str, port: int) -> Shape:
        s = self.shapes.get(src)
        return s[port] if s is not None and port < len(s) else None

    def costs_of(self, name: str) -> DeviceCosts:
        device = self.p.g._node[name]["device"]
        got = self._device_costs.get(device)
        if got is None:
            got = costs_for(self.p.target.place(device), self.p.precision)
            if self.serial and got.cast_in_place is not None:
                got = replace(got, cast_in_place=None)
            self._device_costs[device] = got
        return got


@dataclass
class _Freedom:
    """Which vertices the cut decides (``free``), the tied groups decided as one unit
    (``free_groups``), the vertices held float32 upstream of a fragile normalization
    (``held``: vertex -> (normalization, values reduced), or ``None`` for a vertex that
    reached allow-list ops only through held ones), and the fragile normalizations found."""

    free: list[bool]
    free_groups: list[list[int]]
    held: dict[int, tuple[str, int] | None]
    fragile_norms: Any


def _eligible(p: PaintingState, v: int, tied: set[int], greedy: set[int]) -> bool:
    """Whether vertex ``v`` may be re-decided by the cut on its own (before freedom spreads
    from allow-list vertices).  Pure."""
    cat = p.v_cat
    if v in tied or v in p.deny or not p.v_proc[v] or not p.is_f32(v):
        return False
    name = p.tg.node[v]
    if p.ops[name] == "Cast":
        return False
    if cat[v] == "allow":
        return v in greedy
    if cat[v] in ("infer", "clear"):
        if v in p.kernel_missing or not p.supports(v):
            return False
        return not (cat[v] == "clear" and p.reads_ref_var(name))
    return False


def _find_freedom(p: PaintingState, clusters: list[list[str]], greedy: set[int], min_casts: bool) -> _Freedom:
    """The free vertices of ``p`` and the tied groups among them (see :class:`_Freedom`).
    Reads ``p`` only."""
    tg = p.tg
    n = len(tg)
    cat = p.v_cat
    groups = _tied_groups(p, clusters)
    tied = {v for g in groups for v in g}
    # A tied group that the greedy passes put wholly in low precision is free as a unit: float32
    # for all of it is the original graph, always valid, and the cut may prefer it (a
    # recurrent cell of tiny MatMuls whose Casts cost more than they save).  Its members are
    # tied by an uncuttable hyperedge below, and they pass freedom on like any eligible
    # vertex (the ops feeding a TensorList reach the MatMuls of the loop only through it).
    # Other groups keep their greedy colour.  A deny-list member does not stop a group that the
    # passes painted low (recurrent matching ties a loop's plumbing across it): float32 for the
    # whole group is still the original graph, and keeping the group low because one of its
    # members is on the deny list would convert *more* as the deny list grows.
    free_groups = [] if min_casts else [
        g for g in groups
        if all(v in greedy and p.is_f32(v) and p.v_proc[v]
               and p.ops[tg.node[v]] != "Cast" for v in g)]
    elig = [_eligible(p, v, tied, greedy) for v in range(n)]
    for g in free_groups:
        for v in g:
            elig[v] = True
    free = _spread_freedom(tg, cat, elig, free_groups)
    # Upstream of a fragile normalization nothing is free: it stays float32 (a tied group as a
    # whole, if any member is upstream), and so does a vertex that reached an allow-list op
    # only through such vertices -- float32 is valid for every free vertex.
    info = p.norm_info
    fragile_norms = info.fragile if info is not None and not min_casts else ()
    fragile = upstream_of_fragile(p.g, info) if fragile_norms else {}
    held: dict[int, tuple[str, int] | None] = {}
    if fragile:
        for v in range(n):
            got = fragile.get(tg.node[v])
            if free[v] and got is not None:
                held[v] = (got[0].mean, got[1])
        for g in free_groups:
            hit = next((held[v] for v in g if v in held), None)
            if hit is not None:
                held.update((v, hit) for v in g)
        if held:
            for v in held:
                elig[v] = False
            was_free = free
            free_groups = [g for g in free_groups if g[0] not in held]
            free = _spread_freedom(tg, cat, elig, free_groups)
            held.update((v, None) for v in range(n) if was_free[v] and not free[v] and v not in held)
    return _Freedom(free, free_groups, held, fragile_norms)


def _fixed_colours(p: PaintingState, freedom: _Freedom, greedy: set[int], min_casts: bool) -> list[int]:
    """Per vertex: ``FREE`` for the cut to decide, else its fixed side.  Vertices the cut does
    not decide keep the greedy colour (other tied groups, and whatever the passes painted
    outside the free set), except existing Casts, which are matched to their consumers again
    afterwards.  Under min-casts every free allow-list vertex is low.  Pure."""
    tg = p.tg
    free, held = freedom.free, freedom.held
    fixed = [FREE if free[v] else (
        LOW if v in greedy and p.is_f32(v) and p.ops[tg.node[v]] != "Cast" and v not in held else HIGH)
        for v in range(len(tg))]
    if min_casts:
        fixed = [LOW if f == FREE and p.v_cat[v] == "allow" else f for v, f in enumerate(fixed)]
    return fixed


def _unary_costs(p: PaintingState, free: list[bool], pricing: _Pricing, shape_aware: bool,
                 compiled: bool, live: frozenset[str] | None
                 ) -> tuple[list[float], list[float], dict[str, tuple[int, ...]], frozenset[str]]:
    """``(cost_high, cost_low, misaligned, consts)``: each node's time goes on its first free
    vertex, in each precision, where it runs (``live``, :func:`~amp_rewrite.graph.liveness.live_nodes`;
    ``None``: every node); the allow-list nodes whose dimensions miss the device's multiple;
    the constant nodes (:func:`_constant_nodes`).  Reads ``p`` only."""
    tg = p.tg
    n = len(tg)
    cat = p.v_cat
    cost_high = [0.0] * n
    cost_low = [0.0] * n
    misaligned: dict[str, tuple[int, ...]] = {}
    folded: grappler_folds.FoldMemo = {}
    consts = _constant_nodes(p)
    # A swish is priced as one fused kernel, on its Sigmoid, where the device has the fusion;
    # its Muls cost nothing more.
    swishes = {name: parts for name in p.order
               if p.ops[name] == "Sigmoid" and grappler_folds.FUSED_SWISH in pricing.costs_of(name).elementwise
               for parts in [grappler_folds.swish_parts(p.g, p.ops, p.inputs, name, consts)] if parts}
    swish_muls = {m for parts in swishes.values() for m in parts}

    def onednn(dense: str) -> bool:
        # Under XLA, XLA's fusion decides, not Grappler's GPU rules (:mod:`.grappler_folds`):
        # the planner keeps pricing a frozen dense op's scale, bias and activation as folded
        # there, as it did before those rules (a bias and an activation go into the dense op's
        # fusion), where the step estimate prices each as a fused op's bytes.
        return compiled or pricing.costs_of(dense).fuses_bias_activation

    def unfused_by_low_conv(name: str, conv: str) -> None:
        # ``name`` runs inside the float32 convolution ``conv`` (cuDNN's fusion), but as a
        # kernel of its own, in low precision, once ``conv`` is converted: its price goes on
        # the convolution's low colour.
        conv_carrier = next((v for v in tg.by_node[conv] if free[v]), None)
        if conv_carrier is not None:
            device = pricing.costs_of(name)
            ins = [pricing.out_shape(src, port) for src, port in p.inputs[name]]
            nc = node_cost(p.ops[name], ins, list(pricing.shapes.get(name, ())), 2, device,
                           shape_aware=shape_aware, compiled=compiled)
            cost_low[conv_carrier] += nc.low + device.kernel_overhead

    for name in p.order:
        op = p.ops[name]
        if (op not in DENSE_OPS and name not in consts and (live is None or name in live)
                and (conv := grappler_folds.float32_fusion(p.g, p.ops, p.inputs, name, consts, folded,
                                                           onednn)) is not None):
            unfused_by_low_conv(name, conv)
            continue
        vs = tg.by_node[name]
        carrier = next((v for v in vs if free[v]), None)
        if carrier is None:
            continue
        ins = [pricing.out_shape(src, port) for src, port in p.inputs[name]]
        outs = list(pricing.shapes.get(name, ()))
        # Nothing runs for a node nothing that runs needs (TensorFlow prunes it), a constant
        # (folded when the graph is loaded), an op folded into a frozen dense op, or a swish's
        # Mul (priced with its Sigmoid).
        if ((live is not None and name not in live) or name in consts or name in swish_muls
                or (op not in DENSE_OPS and grappler_folds.is_folded(p.g, p.ops, p.inputs, name, consts, folded,
                                                                     onednn))):
            continue
        weights = p.inputs[name][1][0] if op in DENSE_OPS and len(p.inputs[name]) > 1 else None
        priced = grappler_folds.FUSED_SWISH if name in swishes else op
        device = pricing.costs_of(name)
        nc = node_cost(priced, ins, outs, 2, device, shape_aware=shape_aware,
                       constant_weights=weights is not None and weights in consts, compiled=compiled)
        if op in DENSE_OPS or nc.measured or compiled:
            # Dense ops, element-wise ops whose time on this device class was measured at
            # this size, and, under XLA, every element-wise op: fused, it costs the bytes of
            # its output, as a Cast does, so its gain is as sure as the Cast's price.
            # (Dropping it, the optimal plans of ResNet50, MobileNetV2 and EfficientNetB0
            # under XLA were estimated 7%, 15% and 30% slower than the default profile's on
            # an H200.)
            cost_high[carrier] += nc.high
            cost_low[carrier] += nc.low
        else:
            # Other element-wise ops: the generic ratio of a kernel is a rough guess, and a
            # gain guessed from it is not worth a Cast (the planner minimizes Casts first, as
            # TensorFlow's lists intend), but a loss -- low-precision kernels slower than
            # float32 on the target -- counts.
            cost_low[carrier] += max(0.0, nc.low - nc.high)
        if nc.misaligned and cat[carrier] == "allow":
            misaligned[name] = nc.misaligned
    return cost_high, cost_low, misaligned, consts


def _tensor_members(p: PaintingState) -> dict[tuple[str, int], list[int]]:
    """One hyperedge per float tensor ``(producer, port)``: its producer vertex, then its
    consumer vertices, in node order.  Pure."""
    tg = p.tg
    members: dict[tuple[str, int], list[int]] = {}
    for name in p.order:
        types = p.types[name]
        for q, (src, sp) in enumerate(p.inputs[name]):
            src_types = p.types.get(src)
            if src_types is None or sp >= len(src_types.outputs) or q >= len(types.inputs):
                continue
            a = tg.index[(src, src_types.outputs[sp])]
            if not p.is_f32(a):
                continue
            b = tg.index[(name, types.inputs[q])]
            m = members.setdefault((src, sp), [a])
            if b not in m:
                m.append(b)
    return members


def _tensors(p: PaintingState, freedom: _Freedom, pricing: _Pricing, consts: frozenset[str] | None,
             min_casts: bool, compiled: bool,
             live: frozenset[str] | None) -> tuple[list[tuple[tuple[int, ...], float]], list[float]]:
    """``(tensors, cast_bytes)``: the cut's hyperedges (members, cost of a Cast), one per float
    tensor with a free member, then one uncuttable edge per free tied group; and per
    hyperedge the bytes a Cast of it moves (read + write; 0 for a group), for the guard.
    Where some consumers do not run (not in ``live``, where given), they get a hyperedge of
    their own, with the producer, that costs only a token (:func:`_token_cost`): TensorFlow
    prunes a Cast that only they read, but among equally fast colourings the cut should still
    prefer the one with fewer Cast nodes.  ``consts`` is unused (``None``) under min-casts.
    Pure."""
    free = freedom.free
    node_of = p.tg.node
    # Tensors of a loop body that are the same every iteration: the rewrite makes their Casts
    # once, before the loop (amp_rewrite.loop_hoist; api sets this where the profile hoists).
    invariant = p.g.graph.get("loop_invariant") or frozenset()
    tensors = []
    cast_bytes = []
    for (src, sp), members in _tensor_members(p).items():
        if len(members) < 2 or not any(free[m] for m in members):
            continue
        c = pricing.costs_of(src)
        nbytes = 6.0 * elements(pricing.out_shape(src, sp))
        ms, dead = members, []
        if live is not None:
            ms = [members[0], *(m for m in members[1:] if node_of[m] in live)]
            dead = [m for m in members[1:] if node_of[m] not in live]
        if dead and (free[members[0]] or any(free[m] for m in dead)):
            tensors.append(((members[0], *dead), _token_cost(c)))
            cast_bytes.append(0.0)
        if len(ms) < 2 or not any(free[m] for m in ms):
            continue
        cast_bytes.append(nbytes)
        if min_casts:
            # Bytes, plus one per Cast so that fewer Casts win a tie.
            cost = 1.0 + nbytes
        elif src in consts or (src, sp) in invariant:  # type: ignore[operator]
            # A Cast of a constant is folded by Grappler when the graph is loaded: it costs
            # nothing per step (weights of frozen graphs; variables are read every step).
            # One of a loop-invariant tensor runs once per loop, not once per iteration.
            cost = _token_cost(c)
        else:
            cost = cast_cost(pricing.out_shape(src, sp), 2, c, compiled=compiled)
            if compiled and _cast_is_a_kernel(p, src, ms):
                cost += c.kernel_overhead
        tensors.append((tuple(ms), cost))
    for g in freedom.free_groups:
        if len(g) > 1:
            tensors.append((tuple(g), math.inf))
            cast_bytes.append(0.0)
    return tensors, cast_bytes


def _token_cost(costs: DeviceCosts) -> float:
    """The price of a Cast that costs no time per step (of a constant, folded when the graph
    is loaded; or read only by nodes that never run, pruned with them): a token, so that among
    equally fast colourings the cut prefers the one with fewer Cast nodes.  Pure."""
    return 0.01 * costs.op_overhead


def _cast_is_a_kernel(p: PaintingState, src: str, members: list[int]) -> bool:
    """Under XLA, whether a Cast of ``src``'s output launches a kernel of its own: XLA fuses a
    convert into the element-wise kernel that makes or reads its tensor, but not into a GEMM
    or convolution, and a buffer read (a variable each step, an argument) is no kernel to fuse
    into.  So: the tensor is a buffer's, or a dense op's read by another dense op.  The rule
    of the step estimate (:mod:`amp_rewrite.plan.step_cost`: what it counts as a kernel, net
    of the one the Cast's producer no longer ends).  Pure."""
    op = p.ops[src]
    if op in BUFFER_OPS:
        return True
    node_of = p.tg.node
    return op in DENSE_OPS and any(p.ops[node_of[m]] in DENSE_OPS for m in members[1:])


def _below_margin(problem: PlacementProblem, low: list[bool]) -> bool:
    """Whether colouring ``low``'s estimated gain over all float32 is below
    :data:`MIN_ESTIMATED_GAIN` of the float32 estimate (never for all float32 itself).  Below
    the margin the whole plan is declined, the vertices the cut did not decide included:
    keeping a loop's tied plumbing low while its MatMul goes back to float32 would add Casts
    for nothing.  All float32 is the original graph.  Pure."""
    all_high = [False] * len(low)
    if low == all_high:
        return False
    f32_cost = objective(problem, all_high)
    return f32_cost - objective(problem, low) < MIN_ESTIMATED_GAIN * f32_cost


def _apply(p: PaintingState, low: list[bool], greedy: set[int], fixed: list[int], freedom: _Freedom,
           below_margin: bool, costs: tuple[list[float], list[float]], pricing: _Pricing,
           declined: str | None = None, live: frozenset[str] | None = None) -> tuple[int, int]:
    """Make ``low`` the paint of ``p``: the cut decides float vertices; vertices already in
    low precision stay.  Records the reason of every vertex that changed colour or was held
    float32 (``declined``: the whole plan was declined, and why; ``live``: the nodes that run,
    where known).  Mutates ``p.allow`` (replaced) and ``p.reason``.  Returns ``(to_low,
    to_high)``."""
    tg = p.tg
    cat = p.v_cat
    held = freedom.held
    cost_high, cost_low = costs
    to_low = to_high = 0
    new_allow = {v for v in greedy if not p.is_f32(v)}
    for v in range(len(tg)):
        if not p.is_f32(v):
            continue
        if v in held:
            why = held[v]
            p.reason[v] = (
                f"{cat[v]} op kept float32: upstream of normalization {why[0]!r}, whose statistics "
                f"reduce only {why[1]} values, so rounding here can flip its outputs' signs"
                if why is not None else
                f"{cat[v]} op kept float32: it reaches allow-list ops only through ops kept float32 "
                "upstream of a fragile normalization")
        elif low[v]:
            new_allow.add(v)
            if v not in greedy:
                to_low += 1
                p.reason[v] = (f"{cat[v]} op placed in {p.precision} by the min-cut planner "
                               "(fewer or cheaper Casts)")
        elif v in greedy and (fixed[v] == FREE or below_margin or declined is not None):
            to_high += 1
            if declined is not None:
                p.reason[v] = f"{cat[v]} op kept float32: {declined}"
            elif live is not None and tg.node[v] not in live:
                p.reason[v] = (
                    f"{cat[v]} op kept float32: it never runs (nothing the graph's results, fetches or "
                    "stateful ops need reads it, so TensorFlow prunes it): converting it gains no time")
            elif below_margin:
                p.reason[v] = (
                    f"{cat[v]} op kept float32: the plan's estimated gain on "
                    f"{pricing.costs_of(tg.node[v]).name} is below {MIN_ESTIMATED_GAIN:.0%} of the float32 "
                    "estimate, within the cost model's error")
            elif cat[v] == "allow":
                p.reason[v] = (
                    f"{p.ops[tg.node[v]]} kept float32 by the cost model: converting does not pay "
                    f"on {pricing.costs_of(tg.node[v]).name} (est. {cost_high[v] / 1e3:.1f} us in float32 vs "
                    f"{cost_low[v] / 1e3:.1f} us plus Casts)"
                )
            else:
                p.reason[v] = f"{cat[v]} op kept float32 by the min-cut planner (saves Casts)"
    p.allow = new_allow
    return to_low, to_high


@dataclass(frozen=True)
class _Prepared:
    """What every colouring of one painting shares: the paint the greedy passes left
    (``greedy``), the free vertices and fixed colours, the prices and the problem the cut
    solves.  Depends only on the paint before the placement, which the painter restores
    before each colouring (:class:`amp_rewrite.plan.painter.Painting`).  Read-only."""

    goal: str  #: ``"optimal"`` or ``"min-casts"`` (see :func:`place_optimally`)
    greedy: frozenset[int]
    freedom: _Freedom
    fixed: list[int]
    pricing: _Pricing
    unary: tuple[list[float], list[float]]
    misaligned: dict[str, tuple[int, ...]]
    cast_bytes: Any
    problem: PlacementProblem
    before: list[bool]
    #: The nodes that run (:func:`~amp_rewrite.graph.liveness.live_nodes`); ``None``: all.
    live: frozenset[str] | None = None


def _prepare(p: PaintingState, clusters: list[list[str]], shape_aware: bool, goal: str,
             compiled: bool) -> _Prepared:
    """The placement problem of painted ``p`` (see :func:`place_optimally`).  Reads ``p`` only."""
    min_casts = goal == "min-casts"
    n = len(p.tg)
    greedy = set(p.allow)
    freedom = _find_freedom(p, clusters, greedy, min_casts)
    fixed = _fixed_colours(p, freedom, greedy, min_casts)
    pricing = _Pricing(p)
    # Time is spent only on what runs; min-casts counts the Casts of the graph as written.
    live = None if min_casts else live_nodes(p.g, p.registry, p.g.graph.get("fetches"))
    if min_casts:
        # Only Cast bytes count: no node is priced.
        cost_high, cost_low, misaligned, consts = [0.0] * n, [0.0] * n, {}, None
    else:
        cost_high, cost_low, misaligned, consts = _unary_costs(p, freedom.free, pricing, shape_aware, compiled,
                                                               live)
    tensors, cast_bytes = _tensors(p, freedom, pricing, consts, min_casts, compiled, live)
    problem = PlacementProblem(fixed, cost_high, cost_low, tensors)
    return _Prepared(goal, frozenset(greedy), freedom, fixed, pricing, (cost_high, cost_low), misaligned,
                     cast_bytes, problem, [v in greedy for v in range(n)], live)


def _colour(p: PaintingState, prep: _Prepared, declined: str | None,
            colouring: Literal["min-cut", "greedy"]) -> PlacementSummary:
    """Colour the free vertices of ``prep``'s problem as ``colouring`` and ``declined`` ask
    (see :func:`place_optimally`) and make that ``p``'s paint.  Mutates ``p``'s paint."""
    n = len(p.tg)
    problem, fixed, greedy = prep.problem, prep.fixed, prep.greedy
    min_casts = prep.goal == "min-casts"
    take_greedy = colouring == "greedy" and not min_casts
    guarded = below_margin = False
    if declined is not None:
        # Declined by the whole-step check: float32, whatever a cut would say (none is solved).
        low = [False] * n
    elif take_greedy:
        # The greedy colouring of the free vertices, the rest fixed as the cut would have it.
        low = [f == LOW or (f == FREE and v in greedy) for v, f in enumerate(fixed)]
    else:
        low = solve(problem)
    if not min_casts and not take_greedy and declined is None:
        # A copy: the guard may hand back the colouring it was given, and prep is shared by
        # every colouring of the painting.
        guarded_low = _guard(problem, low, list(prep.before), prep.cast_bytes, fixed, p.v_cat)
        guarded = guarded_low is not low
        low = guarded_low
        below_margin = _below_margin(problem, low)
    if below_margin:
        low = [False] * n
    summary_costs = (objective(problem, [False] * n), objective(problem, prep.before), objective(problem, low))
    to_low, to_high = _apply(p, low, greedy, fixed, prep.freedom, below_margin, prep.unary, prep.pricing,
                             declined, prep.live)
    freedom = prep.freedom
    summary = PlacementSummary(
        summary_costs[0] / 1e3, summary_costs[1] / 1e3, summary_costs[2] / 1e3,
        sum(freedom.free), to_low, to_high, prep.misaligned, problem, tuple(low), prep.goal, guarded, below_margin,
        len(freedom.fragile_norms), len(freedom.held),
        colouring="float32" if declined is not None else "greedy" if take_greedy else "min-cut",
    )
    _log_summary(p, summary, prep.misaligned)
    return summary


def place_optimally(p: PaintingState, clusters: list[list[str]], shape_aware: bool,
                    goal: str = "optimal", compiled: bool = False, declined: str | None = None,
                    colouring: Literal["min-cut", "greedy"] = "min-cut") -> PlacementSummary:
    """Replace the greedy colouring of ``p``'s free vertices by an optimal one.  Mutates ``p``.

    ``goal="optimal"`` minimizes the estimated time (allow-list ops may stay float32
    where converting loses); ``"min-casts"`` ties allow-list ops to low precision, as
    TensorFlow does, and minimizes the bytes moved by Casts (plus one byte per Cast, so that
    fewer Casts win a tie).  ``compiled``: the graph runs under XLA, and the cost model prices
    Casts and element-wise ops as fused (:func:`amp_rewrite.plan.cost_model.node_cost`).
    ``declined``: the whole-step check declined this graph's plan (why): every vertex the
    planner could convert stays float32, with that reason.  ``colouring="greedy"`` keeps the
    greedy passes' colouring of the free vertices instead of the cut's (the whole-step check's
    other candidate), under the same safety rules.
    """
    return _colour(p, _prepare(p, clusters, shape_aware, goal, compiled), declined, colouring)


def _log_summary(p: PaintingState, summary: PlacementSummary, misaligned: dict[str, tuple[int, ...]]) -> None:
    """Log the summary and the misaligned dense nodes, at debug level."""
    log.debug("optimal placement: %s", summary.as_dict())
    for name, dims in sorted(misaligned.items()):
        if p.ops[name] in DENSE_OPS:
            log.debug("%s (%s): dimensions %s are not multiples of the preferred size",
                      name, p.ops[name], dims)


def min_cut_placement(state: PaintingState, clusters: list[list[str]], options: DecideOptions) -> PlacementSummary:
    """The :class:`~amp_rewrite.plan.painting.Placement` of the ``optimal`` and ``min-casts``
    planners: :func:`place_optimally` with the goal and knobs of ``options``.  Mutates
    ``state``'s paint (see :func:`place_optimally`), and keeps the problem it builds in
    ``state.placement_memo``, so that each further colouring of the same painting
    (:class:`amp_rewrite.plan.painter.Painting`) only solves it."""
    key = ("min-cut", options.planner, options.shape_aware, options.compiled)
    prepared = state.placement_memo.get(key)
    if prepared is None:
        prepared = _prepare(state, clusters, options.shape_aware, options.planner, options.compiled)
        state.placement_memo[key] = prepared
    return _colour(state, prepared, options.declined, options.colouring)
