"""The optimal planner on graphs of user size: no recursion over the graph, linear time on long
chains, and the fast solver's answers identical to the networkx min cut it replaced (issue 24,
F9c and F10).
"""

from __future__ import annotations

import math
import random
import sys
import time

import networkx as nx
import pytest
from tensorflow.core.framework import graph_pb2, node_def_pb2, types_pb2

import amp_rewrite
import corpus
from amp_rewrite.plan.optimal import _CAST_PENALTIES
from amp_rewrite.plan.mincut import FREE, HIGH, LOW, PlacementProblem, _int, solve

F32 = types_pb2.DT_FLOAT


# ------------------------------------------------------------------ F9c: no recursion


def _relu_chain_consumer_first(relus: int) -> tuple[graph_pb2.GraphDef, str]:
    """``MatMul(x, const) -> Relu -> ... -> Relu`` with the Relus listed last first, so the first
    node the planner prices is the one farthest from the MatMul.  Returns the GraphDef and
    the last Relu's name.  Pure."""
    nodes = []
    x = node_def_pb2.NodeDef(name="x", op="Placeholder")
    x.attr["dtype"].type = F32
    x.attr["shape"].shape.dim.add(size=8)
    x.attr["shape"].shape.dim.add(size=64)
    w = node_def_pb2.NodeDef(name="w", op="Const")
    w.attr["dtype"].type = F32
    value = w.attr["value"].tensor
    value.dtype = F32
    value.tensor_shape.dim.add(size=64)
    value.tensor_shape.dim.add(size=64)
    value.float_val.append(0.01)
    mm = node_def_pb2.NodeDef(name="mm", op="MatMul", input=["x", "w"])
    mm.attr["T"].type = F32
    nodes += [x, w, mm]
    prev = "mm"
    for i in range(relus):
        relu = node_def_pb2.NodeDef(name=f"relu{i}", op="Relu", input=[prev])
        relu.attr["T"].type = F32
        nodes.append(relu)
        prev = relu.name
    gd = graph_pb2.GraphDef()
    gd.versions.producer = 1994
    gd.node.extend(reversed(nodes))
    return gd, prev


def test_a_long_relu_chain_listed_consumer_first_plans_without_recursion():
    """Whether a Relu is folded into the MatMul before it was decided by recursing once per
    Relu: a valid graph of a few thousand Relus overflowed the stack (RecursionError; the
    limit is 3000 once TensorFlow is imported).  The plan goes through.  On a GPU nothing
    fuses into a MatMul, so every Relu is a kernel, priced as an H200 ran them (a gain in
    float16); the step, 5,000 kernels, waits for the executor's host time, and the whole-step
    check keeps float32."""
    relus = max(5000, sys.getrecursionlimit() + 2000)
    gd, last = _relu_chain_consumer_first(relus)
    result = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="optimal", fetches=[last],
                                           use_env=False)
    placement = result.report["placement"]
    assert placement["free_vertices"] >= relus
    problem = result.plans[""].placement.problem
    assert problem is not None
    assert sum(1 for c in problem.cost_low if c) >= relus
    assert placement["step_check"]["chosen"] == "given" and result.report["converted_nodes"] == 0


# ------------------------------------------------------------------ F10: exact and fast


def _reference_solve(problem: PlacementProblem) -> list[bool]:
    """The solver before issue 24: Lawler's network in networkx, one preflow-push minimum cut
    over all free vertices, float32 = the vertices that reach the sink in the residual
    network.  Kept here as the oracle the fast solver must match vertex for vertex.  Pure."""
    fixed = problem.fixed
    low = [f == LOW for f in fixed]
    free = [v for v in range(len(fixed)) if fixed[v] == FREE]
    if not free:
        return low
    g = nx.DiGraph()
    g.add_nodes_from(["s", "t"])

    def add(u: object, v: object, cap: int | None) -> None:
        if cap is not None and cap <= 0:
            return
        if g.has_edge(u, v):
            if cap is None or "capacity" not in g[u][v]:
                g[u][v].pop("capacity", None)
            else:
                g[u][v]["capacity"] += cap
        elif cap is None:
            g.add_edge(u, v)
        else:
            g.add_edge(u, v, capacity=cap)

    for v in free:
        g.add_node(v)
        d = _int(problem.cost_high[v]) - _int(problem.cost_low[v])
        if d > 0:
            add("s", v, d)
        elif d < 0:
            add(v, "t", -d)
    for i, (members, cost) in enumerate(problem.tensors):
        w = None if math.isinf(cost) else _int(cost)
        if w is not None and w <= 0:
            continue
        nodes: list[object] = []
        has_low = has_high = False
        for m in members:
            if fixed[m] == LOW:
                has_low = True
            elif fixed[m] == HIGH:
                has_high = True
            elif m not in nodes:
                nodes.append(m)
        if not nodes or (has_low and has_high):
            continue
        nodes += ["s"] * has_low + ["t"] * has_high
        if len(nodes) == 2:
            add(nodes[0], nodes[1], w)
            add(nodes[1], nodes[0], w)
        elif len(nodes) > 2:
            for m in nodes:
                add(m, ("in", i), None)
                add(("out", i), m, None)
            add(("in", i), ("out", i), w)
    _, (source_side, _) = nx.minimum_cut(g, "s", "t", flow_func=nx.algorithms.flow.preflow_push)
    for v in free:
        low[v] = v in source_side
    return low


def _random_problem(rng: random.Random, n: int) -> PlacementProblem:
    """A problem with ties everywhere: costs on a coarse grid, hyperedges of 2 to 4 members,
    fixed vertices on both sides, and sometimes an uncuttable group of free vertices."""
    fixed = [rng.choice([FREE, FREE, FREE, HIGH, LOW]) for _ in range(n)]
    grid = [0.0, 0.0, 0.5, 1.0, 2.0, 3.0, 10.0]
    high = [rng.choice(grid) * rng.choice([1.0, 1.0, 1 / 16]) for _ in range(n)]
    low = [rng.choice(grid) * rng.choice([1.0, 1.0, 1 / 16]) for _ in range(n)]
    tensors: list[tuple[tuple[int, ...], float]] = [
        (tuple(rng.randrange(n) for _ in range(rng.choice([2, 2, 2, 3, 4]))),
         rng.choice([0.0, 0.5, 1.0, 1.0, 2.0, 4.0]))
        for _ in range(rng.randint(0, 2 * n))]
    free = [v for v in range(n) if fixed[v] == FREE]
    if len(free) >= 2 and rng.random() < 0.3:
        tensors.append((tuple(rng.sample(free, min(len(free), rng.randint(2, 4)))), math.inf))
    return PlacementProblem(fixed, high, low, tensors)


@pytest.mark.parametrize("size", [8, 30, 200])
def test_solver_matches_the_networkx_min_cut_on_random_problems(size):
    """Ties decide most of these, so any solver that is not exactly the smallest sink side
    (every reduction, every residual search) shows up as a different vertex."""
    rng = random.Random(size)
    for _ in range({8: 2000, 30: 500, 200: 40}[size]):
        problem = _random_problem(rng, rng.randint(1, size))
        assert solve(problem) == _reference_solve(problem), problem


def _guard_variants(problem: PlacementProblem) -> list[PlacementProblem]:
    """The problem and the Cast-priced versions of it that ``optimal._guard`` solves."""
    return [problem] + [PlacementProblem(problem.fixed, problem.cost_high, problem.cost_low,
                                         [(m, c * f) for m, c in problem.tensors])
                        for f in _CAST_PENALTIES]


@pytest.mark.parametrize("name", ["mlp/inference", "transformer/inference", "transformer/training",
                                  "mobilenetv2/inference"])
@pytest.mark.parametrize("target, precision, planner", [("gpu:8.0", "float16", "optimal"),
                                                        ("cpu", "bfloat16", "optimal"),
                                                        ("gpu:8.0", "float16", "min-casts")])
def test_solver_matches_the_networkx_min_cut_on_corpus_problems(name, target, precision, planner):
    """The problems the planner really solves, with the guard's repricings of them."""
    item = corpus.build(name)
    result = amp_rewrite.rewrite_graph_def(item.graph_def, target=target, precision=precision,
                                           lists="optimal", planner=planner, fetches=list(item.fetches),
                                           functions="reachable", use_env=False)
    summary = result.plans[""].placement
    assert summary is not None and summary.free_vertices > 0
    for problem in _guard_variants(summary.problem):
        assert solve(problem) == _reference_solve(problem)


def _chain_problem(blocks: int) -> PlacementProblem:
    """A long free chain like a deep MLP's: per block a MatMul that gains from converting,
    three neutral ops and an op that loses a little, joined by Casts that cost far more than
    either (so the chain is one component that no local bound settles), an output that must
    stay float32 at the end, and the occasional cheaper Cast.  Pure."""
    fixed: list[int] = []
    high: list[float] = []
    low: list[float] = []
    tensors: list[tuple[tuple[int, ...], float]] = []
    for b in range(blocks):
        for k, (h, lo) in enumerate([(140.0, 6.0), (0.0, 0.0), (0.0, 20.0), (0.0, 0.0), (0.0, 0.0)]):
            v = len(fixed)
            fixed.append(FREE)
            high.append(h)
            low.append(lo)
            if v:
                tensors.append(((v - 1, v), 400.0 if (b + k) % 7 else 30.0))
            if k == 4 and b % 4 == 0 and b:
                tensors.append(((v, v - 9, v - 3), 2000.0))  # a residual: a three-member tensor
    out = len(fixed)
    fixed.append(HIGH)
    high.append(0.0)
    low.append(0.0)
    tensors.append(((out - 1, out), 2000.0))
    return PlacementProblem(fixed, high, low, tensors)


def test_solver_is_exact_and_linear_on_a_long_chain():
    """networkx's preflow-push grew as n ** 1.7 on chains (400k nodes: 147 s).  The solver
    must stay linear: 8x the chain may take at most 16x the time (n ** 1.7 would be 34x),
    and the answer is the reference's."""
    small = _chain_problem(400)
    assert solve(small) == _reference_solve(small)

    def seconds(problem: PlacementProblem) -> float:
        # CPU time, the best of two: on a shared machine wall time counts other processes too.
        best = math.inf
        for _ in range(2):
            t = time.process_time()
            solve(problem)
            best = min(best, time.process_time() - t)
        return best

    short, long = _chain_problem(4_000), _chain_problem(32_000)
    ratio = seconds(long) / seconds(short)
    assert ratio < 16, f"8x the chain took {ratio:.1f}x the time"
