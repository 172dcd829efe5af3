"""The amp-rewrite command: rewrite, lists, demo, errors and atomic output."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import tensorflow as tf

from amp_rewrite.cli import main
from graphs import graph_def, v1


@pytest.fixture()
def pb(tmp_path):
    def build():
        x = v1.placeholder(tf.float32, (4, 4), name="x")
        tf.identity(tf.nn.softmax(tf.matmul(x, x, name="mm"), name="sm"), name="out")

    path = tmp_path / "in.pb"
    path.write_bytes(graph_def(build).SerializeToString())
    return path


def test_rewrite_writes_graph_and_report(pb, tmp_path, capsys):
    out, report = tmp_path / "out.pb", tmp_path / "r.json"
    assert main(["rewrite", str(pb), str(out), "--target", "gpu:8.0", "--report", str(report)]) == 0
    assert "converted 1 of" in capsys.readouterr().out
    data = json.loads(report.read_text())
    assert data["nodes"]["mm"]["dtype"] == "float16" and data["nodes"]["sm"]["color"] == "deny"
    gd = tf.compat.v1.GraphDef.FromString(out.read_bytes())
    assert next(n for n in gd.node if n.name == "mm").attr["T"].type == tf.float16.as_datatype_enum


def test_rewrite_text_output_and_list_overrides(pb, tmp_path):
    out = tmp_path / "out.pbtxt"
    assert main(["rewrite", str(pb), str(out), "--target", "gpu:8.0", "--remove-allow", "MatMul", "-q"]) == 0
    assert "DT_HALF" not in out.read_text()


def test_rewrite_refuses_to_overwrite(pb, tmp_path, capsys):
    assert main(["rewrite", str(pb), str(pb), "--target", "gpu:8.0"]) == 1
    assert "same file" in capsys.readouterr().err
    out = tmp_path / "exists.pb"
    out.write_bytes(b"keep me")
    assert main(["rewrite", str(pb), str(out), "--target", "gpu:8.0"]) == 1
    assert out.read_bytes() == b"keep me"
    assert main(["rewrite", str(pb), str(out), "--target", "gpu:8.0", "--overwrite", "-q"]) == 0
    assert out.read_bytes() != b"keep me"


def test_bad_input_is_one_line_and_leaves_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.pb"
    bad.write_bytes(b"\x00garbage\xff" * 10)
    out = tmp_path / "out.pb"
    assert main(["rewrite", str(bad), str(out), "--target", "gpu:8.0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("amp-rewrite: error:") and err.count("\n") == 1
    assert not out.exists() and list(tmp_path.iterdir()) == [bad]


def test_lists_command_prints_effective_lists(capsys):
    assert main(["lists", "--lists", "tensorflow", "--target", "gpu:8.0", "--deny", "Tanh"]) == 0
    text = capsys.readouterr().out
    deny = text.split("[deny]")[1].split("[clear]")[0]
    assert "Tanh" in deny and "Exp" in deny


def test_demo_runs_as_a_module():
    proc = subprocess.run([sys.executable, "-m", "amp_rewrite", "demo"], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "converted" in proc.stdout and "max relative difference vs float32" in proc.stdout
