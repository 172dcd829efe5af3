"""Export: the networkx IR -> a new GraphDef.

Part of :mod:`amp_rewrite.graph.io` (which re-exports these names).  Nodes the rewrite did
not touch are emitted as copies of their original NodeDef, and functions with no changed node
as copies of their original FunctionDef, so a round trip without changes is byte-identical.
The IR and the original GraphDef are only read.
"""

from __future__ import annotations

from typing import Any

import networkx as nx

from . import ir
from .importer import ImportedGraph, _op_signature
from .op_registry import OpRegistry
from .reading import _graph_def_class
from .tensor_names import CONTROL, format_graph_input
from .type_attrs import output_arg_ranges


def _set_type_attr(attr_map: Any, name: str, value: int | tuple[int, ...]) -> None:
    if isinstance(value, tuple):
        attr_map[name].list.type[:] = list(value)
    else:
        attr_map[name].type = value


def _set_scalar_attr(attr_map: Any, name: str, value: bool | int | bytes) -> None:
    if isinstance(value, bool):
        attr_map[name].b = value
    elif isinstance(value, int):
        attr_map[name].i = value
    else:
        attr_map[name].s = value


def _edge_text(
    g: nx.MultiDiGraph, src: str, src_port: int, registry: OpRegistry
) -> str:
    """Spell a reference to ``src:src_port`` for an edge the rewrite created."""
    if g.graph["kind"] == "graph":
        from .tensor_names import TensorRef

        return format_graph_input(TensorRef(src, src_port))
    data = g._node[src]
    if data["synthetic"] == "arg":
        return src
    sig = _op_signature(data["op"], registry, g.graph["signatures"])
    assert sig is not None, f"op {data['op']} vanished from the registry"
    for arg, (start, count) in output_arg_ranges(sig, data["dtypes"], data["ints"], src).items():
        if start <= src_port < start + count:
            return f"{src}:{arg}:{src_port - start}"
    raise AssertionError(f"output {src_port} of {src} does not exist")


def _node_inputs(g: nx.MultiDiGraph, name: str, registry: OpRegistry) -> list[str]:
    """The input strings of ``name``: data inputs by port, then control inputs in their
    original order.  Edges the rewrite created are spelled here.  Reads ``g`` only."""
    return _inputs_from(g, name, g._pred[name], registry)


def _inputs_from(g: nx.MultiDiGraph, name: str, pred: dict, registry: OpRegistry) -> list[str]:
    """:func:`_node_inputs` given the node's predecessor dict (``g._pred[name]``)."""
    data_edges = []
    control_edges = []
    in_graph = g.graph["kind"] == "graph"
    for u, keyed in pred.items():  # networkx's dict, read directly (see import)
        for d in keyed.values():
            if d["dst_port"] == CONTROL:
                control_edges.append((d["pos"], d["text"] or "^" + u))
            else:
                text = d["text"]
                if not text:
                    port = d["src_port"]
                    if in_graph:
                        # format_graph_input's spelling, inlined: it runs for every new edge.
                        text = u if port == 0 else f"{u}:{port}"
                    else:
                        text = _edge_text(g, u, port, registry)
                data_edges.append((d["dst_port"], text))
    if len(data_edges) > 1:
        data_edges.sort()
    if control_edges:
        control_edges.sort()
        return [t for _, t in data_edges] + [t for _, t in control_edges]
    return [t for _, t in data_edges]


def _fill_from(
    g: nx.MultiDiGraph, name: str, data: dict, pred: dict, registry: OpRegistry, nd: Any,
    templates: dict[tuple[object, ...], Any],
) -> None:
    """Write node ``name`` of ``g``, given its attribute and predecessor dicts, into ``nd``,
    a new empty NodeDef.  Mutates ``nd`` only.

    A node the rewrite made (a Cast) is copied from a template NodeDef with its op, device
    and attrs, kept in ``templates`` for the next node alike: one copy instead of an attr
    map write per attribute.
    """
    proto = data["proto"]
    if proto is not None:
        nd.CopyFrom(proto)
        _apply_changes(g, name, data, pred, registry, nd)
        return
    dtypes = data["dtypes"]
    # Other attributes of a node the rewrite made: bools (a Cast's Truncate) and scalars
    # (bool, int or bytes: an Enter's is_constant, parallel_iterations, frame_name).
    scalars = {**data.get("bools", {}), **data.get("scalars", {})}
    key = (data["op"], data["device"], tuple(sorted(dtypes.items())), tuple(sorted(scalars.items())))
    template = templates.get(key)
    if template is None:
        template = templates[key] = type(nd)()
        template.op = data["op"]
        template.device = data["device"]
        attr_map = template.attr
        for attr in sorted(dtypes):
            _set_type_attr(attr_map, attr, dtypes[attr])
        for attr, value in sorted(scalars.items()):
            _set_scalar_attr(attr_map, attr, value)
    nd.CopyFrom(template)
    nd.name = name
    nd.input.extend(_inputs_from(g, name, pred, registry))


def _apply_changes(
    g: nx.MultiDiGraph, name: str, data: dict, pred: dict, registry: OpRegistry, nd: Any
) -> None:
    """Write what the rewrite changed on an imported node into ``nd``, a copy of its NodeDef:
    its op, its changed type attrs and, if rewired, its inputs.  Mutates ``nd`` only."""
    nd.op = data["op"]
    changed = data.get("changed_attrs")
    if changed:
        attr_map = nd.attr
        dtypes = data["dtypes"]
        for attr in sorted(changed):
            _set_type_attr(attr_map, attr, dtypes[attr])
    appended = data.get("appended_output_shapes")
    if appended:
        _append_output_shapes(nd, appended)
    if data.get("inputs_changed"):
        del nd.input[:]
        nd.input.extend(_inputs_from(g, name, pred, registry))


def _append_output_shapes(nd: Any, appended: list[int | tuple[int | None, ...] | None]) -> None:
    """Give loop ``nd`` (a copy of a ``While``'s NodeDef whose ``T`` has grown by
    ``len(appended)``) an ``output_shapes`` entry per new loop variable: a copy of loop
    variable ``i``'s for an int ``i``, a shape (dims, ``None`` unknown), or an unknown shape
    for ``None``.  A loop without ``output_shapes`` (or with one that does not match its old
    ``T``) is left without them.  Mutates ``nd`` only."""
    old_count = len(nd.attr["T"].list.type) - len(appended)
    # The loop's own output_shapes, and _output_shapes where the graph records every node's
    # (as_graph_def(add_shapes=True)): importing checks there is one per output.
    for attr in ("output_shapes", "_output_shapes"):
        if attr in nd.attr:
            _append_shapes(nd.attr[attr].list.shape, old_count, appended)
    # TensorFlow's gradient of a loop (while_v2, when a loaded model is differentiated) takes
    # its first _num_original_outputs outputs for its loop variables and the rest for values
    # saved for an earlier gradient; a loop that had none gets the new ones counted, so the
    # gradient reaches what they were cast from.
    if "_num_original_outputs" in nd.attr and nd.attr["_num_original_outputs"].i == old_count:
        nd.attr["_num_original_outputs"].i = len(nd.attr["T"].list.type)


def _append_shapes(shapes: Any, old_count: int, appended: list[int | tuple[int | None, ...] | None]) -> None:
    """Append to ``shapes`` (a repeated TensorShapeProto of ``old_count`` entries; left alone
    otherwise) one entry per ``appended``: a copy of entry ``i`` for an int ``i``, a shape,
    or an unknown shape for ``None``.  Mutates ``shapes``."""
    if len(shapes) != old_count:
        return
    for source in appended:
        new = shapes.add()
        if isinstance(source, int):
            new.CopyFrom(shapes[source])
        else:
            _fill_shape(new, source)


def _fill_shape(proto: Any, shape: tuple[int | None, ...] | None) -> None:
    """Write ``shape`` (dims, ``None`` for an unknown one; ``None``: unknown rank) into the
    empty TensorShapeProto ``proto``.  Mutates ``proto``."""
    if shape is None:
        proto.unknown_rank = True
        return
    proto.SetInParent()  # a scalar has a shape with no dims, not an unknown one
    for d in shape:
        proto.dim.add().size = -1 if d is None else d


def _export_nodes(g: nx.MultiDiGraph, registry: OpRegistry, container: Any) -> None:
    """Append ``g``'s nodes, in node order, to ``container`` (an empty repeated NodeDef field,
    which this mutates).  Changed nodes are built in place (``container.add()``) rather than
    built and then copied in; runs of unchanged ones are copied with one ``extend``."""
    pending: list[Any] = []
    add = container.add
    templates: dict[tuple[object, ...], Any] = {}
    names, datas, _, preds = ir.ordered_entries(g, succ=False)
    for name, data, pred in zip(names, datas, preds):  # type: ignore[arg-type]
        if data["synthetic"]:
            continue
        if data["dirty"]:
            if pending:
                container.extend(pending)
                pending = []
            _fill_from(g, name, data, pred, registry, add(), templates)
        else:
            pending.append(data["proto"])
    if pending:
        container.extend(pending)


def _export_main_in_place(g: nx.MultiDiGraph, registry: OpRegistry, container: Any) -> bool:
    """Turn ``container``, a copy of the node list ``g`` was imported from, into ``g``'s
    node list: changed nodes are edited where they are, new ones appended, then all put in
    node order.  Mutates ``container``; returns False (and leaves it to be refilled) when
    ``g``'s imported nodes are not exactly the container's, in its order.

    Copying the whole list is one C-level copy; copying node by node (:func:`_export_nodes`)
    costs microseconds per node, seconds on graphs of a million nodes.
    """
    names, datas, _, preds = ir.node_entries(g, succ=False)
    size = len(container)
    old_keys: list[tuple[int, int]] = []  # order of container[i], for i < size
    new_keys: list[tuple[int, int]] = []  # order of the nodes appended, in turn
    add = container.add
    templates: dict[tuple[object, ...], Any] = {}
    for name, data, pred in zip(names, datas, preds):  # type: ignore[arg-type]
        if data["synthetic"]:
            return False
        order = data["order"]
        if data["proto"] is None:
            _fill_from(g, name, data, pred, registry, add(), templates)
            new_keys.append(order)
            continue
        # Imported node i has order (i, 0); they come first, in the dict's insertion order.
        i = len(old_keys)
        if order[0] != i or order[1] != 0 or i >= size:
            return False
        old_keys.append(order)
        if data["dirty"]:
            _apply_changes(g, name, data, pred, registry, container[i])
    if len(old_keys) != size:
        return False
    if new_keys:
        # Sort the container by node order.  Its elements are the imported nodes, then the
        # appended ones: keys in that order, handed out one per call, as list.sort (which
        # the container's sort uses) computes each element's key once, first to last.
        keys = iter(old_keys + new_keys)
        container.sort(key=lambda _: next(keys))
    return True


def _export_function(fg: nx.MultiDiGraph, registry: OpRegistry) -> Any:
    from tensorflow.core.framework import function_pb2

    source = fg.graph["source"]
    if not any(d["dirty"] for _, d in fg.nodes(data=True)):
        return source
    fdef = function_pb2.FunctionDef()
    fdef.CopyFrom(source)
    del fdef.node_def[:]
    _export_nodes(fg, registry, fdef.node_def)
    _append_arguments(fg, fdef)
    for name, data in fg.nodes(data=True):
        if data["synthetic"] == "retval":
            (text,) = _node_inputs(fg, name, registry)
            fdef.ret[data["ret_key"]] = text
    return fdef


def _append_arguments(fg: nx.MultiDiGraph, fdef: Any) -> None:
    """Append to ``fdef``'s signature the arguments and results ``fg`` has beyond it (the
    loop variables :mod:`amp_rewrite.loop_hoist` adds), in index order: an argument is named
    after its node, a result after its ``ret_key``, each of its fixed type.  Mutates ``fdef``."""
    sig = fdef.signature
    args = sorted((d["ints"]["index"], n, d) for n, d in fg.nodes(data=True) if d["synthetic"])
    old_count = len(sig.input_arg)
    added = []
    for index, name, data in args:
        if data["synthetic"] == "arg" and index >= len(sig.input_arg):
            _declare_shape(fdef, index, data.get("arg_shape"))
            sig.input_arg.add(name=name, type=data["dtypes"]["T"])
            added.append(data.get("arg_shape"))
        elif data["synthetic"] == "retval" and index >= len(sig.output_arg):
            sig.output_arg.add(name=data["ret_key"], type=data["dtypes"]["T"])
    # A function TensorFlow's tf.function traced declares its arguments' shapes once more in
    # _input_shapes, which loading a SavedModel checks has one per argument.
    if added and "_input_shapes" in fdef.attr:
        _append_shapes(fdef.attr["_input_shapes"].list.shape, old_count, added)


def _declare_shape(fdef: Any, index: int, shape: int | tuple[int | None, ...] | None) -> None:
    """Declare argument ``index``'s shape as TensorFlow's function builders do (its
    ``arg_attr`` ``_output_shapes``): a copy of argument ``i``'s for an int ``i`` (nothing
    where it declares none), a shape, or nothing for ``None``.  Mutates ``fdef``."""
    if shape is None:
        return
    if isinstance(shape, int):
        if shape not in fdef.arg_attr or "_output_shapes" not in fdef.arg_attr[shape].attr:
            return
        fdef.arg_attr[index].attr["_output_shapes"].CopyFrom(fdef.arg_attr[shape].attr["_output_shapes"])
        return
    _fill_shape(fdef.arg_attr[index].attr["_output_shapes"].list.shape.add(), shape)


def export_graph_def(imported: ImportedGraph, registry: OpRegistry) -> Any:
    """Build a new GraphDef from the IR.  Untouched nodes and functions are copied verbatim."""
    source = imported.source
    gd = _graph_def_class()()
    # Copy everything (versions, library, unknown fields) and then replace what changed.
    gd.CopyFrom(source)
    if any(d["dirty"] for _, d in imported.graph.nodes(data=True)):
        if not _export_main_in_place(imported.graph, registry, gd.node):
            del gd.node[:]
            _export_nodes(imported.graph, registry, gd.node)
    for i, fdef in enumerate(source.library.function):
        fg = imported.functions.get(fdef.signature.name)
        if fg is not None:
            new = _export_function(fg, registry)
            if new is not fdef:
                gd.library.function[i].CopyFrom(new)
    return gd
