"""The decision stage: paint every (node, type attribute) and return an explainable plan.

:func:`decide` is a pure function of a graph (IR), the effective op lists, a target and a
registry.  It reproduces the passes of TensorFlow's ``auto_mixed_precision`` optimizer, in
the same order and with the same rules (see ``shared/design/grappler_amp.md``):

0. *Gating.*  A node is processed iff it is not preserved (fetched) and is placed on a
   target device that profits from the precision.  ``FusedBatchNorm``/``FusedBatchNormGrad``
   on processed nodes become their V2 forms with ``U = float32``.
1. *Allow.*  Every type attribute of a processed allow-list op is painted allow (and, under
   ``UNSAFE_FORCE_ALL``, every attribute of every processed op that can be forced).
   Unlike TensorFlow, a float32 attribute with no low-precision kernel on its device stays
   float32 here (see ``KNOWN_DIFFERENCES.md``).
2. *Deny propagation.*  Deny spreads forward from deny-list ops through clear and infer ops
   whenever the path ends at a deny or infer op.
   TensorList clusters are then forced to one colour.
3. *Between allow.*  Clear and infer attributes on a forward path from an allow op to an
   allow op (and eligible) become allow.
4. *Infer after allow.*  An infer attribute fed directly by an allow one becomes allow,
   in node order (TensorFlow 2.20 and later run this pass in every mode; 2.16 to 2.19 only
   in their bfloat16 mode, see :func:`.passes._infer_after_allow_in_every_mode`).
5. *Through clear.*  Clear attributes connected, in either direction, to an allow attribute
   through eligible clear attributes become allow.
6. *Clean-up.*  Allow-list attributes whose type cannot be the target type are removed.
   TensorList clusters are matched again, loop back edges (NextIteration -> Merge) are
   forced to one colour, and existing ``Cast`` nodes whose consumers are all allow become
   casts to the target type.

Every painted attribute records the rule that painted it and, for a propagated deny, the
attribute it came from, so a person can ask why.

The passes are functions in :mod:`.passes` over one :class:`~.painting.PaintingState`;
:func:`paint_passes` calls them in the order above.  A cost-aware planner (``options.planner``
``"optimal"`` or ``"min-casts"``) runs after them (:func:`place`; :class:`Painting` places one
painting as often as asked): the caller hands it to :func:`decide` as a
:class:`~.painting.Placement` (:func:`amp_rewrite.plan.optimal.min_cut_placement`); this module
imports none.  The plan's types live in :mod:`.decisions` and are re-exported here.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Iterable, Literal

import networkx as nx

from ..errors import RewriteError
from ..graph import dtypes as dt
from ..graph.op_registry import OpRegistry
from ..graph.type_attrs import TypeAttr
from . import passes
from .decisions import (AttrDecision, Color, DecideOptions, NodeDecision, NodeDecisions, Plan,  # noqa: F401
                        Precision)
from .painting import PaintingState, Placement, _lists_of
from .targets import Target

__all__ = ["AttrDecision", "NodeDecision", "NodeDecisions", "Plan", "decide", "DecideOptions", "Painting",
           "Placement", "paint_passes", "place"]

log = logging.getLogger(__name__)


def paint_passes(state: PaintingState) -> list[list[str]] | None:
    """Run TensorFlow's passes on a built ``state`` (:meth:`PaintingState.build`), in
    TensorFlow's order, up to the clean-up pass.  Returns the float32 TensorList clusters a
    placement needs, or ``None`` when pass 1 painted nothing (then no other pass, and no
    placement, has anything to do).  Mutates ``state`` (its paint), nothing else."""
    clusters = passes.tensor_list_clusters(state)
    passes.tensor_list_edges(state, clusters)
    roots = passes.paint_allow(state)
    if not state.allow:
        return None
    state.had_allow = True
    passes.propagate_deny(state)
    passes.tensor_list_match(state, clusters)
    passes.paint_between_allow(state, roots)
    passes.paint_infer_after_allow(state)
    passes.paint_through_clear(state)
    passes.drop_unconvertible(state)
    passes.tensor_list_match(state, clusters)
    passes.recurrent_match(state)
    passes.existing_casts(state)
    return clusters


def place(state: PaintingState, clusters: list[list[str]], placement: Placement | None) -> None:
    """Run ``placement`` on a state painted by :func:`paint_passes` where
    ``state.options.planner`` asks for a cost-aware planner, then match existing Casts again.
    Mutates ``state`` (its paint).  Raises :class:`~amp_rewrite.errors.RewriteError` when the
    options ask for a planner and none is given."""
    options = state.options
    if options.planner in ("optimal", "min-casts") and not options.force_all:
        if placement is None:
            raise RewriteError(f"planner {options.planner!r} needs a placement: pass "
                               "amp_rewrite.plan.optimal.min_cut_placement to decide()")
        state.placement = placement(state, clusters, options)
        # The placement re-decided the float vertices: existing Casts follow their consumers.
        passes.existing_casts(state)


def decide(
    g: nx.MultiDiGraph,
    lists: object,
    target: Target,
    precision: Precision,
    registry: OpRegistry,
    options: DecideOptions = DecideOptions(),
    placement: Placement | None = None,
) -> Plan:
    """Paint ``g`` and return the plan.  Pure: ``g`` and ``lists`` are not modified.

    ``lists`` is any object with ``allow``/``infer``/``deny``/``clear`` collections of op
    names (an :class:`amp_rewrite.plan.lists.OpLists`).  ``placement`` is the cost-aware
    planner that ``options.planner`` names (:class:`~.painting.Placement`; the API passes
    :func:`amp_rewrite.plan.optimal.min_cut_placement` for ``"optimal"`` and
    ``"min-casts"``); the greedy planner needs none.  Raises
    :class:`~amp_rewrite.errors.InvalidGraphError` when the graph is inconsistent with the
    op registry (wrong input count, missing type attribute, bad loop back edge).
    """
    return Painting(g, lists, target, precision, registry, options, placement).plan()


class Painting:
    """One graph painted once by TensorFlow's passes, and the plan of each colouring a
    cost-aware placement can give it (:meth:`plan`), each exactly as :func:`decide` makes it
    with those options, without painting the graph again.

    The whole-step check (:mod:`amp_rewrite.step_check`) weighs two or three colourings of a
    graph (the cut's, the greedy passes', float32): the passes, and the problem the placement
    builds (which it keeps in the state's ``placement_memo``), are the same for all of them.
    Reads ``g``, which must not change while the painting is in use; raises as
    :func:`decide` does.
    """

    def __init__(self, g: nx.MultiDiGraph, lists: object, target: Target, precision: Precision,
                 registry: OpRegistry, options: DecideOptions = DecideOptions(),
                 placement: Placement | None = None) -> None:
        self._name: str = g.graph.get("name", "")
        self._precision = precision
        self._options = options
        self._placement = placement
        self._skip = target.skip_reason(precision)
        self._state: PaintingState | None = None
        self._clusters: list[list[str]] | None = None
        self._passes_paint: tuple[set[int], dict[int, str]] = (set(), {})
        if self._skip is not None:
            return
        state = PaintingState(g, _lists_of(lists), target, precision, registry, options)
        state.build()
        self._clusters = paint_passes(state)
        self._passes_paint = (set(state.allow), dict(state.reason))
        self._state = state

    def plan(self, colouring: Literal["min-cut", "greedy"] | None = None, declined: str | None = None) -> Plan:
        """The plan with the placement's free vertices coloured as ``colouring`` and
        ``declined`` ask (see :class:`DecideOptions`; ``None``: as the painting's options
        say).  Mutates the painting's own state only."""
        if self._skip is not None:
            low = dt.HALF if self._precision == "float16" else dt.BFLOAT16
            return Plan(self._name, self._precision, low, self._skip)
        state = self._state
        assert state is not None
        options = self._options
        if colouring is not None or declined is not None:
            options = dataclasses.replace(options, colouring=colouring or options.colouring,
                                          declined=declined if declined is not None else options.declined)
        # Back to the paint the passes left: the placement and the Cast matching after it
        # change the allow set (replaced) and the reasons, and store the placement's summary.
        state.options = options
        state.allow = set(self._passes_paint[0])
        state.reason = dict(self._passes_paint[1])
        state.placement = None
        if self._clusters is not None:
            place(state, self._clusters, self._placement)
        return to_plan(state, self._name)


def to_plan(state: PaintingState, graph_name: str) -> Plan:
    """The :class:`Plan` of a painted ``state``.  Reads ``state`` only."""
    tg = state.tg
    node_of = tg.node
    attr_of = tg.attr
    painted = state.allow
    # The pairs are made by C-level passes; iterating the same set twice gives the same
    # order, so the frozenset is built exactly as from a generator over the set.
    allow = frozenset(zip(map(node_of.__getitem__, painted), map(attr_of.__getitem__, painted)))
    v_dtype = state.v_dtype
    f32 = [v for v in sorted(painted) if v_dtype[v] == dt.FLOAT]
    convert = tuple(zip(map(node_of.__getitem__, f32), map(attr_of.__getitem__, f32)))
    fields = list(map(_decision_function(state), range(len(tg))))
    if fields:
        vcolor, vdtype, vreason, vsource = map(list, zip(*fields))
    else:
        vcolor, vdtype, vreason, vsource = [], [], [], []
    del fields
    order = state.order
    ops_l = state.ops_l
    bases = state.bases
    if log.isEnabledFor(logging.DEBUG):
        for i, name in enumerate(order):
            for v in range(bases[i], bases[i + 1]):
                if vcolor[v] in ("allow", "deny"):
                    log.debug("%s: %s %s of %s node %s: %s", graph_name or "graph",
                              vcolor[v].upper(), attr_of[v], ops_l[i], name, vreason[v])
    nodes = NodeDecisions(
        order, ops_l, state.cats_l, state.proc_l, bases, attr_of,
        vcolor, vdtype, vreason, vsource, state.low, index=state.index,
    )
    vert = lambda v: (node_of[v], attr_of[v])  # noqa: E731
    parent = {vert(k): vert(p) for k, p in state.deny_parent.items()}
    return Plan(
        graph_name=graph_name,
        precision=state.precision,
        target_dtype=state.low,
        skipped=None,
        types=state.types,
        allow=allow,
        convert=convert,
        renames=dict(state.renames),
        nodes=nodes,
        deny_parent=parent,
        unknown_ops=dict(sorted(state.unknown_ops.items())),
        placement=state.placement,
        normalized=dict(sorted(state.normalized.items())),
        bounded=dict(sorted(state.bounded.items())),
        identity=dict(sorted(state.identity.items())),
    )


def _decision_function(state: PaintingState) -> Callable[[int], tuple[str, int, str, str | None]]:
    """``(color, dtype, reason, source)`` of a vertex, as a function with the painted
    ``state`` bound once: :func:`to_plan` calls it for every vertex, and attribute lookups on
    the state per call were a good part of its cost.  Reads ``state`` only."""
    node_of = state.tg.node
    v_dtype = state.v_dtype
    v_cat = state.v_cat
    v_node = state.v_node
    ops_l = state.ops_l
    allow = state.allow
    deny = state.deny
    deny_parent = state.deny_parent
    reasons = state.reason
    normalized = state.normalized
    bounded = state.bounded
    identity = state.identity
    low = state.low
    FLOAT = dt.FLOAT
    unpainted = _unpainted_reason_function(state)
    # The profile's per-node rules that changed a node's category or painting, each with its
    # proof, appended to the pass's reason.
    rules = [(label, table) for label, table in (("normalization-aware", normalized), ("range-proven", bounded),
                                                 ("shape-proven", identity)) if table]

    def with_rules(reason: str, name: str) -> str:
        for label, table in rules:
            if name in table:
                reason = f"{reason}; {label}: {table[name]}"
        return reason

    def fields(v: int) -> tuple[str, int, str, str | None]:
        name = node_of[v]
        dtype = v_dtype[v]
        if v in allow:
            final = low if dtype == FLOAT else dtype
            return "allow", final, with_rules(reasons.get(v, "allow"), name), None
        if v in deny:
            reason = reasons.get(v, "deny")
            source = None
            if v in deny_parent:
                root = v
                hops = []
                while root in deny_parent and len(hops) < 10_000:
                    root = deny_parent[root]
                    hops.append(root)
                source = node_of[root]
                via = [node_of[h] for h in reversed(hops[:-1])]
                reason = f"downstream of deny node {source!r} ({ops_l[v_node[root]]})" + (
                    " via " + " -> ".join(repr(x) for x in via[-6:]) if via else ""
                )
            return "deny", dtype, reason, source
        cat = v_cat[v]
        color: Color = cat if cat in ("infer", "clear") else "none"  # type: ignore[assignment]
        reason = reasons.get(v)  # type: ignore[assignment]
        if reason is None:
            reason = unpainted(v, name, dtype, cat)
        return color, dtype, with_rules(reason, name), None

    return fields


def _unpainted_reason_function(state: PaintingState) -> Callable[[int, str, int, str | None], str]:
    """Why vertex ``v`` (of node ``name``, with ``dtype`` and list category ``cat``) is
    neither allow nor deny, where no pass recorded a reason: a function with the painted
    ``state`` bound once (see :func:`_decision_function`).  Reads ``state`` only."""
    v_node = state.v_node
    ops_l = state.ops_l
    types_l = state.types_l
    proc_l = state.proc_l
    kernel_missing = state.kernel_missing
    signature_bound = state.signature_bound
    preserve = state.options.preserve
    preserve_reasons = state.options.preserve_reasons
    precision = state.precision
    text = state.text
    FLOAT = dt.FLOAT

    def reason(v: int, name: str, dtype: int, cat: str | None) -> str:
        i = v_node[v]
        op = ops_l[i]
        if not types_l[i].known:
            return text("op {} is not in the op registry", op)
        if not proc_l[i]:
            if name in preserve:
                return preserve_reasons.get(name) or "preserved (fetched or excluded): keeps its dtypes"
            device = state.device_l[i] or "(default device)"
            return text("device {} is not eligible for " + precision, device)
        if dtype != FLOAT:
            return text("type {} is not float32", dt.name(dtype))
        if v in kernel_missing:
            return text("no " + precision + " kernel for {} on this device", op)
        if name in signature_bound:
            return signature_bound[name]
        if cat == "allow":
            return "allow-list op not painted"
        if cat == "infer":
            return "infer op not between allow-list ops"
        if cat == "clear":
            return "clear op with no allow neighbour" if state.supports(v) else (
                text("no " + precision + " kernel for {}", op))
        if state.had_allow:
            return text("{} is on no list", op)
        return "no allow-list op in the graph"

    return reason


def iter_vertices(plan: Plan) -> Iterable[tuple[str, TypeAttr, AttrDecision]]:
    """Every (node, type attr, decision) of a plan, in node order."""
    for name, nd in plan.nodes.items():
        for ta, d in nd.attrs.items():
            yield name, ta, d
