"""Copies of an untrusted GraphDef that TensorFlow's shape inference can read without running
any of the input's kernels.

Part of the import stage.  TensorFlow's shape refiner is the reference for static shapes, but
it is not passive: when a shape function asks for the *value* of an input (``Reshape``'s
shape, ``Fill``'s dims, ``Tile``'s multiples, ...), the refiner extracts the constant
subgraph behind that input and runs its kernels.  A model can put anything there --
``ReadFile`` of a path it chooses, or a ``MatMul`` of two ``Fill([N, N])`` that costs N**3
-- and TensorFlow's import also descends into the function library, where a recursive
function overflows the C++ stack.

:func:`inert_graph_def` returns a copy in which the refiner can only ever evaluate *shape
plumbing*: the shape of a tensor (``Shape``/``ShapeN``/``Size``/``Rank``, which the refiner
reads from shapes without computing data), constants, and a short list of integer ops
(:data:`SHAPE_PLUMBING`) restricted to small-rank integer values, so that no evaluation can
allocate more than the size of its inputs.  Every other node whose value *could* be computed
from constants alone is *severed*: one of its inputs (its data operand, not a shape operand
where that can be told) is read from a ``Placeholder`` of the same dtype and of the statically
known shape (a constant's own shape), so its value -- and everything computed from it -- is
no longer a constant to the refiner, while its shape still is what the shape functions say.
Calls into the function library (ops named after a function, and ops with ``func``
attributes: While, If, PartitionedCall) are removed and the library is dropped, so the
refiner never enters a function body from the main graph; their consumers read placeholders
with the recorded ``_output_shapes`` where present.  So are nodes with an attribute value whose
shape function would abort the process (:data:`_UNVALIDATED_ATTRS`: ``GatherV2``'s
``batch_dims``).

Severing costs little knowledge (a folded batch norm's parameters keep their shapes); a
removed call's outputs get a default size from the planner.  It never changes a plan's correctness.

Pure: the caller's GraphDef is never modified (the copy is a new message).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Iterable, Mapping

from . import dtypes as dt
from .importer import _attr_values
from .op_registry import OpRegistry, OpSignature
from .tensor_names import CONTROL, parse_graph_input
from .type_attrs import output_dtypes

__all__ = ["SHAPE_PLUMBING", "ShapeSource", "inert_graph_def"]

#: Ops whose value the refiner takes from their input's *shape*, never from its data.
ShapeSource = frozenset({"Shape", "ShapeN", "Size", "Rank"})

#: Integer shape arithmetic the refiner may evaluate on scalars and vectors: each output is at
#: most as large as its inputs together (vector broadcasting needs equal lengths or a scalar),
#: so evaluating a chain of them costs no more than the graph's own size.  ``Fill``, ``Range``,
#: ``Tile``, ``BroadcastTo``, ``Reshape`` and everything else are not here: their output size
#: is a value, not a size.
SHAPE_PLUMBING = frozenset({
    "Identity", "StridedSlice", "Slice", "Squeeze", "ExpandDims", "Pack", "Unpack",
    "Concat", "ConcatV2", "Gather", "GatherV2", "Cast", "Reshape", "InvertPermutation",
    "Add", "AddV2", "Sub", "Mul", "FloorDiv", "FloorMod", "Maximum", "Minimum", "Neg",
    "Prod", "Sum", "Max", "Min", "BroadcastGradientArgs",
})

#: The plumbing ops that broadcast or combine values: limited to vectors, so that two
#: operands of n elements give n, never n * n.  The others only move elements (their output
#: is at most their inputs together) and may work on matrices (a Pad's paddings).
_VECTOR_ONLY = frozenset({"Add", "AddV2", "Sub", "Mul", "FloorDiv", "FloorMod", "Maximum",
                          "Minimum", "Neg", "Prod", "Sum", "Max", "Min", "BroadcastGradientArgs"})

#: Ops that change neither shape nor size: a cut one passes its input's static shape on.
_SHAPE_PRESERVING = frozenset({"Identity", "Cast", "Neg", "Relu", "Relu6", "Abs", "Sign",
                               "StopGradient", "Snapshot"})

#: Ops whose value is never a constant to the refiner: inputs, and TF1 control flow (the
#: refiner does not fold through a loop's or a cond's plumbing).
_OPAQUE = frozenset({"Placeholder", "PlaceholderWithDefault", "PlaceholderV2", "_Arg",
                     "Enter", "RefEnter", "Exit", "RefExit", "Merge", "RefMerge", "Switch",
                     "RefSwitch", "NextIteration", "RefNextIteration", "LoopCond"})

#: Largest rank of a value :data:`SHAPE_PLUMBING` may compute (vectors for the element-wise
#: ops, :data:`_VECTOR_ONLY`).
_MAX_PLUMBING_RANK = 2

_CUT_SCOPE = "amp_rewrite_cut"


def _popcount(node_def: Any, attr: str) -> int:
    return bin(node_def.attr[attr].i).count("1") if attr in node_def.attr else 0


def _rank_bound(node_def: Any, ranks: list[int]) -> int:
    """An upper bound of the rank of a shape-plumbing op's value, from its inputs' bounds."""
    op = node_def.op
    if not ranks:
        return 0
    if op == "StridedSlice":
        return max(ranks[0] - _popcount(node_def, "shrink_axis_mask"), 0) \
            + _popcount(node_def, "new_axis_mask")
    if op in ("Slice", "Squeeze", "Identity", "Cast", "Neg", "InvertPermutation"):
        return ranks[0]
    if op == "ExpandDims":
        return ranks[0] + 1
    if op == "Pack":
        return max(ranks) + 1
    if op == "Unpack":
        return max(ranks[0] - 1, 0)
    if op == "ConcatV2":
        return max(ranks[:-1])
    if op == "Concat":
        return max(ranks[1:], default=0)
    if op in ("Gather", "GatherV2"):
        return ranks[0] - 1 + ranks[1] if len(ranks) > 1 else ranks[0]
    return max(ranks)  # element-wise arithmetic broadcasts to the larger rank


#: Functional control flow whose shape functions read the ``output_shapes`` attr and never
#: enter the bodies: kept (without the library) so their outputs keep their shapes.
_SHAPED_CONTROL_FLOW = frozenset({"While", "StatelessWhile", "_While", "If", "StatelessIf",
                                  "_If", "Case", "StatelessCase"})


#: Attributes that TensorFlow's shape functions compute with before validating them, and the
#: values known safe: a node with another value is removed from the copy, as a call is.
#: ``GatherV2``'s shape function makes a shape of rank ``rank(params) + rank(indices) - 1 -
#: batch_dims`` when its axis is not a constant, and a negative rank fails a CHECK
#: (``shape_inference.cc: rank must not be negative``) that aborts the process; a large
#: negative ``batch_dims`` asks for billions of dimensions.  Found by ``bench/hunt_aborts.py``.
#: Real models use 0, and sometimes 1 or -1 (``tf.gather(..., batch_dims=1)``).
_UNVALIDATED_ATTRS: Mapping[str, tuple[str, frozenset[int]]] = {
    "GatherV2": ("batch_dims", frozenset({-1, 0, 1})),
}


def _unvalidated_attr(node_def: Any) -> bool:
    """Whether an attribute of ``node_def`` has a value its op's shape function may abort on."""
    rule = _UNVALIDATED_ATTRS.get(node_def.op)
    if rule is None or rule[0] not in node_def.attr:
        return False
    value = node_def.attr[rule[0]]
    return value.WhichOneof("value") == "i" and value.i not in rule[1]


def _is_call(node_def: Any, library: set[str]) -> bool:
    if node_def.op in library:
        return True
    if node_def.op in _SHAPED_CONTROL_FLOW:
        return False
    return bool(_attr_values(node_def)[3])  # the functions its func / list(func) attrs name


def _const_shape(node_def: Any) -> tuple[int, ...] | None:
    """The shape of a ``Const`` node's value, read from its proto; ``None`` if unknown."""
    if "value" not in node_def.attr:
        return None
    shape = node_def.attr["value"].tensor.tensor_shape
    if shape.unknown_rank:
        return None
    return tuple(d.size for d in shape.dim)


def _recorded_shape(node_def: Any, port: int) -> Any | None:
    """The ``_output_shapes`` entry of ``port``, as a TensorShapeProto, if recorded."""
    if "_output_shapes" in node_def.attr:
        shapes = node_def.attr["_output_shapes"].list.shape
        if port < len(shapes):
            return shapes[port]
    return None


#: Integer dtypes: the operands of shape arithmetic.  A severed node gives up one of its
#: other operands first (its data), so the shape it is given stays known.
_INTEGER = frozenset({dt.INT32, dt.INT64})


class _Analysis:
    """Which nodes of a GraphDef to remove (calls, :data:`_UNVALIDATED_ATTRS`) and which input of
    which node to sever.
    Built once; reads the GraphDef only.

    Walks the data edges in topological order with an explicit queue (no recursion: graphs
    are user-sized).  Nodes on a cycle (TF1 loops) are never folded by the refiner -- Merge
    and Enter stop it -- and stay as they are.
    """

    def __init__(self, graph_def: Any, signature: Callable[[str], OpSignature | None]) -> None:
        self.nodes = {nd.name: nd for nd in graph_def.node}
        library = {f.signature.name for f in graph_def.library.function}
        #: node -> its data inputs as (producer, port, position in ``node_def.input``).
        self.inputs: dict[str, list[tuple[str, int, int]]] = {}
        for nd in graph_def.node:
            refs = []
            for pos, text in enumerate(nd.input):
                try:
                    ref = parse_graph_input(text)
                except ValueError:
                    continue  # the importer rejects it; shape inference then falls back
                if ref.port != CONTROL and ref.node in self.nodes:
                    refs.append((ref.node, ref.port, pos))
            self.inputs[nd.name] = refs
        self.signature = signature
        self._dtypes: dict[str, list[int] | None] = {}
        #: node -> True if the refiner could compute its value from constants alone.
        self.foldable: dict[str, bool] = {}
        #: node -> upper bound of its value's rank (foldable nodes only).
        self.rank: dict[str, int] = {}
        #: nodes removed from the copy (their consumers read placeholders).
        self.removed: set[str] = set()
        #: node -> position in its ``input`` list that reads a placeholder instead.
        self.severed: dict[str, int] = {}
        #: nodes TensorFlow must not see: calls (no body is in the copy) and nodes whose shape
        #: function may abort on an attribute (:data:`_UNVALIDATED_ATTRS`).
        self.unimportable = {n for n, nd in self.nodes.items() if _is_call(nd, library) or _unvalidated_attr(nd)}
        self._walk()

    def _walk(self) -> None:
        consumers: dict[str, list[str]] = {n: [] for n in self.nodes}
        pending = {}
        for name, refs in self.inputs.items():
            pending[name] = len(refs)
            for src, _, _ in refs:
                consumers[src].append(name)
        ready = deque(sorted(n for n, k in pending.items() if k == 0))
        while ready:
            name = ready.popleft()
            self._visit(name)
            for dst in consumers[name]:
                pending[dst] -= 1
                if pending[dst] == 0:
                    ready.append(dst)

    def output_dtypes(self, name: str) -> list[int] | None:
        """The dtype of each output port of ``name`` (``None`` if it cannot be told); memoized,
        as the walk asks for a node once per consumer."""
        if name not in self._dtypes:
            nd = self.nodes[name]
            types, ints = _attr_values(nd)[:2]
            self._dtypes[name] = output_dtypes(self.signature(nd.op), types, ints)
        return self._dtypes[name]

    def output_dtype(self, name: str, port: int) -> int:
        dtypes = self.output_dtypes(name)
        if dtypes is None or port >= len(dtypes):
            return dt.INVALID
        return dtypes[port]

    def _visit(self, name: str) -> None:
        nd = self.nodes[name]
        op = nd.op
        refs = self.inputs[name]
        self.foldable[name] = False
        if name in self.unimportable:
            self.removed.add(name)
            return
        if op == "Const":
            shape = _const_shape(nd)
            self.foldable[name] = True
            self.rank[name] = len(shape) if shape is not None else _MAX_PLUMBING_RANK + 1
            return
        if op in ShapeSource:
            self.foldable[name] = True
            self.rank[name] = 1 if op in ("Shape", "ShapeN") else 0
            return
        sig = self.signature(op)
        if op in _OPAQUE or (sig is not None and sig.is_stateful):
            return  # the refiner never folds a stateful op; its value is the program's business
        if not all(self.foldable[src] for src, _, _ in refs):
            return  # already not a constant to the refiner
        if not refs:
            # No data input and not a constant: nothing to sever, so an op with outputs is
            # removed (an op that has none, like NoOp, cannot feed a value).
            if sig is None or sig.outputs:
                self.removed.add(name)
            return
        rank = _rank_bound(nd, [self.rank[src] for src, _, _ in refs])
        if op == "Reshape":
            # Its rank is the length of its shape operand, known only for a constant one.
            shape_src = self.nodes[refs[1][0]] if len(refs) > 1 else None
            dims = _const_shape(shape_src) if shape_src is not None and shape_src.op == "Const" else None
            rank = dims[0] if dims is not None and len(dims) == 1 else _MAX_PLUMBING_RANK + 1
        limit = 1 if op in _VECTOR_ONLY else _MAX_PLUMBING_RANK
        if op in SHAPE_PLUMBING and rank <= limit and all(
                d in _INTEGER for d in self.output_dtypes(name) or (dt.INVALID,)):
            self.foldable[name] = True
            self.rank[name] = rank
            return
        self.severed[name] = self._operand_to_sever(refs)

    def _operand_to_sever(self, refs: list[tuple[str, int, int]]) -> int:
        """The input position to read from a placeholder.  A non-integer operand (the data,
        not a shape) if there is one; among integer operands, a computed one before a
        constant (constants are what shape functions read: an ``element_shape``, a
        ``multiples``); then the larger value, then the later input."""
        def key(ref: tuple[str, int, int]) -> tuple[int, int, int, int, int]:
            src, port, pos = ref
            numeric_data = self.output_dtype(src, port) not in _INTEGER
            is_const = self.nodes[src].op == "Const"
            shape = _const_shape(self.nodes[src]) if is_const else None
            size = 1
            for d in shape or ():
                size *= max(d, 0)
            return (int(numeric_data), int(not is_const), self.rank.get(src, 0), size, pos)

        return max(refs, key=key)[2]

    def static_shape(self, name: str, port: int, known: dict[str, Any]) -> Any | None:
        """A shape for the value of a cut ``name:port`` that needs no evaluation: a constant's
        own shape, a shape-preserving op's input shape, or a recorded ``_output_shapes``.
        ``known`` memoizes results (iterative: follows a chain of shape-preserving ops)."""
        chain = []
        cur, cur_port = name, port
        shape: Any | None = None
        while True:
            if (cur, cur_port) in known:
                shape = known[(cur, cur_port)]
                break
            nd = self.nodes[cur]
            recorded = _recorded_shape(nd, cur_port)
            if recorded is not None:
                shape = recorded
                break
            if nd.op == "Const" and cur_port == 0:
                dims = _const_shape(nd)
                shape = dims
                break
            refs = self.inputs[cur]
            if nd.op in _SHAPE_PRESERVING and cur_port == 0 and refs:
                chain.append((cur, cur_port))
                cur, cur_port, _ = refs[0]
                if len(chain) > len(self.nodes):
                    break
                continue
            break
        known[(cur, cur_port)] = shape
        for key in chain:
            known[key] = shape
        return shape


def placeholder_sources(copy: Any) -> dict[str, tuple[str, int]]:
    """The ``(node, port)`` each placeholder that :func:`inert_graph_def` added stands for,
    by placeholder name, for the placeholders whose shape is not fully known."""
    out = {}
    for nd in copy.node:
        if nd.op != "Placeholder" or "_amp_rewrite_stands_for" not in nd.attr:
            continue
        shape = nd.attr["shape"].shape
        if shape.unknown_rank or any(d.size < 0 for d in shape.dim):
            src, _, port = nd.attr["_amp_rewrite_stands_for"].s.decode().rpartition(":")
            out[nd.name] = (src, int(port))
    return out


def _placeholder(container: Any, name: str, dtype: int, shape: Any | None) -> None:
    """Add a Placeholder of ``dtype``; ``shape`` is a tuple of dims (``None`` = unknown), a
    TensorShapeProto, or ``None`` for an unknown rank."""
    nd = container.add()
    nd.name = name
    nd.op = "Placeholder"
    nd.attr["dtype"].type = dtype
    proto = nd.attr["shape"].shape
    if shape is None:
        proto.unknown_rank = True
    elif isinstance(shape, tuple):
        proto.SetInParent()  # a scalar has a shape with no dims, not an unknown one
        for d in shape:
            proto.dim.add().size = -1 if d is None else d
    else:
        proto.CopyFrom(shape)


def _free_scope(names: Iterable[str]) -> str:
    taken = set(names)
    scope = _CUT_SCOPE
    while any(n == scope or n.startswith(scope + "/") for n in taken):
        scope += "_"
    return scope


def inert_graph_def(graph_def: Any, registry: OpRegistry,
                    shape_hints: Mapping[tuple[str, int], tuple[int | None, ...] | None] | None = None,
                    ) -> tuple[Any, set[str]] | None:
    """A copy of ``graph_def``'s main graph that shape inference can import without running
    any of its kernels (see the module docstring), and the names of the nodes cut from it.

    The copy has no function library.  ``shape_hints`` gives shapes for the placeholders
    that stand for ``(node, port)`` (from a first import of the copy: the producers of a
    severed input are constants and shape plumbing, whose shapes do not depend on anything
    severed).  Returns ``None`` if the dtype of a placeholder's tensor cannot be told (an op
    unknown to ``registry``): the caller then must not import the graph.
    Pure: ``graph_def`` is read only.
    """
    library_sigs = {}
    if graph_def.library.function:
        from .op_registry import signature_from_opdef

        library_sigs = {f.signature.name: signature_from_opdef(f.signature)
                        for f in graph_def.library.function}

    def signature(op: str) -> OpSignature | None:
        return library_sigs.get(op) or registry.op(op)

    analysis = _Analysis(graph_def, signature)
    out = type(graph_def)()
    out.versions.CopyFrom(graph_def.versions)
    if not analysis.removed and not analysis.severed:
        out.node.extend(graph_def.node)
        return out, set()
    scope = _free_scope(analysis.nodes)
    placeholders: dict[tuple[str, int], str] = {}
    known: dict[tuple[str, int], Any] = {}
    for key, shape in (shape_hints or {}).items():
        if shape is not None:
            known[key] = shape

    def placeholder_for(src: str, port: int) -> str | None:
        key = (src, port)
        if key not in placeholders:
            dtype = analysis.output_dtype(src, port)
            if dtype == dt.INVALID:
                return None
            placeholders[key] = f"{scope}/{src}/{port}"
            _placeholder(out.node, placeholders[key], dtype, analysis.static_shape(src, port, known))
            # Private marker (underscore attrs are not checked against the op's definition).
            out.node[-1].attr["_amp_rewrite_stands_for"].s = f"{src}:{port}".encode()
        return placeholders[key]

    for nd in graph_def.node:
        if nd.name in analysis.removed:
            continue
        copy = out.node.add()
        copy.CopyFrom(nd)
        severed = analysis.severed.get(nd.name, -1)
        if severed < 0 and not any(src in analysis.removed for src, _, _ in analysis.inputs[nd.name]) \
                and not any(t.startswith("^") and t[1:] in analysis.removed for t in nd.input):
            continue
        del copy.input[:]
        for pos, text in enumerate(nd.input):
            try:
                ref = parse_graph_input(text)
            except ValueError:
                copy.input.append(text)
                continue
            if ref.port == CONTROL:
                if ref.node not in analysis.removed:
                    copy.input.append(text)  # ordering only; a removed node's is dropped
                continue
            if pos == severed or ref.node in analysis.removed:
                name = placeholder_for(ref.node, ref.port)
                if name is None:
                    return None
                copy.input.append(name)
            else:
                copy.input.append(text)
    return out, set(analysis.removed)
