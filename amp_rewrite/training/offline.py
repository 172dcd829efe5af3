"""Offline: rewrite an exported TF1 *training* MetaGraphDef, its optimizer included.

``rewrite_training_meta_graph(meta_graph_def, loss_scale="dynamic", **rewrite_options)`` does
what :func:`amp_rewrite.enable_mixed_precision_graph_rewrite` does at graph-construction time,
but on a graph that was already built and exported (``tf.compat.v1.train.export_meta_graph``
after ``train_op = opt.minimize(loss)``, with ``train_op`` in the ``train_op`` collection):

1. The GraphDef is rewritten to mixed precision (:func:`amp_rewrite.rewrite_graph_def`).
2. Loss scaling is written into the graph, under the name scope ``amp_loss_scale/``:

   * three variables: ``current_loss_scale`` (float32), ``good_steps`` and ``skipped_steps``
     (int64), in ``GLOBAL_VARIABLES`` so ``global_variables_initializer()`` covers them;
   * the gradient seed of ``tf.gradients`` (the ``.../grad_ys_N`` node) is multiplied by the
     scale, so every gradient is computed scaled;
   * every ``Apply*``/``ResourceApply*``/``(Resource)SparseApply*`` update op that the train op
     depends on gets its ``grad`` input divided by the scale, and passed through a ``Switch`` on
     "all unscaled gradients are finite": when a gradient is Inf/NaN, the update ops receive a
     dead tensor and do not run (nor does anything that depends on them, such as the
     ``global_step`` increment), which is TensorFlow's skip;
   * the scale update (TensorFlow's dynamic rule, :func:`.loss_scale.next_state`) becomes a
     control input of the train op, so it runs on every step.

The graph is edited with TensorFlow's graph API (``Operation._update_input`` and
``_add_control_input``) on a ``tf.Graph`` imported from the rewritten MetaGraphDef, then
exported again; node names are kept, so fetching ``train_op``/``loss`` by name works.

Assumptions (each violation is an :class:`~amp_rewrite.AmpRewriteError` naming it): exactly
one train op (or ``train_op=`` names it); gradients come from ``tf.gradients`` with its default
seed; variables are updated only by ``Apply*`` ops (a sparse ``GradientDescent`` update, which
uses ``ScatterAdd``, is rejected rather than trained with scaled gradients); the graph is not
already loss-scaled.

Checkpoints: when the MetaGraphDef has a ``saver_def``, a new ``Saver`` is built in the graph
(``save_1/`` or the next free scope; the old saver's ops stay, unused) that saves everything the
old one saved, under the same checkpoint keys, plus the three loss-scale variables, and the
``saver_def`` is replaced by the new saver's: ``import_meta_graph`` then returns a saver whose
checkpoints carry the scale and counters, so a restored job resumes with its loss scale.
A checkpoint written by the *original* graph's saver lacks those three keys; restore it with a
``Saver`` over the model's own variables and initialize the loss-scale variables.  A graph whose
saver cannot be rebuilt (a saved tensor that is not a whole variable, such as a partitioned
variable's slice) keeps its ``saver_def``, and a WARNING says that the loss-scale variables are
not checkpointed.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..api import RewriteResult, rewrite_graph_def
from ..errors import AmpRewriteError
from . import loss_scale as loss_scale_module
from ._common import check_rewrite_options, without_training_options

__all__ = ["TrainingRewriteResult", "rewrite_training_meta_graph"]

log = logging.getLogger(__name__)

_APPLY_OP = re.compile(r"^(Resource)?(Sparse)?Apply[A-Z][A-Za-z]*$")
_SEED = re.compile(r"(^|/)grad_ys_\d+$")
# Ops that write a variable; one of these fed by the scaled gradients (other than the Apply ops
# we unscale) would train with gradients too large by the loss scale.
_WRITERS = re.compile(
    r"^(Assign|AssignAdd|AssignSub|AssignVariableOp|AssignAddVariableOp|AssignSubVariableOp|"
    r"(Resource)?Scatter[A-Za-z]*|(Resource)?StridedSliceAssign)$"
)
_SCOPE = "amp_loss_scale"


@dataclass(frozen=True)
class TrainingRewriteResult:
    """The rewritten MetaGraphDef and what was done to it.

    ``report`` is the rewrite's JSON-ready report with a ``"training"`` section added:
    the train op, the update ops that were unscaled and gated, the gradient seeds, and the
    loss-scale configuration.
    """

    meta_graph_def: Any
    report: dict[str, Any]
    rewrite_result: RewriteResult
    apply_ops: tuple[str, ...] = field(default_factory=tuple)


def _parse(meta_graph_def: Any) -> Any:
    from tensorflow.core.protobuf import meta_graph_pb2

    if isinstance(meta_graph_def, (bytes, bytearray)):
        out = meta_graph_pb2.MetaGraphDef()
        try:
            out.ParseFromString(bytes(meta_graph_def))
        except Exception as exc:  # protobuf's DecodeError has no stable import path
            raise AmpRewriteError(f"not a serialized MetaGraphDef: {exc}") from None
        return out
    if not hasattr(meta_graph_def, "graph_def") or not hasattr(meta_graph_def, "collection_def"):
        raise AmpRewriteError(
            f"expected a MetaGraphDef or its bytes, got {type(meta_graph_def).__name__}"
        )
    out = meta_graph_pb2.MetaGraphDef()
    out.CopyFrom(meta_graph_def)
    return out


def _train_op_name(meta: Any, train_op: str | None) -> str:
    names = {node.name for node in meta.graph_def.node}
    if train_op is not None:
        name = train_op.split(":")[0].lstrip("^")
        if name not in names:
            raise AmpRewriteError(f"train_op {train_op!r} names no node of the graph", node=name)
        return name
    collection = meta.collection_def.get("train_op")
    entries = list(collection.node_list.value) if collection is not None else []
    # dict.fromkeys: an op listed twice (minimize() adds it and so may the user) is one op.
    entries = list(dict.fromkeys(e.split(":")[0] for e in entries if e.split(":")[0] in names))
    if len(entries) != 1:
        found = ", ".join(entries) if entries else "none"
        raise AmpRewriteError(
            "a training MetaGraphDef needs exactly one op in its 'train_op' collection "
            f"(found: {found}); pass train_op= to name it"
        )
    return entries[0]


def _ancestors(op: Any) -> list[Any]:
    """Ops ``op`` depends on (data and control inputs), in the main graph, ``op`` first."""
    seen = {op.name: op}
    order = [op]
    stack = [op]
    while stack:
        cur = stack.pop()
        for parent in [t.op for t in cur.inputs] + list(cur.control_inputs):
            if parent.name not in seen:
                seen[parent.name] = parent
                order.append(parent)
                stack.append(parent)
    return order


def _data_descendants(ops: Sequence[Any]) -> list[Any]:
    """Ops reachable from ``ops`` through data edges (not ``ops`` themselves)."""
    seen = {op.name for op in ops}
    out = []
    stack = list(ops)
    while stack:
        cur = stack.pop()
        for tensor in cur.outputs:
            for consumer in tensor.consumers():
                if consumer.name not in seen:
                    seen.add(consumer.name)
                    out.append(consumer)
                    stack.append(consumer)
    return out


def _grad_index(op: Any) -> int:
    names = [arg.name for arg in op.op_def.input_arg]
    # Every Apply*/ResourceApply* op names its gradient input "grad", except the plain
    # gradient-descent updates, which call it "delta".
    key = "grad" if "grad" in names else "delta"
    if key not in names or len(names) != len(op.inputs):
        raise AmpRewriteError(f"update op {op.name} ({op.type}) has no single 'grad' input",
                              node=op.name, op=op.type)
    return names.index(key)


def _saved_variables(graph: Any, saver_def: Any) -> dict[str, Any] | None:
    """Checkpoint key -> variable, for every tensor the saver of ``saver_def`` saves.

    Pure (reads ``graph``).  The keys and tensors are read from the saver's ``SaveV2`` ops
    (one per shard): their ``tensor_names`` constant pairs with their ``tensors`` inputs.  A
    saved tensor is traced back through ``Identity``/``ReadVariableOp`` to the variable it reads.
    Returns ``None`` when some saved tensor is not a whole variable of ``GLOBAL_VARIABLES`` (a
    slice of a partitioned variable, a tensor computed from one) or the saver writes the V1
    format: such a saver cannot be rebuilt from a list of variables.
    """
    import tensorflow as tf
    from tensorflow.python.framework import tensor_util

    scope = saver_def.save_tensor_name.rsplit("/", 1)[0] + "/"
    variables = {v.op.name: v for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}
    saves = [op for op in graph.get_operations()
             if op.type in ("SaveV2", "Save", "SaveSlices") and op.name.startswith(scope)]
    if not saves:
        return None
    out: dict[str, Any] = {}
    for save in saves:
        if save.type != "SaveV2":
            return None  # the V1 checkpoint format: not rebuilt
        names = tensor_util.constant_value(save.inputs[1])
        slices = tensor_util.constant_value(save.inputs[2])
        if names is None or slices is None or any(slices):
            return None
        for name, tensor in zip(names, save.inputs[3:]):
            op = tensor.op
            while op.name not in variables and op.type in ("Identity", "ReadVariableOp") and op.inputs:
                op = op.inputs[0].op
            if op.name not in variables:
                return None
            out[name.decode()] = variables[op.name]
    return out


def _saver_with_loss_scale(graph: Any, saver_def: Any, loss_scale_variables: Sequence[Any]) -> Any:
    """A ``SaverDef`` that saves what ``saver_def`` saves plus ``loss_scale_variables``.

    Mutates ``graph`` (the caller's working copy): adds the new saver's ops.  Returns ``None``
    (and logs a WARNING) when the old saver cannot be rebuilt; see :func:`_saved_variables`.
    """
    import tensorflow as tf

    var_list = _saved_variables(graph, saver_def)
    if var_list is None:
        log.warning(
            "amp_rewrite: the training graph's Saver (%s) saves something other than whole "
            "variables, so it is kept as it was and does not checkpoint the loss-scale "
            "variables (%s/*): a restored job restarts from the initial loss scale",
            saver_def.save_tensor_name, _SCOPE,
        )
        return None
    for variable in loss_scale_variables:
        var_list[variable.op.name] = variable
    keep_hours = saver_def.keep_checkpoint_every_n_hours
    # A scope of its own: after an import, TensorFlow's name scopes do not know "save" is
    # taken and would mix the new saver's ops into the old saver's scope.
    prefixes = {op.name.split("/", 1)[0] for op in graph.get_operations()}
    name = next(f"save_{i}" for i in range(1, len(prefixes) + 2) if f"save_{i}" not in prefixes)
    saver = tf.compat.v1.train.Saver(
        var_list=var_list, sharded=saver_def.sharded,
        max_to_keep=saver_def.max_to_keep,
        # 0 in a SaverDef means "not set"; the Saver's own default is 10000 hours.
        keep_checkpoint_every_n_hours=keep_hours if keep_hours > 0 else 10000.0,
        write_version=saver_def.version or tf.compat.v1.train.SaverDef.V2,
        name=name,
    )
    return saver.as_saver_def()


def _loss_scale_config(loss_scale: Any) -> Any:
    """The loss-scale configuration ``loss_scale`` names; :class:`AmpRewriteError` for one
    that is not a loss scale (one error type for the CLI to report), and for ``"auto"``: asking
    for loss scaling offline is explicit, and an update that may or may not be scaled depending
    on the precision chosen would leave the user guessing which.  Pure."""
    try:
        config = loss_scale_module.get(loss_scale)
    except (TypeError, ValueError) as exc:  # one error type for the CLI to report
        raise AmpRewriteError(str(exc)) from None
    if isinstance(config, loss_scale_module.AutoLossScale):
        raise AmpRewriteError("an offline training rewrite takes loss scaling 'dynamic' or a number >= 1, not "
                              "'auto' (which scales float16 only): leave it out where no loss scaling is wanted")
    return config


def _update_ops(train: Any, train_name: str) -> list[tuple[Any, int]]:
    """``(update op, index of its grad input)`` for every ``Apply*`` op the train op depends
    on, in :func:`_ancestors` order.  Raises :class:`AmpRewriteError` when there is none.
    Reads the graph."""
    applies = [op for op in _ancestors(train) if _APPLY_OP.match(op.type)]
    if not applies:
        raise AmpRewriteError(
            f"train op {train_name} depends on no Apply*/ResourceApply* update op; "
            "nothing to loss-scale", node=train_name,
        )
    return [(op, _grad_index(op)) for op in applies]


def _gradient_seeds(grad_inputs: Sequence[tuple[Any, int]]) -> list[Any]:
    """The ``tf.gradients`` seeds (``.../grad_ys_N``) of the gradients that reach the update
    ops.  Raises :class:`AmpRewriteError` when some update applies a value no seed leads to
    (next to ones a seed does) or when there is no seed.  Reads the graph."""
    grad_ancestors: dict[str, Any] = {}
    unseeded = []
    for op, index in grad_inputs:
        parents = _ancestors(op.inputs[index].op)
        for parent in parents:
            grad_ancestors[parent.name] = parent
        if not any(_SEED.search(parent.name) for parent in parents):
            unseeded.append(op.name)
    if unseeded and len(unseeded) < len(grad_inputs):
        # Dividing such an update by the scale would shrink it silently.
        raise AmpRewriteError(
            f"update op(s) {', '.join(sorted(unseeded)[:5])} apply a value that no "
            "tf.gradients seed ('.../grad_ys_N') leads to, next to updates that do; only "
            "gradients of the loss can be loss-scaled", node=sorted(unseeded)[0],
        )
    seeds = [op for op in grad_ancestors.values() if _SEED.search(op.name)]
    if not seeds:
        raise AmpRewriteError(
            "could not find the gradient seed (a node named '.../grad_ys_N', as "
            "tf.gradients creates) behind the update ops' gradients"
        )
    return seeds


def _check_only_updates_write(seeds: Sequence[Any], apply_names: set[str]) -> None:
    """Raise :class:`AmpRewriteError` when an op other than the update ops writes a variable
    from the (scaled) gradients: it could be neither unscaled nor gated.  Reads the graph."""
    writers = sorted(
        op.name for op in _data_descendants(seeds)
        if _WRITERS.match(op.type) and op.name not in apply_names
    )
    if writers:
        raise AmpRewriteError(
            "variables updated from the gradients by ops other than Apply*: "
            f"{', '.join(writers[:5])}; their gradients cannot be unscaled and gated here",
            node=writers[0],
        )


def _scale_seeds(seeds: Sequence[Any], scale: Any) -> None:
    """Multiply every output of each gradient seed by ``scale`` for all its consumers.
    Mutates the default graph (adds ops, rewires the consumers)."""
    import tensorflow as tf

    for seed in seeds:
        for out in seed.outputs:
            consumers = [(c, i) for c in out.consumers()
                         for i, t in enumerate(c.inputs) if t is out]
            scaled = tf.multiply(out, tf.cast(scale, out.dtype), name="scaled_seed")
            for consumer, i in consumers:
                consumer._update_input(i, scaled)  # noqa: SLF001 - graph editing


def _unscale_and_gate(grad_inputs: Sequence[tuple[Any, int]], scale: Any, scale_config: Any) -> Any:
    """Divide each update op's gradient by ``scale`` and, for a dynamic scale, gate it on
    all of them being finite; returns the ``all_finite`` tensor.  Mutates the default graph
    (adds ops, rewires the update ops' grad inputs)."""
    import tensorflow as tf

    unscaled = []
    for op, index in grad_inputs:
        grad = op.inputs[index]
        with tf.name_scope("unscale"):
            unscaled.append(loss_scale_module.unscale(grad, scale))
    finite = tf.identity(loss_scale_module.all_finite(unscaled), name="all_finite")
    for (op, index), value in zip(grad_inputs, unscaled):
        if scale_config.dynamic:
            # Switch's true output is dead when `finite` is false, and an op with a
            # dead input does not run: the update is skipped.
            value = tf.raw_ops.Switch(data=value, pred=finite, name="gate")[1]
        op._update_input(index, value)  # noqa: SLF001
    return finite


def _write_loss_scaling(scale_config: Any, seeds: Sequence[Any],
                        grad_inputs: Sequence[tuple[Any, int]]) -> tuple[tuple[Any, Any, Any], Any]:
    """Write loss scaling into the default graph under ``amp_loss_scale/``: the three
    variables, the scaled seeds, the unscaled and gated gradients and the scale update.
    Returns ``((current_loss_scale, good_steps, skipped_steps), update op)``.  Mutates the
    default graph."""
    import tensorflow as tf

    with tf.name_scope(f"{_SCOPE}/"):
        def variable(value: Any, dtype: Any, name: str) -> Any:
            return tf.Variable(value, dtype=dtype, trainable=False, name=name)

        scale_var = variable(scale_config.initial_scale, tf.float32, "current_loss_scale")
        good_var = variable(0, tf.int64, "good_steps")
        skipped_var = variable(0, tf.int64, "skipped_steps")
        # One read per step: the seed, the unscaling and the update all use it, so the
        # update (which depends on it) cannot run before the reads.
        scale = tf.identity(scale_var.read_value(), name="scale")
        _scale_seeds(seeds, scale)
        finite = _unscale_and_gate(grad_inputs, scale, scale_config)
        new_scale, new_good, new_skipped = loss_scale_module.next_state(
            scale_config, scale, good_var.read_value(), skipped_var.read_value(), finite
        )
        update = tf.group(
            scale_var.assign(new_scale), good_var.assign(new_good),
            skipped_var.assign(new_skipped), name="update",
        )
    return (scale_var, good_var, skipped_var), update


def _keep_meta_fields(out: Any, meta: Any, saver_def: Any) -> None:
    """Copy into the exported ``out`` what the export does not know about: signatures, saver
    (``saver_def`` when rebuilt, else the original's), assets, meta info.  Mutates ``out``."""
    # The export's meta_info_def has the right stripped_op_list (it now needs Switch,
    # IsFinite...); keep the original's tags and version strings.
    out.meta_info_def.tags[:] = list(meta.meta_info_def.tags)
    for name in ("meta_graph_version", "tensorflow_version", "tensorflow_git_version"):
        if getattr(meta.meta_info_def, name):
            setattr(out.meta_info_def, name, getattr(meta.meta_info_def, name))
    for key, sig in meta.signature_def.items():
        out.signature_def[key].CopyFrom(sig)
    if meta.HasField("saver_def"):
        out.saver_def.CopyFrom(saver_def if saver_def is not None else meta.saver_def)
    out.asset_file_def.extend(meta.asset_file_def)


def _training_section(train_name: str, apply_names: set[str], seeds: Sequence[str], scale_config: Any,
                      checkpointed: bool) -> dict[str, Any]:
    """The report's ``"training"`` section.  Pure.

    ``checkpointed``: whether the Saver that ``import_meta_graph`` builds checkpoints the
    loss-scale variables: the rebuilt saver_def's does; without a saver_def it builds one over
    all global variables, theirs included; a kept saver_def's does not (see the module
    docstring)."""
    return {
        "train_op": train_name,
        "apply_ops": sorted(apply_names),
        "gradient_seeds": sorted(seeds),
        "loss_scale": repr(scale_config),
        "loss_scale_variables": [f"{_SCOPE}/current_loss_scale", f"{_SCOPE}/good_steps",
                                 f"{_SCOPE}/skipped_steps"],
        "loss_scale_checkpointed": checkpointed,
    }



def _scale_in_tensorflow(meta: Any, train_name: str, loss_scale: Any) -> tuple[Any, set[str], list[str], bool]:
    """Write loss scaling into the rewritten MetaGraphDef ``meta`` with TensorFlow's graph API
    (module docstring): the exported MetaGraphDef, the update ops' names, the gradient seeds'
    names, and whether the loss-scale variables are checkpointed.  Imports ``meta`` into a
    ``tf.Graph`` of its own, which runs TensorFlow's shape functions on it: see
    :func:`_scaled_where_safe`.  Raises :class:`AmpRewriteError` where the graph breaks an
    assumption; reads ``meta``."""
    import tensorflow as tf
    from tensorflow.python.framework import meta_graph

    scale_config = _loss_scale_config(loss_scale)
    graph = tf.Graph()
    with graph.as_default():
        meta_graph.import_scoped_meta_graph(meta, clear_devices=False, graph=graph)
        train = graph.get_operation_by_name(train_name)
        grad_inputs = _update_ops(train, train_name)
        apply_names = {op.name for op, _ in grad_inputs}
        seeds = _gradient_seeds(grad_inputs)
        _check_only_updates_write(seeds, apply_names)
        variables, update = _write_loss_scaling(scale_config, seeds, grad_inputs)
        train._add_control_input(update)  # noqa: SLF001

        saver_def = None
        if meta.HasField("saver_def"):
            saver_def = _saver_with_loss_scale(graph, meta.saver_def, list(variables))
        out = tf.compat.v1.train.export_meta_graph(graph=graph, clear_devices=False)
    _keep_meta_fields(out, meta, saver_def)
    checkpointed = saver_def is not None or not meta.HasField("saver_def")
    return out, apply_names, [op.name for op in seeds], checkpointed


def scale_in_tensorflow_request(payload: tuple[bytes, str, Any]) -> tuple[bytes, list[str], list[str], bool]:
    """:func:`_scale_in_tensorflow` in the helper process (:func:`_scaled_where_safe`): the
    MetaGraphDef as bytes in and out.  Runs in the helper."""
    from tensorflow.core.protobuf import meta_graph_pb2

    meta_bytes, train_name, loss_scale = payload
    out, apply_names, seeds, checkpointed = _scale_in_tensorflow(
        meta_graph_pb2.MetaGraphDef.FromString(meta_bytes), train_name, loss_scale)
    return out.SerializeToString(deterministic=True), sorted(apply_names), seeds, checkpointed


def _scaled_where_safe(meta: Any, train_name: str, loss_scale: Any) -> tuple[Any, set[str], list[str], bool]:
    """:func:`_scale_in_tensorflow`, in the helper process that infers shapes where they are
    inferred there (:func:`amp_rewrite.isolated_shape_inference`, every CLI command that reads
    a file): importing a graph from anyone runs TensorFlow's shape functions, and one that
    aborts would end this process.  There an abort is an :class:`AmpRewriteError` (nothing
    is written), and the worker's own errors keep their message."""
    from tensorflow.core.protobuf import meta_graph_pb2

    from ..graph.shape_process import isolation_active, run_isolated

    if not isolation_active():
        return _scale_in_tensorflow(meta, train_name, loss_scale)
    status, answer = run_isolated(f"{__name__}:scale_in_tensorflow_request",
                                  (meta.SerializeToString(deterministic=True), train_name, loss_scale))
    if status == "died":
        raise AmpRewriteError(f"TensorFlow ended the process that imported the rewritten graph to write loss "
                              f"scaling into it ({answer}); the graph cannot be loss-scaled")
    if status == "error":
        kind, _, message = str(answer).partition(": ")
        raise AmpRewriteError(message if kind == AmpRewriteError.__name__ else f"{kind}: {message}")
    out_bytes, apply_names, seeds, checkpointed = answer
    return meta_graph_pb2.MetaGraphDef.FromString(out_bytes), set(apply_names), seeds, checkpointed


def rewrite_training_meta_graph(
    meta_graph_def: Any,
    loss_scale: Any = "dynamic",
    *,
    train_op: str | None = None,
    **rewrite_options: Any,
) -> TrainingRewriteResult:
    """Rewrite a TF1 training MetaGraphDef to mixed precision with loss scaling in the graph.

    Parameters
    ----------
    meta_graph_def
        A ``MetaGraphDef`` (or its bytes) exported after building ``train_op``.  Not modified.
    loss_scale
        ``"dynamic"``, a number (fixed scale: gradients are scaled and unscaled, no step is
        skipped), or a :class:`~amp_rewrite.training.loss_scale.LossScale`.
    train_op
        The train op's name, when the ``train_op`` collection does not hold exactly one.
    rewrite_options
        For :func:`amp_rewrite.rewrite_graph_def` (``target`` defaults to ``"auto"``).

    Returns
    -------
    TrainingRewriteResult
        ``.meta_graph_def`` imports with ``tf.compat.v1.train.import_meta_graph``; run
        ``global_variables_initializer()`` (or restore) and then the train op as before.

    Raises
    ------
    AmpRewriteError
        If the graph breaks one of the module's assumptions, the rewrite rejects it, or
        ``loss_scale`` is not a loss scale.  That includes an update op whose value no
        gradient seed leads to, next to ones it does.

    Every ``tf.gradients`` seed behind the update ops is scaled.  A gradient used *inside*
    the loss (a gradient penalty, as in WGAN-GP) has a seed of its own there, which would be
    scaled too and change the loss; the graph gives no reliable mark of such a seed, so this
    is not detected.  Train such models with
    :func:`amp_rewrite.enable_mixed_precision_graph_rewrite`, which scales only the loss.
    """
    from .session import _drop_dangling_collection_entries

    options = check_rewrite_options(rewrite_options)
    scale_config = _loss_scale_config(loss_scale)
    meta = _parse(meta_graph_def)
    train_name = _train_op_name(meta, train_op)
    if any(node.name.startswith(f"{_SCOPE}/") for node in meta.graph_def.node):
        raise AmpRewriteError(f"the graph is already loss-scaled (it has {_SCOPE}/ nodes)")

    result = rewrite_graph_def(meta.graph_def, **without_training_options(options, "an offline meta graph"))
    meta.graph_def.CopyFrom(result.graph_def)
    _drop_dangling_collection_entries(meta)

    out, apply_names, seeds, checkpointed = _scaled_where_safe(meta, train_name, scale_config)
    report = dict(result.report)
    report["training"] = _training_section(train_name, apply_names, seeds, scale_config, checkpointed)
    log.info("amp_rewrite: loss scaling written into the training graph: %d update op(s), "
             "%d gradient seed(s)", len(apply_names), len(seeds))
    return TrainingRewriteResult(out, report, result, tuple(sorted(apply_names)))
