"""One worker of the multi-worker training tests (``tests/test_training_multiworker.py``).

Run as ``python tests/_multiworker_worker.py CONFIG.json``: the JSON names the cluster's
ports (on 127.0.0.1 only), this worker's task index, the phases to run and where to write
results.  Each phase trains a tiny MLP with a loss-scaled optimizer from
:func:`amp_rewrite.enable_mixed_precision_graph_rewrite` under
``tf.distribute.MultiWorkerMirroredStrategy`` and writes ``<out>/<phase>.<task>.json``.

The training functions take a strategy, so the test process imports this module and runs the
same training without one (the single-worker reference on the same global batches).

Phases (run in the order given; one whose result file exists is skipped, so a restarted job
goes on where the killed one stopped):

* ``fit``/``loop``: Keras ``fit`` with ``BackupAndRestore``, or a custom loop through
  :func:`amp_rewrite.function` with ``tf.train.CheckpointManager``; float16, 3 epochs of 4
  steps, with an ``inf`` in the part of batch 1 that only worker 1 reads (every epoch sees
  the same 4 batches, so steps 1, 5 and 9 overflow on worker 1 alone).  A backup is written
  at the end of every epoch; a run that finds one resumes from it.
* ``fit_ft``/``loop_ft``: the same training in backup directories of their own, for the test
  that kills a worker (the plain phases are the uninterrupted runs they are compared with).
* ``fit_bf16``/``loop_bf16``: the same for bfloat16 with a fixed loss scale of 1 (bfloat16
  has float32's range, so it needs no scaling) and finite data, one epoch.

``crash`` (``{"phase": ..., "task": ..., "step": ...}``) makes that task write
``<out>/crash.<phase>.ready`` after that global step of that phase and then block: the test
SIGKILLs it there (mid-epoch, after the backup of the epoch before).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

GLOBAL_BATCH = 32
STEPS_PER_EPOCH = 4
FEATURES = 8
CLASSES = 4
INITIAL_SCALE = 2.0**10
INCREMENT_PERIOD = 3
# Row 1 * 32 + 16 + 3: batch 1, in the second half of the global batch, which worker 1 reads.
INF_ROW = 1 * GLOBAL_BATCH + GLOBAL_BATCH // 2 + 3


def data(with_inf: bool) -> tuple[Any, Any]:
    """The 4 global batches of one epoch (pure; the same arrays in every process)."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((GLOBAL_BATCH * STEPS_PER_EPOCH, FEATURES)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32) + 2 * (x[:, 1] > 0).astype(np.int32)
    if with_inf:
        x[INF_ROW, 0] = np.inf
    return x, y


def initial_weights() -> list[Any]:
    """Fixed initial weights, so every process (and the reference) starts from the same model
    whatever the strategy does with initializers and seeds."""
    import numpy as np

    rng = np.random.default_rng(1)
    return [(rng.standard_normal((FEATURES, 16)) * 0.4).astype(np.float32), np.zeros(16, np.float32),
            (rng.standard_normal((16, CLASSES)) * 0.4).astype(np.float32), np.zeros(CLASSES, np.float32)]


def dataset_fn(with_inf: bool) -> Callable[[Any], Any]:
    """For ``distribute_datasets_from_function``: input pipeline ``p`` of ``n`` reads rows
    ``[p * G/n, (p + 1) * G/n)`` of every global batch, repeated epoch after epoch."""
    import tensorflow as tf

    x, y = data(with_inf)

    def make(context: Any) -> Any:
        n, p = context.num_input_pipelines, context.input_pipeline_id
        per = GLOBAL_BATCH // n
        xs = x.reshape(STEPS_PER_EPOCH, n, per, FEATURES)[:, p].reshape(-1, FEATURES)
        ys = y.reshape(STEPS_PER_EPOCH, n, per)[:, p].reshape(-1)
        return tf.data.Dataset.from_tensor_slices((xs, ys)).batch(per).repeat()

    return make


def build(strategy: Any, precision: str) -> tuple[Any, Any]:
    """A compiled-ready MLP and its loss-scaled SGD-with-momentum optimizer (momentum, so a
    restore that lost the optimizer's slots would change the weights), built in ``strategy``."""
    import keras

    import amp_rewrite

    if precision == "float16":
        scale: Any = amp_rewrite.DynamicLossScale(INITIAL_SCALE, increment_period=INCREMENT_PERIOD)
    else:
        scale = 1  # bfloat16 keeps float32's exponent: no scaling, hence no skipping
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(CLASSES)])
        model.set_weights(initial_weights())
        opt = amp_rewrite.enable_mixed_precision_graph_rewrite(
            keras.optimizers.SGD(0.05, momentum=0.9), loss_scale=scale, target="cpu",
            precision=precision)
    return model, opt


def state(model: Any, opt: Any) -> dict[str, Any]:
    """The training state this worker holds (its own copy of every mirrored variable)."""
    import numpy as np

    return {
        "scale": float(opt.current_loss_scale),
        # Keras's LossScaleOptimizer counts consecutive finite steps in step_counter.
        "good_steps": int(opt.step_counter.numpy()) if opt.built else 0,
        "skipped": int(opt.skipped_steps),
        "iterations": int(opt.iterations.numpy()),
        "weights": [np.asarray(w).tolist() for w in model.get_weights()],
        "momentums": [np.asarray(v).tolist() for v in opt.inner_optimizer.variables
                      if "momentum" in v.path],
    }


def rewrite_summary(function: Any) -> dict[str, Any]:
    """What the rewrite of a traced step did, and which MatMuls ran in which dtype."""
    results = function.rewrite_results
    matmuls = sorted({op.get_attr("T").name for g in function.executed_graphs()
                      for op in g.get_operations() if op.type == "MatMul"})
    return {"converted_nodes": sum(r.report["converted_nodes"] for r in results),
            "skipped_reasons": [r.report["skipped"] for r in results],
            "matmul_dtypes": matmuls}


def _crash_here(crash: dict[str, Any] | None, phase: str, task: int, step: int, out: Path) -> None:
    if crash and crash["phase"] == phase and crash["task"] == task and crash["step"] == step:
        (out / f"crash.{phase}.ready").write_text(str(os.getpid()))
        while True:  # the test SIGKILLs this process now
            time.sleep(1)


def run_fit(strategy: Any, precision: str, epochs: int, *, backup_dir: str | None = None,
            task: int = 0, out: Path | None = None, crash: dict[str, Any] | None = None,
            phase: str = "fit") -> dict[str, Any]:
    """Keras ``fit`` (with ``BackupAndRestore`` when ``backup_dir`` is given).

    Returns the state at ``on_train_begin`` (after any restore), at every epoch end, and at
    the end.  Mutates nothing outside ``backup_dir`` and ``out``.
    """
    import keras

    model, opt = build(strategy, precision)
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    record: dict[str, Any] = {"epochs": []}

    class Probe(keras.callbacks.Callback):
        # After BackupAndRestore in the callback list, so on_train_begin sees the restored state.
        def on_train_begin(self, logs: Any = None) -> None:
            record["begin"] = state(model, opt)
            record["initial_epoch"] = int(model._initial_epoch or 0)

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch = epoch

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            _crash_here(crash, phase, task, self.epoch * STEPS_PER_EPOCH + batch, out)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            record["epochs"].append({"epoch": epoch, **state(model, opt)})

    callbacks: list[Any] = []
    if backup_dir is not None:
        callbacks.append(keras.callbacks.BackupAndRestore(backup_dir, delete_checkpoint=False))
    callbacks.append(Probe())
    dataset = strategy.distribute_datasets_from_function(dataset_fn(precision == "float16"))
    model.fit(dataset, epochs=epochs, steps_per_epoch=STEPS_PER_EPOCH, shuffle=False, verbose=0,
              callbacks=callbacks)
    record["end"] = state(model, opt)
    record["rewrite"] = rewrite_summary(model.train_function.amp_function)
    return record


def run_loop(strategy: Any, precision: str, epochs: int, *, checkpoint_dir: str | None = None,
             restore_dir: str | None = None, task: int = 0, out: Path | None = None,
             crash: dict[str, Any] | None = None, phase: str = "loop") -> dict[str, Any]:
    """A custom loop through ``amp_rewrite.function``, checkpointed with ``CheckpointManager``.

    Every worker saves, as TensorFlow's multi-worker guide asks (a save may run collectives,
    e.g. to read sync-on-read variables): the chief into ``checkpoint_dir``, the others into a
    directory of their own, so they never write the same files; every worker restores from
    ``restore_dir`` (the chief's).  Saves after each epoch (4 steps), so a resumed run
    starts at an epoch boundary with a fresh iterator over the same batches.
    """
    import keras
    import tensorflow as tf

    import amp_rewrite

    model, opt = build(strategy, precision)
    with strategy.scope():
        # Mirrored variables cannot be created inside the traced step: build first.
        opt.build(model.trainable_variables)
        done = tf.Variable(0, dtype=tf.int64, trainable=False)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=opt, done=done)
    record: dict[str, Any] = {"epochs": [], "restored_from": None}
    if restore_dir is not None:
        latest = tf.train.latest_checkpoint(restore_dir)
        if latest is not None:
            checkpoint.restore(latest).assert_consumed()
            record["restored_from"] = os.path.basename(latest)
    manager = (tf.train.CheckpointManager(checkpoint, checkpoint_dir, max_to_keep=1)
               if checkpoint_dir is not None else None)
    record["begin"] = state(model, opt)
    start = int(done.numpy())
    record["initial_epoch"] = start // STEPS_PER_EPOCH
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")

    def replica_step(xb: Any, yb: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True)) / GLOBAL_BATCH
            scaled = opt.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)
        return loss

    @amp_rewrite.function
    def step(batch: Any) -> Any:
        return strategy.run(replica_step, args=batch)

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn(precision == "float16")))
    for global_step in range(start, epochs * STEPS_PER_EPOCH):
        step(next(iterator))
        _crash_here(crash, phase, task, global_step, out)
        if (global_step + 1) % STEPS_PER_EPOCH == 0:
            done.assign(global_step + 1)
            record["epochs"].append({"epoch": global_step // STEPS_PER_EPOCH, **state(model, opt)})
            if manager is not None:
                manager.save()
    record["end"] = state(model, opt)
    record["rewrite"] = rewrite_summary(step)
    return record


def main(config_path: str) -> None:
    """Join the cluster named in the config, run its phases, write one JSON file per phase."""
    started = time.monotonic()
    config = json.loads(Path(config_path).read_text())
    task = int(config["task"])
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{port}" for port in config["ports"]]},
        "task": {"type": "worker", "index": task},
    })
    import tensorflow as tf

    # Two shared cores: one thread per kernel keeps the two workers from fighting over them.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    assert strategy.num_replicas_in_sync == len(config["ports"])
    print(f"worker {task}: joined the cluster after {time.monotonic() - started:.1f}s",
          file=sys.stderr, flush=True)
    out = Path(config["out"])
    root = Path(config["state_dir"])
    crash = config.get("crash")
    for phase in config["phases"]:
        if (out / f"{phase}.{task}.json").exists():
            continue  # finished before a restart of the job
        started = time.monotonic()
        precision = "bfloat16" if phase.endswith("_bf16") else "float16"
        epochs = 1 if precision == "bfloat16" else 3
        if phase.startswith("fit"):
            # One backup directory per worker: Keras's weights file is not written collectively.
            record = run_fit(strategy, precision, epochs, backup_dir=str(root / phase / f"worker{task}"),
                             task=task, out=out, crash=crash, phase=phase)
        else:
            chief_dir = root / phase / "chief"
            own = chief_dir if task == 0 else root / phase / f"worker{task}"
            record = run_loop(strategy, precision, epochs, checkpoint_dir=str(own),
                              restore_dir=str(chief_dir), task=task, out=out, crash=crash,
                              phase=phase)
        record["seconds"] = time.monotonic() - started
        print(f"worker {task}: {phase} took {record['seconds']:.1f}s", file=sys.stderr, flush=True)
        # Written atomically: the test reads a file only once it is complete.
        tmp = out / f"{phase}.{task}.json.tmp"
        tmp.write_text(json.dumps(record))
        tmp.rename(out / f"{phase}.{task}.json")


if __name__ == "__main__":
    main(sys.argv[1])
