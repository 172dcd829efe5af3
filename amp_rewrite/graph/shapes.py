"""Static tensor shapes for the cost-aware planner, read with TensorFlow's shape inference.

Part of the import stage: it reads the caller's GraphDef (protobuf) and never modifies it.
The result maps each node to one shape per output port; a shape is a tuple of dimensions,
``None`` for an unknown dimension, or ``None`` as a whole when even the rank is unknown.

TensorFlow's own shape functions are the reference, so the main graph is imported into a
scratch ``tf.Graph`` (which runs them) -- as an inert copy, in which no kernel of the input
can run and no function body is entered (:mod:`amp_rewrite.graph.inert`).  A graph TensorFlow cannot import (custom ops, a
broken function library) falls back to the ``_output_shapes`` attributes some exporters
write, and then to "unknown": the planner then uses a default size per tensor, so missing
shapes cost quality, never correctness.

A GraphDef records a captured variable only as a ``Placeholder`` of dtype ``resource``, with
no shape for the value behind it (a ``tf.function``'s graph, or a training step exported
with its variables as inputs).  TensorFlow's import ignores any handle-shape attribute on
such a placeholder, so every ``ReadVariableOp`` of it -- and everything computed from the
weights, down to the spatial size of a VALID convolution -- would be unknown.  Callers who
know the variables pass their shapes (:func:`check_variable_shapes`); the scratch import
then maps each such placeholder to a variable handle of that shape.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from typing import Any, Callable, Collection, Hashable, Mapping, Sequence

from . import dtypes as dt
from ..errors import AmpRewriteError, InvalidGraphError
from .inert import inert_graph_def, placeholder_sources
from .op_registry import OpRegistry, default_registry
from .tensor_names import node_name

__all__ = ["CallArguments", "Shape", "assign_function_shapes", "call_arguments", "check_variable_shapes",
           "clear_shape_memo", "function_shapes", "graph_shapes", "known_numel", "merge_call_arguments", "numel",
           "tensor_numel"]

log = logging.getLogger(__name__)

#: One tensor's static shape: dims (``None`` = unknown), or ``None`` for unknown rank.
Shape = tuple[int | None, ...] | None


def _from_tensor_shape(shape: Any) -> Shape:
    if shape.rank is None:
        return None
    return tuple(shape.as_list())


def _from_proto(proto: Any) -> Shape:
    if proto.unknown_rank:
        return None
    return tuple(d.size if d.size >= 0 else None for d in proto.dim)


def _attr_shapes(node_defs: Any) -> dict[str, tuple[Shape, ...]]:
    """Shapes from ``_output_shapes`` attributes (written by some exporters), if present."""
    out: dict[str, tuple[Shape, ...]] = {}
    for nd in node_defs:
        if "_output_shapes" in nd.attr:
            out[nd.name] = tuple(_from_proto(s) for s in nd.attr["_output_shapes"].list.shape)
    return out


#: Ops whose data outputs have the shape of their (first known) data input.  TensorFlow
#: leaves the loop variables of a lowered ``while_loop`` without a shape (the back edge is
#: unknown when Merge is built); for the cost model, the shape entering the loop is the
#: best estimate.
_FORWARDING = frozenset({"Enter", "Exit", "Merge", "Switch", "NextIteration", "Identity",
                         "RefEnter", "RefExit", "RefMerge", "RefSwitch", "RefNextIteration"})


def _known(shape: Shape) -> bool:
    return shape is not None and all(d is not None for d in shape)


def _forward_loop_shapes(node_defs: Any, shapes: dict[str, tuple[Shape, ...]]) -> dict[str, tuple[Shape, ...]]:
    """Fill unknown shapes of loop plumbing from their inputs.  Returns ``shapes``, updated."""
    forwarding = [nd for nd in node_defs if nd.op in _FORWARDING]
    for _ in range(8):  # nested loops need a few rounds; each round only adds knowledge
        changed = False
        for nd in forwarding:
            outs = shapes.get(nd.name)
            if not outs or _known(outs[0]):
                continue
            for text in nd.input:
                if text.startswith("^"):
                    continue
                name, _, port = text.partition(":")
                src = shapes.get(name)
                idx = int(port) if port.isdigit() else 0
                if src and idx < len(src) and _known(src[idx]):
                    n_out = 2 if nd.op.endswith("Switch") or nd.op.endswith("Merge") else len(outs)
                    new = list(outs)
                    for i in range(min(n_out, len(new))):
                        if nd.op.endswith("Merge") and i == 1:
                            continue  # value_index is a scalar int
                        new[i] = src[idx]
                    shapes[nd.name] = tuple(new)
                    changed = True
                    break
        if not changed:
            break
    return shapes


def _check_shape(name: str, shape: Any) -> Shape:
    if shape is None:
        return None
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
        # numpy arrays' .shape and TensorShape.as_list() are sequences; a bare int is not.
        try:
            shape = tuple(shape)
        except TypeError:
            raise AmpRewriteError(
                f"variable_shapes[{name!r}] must be a sequence of dimensions or None, "
                f"not {type(shape).__name__}", node=name) from None
    dims: list[int | None] = []
    for d in shape:
        if d is not None and (isinstance(d, bool) or not hasattr(d, "__index__") or int(d) < 0):
            raise AmpRewriteError(
                f"variable_shapes[{name!r}] has dimension {d!r}; dimensions are "
                f"non-negative integers, or None when unknown", node=name)
        dims.append(None if d is None else int(d))
    return tuple(dims)


def check_variable_shapes(graph_def: Any, variable_shapes: Mapping[str, Any] | None) -> dict[str, Shape]:
    """Validate ``variable_shapes`` (resource placeholder name -> the variable's shape)
    against ``graph_def``'s main graph and return it normalized to :data:`Shape` tuples.
    Pure.

    Raises
    ------
    InvalidGraphError
        For a name that is not a ``Placeholder`` of dtype ``resource`` in the main graph.
    AmpRewriteError
        For a shape that is not a sequence of non-negative integers (``None`` = unknown).
    """
    if not variable_shapes:
        return {}
    if not isinstance(variable_shapes, Mapping):
        raise AmpRewriteError(
            "variable_shapes must map resource placeholder names to shapes, "
            f"not {type(variable_shapes).__name__}")
    wanted = {}
    for key in variable_shapes:
        if not isinstance(key, str):
            raise AmpRewriteError(f"variable_shapes keys are node names, not {key!r}")
        try:
            wanted[node_name(key)] = key
        except ValueError:
            raise InvalidGraphError(f"variable_shapes names a bad node {key!r}") from None
    found = {nd.name: nd for nd in graph_def.node if nd.name in wanted}
    out: dict[str, Shape] = {}
    for name in sorted(wanted):
        nd = found.get(name)
        if nd is None:
            raise InvalidGraphError(f"variable_shapes names {name!r}, which is not a node of the graph",
                                    node=name)
        if nd.op != "Placeholder" or nd.attr["dtype"].type != dt.RESOURCE:
            raise InvalidGraphError(
                f"variable_shapes names {name!r}, a {nd.op} node; only resource placeholders "
                "(captured variables) take a shape this way", node=name)
        out[name] = _check_shape(name, variable_shapes[wanted[name]])
    return out


def _variable_handles(graph_def: Any, variable_shapes: Mapping[str, Shape]) -> dict[str, Any]:
    """An ``import_graph_def`` input map that replaces each resource placeholder with a known
    shape by a variable handle of that shape, built in the current (scratch) default graph.

    The dtype of the variable is the one its readers declare (``ReadVariableOp`` and the
    gathers carry a ``dtype`` attr); a placeholder nothing reads that way is left alone, as
    its shape could not matter.  Only called under a scratch graph; never touches the caller's.
    """
    import tensorflow as tf

    dtypes: dict[str, int] = {}
    for nd in graph_def.node:
        if nd.input and not nd.input[0].startswith("^") and "dtype" in nd.attr:
            src = node_name(nd.input[0])
            if src in variable_shapes and src not in dtypes:
                dtypes[src] = nd.attr["dtype"].type
    # The handles' own names must not take a graph node's name (the import would then rename
    # the graph's node, and its shapes would be filed under another name).
    names = {nd.name for nd in graph_def.node}
    scope = "amp_rewrite_variable_handles"
    while any(n == scope or n.startswith(scope + "/") for n in names):
        scope += "_"
    input_map = {}
    with tf.name_scope(scope + "/"):
        for name in sorted(dtypes):
            shape = variable_shapes[name]
            if shape is None:
                continue
            handle = tf.raw_ops.VarHandleOp(dtype=tf.as_dtype(dtypes[name]), shape=list(shape),
                                            shared_name=f"{scope}/{name}")
            input_map[f"{name}:0"] = handle
    return input_map


def _placeholder_hints(scratch: Any, copy: Any) -> dict[tuple[str, int], Shape]:
    """Shapes, from a first import of ``copy``, of the tensors its shapeless placeholders
    stand for (only those now known)."""
    hints: dict[tuple[str, int], Shape] = {}
    for (src, port) in placeholder_sources(copy).values():
        try:
            op = scratch.get_operation_by_name(src)
        except (KeyError, ValueError):
            continue
        if port < len(op.outputs):
            shape = _from_tensor_shape(op.outputs[port].shape)
            if shape is not None:
                hints[(src, port)] = shape
    return hints


def _read_shapes(graph: Any, wanted: set[str], skip: set[str] = frozenset()) -> dict[str, tuple[Shape, ...]]:
    return {
        op.name: tuple(_from_tensor_shape(t.shape) for t in op.outputs)
        for op in graph.get_operations() if op.name in wanted and op.name not in skip
    }


class _RecentShapes:
    """The last ``size`` shape inferences of one kind, by what they depend on: the bytes of
    the message (a digest of its deterministic serialization), the shapes the caller gave,
    and the registry (by identity).  Callers that infer the shapes of one graph several times
    -- the training path's whole-step check prices a step and then rewrites it; an autotune
    rewrites one graph per candidate -- run TensorFlow's import once.  Shape inference is a
    pure function of those inputs, so a hit is what inferring again would give.  Thread-safe;
    hands out copies."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: OrderedDict[Hashable, tuple[OpRegistry, dict[str, tuple[Shape, ...]]]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, registry: OpRegistry) -> dict[str, tuple[Shape, ...]] | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] is not registry:
                return None
            self._entries.move_to_end(key)
            return dict(entry[1])

    def put(self, key: Hashable, registry: OpRegistry, shapes: Mapping[str, tuple[Shape, ...]]) -> None:
        with self._lock:
            self._entries[key] = (registry, dict(shapes))
            self._entries.move_to_end(key)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def recall(self, message: Any, extra: Hashable, registry: OpRegistry,
               infer: Callable[[bytes | None], tuple[dict[str, tuple[Shape, ...]], bool]]
               ) -> dict[str, tuple[Shape, ...]]:
        """The shapes ``infer(serialized)`` gives for ``message`` (with ``extra``, what else
        they depend on, and ``registry``; ``serialized``: its deterministic serialization,
        ``None`` where it has none): kept from an earlier call where there is one, else
        inferred, and kept where ``infer`` says another try would give the same (not a stand-in
        for a helper process that did not answer in time, which may the next time).  A message
        that cannot be serialized is inferred each time."""
        serialized = _serialized(message)
        if serialized is None:
            return infer(None)[0]
        key = (hashlib.sha256(serialized).digest(), extra)
        shapes = self.get(key, registry)
        if shapes is None:
            shapes, inferred = infer(serialized)
            if inferred:
                self.put(key, registry, shapes)
        else:
            log.debug("static shapes inferred before: reused (%d nodes)", len(shapes))
        return shapes


#: A main graph's shapes can hold a few hundred thousand entries: few are kept.
_RECENT_GRAPHS = _RecentShapes(4)
_RECENT_FUNCTIONS = _RecentShapes(64)


def _serialized(message: Any) -> bytes | None:
    """``message``'s deterministic serialization, or ``None`` where it cannot be serialized
    (then nothing is kept: inference says why the shapes are unknown).  Pure."""
    try:
        return message.SerializeToString(deterministic=True)
    except Exception:  # noqa: BLE001 - e.g. a message over protobuf's 2 GB; TensorFlow's import would fail too
        return None


def _frozen(value: Any) -> Any:
    """``value`` with every list and tuple in it made a tuple (a hashable key).  Pure."""
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


def _shapes_key(shapes: Mapping[str, Shape] | None) -> tuple[tuple[str, Shape], ...]:
    return tuple(sorted((name, _frozen(shape)) for name, shape in (shapes or {}).items()))


def clear_shape_memo() -> None:
    """Forget the shape inferences :func:`graph_shapes` and :func:`function_shapes` keep (tests
    that count TensorFlow imports, or free their memory)."""
    _RECENT_GRAPHS.clear()
    _RECENT_FUNCTIONS.clear()


def graph_shapes(graph_def: Any, variable_shapes: Mapping[str, Shape] | None = None,
                 registry: OpRegistry | None = None) -> dict[str, tuple[Shape, ...]]:
    """Static output shapes of every node of ``graph_def``'s main graph (:func:`_infer_graph_shapes`),
    inferred once for the last few graphs asked (:class:`_RecentShapes`), in the helper
    process inside :func:`~amp_rewrite.graph.shape_process.isolated_shape_inference`.  Pure."""
    registry = registry or default_registry()
    variables = dict(variable_shapes) if variable_shapes else None
    return _RECENT_GRAPHS.recall(graph_def, _shapes_key(variable_shapes), registry, lambda serialized: _isolated_or_here(
        "graph", graph_def, serialized, variables, graph_def.node, registry,
        lambda: _infer_graph_shapes(graph_def, variable_shapes, registry)))


def _isolated_or_here(kind: str, message: Any, serialized: bytes | None, extra: Any, node_defs: Any,
                      registry: OpRegistry, here: Callable[[], dict[str, tuple[Shape, ...]]]
                      ) -> tuple[dict[str, tuple[Shape, ...]], bool]:
    """``here()``, or, inside :func:`~amp_rewrite.graph.shape_process.isolated_shape_inference`
    and with the default registry (a custom one cannot be sent), the same inference in the
    helper process (:func:`answer_shape_request`) on ``serialized`` (``message``'s bytes;
    ``None``: it has none, over protobuf's 2 GB, which TensorFlow could not import either);
    and whether another try would give the same (``False``: a stand-in for a helper that did
    not answer in time).
    Where the helper dies on the graph (a TensorFlow shape function aborted it) or fails, the
    nodes get their recorded ``_output_shapes`` (``node_defs``), with one WARNING for a death,
    or one for the process where the helper cannot start at all.
    Pure but for the log and the helper."""
    from .shape_process import isolation_active, shape_process

    if not isolation_active() or registry is not default_registry():
        return here(), True
    if serialized is None:
        return _attr_shapes(node_defs), True
    helper = shape_process()
    status, result = helper.infer(kind, (serialized, extra))
    if status == "ok":
        return result, True
    what = "the graph" if kind == "graph" else f"function {message.signature.name!r}"
    if status == "died" and helper.broken is not None:
        if not helper.warned_broken:
            helper.warned_broken = True
            log.warning("amp_rewrite: static shapes are not inferred: the process that infers them apart from "
                        "this one cannot run (%s); using _output_shapes attributes where present", helper.broken)
        return _attr_shapes(node_defs), False
    if status == "died":
        log.warning("amp_rewrite: TensorFlow's shape inference ended the helper process that ran it on %s (%s); "
                    "static shapes unavailable there: using _output_shapes attributes where present", what, result)
        # A crash on these bytes would crash again: the stand-in is kept, so the next rewrite of
        # the graph does not start (and kill) a helper for it again.  A helper that did not
        # answer in time (a loaded machine) may the next time.
        return _attr_shapes(node_defs), not str(result).startswith("no answer")
    log.info("static shapes unavailable for %s (%s); using _output_shapes attributes where present",
             what, str(result).splitlines()[0][:200])
    return _attr_shapes(node_defs), True


def answer_shape_request(kind: str, payload: Any) -> dict[str, tuple[Shape, ...]]:
    """The helper process's side of :func:`_isolated_or_here`: ``("graph", (GraphDef bytes,
    variable shapes))`` or ``("function", (FunctionDef bytes, call arguments))``, inferred with
    the default registry as in process.  Raises for an unknown kind."""
    from tensorflow.core.framework import function_pb2, graph_pb2

    serialized, extra = payload
    if kind == "graph":
        graph_def = graph_pb2.GraphDef.FromString(serialized)
        return _infer_graph_shapes(graph_def, extra, default_registry())
    if kind == "function":
        return _infer_function_shapes(function_pb2.FunctionDef.FromString(serialized), default_registry(), extra)
    raise ValueError(f"unknown shape request {kind!r}")


def _infer_graph_shapes(graph_def: Any, variable_shapes: Mapping[str, Shape] | None,
                        registry: OpRegistry) -> dict[str, tuple[Shape, ...]]:
    """Static output shapes of every node of ``graph_def``'s main graph.  Pure.

    TensorFlow imports an inert copy (:func:`~amp_rewrite.graph.inert.inert_graph_def`): no
    kernel of the input runs and no function body is entered; the nodes cut from that copy
    get their ``_output_shapes`` attribute or no shape.  ``variable_shapes`` (from
    :func:`check_variable_shapes`) gives the shapes of the values behind resource
    placeholders, which the GraphDef does not record.  Assumes TensorFlow is importable and
    the call graph was validated (:func:`amp_rewrite.graph.io.check_call_graph`).  Never
    raises for a graph TensorFlow rejects: the nodes then get the shapes of their
    ``_output_shapes`` attribute, or none at all.
    """
    import tensorflow as tf

    inert = inert_graph_def(graph_def, registry)
    recorded = _attr_shapes(graph_def.node)
    if inert is None:
        log.info("static shapes unavailable (an op feeding a shape is unknown); using "
                 "_output_shapes attributes where present")
        return recorded
    copy, cut = inert

    def scratch_import(message: Any) -> Any:
        scratch = tf.Graph()
        with scratch.as_default():
            input_map = _variable_handles(graph_def, variable_shapes) if variable_shapes else {}
            tf.graph_util.import_graph_def(message, input_map=input_map or None, name="")
        return scratch

    try:
        scratch = scratch_import(copy)
        hints = _placeholder_hints(scratch, copy)
        if hints:
            # The first import told the shapes of what the placeholders stand for (shape
            # plumbing, which never depends on anything severed); import once more with them.
            # A shape function may want the value behind a shape it is now given (an
            # element_shape operand): then the first import's shapes stand.
            again = inert_graph_def(graph_def, registry, hints)
            try:
                if again is not None:
                    scratch = scratch_import(again[0])
            except Exception as exc:  # noqa: BLE001 - the first import's shapes stand
                log.debug("second shape import failed (%s); keeping the first", exc)
        wanted = {nd.name for nd in graph_def.node} - cut
        shapes = _read_shapes(scratch, wanted)
    except Exception as exc:  # noqa: BLE001 - any failure only means "shapes unknown"
        log.info("static shapes unavailable (TensorFlow cannot import the graph: %s); "
                 "using _output_shapes attributes where present", str(exc).splitlines()[0][:200])
        return recorded
    for name in cut:
        if name in recorded:
            shapes[name] = recorded[name]
    return _forward_loop_shapes(graph_def.node, shapes)


#: What the call sites of a function tell about its arguments: per argument, the shape of the
#: tensor passed (``None``: unknown, or the call sites disagree) and, for a resource argument,
#: the shape of the variable behind it (``None`` when not known).  ``None`` as a whole: some
#: call site does not pass arguments by position (a loop's body, whose arguments change shape
#: from one iteration to the next as far as a call site can tell).
CallArguments = list[tuple[Shape, Shape]]

#: Ops that call a function with their data inputs as its arguments, from the input at this
#: offset (a conditional's first input is its predicate or branch index).  A While's body and
#: condition take the loop variables, whose shapes a call site cannot vouch for.
_CALL_OFFSET = {"If": 1, "StatelessIf": 1, "_If": 1, "Case": 1, "StatelessCase": 1, "_Case": 1,
                "PartitionedCall": 0, "StatefulPartitionedCall": 0}
_LOOPS = frozenset({"While", "StatelessWhile", "_While"})


def call_arguments(caller: Any, shapes: Mapping[str, tuple[Shape, ...]], variables: Mapping[str, Shape],
                   functions: Collection[str],
                   loop_invariant: Callable[[str], Collection[int]] | None = None,
                   ) -> dict[str, list[CallArguments | None]]:
    """The arguments each call in the imported graph ``caller`` (a networkx graph of
    :mod:`amp_rewrite.graph.ir`) passes to a function of ``functions``: per call, the shape
    of every argument (from ``shapes``, the caller's) and, where the argument is a resource
    placeholder or argument with a variable of known shape (``variables``: its name -> the
    value's shape), that shape.  Calls are the conditionals and function-call ops of
    ``_CALL_OFFSET`` and ops named after a function.  A loop's body and condition learn, where
    ``loop_invariant`` (body name -> the loop variables it passes through unchanged) is given,
    the variables behind the resources among those, and no shape (each iteration may change a
    loop variable's shape; the body declares its own): the same variable in every iteration.
    Any other reference to a function (a loop without such a variable, a dataset op's
    function) is a call whose arguments are unknown: ``None``, which
    :func:`merge_call_arguments` lets no shape through.  Pure."""
    from .ir import data_inputs

    out: dict[str, list[CallArguments | None]] = {}
    for name in caller.nodes:
        node = caller.nodes[name]
        op = node["op"]
        referenced = {f for f in (node.get("funcs") or ()) if f in functions}
        if op in functions:
            referenced.add(op)
        if not referenced:
            continue
        positional = op not in _LOOPS and (op in _CALL_OFFSET or op in functions)
        args: CallArguments | None = None
        if positional:
            args = []
            for src, port in data_inputs(caller, name)[_CALL_OFFSET.get(op, 0):]:
                outs = shapes.get(src)
                args.append((outs[port] if outs is not None and port < len(outs) else None, variables.get(src)))
        loop = _loop_arguments(caller, name, node, variables, loop_invariant) if op in _LOOPS else None
        for f in sorted(referenced):
            if loop is not None and f in loop[0]:
                out.setdefault(f, []).append(loop[1])
                continue
            out.setdefault(f, []).append(args if positional and (op in _CALL_OFFSET or op == f) else None)
    return out


def _loop_arguments(caller: Any, name: str, node: Mapping[str, Any], variables: Mapping[str, Shape],
                    loop_invariant: Callable[[str], Collection[int]] | None,
                    ) -> tuple[tuple[str, str], CallArguments] | None:
    """``((body, cond), arguments)`` of loop ``name`` of ``caller``: no shapes, and the variable
    shapes (``variables``) behind the resources the body passes through unchanged; ``None``
    when it has none of those (or no ``loop_invariant``).  Pure."""
    from .ir import data_inputs

    callees = dict(node.get("func_attrs") or ())
    body, cond = callees.get("body"), callees.get("cond")
    if loop_invariant is None or body is None or cond is None:
        return None
    through = loop_invariant(body)
    args: CallArguments = [(None, variables.get(src) if i in through and port == 0 else None)
                           for i, (src, port) in enumerate(data_inputs(caller, name))]
    if all(v is None for _, v in args):
        return None
    return (body, cond), args


def merge_call_arguments(calls: list[CallArguments | None], n_args: int) -> CallArguments | None:
    """One argument list that holds at every call site: a shape (or variable shape) where all
    calls agree on it, ``None`` where they differ; ``None`` as a whole where a call passes
    another number of arguments or its arguments are unknown (``None``).  Pure."""
    if not calls or any(c is None or len(c) != n_args for c in calls):
        return None
    merged: CallArguments = []
    for i in range(n_args):
        shapes = {c[i][0] for c in calls}
        variables = {c[i][1] for c in calls}
        merged.append((shapes.pop() if len(shapes) == 1 else None, variables.pop() if len(variables) == 1 else None))
    return merged


def _function_input_shapes(fdef: Any) -> list[Any] | None:
    """The argument shapes TensorFlow's ``function_def_to_graph`` would use: the
    ``_input_shapes`` attribute, with none for a resource argument that has handle data."""
    attr = fdef.attr.get("_input_shapes", None)
    if attr is None:
        return None
    from tensorflow.core.framework import types_pb2

    return [None if arg.type == types_pb2.DT_RESOURCE and arg.handle_data else shape
            for shape, arg in zip(attr.list.shape, fdef.signature.input_arg)]


def _with_call_shapes(fdef: Any, declared: list[Any] | None, call: CallArguments | None) -> list[Any] | None:
    """The argument shapes to build ``fdef``'s body with: those it declares (``declared``,
    from its attributes), else what its call sites agree on (``call``), for non-resource
    arguments.  Pure."""
    if call is None or len(call) != len(fdef.signature.input_arg):
        return declared
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2

    shapes = list(declared) if declared is not None else [None] * len(call)
    for i, (arg, (shape, _)) in enumerate(zip(fdef.signature.input_arg, call)):
        if shapes[i] is None and shape is not None and arg.type != types_pb2.DT_RESOURCE:
            shapes[i] = tf.TensorShape(list(shape))
    if declared is None and all(shape is None for shape in shapes):
        return None  # a call that says no shape (a loop's: only its variables) declares none
    return shapes


def _blank_function_names(fdef: Any) -> dict[tuple[str, str], Any]:
    """Blank the function names of every ``func``/``list(func)`` attribute of ``fdef``'s nodes
    (a local copy: mutated), returning them per (node, attribute) to put back."""
    named: dict[tuple[str, str], Any] = {}
    for nd in fdef.node_def:
        for key in list(nd.attr):
            value = nd.attr[key]
            kind = value.WhichOneof("value")
            if kind == "func" and value.func.name:
                named[(nd.name, key)] = value.func.name
                value.func.name = ""
            elif kind == "list" and value.list.func:
                named[(nd.name, key)] = [f.name for f in value.list.func]
                for f in value.list.func:
                    f.name = ""
    return named


def _restore_function_names(graph_def: Any, named: Mapping[tuple[str, str], Any]) -> None:
    """Put back the names :func:`_blank_function_names` took (``graph_def``: the converted
    copy, mutated; its nodes keep the body's node names)."""
    by_node: dict[str, list[tuple[str, Any]]] = {}
    for (node, key), value in named.items():
        by_node.setdefault(node, []).append((key, value))
    for nd in graph_def.node:
        for key, value in by_node.get(nd.name, ()):
            if key not in nd.attr:
                continue
            if isinstance(value, str):
                nd.attr[key].func.name = value
            else:
                for f, name in zip(nd.attr[key].list.func, value):
                    f.name = name


def function_shapes(fdef: Any, registry: OpRegistry | None = None,
                    call: CallArguments | None = None) -> dict[str, tuple[Shape, ...]]:
    """:func:`_infer_function_shapes`, inferred once for the last few bodies and call
    arguments asked (:class:`_RecentShapes`).  Pure; never raises."""
    registry = registry or default_registry()
    return _RECENT_FUNCTIONS.recall(fdef, _frozen(call), registry, lambda serialized: _isolated_or_here(
        "function", fdef, serialized, call, fdef.node_def, registry,
        lambda: _infer_function_shapes(fdef, registry, call)))


def _infer_function_shapes(fdef: Any, registry: OpRegistry,
                           call: CallArguments | None) -> dict[str, tuple[Shape, ...]]:
    """Static output shapes of the nodes of one FunctionDef body.  Argument shapes come from
    its ``_input_shapes`` attribute or argument attributes, else from ``call`` (what its call
    sites pass, :func:`merge_call_arguments`), whose variable shapes also give each resource
    argument a variable handle of that shape, so that what the body reads from a variable --
    a training step's optimizer update inside a loss-scale conditional -- has a size.  Like
    :func:`graph_shapes`, the body TensorFlow imports is an inert copy: nothing of it runs,
    and no call is entered.  Pure; never raises: a body TensorFlow cannot build gets its
    ``_output_shapes`` attributes or nothing.
    """
    from tensorflow.python.framework import importer
    from tensorflow.python.framework.func_graph import FuncGraph
    from tensorflow.python.framework.function_def_to_graph import function_def_to_graph_def

    import tensorflow as tf

    variables = {a.name: v for a, (_, v) in zip(fdef.signature.input_arg, call or ()) if v is not None}

    def import_body(message: Any, graph_def: Any) -> None:
        # Into the current (scratch) FuncGraph; resource arguments with a known variable
        # shape read from a handle of that shape (as graph_shapes does for placeholders).
        input_map = _variable_handles(graph_def, variables) if variables else {}
        importer._import_graph_def_internal(  # noqa: SLF001 - import_graph_def_for_function, with an input map
            message, input_map=input_map or None, validate_colocation_constraints=False, name="")

    recorded = _attr_shapes(fdef.node_def)
    # An empty graph around the body: in eager mode TensorFlow would resolve an op named after
    # a function from every function this process ever traced, so shapes would depend on
    # what ran before (a call the body makes is cut anyway).
    isolated = tf.Graph()
    try:
        with isolated.as_default():
            scratch = FuncGraph(fdef.signature.name)
            with scratch.as_default():
                # Flattens ``node:out_arg:i`` references into ports and adds one Placeholder
                # per argument; pure Python, runs nothing.
                # A copy: TensorFlow reads ``arg_attr[i]`` of every argument, and reading a
                # protobuf map inserts the key, which would change the caller's FunctionDef.
                local = type(fdef)()
                local.CopyFrom(fdef)
                # TensorFlow's conversion insists that every function a node names (an If's
                # branches, a PartitionedCall's target) be registered in the graph; the inert
                # copy cuts or keeps those nodes without entering any body, so the names are
                # blanked for the conversion and put back after it.
                named = _blank_function_names(local)
                graph_def, _ = function_def_to_graph_def(
                    local, _with_call_shapes(local, _function_input_shapes(local), call))
                _restore_function_names(graph_def, named)
                inert = inert_graph_def(graph_def, registry)
                if inert is None:
                    return recorded
                copy, cut = inert
                import_body(copy, graph_def)
            hints = _placeholder_hints(scratch, copy)
            if hints and (again := inert_graph_def(graph_def, registry, hints)) is not None:
                second = FuncGraph(fdef.signature.name)
                try:
                    with second.as_default():
                        import_body(again[0], graph_def)
                    scratch = second
                except Exception as exc:  # noqa: BLE001 - the first import's shapes stand
                    log.debug("second shape import of %s failed (%s); keeping the first",
                              fdef.signature.name, exc)
        # The arguments are Placeholders named after them; their shapes are read too.
        wanted = {nd.name for nd in fdef.node_def} | {a.name for a in fdef.signature.input_arg}
        shapes = _read_shapes(scratch, wanted - cut)
    except Exception as exc:  # noqa: BLE001 - any failure only means "shapes unknown"
        log.debug("no static shapes for function %s: %s", fdef.signature.name,
                  str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
        return recorded
    # Exporters' recorded shapes win, as in TensorFlow's function_def_to_graph (they may be
    # more specific than what the body's own shape functions can tell).
    for name, outs in recorded.items():
        if name in shapes:
            shapes[name] = tuple(r if r is not None else s for r, s in zip(outs, shapes[name])) \
                + shapes[name][len(outs):]
        else:
            shapes[name] = outs
    return shapes


def assign_function_shapes(main: Any, functions: Mapping[str, Any], fdefs: Mapping[str, Any],
                           variables: Mapping[str, Shape], registry: OpRegistry) -> None:
    """Set ``graph["shapes"]`` of every imported function graph of ``functions`` (networkx
    graphs of :mod:`amp_rewrite.graph.ir`; ``main``: the imported main graph, its shapes
    set), callers before callees: a body whose FunctionDef (``fdefs``) declares no argument
    shapes (a ``tf.cond`` branch) takes those its call sites agree on, and the variable shapes
    behind its resource arguments (``variables``, the main graph's resource placeholders: the
    loss-scale conditional around a training step's update).  Only callers reachable from the
    main graph count (a library function nothing calls says nothing about its callees).
    Mutates the function graphs' ``graph`` dicts only; assumes the call graph is acyclic
    (checked on import)."""

    def callees(g: Any) -> list[str]:
        # One entry per calling node and function, as call_arguments counts them in visit.
        return [f for f, entries in call_arguments(g, {}, {}, functions).items() for _ in entries]

    from .ir import passed_through

    def loop_invariant(body: str) -> set[int]:
        return passed_through(functions[body]) if body in functions else set()

    reachable, todo = set(), callees(main)
    while todo:
        f = todo.pop()
        if f not in reachable:
            reachable.add(f)
            todo.extend(callees(functions[f]))
    callers_left = dict.fromkeys(reachable, 0)
    for caller in [main, *(functions[f] for f in reachable)]:
        for f in callees(caller):
            callers_left[f] += 1
    calls: dict[str, list[CallArguments | None]] = {f: [] for f in reachable}

    def visit(caller: Any, arg_variables: Mapping[str, Shape], ready: list[str]) -> None:
        for f, entries in call_arguments(caller, caller.graph.get("shapes") or {}, arg_variables, reachable,
                                         loop_invariant).items():
            calls[f].extend(entries)
            callers_left[f] -= len(entries)
            if callers_left[f] == 0:
                ready.append(f)

    ready: list[str] = []
    visit(main, variables, ready)
    while ready:
        fname = ready.pop()
        fg, fdef = functions[fname], fdefs.get(fname)
        merged = merge_call_arguments(calls[fname], len(fdef.signature.input_arg)) if fdef is not None else None
        fg.graph["shapes"] = function_shapes(fdef, registry, merged) if fdef is not None else {}
        known = ({a.name: v for a, (_, v) in zip(fdef.signature.input_arg, merged) if v is not None}
                 if fdef is not None and merged else {})
        visit(fg, known, ready)
    for fname in functions.keys() - reachable:  # nothing reachable calls it: no call site to use
        fdef = fdefs.get(fname)
        functions[fname].graph["shapes"] = function_shapes(fdef, registry) if fdef is not None else {}


def known_numel(shape: Shape) -> int | None:
    """Number of elements of ``shape`` when it is fully known (rank and every dimension),
    else ``None``.  Pure."""
    if shape is None or any(d is None for d in shape):
        return None
    n = 1
    for d in shape:
        n *= max(d, 0)
    return n


def tensor_numel(shapes: Mapping[str, tuple[Shape, ...]], tensor: tuple[str, int]) -> int | None:
    """The number of values of ``tensor`` (producer, output port) in ``shapes`` (node -> one
    shape per port) where its shape is fully known, else ``None``.  Pure."""
    outs = shapes.get(tensor[0])
    return known_numel(outs[tensor[1]]) if outs and tensor[1] < len(outs) else None


def numel(shape: Shape, default: int) -> int:
    """Number of elements of ``shape``; unknown dimensions count as ``default`` each and an
    unknown rank as ``default`` elements in all."""
    if shape is None:
        return default
    n = 1
    for d in shape:
        n *= default if d is None else max(d, 0)
    return n

