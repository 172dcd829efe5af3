"""Float16 errors of the gradients, not only of the loss, of corpus training models under each
rewrite, with Keras's initial loss scale.

``bench.py`` and ``keras_policy_numerics.py`` compare a training step's first output, its
loss, which only the forward pass computes; a rule that changes the backward pass (the
default profile's ``[float16.identity]`` and its fence writers, 2026-11-27) shows in the
gradients.  For each model: the corpus model (the corpus' seed and weights) in a
``tf.function`` that returns the loss and the gradient of every trainable variable, computed
as a mixed-precision step computes them -- the loss times Keras's initial loss scale (2^15),
differentiated, each gradient divided by the scale -- frozen (weights as constants), then
rewritten for a GPU 8.0 in float16: by TensorFlow's pass (``tensorflow``) and by our default
profile (``default``).  On 16 batches (``bench.input_batches``), each output against the
float32 graph's: ``max|a - b| / max|b|`` per tensor.  Reported per variant: the median over
batches of the loss's error, and of the median and the maximum over gradient tensors (those
whose float32 values reach 1e-4 of the largest gradient's: a gradient that is zero but for
rounding has no scale to measure against);
``nonfinite`` counts batch-and-tensor pairs that overflowed (a step the loss scale would
skip).  Paired with TensorFlow's batch by batch: on how many batches the median gradient
error is larger.  Runs on this CPU (float16 emulated), times nothing.

The code that rewrites is the checkout's this script lives in: run the same file from a
worktree of another commit for that commit's rules (the README says which).

Keras's ``mixed_float16`` policy is measured beside (``keras_mixed_float16``): the model built
again under it with the float32 model's weights, the same function, not frozen; and the float32
model's function, not frozen (``keras_float32``, a control: the reference is the frozen graph).

Usage (from a checkout's root)::

    python bench/cpu_runs/2026-11-27-identity/gradient_errors.py [--loss-scale=1024] transformer bert_like

``--precision=bfloat16`` measures bfloat16 instead: our rewrites for a GPU 8.0 in bfloat16
(``default``, and ``tensorflow``: TensorFlow's bfloat16 lists painted by TensorFlow's passes,
which TensorFlow itself runs only on a CPU, with oneDNN) against Keras's ``mixed_bfloat16``
policy (``keras_mixed``); use it with ``--loss-scale=1``, as Keras does not scale a bfloat16
loss.  The graphs run on this CPU's bfloat16 kernels.

Models with batch norms are not measured: freezing their training step's moving-average
updates fails.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..", "..")
sys.path[:0] = [os.path.join(ROOT, "bench"), os.path.join(ROOT, "tests"), ROOT,
                os.path.join(HERE, "..", "2026-11-27-keras-norm")]

import numpy as np  # noqa: E402

import amp_rewrite  # noqa: E402
import bench  # noqa: E402
from keras_policy_numerics import keras_models  # noqa: E402  (the float32 and mixed models, same weights)
from models import corpus, register  # noqa: E402
from tf_oracle import tf_amp_rewrite  # noqa: E402

LOSS_SCALE = 2.0 ** 15  # Keras's LossScaleOptimizer starts there


def loss_and_gradients_function(model, loss_fn, x0: np.ndarray, y0: np.ndarray):
    """A ``tf.function`` of ``(x, y)`` returning the loss and the gradient of each of
    ``model``'s trainable variables, computed with the loss scaled by :data:`LOSS_SCALE` and
    each gradient unscaled, as a mixed-precision step computes them."""
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec(x0.shape, x0.dtype, name="x"), tf.TensorSpec(y0.shape, y0.dtype, name="y")])
    def loss_and_gradients(x, y):
        with tf.GradientTape() as tape:
            loss = tf.cast(loss_fn(y, model(x, training=True)), tf.float32)
            scaled = loss * LOSS_SCALE
        grads = tape.gradient(scaled, model.trainable_variables)
        return [tf.identity(loss, name="loss")] + [
            tf.identity(tf.cast(tf.convert_to_tensor(g), tf.float32) / LOSS_SCALE, name=f"grad_{i}")
            for i, g in enumerate(grads)]

    return loss_and_gradients


PRECISION = "float16"  # --precision=bfloat16: the bfloat16 rewrites and Keras's mixed_bfloat16


def gradient_graph(model_name: str):
    """``(GraphDef, output names, input names, item, Keras's mixed function, Keras's float32
    function)``: the frozen loss-and-gradients function of the corpus model ``model_name`` in
    float32, its corpus training item (for the batches), and the same function, not frozen, of
    the model under Keras's ``mixed_float16`` policy and of the float32 model (a control)."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    item = corpus.build(f"{model_name}/training")
    f32, mixed, loss_fn = keras_models(model_name, f"mixed_{PRECISION}")
    x0, y0 = item.feeds["x:0"], item.feeds["y:0"]
    concrete = loss_and_gradients_function(f32, loss_fn, x0, y0).get_concrete_function()
    frozen = convert_variables_to_constants_v2(concrete)
    graph_def = frozen.graph.as_graph_def()
    outputs = [t.op.name for t in frozen.outputs]
    inputs = [t.op.name for t in frozen.inputs]
    return (graph_def, outputs, inputs, item, loss_and_gradients_function(mixed, loss_fn, x0, y0),
            loss_and_gradients_function(f32, loss_fn, x0, y0))


def run(graph_def, outputs: list[str], inputs: list[str], batches) -> list[list[np.ndarray]]:
    """Every output of ``graph_def`` on each feed dict of ``batches`` (``x:0``, ``y:0``)."""
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    fetch = [g.get_tensor_by_name(f"{o}:0") for o in outputs]
    feeds_of = [g.get_tensor_by_name(f"{i}:0") for i in inputs]
    results = []
    with tf.compat.v1.Session(graph=g) as sess:
        for feeds in batches:
            values = sess.run(fetch, {feeds_of[0]: feeds["x:0"], feeds_of[1]: feeds["y:0"]})
            results.append([np.asarray(v, dtype=np.float64) for v in values])
    return results


def tensor_error(got: np.ndarray, ref: np.ndarray) -> float:
    """``max|got - ref| / max|ref|`` (inf where ``got`` is not finite)."""
    if not np.all(np.isfinite(got)):
        return float("inf")
    return float(np.max(np.abs(got - ref))) / max(float(np.max(np.abs(ref))), 1e-12)


def errors(model_name: str) -> dict[str, float]:
    graph_def, outputs, inputs, item, keras_mixed, keras_f32 = gradient_graph(model_name)
    batches = bench.input_batches(item, 16)
    ref = run(graph_def, outputs, inputs, batches)
    def ours(lists: str):
        return amp_rewrite.rewrite_graph_def(graph_def, target="gpu:8.0", precision=PRECISION, fetches=outputs,
                                             lists=lists, use_env=False).graph_def

    rewrites = {
        "tensorflow": tf_amp_rewrite(graph_def, outputs) if PRECISION == "float16" else ours("tensorflow"),
        "default": ours("default"),
        f"keras_mixed_{PRECISION}": keras_mixed,
        "keras_float32": keras_f32,
    }
    low_enum = 19 if PRECISION == "float16" else 14  # DataType DT_HALF / DT_BFLOAT16
    result: dict[str, float] = {"gradients": len(outputs) - 1}
    per_batch_median: dict[str, list[float]] = {}
    for label, gd in rewrites.items():
        if callable(gd):
            got = [[np.asarray(v, dtype=np.float64) for v in gd(feeds["x:0"], feeds["y:0"])] for feeds in batches]
        else:
            got = run(gd, outputs, inputs, batches)
        loss_errs, med, worst, nonfinite = [], [], [], 0
        for out, r in zip(got, ref):
            errs = [tensor_error(o, b) for o, b in zip(out, r)]
            nonfinite += sum(e == float("inf") for e in errs)
            loss_errs.append(errs[0])
            # Gradients that are zero but for float32 rounding (a softmax's key bias: softmax
            # ignores a constant shift) have no scale of their own to measure against.
            scale = max(float(np.max(np.abs(b))) for b in r[1:])
            kept = [e for e, b in zip(errs[1:], r[1:]) if float(np.max(np.abs(b))) >= 1e-4 * scale]
            med.append(statistics.median(kept))
            worst.append(max(kept))
        per_batch_median[label] = med
        result[f"{label}:loss"] = statistics.median(loss_errs)
        result[f"{label}:grad_median"] = statistics.median(med)
        result[f"{label}:grad_max"] = statistics.median(worst)
        result[f"{label}:nonfinite"] = nonfinite
        if not callable(gd):
            result[f"{label}:converted"] = sum(
                1 for n in gd.node if any(v.type == low_enum for k, v in n.attr.items() if k in ("T", "dtype", "DstT")))
    for label in ("default", f"keras_mixed_{PRECISION}"):
        pairs = list(zip(per_batch_median[label], per_batch_median["tensorflow"]))
        result[f"{label}:grad_worse_than_tf"] = sum(d > t for d, t in pairs)
    return result


if __name__ == "__main__":
    register()
    args = sys.argv[1:]
    while args and args[0].startswith("--"):
        key, _, value = args.pop(0).partition("=")
        if key == "--loss-scale":
            LOSS_SCALE = float(value)
        elif key == "--precision" and value in ("float16", "bfloat16"):
            PRECISION = value
        else:
            raise SystemExit(f"unknown option {key}={value}: --loss-scale=N, --precision=float16|bfloat16")
    for name in args:
        print(json.dumps({"model": name, **{k: float(f"{v:.4g}") for k, v in errors(name).items()}}), flush=True)
