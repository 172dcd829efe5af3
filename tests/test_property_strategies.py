"""The strategies themselves: drawn graphs are valid, run, respect the bounds they promise,
exercise every op in float16 and bfloat16 on this CPU, honour their options, and shrink to
small readable counterexamples."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, find, given, settings

import amp_rewrite
from amp_rewrite.testing import LIMIT, MULTI_DEVICES, OPS, GraphCase, check_valid, graph_defs, graphs
from amp_rewrite.testing.facts import low_dtype, type_values
from conftest import examples

FULL = graphs(devices=MULTI_DEVICES, while_loops=True, functions=True)


def _first(strategy, condition, tries=500):
    """The first drawn example that satisfies ``condition`` (no shrinking: fast)."""
    return find(strategy, condition, settings=settings(
        max_examples=tries, phases=[Phase.generate], database=None, derandomize=True,
        suppress_health_check=list(HealthCheck)))


@settings(max_examples=examples(40))
@given(FULL)
def test_drawn_graphs_are_valid_run_and_stay_in_their_bounds(case):
    check_valid(case.graph_def, case.graph_def, feeds=case.feeds, outputs=case.outputs, run=False)
    names = list(case.bounds)
    values = case.run(outputs=names)
    for name, value in zip(names, values):
        lo, hi = case.bounds[name]
        assert abs(lo) <= LIMIT and abs(hi) <= LIMIT
        slack = 1e-3 * max(1.0, abs(lo), abs(hi)) + (1e-2 if value.dtype == np.float16 else 0)
        assert np.all(value >= lo - slack) and np.all(value <= hi + slack), (
            f"{name} has values in [{value.min()}, {value.max()}], outside its bounds [{lo}, {hi}]")
    assert set(case.fetches) == {n.name for n in case.graph_def.node} - {
        i.lstrip("^").split(":")[0] for n in case.graph_def.node for i in n.input}
    assert "GraphCase(" in repr(case) and case.program.steps[0].name in repr(case)


LOW_PRECISION_OPS = sorted(set(OPS) - {"Cast"})


@pytest.mark.parametrize("op", LOW_PRECISION_OPS)
def test_every_op_runs_in_float16_and_bfloat16_on_this_cpu(op):
    """Put every op of a graph that holds ``op`` on the allow list and rewrite for a CPU with
    fast float16 and bfloat16: each op is converted (a CPU kernel exists) and the graph runs."""
    case = _first(graphs(ops={**OPS, op: 400}, max_nodes=4), lambda c: op in c.ops)
    ops = sorted(set(case.ops) & set(OPS))
    for precision in ("float16", "bfloat16"):
        result = amp_rewrite.rewrite_graph_def(case.graph_def, target="cpu", precision=precision,
                                               add={"allow": ops}, use_env=False)
        low = low_dtype(precision)
        converted = {n.op for n in result.graph_def.node if n.op == op and low in type_values(n).values()}
        preserved = {n.name for n in case.graph_def.node if n.op == op} <= set(case.fetches)
        assert converted or preserved, f"{op} was not converted to {precision}:\n{case!r}"
        case.run(result.graph_def)


def test_shrinking_gives_a_small_readable_counterexample():
    case = find(graphs(max_nodes=6), lambda c: {"MatMul", "Exp"} <= set(c.ops),
                settings=settings(database=None, derandomize=True, max_examples=2000,
                                  suppress_health_check=list(HealthCheck)))
    ops = [s.op for s in case.program.steps]
    assert len(ops) <= 8, repr(case)
    text = repr(case)
    assert "MatMul(" in text and "Exp(" in text and len(text.splitlines()) <= 9, text


def test_options_shape_the_graphs():
    tanh_only = _first(graphs(ops=["Tanh"], min_nodes=3, max_nodes=3), lambda c: True)
    assert set(tanh_only.ops) <= {"Placeholder", "Tanh", "Identity"}
    assert "Tanh" in tanh_only.ops
    loop = _first(graphs(while_loops=True), lambda c: "NextIteration" in c.ops)
    assert {"Enter", "Merge", "Switch", "Exit", "LoopCond"} <= set(loop.ops)
    call = _first(graphs(functions=True), lambda c: "PartitionedCall" in c.ops)
    assert call.graph_def.library.function
    spread = _first(graphs(devices=MULTI_DEVICES, min_nodes=6), lambda c: len({n.device for n in c.graph_def.node}) >= 3)
    assert spread.target in ("gpu:8.0", "gpu:8.0,6.1")
    gpu1 = _first(graphs(devices=MULTI_DEVICES), lambda c: any("GPU:1" in n.device for n in c.graph_def.node))
    assert gpu1.target == "gpu:8.0,6.1"
    ctrl = _first(graphs(min_nodes=6), lambda c: any(i.startswith("^") for n in c.graph_def.node for i in n.input))
    assert ctrl.graph_def.node
    no_ctrl = _first(graphs(control_edges=False, min_nodes=6), lambda c: True)
    assert not any(i.startswith("^") for n in no_ctrl.graph_def.node for i in n.input)
    several = _first(graphs(), lambda c: len(c.fetches) >= 3)
    assert len(several.outputs) >= 3


@settings(max_examples=examples(5, deep=100))
@given(graph_defs(max_nodes=3))
def test_graph_defs_draws_graph_defs(gd):
    assert gd.node and hasattr(gd, "library")


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="NoSuchOp"):
        graphs(ops=["MatMul", "NoSuchOp"])
    with pytest.raises(ValueError, match="min_nodes"):
        graphs(min_nodes=5, max_nodes=2)
    with pytest.raises(ValueError, match="devices"):
        graphs(devices=())


def test_hand_made_cases_for_example_regressions():
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (8, 8), name="x")
        tf.identity(tf.matmul(x, x, name="mm"), name="out")
    case = GraphCase.from_graph_def(g.as_graph_def(), description="MatMul then Identity")
    assert case.fetches == ("out",) and case.outputs == ("out:0",) and case.smooth_outputs == ("out:0",)
    assert "MatMul then Identity" in repr(case) and "mm = MatMul(x, x)" in repr(case)
    (value,) = case.run()
    assert value.shape == (8, 8)


@settings(max_examples=examples(10, deep=200))
@given(FULL)
def test_materializing_a_program_is_deterministic(case):
    """The same program and seed give the same GraphDef, byte for byte (functions included)."""
    from amp_rewrite.testing.program import materialize

    again = materialize(case.program, case.seed).graph_def
    assert again.SerializeToString(deterministic=True) == case.graph_def.SerializeToString(deterministic=True)


def test_materializing_is_independent_of_tensorflows_function_counters():
    """Regression (found by the deep profile): TensorFlow orders a graph's function library by
    its own names, which carry process-wide counters; two calls could swap places."""
    import tensorflow as tf

    from amp_rewrite.testing.program import materialize

    case = _first(graphs(functions=True, min_nodes=6), lambda c: len(c.graph_def.library.function) >= 2, tries=2000)
    calls = [f"{s.name}_body" for s in case.program.steps if s.op == "Call"]
    assert [f.signature.name for f in case.graph_def.library.function] == calls
    for i in range(12):  # move TensorFlow's function counter on
        tf.function(lambda x: x + 1, autograph=False).get_concrete_function(tf.TensorSpec((), tf.float32))
        again = materialize(case.program, case.seed).graph_def
        assert [f.signature.name for f in again.library.function] == [
            f.signature.name for f in case.graph_def.library.function]
        assert again.SerializeToString(deterministic=True) == case.graph_def.SerializeToString(deterministic=True)


def test_functional_loops_are_named_by_the_program():
    """Regression (deep run, 2026-11-27): a functional loop's ``cond`` and ``body`` carried
    TensorFlow's process-wide counters in their names (and the cond's unread arguments in
    theirs), so the same program materialized to other bytes once anything else was traced."""
    import tensorflow as tf

    from amp_rewrite.testing.program import materialize

    case = _first(graphs(while_loops=True, max_nodes=6),
                  lambda c: any(s.op == "While" and s.param("functional") for s in c.program.steps), tries=2000)
    (step,) = [s for s in case.program.steps if s.op == "While"][:1]
    loop = next(n for n in case.graph_def.node if n.name == step.name)
    assert (loop.attr["cond"].func.name, loop.attr["body"].func.name) == (f"{step.name}_cond", f"{step.name}_body")
    tf.function(lambda x: x + 1, autograph=False).get_concrete_function(tf.TensorSpec((), tf.float32))
    again = materialize(case.program, case.seed).graph_def
    assert again.SerializeToString(deterministic=True) == case.graph_def.SerializeToString(deterministic=True)


def test_conditionals_are_functional_ifs_named_by_the_program():
    """A drawn ``Cond`` is TF2's ``tf.cond``: a ``StatelessIf`` whose branches are functions
    named after the step (not TensorFlow's process-wide counters), rewritten on their own:
    their MatMuls run in float16 while the If keeps its branches' signatures."""
    import numpy as np
    import tensorflow as tf

    import amp_rewrite
    from amp_rewrite.testing.program import materialize

    def converts_in_a_branch(case) -> bool:
        if not any(s.op == "Cond" for s in case.program.steps):
            return False
        out = amp_rewrite.rewrite_graph_def(case.graph_def, target="gpu:8.0", precision="float16", use_env=False)
        return any(n.attr["T"].type == tf.float16.as_datatype_enum for f in out.graph_def.library.function
                   if f.signature.name.endswith("_then") for n in f.node_def if "T" in n.attr)

    case = _first(graphs(functions=True, max_nodes=20), converts_in_a_branch, tries=3000)
    (step,) = [s for s in case.program.steps if s.op == "Cond"][:1]
    node = next(n for n in case.graph_def.node if n.name == step.name)
    assert node.op == "StatelessIf"
    assert (node.attr["then_branch"].func.name, node.attr["else_branch"].func.name) == (
        f"{step.name}_then", f"{step.name}_else")
    tf.function(lambda x: x + 1, autograph=False).get_concrete_function(tf.TensorSpec((), tf.float32))
    again = materialize(case.program, case.seed).graph_def
    assert again.SerializeToString(deterministic=True) == case.graph_def.SerializeToString(deterministic=True)
    out = amp_rewrite.rewrite_graph_def(case.graph_def, target="gpu:8.0", precision="float16", use_env=False)
    rewritten = next(n for n in out.graph_def.node if n.name == step.name)
    assert list(rewritten.attr["Tin"].list.type) == list(node.attr["Tin"].list.type)
    check_valid(case.graph_def, out.graph_def, feeds=case.feeds, outputs=case.outputs)
    assert np.all(np.isfinite(case.run(outputs=case.outputs)[0]))


def _names(program) -> list[str]:
    """Every step name of ``program`` and of its loop bodies (not function bodies, which are
    built in a graph of their own)."""
    names = []
    for step in program.steps:
        names.append(step.name)
        if step.op == "While":
            names.extend(_names(step.body))
    return names


@settings(max_examples=100, database=None, derandomize=True, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(graphs(while_loops=True, max_nodes=12))
def test_a_loop_body_never_reuses_a_name_of_its_program(case):
    """Regression (deep run, 2026-11-25): a loop body numbered its steps from 0, so a body
    Const could take the name of a captured outer value (``c_1`` outside and inside) and
    shadow it while the body was built: a depthwise convolution of a filter with itself, or a
    loop variable whose shape changed after one iteration, and the draw failed.  Step numbers
    are now unique across a program and its loop bodies, so no name can be shadowed."""
    numbers = [int(name.rpartition("_")[2]) for name in _names(case.program)]
    assert len(numbers) == len(set(numbers)), _names(case.program)
