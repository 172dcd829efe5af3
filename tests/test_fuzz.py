"""The fuzzed boundary: mutated and garbage inputs reach the public API and the CLI, and the
only thing that may come out is the product's own error -- ``AmpRewriteError`` from the API,
exit status 1 with a one-line message from the CLI -- naming the problem.

Mutations (``amp_rewrite.testing.MUTATIONS``): random bytes, truncated and flipped
serializations, dangling inputs, duplicate names, cycles, attributes of the wrong type,
removed attributes, unknown and swapped ops, malformed input strings, control inputs before
data inputs, ports out of range, empty names, broken function libraries, text-format
garbage, and several of these at once.  The deep profile runs >= 10,000 inputs in all.

Two core issues found here (a NUL byte, a line break in a list path) are fixed; the
regression tests at the bottom keep them fixed, and explicit examples keep the inputs that
found them.
"""

from __future__ import annotations

import tempfile

import pytest
import tensorflow as tf
from hypothesis import example, given, settings, strategies as st

from amp_rewrite.testing import (
    GraphCase,
    Mutant,
    check_api_boundary,
    check_cli_boundary,
    graphs,
    mutants,
    rewrite_options,
)
from conftest import examples

SMALL = graphs(max_nodes=4, functions=True)


def _tiny() -> GraphCase:
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (8, 8), name="x")
        tf.identity(tf.matmul(x, x, name="mm"), name="out")
    return GraphCase.from_graph_def(g.as_graph_def(), description="x -> MatMul -> out")


TINY = _tiny()


@settings(max_examples=examples(1500, deep=5000))
@given(mutants())
@example(Mutant("random bytes", b"\x00\xff" * 40))
@example(Mutant("empty graph", b""))
@example(Mutant("truncated", b"\n\x05\n\x01x\x12"))
def test_mutated_graphs_get_only_the_products_error_from_the_api(mutant):
    check_api_boundary(mutant)


@settings(max_examples=examples(400, deep=2000))
@given(SMALL, rewrite_options())
@example(TINY, {"use_env": False, "target": "gpu:8.0", "precision": "bfloat16", "lists": "\x00", "exclude": "("})
def test_garbage_options_get_only_the_products_error_from_the_api(case, options):
    check_api_boundary(Mutant("unchanged", case.graph_def.SerializeToString()), **options)


@settings(max_examples=examples(400, deep=2000))
@given(mutants())
def test_mutated_graph_files_get_one_line_from_the_cli(mutant):
    with tempfile.TemporaryDirectory() as directory:
        check_cli_boundary(mutant, directory)


_CLI_VALUES = st.one_of(st.sampled_from(["gpu:8.0", "cpu", "gpu:", "x", "", "nope", "(", "MatMul", "NotAnOp",
                                         "tensorflow", "../lists", "UNSAFE_FORCE_ALL", "x_0:0", "^x_0",
                                         "a\nb.toml"]),
                        st.text(max_size=8))
_CLI_FLAGS = ("--target", "--lists", "--fetch", "--exclude", "--deny", "--allow", "--remove-clear", "--level",
              "--lists-file", "--report")


@settings(max_examples=examples(300, deep=1000))
@given(SMALL, st.lists(st.tuples(st.sampled_from(_CLI_FLAGS), _CLI_VALUES), max_size=3))
@example(TINY, [("--lists-file", "\x1e")])  # not a line break for a terminal: one line
@example(TINY, [("--lists-file", "a\nb")])  # found a two-line message (fixed)
def test_garbage_cli_options_get_one_line_from_the_cli(case, flags):
    # Command-line arguments cannot hold NUL bytes.
    args = [f"{flag}={value}" for flag, value in flags if "\x00" not in value]
    with tempfile.TemporaryDirectory() as directory:
        args = [a.replace("--report=", f"--report={directory}/") for a in args]
        check_cli_boundary(Mutant("unchanged", case.graph_def.SerializeToString()), directory, args)


# ----------------------------------------------------------------------------------------
# Regressions: core issues found by this fuzzing, now fixed.


# A NUL byte in a list path once let os.stat's ValueError escape instead of an AmpRewriteError.
@pytest.mark.parametrize("options", [{"lists": "\x00"}, {"lists": "a\x00b.toml"}, {"lists_file": "x\x00.toml"}])
def test_regression_nul_byte_in_a_list_path(options):
    check_api_boundary(Mutant("unchanged", TINY.graph_def.SerializeToString()), **options)


# A line break in a list path once split the CLI's error over two lines (paths are now quoted).
@pytest.mark.parametrize("flag", ["--lists-file=a\nb", "--lists=a\nb.toml"])
def test_regression_line_break_in_a_list_path(flag):
    with tempfile.TemporaryDirectory() as directory:
        check_cli_boundary(Mutant("unchanged", TINY.graph_def.SerializeToString()), directory, [flag])
