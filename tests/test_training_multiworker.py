"""Training on more than one machine (issue 24): MultiWorkerMirroredStrategy, fault tolerance,
and the offline TF1 path's checkpoints.

The cluster is two worker processes on 127.0.0.1 (ports picked free there, ``TF_CONFIG``), each
running ``tests/_multiworker_worker.py``.  A strategy fixes TensorFlow's collective setup when
it is created, so the workers are separate processes, and the single-worker reference runs in
this process with the same code and the same global batches.

What is checked:

* Both workers take the same skip/scale decisions (Keras ``fit`` and a custom loop through
  ``amp_rewrite.function``), also when a gradient is non-finite on *one* worker only: an ``inf``
  sits in the half of a global batch that only worker 1 reads, and both skip that step and halve
  the scale.  Their state equals a single-worker run on the same global batches, the rewrite
  converted nodes, and the MatMuls ran in float16 (and bfloat16, with the target ``"cpu"``).
* Fault tolerance: worker 1 is SIGKILLed mid-epoch; worker 0 cannot go on without it; the whole
  job is restarted, and ``BackupAndRestore`` (``fit``) or ``tf.train.CheckpointManager`` (custom
  loop) resumes from the last epoch's backup with its loss scale, finite-step counter, skipped
  count, slots and weights, and ends exactly where the uninterrupted run ended.
* The offline path (``amp-rewrite rewrite --loss-scale``): the graph's ``Saver`` checkpoints the
  loss-scale variables.

Every subprocess has a deadline and is SIGKILLed in a ``finally``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("keras")

import _multiworker_worker as worker  # noqa: E402  (tests/ is on sys.path, see conftest)

ROOT = Path(__file__).resolve().parent.parent
# Uninterrupted runs first; then the phases a worker is killed in.
PHASES = ["fit", "loop", "fit_bf16", "loop_bf16", "fit_ft", "loop_ft"]
CRASH_STEP = 5  # epoch 1, batch 1: after the backup at the end of epoch 0, before epoch 1's
# Generous per job: the two cores are shared, and a job spends most of its time importing.
JOB_SECONDS = 300
# The workers sum two half-batch gradients where the reference computes one, rounded in low
# precision at other points: measured largest differences (weights and momentums) 5.7e-5 in
# float16 and 6.6e-4 in bfloat16, while training moves some weight by 0.2 and 0.16.
TOLERANCE = {"float16": 5e-4, "bfloat16": 5e-3}


def _free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 now (held open together, so they are distinct)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class _Job:
    """One run of the two-worker cluster (a fresh set of ports and processes)."""

    def __init__(self, root: Path, name: str, crash: dict[str, Any] | None) -> None:
        self.root = root
        self.name = name
        ports = _free_ports(2)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_") and k != "TF_CONFIG"}
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        for task in range(2):
            config = root / f"{name}.{task}.json"
            config.write_text(json.dumps({
                "task": task, "ports": ports, "phases": PHASES, "crash": crash,
                "out": str(root / "out"), "state_dir": str(root / "state"),
            }))
            log = root / f"{name}.{task}.log"
            self.logs.append(log)
            with open(log, "wb") as handle:
                self.procs.append(subprocess.Popen(
                    [sys.executable, str(ROOT / "tests" / "_multiworker_worker.py"), str(config)],
                    stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT)))

    def tails(self) -> str:
        return "\n".join(f"--- {log.name} ---\n" + log.read_text(errors="replace")[-3000:]
                         for log in self.logs)

    def kill(self) -> None:
        """SIGKILL every worker of this job still running (by its own pid) and reap it."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()

    def wait_ok(self, deadline: float) -> None:
        for proc in self.procs:
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{self.name} timed out\n{self.tails()}") from None
        codes = [proc.returncode for proc in self.procs]
        assert codes == [0, 0], f"{self.name} exited with {codes}\n{self.tails()}"

    def kill_worker_one_at(self, phase: str, deadline: float) -> dict[str, Any]:
        """Wait until worker 1 stops after step ``CRASH_STEP`` of ``phase``, SIGKILL it, and
        report whether worker 0 could go on alone; then end the job."""
        ready = self.root / "out" / f"crash.{phase}.ready"
        while not ready.exists():
            if any(proc.poll() is not None for proc in self.procs):
                raise AssertionError(f"{self.name}: a worker exited before the crash point\n"
                                     f"{self.tails()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: no crash point in time\n{self.tails()}")
            time.sleep(0.2)
        survivor, victim = self.procs
        assert int(ready.read_text()) == victim.pid
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        # Worker 0 needs worker 1 for the next all-reduce: give it time to (not) finish.
        time.sleep(3.0)
        event = {"victim_returncode": victim.returncode,
                 "survivor_finished": (self.root / "out" / f"{phase}.0.json").exists(),
                 "survivor_exit": survivor.poll()}
        self.kill()  # restart the whole job, as MultiWorkerMirroredStrategy requires
        return event


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three jobs: every phase uninterrupted, then ``fit_ft`` killed; restarted, ``fit_ft``
    resumes and ``loop_ft`` is killed; restarted, ``loop_ft`` resumes."""
    root = tmp_path_factory.mktemp("multiworker")
    (root / "out").mkdir()
    jobs: list[_Job] = []
    events: dict[str, Any] = {}
    started = time.monotonic()
    try:
        jobs.append(_Job(root, "job1", {"phase": "fit_ft", "task": 1, "step": CRASH_STEP}))
        events["fit_ft"] = jobs[-1].kill_worker_one_at("fit_ft", time.monotonic() + JOB_SECONDS)
        jobs.append(_Job(root, "job2", {"phase": "loop_ft", "task": 1, "step": CRASH_STEP}))
        events["loop_ft"] = jobs[-1].kill_worker_one_at("loop_ft", time.monotonic() + JOB_SECONDS)
        jobs.append(_Job(root, "job3", None))
        jobs[-1].wait_ok(time.monotonic() + JOB_SECONDS)
    finally:
        for job in jobs:
            job.kill()
    results = {path.name[:-len(".json")]: json.loads(path.read_text())
               for path in (root / "out").glob("*.json")}
    print(f"multi-worker jobs: {time.monotonic() - started:.1f}s; phases: " + ", ".join(
        f"{name} {r['seconds']:.1f}s" for name, r in sorted(results.items())))
    return {"results": results, "events": events}


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    """The same training on one worker (no strategy) and the same global batches."""
    strategy = tf.distribute.get_strategy()
    return {
        "fit": worker.run_fit(strategy, "float16", 3),
        "loop": worker.run_loop(strategy, "float16", 3),
        "fit_bf16": worker.run_fit(strategy, "bfloat16", 1),
        "loop_bf16": worker.run_loop(strategy, "bfloat16", 1),
    }


def _state_equal(a: dict[str, Any], b: dict[str, Any], atol: float = 0.0) -> None:
    for key in ("scale", "good_steps", "skipped", "iterations"):
        assert a[key] == b[key], (key, a[key], b[key])
    for key in ("weights", "momentums"):
        assert len(a[key]) == len(b[key]) > 0
        for x, y in zip(a[key], b[key]):
            np.testing.assert_allclose(np.array(x), np.array(y), rtol=0, atol=atol)


def test_only_worker_one_reads_the_inf() -> None:
    # The premise of the one-sided overflow: worker 0's shard is finite, worker 1's is not.
    # Batch 1 of each epoch, on worker 1 only.
    for pipeline, expected in ((0, [True] * 4), (1, [True, False, True, True])):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline,
                                             num_replicas_in_sync=2)
        batches = list(worker.dataset_fn(True)(context).take(worker.STEPS_PER_EPOCH))
        assert all(x.shape[0] == worker.GLOBAL_BATCH // 2 for x, _ in batches)
        assert [bool(np.isfinite(x.numpy()).all()) for x, _ in batches] == expected


@pytest.mark.parametrize("phase", ["fit", "loop", "fit_bf16", "loop_bf16"])
def test_workers_decide_together_and_match_one_worker(cluster: dict, reference: dict,
                                                      phase: str) -> None:
    results = cluster["results"]
    one, two, ref = results[f"{phase}.0"], results[f"{phase}.1"], reference[phase]
    precision = "bfloat16" if phase.endswith("_bf16") else "float16"
    # Mixed precision really ran, on both workers.
    for record in (one, two):
        assert record["rewrite"]["converted_nodes"] > 0, record["rewrite"]
        assert record["rewrite"]["skipped_reasons"] == [None]
        assert record["rewrite"]["matmul_dtypes"] == [precision]
    # Both workers hold the same state, bit for bit (every decision was the same).
    _state_equal(one["end"], two["end"])
    assert [e["scale"] for e in one["epochs"]] == [e["scale"] for e in two["epochs"]]
    if precision == "float16":
        # Steps 1, 5 and 9 overflowed on worker 1 only: skipped everywhere, scale halved each
        # time and regrown after 3 finite steps.
        assert one["end"]["skipped"] == 3
        assert one["end"]["scale"] == worker.INITIAL_SCALE / 2
        assert one["end"]["iterations"] == 9
    else:
        assert one["end"]["skipped"] == 0 and one["end"]["scale"] == 1.0
        assert one["end"]["iterations"] == 4
    # The same as one worker on the same global batches.
    _state_equal(one["end"], ref["end"], atol=TOLERANCE[precision])
    moved = max(float(np.abs(np.array(w) - w0).max())
                for w, w0 in zip(one["end"]["weights"], worker.initial_weights()))
    assert moved > 20 * TOLERANCE[precision], "training must move the weights past the tolerance"


@pytest.mark.parametrize("phase", ["fit_ft", "loop_ft"])
def test_killed_worker_job_resumes_with_its_loss_scale(cluster: dict, phase: str) -> None:
    results, event = cluster["results"], cluster["events"][phase]
    plain = phase[:-len("_ft")]
    # Worker 1 died by SIGKILL mid-epoch; worker 0 could not finish without it.
    assert event["victim_returncode"] == -signal.SIGKILL
    # (Still blocked in the next all-reduce, or failed there: either way not a success.)
    assert not event["survivor_finished"] and event["survivor_exit"] != 0, event
    for task in (0, 1):
        resumed, uninterrupted = results[f"{phase}.{task}"], results[f"{plain}.{task}"]
        # It resumed from the backup of epoch 0 (not from scratch, not from the crash point)...
        assert resumed["initial_epoch"] == 1
        assert [e["epoch"] for e in resumed["epochs"]] == [1, 2]
        if phase == "loop_ft":
            assert resumed["restored_from"] == "ckpt-1"
        begin = resumed["begin"]
        # ...with the loss-scale state of that moment: halved once, two finite steps counted.
        assert (begin["scale"], begin["good_steps"], begin["skipped"]) == (
            worker.INITIAL_SCALE / 2, 2, 1)
        _state_equal(begin, uninterrupted["epochs"][0])
        # ...and ended where the uninterrupted run ended (same decisions after the restart).
        _state_equal(resumed["end"], uninterrupted["end"], atol=1e-6)
        assert resumed["rewrite"]["converted_nodes"] > 0


def test_offline_training_graph_saver_checkpoints_the_loss_scale(tmp_path: Path) -> None:
    from amp_rewrite.cli import main

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (None, worker.FEATURES), name="x")
        y = tf.compat.v1.placeholder(tf.int32, (None,), name="y")
        w1, _, w2, _ = worker.initial_weights()
        v1 = tf.compat.v1.get_variable("w1", initializer=w1)
        v2 = tf.compat.v1.get_variable("w2", initializer=w2)
        logits = tf.matmul(tf.nn.relu(tf.matmul(x, v1)), v2)
        tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits),
                       name="loss")
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9).minimize(
            graph.get_tensor_by_name("loss:0"), global_step=step, name="train")
        tf.compat.v1.add_to_collection("train_op", train)
        saver = tf.compat.v1.train.Saver(max_to_keep=3)
        meta = tf.compat.v1.train.export_meta_graph(saver_def=saver.as_saver_def())
    src, out, report = tmp_path / "train.meta", tmp_path / "amp.meta", tmp_path / "report.json"
    src.write_bytes(meta.SerializeToString())
    assert main(["rewrite", str(src), str(out), "--loss-scale", "dynamic", "--target", "cpu",
                 "--precision", "float16", "--report", str(report), "--quiet"]) == 0
    training = json.loads(report.read_text())
    assert training["converted_nodes"] > 0 and training["training"]["loss_scale_checkpointed"]

    names = ["amp_loss_scale/current_loss_scale", "amp_loss_scale/good_steps",
             "amp_loss_scale/skipped_steps", "global_step", "w1"]
    x_data, y_data = worker.data(with_inf=False)
    feed = {"x:0": x_data[:32], "y:0": y_data[:32]}
    bad = {"x:0": np.where(np.arange(32)[:, None] == 3, np.inf, x_data[:32]), "y:0": y_data[:32]}

    def load() -> tuple[Any, Any, list[Any]]:
        g = tf.Graph()
        with g.as_default():
            restored_saver = tf.compat.v1.train.import_meta_graph(str(out))
        variables = {v.op.name: v for v in g.get_collection("variables")}
        return g, restored_saver, [variables[name] for name in names]

    g, restored_saver, fetches = load()
    assert g.get_operation_by_name("MatMul").get_attr("T") == tf.float16
    with tf.compat.v1.Session(graph=g) as sess:
        sess.run(tf.compat.v1.variables_initializer(g.get_collection("variables")))
        for inputs in (feed, bad, feed, feed):  # one overflow: the scale halves, 2 finite after
            sess.run("train", inputs)
        saved = [v.tolist() for v in sess.run(fetches)]
        path = restored_saver.save(sess, str(tmp_path / "ckpt"), global_step=3)
    assert saved[:4] == [2.0**14, 2, 1, 3]  # TensorFlow's default 2**15, halved once
    g2, saver2, fetches2 = load()
    with tf.compat.v1.Session(graph=g2) as sess:
        # Initialize first: a variable the checkpoint lacked would keep its initial value.
        sess.run(tf.compat.v1.variables_initializer(g2.get_collection("variables")))
        saver2.restore(sess, path)
        restored = [v.tolist() for v in sess.run(fetches2)]
    assert restored[:4] == saved[:4]
    np.testing.assert_array_equal(restored[4], saved[4])
    assert "amp_loss_scale/current_loss_scale" in dict(tf.train.list_variables(path))


def test_offline_saver_that_cannot_be_rebuilt_is_kept_with_a_warning(caplog: Any) -> None:
    import amp_rewrite

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (None, worker.FEATURES), name="x")
        # A partitioned variable is saved as slices, which a Saver over variables cannot name.
        w = tf.compat.v1.get_variable(
            "w", (worker.FEATURES, 4), partitioner=tf.compat.v1.fixed_size_partitioner(2))
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w)), name="loss")
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
        tf.compat.v1.add_to_collection("train_op", train)
        saver = tf.compat.v1.train.Saver()
        meta = tf.compat.v1.train.export_meta_graph(saver_def=saver.as_saver_def())
    with caplog.at_level("WARNING", logger="amp_rewrite.training.offline"):
        result = amp_rewrite.rewrite_training_meta_graph(meta, target="cpu", precision="float16")
    assert result.report["converted_nodes"] > 0
    assert result.report["training"]["loss_scale_checkpointed"] is False
    assert result.meta_graph_def.saver_def == meta.saver_def
    assert "does not checkpoint the loss-scale variables" in caplog.text
