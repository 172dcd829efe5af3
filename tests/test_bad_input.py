"""Bad input gets the product's own error, names the problem, and changes nothing."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import amp_rewrite
from amp_rewrite.errors import AmpRewriteError, GraphFormatError, InvalidGraphError, ListError
from graphs import graph_def, v1


def _small() -> tf.compat.v1.GraphDef:
    def build():
        x = v1.placeholder(tf.float32, (4, 4), name="x")
        tf.identity(tf.matmul(x, x, name="mm"), name="out")

    return graph_def(build)


def _rewrite(data, **kw):
    return amp_rewrite.rewrite_graph_def(data, target="gpu:8.0", use_env=False, **kw)


def test_random_bytes_are_not_a_graph():
    with pytest.raises(GraphFormatError, match="not a GraphDef"):
        _rewrite(bytes(np.random.default_rng(0).integers(0, 256, 200, dtype=np.uint8)))


def test_truncated_file(tmp_path):
    data = _small().SerializeToString()
    path = tmp_path / "g.pb"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(GraphFormatError):
        amp_rewrite.load_graph_def(path)


def test_text_file_that_is_not_a_graph(tmp_path):
    path = tmp_path / "g.pbtxt"
    path.write_text("this is not { a graph")
    with pytest.raises(GraphFormatError, match="not a text GraphDef"):
        amp_rewrite.load_graph_def(path)


def test_missing_file(tmp_path):
    with pytest.raises(GraphFormatError, match="cannot read"):
        amp_rewrite.load_graph_def(tmp_path / "nope.pb")


def test_dangling_input_names_the_node():
    gd = _small()
    gd.node[1].input[0] = "ghost:0"
    with pytest.raises(InvalidGraphError, match="ghost"):
        _rewrite(gd)


def test_duplicate_node_names():
    gd = _small()
    gd.node.add().CopyFrom(gd.node[1])
    with pytest.raises(InvalidGraphError, match="duplicate node name 'mm'"):
        _rewrite(gd)


def test_cycle_not_closed_by_next_iteration():
    gd = _small()
    mm = next(n for n in gd.node if n.name == "mm")
    mm.input[1] = "out"
    with pytest.raises(InvalidGraphError, match="cycle not closed by a NextIteration"):
        _rewrite(gd)


def test_wrong_input_count_and_wrong_attr_type():
    gd = _small()
    mm = next(n for n in gd.node if n.name == "mm")
    mm.input.append("x")
    with pytest.raises(InvalidGraphError, match="data input"):
        _rewrite(gd)
    gd = _small()
    mm = next(n for n in gd.node if n.name == "mm")
    del mm.attr["T"]
    mm.attr["T"].i = 3  # an int where a type belongs
    with pytest.raises(InvalidGraphError, match="type attribute 'T'"):
        _rewrite(gd)


def test_output_port_out_of_range():
    gd = _small()
    next(n for n in gd.node if n.name == "out").input[0] = "mm:5"
    with pytest.raises(InvalidGraphError, match="output 5"):
        _rewrite(gd)


def test_fetch_that_does_not_exist():
    with pytest.raises(InvalidGraphError, match="fetch 'nope:0'"):
        _rewrite(_small(), fetches=["nope:0"])


def test_unknown_list_name_and_bad_options():
    with pytest.raises(ListError, match="no_such_profile"):
        _rewrite(_small(), lists="no_such_profile")
    with pytest.raises(ListError, match="NotAnOp"):
        _rewrite(_small(), add={"allow": ["NotAnOp"]})
    with pytest.raises(AmpRewriteError, match="precision"):
        _rewrite(_small(), precision="float8")
    with pytest.raises(AmpRewriteError, match="GraphDef"):
        _rewrite("not a graph")


def test_env_list_edits_are_read_at_the_boundary(monkeypatch):
    monkeypatch.setenv("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_ALLOWLIST_REMOVE", "MatMul")
    gd = _small()
    assert amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0").report["converted_nodes"] == 0
    assert amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", use_env=False).report["converted_nodes"] == 1
    monkeypatch.setenv("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_DENYLIST_ADD", "MatMul")
    monkeypatch.setenv("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_ALLOWLIST_REMOVE", "")
    with pytest.raises(ListError, match="MatMul"):
        amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0")


def test_input_is_never_modified():
    gd = _small()
    before = gd.SerializeToString(deterministic=True)
    result = _rewrite(gd)
    assert result.report["converted_nodes"] == 1
    assert gd.SerializeToString(deterministic=True) == before
    bad = _small()
    bad.node[1].input[0] = "ghost"
    snapshot = bad.SerializeToString(deterministic=True)
    with pytest.raises(InvalidGraphError):
        _rewrite(bad)
    assert bad.SerializeToString(deterministic=True) == snapshot
