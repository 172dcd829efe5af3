"""TensorFlow's shape inference in a helper process (``amp_rewrite.isolated_shape_inference``,
and every command of the CLI that reads a file): the same shapes as in process, and a
TensorFlow abort on a hostile graph costs that graph's shapes, not the caller's process."""

from __future__ import annotations

import logging

import pytest
import tensorflow as tf

import amp_rewrite
from amp_rewrite.graph import shape_process as sp
from amp_rewrite.graph.shapes import clear_shape_memo, function_shapes, graph_shapes

FAULTS = "shape_fault_worker:answer"  # tests/shape_fault_worker.py, imported in the helper


@pytest.fixture
def helper(monkeypatch):
    """A helper process of its own for the test (the fault-injecting worker, which answers
    as the real one does unless a graph holds its marker), ended after it."""
    process = sp.ShapeProcess(worker=FAULTS)
    monkeypatch.setattr(sp, "_PROCESS", process)
    clear_shape_memo()
    yield process
    process.close()
    clear_shape_memo()


def _step_graph() -> tf.compat.v1.GraphDef:
    """A traced step with a variable, a MatMul, a ``tf.cond`` (two function bodies) and a
    reduction."""
    w = tf.Variable(tf.ones([32, 16]))

    @tf.function
    def step(x):
        y = tf.matmul(x, w)
        y = tf.cond(tf.reduce_sum(y) > 0, lambda: y * 2.0, lambda: tf.nn.relu(y))
        return tf.reduce_mean(y, axis=1)

    return step.get_concrete_function(tf.TensorSpec([8, 32], tf.float32)).graph.as_graph_def()


def test_isolated_inference_gives_the_shapes_inferred_in_process(helper):
    """The same static shapes in the helper as in process, for the main graph and for each
    function body; and the helper did answer them (no silent fallback to in process)."""
    graph = _step_graph()
    here = graph_shapes(graph)
    bodies = {f.signature.name: function_shapes(f) for f in graph.library.function}
    clear_shape_memo()
    with amp_rewrite.isolated_shape_inference():
        assert sp.isolation_active()
        isolated = graph_shapes(graph)
        isolated_bodies = {f.signature.name: function_shapes(f) for f in graph.library.function}
    assert not sp.isolation_active()
    assert isolated == here and isolated_bodies == bodies
    assert any(s == ((8, 16),) for s in here.values())  # the MatMul's, known: a real inference
    assert helper.answered == 1 + len(bodies) and helper.deaths == 0


def test_a_rewrite_in_isolation_is_the_rewrite_in_process(helper):
    """What the planner decides from the shapes is the same either way: the rewritten graph is
    byte for byte the one rewritten in process (the optimal planner, which reads the shapes)."""
    graph = _step_graph()
    options = dict(target="gpu:8.0", precision="float16", lists="optimal")
    here = amp_rewrite.rewrite_graph_def(graph, **options)
    clear_shape_memo()
    with amp_rewrite.isolated_shape_inference():
        isolated = amp_rewrite.rewrite_graph_def(graph, **options)
    assert helper.answered >= 1
    assert isolated.graph_def.SerializeToString(deterministic=True) == \
        here.graph_def.SerializeToString(deterministic=True)
    assert isolated.report == here.report


def test_an_abort_in_the_helper_costs_the_shapes_not_the_process(helper, caplog):
    """A graph on which TensorFlow aborts (here the fault worker's ``os.abort()``, as a failed
    ``CHECK`` in a shape function would): this process lives on, the graph gets its recorded
    ``_output_shapes`` (none here), one WARNING says so, and the next graph is answered by a
    helper started again."""
    graph = _step_graph()
    marked = type(graph)()
    marked.CopyFrom(graph)
    marked.node.add(name="amp_rewrite_abort_here", op="NoOp")
    with amp_rewrite.isolated_shape_inference(), caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        assert graph_shapes(marked) == {}
        assert helper.deaths == 1
        assert any("ended the helper process" in r.getMessage() and "signal 6" in r.getMessage()
                   for r in caplog.records)
        assert graph_shapes(graph)  # a new helper answers
    assert helper.deaths == 1 and helper.answered == 1


def test_a_helper_that_does_not_answer_is_ended():
    """A request the helper does not answer in time (a shape function that loops) ends it;
    the caller gets "died", and the next request starts it again."""
    process = sp.ShapeProcess(worker=FAULTS, timeout_s=3)
    try:
        status, why = process.infer("hang", (b"", None))
        assert (status, why) == ("died", "no answer in 3 s") and process.deaths == 1
        status, result = process.infer("nonsense", (b"", None))
        assert status == "error" and "unknown shape request" in result
    finally:
        process.close()


def test_a_custom_registry_is_inferred_in_process(helper):
    """A registry the helper cannot rebuild (a caller's own) keeps inference in process."""
    from amp_rewrite.graph.op_registry import TensorFlowRegistry

    with amp_rewrite.isolated_shape_inference():
        assert graph_shapes(_step_graph(), registry=TensorFlowRegistry())
    assert helper.answered == 0


def test_the_cli_infers_shapes_in_the_helper(helper, tmp_path, capsys):
    """``amp-rewrite rewrite`` reads a file that may come from anyone: its shapes are inferred
    in the helper, and an abort there leaves the command to finish, with the WARNING."""
    from amp_rewrite.cli import main

    graph = _step_graph()
    marked = type(graph)()
    marked.CopyFrom(graph)
    marked.node.add(name="amp_rewrite_abort_here", op="NoOp")
    src, out = tmp_path / "g.pb", tmp_path / "o.pb"
    src.write_bytes(marked.SerializeToString())
    code = main(["rewrite", str(src), str(out), "--target", "gpu:8.0", "--lists", "optimal"])
    assert code in (0, 3), capsys.readouterr().err  # 3: unchanged (EXIT_UNCHANGED)
    assert helper.deaths == 1
    assert "ended the helper process" in capsys.readouterr().err
