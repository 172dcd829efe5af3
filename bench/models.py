"""The benchmark corpus: the test corpus (tests/corpus.py) plus larger Keras models.

:func:`register` adds DenseNet121, InceptionV3, VGG16 (``weights=None``), EfficientNetB0 and a
BERT-like encoder to the test corpus' model table, so ``corpus.build("densenet121/inference")``
etc. work the same way as the test items (frozen inference graph, one training step with
GradientTape).  Inputs are small (batch 2, 64x64 or 75x75 images, 32 tokens) so that a full
run fits in minutes on two CPU cores.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import corpus  # noqa: E402  (tests/corpus.py: builders and runners shared with the tests)

__all__ = ["corpus", "BENCH_MODELS", "QUICK_MODELS", "ALL_MODELS", "item_names", "register", "resized",
           "resolve_items", "set_batch", "set_weights", "trained_like", "WEIGHTS", "add_model_options",
           "apply_model_options"]


def _keras():
    import keras

    return keras


def _application(cls: str, side: int):
    """A ``keras.applications`` model with random weights, 10 classes, ``side x side`` RGB input."""
    shape = (side, side, 3)
    return getattr(_keras().applications, cls)(weights=None, input_shape=shape, classes=10), shape, False


def _densenet121(side: int = 64):
    return _application("DenseNet121", side)


def _inceptionv3(side: int = 75):
    # 75 is InceptionV3's smallest input: its last blocks then have 1x1 feature maps, so at
    # batch 2 their batch norms reduce two values per channel (see ``resized``).
    return _application("InceptionV3", side)


def _vgg16(side: int = 64):
    return _application("VGG16", side)


def _efficientnetb0(side: int = 64):
    return _application("EfficientNetB0", side)


def _bert_like():
    """A 4-layer BERT-style encoder: embeddings + post-LN transformer blocks, GELU FFN."""
    keras = _keras()
    seq, d, heads, ff, vocab = 32, 128, 4, 512, 1000
    tokens = keras.Input((seq,), dtype="float32", name="tokens")
    ids = keras.layers.Lambda(lambda t: keras.ops.cast(t, "int32"))(tokens)
    h = keras.layers.Embedding(vocab, d)(ids)
    for _ in range(4):
        att = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=d // heads)(h, h)
        h = keras.layers.LayerNormalization(epsilon=1e-12)(h + att)
        f = keras.layers.Dense(ff, activation="gelu")(h)
        f = keras.layers.Dense(d)(f)
        h = keras.layers.LayerNormalization(epsilon=1e-12)(h + f)
    pooled = keras.layers.Dense(d, activation="tanh")(h[:, 0])
    out = keras.layers.Dense(10)(pooled)
    return keras.Model(tokens, out, name="bert_like"), (seq,), True


def _sgd(k):
    return k.optimizers.SGD(learning_rate=0.01, momentum=0.9)


def _adam(k):
    return k.optimizers.Adam(learning_rate=1e-4)


BENCH_MODELS: dict[str, tuple[Callable, Callable]] = {
    "densenet121": (_densenet121, _sgd),
    "inceptionv3": (_inceptionv3, _sgd),
    "vgg16": (_vgg16, _sgd),
    "bert_like": (_bert_like, _adam),
    "efficientnetb0": (_efficientnetb0, _sgd),
}
_ORIG_INPUTS = corpus._inputs


def _inputs(name, shape):
    # Token ids for the BERT-like model (fed as float, cast inside); images otherwise.
    x, y = _ORIG_INPUTS(name, shape)
    if name == "bert_like":
        import numpy as np

        x = np.random.default_rng(0).integers(0, 1000, size=x.shape).astype(np.float32)
    return x, y


def _corpus_application(cls: str, side: int):
    # The test corpus' ResNet50 and MobileNetV2 at another size; a non-default size only
    # triggers a "weights for 224" warning, which does not apply (weights=None).
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _application(cls, side)


#: Image models :func:`resized` can build at another input size, and how.
_RESIZABLE: dict[str, Callable] = {
    "densenet121": _densenet121, "inceptionv3": _inceptionv3, "vgg16": _vgg16, "efficientnetb0": _efficientnetb0,
    "resnet50": lambda side: _corpus_application("ResNet50", side),
    "mobilenetv2": lambda side: _corpus_application("MobileNetV2", side),
}


def resized(model: str, side: int) -> str:
    """Registers the image model ``model`` (one of :data:`_RESIZABLE`) at a ``side x side``
    input as the corpus model ``"{model}@{side}"`` (calls :func:`register`) and returns that
    name.  Mutates ``corpus.MODELS``.

    For checks off the benchmark's sizes, e.g. InceptionV3's training loss at batch 2: at 75x75
    its last batch norms normalize two values per channel, whose outputs are the sign of their
    difference, so the loss jumps with any rounding upstream; at 150x150 they reduce 18.  And
    for the cost model at the sizes people run (``calibrate_in_place.py --items
    resnet50@224/inference --batch 8``).  Raises ``KeyError`` for a model that takes no images."""
    if model not in _RESIZABLE:
        raise KeyError(f"{model!r} is not one of the resizable image models: {', '.join(sorted(_RESIZABLE))}")
    register()
    name = f"{model}@{side}"
    build = _RESIZABLE[model]
    optimizer = (BENCH_MODELS.get(model) or corpus.MODELS[model])[1]
    corpus.MODELS[name] = (lambda: build(side), optimizer)
    return name


def resolve_items(names: Sequence[str]) -> list[str]:
    """``names`` with every ``"model@side/kind"`` registered (:func:`resized`); others as given."""
    for name in names:
        model = name.split("/", 1)[0]
        if "@" in model:
            base, side = model.split("@", 1)
            resized(base, int(side))
    return list(names)


#: Weights a benchmark model is built with (:func:`set_weights`).
WEIGHTS = ("init", "trained")


def trained_like(model, seed: int = 0) -> None:
    """Gives ``model`` the parameters a trained model has where Keras initializes constants:
    biases, batch-norm shifts and moving means drawn around 0 (scale 0.1), batch-norm scales
    and moving variances drawn from [0.5, 1.5].  Mutates ``model``; deterministic for ``seed``.

    Why: Keras initializes every bias and batch-norm shift and mean to zero, and in a frozen
    graph Grappler drops an add of zeros, which leaves a convolution without the bias its
    activation fuses behind: on TensorFlow 2.21 with oneDNN, every Relu and Relu6 of the
    ``weights=None`` ResNet50, MobileNetV2 and VGG16 inference graphs ran as a kernel of its
    own (MobileNetV2's Relu6s took 20 of the 43 ms of its bfloat16 step at 224x224, batch 8),
    where a trained model's are fused into the convolution.  The cost model prices the
    trained model's graph."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for var in model.weights:
        leaf = var.path.rsplit("/", 1)[-1]
        shape = tuple(var.shape)
        if leaf in ("bias", "beta", "moving_mean"):
            var.assign((0.1 * rng.standard_normal(shape)).astype(var.dtype))
        elif leaf in ("gamma", "moving_variance"):
            var.assign(rng.uniform(0.5, 1.5, shape).astype(var.dtype))


def set_weights(kind: str) -> None:
    """Builds every benchmark model from now on with ``kind`` weights (one of
    :data:`WEIGHTS`): ``"init"``, Keras's initial ones (``weights=None``), or ``"trained"``
    (:func:`trained_like`).  Mutates the corpus module; for the tools' entry points."""
    if kind not in WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, got {kind!r}")
    corpus.PREPARE_MODEL = trained_like if kind == "trained" else None


def add_model_options(ap, *, batch: int | None = None, weights: str = "init") -> None:
    """Adds ``--batch`` and ``--weights`` to a tool's argument parser ``ap`` (mutates it);
    :func:`apply_model_options` carries them out.  Defaults: the corpus' batch, and
    ``weights``."""
    ap.add_argument("--batch", type=int, default=batch or corpus.BATCH,
                    help="examples per step (an item's input size is its model@side name's)")
    ap.add_argument("--weights", choices=WEIGHTS, default=weights,
                    help="the models' weights: Keras's initial ones, or a trained model's biases and batch-norm "
                         "statistics (trained_like: what Grappler folds into a frozen graph depends on them)")


def apply_model_options(args) -> None:
    """Registers the benchmark's models and builds every item from now on with ``args``'
    ``--batch`` and ``--weights`` (:func:`add_model_options`).  Mutates the corpus module."""
    register()
    set_batch(args.batch)
    set_weights(args.weights)


def set_batch(batch: int) -> None:
    """Builds every corpus item from now on at ``batch`` examples (the corpus' default is
    :data:`corpus.BATCH`, 2).  Mutates the corpus module; for the tools' entry points."""
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    corpus.BATCH = batch


def register() -> None:
    """Add the benchmark's models (and the BERT-like model's token inputs) to the test corpus.

    Mutates ``corpus``'s tables; idempotent.  Each tool calls it from its entry point, not at
    import, so that importing a tool (the unit tests do) leaves the test corpus as it is.
    """
    corpus.MODELS.update(BENCH_MODELS)
    corpus._inputs = _inputs


#: The --quick corpus: one small and one mid-size model, inference and training.
QUICK_MODELS = ("mlp", "transformer", "mobilenetv2")
ALL_MODELS = ("resnet50", "mobilenetv2", "mlp", "transformer", "rnn", "densenet121", "inceptionv3",
              "vgg16", "bert_like", "efficientnetb0")


def item_names(models: tuple[str, ...]) -> list[str]:
    """Corpus item names for ``models`` (inference then training)."""
    return [f"{m}/{kind}" for m in models for kind in ("inference", "training")]
