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
        process.timeout_s = 120  # the next request's time holds a helper's start: not what is tested
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


def test_an_answer_to_a_request_its_caller_left_is_not_taken_for_the_next():
    """A caller that leaves before its answer (a deadline of its own, an interrupt): the next
    request gets its own answer, never the one left behind."""
    process = sp.ShapeProcess(worker=FAULTS, timeout_s=120)
    try:
        process.submit("sleep", (1.0, "left behind"))  # its caller never asks for the answer
        assert process.request("echo", "mine") == ("ok", "mine")
        assert process.request("echo", "and mine") == ("ok", "and mine")
        assert process.deaths == 0
    finally:
        process.close()


def test_a_caller_interrupted_while_waiting_ends_the_helper():
    """An exception that reaches the caller while it waits (here a signal handler's) ends the
    helper working on the request, and the next request is answered by a new one."""
    import signal

    class Deadline(Exception):
        pass

    def deadline(signum, frame):
        raise Deadline("the caller's own deadline")

    process = sp.ShapeProcess(worker=FAULTS, timeout_s=120)
    previous = signal.signal(signal.SIGALRM, deadline)
    try:
        signal.alarm(1)
        with pytest.raises(Deadline):
            process.request("sleep", (30.0, "too late"))
        signal.alarm(0)
        assert process.request("echo", "next") == ("ok", "next")
        assert process.starts == 2
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        process.close()


def test_the_helper_never_imports_from_the_current_directory(tmp_path, monkeypatch):
    """A file in the current directory named like a module the helper imports (a model's
    folder holding ``networkx.py``) is not what the helper runs."""
    marker = tmp_path / "ran"
    (tmp_path / "networkx.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    (tmp_path / "shape_fault_worker.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    monkeypatch.chdir(tmp_path)
    process = sp.ShapeProcess(worker=FAULTS, timeout_s=120)
    try:
        assert process.request("echo", 1) == ("ok", 1)
        status, _ = process.request("graph", (_step_graph().SerializeToString(), None))
        assert status == "ok"
    finally:
        process.close()
    assert not marker.exists()


def test_a_death_says_what_the_helper_wrote_last():
    """The reason a helper died quotes the end of what it wrote to standard error (an abort's
    ``Check failed`` line), and nothing of it reaches this process's own output."""
    process = sp.ShapeProcess(worker=FAULTS, timeout_s=120)
    try:
        status, why = process.request("scream", "F0000 shape_inference.cc:42] Check failed: rank >= 0")
        assert status == "died" and "signal 6" in why and "Check failed: rank >= 0" in why, why
        assert process.broken is None  # a death on a request: started again at the next
        assert process.request("echo", 2) == ("ok", 2)
    finally:
        process.close()


def test_the_helpers_log_records_are_emitted_here(caplog):
    """What the helper's ``amp_rewrite`` loggers say while answering (why shapes are missing)
    is said again by the same logger here."""
    process = sp.ShapeProcess(worker=FAULTS, timeout_s=120)
    try:
        with caplog.at_level(logging.INFO, logger="amp_rewrite"):
            assert process.request("log", "hello") == ("ok", "hello")
    finally:
        process.close()
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records
            if r.name == "amp_rewrite.tests.fault_worker"] == [
        ("amp_rewrite.tests.fault_worker", logging.INFO, "from the helper: hello")]


def _open_fds() -> int:
    import os

    return len(os.listdir("/proc/self/fd"))


def test_a_helper_that_cannot_start_is_not_started_again(monkeypatch, caplog):
    """No interpreter to start (an embedded or frozen caller): every request is answered
    "died" with the reason, no exception reaches the caller, no file descriptor is left
    open, and the shapes fall back with one WARNING for the process, not one per graph."""
    import sys

    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    process = sp.ShapeProcess(worker=FAULTS, timeout_s=120)
    monkeypatch.setattr(sp, "_PROCESS", process)
    clear_shape_memo()
    before = _open_fds()
    graph = _step_graph()
    with amp_rewrite.isolated_shape_inference(), caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        for _ in range(3):
            status, why = process.request("echo", 1)
            assert status == "died" and "/nonexistent/python" in why
        assert graph_shapes(graph) == {}
        assert all(function_shapes(f) == {} for f in graph.library.function)
    assert _open_fds() == before
    assert process.starts == 0 and process.broken is not None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "cannot run" in warnings[0].getMessage()
    clear_shape_memo()


def test_a_helper_whose_worker_does_not_import_is_started_once():
    """A worker that cannot be imported ends the helper at its start with an error: it is not
    started again for every later request, and the reason names the error."""
    process = sp.ShapeProcess(worker="amp_rewrite_no_such_module:answer", timeout_s=120)
    try:
        first = process.request("echo", 1)
        assert first[0] == "died" and "ModuleNotFoundError" in first[1], first
        assert process.request("echo", 2)[0] == "died" and process.starts == 1
        assert "exited at its start" in process.broken
    finally:
        process.close()


def test_a_stand_in_for_a_dead_helper_is_not_kept_as_the_graphs_shapes(helper):
    """Shapes that stand in for a helper that died (a timeout under load) are not kept: the
    same graph asked again, in process or isolated, is inferred."""
    graph = _step_graph()
    helper.timeout_s = 1e-3  # no helper answers this fast: it "dies" on the request
    with amp_rewrite.isolated_shape_inference():
        assert graph_shapes(graph) == {}
    assert helper.deaths == 1
    assert any(s == ((8, 16),) for s in graph_shapes(graph).values())  # in process, inferred


def test_the_helper_ends_when_its_parent_is_killed(tmp_path):
    """A parent killed while its helper is busy on a request that does not end: the helper
    ends itself too, instead of living on with the parent's memory and standard error."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time\n"
        "from amp_rewrite.graph.shape_process import ShapeProcess\n"
        f"p = ShapeProcess(worker={FAULTS!r}, timeout_s=3600)\n"
        "p.submit('hang', (b'', None))\n"
        "print(p._process.pid, flush=True)\n"
        "time.sleep(3600)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=env, text=True)
    helper_pid = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(helper_pid, 0)
        except ProcessLookupError:
            break
        if _zombie(helper_pid):
            break
        time.sleep(0.2)
    else:
        os.kill(helper_pid, signal.SIGKILL)
        pytest.fail("the helper outlived its parent by 30 s")


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has ended and waits only to be reaped (by init, as an orphan)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _training_meta(batch_dims: int) -> bytes:
    """An exported TF1 training graph (a MatMul, a ``GatherV2`` and plain SGD) whose gather
    has ``batch_dims`` (TensorFlow 2.21's shape function aborts the process for 8)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [16, 64], name="x")
        w = tf.compat.v1.get_variable("w", [64, 64])
        y = tf.matmul(x, w)
        gathered = tf.gather(y, tf.zeros([16, 2], tf.int32), axis=1, batch_dims=1, name="gather")
        loss = tf.reduce_mean(tf.square(y)) + tf.reduce_mean(gathered)
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
        meta = tf.compat.v1.train.export_meta_graph(graph=graph)
    next(n for n in meta.graph_def.node if n.name == "gather").attr["batch_dims"].i = batch_dims
    return meta.SerializeToString()


def test_loss_scaling_a_training_graph_imports_it_in_the_helper(monkeypatch, tmp_path, capsys):
    """``amp-rewrite rewrite X.meta --loss-scale`` writes the loss scaling with TensorFlow's
    graph API on the graph imported into TensorFlow, whose shape functions run then: in the
    helper.  A graph on which one aborts is an error of the command (nothing written), not
    the end of the process; a sound graph is loss-scaled as in process."""
    from amp_rewrite.cli import main
    from amp_rewrite.training.offline import rewrite_training_meta_graph

    process = sp.ShapeProcess()
    monkeypatch.setattr(sp, "_PROCESS", process)
    try:
        hostile, out = tmp_path / "hostile.meta", tmp_path / "out.meta"
        hostile.write_bytes(_training_meta(batch_dims=8))
        assert main(["rewrite", str(hostile), str(out), "--loss-scale", "dynamic", "--target", "gpu:8.0"]) == 1
        err = capsys.readouterr().err
        assert "TensorFlow ended the process that imported the rewritten graph" in err and "signal 6" in err, err
        assert not out.exists() and process.deaths >= 1

        sound = tmp_path / "sound.meta"
        sound.write_bytes(_training_meta(batch_dims=1))
        answered = process.answered
        assert main(["rewrite", str(sound), str(out), "--loss-scale", "dynamic", "--target", "gpu:8.0"]) == 0
        assert process.answered > answered
        here = rewrite_training_meta_graph(sound.read_bytes(), "dynamic", target="gpu:8.0")
        written = tf.compat.v1.MetaGraphDef.FromString(out.read_bytes())
        assert written.graph_def.SerializeToString(deterministic=True) == \
            here.meta_graph_def.graph_def.SerializeToString(deterministic=True)
        assert any(n.name.startswith("amp_loss_scale/") for n in written.graph_def.node)
    finally:
        process.close()
