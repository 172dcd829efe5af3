"""The pictures a person reads (issue 23 item 6): the HTML page's order, labels shortened in
the middle, the legend of the proportion bars, one drawing per signature, and large graphs
laid out in two dimensions."""

from __future__ import annotations

import re
from collections import Counter
import xml.etree.ElementTree as ET

import pytest
import tensorflow as tf

import amp_rewrite
from amp_rewrite.report import draw
from amp_rewrite.models import saved_model as sm
from graphs import graph_def, v1

SVG = "{http://www.w3.org/2000/svg}"


class TwoSignatures(tf.Module):
    """Two served functions: ``serving_default`` (relu(x @ w)) and ``score`` (sum(x @ w @ w))."""

    def __init__(self) -> None:
        super().__init__()
        self.w = tf.Variable(tf.ones((8, 8)))

    @tf.function(input_signature=[tf.TensorSpec((2, 8), tf.float32, name="x")])
    def predict(self, x):
        return {"y": tf.nn.relu(tf.matmul(x, self.w))}

    @tf.function(input_signature=[tf.TensorSpec((2, 8), tf.float32, name="x")])
    def score(self, x):
        return {"s": tf.reduce_sum(tf.matmul(tf.matmul(x, self.w), self.w))}


@pytest.fixture(scope="module")
def two_signatures(tmp_path_factory) -> sm.ModelRewrite:
    path = tmp_path_factory.mktemp("pictures") / "two"
    module = TwoSignatures()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.predict, "score": module.score})
    return sm.rewrite_model(sm.load_model(path), target="gpu:8.0", use_env=False)


def _svg_size(svg: str) -> tuple[float, float]:
    root = ET.fromstring(svg)
    return float(root.get("width")), float(root.get("height"))


# ------------------------------------------------------------------------------ the page


def test_summary_and_decision_tables_come_before_the_drawings(two_signatures, tmp_path):
    page = draw.render_file(two_signatures, tmp_path / "g.html").decode("utf-8")
    body = page[page.index("<body>"):]
    first_svg = body.index("<svg")
    assert body.index("converted 5 of") < body.index("class='overview'") < first_svg
    assert body.index("<h2>Decisions</h2>") < body.index("<table><tr><th>node</th>") < first_svg
    assert body.index("<h2>Decisions</h2>") < body.index("<h2>Drawings</h2>") < first_svg
    # The decision tables are open, not folded away.
    assert "<details open class='decisions'>" in body and "<details>" not in body
    assert "Content-Security-Policy" in page and "<script" not in page
    # Every inline SVG is well formed and has its own arrow-head id.
    svgs = re.findall(r"<svg .*?</svg>", body, flags=re.S)
    for svg in svgs:
        ET.fromstring(svg)
    ids = re.findall(r'<marker id="([^"]+)"', body)
    assert len(ids) == len(set(ids)) == len(svgs)
    assert page == draw.render_file(two_signatures, tmp_path / "g.html").decode("utf-8"), "deterministic"


def test_one_drawing_per_signature_titled_by_its_key(two_signatures, tmp_path):
    (label, result, sigs), = draw._results(two_signatures)
    assert sorted(sigs) == ["score", "serving_default"]
    panels = draw.panels_for(result, title=label, signatures=sigs)
    assert [p.signatures for p in panels] == [("score",), ("serving_default",)]
    assert [p.title for p in panels] == ["signature score", "signature serving_default"]
    functions = two_signatures.report["graphs"][0]["functions"]
    for panel in panels:
        name = panel.subtitle.split("function ")[1]
        assert functions[name]["converted_nodes"] > 0 and label in panel.subtitle
    page = draw.render_file(two_signatures, tmp_path / "g.html").decode("utf-8")
    assert page.count("<section>") == 2
    assert page.index("<h3>signature score</h3>") < page.index("<h3>signature serving_default</h3>")
    # The decision tables follow the same order and name the signatures too.
    assert page.index("signature score (meta graph 0 [serve]: function") < page.index(
        "signature serving_default (meta graph 0 [serve]: function")
    assert "<td>score</td>" in page and "<td>serving_default</td>" in page
    svg = draw.render_file(two_signatures, tmp_path / "g.svg").decode("utf-8")
    titles = [t.text for t in ET.fromstring(svg).iter(f"{SVG}text") if t.get("class") == "title"]
    assert titles[1:] == ["signature score", "signature serving_default"]


# ------------------------------------------------------------------------------ labels and legend


@pytest.mark.parametrize("name,label", [
    ("mobilenetv2_1.00_224_1/block_16_expand_BN_1/", "mobile\u2026/block_16_expand_BN_1/"),
    ("model/dense_layer_number_7/MatMul/ReadVariableOp", "model/\u2026/MatMul/ReadVariableOp"),
    ("a_very_long_model_name/block_1/Conv2D", "a_very_long_m\u2026/block_1/Conv2D"),
    ("x" * 40, "xxxx\u2026" + "x" * 24),
    ("short/name", "short/name"),
])
def test_labels_are_shortened_in_the_middle(name, label):
    got = draw._middle(name)
    assert got == label and len(got) <= draw._LABEL_CHARS
    if got != name:
        head, tail = got.split("\u2026")
        assert name.startswith(head) and name.endswith(tail) and len(head) >= 4


def test_long_names_keep_both_ends_in_the_drawing_and_the_full_name_in_the_tooltip():
    name = "functional_model_1/block_12_relu_1/Relu6"

    def build():
        x = v1.placeholder(tf.float32, (2, 2), name="x")
        with tf.name_scope("functional_model_1"), tf.name_scope("block_12_relu_1"):
            r = tf.nn.relu6(tf.matmul(x, x, name="MatMul"), name="Relu6")
        tf.identity(r, name="out")

    r = amp_rewrite.rewrite_graph_def(graph_def(build), target="gpu:8.0", use_env=False)
    root = ET.fromstring(draw.to_svg(draw.panels_for(r)))
    for g in root.iter(f"{SVG}g"):
        if g.find(f"{SVG}title").text.split("\n")[0] == name:
            label = g.findall(f"{SVG}text")[0].text
            break
    else:
        raise AssertionError(f"no box for {name}")
    assert label.startswith("func") and label.endswith("/block_12_relu_1/Relu6") and "\u2026" in label


def test_the_legend_explains_the_proportion_bars(two_signatures, tmp_path):
    assert "share of its nodes with that decision" in draw.BARS_LEGEND
    for fmt in ("svg", "html"):
        text = draw.render_file(two_signatures, tmp_path / f"g.{fmt}").decode("utf-8")
        assert draw.BARS_LEGEND in text and "hover a box for its counts" in text


# ------------------------------------------------------------------------------ large graphs


def _chain(layers: int) -> tf.compat.v1.GraphDef:
    """A Keras-like chain: one name scope per layer, each a MatMul, a BiasAdd and a Relu."""

    def build():
        h = v1.placeholder(tf.float32, (2, 8), name="x")
        w, b = tf.ones((8, 8), name="w"), tf.zeros((8,), name="b")
        with tf.name_scope("model"):
            for i in range(layers):
                with tf.name_scope(f"dense_{i}"):
                    h = tf.nn.relu(tf.nn.bias_add(tf.matmul(h, w), b))
        tf.identity(h, name="out")

    return graph_def(build)


def test_a_long_chain_of_layers_is_drawn_in_two_dimensions():
    r = amp_rewrite.rewrite_graph_def(_chain(300), target="gpu:8.0", use_env=False)
    (panel,) = draw.panels_for(r)
    assert "collapsed by name scope" in panel.note
    assert any(n.id == "model/dense_150/ (scope)" for n in panel.nodes), "one box per layer"
    width, height = _svg_size(draw.to_svg([panel]))
    assert width <= 3000 and height <= 3000, (width, height)
    assert max(width, height) / min(width, height) <= 3, (width, height)
    lay = draw._layout(panel)
    assert len(lay.columns) > 3
    # Read column by column: each layer is in the same column as the one before or the next.
    cols = [lay.column[f"model/dense_{i}/ (scope)"] for i in range(300)]
    assert all(b - a in (0, 1) for a, b in zip(cols, cols[1:]))
    assert draw.to_svg([panel]) == draw.to_svg(draw.panels_for(r)), "deterministic"


def test_a_short_graph_stays_one_column():
    r = amp_rewrite.rewrite_graph_def(_chain(3), target="gpu:8.0", use_env=False)
    (panel,) = draw.panels_for(r)
    assert len(draw._layout(panel).columns) == 1


class Deep(tf.Module):
    """Forty layers, each reading its own variable (a captured argument of the function)."""

    def __init__(self) -> None:
        super().__init__()
        self.ws = [tf.Variable(tf.ones((8, 8)), name=f"w{i}") for i in range(40)]

    @tf.function(input_signature=[tf.TensorSpec((2, 8), tf.float32, name="x")])
    def __call__(self, x):
        for i, w in enumerate(self.ws):
            with tf.name_scope(f"dense_{i}"):
                x = tf.nn.relu(tf.matmul(x, w))
        return {"y": x}


def test_variables_go_into_their_layer_and_control_hubs_are_counted(tmp_path):
    """A TF2 function's captured variables are drawn in the layer that reads them, and a
    box with a control edge from every layer (a NoOp) is not wired to each of them."""
    module = Deep()
    tf.saved_model.save(module, str(tmp_path / "deep"), signatures={"serving_default": module.__call__})
    rewrite = sm.rewrite_model(sm.load_model(tmp_path / "deep"), target="gpu:8.0", use_env=False)
    (label, result, sigs), = draw._results(rewrite)
    (panel,) = draw.panels_for(result, title=label, signatures=sigs, max_nodes=60)
    assert panel.signatures == ("serving_default",) and "collapsed by name scope" in panel.note
    boxes = {n.id: n for n in panel.nodes}
    layer = boxes["dense_7/ (scope)"]
    assert layer.sublabel.endswith("+ 1 arguments") and "io" not in dict(layer.counts)
    assert dict(layer.counts)["allow"] >= 1
    # No edge fans out of an "arguments" box into every layer.
    assert max(Counter(u for u, _, _ in panel.edges).values()) <= 3
    hubs = [n for n in panel.nodes if "control from" in n.sublabel]
    fan_in = Counter(v for _, v, c in panel.edges if c)
    assert all(fan_in[n.id] == 0 for n in hubs)
    assert max(fan_in.values(), default=0) <= draw._HUB
