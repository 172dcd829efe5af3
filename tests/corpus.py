"""In-process test corpus of real TensorFlow graphs for the AMP rewrite.

Everything is built locally from Keras / TensorFlow code (no downloads, ``weights=None``) and
is deterministic: every model is built after ``keras.backend.clear_session()`` and
``keras.utils.set_random_seed``, so node names and weights do not depend on which items were
built before in the same process.

Items (see :func:`corpus_names`):

* ``<model>/inference`` for ``model`` in ``resnet50, mobilenetv2, mlp, transformer, rnn``:
  a frozen inference graph (``tf.function(model)`` -> concrete function ->
  ``convert_variables_to_constants_v2``).  Input placeholder ``x`` (batch 2), fetches = the
  ``Identity`` output node(s).  Freezing lowers control flow by default, so ``rnn/inference``
  (Keras LSTM + GRU) holds v1 loops with TensorList ops and no function library.
* ``rnn/inference_v2``: the same frozen model with ``lower_control_flow=False``: functional
  ``While``/``StatelessWhile`` nodes whose cond/body live in the function library.
* ``<model>/training``: one training step (``GradientTape``, sparse categorical crossentropy,
  ``optimizer.apply_gradients``) traced with ``tf.function``; the GraphDef is
  ``concrete.graph.as_graph_def()``.  Inputs are placeholders ``x`` and ``y``; the model and
  optimizer variables stay *captured resource placeholders* (op ``Placeholder``,
  ``dtype: DT_RESOURCE``).  ``CorpusGraph.variables`` maps each of these placeholder node names
  to the variable's initial value; :func:`run` creates fresh variables from those values on
  every call, so every run starts from the same weights.  Fetches = the function's output
  nodes (the loss ``Identity``, which carries control dependencies on every update).
* ``while_v1``: a TF1 graph built with control flow v1 (``Enter/Merge/Switch/NextIteration/
  Exit/LoopCond``): ``tf.compat.v1.while_loop`` whose body does MatMul + Tanh + Relu on a
  float32 state; placeholders ``x`` and ``w``; fetch ``output``.

:func:`run` executes a graph (the original or a rewritten one with the same input / fetch node
names) in a ``tf.compat.v1.Session`` on a fresh ``tf.Graph`` (Grappler disabled, so the graph
runs exactly as given) and returns the fetched values as numpy arrays:
``[<fetch>:0 for each fetch]`` followed, for training items, by the values of the variables
named in ``CorpusGraph.watch`` after the step.  A fresh graph per call keeps function
libraries apart (a rewritten library may reuse the original function names).

Determinism: besides the seeds, :func:`_canonicalize` removes the process-history-dependent
parts of the GraphDefs (global uids in function names and ``_gradient_op_type``, set-order
artefacts of freezing with control flow); the GraphDefs, feeds, weights and run outputs are
byte-identical across processes and build orders.

Measured on 2 CPU cores (TF 2.21): building resnet50 ~14 s for both items (+ ~1 s/6 s to run
inference/training), mobilenetv2 ~6 s; every other item builds in about a second and runs in
well under one.  ``python -m tests.corpus [NAME...]`` prints the measured times.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Literal, Mapping, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.framework.graph_pb2 import GraphDef  # noqa: E402
from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2  # noqa: E402

__all__ = [
    "CorpusGraph",
    "BATCH",
    "MODELS",
    "corpus_names",
    "build",
    "run",
]

BATCH = 2
NUM_CLASSES = 10
SEED = 1234
#: Called with every Keras model right after it is built, before anything is traced (``None``:
#: the model keeps its initial weights).  The benchmark tools set it
#: (``bench/models.py:set_weights``); the tests leave it alone.
PREPARE_MODEL = None

Kind = Literal["inference", "training", "v1loop"]


@dataclass(frozen=True, eq=False)
class CorpusGraph:
    """One corpus graph.

    ``eq=False``: items hold dicts / arrays, so they compare and hash by identity.
    """

    name: str
    kind: Kind
    graph_def: GraphDef
    fetches: tuple[str, ...]
    feeds: Mapping[str, np.ndarray]
    # Training items only: resource placeholder node name -> initial variable value.
    variables: Mapping[str, np.ndarray] = field(default_factory=dict)
    # Training items only: resource placeholder node names whose post-step values `run`
    # returns after the fetched values.
    watch: tuple[str, ...] = ()
    # Seconds spent building this item (for reports).
    build_seconds: float = 0.0

    # Shapes of the values `run` returns (fetches, then watched variables).
    output_shapes: tuple[tuple[int, ...], ...] = ()


# ----------------------------------------------------------------------------------------
# Keras models


def _keras():
    import keras  # deferred: importing keras is slowish and not needed for while_v1

    return keras


def _resnet50():
    keras = _keras()
    model = keras.applications.ResNet50(
        weights=None, input_shape=(64, 64, 3), classes=NUM_CLASSES
    )
    return model, (64, 64, 3), False  # softmax output -> from_logits=False


def _mobilenetv2():
    keras = _keras()
    # 32x32 is the smallest accepted size; 64x64 keeps some spatial extent.  A non-default
    # size only triggers a "weights for 224" warning, which does not apply (weights=None).
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = keras.applications.MobileNetV2(
            weights=None, input_shape=(64, 64, 3), classes=NUM_CLASSES
        )
    return model, (64, 64, 3), False


def _mlp():
    keras = _keras()
    inp = keras.Input((32,), name="features")
    h = keras.layers.Dense(64, activation="relu")(inp)
    h = keras.layers.Dense(64, activation="tanh")(h)
    out = keras.layers.Dense(NUM_CLASSES)(h)
    return keras.Model(inp, out, name="mlp"), (32,), True


def _transformer():
    keras = _keras()
    seq, d = 8, 16
    inp = keras.Input((seq, d), name="tokens")
    att = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(inp, inp)
    h = keras.layers.LayerNormalization(epsilon=1e-6)(inp + att)
    ff = keras.layers.Dense(32, activation="gelu")(h)
    ff = keras.layers.Dense(d)(ff)
    h = keras.layers.LayerNormalization(epsilon=1e-6)(h + ff)
    h = keras.layers.GlobalAveragePooling1D()(h)
    out = keras.layers.Dense(NUM_CLASSES)(h)
    return keras.Model(inp, out, name="transformer"), (seq, d), True


def _rnn():
    keras = _keras()
    seq, feat = 5, 8
    inp = keras.Input((seq, feat), name="sequence")
    h = keras.layers.LSTM(16, return_sequences=True)(inp)
    h = keras.layers.GRU(16)(h)
    out = keras.layers.Dense(NUM_CLASSES)(h)
    return keras.Model(inp, out, name="rnn"), (seq, feat), True


# model name -> (factory, optimizer factory)
MODELS: dict[str, tuple[Callable, Callable]] = {
    "resnet50": (_resnet50, lambda k: k.optimizers.SGD(learning_rate=0.01, momentum=0.9)),
    "mobilenetv2": (_mobilenetv2, lambda k: k.optimizers.SGD(learning_rate=0.01)),
    "mlp": (_mlp, lambda k: k.optimizers.Adam(learning_rate=1e-3)),
    "transformer": (_transformer, lambda k: k.optimizers.Adam(learning_rate=1e-3)),
    "rnn": (_rnn, lambda k: k.optimizers.Adam(learning_rate=1e-3)),
}

V1_NAMES = ("while_v1",)


def corpus_names() -> list[str]:
    names = []
    for m in MODELS:
        names += [f"{m}/inference", f"{m}/training"]
        if m in UNLOWERED_INFERENCE:
            names.append(f"{m}/inference_v2")
    names += list(V1_NAMES)
    return names


def _inputs(name: str, shape: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    # Seed from the model name (stable across processes, unlike hash()).
    seed = SEED + sum(ord(c) for c in name)
    rng = np.random.RandomState(seed)
    x = rng.standard_normal((BATCH, *shape)).astype(np.float32)
    y = rng.randint(0, NUM_CLASSES, size=(BATCH,)).astype(np.int32)
    return x, y


def _var_handle(v):
    # Keras 3 variables wrap a tf.Variable in `.value`; plain tf.Variables are their own.
    inner = getattr(v, "value", v)
    if not hasattr(inner, "handle"):
        inner = v
    return inner.handle


# Models whose frozen graph is also built without lowering control flow ("<model>/inference_v2").
UNLOWERED_INFERENCE = ("rnn",)


@functools.lru_cache(maxsize=None)
def _build_model_items(model_name: str) -> dict[str, CorpusGraph]:
    """Builds ``<model>/inference``, ``<model>/training`` (and ``<model>/inference_v2``) from
    one model instance; returns ``{suffix: item}``."""
    from tensorflow.python.framework import convert_to_constants

    keras = _keras()
    factory, opt_factory = MODELS[model_name]
    items: dict[str, CorpusGraph] = {}
    t0 = time.perf_counter()
    keras.backend.clear_session()
    keras.utils.set_random_seed(SEED)
    model, in_shape, from_logits = factory()
    if PREPARE_MODEL is not None:
        PREPARE_MODEL(model)
    x, y = _inputs(model_name, in_shape)
    x_spec = tf.TensorSpec((BATCH, *in_shape), tf.float32, name="x")
    y_spec = tf.TensorSpec((BATCH,), tf.int32, name="y")
    t_model = time.perf_counter() - t0

    # ---- inference: frozen graph(s)
    variants = [("inference", True)]
    if model_name in UNLOWERED_INFERENCE:
        variants.append(("inference_v2", False))
    for suffix, lower in variants:
        t1 = time.perf_counter()
        infer_fn = tf.function(lambda x: model(x, training=False))
        concrete = infer_fn.get_concrete_function(x_spec)
        frozen = convert_to_constants.convert_variables_to_constants_v2(
            concrete, lower_control_flow=lower
        )
        assert [t.name for t in frozen.inputs] == ["x:0"], frozen.inputs
        items[suffix] = CorpusGraph(
            name=f"{model_name}/{suffix}",
            kind="inference",
            graph_def=_canonicalize(frozen.graph.as_graph_def(), frozen=True),
            fetches=tuple(t.op.name for t in frozen.outputs),
            feeds={"x:0": x},
            output_shapes=tuple(tuple(t.shape.as_list()) for t in frozen.outputs),
            build_seconds=time.perf_counter() - t1 + (t_model if suffix == "inference" else 0.0),
        )
        del infer_fn, concrete, frozen

    # ---- training: one optimizer step, variables as captured resource placeholders
    t1 = time.perf_counter()
    optimizer = opt_factory(keras)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits)

    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = loss_fn(y, logits)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    step_fn = tf.function(train_step)
    tconcrete = step_fn.get_concrete_function(x_spec, y_spec)
    train_gd = _canonicalize(tconcrete.graph.as_graph_def())
    train_fetches = tuple(t.op.name for t in tconcrete.outputs)
    train_shapes = [tuple(t.shape.as_list()) for t in tconcrete.outputs]

    handle_to_var = {}
    for v in list(model.variables) + list(optimizer.variables):
        handle_to_var[id(_var_handle(v))] = v
    variables: dict[str, np.ndarray] = {}
    captured_feeds: dict[str, np.ndarray] = {}
    for external, internal in tconcrete.graph.captures:
        if internal.dtype != tf.resource:
            # A captured eager constant (e.g. EfficientNet's input normalization): its
            # placeholder is fed its value, like x and y.
            captured_feeds[internal.name] = np.array(external.numpy(), copy=True)
            continue
        var = handle_to_var.get(id(external))
        if var is None:
            raise RuntimeError(f"{model_name}: no variable for capture {internal.name}")
        assert internal.name.endswith(":0")
        variables[internal.op.name] = np.array(var.numpy(), copy=True)
    trainable_ids = {id(_var_handle(v)) for v in model.trainable_variables}
    trainable_phs = [
        internal.op.name
        for external, internal in tconcrete.graph.captures
        if id(external) in trainable_ids
    ]
    watch = (trainable_phs[0], trainable_phs[-1]) if len(trainable_phs) > 1 else tuple(trainable_phs)
    del step_fn, tconcrete, handle_to_var, optimizer, model, loss_fn
    keras.backend.clear_session()
    import gc

    gc.collect()
    items["training"] = CorpusGraph(
        name=f"{model_name}/training",
        kind="training",
        graph_def=train_gd,
        fetches=train_fetches,
        feeds={"x:0": x, "y:0": y, **captured_feeds},
        variables=variables,
        watch=watch,
        output_shapes=tuple(train_shapes) + tuple(variables[w].shape for w in watch),
        build_seconds=time.perf_counter() - t1,
    )
    return items


# ----------------------------------------------------------------------------------------
# Canonicalization (determinism across processes and build orders)
#
# * Function names carry global uids (``..._while_body_1360``) that depend on everything traced
#   before in the process: every >=3-digit number found in a function's name or argument names
#   is replaced, in all identifier strings, by its rank among those numbers, zero-padded (``_001``, ``_002``...;
#   TF never generates zero-padded counters, so nothing can collide).
# * ``convert_variables_to_constants_v2`` with lowered control flow (rnn/inference) iterates
#   Python sets: the node order, the number of dead ``unused_control_flow_input*`` placeholders
#   and where the Python-only marker attr ``_has_manual_control_dependencies`` lands vary with
#   PYTHONHASHSEED (unlowered While graphs too: node order).  The marker is dropped everywhere;
#   in frozen graphs with control flow dead placeholders are removed and the nodes re-ordered
#   by a deterministic topological sort (ties by name, NextIteration back edges ignored).

_MARKER_ATTR = "_has_manual_control_dependencies"


def _is_repeated(fd) -> bool:
    rep = getattr(fd, "is_repeated", None)  # protobuf >= 5.x / upb
    if rep is not None:
        return bool(rep)
    return fd.label == fd.LABEL_REPEATED


def _walk_strings(msg, fn) -> None:
    """Applies ``fn`` to every ``string`` (not ``bytes``) field of ``msg``, recursively,
    including string map keys."""
    from google.protobuf.descriptor import FieldDescriptor as FD

    for fd, value in list(msg.ListFields()):
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            key_fd = fd.message_type.fields_by_name["key"]
            val_fd = fd.message_type.fields_by_name["value"]
            items = list(value.items())
            if key_fd.type != FD.TYPE_STRING and val_fd.message_type is None:
                continue
            new_items = []
            for k, v in items:
                nk = fn(k) if key_fd.type == FD.TYPE_STRING else k
                if val_fd.message_type is not None:
                    _walk_strings(v, fn)
                    new_items.append((nk, v))
                else:
                    new_items.append((nk, fn(v) if val_fd.type == FD.TYPE_STRING else v))
            if val_fd.message_type is not None:
                copies = [(k, type(v)()) for k, v in new_items]
                for (k, c), (_, v) in zip(copies, new_items):
                    c.CopyFrom(v)
                value.clear()
                for k, c in copies:
                    value[k].CopyFrom(c)
            else:
                value.clear()
                for k, v in new_items:
                    value[k] = v
        elif fd.type == FD.TYPE_MESSAGE:
            if _is_repeated(fd):
                for v in value:
                    _walk_strings(v, fn)
            else:
                _walk_strings(value, fn)
        elif fd.type == FD.TYPE_STRING:
            if _is_repeated(fd):
                value[:] = [fn(v) for v in value]
            else:
                setattr(msg, fd.name, fn(value))


def _strip_marker(nodes) -> None:
    for n in nodes:
        if _MARKER_ATTR in n.attr:
            del n.attr[_MARKER_ATTR]


def _topo_sorted(nodes) -> list:
    import heapq

    by_name = {n.name: n for n in nodes}
    deps: dict[str, set[str]] = {}
    for n in nodes:
        d = set()
        for inp in n.input:
            src = inp.lstrip("^").split(":")[0]
            if src in by_name and by_name[src].op not in ("NextIteration", "RefNextIteration"):
                d.add(src)
        deps[n.name] = d
    users: dict[str, list[str]] = {name: [] for name in by_name}
    for name, d in deps.items():
        for src in d:
            users[src].append(name)
    indeg = {name: len(d) for name, d in deps.items()}
    heap = [name for name, k in indeg.items() if k == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        name = heapq.heappop(heap)
        order.append(by_name[name])
        for u in users[name]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(heap, u)
    if len(order) != len(nodes):  # a cycle not through NextIteration: keep the input order
        return list(nodes)
    return order


_CONTROL_FLOW_OPS = frozenset(
    {"While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase", "Enter"}
)


def _canonicalize(graph_def: GraphDef, *, frozen: bool = False) -> GraphDef:
    import re

    gd = GraphDef()
    gd.CopyFrom(graph_def)
    _strip_marker(gd.node)
    for f in gd.library.function:
        _strip_marker(f.node_def)

    # Dead placeholders left behind by control-flow lowering; node order of frozen graphs with
    # control flow.
    if frozen and any(n.op in _CONTROL_FLOW_OPS for n in gd.node):
        used = {i.lstrip("^").split(":")[0] for n in gd.node for i in n.input}
        keep = [
            n for n in gd.node
            if not (n.op == "Placeholder" and n.name.startswith("unused_control_flow_input")
                    and n.name not in used)
        ]
        ordered = _topo_sorted(keep)
        copies = [type(n)() for n in ordered]
        for c, n in zip(copies, ordered):
            c.CopyFrom(n)
        del gd.node[:]
        gd.node.extend(copies)

    sig_names = [
        name
        for f in gd.library.function
        for name in [f.signature.name]
        + [a.name for a in f.signature.input_arg]
        + [a.name for a in f.signature.output_arg]
    ]
    uids = sorted(
        {int(m) for name in sig_names for m in re.findall(r"(?<=_)\d{3,}(?![0-9])", name)}
    )
    if uids:
        table = {str(u): f"{rank:03d}" for rank, u in enumerate(uids, start=1)}
        pattern = re.compile(r"(?<=_)(\d{3,})(?![0-9])")

        def rename(s: str) -> str:
            return pattern.sub(lambda m: table.get(m.group(1), m.group(1)), s)

        for n in gd.node:
            _walk_strings(n, rename)
        _walk_strings(gd.library, rename)
    # `_gradient_op_type` ("CustomGradient-<uid>", a bytes attr) carries a global uid too.
    all_nodes = list(gd.node) + [n for f in gd.library.function for n in f.node_def]
    grad_types = sorted(
        {n.attr["_gradient_op_type"].s for n in all_nodes if "_gradient_op_type" in n.attr},
        key=lambda b: (len(b), b),
    )
    grad_table = {b: f"CustomGradient-{i:03d}".encode() for i, b in enumerate(grad_types, 1)}
    for n in all_nodes:
        if "_gradient_op_type" in n.attr:
            n.attr["_gradient_op_type"].s = grad_table[n.attr["_gradient_op_type"].s]
    # Library order is not meaningful; make it stable.
    funcs = sorted(gd.library.function, key=lambda f: f.signature.name)
    copies = [type(f)() for f in funcs]
    for c, f in zip(copies, funcs):
        c.CopyFrom(f)
    del gd.library.function[:]
    gd.library.function.extend(copies)
    return gd


# ----------------------------------------------------------------------------------------
# TF1 control-flow-v1 loop


def _build_while_v1() -> CorpusGraph:
    t0 = time.perf_counter()
    from tensorflow.python.ops import control_flow_util

    was_v2 = control_flow_util.ENABLE_CONTROL_FLOW_V2
    tf.compat.v1.disable_control_flow_v2()
    try:
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, (BATCH, 8), name="x")
            w = tf.compat.v1.placeholder(tf.float32, (8, 8), name="w")
            i0 = tf.constant(0, name="i0")

            def cond(i, s):
                return tf.less(i, 3)

            def body(i, s):
                h = tf.tanh(tf.matmul(s, w))
                s2 = tf.nn.relu(h) + 0.5 * s
                return i + 1, s2

            _, s = tf.compat.v1.while_loop(cond, body, [i0, x], name="loop")
            out = tf.matmul(s, w, name="head")
            tf.identity(tf.nn.softmax(out), name="output")
        gd = g.as_graph_def()
    finally:
        if was_v2:
            tf.compat.v1.enable_control_flow_v2()
    ops = {n.op for n in gd.node}
    missing = {"Enter", "Merge", "Switch", "NextIteration", "Exit", "LoopCond"} - ops
    assert not missing, missing
    rng = np.random.RandomState(SEED)
    feeds = {
        "x:0": rng.standard_normal((BATCH, 8)).astype(np.float32),
        "w:0": (0.3 * rng.standard_normal((8, 8))).astype(np.float32),
    }
    return CorpusGraph(
        name="while_v1",
        kind="v1loop",
        graph_def=gd,
        fetches=("output",),
        feeds=feeds,
        output_shapes=((BATCH, 8),),
        build_seconds=time.perf_counter() - t0,
    )


@functools.lru_cache(maxsize=None)
def build(name: str) -> CorpusGraph:
    """Builds (once per process) the corpus item ``name``; treat the result as read-only."""
    if name == "while_v1":
        return _build_while_v1()
    if name not in corpus_names():
        raise KeyError(f"unknown corpus item {name!r}; known: {corpus_names()}")
    model, _, suffix = name.partition("/")
    return _build_model_items(model)[suffix]


# ----------------------------------------------------------------------------------------
# Execution


def _session_config() -> config_pb2.ConfigProto:
    cfg = config_pb2.ConfigProto(
        intra_op_parallelism_threads=2,
        inter_op_parallelism_threads=1,
        device_count={"GPU": 0},
    )
    # Run the graph exactly as given (no Grappler rewrites at session creation).
    cfg.graph_options.rewrite_options.disable_meta_optimizer = True
    cfg.graph_options.rewrite_options.meta_optimizer_iterations = (
        rewriter_config_pb2.RewriterConfig.ONE
    )
    return cfg


def run(graph_def: GraphDef, item: CorpusGraph) -> list[np.ndarray]:
    """Imports ``graph_def`` into a fresh graph, feeds ``item.feeds`` and returns the values of
    ``<fetch>:0`` for every fetch (then, for training items, the watched variables after the
    step).  ``graph_def`` must keep the input/fetch node names of ``item.graph_def``.
    """
    g = tf.Graph()
    with g.as_default():
        variables = {}
        input_map = {}
        for ph_name, value in item.variables.items():
            # Resource variables created in graph mode; fresh from the stored values each call.
            var = tf.Variable(value, name=f"corpus_var/{ph_name}".replace(":", "_"))
            variables[ph_name] = var
            input_map[f"{ph_name}:0"] = var.handle
        fetch_names = [f"{f}:0" for f in item.fetches]
        fetched = tf.graph_util.import_graph_def(
            graph_def,
            input_map=input_map or None,
            return_elements=fetch_names,
            name="",
        )
        init = tf.compat.v1.variables_initializer(list(variables.values()))
        reads = [variables[w].read_value() for w in item.watch]
        feed_dict = {g.get_tensor_by_name(k): v for k, v in item.feeds.items()}
    with tf.compat.v1.Session(graph=g, config=_session_config()) as sess:
        if variables:
            sess.run(init)
        values = sess.run(fetched, feed_dict=feed_dict)
        if reads:
            values = list(values) + list(sess.run(reads))
    return [np.asarray(v) for v in values]


def _main() -> None:  # pragma: no cover - manual timing report
    import sys

    names = sys.argv[1:] or corpus_names()
    for name in names:
        t0 = time.perf_counter()
        item = build(name)
        t1 = time.perf_counter()
        out = run(item.graph_def, item)
        t2 = time.perf_counter()
        nfun = sum(len(f.node_def) for f in item.graph_def.library.function)
        print(
            f"{name:24s} build {item.build_seconds:6.2f}s (call {t1 - t0:6.2f}s)  run {t2 - t1:6.2f}s  "
            f"nodes {len(item.graph_def.node):5d}  functions {len(item.graph_def.library.function):3d} "
            f"({nfun} nodes)  outputs {[tuple(o.shape) for o in out]} expected {list(item.output_shapes)}"
        )


if __name__ == "__main__":  # pragma: no cover
    _main()
