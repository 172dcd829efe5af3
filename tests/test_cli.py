"""The amp-rewrite command: rewrite, explain, lists, demo, errors and atomic output."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from amp_rewrite.cli import main
from graphs import SmallModule, graph_def, v1

GPU = ["--target", "gpu:8.0"]
CPU_BF16 = ["--target", "cpu", "--precision", "bfloat16"]


@pytest.fixture()
def pb(tmp_path):
    def build():
        x = v1.placeholder(tf.float32, (4, 4), name="x")
        tf.identity(tf.nn.softmax(tf.matmul(x, x, name="mm"), name="sm"), name="out")

    path = tmp_path / "in.pb"
    path.write_bytes(graph_def(build).SerializeToString())
    return path


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("cli") / "model"
    m = SmallModule()
    tf.saved_model.save(m, str(path), signatures={"serving_default": m.__call__})
    return path


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.err.startswith("amp-rewrite: error:"), captured.err
    assert captured.err.count("\n") == 1, captured.err
    assert "Traceback" not in captured.err
    return captured.err


# ------------------------------------------------------------------------------ rewrite


def test_rewrite_writes_graph_and_report(pb, tmp_path, capsys):
    out, report = tmp_path / "out.pb", tmp_path / "r.json"
    assert main(["rewrite", str(pb), str(out), *GPU, "--report", str(report)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("converted 1 of 4 nodes, 1 cast(s) to float16, 1 to float32")
    data = json.loads(report.read_text())
    assert data["format"] == "graph_def" and data["output"] == str(out)
    graph = data["graphs"][0]
    assert graph["nodes"]["mm"]["dtype"] == "float16" and graph["nodes"]["sm"]["color"] == "deny"
    gd = tf.compat.v1.GraphDef.FromString(out.read_bytes())
    assert next(n for n in gd.node if n.name == "mm").attr["T"].type == tf.float16.as_datatype_enum


def test_rewrite_text_output_and_list_overrides(pb, tmp_path):
    out = tmp_path / "out.pbtxt"
    assert main(["rewrite", str(pb), str(out), *GPU, "--remove-allow", "MatMul", "-q"]) == 0
    assert "DT_HALF" not in out.read_text() and "MatMul" in out.read_text()


def test_rewrite_saved_model_with_every_extra_output(saved, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["rewrite", str(saved), str(out), *CPU_BF16, "--report", str(tmp_path / "r.json"),
            "--graph", str(tmp_path / "g.html"), "--dump-dir", str(tmp_path / "dumps"),
            "--tensorboard", str(tmp_path / "tb")]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "cast(s) to bfloat16" in printed and f"wrote {out}" in printed
    assert json.loads((tmp_path / "r.json").read_text())["converted_nodes"] >= 2
    assert "<svg" in (tmp_path / "g.html").read_text()
    assert len(list((tmp_path / "dumps").iterdir())) == 3
    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == ["after", "before"]
    y = tf.saved_model.load(str(out)).signatures["serving_default"](x=np.ones((2, 8), np.float32))["y"]
    assert y.dtype == tf.float32 and y.shape == (2, 4)


def test_rewrite_says_when_nothing_could_be_done(pb, tmp_path, capsys):
    assert main(["rewrite", str(pb), str(tmp_path / "o.pb"), "--target", "gpu:6.1"]) == 0
    assert "nothing rewritten: no GPU can profit from float16" in capsys.readouterr().out


def test_rewrite_refuses_to_overwrite(pb, tmp_path, capsys):
    assert main(["rewrite", str(pb), str(pb), *GPU]) == 1
    assert "the input is never modified" in _one_error_line(capsys)
    out = tmp_path / "exists.pb"
    out.write_bytes(b"keep me")
    assert main(["rewrite", str(pb), str(out), *GPU]) == 1
    assert "pass --overwrite" in _one_error_line(capsys)
    assert out.read_bytes() == b"keep me"
    assert main(["rewrite", str(pb), str(out), *GPU, "--overwrite", "-q"]) == 0
    assert out.read_bytes() != b"keep me"


# ------------------------------------------------------------------------------ bad input


def _corrupt_saved_model(tmp: pathlib.Path) -> pathlib.Path:
    path = tmp / "corrupt"
    path.mkdir()
    (path / "saved_model.pb").write_bytes(b"\x12\x05short")
    return path


@pytest.mark.parametrize("case,message", [
    ("missing path", "no such file or directory"),
    ("directory that is not a SavedModel", "not a SavedModel"),
    ("corrupt saved_model.pb", "corrupt saved_model.pb"),
    ("random bytes as a GraphDef", "not a GraphDef"),
    ("unknown tag", "no meta graph has the tags 'train'"),
    ("unknown signature", "no signature 'predict'"),
    ("unknown op in --allow", "NotAnOp"),
    ("unwritable OUTPUT", "cannot write"),
    ("unknown --graph format", "unknown drawing format '.png'"),
    ("bad --exclude regex", "bad --exclude regular expression"),
])
def test_bad_input_is_one_line_exit_1_and_leaves_no_output(case, message, saved, tmp_path, capsys):
    out = tmp_path / "out"
    src, extra = str(saved), []
    if case == "missing path":
        src = str(tmp_path / "nope")
    elif case == "directory that is not a SavedModel":
        (tmp_path / "plain").mkdir()
        src = str(tmp_path / "plain")
    elif case == "corrupt saved_model.pb":
        src = str(_corrupt_saved_model(tmp_path))
    elif case == "random bytes as a GraphDef":
        (tmp_path / "bad.pb").write_bytes(bytes(np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8)))
        src, out = str(tmp_path / "bad.pb"), tmp_path / "out.pb"
    elif case == "unknown tag":
        extra = ["--tags", "train"]
    elif case == "unknown signature":
        extra = ["--signature", "predict"]
    elif case == "unknown op in --allow":
        extra = ["--allow", "MatMul,NotAnOp"]
    elif case == "unwritable OUTPUT":
        (tmp_path / "a_file").write_text("x")
        out = tmp_path / "a_file" / "out"
    elif case == "unknown --graph format":
        extra = ["--graph", str(tmp_path / "g.png")]
    elif case == "bad --exclude regex":
        extra = ["--exclude", "(unclosed"]
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["rewrite", src, str(out), *CPU_BF16, "--report", str(tmp_path / "r.json"), *extra]) == 1
    assert message in _one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "nothing may be left behind"


def test_a_real_process_prints_exactly_one_line(tmp_path):
    """TensorFlow's C++ start-up notices (written to fd 2) must not drown the error."""
    corrupt = _corrupt_saved_model(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "amp_rewrite", "rewrite", str(corrupt), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"amp-rewrite: error: {corrupt}: corrupt saved_model.pb")
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "out").exists()


def test_ctrl_c_exits_130_and_writes_nothing(saved, tmp_path, monkeypatch, capsys):
    from amp_rewrite.models import saved_model
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(saved_model, "_fingerprint", interrupted)
    assert main(["rewrite", str(saved), str(tmp_path / "out"), *CPU_BF16]) == 130
    assert capsys.readouterr().err == "amp-rewrite: interrupted; nothing was written\n"
    assert list(tmp_path.iterdir()) == []


def test_fetch_adds_to_the_preserved_outputs(pb, tmp_path):
    out = tmp_path / "out.pb"
    assert main(["rewrite", str(pb), str(out), *GPU, "--fetch", "mm", "--report", str(tmp_path / "r.json"), "-q"]) == 0
    nodes = json.loads((tmp_path / "r.json").read_text())["graphs"][0]["nodes"]
    assert nodes["mm"]["dtype"] == "float32" and "preserved" in nodes["out"]["reason"]


# ------------------------------------------------------------------------------ explain, lists


def test_explain_prints_list_pass_and_casts(saved, capsys):
    assert main(["explain", str(saved), "MatMul", *CPU_BF16]) == 0
    text = capsys.readouterr().out
    assert "MatMul is on the allow list" in text
    assert "decision:   allow, bfloat16" in text and "decided by: pass 1 (allow list)" in text
    assert "input cast:" in text and "in function __inference___call__" in text


def test_explain_unknown_node_suggests_close_names(saved, capsys):
    assert main(["explain", str(saved), "MatMull", *CPU_BF16]) == 1
    err = _one_error_line(capsys)
    assert "no node 'MatMull'" in err and "did you mean MatMul" in err


def test_lists_command_prints_effective_lists(capsys):
    assert main(["lists", "--lists", "tensorflow", "--target", "gpu:8.0", "--deny", "Tanh"]) == 0
    text = capsys.readouterr().out
    deny = text.split("[deny]")[1].split("[clear]")[0]
    assert "Tanh" in deny and "Exp" in deny
    assert "# planner greedy; a normalization's apply ops: float32 (TensorFlow's deny propagation)" in text
    assert "[identity]" not in text
    assert main(["lists", "--lists", "default", "--target", "gpu:8.0"]) == 0
    text = capsys.readouterr().out
    assert "a normalization's apply ops: fenced (a norm's statistics and the ops applying them" in text
    identity = text.split("[identity]")[1]
    assert "3 deny-list reductions cleared" in identity and "Sum" in identity


# ------------------------------------------------------------------------------ demo


def test_demo_runs_as_a_module(user_environ):
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "amp_rewrite", "demo"], capture_output=True, text=True,
                          timeout=600, env=user_environ)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert time.monotonic() - start < 60, "the demo should take well under 30 s on 2 cores"
    assert proc.stderr == "", "TensorFlow's start-up notices are kept off the terminal"
    out = proc.stdout
    for row in ("nodes converted", "casts inserted", "output difference", "step time (batch 64)"):
        assert row in out
    assert "rewritten (bfloat16)" in out or "rewritten (float16)" in out
    assert "same top-1 class" in out and " ms " in out


def test_rewrite_with_loss_scale_rewrites_a_training_meta_graph(tmp_path, capsys):
    import numpy as np

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (8, 4), name="x")
        w = tf.compat.v1.get_variable("w", (4, 1), initializer=tf.compat.v1.ones_initializer())
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0), name="loss")
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
        tf.compat.v1.add_to_collection("train_op", train_op)
        meta = tf.compat.v1.train.export_meta_graph()
    src, out, report = tmp_path / "train.meta", tmp_path / "out.meta", tmp_path / "r.json"
    src.write_bytes(meta.SerializeToString())
    assert main(["rewrite", str(src), str(out), "--loss-scale", "dynamic", "--target", "gpu:8.0",
                 "--report", str(report)]) == 0
    assert "loss scaling dynamic" in capsys.readouterr().out
    assert "training" in json.loads(report.read_text())
    g2 = tf.Graph()
    with g2.as_default():
        tf.compat.v1.train.import_meta_graph(str(out))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            feed = {"x:0": np.ones((8, 4), np.float32)}
            before = sess.run("loss:0", feed)
            for _ in range(5):
                sess.run(g2.get_operation_by_name("train"), feed)
            assert sess.run("loss:0", feed) < before
    assert main(["rewrite", str(tmp_path / "in.pb"), str(tmp_path / "o.pb"), "--loss-scale", "dynamic"]) == 1
    assert ".meta" in capsys.readouterr().err


def _tree(path: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("layout", ["report_is_a_dir", "report_in_new_output", "report_in_empty_output",
                                    "report_is_output"])
def test_outputs_that_collide_are_refused_before_anything_is_written(layout, saved, pb, tmp_path, capsys):
    out = tmp_path / "out"
    src, args = saved, []
    if layout == "report_is_a_dir":  # failed at commit, after the model had replaced OUTPUT
        out.mkdir()
        (out / "marker").write_text("the old output")
        (tmp_path / "rep").mkdir()
        report, args = tmp_path / "rep", ["--overwrite"]
    elif layout == "report_in_new_output":
        report = out / "r.json"
    elif layout == "report_in_empty_output":  # was reported written, and was never there
        out.mkdir()
        report = out / "r.json"
    else:  # a GraphDef OUTPUT that the report would have replaced, exit 0
        src, out = pb, tmp_path / "out.pb"
        report = out
    before = _tree(tmp_path)
    assert main(["rewrite", str(src), str(out), "--report", str(report), *args]) == 1
    assert "amp-rewrite: error:" in _one_error_line(capsys)
    assert _tree(tmp_path) == before  # nothing written, nothing replaced
    assert not [p for p in tmp_path.rglob(".amp-rewrite*")]
