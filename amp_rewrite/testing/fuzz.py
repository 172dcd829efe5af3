"""The fuzzed boundary: mutated and garbage inputs for the public API and the CLI.

:func:`mutants` draws a :class:`Mutant`: the bytes of a drawn graph after one mutation
(random bytes, truncation, flipped bytes, a dangling input, a duplicate node name, a cycle,
an attribute of the wrong type, an unknown op, a malformed input string, ...) and, when the
mutation makes the graph certainly invalid, the names an error message should mention.
:func:`rewrite_options` draws keyword arguments for ``rewrite_graph_def``, valid or not.

:func:`check_api_boundary` and :func:`check_cli_boundary` feed one mutant through the API or
the ``amp-rewrite rewrite`` command and raise ``AssertionError`` unless the only failure is
the product's own error (:class:`amp_rewrite.AmpRewriteError`, exit status 1 with a one-line
message) naming the problem.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from hypothesis import strategies as st

from .facts import parse_input
from .strategies import OPS, graphs

__all__ = ["Mutant", "mutants", "rewrite_options", "check_api_boundary", "check_cli_boundary", "MUTATIONS"]


@dataclass(frozen=True)
class Mutant:
    """One fuzzed input: ``data`` (binary GraphDef or, when ``text``, pbtxt), how it was made."""

    kind: str
    data: bytes
    must_fail: bool = False
    culprits: tuple[str, ...] = ()
    text: bool = False
    detail: str = ""

    def __repr__(self) -> str:
        return (f"Mutant(kind={self.kind!r}, detail={self.detail!r}, must_fail={self.must_fail}, "
                f"culprits={self.culprits!r}, {len(self.data)} bytes)")


_BAD_INPUTS = ("", ":", "^", "^^{n}", "{n}:", ":0", "{n}:-1", "{n}:1.5", "{n}:99999999999999999999",
               "{n}:0:0", "{n}:out:0", " {n}", "{n} ", "{n}:0x1", "{n}:٣", "{n}/", "^{n}:0")

_STRUCTURAL = ("dangling input", "duplicate name", "cycle", "self loop", "wrong attr type", "removed attr",
               "unknown op", "other op", "bad input string", "control before data", "port out of range",
               "empty name", "extra input", "bad device", "function library", "next iteration",
               "recursive library", "deep call chain", "hostile name")
MUTATIONS = ("random bytes", "truncated", "flipped bytes", *_STRUCTURAL, "text", "empty graph", "several")

#: Names a hostile model uses to reach the terminal: escape sequences, line breaks, a bell.
HOSTILE_NAMES = ("Evil\x1b[2J", "Op\nWith\nLines", "\x07Bell", "Esc\x1b]0;title\x07", "Tab\tCR\r",
                 "Nul\x00Op", "\u202eRTL")


def _graph_def_class() -> Any:
    from tensorflow.core.framework import graph_pb2

    return graph_pb2.GraphDef


def _copy(gd: Any) -> Any:
    out = _graph_def_class()()
    out.CopyFrom(gd)
    return out


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


def _mutate(draw: Any, gd: Any, kind: str) -> tuple[bool, tuple[str, ...], str]:
    """Apply one structural mutation to ``gd`` (in place): (must fail, culprits, detail)."""
    names = [n.name for n in gd.node]

    def node_index(pred: Any = lambda n: True) -> int | None:
        idx = [i for i, n in enumerate(gd.node) if pred(n)]
        return draw(st.sampled_from(idx)) if idx else None

    must_fail, culprits, detail = False, (), ""
    i = node_index()
    if i is None:
        return False, (), "no node to mutate"
    node = gd.node[i]
    if kind == "dangling input":
        ghost = draw(st.sampled_from(["ghost", "ghost:0", "ghost:1", "^ghost"]))
        if node.input and not ghost.startswith("^") and draw(st.booleans()):
            data_idx = [k for k, t in enumerate(node.input) if not t.startswith("^")]
            if data_idx:
                node.input[draw(st.sampled_from(data_idx))] = ghost
            else:
                node.input.append(ghost)
        else:
            node.input.append("^ghost")
        must_fail, culprits = True, (node.name, "ghost")
    elif kind == "duplicate name":
        gd.node.add().CopyFrom(node)
        must_fail, culprits = True, (node.name,)
    elif kind in ("cycle", "self loop"):
        j = node_index(lambda n: n.op != "NextIteration" and any(not t.startswith("^") for t in n.input))
        if j is None or kind == "self loop":
            node.input.append("^" + node.name)
            # A NextIteration may close a cycle (that is a loop's back edge).
            culprits = (node.name,) if node.op != "NextIteration" else ()
        else:
            consumer = gd.node[j]
            producer = parse_input(next(t for t in consumer.input if not t.startswith("^")))[0]
            p = next(n for n in gd.node if n.name == producer)
            p.input.append("^" + consumer.name)
            culprits = (producer, consumer.name)
            if p.op == "NextIteration":
                culprits = ()
        must_fail = bool(culprits)
    elif kind == "wrong attr type":
        if node.attr:
            key = draw(st.sampled_from(sorted(node.attr)))
            detail = f"{key}: {_attr_garbage(draw, node.attr[key])}"
    elif kind == "removed attr":
        if node.attr:
            key = draw(st.sampled_from(sorted(node.attr)))
            del node.attr[key]
            detail = key
    elif kind == "unknown op":
        node.op = draw(st.sampled_from(["NoSuchOp", "", "matmul", "MatMul ", "Cast\x00", "ÜnknownOp"]))
        detail = node.op
    elif kind == "other op":
        node.op = draw(st.sampled_from(sorted(OPS) + ["Placeholder", "Const", "NoOp", "While", "Merge",
                                                      "PartitionedCall", "Switch", "Enter"]))
        detail = node.op
    elif kind == "bad input string":
        template = draw(st.sampled_from(_BAD_INPUTS))
        other = draw(st.sampled_from(names))
        text = template.replace("{n}", other)
        if node.input and draw(st.booleans()):
            node.input[draw(st.integers(0, len(node.input) - 1))] = text
        else:
            node.input.append(text)
        detail = text
    elif kind == "control before data":
        data_idx = [k for k, t in enumerate(node.input) if not t.startswith("^")]
        if data_idx:
            node.input.insert(0, "^" + draw(st.sampled_from(names)))
            must_fail, culprits = True, (node.name,)
    elif kind == "port out of range":
        other = draw(st.sampled_from(names))
        port = draw(st.sampled_from([57, 1000, 2 ** 31 - 1, 2 ** 31, 2 ** 40]))
        node.input.append(f"{other}:{port}")
        must_fail, culprits = True, (node.name, other)
        if any(t.startswith("^") for t in list(node.input)[:-1]):
            culprits = (node.name,)
    elif kind == "empty name":
        node.name = ""
        must_fail = True
    elif kind == "extra input":
        node.input.insert(0, draw(st.sampled_from(names)))
        detail = node.input[0]
    elif kind == "bad device":
        node.device = draw(st.sampled_from(["/device:GPU:*", "/device:GPU", "gpu", "/job:x/device:TPU:0",
                                            "/device:XLA_GPU:0", "garbage", "/device:GPU:99999999999999",
                                            "/device:CPU:0/device:GPU:0", "\x00", "/job:/replica:x/task:y"]))
        detail = node.device
    elif kind == "function library":
        lib = gd.library
        if lib.function:
            f = lib.function[draw(st.integers(0, len(lib.function) - 1))]
            what = draw(st.sampled_from(["ret", "input", "duplicate", "rename", "arg type", "parametrize",
                                         "node op", "control_ret"]))
            detail = what
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
        else:
            fd = lib.function.add()
            fd.signature.name = draw(st.sampled_from(["f", "", "MatMul"]))
            detail = "stub function"
    elif kind == "next iteration":
        node.op = "NextIteration"
        detail = "turned into NextIteration"
    elif kind == "recursive library":
        names_cycle = draw(st.sampled_from([("rec_f",), ("rec_f", "rec_g"), ("rec_f", "rec_g", "rec_h")]))
        for k, fname in enumerate(names_cycle):
            _add_calling_function(gd, fname, names_cycle[(k + 1) % len(names_cycle)])
        if draw(st.booleans()):
            _add_main_call(gd, names_cycle[0])
        must_fail, culprits, detail = True, names_cycle, f"{len(names_cycle)} function(s) in a cycle"
    elif kind == "deep call chain":
        from ..graph.io import MAX_CALL_DEPTH

        depth = MAX_CALL_DEPTH + draw(st.integers(1, 40))
        for k in range(depth):
            _add_calling_function(gd, f"chain_{k}", f"chain_{k + 1}" if k + 1 < depth else None)
        _add_main_call(gd, "chain_0")
        must_fail, culprits, detail = True, ("chain_0",), f"{depth} nested calls"
    elif kind == "hostile name":
        hostile = draw(st.sampled_from(HOSTILE_NAMES))
        where = draw(st.sampled_from(["op", "function", "device"]))
        if where == "op":
            node.op = hostile  # an unknown op: kept float32, with a warning naming it
        elif where == "function":
            _add_calling_function(gd, hostile, None)
        else:
            node.device = hostile
        detail = f"{where} {hostile!r}"
    return must_fail, culprits, detail


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


@st.composite
def _mutant(draw: Any, base: st.SearchStrategy[Any]) -> Mutant:
    case = draw(base)
    gd = _copy(case.graph_def if hasattr(case, "graph_def") else case)
    kind = draw(st.sampled_from(MUTATIONS))

    def node_index(pred: Any = lambda n: True) -> int | None:
        idx = [i for i, n in enumerate(gd.node) if pred(n)]
        return draw(st.sampled_from(idx)) if idx else None

    if kind == "random bytes":
        return Mutant(kind, draw(st.binary(min_size=1, max_size=256)))
    if kind == "empty graph":
        return Mutant(kind, b"")
    if kind == "text":
        from google.protobuf import text_format

        data = text_format.MessageToString(gd)
        cut = draw(st.integers(0, len(data)))
        junk = draw(st.text(max_size=8))
        return Mutant(kind, (data[:cut] + junk + data[cut:]).encode("utf-8", "surrogatepass"), text=True,
                      detail=f"{junk!r} inserted at {cut}")
    serialized = gd.SerializeToString()
    if kind == "truncated":
        cut = draw(st.integers(0, max(0, len(serialized) - 1)))
        return Mutant(kind, serialized[:cut], detail=f"first {cut} of {len(serialized)} bytes")
    if kind == "flipped bytes":
        data = bytearray(serialized)
        for _ in range(draw(st.integers(1, 4))):
            if data:
                data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return Mutant(kind, bytes(data))

    if kind == "several":
        details = []
        for _ in range(draw(st.integers(2, 4))):
            sub = draw(st.sampled_from(_STRUCTURAL))
            details.append(f"{sub}: {_mutate(draw, gd, sub)[2]}")
        return Mutant(kind, gd.SerializeToString(), detail="; ".join(details))
    must_fail, culprits, detail = _mutate(draw, gd, kind)
    return Mutant(kind, gd.SerializeToString(), must_fail, culprits, False, detail)


def mutants(base: st.SearchStrategy[Any] | None = None) -> st.SearchStrategy[Mutant]:
    """Draw a :class:`Mutant` of a graph drawn from ``base`` (default: small graphs with
    loops, calls, control edges and several devices)."""
    if base is None:
        from .strategies import MULTI_DEVICES

        base = graphs(max_nodes=6, while_loops=True, functions=True, devices=MULTI_DEVICES, body_nodes=2)
    return _mutant(base)


_OP_NAMES = ("MatMul", "Tanh", "Exp", "Relu", "NotAnOp", "", "matmul", "Conv2D,Relu", " Sum ")


@st.composite
def rewrite_options(draw: Any) -> dict[str, Any]:
    """Keyword arguments for ``rewrite_graph_def``: mostly valid, sometimes garbage."""
    opts: dict[str, Any] = {"use_env": False}
    text = st.text(max_size=12)
    if draw(st.booleans()):
        opts["target"] = draw(st.one_of(
            st.sampled_from(["gpu:8.0", "gpu:7.0,6.1", "cpu", "gpu:", "gpu:x", "tpu", "gpu:8.0,", "GPU:8",
                             "gpu:99999999999999999999.0", "gpu:-1", "auto "]), text))
    else:
        opts["target"] = "gpu:8.0"
    if draw(st.integers(0, 4)) == 0:
        opts["precision"] = draw(st.one_of(st.sampled_from(["bfloat16", "float8", "FLOAT16", ""]), text))
    if draw(st.integers(0, 4)) == 0:
        opts["lists"] = draw(st.one_of(st.sampled_from(["tensorflow", "default", "nope", "../x", ""]), text))
    if draw(st.integers(0, 3)) == 0:
        opts["fetches"] = draw(st.lists(st.one_of(st.sampled_from(["x_0", "x_0:0", "^x_0", "x_0:9", ":"]), text),
                                        max_size=3))
    if draw(st.integers(0, 4)) == 0:
        opts["exclude"] = draw(st.one_of(st.sampled_from(["(", "x_.*", "[", "*", ""]), text))
    if draw(st.integers(0, 4)) == 0:
        category = draw(st.one_of(st.sampled_from(["allow", "infer", "deny", "clear", "white", ""]), text))
        opts[draw(st.sampled_from(["add", "remove"]))] = {
            category: draw(st.one_of(st.lists(st.sampled_from(_OP_NAMES), max_size=3), st.sampled_from(_OP_NAMES)))}
    if draw(st.integers(0, 5)) == 0:
        opts["level"] = draw(st.one_of(st.sampled_from(["DEFAULT", "UNSAFE_FORCE_ALL", "TREAT_INFER_AS_DENY",
                                                         "nope", ""]), text))
    if draw(st.integers(0, 5)) == 0:
        opts["functions"] = draw(st.sampled_from(["all", "reachable", "none", ""]))
    if draw(st.integers(0, 4)) == 0:
        opts["planner"] = draw(st.sampled_from(["greedy", "optimal", "min-casts", "best", ""]))
    if draw(st.integers(0, 9)) == 0:
        # A value of the wrong type: still only the product's own error.
        key = draw(st.sampled_from(["target", "precision", "lists", "lists_file", "level", "fetches",
                                    "add", "remove", "functions", "planner", "use_env",
                                    "tensorflow_bugs"]))
        opts[key] = draw(st.sampled_from([None, 5, 1.5, [1], b"x", {"a": 1}, ("x",), True]))
        if key in ("use_env", "tensorflow_bugs") and opts[key] in (True,):
            opts[key] = "yes"
    return opts


def _names_problem(message: str, mutant: Mutant) -> bool:
    if not message.strip():
        return False
    return not mutant.culprits or any(c in message for c in mutant.culprits)


def check_api_boundary(mutant: Mutant, **options: Any) -> str:
    """Rewrite ``mutant.data`` through the API.  Returns ``"accepted"`` or ``"rejected"``.

    Raises ``AssertionError`` when another exception than ``AmpRewriteError`` escapes, when a
    certainly invalid graph is accepted, or when the error message does not name the problem.
    """
    import amp_rewrite
    from amp_rewrite.errors import AmpRewriteError

    options.setdefault("use_env", False)
    options.setdefault("target", "gpu:8.0")
    try:
        if mutant.text:
            from google.protobuf import text_format

            gd = _graph_def_class()()
            try:
                text_format.Parse(mutant.data.decode("utf-8"), gd)
            except (text_format.ParseError, UnicodeDecodeError):
                return "rejected"  # not the API's business: the CLI reads text files
            amp_rewrite.rewrite_graph_def(gd, **options)
        else:
            amp_rewrite.rewrite_graph_def(mutant.data, **options)
    except AmpRewriteError as exc:
        message = str(exc)
        if not message.strip():
            raise AssertionError(f"{type(exc).__name__} with an empty message for {mutant!r}") from exc
        if mutant.must_fail and not _names_problem(message, mutant) and _default_options(options):
            raise AssertionError(f"the message {message!r} names none of {mutant.culprits} for {mutant!r}") from exc
        return "rejected"
    except Exception as exc:  # noqa: BLE001 - exactly what the boundary must not let out
        raise AssertionError(f"{type(exc).__name__} escaped the API for {mutant!r} with options "
                             f"{options!r}: {exc}") from exc
    if mutant.must_fail and _default_options(options):
        raise AssertionError(f"accepted a graph that is certainly invalid: {mutant!r}")
    return "accepted"


def _default_options(options: Mapping[str, Any]) -> bool:
    """Only then is the graph certainly what fails (garbage options may fail first)."""
    return set(options) <= {"use_env", "target"} and options.get("target") == "gpu:8.0"


def check_cli_boundary(mutant: Mutant, directory: str, extra_args: Sequence[str] = ()) -> int:
    """Run ``amp-rewrite rewrite IN OUT`` on ``mutant.data``; return its exit status.

    Raises ``AssertionError`` unless the command returns 0, or 1 with exactly one line on
    standard error that starts with ``amp-rewrite: error:``.
    """
    from amp_rewrite.cli import main

    suffix = ".pbtxt" if mutant.text else ".pb"
    src = os.path.join(directory, "in" + suffix)
    dst = os.path.join(directory, "out.pb")
    with open(src, "wb") as f:
        f.write(mutant.data)
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(["rewrite", src, dst, "--overwrite", "--target=gpu:8.0", *extra_args])
    except SystemExit as exc:
        raise AssertionError(f"the CLI exited with {exc.code!r} for {mutant!r}: {err.getvalue()!r}") from exc
    except Exception as exc:  # noqa: BLE001
        raise AssertionError(f"{type(exc).__name__} escaped the CLI for {mutant!r}: {exc}") from exc
    # Nothing from the input reaches the terminal raw: no escape sequence, bell or NUL.
    raw = [c for c in err.getvalue() + out.getvalue() if not c.isprintable() and c != "\n"]
    if raw:
        raise AssertionError(f"control characters {sorted(set(raw))!r} reached the terminal for {mutant!r}")
    # One line: no line break (str.splitlines would also split on \x1c-\x1e, \x85, ...).
    lines = [line for line in re.split(r"\r\n|\r|\n", err.getvalue()) if line]
    if code == 1:
        if len(lines) != 1 or not lines[0].startswith("amp-rewrite: error: ") or len(lines[0]) <= 20:
            raise AssertionError(f"exit 1 needs one message line, got {lines!r} for {mutant!r}")
        if mutant.must_fail and not mutant.text and not extra_args and not _names_problem(lines[0], mutant):
            raise AssertionError(f"the message {lines[0]!r} names none of {mutant.culprits} for {mutant!r}")
    elif code == 0:
        if mutant.must_fail and not mutant.text and not extra_args:
            raise AssertionError(f"the CLI accepted a graph that is certainly invalid: {mutant!r}")
    else:
        raise AssertionError(f"unexpected exit status {code!r} for {mutant!r}: {lines!r}")
    return code
