"""Float16 errors of Keras's own ``mixed_float16`` policy next to the rewrites', on the corpus
graphs whose default-profile errors exceed TensorFlow's pass (bench/RESULTS.md, 2026-11-27).

For each graph: the corpus model built again with the corpus' seed (and so its initial
weights), once under ``float32`` and once under ``mixed_float16`` with the float32 model's
weights copied in; then, on the 16 input batches ``bench.py`` uses, each variant's first
output (a training step's loss, computed as the corpus' step computes it: Keras's
``SparseCategoricalCrossentropy`` of ``model(x, training=True)``; an inference graph's output)
against the float32 corpus graph's:

* ``keras_float32``: the float32 Keras model, eagerly (a control: float32 against float32,
  0 but where dropout draws its masks apart from the graph's: EfficientNetB0);
* ``keras_mixed_float16``: the same weights under Keras's ``mixed_float16`` policy (Keras 3:
  batch and layer norms upcast to float32 inside, everything else float16), against the
  float32 Keras model, called in turn with the same seeds (so the same dropout masks);
* ``tensorflow`` / ``default`` / ``default_without_rule`` / ``optimal``: the float16 rewrites
  for a GPU 8.0 of the corpus graph (TensorFlow's pass; our profiles; the default profile
  without its ``[normalization]`` table; ``optimal`` is the planner with the normalization
  rule in both precisions, pricing a GPU without XLA).

The median relative error over the batches, as ``bench.py`` reports it, and paired with
TensorFlow's rewrite batch by batch: on how many batches a variant's error is larger
(``LABEL:worse_than_tf``) and the geometric mean of its errors over TensorFlow's
(``LABEL:geomean_vs_tf``; left out where a variant's error is 0 on some batch).  Runs on this CPU
(float16 emulated), times nothing.

Usage (from the repository root)::

    python bench/cpu_runs/2026-11-27-keras-norm/keras_policy_numerics.py resnet50/training transformer/inference

``MODEL@nodrop/KIND`` builds the model with its dropout layers' rates set to 0
(:func:`without_dropout`).  ``--lists=LABEL:FILE`` (before the graphs) adds a column for our
rewrite with another list file.
"""

from __future__ import annotations

import json
import math
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..", "..")
sys.path[:0] = [os.path.join(ROOT, "bench"), ROOT]

import numpy as np  # noqa: E402

import amp_rewrite  # noqa: E402
import bench  # noqa: E402
from models import corpus, register  # noqa: E402
from tf_oracle import tf_amp_rewrite  # noqa: E402

WITHOUT_RULE = os.path.join(HERE, "..", "2026-11-27-headline", "default_without_normalization_rule.toml")
EXTRA_LISTS = {}


def keras_models(model_name: str, policy: str = "mixed_float16"):
    """The corpus model of ``model_name`` in float32 and under ``policy`` (``mixed_float16``
    or ``mixed_bfloat16``), with the same (the corpus') initial weights, its loss and whether
    the loss takes logits."""
    import keras

    factory = corpus.MODELS[model_name][0]
    keras.backend.clear_session()
    keras.utils.set_random_seed(corpus.SEED)
    f32, _, from_logits = factory()
    if corpus.PREPARE_MODEL is not None:
        corpus.PREPARE_MODEL(f32)
    # The same seed again, so the two models' dropout layers draw the same masks when they are
    # called in turn (EfficientNetB0's; each layer's seed generator starts from it).
    keras.utils.set_random_seed(corpus.SEED)
    keras.mixed_precision.set_dtype_policy(policy)
    try:
        mixed, _, _ = factory()
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    mixed.set_weights(f32.get_weights())
    if policy == "mixed_bfloat16":
        # The BERT-like corpus model feeds token ids as float32 (up to 999) to a Lambda layer
        # that casts them to int32; under mixed_bfloat16 Keras would cast them to bfloat16
        # first (exact only to 256) and look up other embeddings.  A model fed int ids has no
        # such layer, so it computes in float32 here: the policy is measured, not the artefact.
        for layer in mixed.layers:
            if isinstance(layer, keras.layers.Lambda):
                layer.dtype_policy = keras.DTypePolicy("float32")
    return f32, mixed, keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits)


def keras_output(model, loss_fn, kind: str, feeds: dict) -> np.ndarray:
    """The first output of a corpus item's graph, computed by ``model`` on ``feeds``."""
    import tensorflow as tf

    x = tf.constant(feeds["x:0"])
    if kind == "training":
        return np.asarray(loss_fn(tf.constant(feeds["y:0"]), model(x, training=True)), dtype=np.float32)
    return np.asarray(tf.cast(model(x, training=False), tf.float32))


def with_lists(item, path: str):
    """Our float16 rewrite of ``item`` for a GPU 8.0 with the list file ``path``, as
    :func:`bench.fp16_rewrites` makes the default profile's."""
    return amp_rewrite.rewrite_graph_def(item.graph_def, target="gpu:8.0", fetches=list(item.fetches), use_env=False,
                                         variable_shapes=bench.variable_shapes(item), lists=path).graph_def


def errors(name: str) -> dict[str, float]:
    """Median first-output error of each variant of ``name`` against the float32 graph."""
    model_name, kind = name.split("/", 1)
    item = corpus.build(name)
    batches = bench.input_batches(item, 16)
    ref = bench.outputs(item.graph_def, item, batches)
    per_batch: dict[str, list[float]] = {}

    def median_err(outs, label: str, against=None) -> float:
        per_batch[label] = [bench.rel_error(o[:1], r[:1]) for o, r in zip(outs, against or ref)]
        return bench.median_error(per_batch[label])

    ours = bench.fp16_rewrites(item)  # what bench.py's float16 columns run
    graphs = {"tensorflow": tf_amp_rewrite(item.graph_def, list(item.fetches)),
              "default": ours["ours_fp16"].graph_def, "optimal": ours["ours_opt_fp16"].graph_def,
              **{label: with_lists(item, path) for label, path in {"default_without_rule": WITHOUT_RULE,
                                                                   **EXTRA_LISTS}.items()}}
    result = {label: median_err(bench.outputs(g, item, batches), label) for label, g in graphs.items()}
    f32, mixed, loss_fn = keras_models(model_name)
    eager = {"keras_float32": [], "keras_mixed_float16": []}
    for feeds in batches:  # in turn, so that dropout draws the same masks in both
        for label, model in (("keras_float32", f32), ("keras_mixed_float16", mixed)):
            eager[label].append([keras_output(model, loss_fn, kind, feeds)])
    result["keras_float32"] = median_err(eager["keras_float32"], "keras_float32")
    # Keras's policy against Keras's float32 model: the same as against the graph wherever the
    # control above is 0.
    result["keras_mixed_float16"] = median_err(eager["keras_mixed_float16"], "keras_mixed_float16",
                                               eager["keras_float32"])
    # Paired, batch by batch, against TensorFlow's rewrite: medians of 16 errors move with a
    # few batches, so a variant is worse only where most batches say so.
    tf_errs = per_batch["tensorflow"]
    for label, errs in per_batch.items():
        if label in ("tensorflow", "keras_float32"):
            continue
        pairs = [(e, t) for e, t in zip(errs, tf_errs) if e is not None and t]
        result[f"{label}:worse_than_tf"] = sum(e > t for e, t in pairs)
        if all(e > 0 for e, _ in pairs):
            result[f"{label}:geomean_vs_tf"] = math.exp(sum(math.log(e / t) for e, t in pairs) / len(pairs))
    return result


def without_dropout(model_name: str) -> str:
    """Registers ``model_name`` with every ``Dropout`` layer's rate set to 0 as the corpus model
    ``"{model_name}@nodrop"`` and returns that name.  Keras draws a float16 model's dropout
    masks in float16, so its masks differ from the float32 model's whatever the seed, and its
    loss with them; without dropout, Keras's policy can be compared.  Mutates
    ``corpus.MODELS``."""
    import keras

    factory, optimizer = corpus.MODELS[model_name]

    def build():
        model, shape, from_logits = factory()
        for layer in model.layers:
            if isinstance(layer, keras.layers.Dropout):
                layer.rate = 0.0
        return model, shape, from_logits

    corpus.MODELS[f"{model_name}@nodrop"] = (build, optimizer)
    return f"{model_name}@nodrop"


if __name__ == "__main__":
    register()
    args = sys.argv[1:]
    while args and args[0].startswith("--lists="):
        label, path = args.pop(0).split("=", 1)[1].split(":", 1)
        EXTRA_LISTS[label] = path
    for graph in args:
        model, kind = graph.split("/", 1)
        if model.endswith("@nodrop"):
            without_dropout(model.removesuffix("@nodrop"))
        print(json.dumps({"graph": graph, **{k: float(f"{v:.4g}") for k, v in errors(graph).items()}}), flush=True)
