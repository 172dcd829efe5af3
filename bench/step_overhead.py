"""Host time per training step: our rewritten Keras step against Keras's own, side by side.

Usage::

    python bench/step_overhead.py [--layers 150] [--rounds 15] [--steps 20]

``model.train_on_batch`` waits for the loss, so host time spent before the step is launched adds
to every step (issue 22: on an H200 our step trailed Keras's ``mixed_float16`` by 1-3 ms).  This
times a deep MLP with tiny tensors (so the step is mostly host time), under XLA, in one process:

* ``keras_mixed`` and ``keras_mixed_again``: Keras's ``mixed_float16`` policy (the A/A pair);
* ``ours``: ``enable_mixed_precision_graph_rewrite`` (target ``gpu:8.0``, float16), as shipped;
* ``ours_lookup``: the same, with ``amp_rewrite.function``'s per-signature fast path and the
  runner's direct concrete call switched off while its steps run, i.e. ``tf.function``'s own
  lookup on every call (as before the fix).

Variants run round robin, ``--steps`` steps per round, the order rotated every round; it prints
each variant's median of the rounds' medians and the A/A gap.  float16 on a CPU is emulated, so
only the differences between ``ours`` and ``ours_lookup`` (same graph) and the overall gap to
Keras mean anything here.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from typing import Any, Iterator

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))


def build(layers: int, policy: str) -> Any:
    import keras

    keras.mixed_precision.set_dtype_policy(policy)
    try:
        x = inp = keras.Input((16,))
        for _ in range(layers):
            x = keras.layers.Dense(16, activation="relu")(x)
        return keras.Model(inp, keras.layers.Dense(4, dtype="float32")(x))
    finally:
        keras.mixed_precision.set_dtype_policy("float32")


def make(kind: str, layers: int, x: Any, y: Any) -> Any:
    import keras

    import amp_rewrite

    keras.utils.set_random_seed(0)
    model = build(layers, "mixed_float16" if kind.startswith("keras") else "float32")
    opt = keras.optimizers.SGD(0.01, momentum=0.9)
    if kind.startswith("ours"):
        opt = amp_rewrite.enable_mixed_precision_graph_rewrite(opt, target="gpu:8.0", precision="float16")
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=True)
    model.optimizer.build(model.trainable_variables)
    model.train_on_batch(x, y)
    return model


@contextlib.contextmanager
def tf_function_lookup() -> Iterator[None]:
    """``amp_rewrite.function`` as before the fast path: ``tf.function``'s lookup every call."""
    from amp_rewrite.training import tf_function

    key, call_run = tf_function._call_key, tf_function._Runner._call_run
    tf_function._call_key = lambda args, kwargs: None
    tf_function._Runner._call_run = lambda self, args: self._run(*args)
    try:
        yield
    finally:
        tf_function._call_key, tf_function._Runner._call_run = key, call_run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=150)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args(argv)
    import numpy as np
    import tensorflow as tf

    x = tf.constant(np.random.default_rng(0).random((4, 16), np.float32))
    y = tf.constant(np.random.default_rng(1).integers(0, 4, (4,)))
    kinds = ("keras_mixed", "keras_mixed_again", "ours", "ours_lookup")
    models = {}
    for k in kinds:
        with tf_function_lookup() if k == "ours_lookup" else contextlib.nullcontext():
            models[k] = make(k, args.layers, x, y)
    per_round: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
        for k in order:
            with tf_function_lookup() if k == "ours_lookup" else contextlib.nullcontext():
                times = []
                for _ in range(args.steps):
                    start = time.perf_counter()
                    models[k].train_on_batch(x, y)
                    times.append(time.perf_counter() - start)
            per_round[k].append(statistics.median(times))
    med = {k: 1e3 * statistics.median(v) for k, v in per_round.items()}
    for k in kinds:
        print(f"{k:18s} {med[k]:7.2f} ms/step")
    print(f"A/A gap {100 * abs(med['keras_mixed_again'] / med['keras_mixed'] - 1):.1f}%; "
          f"ours / keras_mixed {med['ours'] / med['keras_mixed']:.3f}; "
          f"ours_lookup / ours {med['ours_lookup'] / med['ours']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
