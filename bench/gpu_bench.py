"""Issue 22's GPU benchmark: Keras training and inference steps, every mixed-precision variant
side by side in one process.

Usage::

    python bench/gpu_bench.py                                   # every workload (GPU; long)
    python bench/gpu_bench.py --workloads resnet50-train-b64,bert_base-train-b32 --time-budget 500
    python bench/gpu_bench.py --reduced --out /tmp/gpu_bench.md  # CPU smoke run for CI (< 60 s)
    python bench/gpu_bench.py --merge a.json b.json --out bench/GPU_RESULTS.md

For each *workload* (a model, training or inference, a batch size) every *variant* gets a model
of its own, built from the same random weights, compiled as a Keras user would compile it:

* ``float32`` / ``float32_again``: the float32 model, with TensorFlow's default TF32 math for
  float32 matmuls and convolutions on Ampere and later GPUs.  ``float32_again`` is a second,
  identical model timed in the same rounds: the **A/A control**.  Its distance from ``float32``
  is this run's noise, and any gap smaller than it is no finding.
* ``float32_strict``: the float32 model with TF32 off
  (``tf.config.experimental.enable_tensor_float_32_execution(False)``).  That switch is
  process-wide and read when a kernel runs, so it is turned off just before this variant's
  steps and back on after them.  It is the reference of every relative error.
* ``float32_xla``: the float32 model compiled with ``jit_compile=True`` (the baseline the XLA
  variants' measured ratios are taken against, since the cost model prices XLA's fusion).
* ``tf_amp``: TensorFlow's own Grappler pass.  ``tf.config.optimizer.set_experimental_options(
  {"auto_mixed_precision": True})`` (``auto_mixed_precision_onednn_bfloat16`` for bfloat16) is
  process-wide too: Grappler reads it when a function is instantiated, at its first call.  It
  is switched on only around this variant's calls (its first included) and off otherwise, so
  only this variant's functions are ever instantiated with it and every other variant's
  functions never are, whether or not the runtime keys its function cache on the config.
  (``tf.train.experimental.enable_mixed_precision_graph_rewrite`` is gone from TF 2.21's
  ``tf.train``, and its ``tf.compat.v1`` form sets the same process-wide option.)  With
  float16 the optimizer is wrapped in ``keras.optimizers.LossScaleOptimizer``, as TensorFlow's
  function wrapped it.
* ``keras_mixed`` / ``keras_mixed_xla``: a fresh model built under the ``mixed_float16`` Keras
  policy (``mixed_bfloat16`` for bfloat16), without and with XLA.
* ``ours_<lists>`` / ``ours_<lists>_xla`` for lists ``tensorflow``, ``default``, ``optimal``:
  ``amp_rewrite.enable_mixed_precision_graph_rewrite(opt, lists=..., target=..., precision=...)``
  and ``model.compile(jit_compile=False | True)``: Keras's train (and predict) step rewritten.
  ``ours_optimal`` and ``ours_optimal_xla`` pass ``measure_steps=0``: the planner's own plan,
  which the cost model predicts (left out, the optimal profile's training step on a GPU without
  XLA, which is also a model Keras will not compile under ``_xla``, times its candidates first,
  as ``ours_measured`` does).
* ``ours_user``: ours exactly as a user enables it, ``enable_mixed_precision_graph_rewrite(opt)``
  with no option and ``model.compile`` with Keras's default ``jit_compile="auto"`` (XLA on a
  GPU, as Keras resolves it); its XLA baseline is ``float32_xla`` when Keras chose XLA.

* ``ours_autotune`` / ``ours_autotune_xla`` (inference workloads): the float32 model exported
  (``model.export``), ``amp-rewrite rewrite --autotune`` (``--xla``) run on it on this machine
  as a user serving it would (``rewrite_saved_model(..., autotune=AutotuneOptions(batch=...))``:
  every candidate and float32 timed, with XLA for the second), and the model it writes loaded
  and served (``loaded.serve(x)``).  A Keras ``fit`` step has no SavedModel to autotune, so on
  a training workload they are listed as not applicable.

The timed call is ``model.train_on_batch(x, y)`` (``model.predict_on_batch(x)`` for
inference): it runs the train function ``fit`` builds (``model.make_train_function()``) on one
batch, and returns the loss as a Python float, which waits for the device, so each step is
timed to completion.  The batch is generated once, placed on the device beforehand (a host to
device copy would otherwise be timed) and is the same for every variant.

Per variant and workload it reports: the step time (median of the steps after ``--warmup``
in each repeat, then the median of the repeats), examples/s, the peak device memory (absolute
and above what was in use when the variant's steps began; reset before each variant's steps;
``null`` without a GPU), the relative error of the first step's loss (training) or outputs
(inference) against ``float32_strict`` on the same inputs and initial weights, the first-step
time (trace, rewrite, XLA compile and the step; the optimizer is built beforehand, which spares
every variant alike the second trace ``fit`` pays when its first trace creates the optimizer's
variables), and for our variants the rewrite report's
counts and the cost model's predicted low/float32 step-time ratio next to the measured one.

Variants run round-robin: every repeat times each variant once, in an order rotated by one
per repeat, so a slow spell of the machine or a position in the round hits every variant.

The results go to a JSON file and a markdown table (``--out``, default ``bench/GPU_RESULTS.md``;
the JSON beside it), rewritten after every workload, so a run stopped by a time limit keeps
the workloads it finished.  ``--reduced`` runs two tiny models on the CPU (bfloat16, target
``cpu``) for CI and writes to a temporary directory unless ``--out`` is given.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import gc
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, NamedTuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# TensorFlow's bfloat16 pass (the tf_amp variant of --reduced) exists only while oneDNN is on,
# which TensorFlow turns on by default only on CPUs with AVX512-VNNI/BF16 or AMX; pinned on
# (unless set) so every CI machine runs the same variants, as bench/bench.py does.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
if "--reduced" in sys.argv[1:]:
    # The smoke run checks that every XLA variant compiles and runs, not how fast: XLA's CPU
    # backend compiles a training step several times faster without LLVM's optimizations
    # (read by TensorFlow at import, so set before it; a caller's XLA_FLAGS win).
    os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

import numpy as np  # noqa: E402

SEED = 1234

#: Every variant, in the order of the tables.  ``float32_again`` is the A/A control.
VARIANTS: tuple[str, ...] = (
    "float32", "float32_again", "float32_strict", "float32_xla", "tf_amp",
    "keras_mixed", "keras_mixed_xla",
    "ours_tensorflow", "ours_tensorflow_xla", "ours_default", "ours_default_xla",
    "ours_optimal", "ours_optimal_xla", "ours_user", "ours_autotune", "ours_autotune_xla", "ours_measured",
)
#: ``ours_measured``'s timed steps per candidate (``measure_steps``).
MEASURE_STEPS = 3
#: Untimed calls after ``ours_measured``'s first step, at most, to finish its measuring before
#: the timed repeats (three candidates take 3 x (1 + MEASURE_STEPS) - 1; steps that skipped
#: their update are timed again).
MAX_MEASURE_CALLS = 64
REFERENCE = "float32_strict"


@dataclasses.dataclass(frozen=True)
class VariantSpec:
    """How one variant builds, compiles and runs its model."""

    name: str
    policy: str = "float32"  #: "float32" or "mixed" (mixed_float16 / mixed_bfloat16)
    #: ``model.compile(jit_compile=...)``; ``"auto"`` is Keras's default (XLA on a GPU).
    jit_compile: bool | str = False
    tf32: bool = True  #: TF32 math for float32 matmuls/convolutions while this variant runs
    tf_amp: bool = False  #: TensorFlow's Grappler AMP pass on while this variant runs
    lists: str | None = None  #: amp_rewrite's list profile (our variants only)
    #: Ours exactly as a user enables it: ``enable_mixed_precision_graph_rewrite(opt)`` with no
    #: option and ``compile()`` with Keras's default ``jit_compile="auto"``.
    user_defaults: bool = False
    #: More rewrite options of an ``--extra-variant`` (ours only), as sorted JSON: e.g.
    #: ``{"remove": {"deny": ["Exp"]}}`` to measure what one list entry costs.
    options_json: str = ""
    #: ``amp-rewrite rewrite --autotune`` (``--xla`` with ``jit_compile``) of the float32
    #: model's exported SavedModel, loaded and served: inference workloads only.
    autotune: bool = False

    @property
    def options(self) -> dict[str, Any]:
        return json.loads(self.options_json) if self.options_json else {}

    @property
    def ours(self) -> bool:
        return self.lists is not None or self.user_defaults or self.autotune

    @property
    def measured(self) -> bool:
        """Whether the step that runs is chosen by timing (autotune, ``measure_steps``): no
        one plan to price."""
        return self.autotune or bool(self.options.get("measure_steps"))


#: Why the autotune variants do not run on a training workload.
NOT_AUTOTUNED = "not applicable: autotune rewrites a SavedModel offline; a Keras fit step has none"

#: Variants defined on the command line (``--extra-variant``): name -> (base variant, options).
EXTRA_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {}


def define_extra_variant(text: str) -> str:
    """Register ``NAME=BASE`` or ``NAME=BASE:JSON`` (``--extra-variant``): our variant ``BASE``
    with the JSON object's rewrite options added (``add``, ``remove``, ``lists``, ``exclude``,
    ... as ``enable_mixed_precision_graph_rewrite`` takes them).  A hypothesis about a list
    entry is then measured side by side with the variants it is compared with.  Returns the
    name; raises ``ValueError`` on a malformed definition or a base that is not ours."""
    name, sep, rest = text.partition("=")
    base, _, options = rest.partition(":")
    if not sep or not name or not base or name in VARIANTS or not re.fullmatch(r"[A-Za-z0-9_.+-]+", name):
        raise ValueError(f"--extra-variant {text!r}: expected NAME=BASE[:JSON], NAME new and plain")
    if base not in VARIANTS or not variant_spec(base).ours or variant_spec(base).autotune:
        raise ValueError(f"--extra-variant {text!r}: {base} is not one of our built-in variants")
    parsed = json.loads(options) if options else {}
    if not isinstance(parsed, dict):
        raise ValueError(f"--extra-variant {text!r}: the options must be a JSON object")
    EXTRA_VARIANTS[name] = (base, parsed)
    return name


def variant_spec(name: str) -> VariantSpec:
    """The :class:`VariantSpec` of a variant name from :data:`VARIANTS` or
    :data:`EXTRA_VARIANTS`.  Pure (reads the registry)."""
    if name in EXTRA_VARIANTS:
        base, options = EXTRA_VARIANTS[name]
        spec = variant_spec(base)
        return dataclasses.replace(spec, name=name, options_json=json.dumps({**spec.options, **options},
                                                                            sort_keys=True))
    xla = name.endswith("_xla")
    if name in ("float32", "float32_again", "float32_xla"):
        return VariantSpec(name, jit_compile=xla)
    if name == "float32_strict":
        return VariantSpec(name, tf32=False)
    if name == "tf_amp":
        return VariantSpec(name, tf_amp=True)
    if name.startswith("keras_mixed"):
        return VariantSpec(name, policy="mixed", jit_compile=xla)
    if name == "ours_user":
        return VariantSpec(name, jit_compile="auto", user_defaults=True)
    if name in ("ours_autotune", "ours_autotune_xla"):
        return VariantSpec(name, jit_compile=xla, autotune=True)
    if name == "ours_measured":
        # The optimal profile without XLA, its step chosen by timing the candidates in the
        # first steps (the planned step, float32's, the default lists'): amp_rewrite's
        # training-side autotune.
        return VariantSpec(name, lists="optimal", options_json=json.dumps({"measure_steps": MEASURE_STEPS}))
    if name in ("ours_optimal", "ours_optimal_xla"):
        # The optimal planner's own plan, the one the cost model predicts: a training step left
        # to itself on a GPU without XLA (also one Keras will not compile, a cuDNN LSTM's)
        # measures its candidates since 2026-11-28 (that is ``ours_measured``), so these say not to.
        return VariantSpec(name, jit_compile=xla, lists="optimal", options_json=json.dumps({"measure_steps": 0}))
    if name.startswith("ours_"):
        lists = name[len("ours_"):].removesuffix("_xla")
        if lists in ("tensorflow", "default", "optimal"):
            return VariantSpec(name, jit_compile=xla, lists=lists)
    raise ValueError(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}")


# --------------------------------------------------------------------------- models


def _keras() -> Any:
    import keras

    return keras


def _position_embedding_layer() -> Any:
    """A Keras layer adding a learned position embedding (built lazily: Keras imports late)."""
    keras = _keras()

    class PositionEmbedding(keras.layers.Layer):
        """``x + P`` with ``P`` a learned ``(length, dim)`` table (BERT/GPT style)."""

        def build(self, input_shape: Any) -> None:
            self.table = self.add_weight(
                shape=(input_shape[-2], input_shape[-1]), name="table",
                initializer=keras.initializers.RandomNormal(stddev=0.02))

        def call(self, x: Any) -> Any:
            return x + keras.ops.cast(self.table, x.dtype)

    return PositionEmbedding


def encoder(*, seq: int, d: int, layers: int, heads: int, ff: int, vocab: int, classes: int,
            causal: bool = False, name: str = "encoder") -> Any:
    """A transformer of Keras layers with random weights.

    ``causal=False``: a BERT-style encoder (post-LN blocks, GELU FFN, classification from the
    first token).  ``causal=True``: a GPT-style decoder (pre-LN blocks, a causal attention mask
    through ``MultiHeadAttention(use_causal_mask=True)``, a final LN and next-token logits at
    every position).  No dropout, so every variant's loss is computed on the same function.
    The logits layer is float32 under a mixed policy, as Keras's mixed-precision guide says.
    """
    keras = _keras()
    tokens = keras.Input((seq,), dtype="int32", name="tokens")
    h = keras.layers.Embedding(vocab, d, name="embed")(tokens)
    h = _position_embedding_layer()(name="positions")(h)
    for i in range(layers):
        if causal:
            a = keras.layers.LayerNormalization(epsilon=1e-5, name=f"ln1_{i}")(h)
            a = keras.layers.MultiHeadAttention(heads, d // heads, name=f"attn_{i}")(a, a, use_causal_mask=True)
            h = h + a
            f = keras.layers.LayerNormalization(epsilon=1e-5, name=f"ln2_{i}")(h)
            f = keras.layers.Dense(ff, activation="gelu", name=f"ff1_{i}")(f)
            h = h + keras.layers.Dense(d, name=f"ff2_{i}")(f)
        else:
            a = keras.layers.MultiHeadAttention(heads, d // heads, name=f"attn_{i}")(h, h)
            h = keras.layers.LayerNormalization(epsilon=1e-12, name=f"ln1_{i}")(h + a)
            f = keras.layers.Dense(ff, activation="gelu", name=f"ff1_{i}")(h)
            f = keras.layers.Dense(d, name=f"ff2_{i}")(f)
            h = keras.layers.LayerNormalization(epsilon=1e-12, name=f"ln2_{i}")(h + f)
    if causal:
        h = keras.layers.LayerNormalization(epsilon=1e-5, name="ln_f")(h)
        out = keras.layers.Dense(vocab, dtype="float32", name="lm_head")(h)
    else:
        pooled = keras.layers.Dense(d, activation="tanh", name="pooler")(h[:, 0])
        out = keras.layers.Dense(classes, dtype="float32", name="classifier")(pooled)
    return keras.Model(tokens, out, name=name)


def application(cls: str, side: int, classes: int = 1000) -> Any:
    """A ``keras.applications`` model with random weights (``weights=None``) and logits out.

    Dropout layers (EfficientNet's classifier dropout and its drop-connect) get rate 0: a
    dropout mask is drawn per model and per dtype, so with it the variants' losses would differ
    by the mask, not by their arithmetic.  Every variant runs the same (dropout-free) step.
    """
    keras = _keras()
    model = getattr(keras.applications, cls)(weights=None, input_shape=(side, side, 3), classes=classes,
                                             classifier_activation=None)
    for layer in model.layers:
        if isinstance(layer, keras.layers.Dropout):
            layer.rate = 0.0
    return model


def lstm_model(*, seq: int, vocab: int, units: int, layers: int, classes: int) -> Any:
    """Embedding, ``layers`` stacked LSTMs and a float32 classifier (random weights)."""
    keras = _keras()
    tokens = keras.Input((seq,), dtype="int32", name="tokens")
    h = keras.layers.Embedding(vocab, units, name="embed")(tokens)
    for i in range(layers):
        h = keras.layers.LSTM(units, return_sequences=i < layers - 1, name=f"lstm_{i}")(h)
    return keras.Model(tokens, keras.layers.Dense(classes, dtype="float32", name="classifier")(h))


def small_cnn(side: int = 16, classes: int = 10) -> Any:
    """A tiny convolutional net with batch norm (the CNN of ``--reduced``): two 3x3
    convolutions, as few nodes as still give each planner something to convert."""
    keras = _keras()
    x = inp = keras.Input((side, side, 3))
    for i, (filters, stride) in enumerate(((16, 1), (32, 2))):
        x = keras.layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False, name=f"conv_{i}")(x)
        x = keras.layers.BatchNormalization(name=f"bn_{i}")(x)
        x = keras.layers.ReLU(name=f"relu_{i}")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, keras.layers.Dense(classes, dtype="float32", name="classifier")(x), name="small_cnn")


@dataclasses.dataclass(frozen=True)
class Workload:
    """One benchmarked step: a model, training or inference, a batch size."""

    name: str
    build: Callable[[], Any]
    train: bool
    batch: int
    #: "image" (side x side x 3 floats, one class label) or "tokens" (ids below ``vocab``).
    inputs: str
    side: int = 0
    seq: int = 0
    vocab: int = 0
    classes: int = 10
    #: Labels per position (a language model's next tokens) instead of one per example.
    per_token_labels: bool = False
    optimizer: str = "sgd"


def _img(name: str, cls: str, train: bool, batch: int, side: int = 224) -> Workload:
    return Workload(name, lambda: application(cls, side), train, batch, "image", side=side, classes=1000)


BERT = dict(seq=128, d=768, layers=12, heads=12, ff=3072, vocab=30522, classes=2)
GPT = dict(seq=128, d=768, layers=12, heads=12, ff=3072, vocab=8192, classes=8192)

#: The full (GPU) workloads, in the order they run by default: the issue's done-when lines first
#: (ResNet50 training at batch 64, the BERT-base encoder's training step).
FULL_WORKLOADS: tuple[Workload, ...] = (
    _img("resnet50-train-b64", "ResNet50", True, 64),
    Workload("bert_base-train-b32", lambda: encoder(**BERT, name="bert_base"), True, 32, "tokens",
             seq=BERT["seq"], vocab=BERT["vocab"], classes=BERT["classes"], optimizer="adam"),
    _img("resnet50-train-b128", "ResNet50", True, 128),
    Workload("gpt-train-b32", lambda: encoder(**GPT, causal=True, name="gpt"), True, 32, "tokens",
             seq=GPT["seq"], vocab=GPT["vocab"], classes=GPT["vocab"], per_token_labels=True,
             optimizer="adam"),
    _img("resnet50-infer-b1", "ResNet50", False, 1),
    _img("resnet50-infer-b8", "ResNet50", False, 8),
    _img("resnet50-infer-b64", "ResNet50", False, 64),
    _img("mobilenetv2-train-b64", "MobileNetV2", True, 64),
    _img("efficientnetb0-train-b64", "EfficientNetB0", True, 64),
    Workload("lstm-train-b64", lambda: lstm_model(seq=64, vocab=10000, units=1024, layers=2, classes=10),
             True, 64, "tokens", seq=64, vocab=10000, classes=10, optimizer="adam"),
)

TINY_ENCODER = dict(seq=8, d=32, layers=1, heads=2, ff=64, vocab=64, classes=4)

#: ``--reduced``: a tiny CNN and a one-block encoder (same builders as the full models), small
#: enough that all 13 variants of both trace, rewrite and compile in about a minute on 2 CPU
#: cores (a second block doubles the encoder's share; the XLA variants' compiles dominate).
REDUCED_WORKLOADS: tuple[Workload, ...] = (
    Workload("small_cnn-train-b8", lambda: small_cnn(16), True, 8, "image", side=16, classes=10),
    Workload("tiny_encoder-train-b4", lambda: encoder(**TINY_ENCODER, name="tiny_encoder"), True, 4,
             "tokens", seq=TINY_ENCODER["seq"], vocab=TINY_ENCODER["vocab"],
             classes=TINY_ENCODER["classes"]),
    # Not in the default --reduced run (time): the predict path, for `--reduced --workloads`.
    Workload("small_cnn-infer-b8", lambda: small_cnn(16), False, 8, "image", side=16, classes=10),
    # Nor this one: the LSTM's builder, small (its prediction traces Keras's cuDNN path).
    Workload("tiny_lstm-train-b4", lambda: lstm_model(seq=8, vocab=64, units=32, layers=2, classes=4), True, 4,
             "tokens", seq=8, vocab=64, classes=4, optimizer="adam"),
)
#: What ``--reduced`` runs unless ``--workloads`` says otherwise.
REDUCED_DEFAULT = ("small_cnn-train-b8", "tiny_encoder-train-b4")


def make_batch(w: Workload) -> tuple[np.ndarray, np.ndarray]:
    """The workload's input batch and labels, generated from a fixed seed.  Pure."""
    rng = np.random.default_rng(SEED)
    if w.inputs == "image":
        x = rng.standard_normal((w.batch, w.side, w.side, 3)).astype(np.float32)
    else:
        x = rng.integers(0, w.vocab, size=(w.batch, w.seq)).astype(np.int32)
    shape = (w.batch, w.seq) if w.per_token_labels else (w.batch,)
    y = rng.integers(0, w.classes, size=shape).astype(np.int32)
    return x, y


# --------------------------------------------------------------------------- machine


def gpu_available() -> bool:
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def machine_info() -> dict[str, Any]:
    """Device, driver, CUDA/cuDNN (TensorFlow's build and ``nvidia-smi``), versions and date."""
    import keras
    import tensorflow as tf

    import amp_rewrite

    build = dict(tf.sysconfig.get_build_info())
    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "amp_rewrite": getattr(amp_rewrite, "__version__", "unknown"),
        "tf_build_cuda": build.get("cuda_version"),
        "tf_build_cudnn": build.get("cudnn_version"),
        "tf_build_cuda_compute_capabilities": build.get("cuda_compute_capabilities"),
        "gpus": [tf.config.experimental.get_device_details(g) for g in tf.config.list_physical_devices("GPU")],
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "nvidia_smi": None,
    }
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=name,driver_version,memory.total,compute_cap", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=30)
            head = subprocess.run([smi], capture_output=True, text=True, timeout=30).stdout.splitlines()
            # The banner line names the driver's CUDA version ("CUDA Version: 13.0").
            cuda_line = next((line for line in head if "CUDA Version" in line), "")
            info["nvidia_smi"] = {"gpus": out.stdout.strip().splitlines(),
                                  "banner": " ".join(cuda_line.strip("| ").split())}
        except (OSError, subprocess.SubprocessError) as exc:  # reported, not fatal
            info["nvidia_smi"] = f"failed: {exc!r}"
    return info


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# --------------------------------------------------------------------------- global switches


class Switches:
    """The process-wide settings a variant needs while it runs: TF32 and TensorFlow's AMP pass.

    Both are global to the process, so they are set before each of a variant's calls (its
    first step included) and restored after: the other variants never run, nor get their
    functions instantiated, with them.
    """

    def __init__(self, precision: str) -> None:
        import tensorflow as tf

        # float16 is TensorFlow's GPU pass; bfloat16 its oneDNN (CPU) pass.
        self.amp_key = "auto_mixed_precision" if precision == "float16" else "auto_mixed_precision_onednn_bfloat16"
        # The runtime instantiates a function once per config (measured: after the option was
        # first set, each function's next call took 390 ms instead of 5 on a tiny step, and then
        # stayed fast).  Set "off" explicitly before any function runs, so every other
        # variant's functions are instantiated once, under the same config, for the whole run.
        tf.config.optimizer.set_experimental_options({self.amp_key: False})

    def enter(self, spec: VariantSpec) -> None:
        import tensorflow as tf

        tf.config.experimental.enable_tensor_float_32_execution(spec.tf32)
        if spec.tf_amp:
            tf.config.optimizer.set_experimental_options({self.amp_key: True})

    def leave(self, spec: VariantSpec) -> None:
        import tensorflow as tf

        if spec.tf_amp:
            tf.config.optimizer.set_experimental_options({self.amp_key: False})
        tf.config.experimental.enable_tensor_float_32_execution(True)


# --------------------------------------------------------------------------- one variant


def _optimizer(kind: str) -> Any:
    keras = _keras()
    if kind == "adam":
        return keras.optimizers.Adam(learning_rate=1e-4)
    return keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)


@dataclasses.dataclass
class Config:
    """Run settings shared by every workload."""

    precision: str  #: "float16" or "bfloat16"
    target: str  #: our variants' target ("auto" on the GPU, "cpu" in --reduced)
    repeats: int
    steps: int
    warmup: int
    predict: bool  #: compute the cost model's predicted ratios
    deadline: float  #: time.monotonic() after which no new repeat or workload starts


class VariantRun:
    """One variant's model on one workload: built, compiled, first step, then timed steps."""

    def __init__(self, spec: VariantSpec, w: Workload, weights: list[Any], cfg: Config,
                 switches: Switches, x: Any, y: Any) -> None:
        keras = _keras()
        import amp_rewrite

        self.spec, self.w, self.cfg, self.switches = spec, w, cfg, switches
        self.x, self.y = x, y
        self.step_ms: list[float] = []  #: per repeat: median step time
        self.peak_bytes: list[int] = []
        self.peak_delta_bytes: list[int] = []
        self.first_step_s = math.nan
        #: ``ours_measured``: the untimed trial calls after the first step, and their seconds.
        self.measure_calls: int | None = None
        self.measure_s: float | None = None
        self.first_value: np.ndarray | None = None
        self.served: Any = None  #: the autotuned SavedModel, loaded (autotune variants)
        self.autotune_report: dict[str, Any] | None = None
        if spec.autotune:
            if w.train:
                raise ValueError(NOT_AUTOTUNED)
            self.model = w.build()  # float32, exported and autotuned at the first step
            self.model.set_weights(weights)
            return
        policy = f"mixed_{cfg.precision}" if spec.policy == "mixed" else "float32"
        # No keras.utils.set_random_seed here: the weights come from set_weights below, and
        # tf.random.set_seed makes every tf.function traced before it retrace at its next call
        # (measured: each earlier variant's next step took 200-400 ms instead of 5, and an XLA
        # step would recompile).  run_workload seeds once, before any variant is built.
        keras.mixed_precision.set_dtype_policy(policy)
        try:
            self.model = w.build()
        finally:
            keras.mixed_precision.set_dtype_policy("float32")
        # The same initial weights in every variant (a mixed policy keeps float32 variables).
        self.model.set_weights(weights)
        opt = _optimizer(w.optimizer)
        if spec.user_defaults:
            opt = amp_rewrite.enable_mixed_precision_graph_rewrite(opt, **spec.options)
        elif spec.lists is not None:
            opt = amp_rewrite.enable_mixed_precision_graph_rewrite(
                opt, **{"lists": spec.lists, "target": cfg.target, "precision": cfg.precision, **spec.options})
        elif spec.tf_amp and cfg.precision == "float16":
            opt = keras.optimizers.LossScaleOptimizer(opt)
        self.model.compile(optimizer=opt, jit_compile=spec.jit_compile,
                           loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        if w.train:
            # Without a distribution strategy Keras builds the optimizer inside the first trace
            # of the train step, and a tf.function that creates variables is traced twice.  Built
            # here, every variant's first step is one trace, one rewrite, one compile.
            self.model.optimizer.build(self.model.trainable_variables)

    def _call(self) -> Any:
        """One synchronous step: the loss (training) or the outputs (inference) on the host."""
        if self.spec.autotune:
            if self.served is None:
                self._autotune()
            return self.served.serve(self.x).numpy()
        if self.w.train:
            return self.model.train_on_batch(self.x, self.y, return_dict=True)["loss"]
        return self.model.predict_on_batch(self.x)

    def _autotune(self) -> None:
        """Export the float32 model, ``rewrite_saved_model(..., autotune=...)`` it as a user
        would (``--xla`` for the XLA variant; on this machine, in the variant's precision and
        target), and load the model it writes.  Part of the first step's time."""
        import shutil
        import tempfile

        import tensorflow as tf

        import amp_rewrite
        from amp_rewrite.autotune import AutotuneOptions

        tmp = tempfile.mkdtemp(prefix="gpu_bench_autotune_")
        try:
            src, dst = os.path.join(tmp, "float32"), os.path.join(tmp, "tuned")
            self.model.export(src, verbose=False)
            opts = AutotuneOptions(batch=self.w.batch, repeats=5, steps=3, sessions=1, max_repeats=10)
            self.autotune_report = amp_rewrite.rewrite_saved_model(
                src, dst, target=self.cfg.target, precision=self.cfg.precision, xla=bool(self.spec.jit_compile),
                autotune=opts, use_env=False)
            self.served = tf.saved_model.load(dst)  # variables are read now: the files can go
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def first_step(self) -> None:
        """Trace, rewrite, compile and run once; keep the loss/outputs for the error column.
        A variant that chooses its step by measuring (``ours_measured``) then runs its trial
        steps here, untimed (:meth:`_finish_measuring`), so that its timed repeats time the
        step it chose, not a mix of the candidates."""
        self.switches.enter(self.spec)
        try:
            t = time.perf_counter()
            value = self._call()
            self.first_step_s = time.perf_counter() - t
            if self.spec.measured:
                t = time.perf_counter()
                self.measure_calls = self._finish_measuring()
                self.measure_s = time.perf_counter() - t
        finally:
            self.switches.leave(self.spec)
        self.first_value = np.asarray(value, dtype=np.float64)

    def _finish_measuring(self) -> int:
        """Call the step until every signature's measured choice is made (at most
        :data:`MAX_MEASURE_CALLS` calls: a step whose loss scale keeps skipping its updates
        may take more trial steps than candidates x (1 + MEASURE_STEPS)); how many calls."""
        amp_fn = self.amp_function()
        calls = 0
        while (amp_fn is not None and calls < MAX_MEASURE_CALLS
               and any(c["chosen"] is None for c in amp_fn.measured_choices)):
            self._call()
            calls += 1
        return calls

    def timed_repeat(self) -> None:
        """``warmup`` untimed steps, then ``steps`` timed ones; appends their median."""
        import tensorflow as tf

        gpu = gpu_available()
        self.switches.enter(self.spec)
        try:
            if gpu:
                tf.config.experimental.reset_memory_stats("GPU:0")
                base = tf.config.experimental.get_memory_info("GPU:0")["current"]
            for _ in range(self.cfg.warmup):
                self._call()
            times = []
            for _ in range(self.cfg.steps):
                t = time.perf_counter()
                self._call()
                times.append(time.perf_counter() - t)
            if gpu:
                peak = tf.config.experimental.get_memory_info("GPU:0")["peak"]
                self.peak_bytes.append(int(peak))
                self.peak_delta_bytes.append(int(peak - base))
        finally:
            self.switches.leave(self.spec)
        self.step_ms.append(1e3 * statistics.median(times))

    @property
    def xla(self) -> bool:
        """Whether Keras compiles this variant's step with XLA (``"auto"`` as Keras resolved it;
        an autotuned SavedModel: whether it was marked)."""
        if self.spec.autotune:
            return bool(self.spec.jit_compile)
        return bool(getattr(self.model, "jit_compile", self.spec.jit_compile))

    # -- our variants ---------------------------------------------------------------------
    def amp_function(self) -> Any:
        """Our rewritten step (an ``amp_rewrite.function``), or ``None`` for other variants."""
        fn = self.model.train_function if self.w.train else self.model.predict_function
        return getattr(fn, "amp_function", None)

    def rewrite_info(self) -> dict[str, Any] | None:
        """The live rewrite report's counts and its placement estimates (ours only); for an
        autotuned model, the written model's counts and autotune's choice and line."""
        if self.autotune_report is not None:
            r = self.autotune_report
            return {"converted_nodes": r["converted_nodes"], "total_nodes": r["total_nodes"],
                    "casts_to_low": r["casts_to_low"], "casts_to_high": r["casts_to_high"],
                    "precision": r.get("precision"), "target": r.get("target"), "skipped": r.get("skipped"),
                    "autotune_choice": r["autotune"]["choice"], "autotune_summary": r["autotune"]["summary"],
                    "xla_compiled": bool(r.get("xla", {}).get("compiled_functions"))}
        amp_fn = self.amp_function()
        if amp_fn is None or not amp_fn.rewrite_results:
            return None
        report = amp_fn.rewrite_results[-1].report
        est = placement_estimates(report)
        return {
            "converted_nodes": report["converted_nodes"], "total_nodes": report["total_nodes"],
            "casts_to_low": report["casts_to_low"], "casts_to_high": report["casts_to_high"],
            "precision": report.get("precision"), "target": report.get("target"),
            "skipped": report.get("skipped"), "placement_estimated_us": est,
            "xla_compiled": amp_fn.xla_compiled(), "rewrite_s": amp_fn.rewrite_seconds,
            # measure_steps: each candidate's median step in its trial steps, and the one kept.
            "measured_choices": amp_fn.measured_choices,
            # The trial calls after the first step, untimed (first_step), and their seconds.
            "measure_calls": self.measure_calls,
            "measure_s": self.measure_s,
        }

    def predicted_ratio(self, baseline: str | None) -> tuple[float | None, str]:
        """The cost model's estimate of this variant's step over ``baseline``'s (float32 in the
        same mode), both traced again here and priced whole (:func:`predicted_step_ratio`)."""
        if self.spec.measured:
            return None, "not priced: the step is chosen by measurement"
        if not self.cfg.predict:
            return None, "not computed (--no-predict)"
        if baseline is None:
            return None, "no float32 baseline in this run"
        ratio = predicted_step_ratio(self.w.name, self.spec.name, baseline, target=self.cfg.target,
                                     precision=self.cfg.precision)
        return ratio, f"step estimates: {self.spec.name}/{baseline}"


def workload_named(name: str) -> Workload:
    """The workload of this module called ``name`` (full or reduced).  Pure."""
    return next(w for w in FULL_WORKLOADS + REDUCED_WORKLOADS if w.name == name)


def _output_nodes(graph: Any) -> tuple[str, ...]:
    """The nodes of a traced function's (``tf.Graph``'s) outputs, sorted.  Pure."""
    return tuple(sorted({t.op.name for t in graph.outputs}))


def _rewritten(graph: Any, shapes: Any, *, target: str, precision: str, lists: str, compiled: bool) -> Any:
    """Our rewrite of a traced step (``tf.Graph``) with ``lists``, fetching its outputs: the
    GraphDef.  Reads ``graph``."""
    import amp_rewrite

    return amp_rewrite.rewrite_graph_def(
        graph.as_graph_def(), fetches=list(_output_nodes(graph)), variable_shapes=shapes,
        target=target, precision=precision, lists=lists, compiled=compiled, use_env=False).graph_def


class TracedStep(NamedTuple):
    """A variant's step as traced here (:func:`variant_graph_def`)."""

    graph_def: Any
    #: The captured variables' shapes, by resource placeholder (``variable_shapes=``).
    variable_shapes: Any
    #: Whether the step runs under XLA on a GPU.
    compiled: bool
    #: The traced function's outputs' nodes: with its stateful ops, what the step runs
    #: (``estimate_step_time(fetches=)``).
    fetches: tuple[str, ...]


def variant_graph_def(workload: str, variant: str, *, target: str, precision: str) -> TracedStep:
    """``(GraphDef, variable shapes, compiled, fetches)`` of ``variant``'s step on ``workload`` as this
    module's run builds it on a GPU, traced here (no step runs, no GPU needed; Keras's
    GPU-only paths are taken, :func:`keras_as_on_a_gpu`): the float32 model's Keras step for
    the float32 variants, the ``mixed_<precision>`` model's for Keras's, our traced step
    rewritten with the variant's lists and ``compiled`` for ours, and the float32 step with
    Keras's loss-scale optimizer (float16) rewritten with the ``tensorflow`` lists (the parity of
    TensorFlow's pass) for ``tf_amp``.
    ``float32_strict`` is float32's graph: only its device class differs.  Ours is the graph
    our step's runner would run (:func:`ours_step`).  ``compiled`` is
    what the variant's ``jit_compile`` comes to on a GPU: ``True`` and ``"auto"`` are XLA
    unless a layer opts the model out (Keras's ``model_supports_jit``: an LSTM on cuDNN does;
    Keras then compiles nothing, and says so for ``True``)."""
    import keras

    from amp_rewrite.training.tf_function import captured_variable_shapes

    spec = variant_spec(variant)
    if spec.autotune:
        raise ValueError(f"{variant}: autotune chooses its graph by measurement; there is no one plan to trace")
    try:
        if spec.ours:
            return ours_step(workload, lists=spec.lists or "default", target=target, precision=precision,
                             jit_compile=spec.jit_compile, options_json=spec.options_json)
        # TensorFlow's pass runs on the float32 model's step with the loss scale VariantRun
        # gives it (float16 only: bfloat16 needs none).
        graph, supports_xla = trace_keras_step(workload, mixed=spec.policy == "mixed", precision=precision,
                                               loss_scaled=spec.tf_amp and precision == "float16")
        xla = spec.jit_compile is not False and supports_xla
        shapes = captured_variable_shapes(graph)
        fetches = _output_nodes(graph)
        if not spec.tf_amp:
            return TracedStep(graph.as_graph_def(), shapes, xla, fetches)
        return TracedStep(_rewritten(graph, shapes, target=target, precision=precision, lists="tensorflow",
                                     compiled=False), shapes, False, fetches)
    finally:
        keras.backend.clear_session()


@contextlib.contextmanager
def keras_as_on_a_gpu() -> Any:
    """Build and trace Keras models as on a machine with a GPU, on any machine.  Keras picks
    some paths when a layer is built or traced, from the devices present: with a GPU its LSTM
    and GRU trace to cuDNN's fused kernel (``CudnnRNNV3``) and opt the model out of XLA, on a
    CPU to a ``While`` loop of the cell.  A prediction of a GPU run made on a CPU must price
    the GPU's graph, so Keras's device check answers "a GPU" while this is active.  (The graph
    is traced, never run: a CPU has no kernel for ``CudnnRNNV3``.)  On a GPU it changes
    nothing."""
    import importlib

    # The module (the package exports a function of the same name).
    rnn = importlib.import_module("keras.src.backend.tensorflow.rnn")
    saved = rnn._is_gpu_available  # noqa: SLF001  (Keras's one device check for its RNN paths)
    rnn._is_gpu_available = lambda: True  # noqa: SLF001
    try:
        yield
    finally:
        rnn._is_gpu_available = saved  # noqa: SLF001


def predicted_step_ratio(workload: str, variant: str, baseline: str, *, target: str, precision: str,
                         costs: Any = None) -> float:
    """The cost model's estimated step time of ``variant`` over ``baseline``'s on ``workload``
    (:func:`estimated_step_ns` of each).  ``costs``: a device class to price both with instead
    of the target's (a GPU whose measured bandwidth differs from its family's)."""
    return (estimated_step_ns(workload, variant, target=target, precision=precision, costs=costs,
                              options_json=variant_spec(variant).options_json)
            / estimated_step_ns(workload, baseline, target=target, precision=precision, costs=costs))


@functools.lru_cache(maxsize=None)
def estimated_step_ns(workload: str, variant: str, *, target: str, precision: str, costs: Any = None,
                      options_json: str = "") -> float:
    """:func:`amp_rewrite.estimate_step_time` of :func:`variant_graph_def`, ``float32_strict``
    priced with TF32 off (with ``costs``' bandwidth where given).  Cached per process (per
    variant and its extra options): a baseline is priced once for all the variants measured
    against it."""
    import amp_rewrite
    from amp_rewrite.plan.cost_model import costs_for

    step = variant_graph_def(workload, variant, target=target, precision=precision)
    tgt, costs = variant_target_and_costs(variant, target, precision, costs)
    return amp_rewrite.estimate_step_time(step.graph_def, target=tgt, precision=precision, compiled=step.compiled,
                                          variable_shapes=step.variable_shapes, costs=costs,
                                          fetches=step.fetches).total_ns


def variant_target_and_costs(variant: str, target: str, precision: str, costs: Any = None) -> tuple[Any, Any]:
    """The target (a :class:`amp_rewrite.Target`) and device class to price ``variant``'s
    graph with: ``target`` as it is, but for ``float32_strict``, whose GPUs have TF32 off (and,
    where ``costs`` is given, that class's strict-FP32 sibling with ``costs``' bandwidth).
    Pure."""
    import amp_rewrite
    from amp_rewrite.plan.cost_model import costs_for

    tgt = amp_rewrite.resolve_target(target)
    if variant != "float32_strict" or not any(d.type == "GPU" for d in tgt.devices):
        return tgt, costs
    tgt = dataclasses.replace(tgt, devices=tuple(
        dataclasses.replace(d, features=d.features | {"tf32_off"}) if d.type == "GPU" else d
        for d in tgt.devices))
    if costs is not None:
        strict = costs_for(next(d for d in tgt.devices if d.type == "GPU"), precision)
        costs = dataclasses.replace(strict, bandwidth=costs.bandwidth)
    return tgt, costs


def _supports_xla(model: Any) -> bool:
    """Whether Keras would compile ``model``'s steps under ``jit_compile="auto"`` on a GPU:
    every layer supports XLA (Keras's ``model_supports_jit``).  Pure."""
    from keras.src.trainers.trainer import model_supports_jit

    return bool(model_supports_jit(model))


def trace_keras_step(workload: str, *, mixed: bool, precision: str = "float16",
                     loss_scaled: bool = False) -> tuple[Any, bool]:
    """The traced (not run) Keras step of a workload's model without our rewrite, as on a GPU
    (:func:`keras_as_on_a_gpu`): float32, or built under Keras's ``mixed_<precision>`` policy
    (Keras wraps its optimizer in a loss scale for float16).  ``loss_scaled``: the optimizer
    wrapped in ``keras.optimizers.LossScaleOptimizer`` as :class:`VariantRun` wraps it for
    ``tf_amp`` (the float32 model whose graph TensorFlow's pass rewrites).  ``(tf.Graph, whether
    Keras would compile it under "auto")``; no step runs."""
    import keras
    import tensorflow as tf

    w = workload_named(workload)
    keras.utils.set_random_seed(SEED)
    keras.mixed_precision.set_dtype_policy(f"mixed_{precision}" if mixed else "float32")
    with keras_as_on_a_gpu():
        try:
            model = w.build()
        finally:
            keras.mixed_precision.set_dtype_policy("float32")
        opt = _optimizer(w.optimizer)
        if loss_scaled:
            opt = keras.optimizers.LossScaleOptimizer(opt)
        model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        x, y = make_batch(w)
        if w.train:
            model.optimizer.build(model.trainable_variables)
            graph = tf.function(lambda data: model.train_step(data)).get_concrete_function(
                (tf.constant(x), tf.constant(y))).graph
        else:
            graph = tf.function(lambda data: model.predict_step(data)).get_concrete_function((tf.constant(x),)).graph
    return graph, _supports_xla(model)


def _our_step_function(workload: str, *, lists: str, target: str, precision: str,
                       jit_compile: bool | str, options_json: str = "") -> tuple[Any, tuple[Any, ...], bool]:
    """A fresh model of ``workload`` with its optimizer wrapped by
    ``enable_mixed_precision_graph_rewrite``, compiled with what ``jit_compile`` comes to on a
    GPU, as ``fit`` builds it: ``(its rewritten step, an amp_rewrite Function; the step's
    arguments for a batch; whether Keras would compile it under "auto")``.  Call inside
    :func:`keras_as_on_a_gpu`; no step runs."""
    import keras

    import amp_rewrite

    w = workload_named(workload)
    keras.utils.set_random_seed(SEED)
    model = w.build()
    options = {"lists": lists, "target": target, "precision": precision,
               **(json.loads(options_json) if options_json else {})}
    opt = amp_rewrite.enable_mixed_precision_graph_rewrite(_optimizer(w.optimizer), **options)
    # Traced here on a CPU, "auto" would resolve to no XLA: trace with what it comes to on a
    # GPU (Keras turns True down too where a layer does not support XLA).
    xla = jit_compile is not False and _supports_xla(model)
    model.compile(optimizer=opt, jit_compile=xla,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = make_batch(w)
    if w.train:
        model.optimizer.build(model.trainable_variables)
        return model.make_train_function().amp_function, ((x, y, None),), _supports_xla(model)
    return model.make_predict_function().amp_function, ((x,),), _supports_xla(model)


def trace_step(workload: str, *, lists: str, target: str, precision: str,
               jit_compile: bool | str) -> tuple[Any, bool]:
    """The traced (not rewritten, not run) Keras step of a workload of this module, as our
    optimizer and ``fit`` build it on a GPU (:func:`keras_as_on_a_gpu`): a fresh model with
    the workload's optimizer wrapped by ``enable_mixed_precision_graph_rewrite``, compiled
    with ``jit_compile``.  ``(tf.Graph, whether Keras would compile it under "auto")``; no GPU
    needed, no step runs."""
    with keras_as_on_a_gpu():
        function, args, supports_xla = _our_step_function(workload, lists=lists, target=target,
                                                          precision=precision, jit_compile=jit_compile)
        graph = function.get_concrete_function(*args).graph
    return graph, supports_xla


def ours_step(workload: str, *, lists: str, target: str, precision: str,
              jit_compile: bool | str, options_json: str = "") -> TracedStep:
    """:class:`TracedStep` of the step our rewritten Keras step would run
    on a GPU (:func:`keras_as_on_a_gpu`), built as its first call builds it, without running
    it: the traced step rewritten with the optimizer's options, or, where that converts
    nothing, the step traced again without loss scaling (what ``fit`` then runs).  No GPU
    needed."""
    from amp_rewrite.training.tf_function import captured_variable_shapes

    with keras_as_on_a_gpu():
        function, args, supports_xla = _our_step_function(workload, lists=lists, target=target,
                                                          precision=precision, jit_compile=jit_compile,
                                                          options_json=options_json)
        runner = function._runner(function.get_concrete_function(*args))  # noqa: SLF001  (the first call's)
    xla = jit_compile is not False and supports_xla
    graph = runner.concrete.graph
    return TracedStep(runner.result.graph_def, captured_variable_shapes(graph), xla, _output_nodes(graph))


def placement_estimates(report: dict[str, Any]) -> dict[str, float] | None:
    """The cost model's estimated microseconds (float32, greedy, optimal) summed over the main
    graph and every function section that has a ``placement`` (the optimal planner writes one
    per graph it plans), or ``None`` when no section has one.  Pure."""
    sections = [report, *report.get("functions", {}).values()]
    total = {"float32": 0.0, "greedy": 0.0, "optimal": 0.0}
    found = False
    for section in sections:
        est = (section.get("placement") or {}).get("estimated_us")
        if est:
            found = True
            for k in total:
                total[k] += float(est[k])
    return total if found else None


def relative_error(value: np.ndarray | None, ref: np.ndarray | None) -> float | None:
    """``max|value - ref| / max|ref|`` (a loss is one number), or ``None`` if one is missing."""
    if value is None or ref is None:
        return None
    scale = float(np.max(np.abs(ref))) or 1.0
    return float(np.max(np.abs(value - ref))) / scale


# --------------------------------------------------------------------------- one workload


def run_workload(w: Workload, variants: list[str], cfg: Config, switches: Switches,
                 progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Every variant of ``w`` side by side; returns the workload's JSON record.

    ``progress``, if given, receives a partial record (``"partial": True``, no cost-model
    predictions) once every variant has had its first step and again after each repeat, so a
    caller can write what is measured before a device call's time limit stops the process:
    a workload whose variants take minutes to compile under XLA is not lost whole."""
    import tensorflow as tf

    keras = _keras()
    t_start = time.perf_counter()
    keras.utils.set_random_seed(SEED)
    weights = w.build().get_weights()  # the shared initial weights
    x_np, y_np = make_batch(w)
    device = "/GPU:0" if gpu_available() else "/CPU:0"
    with tf.device(device):  # the batch lives on the device: no host-to-device copy is timed
        x, y = tf.identity(tf.constant(x_np)), tf.identity(tf.constant(y_np))
    runs: dict[str, VariantRun] = {}
    errors: dict[str, str] = {}
    not_applicable = {n: NOT_AUTOTUNED for n in variants if w.train and variant_spec(n).autotune}
    for name in variants:
        if name in not_applicable:
            continue
        if time.monotonic() > cfg.deadline:
            # Past the budget no variant starts its (long: trace, rewrite, XLA compile) first
            # step, so the run ends in time and writes what it has; the table says which.
            errors[name] = "not run: --time-budget spent before its first step"
            continue
        try:
            run = VariantRun(variant_spec(name), w, weights, cfg, switches, x, y)
            run.first_step()
            runs[name] = run
        except Exception as exc:  # a variant that cannot run is reported, the others go on
            errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:400]
            print(f"[{w.name}] {name}: FAILED {errors[name]}", flush=True)
    repeats_done = 0

    def record(partial: bool) -> dict[str, Any]:
        return _workload_record(w, runs, errors, not_applicable, repeats_done, cfg,
                                time.perf_counter() - t_start, partial=partial)

    if progress:
        progress(record(partial=True))
    order = list(runs)
    for r in range(cfg.repeats):
        if r > 0 and time.monotonic() > cfg.deadline:
            break  # keep what is done; the record says how many repeats ran
        k = r % len(order) if order else 0
        for name in order[k:] + order[:k]:  # round robin, start rotated per repeat
            if name in errors:
                continue
            try:
                runs[name].timed_repeat()
            except Exception as exc:  # e.g. out of memory: reported, the others go on
                errors[name] = f"{type(exc).__name__} in repeat {r}: {str(exc).splitlines()[0] if str(exc) else ''}"[:400]
                print(f"[{w.name}] {name}: FAILED {errors[name]}", flush=True)
        repeats_done += 1
        if progress and r + 1 < cfg.repeats:
            progress(record(partial=True))
    rec = record(partial=False)
    del runs, weights
    keras.backend.clear_session()
    gc.collect()
    return rec


def _workload_record(w: Workload, runs: dict[str, VariantRun], errors: dict[str, str],
                     not_applicable: dict[str, str], repeats_done: int, cfg: Config, seconds: float,
                     *, partial: bool) -> dict[str, Any]:
    """The workload's JSON record from what its variants have measured so far.  A partial one
    (the workload still running) leaves the cost model's predictions out: they trace and price
    each step again, which would cost device time between repeats.  Reads ``runs``."""
    ref = runs.get(REFERENCE)
    base = runs.get("float32")
    base_xla = runs.get("float32_xla")
    out_variants: dict[str, Any] = {}
    for name, run in runs.items():
        if name in errors:
            continue  # a variant that failed in a repeat is listed under "failed" only
        step = statistics.median(run.step_ms) if run.step_ms else math.nan
        rec: dict[str, Any] = {
            "step_ms": step,
            "step_ms_per_repeat": list(run.step_ms),
            "examples_per_s": w.batch / (step / 1e3) if step and math.isfinite(step) else None,
            "first_step_s": run.first_step_s,
            "peak_mem_mib": max(run.peak_bytes) / 2**20 if run.peak_bytes else None,
            "peak_mem_above_start_mib": max(run.peak_delta_bytes) / 2**20 if run.peak_delta_bytes else None,
            "rel_err_vs_float32_strict": relative_error(run.first_value, ref.first_value if ref else None),
            "first_value": float(run.first_value) if run.first_value is not None and run.first_value.size == 1 else None,
        }
        if run.spec.ours:
            info = run.rewrite_info()
            rec["rewrite"] = info
            # The cost model prices float32 as it runs beside the plan: under XLA against XLA.
            baseline = base_xla if run.xla else base
            if info is not None and not partial:
                try:
                    pred, source = run.predicted_ratio(baseline.spec.name if baseline else None)
                except Exception as exc:  # the measurements stand without the estimate
                    pred, source = None, f"failed: {type(exc).__name__}: {exc}"[:400]
                rec["predicted_ratio"], rec["predicted_source"] = pred, source
            rec["measured_ratio_baseline"] = baseline.spec.name if baseline else None
            rec["measured_ratio"] = (step / statistics.median(baseline.step_ms)
                                     if baseline and baseline.step_ms else None)
        out_variants[name] = rec
    aa = None
    again = runs.get("float32_again")
    if base and again and base.step_ms and again.step_ms:
        b, a = statistics.median(base.step_ms), statistics.median(again.step_ms)
        aa = abs(a - b) / b
    return {
        "workload": w.name, "train": w.train, "batch": w.batch,
        "repeats": repeats_done, "steps": cfg.steps, "warmup": cfg.warmup,
        "variants": out_variants, "failed": dict(errors), "not_applicable": not_applicable, "aa_gap": aa,
        "seconds": seconds, "partial": partial,
    }


# --------------------------------------------------------------------------- output


def _fmt(v: Any, spec: str = ".2f") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return format(v, spec)


def render_markdown(results: dict[str, Any]) -> str:
    """The results as markdown: machine, settings, and one table per workload.  Pure."""
    m = results["machine"]
    cfg = results["config"]
    lines = [
        "# GPU benchmark (issue 22): Keras mixed-precision variants side by side",
        "",
        f"Written by `bench/gpu_bench.py` on {m.get('date')} ({'reduced CPU mode' if cfg.get('reduced') else 'full mode'}).",
        "Every number below was measured in this run; nothing is copied from elsewhere.",
        "",
        "## Machine",
        "",
        f"- GPUs (TensorFlow): {json.dumps(m.get('gpus')) if m.get('gpus') else 'none (CPU only)'}",
        f"- nvidia-smi: {json.dumps(m.get('nvidia_smi')) if m.get('nvidia_smi') else 'not present'}",
        f"- TensorFlow {m.get('tensorflow')} (built with CUDA {m.get('tf_build_cuda') or 'n/a'}, "
        f"cuDNN {m.get('tf_build_cudnn') or 'n/a'}), Keras {m.get('keras')}, amp_rewrite {m.get('amp_rewrite')}, "
        f"Python {m.get('python')}",
        f"- CPU: {m.get('cpu')} ({m.get('cores')} cores)",
        "",
        "## Settings",
        "",
        f"- precision {cfg['precision']}, our target `{cfg['target']}`; {cfg['repeats']} repeats (round robin, "
        f"order rotated per repeat) of {cfg['warmup']} warm-up + {cfg['steps']} timed steps per variant",
        "- step ms: median over a repeat's timed steps, then median over repeats; `vs f32`: step time over "
        "`float32` (TF32 on, TensorFlow's default); rel err: first step's loss (training) or outputs "
        "(inference) against `float32_strict` on the same inputs and weights, max|a-b|/max|b|",
        "- first step s: the first call (trace, rewrite, compile, run); for ours, in brackets, the seconds our "
        "rewrite took of it (`amp_rewrite.function`'s `rewrite_seconds`: the rewrite, and any second trace, "
        "estimate and rewrite of the float32 step)",
        "- peak MiB: device memory peak while the variant ran (absolute / above what was in use when it began)",
        "- predicted / measured: the cost model's estimate of our rewritten step over float32's, each "
        "priced whole (`amp_rewrite.estimate_step_time`), and the measured step time over `float32` "
        "(over `float32_xla` for XLA variants)",
        "- `ours_autotune` / `ours_autotune_xla` (inference only; a fit step has no SavedModel): the float32 model "
        "exported, `amp-rewrite rewrite --autotune` (`--xla`) on this machine, the written model loaded and served; "
        "its first step holds the export, the autotuning and the load; its step is the served model's call, not Keras's "
        "`predict_on_batch`, so its ratio to float32 holds that difference too even where float32 is kept",
        *[f"- `{n}` (extra variant): `{e['base']}` with the rewrite options `{json.dumps(e['options'], sort_keys=True)}`"
          for n, e in sorted((cfg.get("extra_variants") or {}).items())],
        "",
    ]
    if results.get("skipped_workloads"):
        lines += [f"Not run (time budget): {', '.join(results['skipped_workloads'])}", ""]
    for rec in results["workloads"]:
        kind = "training step" if rec["train"] else "inference"
        lines += [f"## {rec['workload']} ({kind}, batch {rec['batch']})", "",
                  f"A/A gap (`float32_again` vs `float32`): **{_fmt(100 * rec['aa_gap'] if rec['aa_gap'] is not None else None, '.1f')}%**; "
                  f"{rec['repeats']} repeats; {rec['seconds']:.0f} s for the workload.", ""]
        if rec.get("partial"):
            measured = "the first steps only" if rec["repeats"] == 0 else "the step times of those repeats"
            lines += [f"**Partial**: the run stopped during this workload, written after {rec['repeats']} "
                      f"of {cfg['repeats']} repeats ({measured}), without the cost model's predictions.", ""]
        lines.append("| variant | step ms | examples/s | vs f32 | first step s | peak MiB | rel err | "
                     "converted / total | casts | predicted | measured |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
        f32 = rec["variants"].get("float32", {}).get("step_ms")
        for name in (*VARIANTS, *sorted(cfg.get("extra_variants") or {})):
            v = rec["variants"].get(name)
            if v is None:
                if name in rec.get("failed", {}):
                    lines.append(f"| {name} | failed: {rec['failed'][name]} |" + " |" * 9)
                elif name in rec.get("not_applicable", {}):
                    lines.append(f"| {name} | {rec['not_applicable'][name]} |" + " |" * 9)
                continue
            rw = v.get("rewrite") or {}
            conv = f"{rw['converted_nodes']} / {rw['total_nodes']}" if rw else ""
            casts = f"{rw['casts_to_low']} + {rw['casts_to_high']}" if rw else ""
            peak = (f"{_fmt(v['peak_mem_mib'], '.0f')} / {_fmt(v['peak_mem_above_start_mib'], '.0f')}"
                    if v["peak_mem_mib"] is not None else "n/a")
            vs = v["step_ms"] / f32 if f32 else None
            first = _fmt(v['first_step_s'], '.1f') + (f" ({rw['rewrite_s']:.1f})" if rw.get("rewrite_s") else "")
            lines.append(
                f"| {name} | {_fmt(v['step_ms'])} | {_fmt(v['examples_per_s'], '.1f')} | {_fmt(vs, '.3f')} | "
                f"{first} | {peak} | {_fmt(v['rel_err_vs_float32_strict'], '.2e')} | "
                f"{conv} | {casts} | {_fmt(v.get('predicted_ratio'), '.3f') if 'predicted_ratio' in v else ''} | "
                f"{_fmt(v.get('measured_ratio'), '.3f') if 'measured_ratio' in v else ''} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def write_outputs(results: dict[str, Any], md_path: str, json_path: str) -> None:
    """Write the JSON and the markdown atomically (a stopped run keeps the last good files)."""
    for path, text in ((json_path, json.dumps(results, indent=1, default=str)),
                       (md_path, render_markdown(results))):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)


def merge(paths: list[str]) -> dict[str, Any]:
    """Several runs' JSON files as one (the device allows 10 minutes a call, so a full run is
    split over calls): the first file's machine and settings, every workload once (a later
    file's record of a workload wins, unless it is partial and the earlier one finished)."""
    merged: dict[str, Any] | None = None
    by_name: dict[str, Any] = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        if merged is None:
            merged = {k: v for k, v in data.items() if k != "workloads"}
            merged["merged_from"] = []
        merged["merged_from"].append({"file": path, "date": data["machine"].get("date"),
                                      "config": data["config"]})
        for rec in data["workloads"]:
            earlier = by_name.get(rec["workload"])
            if rec.get("partial") and earlier is not None and not earlier.get("partial"):
                continue  # a stopped run's partial record does not replace a finished one
            by_name[rec["workload"]] = rec
    if merged is None:
        raise SystemExit("--merge needs at least one JSON file")
    merged["workloads"] = list(by_name.values())
    # Every file's --extra-variant definitions (a later split of the run may add some).
    extras: dict[str, Any] = {}
    for entry in merged["merged_from"]:
        extras.update(entry["config"].get("extra_variants") or {})
    merged["config"] = {**merged["config"], "extra_variants": extras}
    done = set(by_name)
    merged["skipped_workloads"] = [n for n in merged.get("skipped_workloads", []) if n not in done]
    return merged


# --------------------------------------------------------------------------- main


def _select(names: str | None, table: tuple[Any, ...], what: str) -> list[Any]:
    if not names:
        return list(table)
    by = {getattr(t, "name", t): t for t in table}
    out = []
    for n in names.split(","):
        if n.strip() not in by:
            raise SystemExit(f"unknown {what} {n!r}; known: {', '.join(by)}")
        out.append(by[n.strip()])
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reduced", action="store_true",
                   help="CPU smoke run for CI: two tiny models, 2 repeats of 3 steps, bfloat16, target cpu")
    p.add_argument("--out", help="markdown file (default bench/GPU_RESULTS.md; a temp dir with --reduced)")
    p.add_argument("--json", help="JSON file (default: --out with .json)")
    p.add_argument("--workloads", help="comma-separated subset, in the order to run")
    p.add_argument("--variants", help="comma-separated subset of the variants (extra ones included)")
    p.add_argument("--extra-variant", action="append", default=[], metavar="NAME=BASE[:JSON]",
                   help="one of our variants with more rewrite options, e.g. "
                        "'ours_user_exp=ours_user:{\"remove\": {\"deny\": [\"Exp\"]}}' (repeatable)")
    p.add_argument("--repeats", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--warmup", type=int)
    p.add_argument("--precision", choices=("float16", "bfloat16"))
    p.add_argument("--target", help="our variants' target (default auto; cpu with --reduced)")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds: no workload starts when the last one's duration would overrun it, "
                        "and no repeat starts after it")
    p.add_argument("--no-predict", action="store_true",
                   help="skip the offline rewrites that give the greedy lists' predicted ratios")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="merge runs' JSON files into --out and exit")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.merge:
        md = args.out or os.path.join(HERE, "GPU_RESULTS.md")
        results = merge(args.merge)
        write_outputs(results, md, args.json or os.path.splitext(md)[0] + ".json")
        print(f"merged {len(args.merge)} file(s) into {md}")
        return 0
    if args.reduced:
        out = args.out or os.path.join(tempfile.mkdtemp(prefix="gpu_bench_"), "GPU_RESULTS.md")
    else:
        out = args.out or os.path.join(HERE, "GPU_RESULTS.md")
    json_path = args.json or os.path.splitext(out)[0] + ".json"

    started = time.monotonic()
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    gpu = gpu_available()
    if gpu:  # all variants' models live in one process: take memory as needed, not all at once
        for g in tf.config.list_physical_devices("GPU"):
            tf.config.experimental.set_memory_growth(g, True)
    precision = args.precision or ("bfloat16" if args.reduced or not gpu else "float16")
    target = args.target or ("cpu" if args.reduced else "auto")
    workloads = _select(args.workloads or (",".join(REDUCED_DEFAULT) if args.reduced else None),
                        REDUCED_WORKLOADS if args.reduced else FULL_WORKLOADS, "workload")
    extras = [define_extra_variant(text) for text in args.extra_variant]
    known = tuple(VariantSpec(n) for n in (*VARIANTS, *extras))
    variants = [v.name for v in _select(args.variants or ",".join((*VARIANTS, *extras)), known, "variant")]
    cfg = Config(
        precision=precision, target=target,
        repeats=args.repeats or (2 if args.reduced else 5),
        steps=args.steps or (3 if args.reduced else 20),
        warmup=args.warmup if args.warmup is not None else (1 if args.reduced else 3),
        predict=not args.no_predict,
        deadline=started + args.time_budget if args.time_budget else math.inf,
    )
    results: dict[str, Any] = {
        "machine": machine_info(),
        "config": {**{k: v for k, v in dataclasses.asdict(cfg).items() if k != "deadline"},
                   "reduced": args.reduced, "variants": variants,
                   "extra_variants": {n: {"base": b, "options": o} for n, (b, o) in EXTRA_VARIANTS.items()},
                   "workloads": [w.name for w in workloads], "time_budget_s": args.time_budget},
        "workloads": [],
        "skipped_workloads": [],
    }
    switches = Switches(precision)
    last = 0.0
    for w in workloads:
        if time.monotonic() + last > cfg.deadline:
            results["skipped_workloads"].append(w.name)
            print(f"[{w.name}] skipped: the time budget would be overrun", flush=True)
            continue
        print(f"[{w.name}] {len(variants)} variants ...", flush=True)

        def write_partial(partial_rec: dict[str, Any]) -> None:
            write_outputs({**results, "workloads": [*results["workloads"], partial_rec]}, out, json_path)

        rec = run_workload(w, variants, cfg, switches, progress=write_partial)
        last = rec["seconds"]
        results["workloads"].append(rec)
        write_outputs(results, out, json_path)
        print(f"[{w.name}] done in {last:.1f} s; A/A gap "
              f"{_fmt(100 * rec['aa_gap'] if rec['aa_gap'] is not None else None, '.1f')}%", flush=True)
    results["total_seconds"] = time.monotonic() - started
    write_outputs(results, out, json_path)
    print(render_markdown(results))
    print(f"wrote {out} and {json_path} in {results['total_seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
