"""The optimal planner's whole-step check: a graph is rewritten only where the cost model
estimates the rewritten graph faster than the graph as given, and under XLA, with the faster
of two colourings.

The planner (:mod:`amp_rewrite.plan.optimal`) ranks colourings by what a colouring can change,
one node and one tensor at a time.  The step estimate (:mod:`amp_rewrite.plan.step_cost`)
prices the rewritten graph as it will run: every Cast the rewrite inserts (after it folds Cast
chains), and under XLA where fusions end.  The two disagree most on small graphs under XLA,
where Casts that the planner prices as fused end kernels of their own: on the test corpus
under XLA (gpu:8.0) the planner's plans of the RNN and transformer graphs were estimated 7-16%
slower than float32 whole, and ResNet50 inference at batch 1 on an H200 12% slower.  So, as
for a plan whose estimated gain is too small (``MIN_ESTIMATED_GAIN``), the graph then keeps
float32.

Under XLA the check also prices the greedy passes' colouring of the same free vertices (with
the same safety rules) and takes the faster of the two: there the whole-step estimate is the
model compared with a GPU's measured steps, and it found the greedy colouring of the corpus's
ResNet50 training step 1.4% faster than the cut's.  It does so also where the cut converts
nothing (the cut may have rejected Casts that XLA fuses).  Without XLA the cut is the only
candidate, and the check can still decline it: on a GPU a step may wait for the executor's
host time per kernel, which the cut does not price (its Casts cost their device time) and the
step estimate does (``StepEstimate.total_ns``), so a plan whose Casts lengthen a host-bound
step keeps float32, all of it.  There the model's error on whole steps is larger (10% on the
lent H100, ``DeviceCosts.unfused_step_error``), and so is the gain asked of a rewrite
(:func:`whole_step_margin`).

Each graph (the main graph, each function) is checked on its own, its host and device times
against each other: a function that is host-bound alone inside a step the device keeps busy
(or the reverse) is judged as if it ran alone.

The candidates are colourings of one painting (:class:`amp_rewrite.plan.painter.Painting`):
TensorFlow's passes run once per graph however many are weighed.  Sits above the rewrite
stage: the check carries a plan out on a copy of the graph to price it.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Callable, Iterable, Mapping

import networkx as nx

from .graph.op_registry import OpRegistry
from .plan.cost_model import DeviceCosts, costs_for
from .plan.decisions import Plan
from .plan.painter import Painting
from .plan.optimal import MIN_ESTIMATED_GAIN
from .plan.step_cost import StepCheck, estimate_graph
from .plan.targets import Precision, Target
from .rewrite import apply_plan

__all__ = ["check_plans", "checked_plan", "device_costs", "target_step_margin", "whole_step_margin"]

log = logging.getLogger(__name__)


def device_costs(target: Target, precision: Precision | str,
                 costs: DeviceCosts | None = None) -> Callable[[str], DeviceCosts]:
    """A node's device string -> its cost class on ``target`` for ``precision`` (``costs``
    for every device, where given), looked up once per device.  Mutates only its cache."""
    classes: dict[str, DeviceCosts] = {}

    def costs_of(device: str) -> DeviceCosts:
        if costs is not None:
            return costs
        if device not in classes:
            classes[device] = costs_for(target.place(device), precision)
        return classes[device]

    return costs_of


def _trial_copy(g: nx.MultiDiGraph) -> nx.MultiDiGraph:
    """A copy of ``g`` that :func:`~amp_rewrite.rewrite.apply_plan` may change without touching
    ``g``: its structure, and each node's attributes with their containers copied one level
    down (the rewrite edits a node's type dict in place, and replaces other values).  A
    quarter of a deep copy's time on a ResNet50 training step.  Pure."""
    trial = g.copy()  # new attribute dicts for the graph, every node and every edge
    for data in trial._node.values():  # noqa: SLF001  (networkx's node store, as the IR reads it)
        for key, value in data.items():
            if isinstance(value, (dict, set, list)):
                data[key] = copy.copy(value)
    return trial


def check_plans(g: nx.MultiDiGraph, plans: Mapping[str, Plan], target: Target, registry: OpRegistry, *,
                compiled: bool, fold_casts: bool) -> StepCheck:
    """The whole-step check of candidate ``plans`` (colouring -> a plan made for ``g``; the
    preferred first): ``g``'s step estimate as given against with each plan
    carried out (on a copy, as :func:`~amp_rewrite.rewrite.apply_plan` with ``fold_casts``
    would), priced for ``compiled`` (under XLA).  Needs ``g.graph["shapes"]`` (the cost-aware
    planners' import infers them).  Reads ``g``, changes nothing."""
    precision = next(iter(plans.values())).precision
    costs_of = device_costs(target, precision)
    given = estimate_graph(g, costs_of, registry, compiled=compiled)
    rewritten: dict[str, float] = {}
    for name, plan in plans.items():
        trial = _trial_copy(g)
        apply_plan(trial, plan, fold_casts=fold_casts)
        rewritten[name] = estimate_graph(trial, costs_of, registry, compiled=compiled).total_ns / 1e3
    classes = {costs_of(device) for _, device in g.nodes(data="device", default="")}
    return StepCheck(given.total_ns / 1e3, rewritten, whole_step_margin(classes, compiled),
                     " and ".join(sorted(c.name for c in classes)))


def whole_step_margin(classes: Iterable[DeviceCosts], compiled: bool) -> float:
    """The least estimated gain, as a fraction of the step as given, for which a whole-step
    check keeps a rewrite on devices of ``classes``: :data:`MIN_ESTIMATED_GAIN`, or without XLA
    (``compiled`` false) the largest of the classes' measured errors on whole steps
    (``DeviceCosts.unfused_step_error``: a GPU's 10%) where that is larger.  Pure."""
    errors = [] if compiled else [c.unfused_step_error for c in classes]
    return max([MIN_ESTIMATED_GAIN, *errors])


def target_step_margin(target: Target, precision: Precision | str, compiled: bool) -> float:
    """:func:`whole_step_margin` of every device of ``target`` for ``precision``.  Pure."""
    return whole_step_margin((costs_for(device, precision) for device in target.devices), compiled)


def checked_plan(g: nx.MultiDiGraph, painting: Painting, plan: Plan, target: Target, registry: OpRegistry, *,
                 compiled: bool, fold_casts: bool) -> Plan:
    """The optimal planner's ``plan`` for ``g`` (``painting``'s min-cut colouring), checked
    on the whole step.

    The candidates: the cut's plan where it converts anything, and under XLA (``compiled``)
    the greedy colouring where it converts something else.  The fastest candidate is taken if
    its step estimate is :data:`~amp_rewrite.plan.optimal.MIN_ESTIMATED_GAIN` below ``g``'s;
    else the cut's plan is declined (float32, with the check's reason), or, where the cut
    itself converts nothing, stands with its own reasons.  The check, if any candidate was
    priced, is recorded in the plan's placement.  Reads ``g``; colours ``painting`` again."""
    candidates = {"min-cut": plan} if plan.convert else {}
    if compiled:
        greedy = painting.plan(colouring="greedy")
        if greedy.convert and greedy.convert != plan.convert:
            candidates["greedy"] = greedy
    if not candidates:
        return plan
    check = check_plans(g, candidates, target, registry, compiled=compiled, fold_casts=fold_casts)
    if check.kept:
        plan = candidates[check.best]
    elif plan.convert:
        log.debug("%s: optimal plan declined: %s", g.graph.get("name") or "the graph", check.reason())
        plan = painting.plan(declined=check.reason())
    # Every colouring of a painting that placed its graph is placed.
    assert plan.placement is not None
    return dataclasses.replace(plan, placement=dataclasses.replace(plan.placement, step_check=check))
