"""What a MetaGraphDef refers to, and so what a rewrite must keep.

Signature tensors (dense, sparse or composite), the saver, collections, variable definitions
and assets name main-graph nodes that TensorFlow looks up when it loads the model: their
dtypes must not change (:func:`_preserved_nodes`).  ``--tags`` and ``--signature`` select
what is rewritten (:func:`_select_meta_graphs`, :func:`_check_signatures`,
:func:`_signature_scope`).  Everything here reads protobuf messages and modifies none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ..errors import AmpRewriteError, GraphFormatError, InvalidGraphError
from ..graph.io import reachable_functions
from ..graph.tensor_names import parse_graph_input

if TYPE_CHECKING:
    from .formats import ModelFile

#: Collections of serialized VariableDefs (tf.compat.v1.GraphKeys); their nodes keep dtypes.
_VARIABLE_COLLECTIONS = frozenset({
    "variables", "trainable_variables", "local_variables", "model_variables",
    "moving_average_variables", "metric_variables", "concatenated_variables",
})


def _tensor_names(info: Any) -> list[str]:
    """The tensor names a ``TensorInfo`` refers to (dense, sparse or composite)."""
    kind = info.WhichOneof("encoding")
    if kind == "name":
        return [info.name]
    if kind == "coo_sparse":
        c = info.coo_sparse
        return [n for n in (c.values_tensor_name, c.indices_tensor_name, c.dense_shape_tensor_name) if n]
    if kind == "composite_tensor":
        return [n for comp in info.composite_tensor.components for n in _tensor_names(comp)]
    return []


def _node_of(text: str) -> str | None:
    try:
        return parse_graph_input(text).node
    except ValueError:
        return None


def _signature_nodes(meta: Any, names: Iterable[str] | None = None) -> tuple[set[str], set[str]]:
    """Nodes of the signature inputs and outputs (of ``names``, or of every signature)."""
    inputs: set[str] = set()
    outputs: set[str] = set()
    for key, sig in meta.signature_def.items():
        if names is not None and key not in names:
            continue
        for info in sig.inputs.values():
            inputs.update(n for t in _tensor_names(info) if (n := _node_of(t)))
        for info in sig.outputs.values():
            outputs.update(n for t in _tensor_names(info) if (n := _node_of(t)))
    return inputs, outputs


def _infrastructure_nodes(meta: Any) -> set[str]:
    """Nodes the MetaGraphDef refers to outside its signatures: the saver, collections,
    variable definitions and asset tensors.  TensorFlow looks them up by name when it
    loads the model, so their dtypes must not change."""
    from tensorflow.core.framework import variable_pb2

    names: set[str] = set()
    saver = meta.saver_def
    for text in (saver.filename_tensor_name, saver.save_tensor_name, saver.restore_op_name):
        if text and (n := _node_of(text)):
            names.add(n)
    for key, coll in meta.collection_def.items():
        kind = coll.WhichOneof("kind")
        if kind == "node_list":
            names.update(n for t in coll.node_list.value if (n := _node_of(t)))
        elif kind == "bytes_list" and key in _VARIABLE_COLLECTIONS:
            for raw in coll.bytes_list.value:
                var = variable_pb2.VariableDef()
                try:
                    var.ParseFromString(raw)
                except Exception:  # noqa: BLE001 - a foreign payload is simply not a VariableDef
                    continue
                for text in (var.variable_name, var.initial_value_name, var.initializer_name,
                             var.snapshot_name):
                    if text and (n := _node_of(text)):
                        names.add(n)
    for asset in meta.asset_file_def:
        names.update(n for t in _tensor_names(asset.tensor_info) if (n := _node_of(t)))
    return names


def _graph_outputs(graph_def: Any) -> set[str]:
    """Main-graph nodes that nothing reads (data or control)."""
    read = {n for node in graph_def.node for t in node.input if (n := _node_of(t))}
    return {node.name for node in graph_def.node} - read


def _closure(graph_def: Any, roots: Iterable[str]) -> set[str]:
    """``roots`` and every main-graph node they depend on (data and control inputs)."""
    inputs = {node.name: node.input for node in graph_def.node}
    seen = {r for r in roots if r in inputs}
    todo = list(seen)
    while todo:
        for text in inputs[todo.pop()]:
            n = _node_of(text)
            if n is not None and n in inputs and n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def _select_meta_graphs(model: ModelFile, tags: Sequence[str] | None) -> list[int]:
    metas = model.meta_graphs
    if tags is None:
        return list(range(len(metas)))
    if model.format == "graph_def":
        raise AmpRewriteError("--tags applies to SavedModels and MetaGraphDefs, not to a frozen GraphDef")
    want = frozenset(t.strip() for t in tags if t.strip())
    hits = [i for i, mg in enumerate(metas) if frozenset(mg.meta_info_def.tags) == want]
    if not hits:
        have = "; ".join(",".join(sorted(mg.meta_info_def.tags)) or "(no tags)" for mg in metas)
        raise GraphFormatError(f"no meta graph has the tags {','.join(sorted(want))!r} (it has: {have})",
                               path=model.path)
    return hits


def _check_signatures(model: ModelFile, indices: Sequence[int], signatures: Sequence[str]) -> None:
    if model.format == "graph_def":
        raise AmpRewriteError("--signature applies to SavedModels and MetaGraphDefs, not to a frozen GraphDef")
    for i in indices:
        mg = model.meta_graphs[i]
        missing = [s for s in signatures if s not in mg.signature_def]
        if missing:
            have = ", ".join(sorted(k for k in mg.signature_def if not k.startswith("__"))) or "none"
            raise GraphFormatError(
                f"no signature {missing[0]!r} in meta graph {list(mg.meta_info_def.tags)} (it has: {have})",
                path=model.path,
            )


def _check_tensors_exist(meta: Any, path: str) -> None:
    """Every signature tensor must name a node of the graph (a broken model is refused here,
    with the signature named, rather than deep in the core)."""
    nodes = {n.name for n in meta.graph_def.node}
    for key, sig in sorted(meta.signature_def.items()):
        for side, infos in (("input", sig.inputs), ("output", sig.outputs)):
            for arg, info in sorted(infos.items()):
                for text in _tensor_names(info):
                    if _node_of(text) not in nodes:
                        raise GraphFormatError(
                            f"signature {key!r} {side} {arg!r} names tensor {text!r}, which is not in the graph",
                            path=path,
                        )


def _preserved_nodes(meta: Any, keep_io_types: bool, fetches: Sequence[str] | None) -> set[str]:
    """Main-graph nodes whose dtypes must not change: what the MetaGraphDef refers to by
    name, the graph's outputs, the signature outputs unless ``keep_io_types`` is off, and
    ``fetches``."""
    gd = meta.graph_def
    nodes = {n.name for n in gd.node}
    sig_in, sig_out = _signature_nodes(meta)
    preserve = _infrastructure_nodes(meta) | sig_in
    outputs = _graph_outputs(gd)
    preserve |= (outputs | sig_out) if keep_io_types else (outputs - sig_out)
    for f in fetches or ():
        name = _node_of(f)
        if name is None or name not in nodes:
            raise InvalidGraphError(f"fetch {f!r} names a node that does not exist", node=name)
        preserve.add(name)
    return preserve & nodes


def _signature_scope(meta: Any, signatures: Sequence[str]) -> tuple[set[str], set[str] | None]:
    """What ``signatures`` run: the library functions they reach, and the names of the rest
    of a TF1-style main graph, to keep float32 (``None`` when there is nothing to keep)."""
    gd = meta.graph_def
    _, roots = _signature_nodes(meta, signatures)
    closure = _closure(gd, roots)
    sub = type(gd)()
    sub.library.CopyFrom(gd.library)
    sub.node.extend(n for n in gd.node if n.name in closure)
    keep_functions = reachable_functions(sub)
    if meta.HasField("object_graph_def"):
        # TF2: the main graph holds only placeholders, variables and calls; nothing to keep.
        return keep_functions, None
    # TF1 style: the signatures' nodes live in the main graph.  Keep the rest float32 by
    # exact name (``keep_float32``, which names function body nodes too; that can only keep
    # more nodes float32, which is safe), never through the user's --exclude patterns, which
    # also match path components.
    others = {n.name for n in gd.node} - closure
    return keep_functions, (others or None)
