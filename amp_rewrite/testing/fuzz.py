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

from .mutations import _MUTATORS, HOSTILE_NAMES, _mutate  # noqa: F401  (HOSTILE_NAMES: importable from here)
from .strategies import graphs

__all__ = ["Mutant", "base_graphs", "mutants", "rewrite_options", "check_api_boundary", "check_cli_boundary",
           "MUTATIONS"]


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


_STRUCTURAL = ("dangling input", "duplicate name", "cycle", "self loop", "wrong attr type", "removed attr",
               "unknown op", "other op", "bad input string", "control before data", "port out of range",
               "empty name", "extra input", "bad device", "function library", "next iteration",
               "recursive library", "deep call chain", "hostile name")
MUTATIONS = ("random bytes", "truncated", "flipped bytes", *_STRUCTURAL, "text", "empty graph", "several")
assert set(_STRUCTURAL) == set(_MUTATORS), set(_STRUCTURAL) ^ set(_MUTATORS)


def _graph_def_class() -> Any:
    from tensorflow.core.framework import graph_pb2

    return graph_pb2.GraphDef


def _copy(gd: Any) -> Any:
    out = _graph_def_class()()
    out.CopyFrom(gd)
    return out


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


def base_graphs() -> st.SearchStrategy[Any]:
    """The graphs :func:`mutants` mutates by default: small graphs with loops, calls, control
    edges and several devices (``bench/hunt_aborts.py`` flips every byte of some)."""
    from .strategies import MULTI_DEVICES

    return graphs(max_nodes=6, while_loops=True, functions=True, devices=MULTI_DEVICES, body_nodes=2)


def mutants(base: st.SearchStrategy[Any] | None = None) -> st.SearchStrategy[Mutant]:
    """Draw a :class:`Mutant` of a graph drawn from ``base`` (default: :func:`base_graphs`)."""
    return _mutant(base_graphs() if base is None else base)


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
