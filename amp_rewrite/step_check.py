"""The optimal planner's whole-step check: a graph is rewritten only where the cost model
estimates the rewritten graph faster than the graph as given.

The planner (:mod:`amp_rewrite.plan.optimal`) ranks colourings by what a colouring can change,
one node and one tensor at a time.  The step estimate (:mod:`amp_rewrite.plan.step_cost`)
prices the rewritten graph as it will run: every Cast the rewrite inserts (after it folds Cast
chains), and under XLA where fusions end.  The two disagree most on small graphs under XLA,
where Casts that the planner prices as fused end kernels of their own: on the test corpus
under XLA (gpu:8.0) the planner's plans of the RNN and transformer graphs were estimated 7-16%
slower than float32 whole, and ResNet50 inference at batch 1 on an H200 12% slower.  So, as
for a plan whose estimated gain is too small (``MIN_ESTIMATED_GAIN``), the graph then keeps
float32.

Sits above the rewrite stage: the check carries a plan out on a copy of the graph to price it.
"""

from __future__ import annotations

import copy
from typing import Callable

import networkx as nx

from .graph.op_registry import OpRegistry
from .plan.cost_model import DeviceCosts, costs_for
from .plan.decisions import Plan
from .plan.optimal import MIN_ESTIMATED_GAIN
from .plan.step_cost import StepCheck, estimate_graph
from .plan.targets import Precision, Target
from .rewrite import apply_plan

__all__ = ["check_plan", "device_costs"]


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


def check_plan(g: nx.MultiDiGraph, plan: Plan, target: Target, registry: OpRegistry, *, compiled: bool,
               fold_casts: bool) -> StepCheck:
    """The whole-step check of ``plan`` (made by ``decide`` for ``g``): ``g``'s step estimate
    as given against with ``plan`` carried out (on a copy, as :func:`~amp_rewrite.rewrite.apply_plan`
    with ``fold_casts`` would), priced for ``compiled`` (under XLA).  Needs ``g.graph["shapes"]``
    (the cost-aware planners' import infers them).  Reads ``g``, changes nothing."""
    costs_of = device_costs(target, plan.precision)
    # A deep copy: the rewrite changes the nodes' type dicts in place.
    trial = copy.deepcopy(g)
    apply_plan(trial, plan, fold_casts=fold_casts)
    given = estimate_graph(g, costs_of, registry, compiled=compiled)
    rewritten = estimate_graph(trial, costs_of, registry, compiled=compiled)
    classes = sorted({costs_of(device).name for _, device in g.nodes(data="device", default="")})
    return StepCheck(given.total_ns / 1e3, rewritten.total_ns / 1e3, MIN_ESTIMATED_GAIN, " and ".join(classes))
