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
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import corpus  # noqa: E402  (tests/corpus.py: builders and runners shared with the tests)

__all__ = ["corpus", "BENCH_MODELS", "QUICK_MODELS", "ALL_MODELS", "item_names", "register"]


def _keras():
    import keras

    return keras


def _densenet121():
    keras = _keras()
    return keras.applications.DenseNet121(weights=None, input_shape=(64, 64, 3), classes=10), (64, 64, 3), False


def _inceptionv3():
    keras = _keras()
    return keras.applications.InceptionV3(weights=None, input_shape=(75, 75, 3), classes=10), (75, 75, 3), False


def _vgg16():
    keras = _keras()
    return keras.applications.VGG16(weights=None, input_shape=(64, 64, 3), classes=10), (64, 64, 3), False


def _efficientnetb0():
    keras = _keras()
    return keras.applications.EfficientNetB0(weights=None, input_shape=(64, 64, 3), classes=10), (64, 64, 3), False


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
