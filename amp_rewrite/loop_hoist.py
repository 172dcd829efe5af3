"""Hoist the rewrite's loop-invariant Casts out of loop bodies.

A Cast the rewrite inserts in the body of a functional loop (``While``, ``StatelessWhile``)
runs once per iteration.  Where what it casts is the same in every iteration, that is work
done again for nothing, and often the largest part of the iteration: a recurrent layer or a
decoding loop reads its weights inside the body (Keras's LSTM on a CPU, a ``tf.while_loop``
that generates tokens), and casting a weight matrix reads four bytes and writes two per
element, more memory traffic than the low-precision MatMul that then reads it.  TensorFlow's
pass leaves these Casts in the body.

A Cast is hoisted when its input is

* a loop variable the body passes through unchanged (the body returns its argument ``i`` as
  its result ``i``): the Cast then reads the loop's input ``i`` once, before the loop; or
* a ``ReadVariableOp`` of such a loop variable holding a resource, when nothing in the loop
  can write a variable: every resource the loop is handed reaches only reads, and the loop
  (its body and condition, the loops and functions they call) holds no stateful op but reads,
  random number generators, printing and assertions, no op with a ref argument, and no op
  TensorFlow's registry does not know (a ``py_function`` may assign any variable it closes
  over).  A read before the loop then gives the value every iteration would have read.  The
  read made before the loop waits for what the loop waits for (the loop's control inputs),
  so a write ordered before the loop stays before it.

The cast value enters the loop as a new loop variable, appended after the others (so every
existing output keeps its index), which the body passes through unchanged and which the
condition ignores.  The Cast and, where nothing else reads it, the body's read are removed.
Numerically nothing changes: the same Cast of the same value, made once.

Only bodies and conditions that nothing else calls are changed (their signatures grow), and
loops whose functions the library has gradients for, or that a function left out of the
rewrite calls, are left alone.  The shapes TensorFlow records grow with the signature (the
loop's ``output_shapes`` and ``_output_shapes``, the functions' ``_input_shapes`` and their
arguments' ``_output_shapes``), and a loop with no values saved for a gradient counts the
new loop variables among its ``_num_original_outputs``, so that differentiating a loaded
model reaches what they were cast from.

Two things differ from the Casts left in the loop.  A read hoisted out of a loop that runs no
iteration still runs, once (an uninitialized variable fails there).  And a gradient taken
through the rewritten graph (a loaded SavedModel fine-tuned) sums a hoisted weight's
gradient over the iterations in the low precision, the new loop variable's type, where the
Cast in the loop handed back a float32 one each iteration.  The training paths rewrite a step
whose gradient is already built, so neither arises there.

TensorFlow 1 loops (frames of ``Enter``/``Merge``/``Switch``/``NextIteration``/``Exit`` in one
graph) hand a loop-invariant value in through an ``Enter`` with ``is_constant``: a Cast of
one (a ref variable's read, entered; a placeholder), or of a read of a resource so entered
where no resource entering the frame reaches anything but reads (in it, or in the frames it
enters it into), moves before the ``Enter``,
and a new constant ``Enter`` hands the frame the cast value, where the frame (nested frames
included) and the frames around it write no variable by the same rules (a ref variable's read
shares the variable's buffer; the read made before the frame runs in the enclosing one), and
the read waits for nothing but the frame's pivot.  The frame's own ``Enter`` and read stay,
unused: a MetaGraphDef's while_context names them.

Part of the rewrite stage: imports only :mod:`amp_rewrite.graph` and the errors.  Each loop it
changes is checked after (its types, its inputs and its functions' signatures one for one), and
a mismatch is a :class:`~amp_rewrite.errors.RewriteError` before anything is written.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Iterable, Mapping

import networkx as nx

from .errors import RewriteError
from .graph import dtypes as dt
from .graph import ir
from .graph.node_values import bool_attr, bytes_attr, int_attr
from .graph.op_registry import ArgSpec, OpRegistry, OpSignature
from .graph.tensor_names import CONTROL

__all__ = ["LOOP_OPS", "HoistedCast", "hoist_loop_invariant_casts", "loop_invariant_tensors"]

log = logging.getLogger(__name__)

#: The functional loops whose bodies this looks into.
LOOP_OPS = frozenset({"While", "StatelessWhile"})

#: The read this hoists: a variable's whole value.
_READ = "ReadVariableOp"

#: Ops that only read the resource they are handed (TensorFlow registers them as reading
#: their variable, never assigning it): a loop whose resources reach nothing else writes none.
_READS_ONLY = frozenset({"ReadVariableOp", "ResourceGather", "ResourceGatherNd", "VariableShape",
                         "VarIsInitializedOp"})

#: Stateful ops a loop may hold and still write no variable: reads, and ops whose state is
#: their own (random number generators), only output (printing) or a check (assertions).
_HARMLESS_STATEFUL = _READS_ONLY | frozenset({
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "ParameterizedTruncatedNormal", "Multinomial", "RandomGamma", "RandomPoisson", "RandomPoissonV2",
    "RandomShuffle", "Print", "PrintV2", "Assert"})

#: More loop variables than one loop could be given (orders the nodes added before a loop).
_MOST_HOISTED = 1 << 30

#: Prefix of the loop variables this adds (TensorFlow wants ``[a-z][a-z0-9_]*`` arg names).
_ARG_PREFIX = "amp_rewrite_hoisted_"


@dataclass(frozen=True)
class HoistedCast:
    """One Cast moved out of a loop body: ``cast`` (removed from function ``body``) is now
    ``outer_cast`` in ``graph`` (``""`` for the main graph, else a function's name), feeding
    loop ``loop`` as its loop variable ``index``.  Out of a TensorFlow 1 loop: ``loop`` is the
    frame's name, ``body`` is ``""``, ``cast`` was in ``graph`` and ``index`` is ``None`` (a new
    ``Enter`` hands the frame ``outer_cast``).  ``source`` says what it casts."""

    graph: str
    loop: str
    body: str
    cast: str
    outer_cast: str
    index: int | None
    source: str

    def as_dict(self) -> dict[str, object]:
        """The report's entry (``hoisted_casts``)."""
        return dataclasses.asdict(self)


def loop_invariant_tensors(main: nx.MultiDiGraph, functions: Mapping[str, nx.MultiDiGraph], registry: OpRegistry, *,
                           called_elsewhere: Iterable[str] = ()) -> dict[str, frozenset[tuple[str, int]]]:
    """Per loop body whose Casts :func:`hoist_loop_invariant_casts` may hoist, the tensors of it
    (``(node, port)``) that are the same in every iteration: the arguments it passes through,
    and its reads of the resources among them when the loop writes none.  A Cast of one of
    them is made once per run of the loop, not once per iteration, so the cost-aware planner
    prices it so (its graph's ``loop_invariant`` attribute, which ``api`` sets).  Only loops in
    the main graph and in functions as given are looked at (not the loops a hoist leaves in an
    enclosing body).  Pure."""
    graphs: dict[str, nx.MultiDiGraph] = {"": main, **functions}
    found: dict[str, frozenset[tuple[str, int]]] = {}
    for _, _, body, cond in _hoistable_loops(graphs, functions, set(called_elsewhere)):
        tensors = _invariant_tensors(functions[body], functions[cond], functions, registry)
        if tensors:
            found[body] = frozenset(tensors)
    return found


def _hoistable_loops(graphs: Mapping[str, nx.MultiDiGraph], functions: Mapping[str, nx.MultiDiGraph],
                     frozen: set[str]) -> Iterable[tuple[str, str, str, str]]:
    """``(graph, loop, body, cond)`` for each functional loop of ``graphs`` whose body and
    condition may change signature: both are rewritten functions, distinct, named by that loop
    alone and by nothing outside (``frozen``).  Graphs callees first, loops by name.  Reads the
    graphs as they are when each is reached (the caller may change them in between)."""
    calls = _call_counts(graphs.values())
    for gname in _callees_first(graphs):
        g = graphs[gname]
        for loop in sorted(n for n, d in g.nodes(data=True) if d["op"] in LOOP_OPS):
            callees = dict(g._node[loop]["func_attrs"])
            body, cond = callees.get("body"), callees.get("cond")
            if body is None or cond is None or body == cond:
                continue
            if any(f not in functions or calls.get(f, 0) != 1 or f in frozen for f in (body, cond)):
                continue
            yield gname, loop, body, cond


def hoist_loop_invariant_casts(main: nx.MultiDiGraph, functions: Mapping[str, nx.MultiDiGraph],
                               registry: OpRegistry, *, called_elsewhere: Iterable[str] = ()) -> list[HoistedCast]:
    """Hoist the loop-invariant Casts the rewrite inserted (nodes with no ``proto`` whose op is
    ``Cast``) out of every functional loop of ``main`` and of ``functions`` (the rewritten IR
    of a GraphDef and its library; ``registry`` says which ops are stateful).
    ``called_elsewhere``: functions something outside this IR calls or names (a function not
    rewritten, a gradient), whose signatures must not change.

    Inner loops are done first, so a Cast hoisted out of an inner loop into its enclosing body
    is hoisted again where that body's loop allows.  **Mutates** ``main`` and ``functions``
    (and the shared ``signatures`` mapping of the graphs).  Returns what it moved, in order.
    """
    graphs: dict[str, nx.MultiDiGraph] = {"": main, **functions}
    hoisted: list[HoistedCast] = []
    for gname, loop, body, cond in _hoistable_loops(graphs, functions, set(called_elsewhere)):
        hoisted += _hoist_loop(graphs[gname], gname, loop, functions[body], functions[cond], functions, registry)
    for gname in sorted(graphs):
        if any(d["op"] == _ENTER for _, d in graphs[gname].nodes(data=True)):
            hoisted += _hoist_frames(graphs[gname], gname, functions, registry)
    if hoisted:
        log.debug("amp_rewrite: hoisted %d loop-invariant cast(s) out of loop bodies", len(hoisted))
    return hoisted


def _call_counts(graphs: Iterable[nx.MultiDiGraph]) -> dict[str, int]:
    """How many nodes of ``graphs`` name each function (as their op or in a function
    attribute).  Pure."""
    counts: dict[str, int] = {}
    for g in graphs:
        signatures = g.graph["signatures"]
        for _, data in g.nodes(data=True):
            names = list(data["funcs"])
            if data["op"] in signatures:
                names.append(data["op"])
            for name in names:
                counts[name] = counts.get(name, 0) + 1
    return counts


def _callees_first(graphs: Mapping[str, nx.MultiDiGraph]) -> list[str]:
    """The names of ``graphs`` ordered so that a function comes before every graph calling
    it (the library has no recursion: import refuses it), ties by name.  Pure."""
    deps = nx.DiGraph()
    deps.add_nodes_from(graphs)
    for name, g in graphs.items():
        signatures = g.graph["signatures"]
        for _, data in g.nodes(data=True):
            for callee in (*data["funcs"], *((data["op"],) if data["op"] in signatures else ())):
                if callee in graphs and callee != name:
                    deps.add_edge(callee, name)
    return list(nx.lexicographical_topological_sort(deps))


def _writes_no_resource(body: nx.MultiDiGraph, cond: nx.MultiDiGraph,
                        functions: Mapping[str, nx.MultiDiGraph]) -> bool:
    """Whether a loop with ``body`` and ``cond`` only reads the resources it is handed: every
    consumer of a resource argument is an op that only reads it (:data:`_READS_ONLY`), the
    body's own result passing it through, or a nested loop of which the same holds.  Anything
    else (an assignment, a call, an op this does not know) counts as a write.  Pure."""
    through = ir.passed_through(body)
    for fg, own in ((body, through), (cond, set())):
        for i, arg in ir.function_args(fg, "arg").items():
            if fg._node[arg]["dtypes"]["T"] != dt.RESOURCE:
                continue
            if not _only_read(fg, arg, i, own, functions):
                return False
    return True


def _holds_only_reads(graphs: Iterable[nx.MultiDiGraph], functions: Mapping[str, nx.MultiDiGraph],
                      registry: OpRegistry) -> bool:
    """Whether ``graphs`` (a loop's body and condition, or a TensorFlow 1 frame's nodes) and
    every function they call hold no stateful op (by ``registry``) but reads and ops whose
    state is no variable (:data:`_HARMLESS_STATEFUL`), no op taking or making a ref, and no
    op ``registry`` does not know: a
    ``py_function`` may assign any variable it closes over, a ``VarHandleOp`` may name one the
    loop reads, and neither shows as a consumer of the loop's resources.  Pure."""
    todo, seen = list(graphs), set()
    while todo:
        fg = todo.pop()
        if id(fg) in seen:
            continue
        seen.add(id(fg))
        signatures = fg.graph["signatures"]
        for _, data in fg.nodes(data=True):
            if data["synthetic"]:
                continue
            op = data["op"]
            callees = (*data["funcs"], *((op,) if op in signatures else ()))
            if callees:  # a call or a functional loop or conditional: what it runs is checked
                if any(f not in functions for f in callees):
                    return False
                todo.extend(functions[f] for f in callees)
                continue
            sig = registry.op(op)
            # A ref variable's assignment (Assign, AssignAdd, ScatterUpdate ...) is not marked
            # stateful; it takes the variable as a ref, and so does what enters one into a
            # TensorFlow 1 loop (RefEnter).
            if sig is None or sig.has_ref_args() or (sig.is_stateful and op not in _HARMLESS_STATEFUL):
                return False
    return True


def _only_read(fg: nx.MultiDiGraph, arg: str, index: int, through: set[int],
               functions: Mapping[str, nx.MultiDiGraph]) -> bool:
    """Whether every consumer of argument ``arg`` (number ``index``) of ``fg`` only reads it
    (:func:`_writes_no_resource`).  Pure."""
    for dst, keyed in fg._succ[arg].items():
        data = fg._node[dst]
        for edge in keyed.values():
            port = edge["dst_port"]
            if data["op"] in _READS_ONLY and port == 0:
                continue
            if data["synthetic"] == "retval" and data["ints"]["index"] == index and index in through:
                continue
            if data["op"] in LOOP_OPS and port != CONTROL:
                callees = dict(data["func_attrs"])
                inner = [functions.get(callees.get(k, "")) for k in ("body", "cond")]
                if all(f is not None for f in inner) and _nested_only_reads(inner[0], inner[1], port, functions):
                    continue
            return False
    return True


def _nested_only_reads(body: nx.MultiDiGraph, cond: nx.MultiDiGraph, port: int,
                       functions: Mapping[str, nx.MultiDiGraph]) -> bool:
    """Whether a nested loop only reads the resource it is handed at ``port``.  Pure."""
    through = ir.passed_through(body)
    for fg, own in ((body, through), (cond, set())):
        arg = ir.function_args(fg, "arg").get(port)
        if arg is None or not _only_read(fg, arg, port, own, functions):
            return False
    return True


@dataclass(frozen=True)
class _Candidate:
    """A Cast of a body that can be hoisted: ``cast`` reads loop variable ``index``, through
    the body's ``read`` of it (a resource) or directly (``read`` is ``None``)."""

    cast: str
    index: int
    read: str | None
    src_dtype: int
    dst_dtype: int


def _invariant_tensors(body: nx.MultiDiGraph, cond: nx.MultiDiGraph, functions: Mapping[str, nx.MultiDiGraph],
                       registry: OpRegistry) -> dict[tuple[str, int], tuple[int, str | None]]:
    """The tensors of ``body`` that are the same in every iteration, each with the loop
    variable it comes from and the read it is (``None``: the argument itself): the arguments
    the body passes through, and the ``ReadVariableOp`` reads of those holding a resource
    (with no control input: nothing orders them after anything) when the loop writes no
    variable (:func:`_writes_no_resource`, :func:`_holds_only_reads`).  Pure."""
    args = ir.function_args(body, "arg")
    through = ir.passed_through(body)
    found: dict[tuple[str, int], tuple[int, str | None]] = {(args[i], 0): (i, None) for i in sorted(through)}
    reads = []
    for i in sorted(through):
        if body._node[args[i]]["dtypes"]["T"] != dt.RESOURCE:
            continue
        for dst, keyed in body._succ[args[i]].items():
            if (body._node[dst]["op"] == _READ and any(e["dst_port"] == 0 for e in keyed.values())
                    and not ir.control_inputs(body, dst)):
                reads.append(((dst, 0), (i, dst)))
    if reads and _writes_no_resource(body, cond, functions) and _holds_only_reads([body, cond], functions, registry):
        found.update(reads)
    return found


def _candidates(body: nx.MultiDiGraph, cond: nx.MultiDiGraph, functions: Mapping[str, nx.MultiDiGraph],
                registry: OpRegistry) -> list[_Candidate]:
    """The inserted Casts of ``body`` whose input is the same in every iteration
    (:func:`_invariant_tensors`), in name order.  Pure."""
    invariant = _invariant_tensors(body, cond, functions, registry)
    found = []
    for name in sorted(body.nodes):
        data = body._node[name]
        if data["op"] != "Cast" or data["proto"] is not None:
            continue
        ins = ir.data_inputs(body, name)
        if len(ins) != 1 or ins[0] not in invariant or ir.control_inputs(body, name) or any(
                e["dst_port"] == CONTROL for keyed in body._succ[name].values() for e in keyed.values()):
            continue
        index, read = invariant[ins[0]]
        found.append(_Candidate(name, index, read, data["dtypes"]["SrcT"], data["dtypes"]["DstT"]))
    return found


def _hoist_loop(g: nx.MultiDiGraph, gname: str, loop: str, body: nx.MultiDiGraph, cond: nx.MultiDiGraph,
                functions: Mapping[str, nx.MultiDiGraph], registry: OpRegistry) -> list[HoistedCast]:
    """Hoist what can be of ``body`` (the body of ``loop``, a node of ``g``; ``cond`` its
    condition).  **Mutates** ``g``, ``body``, ``cond`` and the graphs' signatures."""
    loop_data = g._node[loop]
    types = tuple(loop_data["dtypes"].get("T", ()))
    n = len(types)
    outer_ins = ir.data_inputs(g, loop)
    indices = list(range(n))
    if (len(outer_ins) != n or sorted(ir.function_args(body, "arg")) != indices
            or sorted(ir.function_args(body, "retval")) != indices
            or sorted(ir.function_args(cond, "arg")) != indices):
        return []
    candidates = _candidates(body, cond, functions, registry)
    if not candidates:
        return []
    added: dict[tuple[int, bool, int], tuple[str, str, str]] = {}  # -> (body arg, outer cast, source)
    hoisted = []
    for c in candidates:
        key = (c.index, c.read is not None, c.dst_dtype)
        if key not in added:
            index = n + len(added)
            shape = _value_shape(body, c)
            outer_cast = _outer_cast(g, loop, loop_data, outer_ins[c.index], c, body, len(added), shape)
            arg = _new_loop_variable(g, loop, loop_data, outer_cast, index, body, cond, c.dst_dtype,
                                     shape if c.read is not None or shape is not None else c.index)
            what = (f"the read of the variable that is loop variable {c.index}" if c.read is not None
                    else f"loop variable {c.index}, which the body passes through unchanged")
            added[key] = (arg, outer_cast, what)
        arg, outer_cast, what = added[key]
        _replace_with_arg(body, c, arg)
        hoisted.append(HoistedCast(gname, loop, body.graph["name"], c.cast, outer_cast,
                                   n + list(added).index(key), what))
    _extend_signatures(g, body, cond, n, [(added[k][0], k[2]) for k in added])
    _check_loop(g, loop, body, cond)
    return hoisted


def _check_loop(g: nx.MultiDiGraph, loop: str, body: nx.MultiDiGraph, cond: nx.MultiDiGraph) -> None:
    """Raise :class:`RewriteError` unless ``loop``'s types are its inputs', its body's arguments'
    and results', and its condition's arguments', one for one (what TensorFlow checks when it
    instantiates the loop).  Reads only."""
    types = tuple(g._node[loop]["dtypes"]["T"])
    signatures = g.graph["signatures"]
    found = {
        "inputs": len(ir.data_inputs(g, loop)),
        "body arguments": tuple(a.fixed_type for a in signatures[body.graph["name"]].inputs),
        "body results": tuple(a.fixed_type for a in signatures[body.graph["name"]].outputs),
        "condition arguments": tuple(a.fixed_type for a in signatures[cond.graph["name"]].inputs),
    }
    bad = [what for what, got in found.items() if got != (len(types) if what == "inputs" else types)]
    if bad:
        raise RewriteError(f"hoisting Casts out of loop {loop!r} left its types and its {', '.join(bad)} apart. "
                           "This is a bug in amp_rewrite; please report it with the graph", node=loop)


def _value_shape(body: nx.MultiDiGraph, c: _Candidate) -> tuple[int | None, ...] | None:
    """The static shape of what ``c.cast`` casts, where ``body``'s inferred shapes (those the
    import gave the cost-aware planner) know it; else ``None``.  Pure."""
    return _shape_of(body, c.read if c.read is not None else ir.function_args(body, "arg")[c.index])


def _shape_of(g: nx.MultiDiGraph, name: str) -> tuple[int | None, ...] | None:
    """Node ``name``'s first output shape in ``g``'s inferred shapes, or ``None``.  Pure."""
    outs = (g.graph.get("shapes") or {}).get(name)
    return outs[0] if outs else None


def _set_shape(g: nx.MultiDiGraph, name: str, shape: tuple[int | None, ...] | None) -> None:
    """Record ``shape`` as node ``name``'s output shape where ``g`` has inferred shapes (the
    step estimate reads them).  **Mutates** ``g``'s shapes."""
    shapes = g.graph.get("shapes")
    if shapes is not None and shape is not None:
        shapes[name] = (shape,)


def _unique(g: nx.MultiDiGraph, base: str) -> str:
    name, k = base, 0
    while name in g:
        k += 1
        name = f"{base}_{k}"
    return name


def _outer_cast(g: nx.MultiDiGraph, loop: str, loop_data: dict, source: tuple[str, int], c: _Candidate,
                body: nx.MultiDiGraph, seq: int, shape: tuple[int | None, ...] | None) -> str:
    """Add to ``g`` the Cast (and, for a resource, the read) of ``source``, the loop's input
    ``c.index``, that replaces ``c.cast``; returns the Cast's name.  A read waits for the
    loop's control inputs.  ``seq``: how many this loop has had added before (their place in
    node order: just before the loop); ``shape``: the value's, where known.  **Mutates** ``g``."""
    producer, port = source
    # Before the loop in node order, in the order added: (loop's index, negative).
    order = (loop_data["order"][0], -_MOST_HOISTED + 2 * seq)
    device = loop_data["device"]
    if c.read is not None:
        read = _unique(g, f"{loop}/{_ARG_PREFIX}read_{c.index}")
        # The body's read's device ("" in a function body: TensorFlow's placer puts a read
        # beside its resource).
        read_data = body._node[c.read]
        ir.add_node(g, read, op=_READ, device=read_data["device"], order=order,
                    dtypes={"dtype": read_data["dtypes"]["dtype"]})
        g._node[read]["dirty"] = True
        _set_shape(g, read, shape)
        ir.add_data_edge(g, producer, port, read, 0, None)
        _add_control_inputs(g, read, ir.control_inputs(g, loop))
        producer, port = read, 0
    cast = _unique(g, f"{loop}/{_ARG_PREFIX}{c.index}-CastTo-{dt.name(c.dst_dtype)}-AutoMixedPrecision")
    ir.add_node(g, cast, op="Cast", device=device, order=(order[0], order[1] + 1),
                dtypes={"SrcT": c.src_dtype, "DstT": c.dst_dtype})
    g._node[cast]["bools"] = {"Truncate": False}
    g._node[cast]["dirty"] = True
    ir.add_data_edge(g, producer, port, cast, 0, None)
    return cast


def _new_loop_variable(g: nx.MultiDiGraph, loop: str, loop_data: dict, outer_cast: str, index: int,
                       body: nx.MultiDiGraph, cond: nx.MultiDiGraph, dtype: int,
                       shape: int | tuple[int | None, ...] | None) -> str:
    """Append loop variable ``index`` (of ``dtype``, fed by ``outer_cast``) to ``loop``: its
    type, its input, its shape (``shape``: a shape, that of loop variable ``shape`` for an
    int, or ``None`` for unknown) as the loop's output shape and its arguments' declared one,
    an argument the body returns unchanged and one the condition ignores.  Returns the body's
    argument.  **Mutates** ``g``, ``body`` and ``cond``."""
    ir.add_data_edge(g, outer_cast, 0, loop, index, None)
    loop_data["dtypes"]["T"] = tuple(loop_data["dtypes"]["T"]) + (dtype,)
    loop_data.setdefault("changed_attrs", set()).add("T")
    loop_data.setdefault("appended_output_shapes", []).append(shape)
    outer_shapes = g.graph.get("shapes")
    if outer_shapes is not None and loop in outer_shapes:
        outs = outer_shapes[loop]
        value = outs[shape] if isinstance(shape, int) and shape < len(outs) else (
            None if isinstance(shape, int) else shape)
        outer_shapes[loop] = tuple(outs) + (value,)
    loop_data["dirty"] = True
    loop_data["inputs_changed"] = True
    taken = {d.get("ret_key") for _, d in body.nodes(data=True)} | set(body) | set(cond)
    k = index
    while f"{_ARG_PREFIX}{k}" in taken or f"{_ARG_PREFIX}{k}_out" in taken:
        k += 1
    arg = f"{_ARG_PREFIX}{k}"
    for fg in (body, cond):
        ir.add_node(fg, arg, op="_Arg", device="", order=(-1_000_000 - index, 0), dtypes={"T": dtype},
                    ints={"index": index}, synthetic="arg")
        fg._node[arg]["dirty"] = True  # export rebuilds the function and appends the argument
        fg._node[arg]["arg_shape"] = shape  # what export declares (its _output_shapes)
        _set_shape(fg, arg, shape if not isinstance(shape, int) else _shape_of(fg, ir.function_args(fg, "arg")[shape]))
    ret = _unique(body, f"{arg}_out_RetVal")
    ir.add_node(body, ret, op="_Retval", device="", order=(1_000_000 + index, 0), dtypes={"T": dtype},
                ints={"index": index}, synthetic="retval")
    body._node[ret]["ret_key"] = f"{arg}_out"
    body._node[ret]["dirty"] = True
    ir.add_data_edge(body, arg, 0, ret, 0, None)
    return arg


def _replace_with_arg(body: nx.MultiDiGraph, c: _Candidate, arg: str) -> None:
    """Move the consumers of ``c.cast`` onto ``arg`` and remove the Cast, and the body's read
    where nothing else needs it.  **Mutates** ``body``."""
    for dst, keyed in list(body._succ[c.cast].items()):
        for key, edge in list(keyed.items()):
            ir.add_data_edge(body, arg, 0, dst, edge["dst_port"], None)
            body._node[dst]["dirty"] = True
            body._node[dst]["inputs_changed"] = True
    body.remove_node(c.cast)
    if c.read is not None and not body._succ[c.read]:
        body.remove_node(c.read)


def _extend_signatures(g: nx.MultiDiGraph, body: nx.MultiDiGraph, cond: nx.MultiDiGraph, n: int,
                       added: list[tuple[str, int]]) -> None:
    """Append the new loop variables to the signatures the graphs share.  **Mutates** the
    ``signatures`` mapping."""
    signatures = g.graph["signatures"]
    extra_in = tuple(ArgSpec(name=arg, type_attr="", type_list_attr="", number_attr="", fixed_type=dtype,
                             is_ref=False) for arg, dtype in added)
    extra_out = tuple(dataclasses.replace(a, name=f"{a.name}_out") for a in extra_in)
    for fg, outs in ((body, extra_out), (cond, ())):
        old: OpSignature = signatures[fg.graph["name"]]
        signatures[fg.graph["name"]] = dataclasses.replace(
            old, inputs=old.inputs[:n] + extra_in, outputs=old.outputs + outs)


# ---------------------------------------------------------------------------------------------
# TensorFlow 1 loops: frames of Enter / Merge / Switch / NextIteration / Exit in one graph
# ---------------------------------------------------------------------------------------------

#: What hands a TensorFlow 1 loop (a frame) a value; with ``is_constant`` the same value in
#: every iteration.
_ENTER = "Enter"


def _hoist_frames(g: nx.MultiDiGraph, gname: str, functions: Mapping[str, nx.MultiDiGraph],
                  registry: OpRegistry) -> list[HoistedCast]:
    """Hoist the rewrite's Casts of loop-invariant values out of the TensorFlow 1 loops of
    ``g``: a Cast of an ``Enter`` with ``is_constant`` (a weight entered as a constant: a ref
    variable's read, a placeholder), or of a read of a resource so entered, becomes a Cast
    before the ``Enter`` and a new ``Enter`` of the cast value, where the frame writes no
    variable (:func:`_frame_writes_nothing`: a ref variable's read shares the variable's
    buffer, so an assignment in the frame would change it between iterations).  Repeated
    until nothing moves, so a Cast leaves nested frames one at a time.  **Mutates** ``g``.
    Returns what it moved."""
    hoisted: list[HoistedCast] = []
    writes_nothing: dict[bytes, bool] = {}  # the frame and the frames around it
    own: dict[bytes, bool] = {}  # the frame itself (nested frames included)

    def writes_nothing_itself(f: bytes) -> bool:
        if f not in own:
            own[f] = _frame_writes_nothing(g, f, functions, registry)
        return own[f]

    while True:
        moved = False
        for name in sorted(n for n, d in g.nodes(data=True) if d["op"] == "Cast" and d["proto"] is None):
            found = _frame_candidate(g, name)
            if found is None:
                continue
            frame = found[2]
            if frame not in writes_nothing:
                # The frames around it too: the read made before this frame's Enter runs in
                # the enclosing frame, once per iteration there, and a write there could race
                # with it (parallel iterations).
                writes_nothing[frame] = writes_nothing_itself(frame) and all(
                    writes_nothing_itself(f) for f in _enclosing_frames(g, frame))
            if writes_nothing[frame]:
                hoisted.append(_hoist_out_of_frame(g, gname, name, *found, seq=len(hoisted)))
                moved = True
        if not moved:
            return hoisted


def _frame_candidate(g: nx.MultiDiGraph, cast: str) -> tuple[str, str | None, bytes] | None:
    """``(enter, read, frame)`` where inserted Cast ``cast`` of ``g`` reads a value entered
    into TensorFlow 1 loop ``frame`` as a constant: the output of constant ``enter`` (``read``
    None), or ``read``, a ``ReadVariableOp`` of it; else ``None``.
    Whether the frame writes that value is for the caller.  Pure."""
    ins = ir.data_inputs(g, cast)
    if len(ins) != 1 or _has_control_edges(g, cast):
        return None
    (src, port), = ins
    read = None
    if g._node[src]["op"] == _READ and port == 0:
        # A control input that is the frame's pivot only puts it in the loop; a frame that
        # writes nothing (checked by the caller) has nothing else to order it after.  Any other
        # (a tf.control_dependencies inside the body, on something after a write outside the
        # loop) orders the read, and a read made before the loop would lose that order.
        read_ins = ir.data_inputs(g, src)
        if len(read_ins) != 1 or not all(_is_pivot(g, ctrl) for ctrl in ir.control_inputs(g, src)):
            return None
        read, (src, port) = src, read_ins[0]
    enter = g._node[src]
    if enter["op"] != _ENTER or port != 0 or not bool_attr(enter, "is_constant"):
        return None
    frame = bytes_attr(enter, "frame_name")
    if frame is None or (read is None) != (enter["dtypes"].get("T") != dt.RESOURCE):
        return None
    return src, read, frame


def _is_pivot(g: nx.MultiDiGraph, name: str) -> bool:
    """Whether ``name`` is a TensorFlow 1 loop's pivot: the ``Identity`` of a ``Switch``'s
    true output, which every op of an iteration waits for.  Pure."""
    if g._node[name]["op"] != "Identity":
        return False
    ins = ir.data_inputs(g, name)
    return len(ins) == 1 and ins[0][1] == 1 and g._node[ins[0][0]]["op"] in ("Switch", "RefSwitch")


def _has_control_edges(g: nx.MultiDiGraph, name: str) -> bool:
    """Whether ``name`` has a control input or a control output.  Pure."""
    return bool(ir.control_inputs(g, name)) or any(
        e["dst_port"] == CONTROL for keyed in g._succ[name].values() for e in keyed.values())


def _frame_writes_nothing(g: nx.MultiDiGraph, frame: bytes, functions: Mapping[str, nx.MultiDiGraph],
                          registry: OpRegistry) -> bool:
    """Whether TensorFlow 1 loop ``frame`` of ``g`` writes no variable: its nodes (those of
    frames nested in it too) hold only reads and harmless stateful ops
    (:func:`_holds_only_reads`), and every resource entering it reaches only ops that read it
    (:data:`_READS_ONLY`).  Pure."""
    # RefEnter too: a ref variable assigned in the loop enters as one.
    enters = _frame_enters(g, frame)
    for name in enters:
        if g._node[name]["dtypes"].get("T") == dt.RESOURCE and not _reaches_only_reads(g, name):
            return False
    # A view, whose graph attributes (the signatures) are g's.
    return _holds_only_reads([g.subgraph(_frame_nodes(g, enters))], functions, registry)


def _reaches_only_reads(g: nx.MultiDiGraph, resource: str) -> bool:
    """Whether what node ``resource`` of ``g`` outputs (a resource handle) reaches only ops
    that read it (:data:`_READS_ONLY`), through the constant ``Enter`` ops that hand it on into
    nested frames (a variable read two loops deep enters twice).  Pure."""
    todo, seen = [resource], {resource}
    while todo:
        for dst, keyed in g._succ[todo.pop()].items():
            if any(e["dst_port"] != 0 for e in keyed.values()):
                return False
            data = g._node[dst]
            if data["op"] == _ENTER and bool_attr(data, "is_constant"):
                if dst not in seen:
                    seen.add(dst)
                    todo.append(dst)
            elif data["op"] not in _READS_ONLY:
                return False
    return True


def _frame_enters(g: nx.MultiDiGraph, frame: bytes) -> list[str]:
    """The ``Enter``/``RefEnter`` nodes of TensorFlow 1 loop ``frame`` in ``g``.  Pure."""
    return [n for n, d in g.nodes(data=True)
            if d["op"] in (_ENTER, "RefEnter") and bytes_attr(d, "frame_name") == frame]


def _enclosing_frames(g: nx.MultiDiGraph, frame: bytes) -> list[bytes]:
    """The TensorFlow 1 loops of ``g`` that ``frame`` is nested in (their nodes hold its
    ``Enter`` nodes).  Pure."""
    own = set(_frame_enters(g, frame))
    others = sorted({bytes_attr(d, "frame_name") for _, d in g.nodes(data=True)
                     if d["op"] in (_ENTER, "RefEnter")} - {frame, None})
    return [f for f in others if own & _frame_nodes(g, _frame_enters(g, f))]


def _frame_nodes(g: nx.MultiDiGraph, enters: list[str]) -> set[str]:
    """The nodes of ``g`` inside the TensorFlow 1 loop that ``enters`` (all its ``Enter``
    nodes) start, nested loops included: everything reachable from them (data and control
    edges) without leaving through the loop's own ``Exit``; an ``Enter`` goes one frame deeper,
    an ``Exit`` one out.  Pure."""
    depth = {name: 0 for name in enters}
    todo = list(enters)
    while todo:
        u = todo.pop()
        for v in g._succ[u]:
            op = g._node[v]["op"]
            d = depth[u] + (1 if op in ("Enter", "RefEnter") else -1 if op in ("Exit", "RefExit") else 0)
            if d < 0 or v in depth:
                continue
            depth[v] = d
            todo.append(v)
    return set(depth)


def _hoist_out_of_frame(g: nx.MultiDiGraph, gname: str, cast: str, enter: str, read: str | None, frame: bytes,
                        *, seq: int) -> HoistedCast:
    """Move inserted Cast ``cast`` (of ``enter``'s output, or of ``read`` of it) before
    ``enter``: a Cast (after a new read, for a resource) of what ``enter`` enters, and a new
    constant ``Enter`` of its result into the same frame, which ``cast``'s consumers read.
    **Mutates** ``g``."""
    cast_data, enter_data = g._node[cast], g._node[enter]
    (producer, port), = ir.data_inputs(g, enter)
    waits = ir.control_inputs(g, enter)
    order = (enter_data["order"][0], -_MOST_HOISTED + 3 * seq)
    if read is not None:
        read_data = g._node[read]
        new_read = _unique(g, f"{enter}/{_ARG_PREFIX}read")
        ir.add_node(g, new_read, op=_READ, device=read_data["device"], order=order,
                    dtypes={"dtype": read_data["dtypes"]["dtype"]})
        g._node[new_read]["dirty"] = True
        ir.add_data_edge(g, producer, port, new_read, 0, None)
        _add_control_inputs(g, new_read, waits)
        producer, port = new_read, 0
    low = cast_data["dtypes"]["DstT"]
    new_cast = _unique(g, f"{enter}/{_ARG_PREFIX}cast-CastTo-{dt.name(low)}-AutoMixedPrecision")
    ir.add_node(g, new_cast, op="Cast", device=cast_data["device"], order=(order[0], order[1] + 1),
                dtypes=dict(cast_data["dtypes"]))
    g._node[new_cast]["bools"] = dict(cast_data.get("bools", {"Truncate": False}))
    g._node[new_cast]["dirty"] = True
    ir.add_data_edge(g, producer, port, new_cast, 0, None)
    new_enter = _unique(g, f"{enter}/{_ARG_PREFIX}enter")
    ir.add_node(g, new_enter, op=_ENTER, device=enter_data["device"], order=(order[0], order[1] + 2),
                dtypes={"T": low})
    g._node[new_enter]["scalars"] = {"frame_name": frame, "is_constant": True,
                                     "parallel_iterations": int_attr(enter_data, "parallel_iterations") or 10}
    g._node[new_enter]["dirty"] = True
    ir.add_data_edge(g, new_cast, 0, new_enter, 0, None)
    if read is None:
        _add_control_inputs(g, new_enter, waits)
    for dst, keyed in list(g._succ[cast].items()):
        for edge in list(keyed.values()):
            ir.add_data_edge(g, new_enter, 0, dst, edge["dst_port"], None)
            g._node[dst]["dirty"] = True
            g._node[dst]["inputs_changed"] = True
    # The frame's own Enter and read stay, unused, where nothing else reads them: a
    # MetaGraphDef's while_context collection names them, and importing it looks them up
    # (a session runs only what its fetches need, so they cost nothing).
    g.remove_node(cast)
    what = ("the read of a variable entered as a constant" if read is not None
            else "a value entered as a constant (Enter with is_constant)")
    return HoistedCast(gname, frame.decode("utf-8", "replace"), "", cast, new_cast, None, what)


def _add_control_inputs(g: nx.MultiDiGraph, name: str, waits: list[str]) -> None:
    """Give new node ``name`` control inputs from ``waits``, in order.  **Mutates** ``g``."""
    for pos, ctrl in enumerate(waits):
        g.add_edge(ctrl, name, key=-1 - pos, src_port=CONTROL, dst_port=CONTROL, pos=pos, text=None)
