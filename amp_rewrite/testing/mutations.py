"""The structural mutations of :func:`~amp_rewrite.testing.fuzz.mutants`: each breaks one
thing in a drawn GraphDef (a dangling input, a duplicate name, a cycle, an attribute of the
wrong type, an unknown op, a malformed input string, a hostile name, ...), in place, and says
whether the graph is then certainly invalid and which names an error message should mention.

``_MUTATORS`` maps a mutation's name to its function.  The draws each makes, and their order,
are part of the fuzzer's inputs: Hypothesis replays saved and derandomized examples by them,
so a change of order changes what the ``ci`` profile tests.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from hypothesis import strategies as st

from .draw_ops import OPS
from .facts import parse_input


#: Malformed input strings (``{n}``: a node's name) for the "bad input string" mutation.
_BAD_INPUTS = ("", ":", "^", "^^{n}", "{n}:", ":0", "{n}:-1", "{n}:1.5", "{n}:99999999999999999999",
               "{n}:0:0", "{n}:out:0", " {n}", "{n} ", "{n}:0x1", "{n}:٣", "{n}/", "^{n}:0")

#: Names a hostile model uses to reach the terminal: escape sequences, line breaks, a bell.
HOSTILE_NAMES = ("Evil\x1b[2J", "Op\nWith\nLines", "\x07Bell", "Esc\x1b]0;title\x07", "Tab\tCR\r",
                 "Nul\x00Op", "\u202eRTL")


def _attr_garbage(draw: Any, value: Any) -> str:
    choice = draw(st.sampled_from(["i", "s", "f", "b", "shape", "list_i", "list_type", "type", "func", "tensor", "empty"]))
    if choice == "i":
        value.i = draw(st.integers(-2 ** 63, 2 ** 63 - 1))
    elif choice == "s":
        value.s = draw(st.binary(max_size=12))
    elif choice == "f":
        value.f = draw(st.floats(allow_nan=True, allow_infinity=True, width=32))
    elif choice == "b":
        value.b = draw(st.booleans())
    elif choice == "shape":
        value.shape.dim.add().size = draw(st.integers(-3, 3))
    elif choice == "list_i":
        value.list.i.extend(draw(st.lists(st.integers(-5, 5), max_size=3)))
    elif choice == "list_type":
        value.list.type.extend(draw(st.lists(st.sampled_from([1, 3, 19, 0, 100, 999]), max_size=3)))
    elif choice == "type":
        value.type = draw(st.sampled_from([0, 3, 7, 19, 21, 101, 999]))
    elif choice == "func":
        value.func.name = draw(st.sampled_from(["", "nope", "f"]))
    elif choice == "tensor":
        value.tensor.dtype = draw(st.sampled_from([1, 3, 0]))
    else:
        value.Clear()
    return choice


#: What a mutation returns: (the graph certainly fails, names the error should mention, detail).
_Outcome = tuple[bool, tuple[str, ...], str]


@dataclass
class _Site:
    """Where one structural mutation applies: ``draw`` (Hypothesis's draw function), the
    GraphDef ``gd`` (the mutation changes it in place), the ``node`` of ``gd`` drawn for the
    mutation, and ``names``, the node names as they were before any change."""

    draw: Any
    gd: Any
    node: Any
    names: list[str]


def _node_index(draw: Any, gd: Any, pred: Any = lambda n: True) -> int | None:
    """Draw the index of a node of ``gd`` that ``pred`` accepts; None (and no draw) when none does."""
    idx = [i for i, n in enumerate(gd.node) if pred(n)]
    return draw(st.sampled_from(idx)) if idx else None


def _mutate(draw: Any, gd: Any, kind: str) -> _Outcome:
    """Apply one structural mutation to ``gd`` (in place): (must fail, culprits, detail).

    Draws the node to mutate first, then whatever the mutation ``kind`` draws (see
    ``_MUTATORS``); a kind it does not know changes nothing."""
    names = [n.name for n in gd.node]
    i = _node_index(draw, gd)
    if i is None:
        return False, (), "no node to mutate"
    mutation = _MUTATORS.get(kind)
    if mutation is None:
        return False, (), ""
    return mutation(_Site(draw, gd, gd.node[i], names))


def _dangling_input(s: _Site) -> _Outcome:
    """An input (data or control) from a node that does not exist."""
    draw, node = s.draw, s.node
    ghost = draw(st.sampled_from(["ghost", "ghost:0", "ghost:1", "^ghost"]))
    if node.input and not ghost.startswith("^") and draw(st.booleans()):
        data_idx = [k for k, t in enumerate(node.input) if not t.startswith("^")]
        if data_idx:
            node.input[draw(st.sampled_from(data_idx))] = ghost
        else:
            node.input.append(ghost)
    else:
        node.input.append("^ghost")
    return True, (node.name, "ghost"), ""


def _duplicate_name(s: _Site) -> _Outcome:
    """A second node with the node's name (a copy of it)."""
    s.gd.node.add().CopyFrom(s.node)
    return True, (s.node.name,), ""


def _close_cycle(s: _Site, self_loop: bool) -> _Outcome:
    """A control edge that closes a cycle: from a consumer back to its producer, or (for
    ``self_loop``, or when no node has a data input) from the node to itself.  The consumer
    is drawn in both cases, so a self loop draws what a cycle draws."""
    draw, gd, node = s.draw, s.gd, s.node
    j = _node_index(draw, gd, lambda n: n.op != "NextIteration" and any(not t.startswith("^") for t in n.input))
    if j is None or self_loop:
        node.input.append("^" + node.name)
        # A NextIteration may close a cycle (that is a loop's back edge).
        culprits = (node.name,) if node.op != "NextIteration" else ()
    else:
        consumer = gd.node[j]
        producer = parse_input(next(t for t in consumer.input if not t.startswith("^")))[0]
        p = next((n for n in gd.node if n.name == producer), None)
        if p is None:  # an earlier mutation renamed or removed it: the node closes a self loop
            node.input.append("^" + node.name)
            culprits = (node.name,) if node.op != "NextIteration" else ()
        else:
            p.input.append("^" + consumer.name)
            culprits = (producer, consumer.name)
            if p.op == "NextIteration":
                culprits = ()
    return bool(culprits), culprits, ""


def _wrong_attr_type(s: _Site) -> _Outcome:
    """An attribute of the node set to a value of a drawn (mostly wrong) type."""
    detail = ""
    if s.node.attr:
        key = s.draw(st.sampled_from(sorted(s.node.attr)))
        detail = f"{key}: {_attr_garbage(s.draw, s.node.attr[key])}"
    return False, (), detail


def _removed_attr(s: _Site) -> _Outcome:
    """An attribute of the node deleted."""
    detail = ""
    if s.node.attr:
        key = s.draw(st.sampled_from(sorted(s.node.attr)))
        del s.node.attr[key]
        detail = key
    return False, (), detail


def _unknown_op(s: _Site) -> _Outcome:
    """The node's op renamed to one TensorFlow does not know."""
    s.node.op = s.draw(st.sampled_from(["NoSuchOp", "", "matmul", "MatMul ", "Cast\x00", "ÜnknownOp"]))
    return False, (), s.node.op


def _other_op(s: _Site) -> _Outcome:
    """The node's op replaced by another real op (its attributes and inputs stay)."""
    s.node.op = s.draw(st.sampled_from(sorted(OPS) + ["Placeholder", "Const", "NoOp", "While", "Merge",
                                                      "PartitionedCall", "Switch", "Enter"]))
    return False, (), s.node.op


def _bad_input_string(s: _Site) -> _Outcome:
    """A malformed input string (from ``_BAD_INPUTS``) replacing or added to the inputs."""
    draw, node = s.draw, s.node
    template = draw(st.sampled_from(_BAD_INPUTS))
    other = draw(st.sampled_from(s.names))
    text = template.replace("{n}", other)
    if node.input and draw(st.booleans()):
        node.input[draw(st.integers(0, len(node.input) - 1))] = text
    else:
        node.input.append(text)
    return False, (), text


def _control_before_data(s: _Site) -> _Outcome:
    """A control input put before the node's data inputs (when it has any)."""
    data_idx = [k for k, t in enumerate(s.node.input) if not t.startswith("^")]
    if data_idx:
        s.node.input.insert(0, "^" + s.draw(st.sampled_from(s.names)))
        return True, (s.node.name,), ""
    return False, (), ""


def _port_out_of_range(s: _Site) -> _Outcome:
    """An input from an output port the producer does not have."""
    draw, node = s.draw, s.node
    other = draw(st.sampled_from(s.names))
    port = draw(st.sampled_from([57, 1000, 2 ** 31 - 1, 2 ** 31, 2 ** 40]))
    node.input.append(f"{other}:{port}")
    culprits = (node.name, other)
    if any(t.startswith("^") for t in list(node.input)[:-1]):
        culprits = (node.name,)
    return True, culprits, ""


def _empty_name(s: _Site) -> _Outcome:
    """The node's name emptied."""
    s.node.name = ""
    return True, (), ""


def _extra_input(s: _Site) -> _Outcome:
    """One more data input, first, that the op does not take."""
    s.node.input.insert(0, s.draw(st.sampled_from(s.names)))
    return False, (), s.node.input[0]


def _bad_device(s: _Site) -> _Outcome:
    """A malformed or impossible device string."""
    s.node.device = s.draw(st.sampled_from(["/device:GPU:*", "/device:GPU", "gpu", "/job:x/device:TPU:0",
                                            "/device:XLA_GPU:0", "garbage", "/device:GPU:99999999999999",
                                            "/device:CPU:0/device:GPU:0", "\x00", "/job:/replica:x/task:y"]))
    return False, (), s.node.device


def _function_library(s: _Site) -> _Outcome:
    """One function of the library broken (see ``_break_function``), or a stub function added
    when there is none."""
    lib = s.gd.library
    if lib.function:
        f = lib.function[s.draw(st.integers(0, len(lib.function) - 1))]
        return False, (), _break_function(s.draw, lib, f)
    fd = lib.function.add()
    fd.signature.name = s.draw(st.sampled_from(["f", "", "MatMul"]))
    return False, (), "stub function"


def _break_function(draw: Any, lib: Any, f: Any) -> str:
    """Break function ``f`` of ``lib`` in one drawn way (in place); return the way's name.  A
    way that does not apply to ``f`` (no return values, say) changes nothing."""
    what = draw(st.sampled_from(["ret", "input", "duplicate", "rename", "arg type", "parametrize",
                                 "node op", "control_ret"]))
    if what == "ret" and f.ret:
        f.ret[sorted(f.ret)[0]] = draw(st.sampled_from(["nope:out:0", "", "a0", "x:y:z:w"]))
    elif what == "input" and f.node_def:
        f.node_def[0].input.append(draw(st.sampled_from(["nope", "nope:out:0", "^nope", ":"])))
    elif what == "duplicate":
        lib.function.add().CopyFrom(f)
    elif what == "rename":
        f.signature.name = draw(st.sampled_from(["", "MatMul", "other_fn"]))
    elif what == "arg type" and f.signature.input_arg:
        f.signature.input_arg[0].type = draw(st.sampled_from([0, 3, 19, 999]))
    elif what == "parametrize" and f.signature.input_arg:
        f.signature.input_arg[0].type_attr = "T"
    elif what == "node op" and f.node_def:
        f.node_def[0].op = draw(st.sampled_from(["NoSuchOp", "MatMul", f.signature.name]))
    elif what == "control_ret":
        f.control_ret["x"] = "nope"
    return what


def _next_iteration(s: _Site) -> _Outcome:
    """The node turned into a NextIteration (a loop's back edge outside any loop)."""
    s.node.op = "NextIteration"
    return False, (), "turned into NextIteration"


def _recursive_library(s: _Site) -> _Outcome:
    """One to three functions that call each other in a cycle, sometimes called from the graph."""
    draw, gd = s.draw, s.gd
    names_cycle = draw(st.sampled_from([("rec_f",), ("rec_f", "rec_g"), ("rec_f", "rec_g", "rec_h")]))
    for k, fname in enumerate(names_cycle):
        _add_calling_function(gd, fname, names_cycle[(k + 1) % len(names_cycle)])
    if draw(st.booleans()):
        _add_main_call(gd, names_cycle[0])
    return True, names_cycle, f"{len(names_cycle)} function(s) in a cycle"


def _deep_call_chain(s: _Site) -> _Outcome:
    """A chain of nested calls deeper than the product's limit, called from the graph."""
    from ..graph.io import MAX_CALL_DEPTH

    depth = MAX_CALL_DEPTH + s.draw(st.integers(1, 40))
    for k in range(depth):
        _add_calling_function(s.gd, f"chain_{k}", f"chain_{k + 1}" if k + 1 < depth else None)
    _add_main_call(s.gd, "chain_0")
    return True, ("chain_0",), f"{depth} nested calls"


def _hostile_name(s: _Site) -> _Outcome:
    """A name from ``HOSTILE_NAMES`` as the node's op, a function's name or the node's device."""
    draw, node = s.draw, s.node
    hostile = draw(st.sampled_from(HOSTILE_NAMES))
    where = draw(st.sampled_from(["op", "function", "device"]))
    if where == "op":
        node.op = hostile  # an unknown op: kept float32, with a warning naming it
    elif where == "function":
        _add_calling_function(s.gd, hostile, None)
    else:
        node.device = hostile
    return False, (), f"{where} {hostile!r}"


#: The structural mutations by name (the names of ``fuzz._STRUCTURAL``).
_MUTATORS: dict[str, Callable[[_Site], _Outcome]] = {
    "dangling input": _dangling_input,
    "duplicate name": _duplicate_name,
    "cycle": functools.partial(_close_cycle, self_loop=False),
    "self loop": functools.partial(_close_cycle, self_loop=True),
    "wrong attr type": _wrong_attr_type,
    "removed attr": _removed_attr,
    "unknown op": _unknown_op,
    "other op": _other_op,
    "bad input string": _bad_input_string,
    "control before data": _control_before_data,
    "port out of range": _port_out_of_range,
    "empty name": _empty_name,
    "extra input": _extra_input,
    "bad device": _bad_device,
    "function library": _function_library,
    "next iteration": _next_iteration,
    "recursive library": _recursive_library,
    "deep call chain": _deep_call_chain,
    "hostile name": _hostile_name,
}


def _add_calling_function(gd: Any, name: str, callee: str | None) -> None:
    """Add to ``gd``'s library a float32 function ``name``(x) that returns ``callee(x)``
    (a PartitionedCall), or ``Identity(x)`` when ``callee`` is ``None``."""
    from tensorflow.core.framework import types_pb2

    fd = gd.library.function.add()
    fd.signature.name = name
    arg = fd.signature.input_arg.add()
    arg.name, arg.type = "x", types_pb2.DT_FLOAT
    out = fd.signature.output_arg.add()
    out.name, out.type = "y", types_pb2.DT_FLOAT
    body = fd.node_def.add()
    body.name = "body"
    body.input.append("x")
    if callee is None:
        body.op = "Identity"
        body.attr["T"].type = types_pb2.DT_FLOAT
        fd.ret["y"] = "body:output:0"
    else:
        body.op = "PartitionedCall"
        body.attr["Tin"].list.type.append(types_pb2.DT_FLOAT)
        body.attr["Tout"].list.type.append(types_pb2.DT_FLOAT)
        body.attr["f"].func.name = callee
        fd.ret["y"] = "body:output:0"


def _add_main_call(gd: Any, callee: str) -> None:
    """Add a main-graph PartitionedCall of ``callee`` on a new float32 placeholder."""
    from tensorflow.core.framework import types_pb2

    taken = {n.name for n in gd.node}
    name = "fuzz_call"
    while name in taken or name + "_x" in taken:
        name += "_"
    x = gd.node.add()
    x.name, x.op = name + "_x", "Placeholder"
    x.attr["dtype"].type = types_pb2.DT_FLOAT
    call = gd.node.add()
    call.name, call.op = name, "PartitionedCall"
    call.input.append(x.name)
    call.attr["Tin"].list.type.append(types_pb2.DT_FLOAT)
    call.attr["Tout"].list.type.append(types_pb2.DT_FLOAT)
    call.attr["f"].func.name = callee
