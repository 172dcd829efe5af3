"""The fuzzed boundary: mutated and garbage inputs reach the public API and the CLI, and the
only thing that may come out is the product's own error -- ``AmpRewriteError`` from the API,
exit status 1 with a one-line message from the CLI -- naming the problem.

Mutations (``amp_rewrite.testing.MUTATIONS``): random bytes, truncated and flipped
serializations, dangling inputs, duplicate names, cycles, attributes of the wrong type,
removed attributes, unknown and swapped ops, malformed input strings, control inputs before
data inputs, ports out of range, empty names, broken function libraries, text-format
garbage, recursive and too-deep function libraries, hostile terminal strings (escape
sequences, line breaks) in op, function and device names, and several of these at once;
options of the wrong type; and SavedModels carrying links that leave the model, links to
devices, loops and special files.  The deep profile runs >= 10,000 inputs in all.

Two core issues found here (a NUL byte, a line break in a list path) are fixed; the
regression tests at the bottom keep them fixed, and explicit examples keep the inputs that
found them.
"""

from __future__ import annotations

import functools
import os
import stat
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


# Under the ci profile hypothesis is derandomized: every run tries the same inputs, so CI's
# counts keep what earlier runs found fixed, and new inputs come from the deep profile.
@settings(max_examples=examples(600, deep=5000))
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


@settings(max_examples=examples(200, deep=2000))
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


@settings(max_examples=examples(150, deep=1000))
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


# ---------------------------------------------------------------- hostile SavedModel layouts

_SECRET = b"secret outside the model\n"


@functools.lru_cache(maxsize=1)
def _base_saved_model() -> str:
    """A small TF2 SavedModel (a MatMul), saved once per process."""
    directory = tempfile.mkdtemp(prefix="amp_fuzz_sm_")

    class Tiny(tf.Module):
        def __init__(self) -> None:
            self.w = tf.Variable(tf.ones((8, 8)))

        @tf.function(input_signature=[tf.TensorSpec((2, 8), tf.float32)])
        def __call__(self, x):
            return tf.matmul(x, self.w)

    path = os.path.join(directory, "model")
    tf.saved_model.save(Tiny(), path)
    return path


#: Entries a hostile SavedModel may carry: links leaving the model (to a file, a directory,
#: the root, an endless device), absolute links, dangling links and loops, special files.
_LAYOUT_ENTRIES = ("link to outside file", "link to outside dir", "link to root", "link to /dev/zero",
                   "absolute link inside", "relative link inside", "dangling link", "link loop",
                   "fifo", "link out and back", "nested dir")


def _plant(model: str, outside: str, kind: str, where: str) -> None:
    target_dir = os.path.join(model, where)
    os.makedirs(target_dir, exist_ok=True)
    path = os.path.join(target_dir, "entry")
    if kind == "link to outside file":
        os.symlink(os.path.join(outside, "secret.txt"), path)
    elif kind == "link to outside dir":
        os.symlink(outside, path)
    elif kind == "link to root":
        os.symlink("/", path)
    elif kind == "link to /dev/zero":
        os.symlink("/dev/zero", path)
    elif kind == "absolute link inside":
        os.symlink(os.path.join(model, "saved_model.pb"), path)
    elif kind == "relative link inside":
        os.symlink(os.path.relpath(os.path.join(model, "saved_model.pb"), target_dir), path)
    elif kind == "dangling link":
        os.symlink("nowhere/at/all", path)
    elif kind == "link loop":
        os.symlink("entry", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "link out and back":
        os.symlink(os.path.join("..", "..", os.path.basename(model), "saved_model.pb")
                   if where.count("/") == 0 else "../../../saved_model.pb", path)
    elif kind == "nested dir":
        os.makedirs(os.path.join(path, "deeper"), exist_ok=True)
        with open(os.path.join(path, "deeper", "data"), "wb") as f:
            f.write(b"plain data")


@settings(max_examples=examples(25, deep=600))
@given(st.lists(st.tuples(st.sampled_from(_LAYOUT_ENTRIES),
                          st.sampled_from(["assets", "assets.extra", "variables", "assets/sub"])),
                min_size=1, max_size=3, unique_by=lambda t: t[1]))
def test_hostile_saved_model_layouts_are_refused_or_copied_safely(entries):
    """A SavedModel with links and special files: the CLI refuses it in one line, or writes
    an output with no link leaving it, no special file, and nothing read from outside."""
    import io
    import shutil
    import contextlib as _contextlib

    from amp_rewrite.cli import main

    work = tempfile.mkdtemp(prefix="amp_fuzz_layout_")
    try:
        model = os.path.join(work, "model")
        shutil.copytree(_base_saved_model(), model)
        outside = os.path.join(work, "outside")
        os.makedirs(outside)
        with open(os.path.join(outside, "secret.txt"), "wb") as f:
            f.write(_SECRET)
        for kind, where in entries:
            _plant(model, outside, kind, where)
        out_dir = os.path.join(work, "out")
        err, out = io.StringIO(), io.StringIO()
        with _contextlib.redirect_stderr(err), _contextlib.redirect_stdout(out):
            code = main(["rewrite", model, out_dir, "--target=gpu:8.0", "-q"])
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        assert code in (0, 1), (code, lines)
        if code == 1:
            assert len(lines) == 1 and lines[0].startswith("amp-rewrite: error: "), lines
            assert not os.path.exists(out_dir)
            return
        real_out = os.path.realpath(out_dir)
        for root, dirs, files in os.walk(out_dir):
            for name in dirs + files:
                p = os.path.join(root, name)
                st_mode = os.lstat(p).st_mode
                if stat.S_ISLNK(st_mode):
                    resolved = os.path.realpath(p)
                    assert resolved == real_out or resolved.startswith(real_out + os.sep), (p, resolved)
                else:
                    assert stat.S_ISREG(st_mode) or stat.S_ISDIR(st_mode), p
                    if stat.S_ISREG(st_mode) and os.path.getsize(p) == len(_SECRET):
                        with open(p, "rb") as f:
                            assert f.read() != _SECRET, p
    finally:
        shutil.rmtree(work, ignore_errors=True)


@settings(max_examples=5, deadline=None)
@given(st.data())
def test_a_cycle_through_a_producer_an_earlier_mutation_removed_is_a_self_loop(data):
    """Regression (deep run, 2026-11-27): mutations apply one after another, and closing a
    cycle looked up the producer a consumer names, which an earlier mutation may have renamed
    away; the drawing itself then failed.  The node closes a self loop instead."""
    from amp_rewrite.testing.mutations import _close_cycle, _Site

    gd = tf.compat.v1.GraphDef()
    gd.node.add(name="a", op="Placeholder").attr["dtype"].type = tf.float32.as_datatype_enum
    gd.node.add(name="b", op="Identity", input=["gone"]).attr["T"].type = tf.float32.as_datatype_enum
    must_fail, culprits, _ = _close_cycle(_Site(data.draw, gd, gd.node[0], ["a", "b"]), self_loop=False)
    assert must_fail and culprits == ("a",)
    assert list(gd.node[0].input) == ["^a"] and list(gd.node[1].input) == ["gone"]
