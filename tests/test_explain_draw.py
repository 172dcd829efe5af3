"""Explanations of single decisions, the SVG/HTML/DOT drawings and the TensorBoard export."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
import tensorflow as tf

import amp_rewrite
from amp_rewrite.report import draw
from amp_rewrite.api import resolve_lists, resolve_target
from amp_rewrite.errors import AmpRewriteError
from amp_rewrite.report.explain import decided_by, explain_node, explain_text
from graphs import graph_def, v1


def _build():
    x = v1.placeholder(tf.float32, (4, 4), name="x")
    e = tf.exp(x, name="exp")
    r = tf.nn.relu(e, name="relu")
    a = tf.add(r, x, name="add")
    m = tf.matmul(a, x, name="mm")
    t = tf.nn.relu(m, name="relu2")
    b = tf.nn.bias_add(m, tf.zeros([4]), name="bias")
    m2 = tf.matmul(tf.add(t, b, name="add2"), x, name="mm2")
    tf.identity(tf.nn.softmax(tf.identity(m2, name="id"), name="sm"), name="out")
    tf.identity(tf.tanh(m, name="tanh"), name="out2")


@pytest.fixture(scope="module")
def result() -> amp_rewrite.RewriteResult:
    return amp_rewrite.rewrite_graph_def(graph_def(_build), target="gpu:8.0", lists="tensorflow", use_env=False)


@pytest.fixture(scope="module")
def lists():
    return resolve_lists("tensorflow", target=resolve_target("gpu:8.0"), precision="float16", environ={})[0]


# ------------------------------------------------------------------------------ explain


@pytest.mark.parametrize("node,color,dtype,pass_name", [
    ("mm", "allow", "float16", "pass 1 (allow list)"),
    ("exp", "deny", "float32", "pass 2 (deny list)"),
    ("add", "deny", "float32", "pass 2 (deny propagation)"),
    ("relu2", "allow", "float16", "pass 3 (clear/infer between allow ops)"),
    ("tanh", "allow", "float16", "pass 4 (infer after allow)"),
    ("id", "allow", "float16", "pass 5 (allow through clear ops)"),
    ("out", "clear", "float32", "gating (pass 0): preserved node"),
    ("sm", "infer", "float32", "no pass painted it"),
])
def test_each_decision_names_its_pass(result, lists, node, color, dtype, pass_name):
    (e,) = explain_node(result, node, lists=lists)
    assert (e.color, e.dtype) == (color, dtype)
    assert decided_by(e.reason) == pass_name
    assert f"decided by: {pass_name}" in e.format()


def test_propagated_deny_shows_the_path_from_the_deny_node(result, lists):
    (e,) = explain_node(result, "add", lists=lists)
    assert e.list == "infer" and e.list_reason and e.list_origin == "profile tensorflow"
    (attr,) = e.attrs
    assert [n for n, _, _ in attr.deny_path] == ["exp", "relu", "add"]
    text = e.format()
    assert "AddV2 is on the infer list (tensorflow lists, float16; entry from profile tensorflow)" in text
    assert "deny path (T): exp (Exp) -> relu (Relu) -> add (AddV2)" in text


def test_casts_are_listed_and_explained(result):
    (mm,) = explain_node(result, "mm")
    assert sorted((c["source"], c["dtype"]) for c in mm.casts_in) == [("add:0", "float16"), ("x:0", "float16")]
    (cast,) = explain_node(result, mm.casts_in[0]["name"])
    assert cast.is_cast and "a Cast inserted by the rewrite" in cast.format()
    (idn,) = explain_node(result, "id")
    assert [c["dtype"] for c in idn.casts_out] == ["float32"]


def test_node_with_several_type_attributes(result):
    text = explain_text(explain_node(result, "bias"))
    assert "type attributes:" not in text  # BiasAdd has one type attribute, T
    gd = graph_def(lambda: tf.reshape(tf.matmul(v1.placeholder(tf.float32, (2, 2), name="x"),
                                                tf.ones((2, 2)), name="mm"), [4], name="rs"))
    r = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", fetches=[], use_env=False)
    text = explain_text(explain_node(r, "rs"))
    assert re.search(r"Tshape +clear +int32 +type int32 is not float32", text)


def test_unknown_node_and_function(result):
    with pytest.raises(AmpRewriteError, match="no node 'mmm'.*did you mean mm"):
        explain_node(result, "mmm")
    with pytest.raises(AmpRewriteError, match="no function 'f'"):
        explain_node(result, "mm", function="f")


def test_skipped_graph_is_explained():
    r = amp_rewrite.rewrite_graph_def(graph_def(_build), target="gpu:6.1", use_env=False)
    (e,) = explain_node(r, "mm")
    assert "nothing was rewritten in this graph: no GPU can profit from float16" in e.format()


# ------------------------------------------------------------------------------ drawings


def test_svg_is_well_formed_and_coloured_by_decision(result):
    svg = draw.to_svg(draw.panels_for(result))
    root = ET.fromstring(svg)
    groups = {g.find("{http://www.w3.org/2000/svg}title").text.split("\n")[0]: g.get("class")
              for g in root.iter("{http://www.w3.org/2000/svg}g")}
    assert groups["mm"] == "node k-allow" and groups["exp"] == "node k-deny"
    assert groups["sm"] == "node k-infer" and groups["x"] == "node k-unchanged"
    casts = [name for name, cls in groups.items() if cls == "node k-cast"]
    assert len(casts) == result.report["casts_to_low"] + result.report["casts_to_high"]
    assert svg == draw.to_svg(draw.panels_for(result)), "drawings are deterministic"


HOSTILE = '<script>alert("x")</script>&\x01'


def _hostile_graph() -> tf.compat.v1.GraphDef:
    gd = graph_def(lambda: tf.identity(tf.matmul(v1.placeholder(tf.float32, (2, 2), name="x"),
                                                 tf.ones((2, 2)), name="mm"), name="out"))
    # Node names come from untrusted files; TensorFlow's importer would refuse this one,
    # but a file can hold anything.
    for node in gd.node:
        if node.name == "mm":
            node.name = HOSTILE
        node.input[:] = [HOSTILE if i == "mm" else i for i in node.input]
    return gd


@pytest.mark.parametrize("fmt", ["html", "svg", "dot"])
def test_every_format_escapes_node_names(fmt, tmp_path):
    r = amp_rewrite.rewrite_graph_def(_hostile_graph(), target="gpu:8.0", use_env=False)
    assert r.report["nodes"][HOSTILE]["color"] == "allow"
    text = draw.render_file(r, tmp_path / f"g.{fmt}").decode("utf-8")
    assert "\x01" not in text
    if fmt != "dot":
        assert "<script" not in text
    if fmt == "html":
        assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;" in text
        assert "Content-Security-Policy" in text and "default-src 'none'" in text
        ET.fromstring(text[text.index("<svg"):text.index("</svg>") + 6])
    elif fmt == "svg":
        ET.fromstring(text)
    else:
        # In DOT, names only appear inside double-quoted strings, with quotes escaped.
        assert 'tooltip="<script>alert(\\"x\\")</script>&\ufffd\\nMatMul\\n' in text
        assert text.startswith("digraph amp_rewrite {")


def test_large_graphs_collapse_by_name_scope():
    def build():
        x = v1.placeholder(tf.float32, (2, 8), name="x")
        h = x
        for block in range(12):
            with tf.name_scope(f"block{block}"):
                w = tf.ones((8, 8), name="w")
                h = tf.nn.relu(tf.matmul(h, w, name="mm"), name="relu")
                h = tf.identity(h, name="id")
        tf.identity(h, name="out")

    r = amp_rewrite.rewrite_graph_def(graph_def(build), target="gpu:8.0", use_env=False)
    full = draw.panels_for(r, max_nodes=1000)[0]
    (small,) = draw.panels_for(r, max_nodes=20)
    assert len(full.nodes) > 20 >= len(small.nodes)
    assert "collapsed by name scope" in small.note
    groups = {n.id: n for n in small.nodes if n.kind == "group"}
    assert "block3/ (scope)" in groups
    assert dict(groups["block3/ (scope)"].counts)["allow"] >= 2
    assert ("block3/ (scope)", "block4/ (scope)", False) in small.edges
    ET.fromstring(draw.to_svg([small]))


def test_graph_format_from_file_name():
    assert draw.graph_format("a/b.SVG") == "svg" and draw.graph_format("x.htm") == "html"
    with pytest.raises(AmpRewriteError, match="use .svg, .html or .dot"):
        draw.graph_format("g.pdf")


# ------------------------------------------------------------------------------ TensorBoard


def test_tensorboard_event_files_hold_the_graphs(tmp_path):
    from amp_rewrite.models import saved_model as sm
    src = tmp_path / "g.pb"
    src.write_bytes(graph_def(_build).SerializeToString())
    rewrite = sm.rewrite_model(sm.load_model(src), target="gpu:8.0", use_env=False)
    files = draw.tensorboard_files(rewrite, wall_time=1000.0)
    assert sorted(files) == ["after/events.out.tfevents.1000.amp-rewrite",
                             "before/events.out.tfevents.1000.amp-rewrite"]
    graphs = {}
    for rel, data in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        events = list(tf.compat.v1.train.summary_iterator(str(path)))
        assert events[0].file_version == "brain.Event:2"
        graphs[rel.split("/")[0]] = tf.compat.v1.GraphDef.FromString(events[1].graph_def)
    assert graphs["before"] == rewrite.graphs[0].before
    after = {n.name: n for n in graphs["after"].node}
    assert after["mm"].attr["T"].type == tf.float16.as_datatype_enum
    assert after["mm"].attr["_amp_rewrite"].s.decode() == "allow float16: MatMul is on the allow list"


def test_the_normalization_rules_decisions_name_their_pass():
    """The default profile's fence (float32 inside a norm, its output and input taken in
    float16) and its input product are decided by passes 2 and 3; ``explain`` says which,
    not "no pass painted it"."""
    from test_optimal import _batch_norm_graph, _layer_norm_training_graph

    seen = {}
    for gd in (_layer_norm_training_graph(), _batch_norm_graph()):
        ours = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", use_env=False)
        for node in ours.report["nodes"].values():
            for needle in ("fenced, it runs in float32", "a path from an allow-list op to a normalization's input",
                           "a path from a normalization's output"):
                if needle in node["reason"] and node["color"] in ("allow", "deny"):
                    seen[needle] = decided_by(node["reason"])
    assert seen == {
        "fenced, it runs in float32": "pass 2 (normalization fence: float32 inside)",
        "a path from an allow-list op to a normalization's input":
            "pass 3 (from an allow op to a fenced normalization's input)",
        "a path from a normalization's output": "pass 3 (from a fenced normalization's output to an allow op)",
    }
    ln = amp_rewrite.rewrite_graph_def(_layer_norm_training_graph(), target="gpu:8.0", use_env=False)
    (e,) = explain_node(ln, "gradients/AddN")
    assert "decided by: pass 3 (from an allow op to a fenced normalization's input)" in e.format()
