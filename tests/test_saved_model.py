"""Offline rewriting of real model files: SavedModels (Keras ``model.export``, a ``tf.Module``
with two signatures and a variable, a TF1 SavedModel), frozen ``.pb``/``.pbtxt`` GraphDefs
and ``.meta`` MetaGraphDefs.  Each is rewritten, loaded back with TensorFlow, and run."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from amp_rewrite.models import saved_model as sm
from amp_rewrite.errors import AmpRewriteError, GraphFormatError
from amp_rewrite.progress import Progress
from graphs import graph_def, v1

CPU_BF16 = dict(target="cpu", precision="bfloat16", use_env=False)


def _tree_digest(root: pathlib.Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _leftovers(parent: pathlib.Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(".amp-rewrite-"))


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def keras_export(tmp_path_factory) -> pathlib.Path:
    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((6, 6, 2)),
        keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(8, activation="relu"),
        keras.layers.Dense(3),
        keras.layers.Softmax(),
    ])
    path = tmp_path_factory.mktemp("keras") / "exported"
    model.export(str(path), verbose=False)
    return path


class TwoSignatures(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(2)
        self.w = tf.Variable(rng.standard_normal((8, 4)).astype(np.float32), name="w")

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
    def probs(self, x):
        return {"y": tf.nn.softmax(tf.matmul(x, self.w))}

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="a"),
                                  tf.TensorSpec([], tf.int32, name="k")])
    def scaled(self, a, k):
        return {"z": tf.matmul(a, self.w) * tf.cast(k, tf.float32), "k2": k * 2}


@pytest.fixture(scope="module")
def module_model(tmp_path_factory) -> pathlib.Path:
    m = TwoSignatures()
    path = tmp_path_factory.mktemp("module") / "two_sigs"
    tf.saved_model.save(m, str(path), signatures={"serving_default": m.probs, "scaled": m.scaled})
    (path / "assets" / "vocab.txt").write_text("a\nb\n")  # an extra file that must be copied
    return path


@pytest.fixture(scope="module")
def tf1_model(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("tf1") / "tf1"
    g = tf.Graph()
    with g.as_default():
        x = v1.placeholder(tf.float32, [None, 8], name="x")
        rng = np.random.default_rng(3)
        w1 = v1.get_variable("w1", initializer=rng.standard_normal((8, 16)).astype(np.float32))
        w2 = v1.get_variable("w2", initializer=rng.standard_normal((16, 4)).astype(np.float32))
        hidden = tf.nn.relu(tf.matmul(x, w1, name="hidden"), name="features")
        logits = tf.matmul(hidden, w2, name="logits")
        probs = tf.nn.softmax(logits, name="probs")
        with v1.Session(graph=g) as sess:
            sess.run(v1.global_variables_initializer())
            builder = v1.saved_model.Builder(str(path))
            sig = v1.saved_model.predict_signature_def({"x": x}, {"probs": probs, "logits": logits})
            features = v1.saved_model.predict_signature_def({"x": x}, {"features": hidden})
            builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={
                "serving_default": sig, "features": features})
            builder.add_meta_graph(["train"], signature_def_map={"logits": v1.saved_model.predict_signature_def(
                {"x": x}, {"logits": logits})})
            builder.save()
    return path


def _batch(n: int = 5, *shape: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((n, *shape)).astype(np.float32)


# ------------------------------------------------------------------------------ SavedModels


def test_keras_export_round_trip(keras_export, tmp_path):
    before = _tree_digest(keras_export)
    out = tmp_path / "out"
    report = sm.rewrite_saved_model(keras_export, out, **CPU_BF16)
    assert _tree_digest(keras_export) == before, "the input must never change"
    assert report["format"] == "saved_model" and report["converted_nodes"] > 0
    assert report["casts_to_low"] > 0 and report["skipped"] is None
    # Variables are copied byte for byte; only saved_model.pb and fingerprint.pb differ.
    after = _tree_digest(out)
    assert {k: v for k, v in after.items() if k.startswith("variables")} == \
        {k: v for k, v in before.items() if k.startswith("variables")}
    assert after["saved_model.pb"] != before["saved_model.pb"]
    original = tf.saved_model.load(str(keras_export))
    rewritten = tf.saved_model.load(str(out))
    for key in ("serving_default", "serve"):
        f0, f1 = original.signatures[key], rewritten.signatures[key]
        assert f1.structured_input_signature == f0.structured_input_signature
        assert f1.structured_outputs == f0.structured_outputs
        (arg,) = f0.structured_input_signature[1]
        x = _batch(5, 6, 6, 2)
        y0, y1 = f0(**{arg: x}), f1(**{arg: x})
        for name in y0:
            assert y1[name].dtype == tf.float32
            np.testing.assert_allclose(y1[name].numpy(), y0[name].numpy(), rtol=0.05, atol=0.02)
    # The rewrite really is in the served function: it contains bfloat16 convolutions.
    meta = sm.load_model(out).meta_graphs[0]
    ops = {(n.op, n.attr["T"].type) for f in meta.graph_def.library.function for n in f.node_def}
    assert ("Conv2D", tf.bfloat16.as_datatype_enum) in ops


def test_module_with_two_signatures_and_a_variable(module_model, tmp_path):
    out = tmp_path / "out"
    report = sm.rewrite_saved_model(module_model, out, **CPU_BF16)
    (graph,) = report["graphs"]
    assert graph["tags"] == ["serve"]
    assert set(graph["signatures"]) == {"serving_default", "scaled", "__saved_model_init_op"}
    assert graph["signatures"]["scaled"]["outputs"] == {"k2": "int32", "z": "float"}
    assert (out / "assets" / "vocab.txt").read_text() == "a\nb\n"
    original, rewritten = tf.saved_model.load(str(module_model)), tf.saved_model.load(str(out))
    np.testing.assert_array_equal(rewritten.w.numpy(), original.w.numpy())
    x = _batch(3, 8)
    y0, y1 = original.signatures["serving_default"](x=x), rewritten.signatures["serving_default"](x=x)
    np.testing.assert_allclose(y1["y"].numpy(), y0["y"].numpy(), atol=0.02)
    z0 = original.signatures["scaled"](a=x, k=tf.constant(3))
    z1 = rewritten.signatures["scaled"](a=x, k=tf.constant(3))
    assert z1["k2"].dtype == tf.int32 and int(z1["k2"]) == 6
    np.testing.assert_allclose(z1["z"].numpy(), z0["z"].numpy(), rtol=0.05, atol=0.05)
    # The tf.function methods of the object graph are rewritten too (same library functions).
    np.testing.assert_allclose(rewritten.probs(x)["y"].numpy(), y0["y"].numpy(), atol=0.02)
    src_meta, out_meta = sm.load_model(module_model).meta_graphs[0], sm.load_model(out).meta_graphs[0]
    assert out_meta.signature_def == src_meta.signature_def
    assert out_meta.object_graph_def == src_meta.object_graph_def
    assert out_meta.saver_def == src_meta.saver_def
    assert out_meta.meta_info_def.tags == src_meta.meta_info_def.tags


def _show_all(path: pathlib.Path) -> list[str]:
    from tensorflow.python.tools import saved_model_cli

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        saved_model_cli._show_all(str(path))
    # The op set may gain Cast; everything else (signatures, concrete functions) must match.
    return [line for line in buf.getvalue().splitlines() if "contains the following ops" not in line]


def test_saved_model_cli_lists_the_same_signatures(module_model, tmp_path):
    out = tmp_path / "out"
    sm.rewrite_saved_model(module_model, out, **CPU_BF16)
    shown = _show_all(out)
    assert "signature_def['scaled']:" in shown
    assert shown == _show_all(module_model)


def test_fingerprint_is_regenerated_and_output_is_deterministic(module_model, tmp_path):
    from tensorflow.python.saved_model.pywrap_saved_model import fingerprinting

    a, b = tmp_path / "a", tmp_path / "b"
    sm.rewrite_saved_model(module_model, a, **CPU_BF16)
    sm.rewrite_saved_model(module_model, b, **CPU_BF16)
    assert _tree_digest(a) == _tree_digest(b)
    old = tf.saved_model.experimental.read_fingerprint(str(module_model))
    new = tf.saved_model.experimental.read_fingerprint(str(a))
    assert new.saved_model_checksum != old.saved_model_checksum
    assert new.signature_def_hash == old.signature_def_hash  # signatures did not change
    assert new.checkpoint_hash == old.checkpoint_hash        # nor did the variables
    from tensorflow.core.protobuf import fingerprint_pb2

    recomputed = fingerprint_pb2.FingerprintDef.FromString(fingerprinting.CreateFingerprintDef(str(a)))
    assert new.saved_model_checksum == recomputed.saved_model_checksum


def test_signature_option_rewrites_only_what_that_signature_runs(module_model, tmp_path):
    out = tmp_path / "out"
    report = sm.rewrite_saved_model(module_model, out, signatures=["serving_default"], **CPU_BF16)
    before = {f.signature.name: f for f in sm.load_model(module_model).meta_graphs[0].graph_def.library.function}
    after = {f.signature.name: f for f in sm.load_model(out).meta_graphs[0].graph_def.library.function}
    changed = {n for n in before if before[n] != after[n]}
    assert changed and all("probs" in n for n in changed)
    assert set(report["graphs"][0]["functions"]) <= {n for n in before if "probs" in n}
    x = _batch(2, 8)
    loaded = tf.saved_model.load(str(out))
    original = tf.saved_model.load(str(module_model))
    np.testing.assert_array_equal(loaded.signatures["scaled"](a=x, k=tf.constant(2))["z"].numpy(),
                                  original.signatures["scaled"](a=x, k=tf.constant(2))["z"].numpy())


def test_tf1_saved_model_and_keep_io_types(tf1_model, tmp_path):
    kept, free = tmp_path / "kept", tmp_path / "free"
    report = sm.rewrite_saved_model(tf1_model, kept, tags=["serve"], **CPU_BF16)
    nodes = report["graphs"][0]["nodes"]
    assert nodes["hidden"]["dtype"] == "bfloat16" and nodes["logits"]["dtype"] == "float32"
    report = sm.rewrite_saved_model(tf1_model, free, keep_io_types=False, **CPU_BF16)
    assert report["graphs"][0]["signatures"]["serving_default"]["outputs"]["logits"] == "bfloat16"
    x = _batch(4, 8)
    ref = tf.saved_model.load(str(tf1_model), tags=["serve"]).signatures["serving_default"](x=x)
    got = tf.saved_model.load(str(kept), tags=["serve"]).signatures["serving_default"](x=x)
    assert got["logits"].dtype == tf.float32 and got["probs"].dtype == tf.float32
    np.testing.assert_allclose(got["logits"].numpy(), ref["logits"].numpy(), rtol=0.05, atol=0.05)
    # --signature on a TF1 graph: what other signatures need stays float32.
    only = sm.rewrite_saved_model(tf1_model, tmp_path / "only", tags=["serve"], signatures=["features"],
                                  keep_io_types=False, **CPU_BF16)
    nodes = only["graphs"][0]["nodes"]
    assert nodes["hidden"]["dtype"] == "bfloat16" and nodes["logits"]["dtype"] == "float32"
    loose = tf.saved_model.load(str(free), tags=["serve"]).signatures["serving_default"](x=x)
    assert loose["logits"].dtype == tf.bfloat16  # the signature def was updated to match
    np.testing.assert_allclose(tf.cast(loose["logits"], tf.float32).numpy(), ref["logits"].numpy(),
                               rtol=0.05, atol=0.05)


def test_every_meta_graph_is_rewritten_unless_tags_pick_one(tf1_model, tmp_path):
    both = sm.rewrite_saved_model(tf1_model, tmp_path / "both", **CPU_BF16)
    assert [g["tags"] for g in both["graphs"]] == [["serve"], ["train"]]
    assert both["converted_nodes"] == sum(g["converted_nodes"] for g in both["graphs"]) > 0
    serve = sm.rewrite_saved_model(tf1_model, tmp_path / "serve", tags=["serve"], **CPU_BF16)
    assert [g["tags"] for g in serve["graphs"]] == [["serve"]]
    src, out = sm.load_model(tf1_model).meta_graphs, sm.load_model(tmp_path / "serve").meta_graphs
    assert out[1] == src[1], "an unselected meta graph is copied unchanged"
    assert out[0].graph_def != src[0].graph_def


def test_tags_select_a_meta_graph_and_unknown_tags_are_refused(module_model, tmp_path):
    report = sm.rewrite_saved_model(module_model, tmp_path / "ok", tags=["serve"], **CPU_BF16)
    assert report["graphs"][0]["tags"] == ["serve"]
    with pytest.raises(GraphFormatError, match="no meta graph has the tags 'gpu'.*serve"):
        sm.rewrite_saved_model(module_model, tmp_path / "bad", tags=["gpu"], **CPU_BF16)
    with pytest.raises(GraphFormatError, match="no signature 'nope'.*scaled, serving_default"):
        sm.rewrite_saved_model(module_model, tmp_path / "bad", signatures=["nope"], **CPU_BF16)
    assert not (tmp_path / "bad").exists()


# ------------------------------------------------------------------------------ GraphDef files


def _frozen() -> tf.compat.v1.GraphDef:
    def build():
        x = v1.placeholder(tf.float32, (4, 8), name="x")
        w = tf.constant(np.random.default_rng(4).standard_normal((8, 8)).astype(np.float32), name="w")
        h = tf.nn.relu(tf.matmul(x, w, name="mm"), name="relu")
        tf.identity(tf.nn.softmax(tf.matmul(h, w, name="mm2"), name="sm"), name="out")

    return graph_def(build)


def _run(gd, x):
    g = tf.Graph()
    with g.as_default():
        tf.graph_util.import_graph_def(gd, name="")
    with v1.Session(graph=g) as sess:
        return sess.run("out:0", {"x:0": x})


@pytest.mark.parametrize("src_name,dst_name", [("g.pb", "o.pb"), ("g.pbtxt", "o.pbtxt"), ("g.pb", "o.pbtxt")])
def test_frozen_graph_round_trip(tmp_path, src_name, dst_name):
    from google.protobuf import text_format

    gd = _frozen()
    src = tmp_path / src_name
    if src_name.endswith(".pbtxt"):
        src.write_text(text_format.MessageToString(gd))
    else:
        src.write_bytes(gd.SerializeToString())
    report = sm.rewrite_saved_model(src, tmp_path / dst_name, target="gpu:8.0", use_env=False)
    assert report["format"] == "graph_def" and report["converted_nodes"] == 3
    out = sm.load_model(tmp_path / dst_name)
    assert out.format == "graph_def" and out.text == dst_name.endswith(".pbtxt")
    assert {n.name: n.attr["T"].type for n in out.message.node}["mm"] == tf.float16.as_datatype_enum
    x = _batch(4, 8)
    np.testing.assert_allclose(_run(out.message, x), _run(gd, x), atol=0.02)


def test_meta_graph_round_trip_with_checkpoint(tmp_path):
    g = tf.Graph()
    with g.as_default():
        x = v1.placeholder(tf.float32, (None, 8), name="x")
        w = v1.get_variable("w", initializer=np.random.default_rng(5).standard_normal((8, 3)).astype(np.float32))
        tf.identity(tf.nn.softmax(tf.matmul(x, w, name="mm")), name="out")
        saver = v1.train.Saver()
        with v1.Session(graph=g) as sess:
            sess.run(v1.global_variables_initializer())
            prefix = saver.save(sess, str(tmp_path / "ckpt" / "model"))
    meta = pathlib.Path(prefix + ".meta")
    out = tmp_path / "rewritten.meta"
    report = sm.rewrite_saved_model(meta, out, target="gpu:8.0", use_env=False)
    assert report["format"] == "meta_graph" and report["converted_nodes"] >= 1
    x_val = _batch(2, 8)
    results = []
    for path in (meta, out):
        g2 = tf.Graph()
        with g2.as_default(), v1.Session(graph=g2) as sess:
            restorer = v1.train.import_meta_graph(str(path))
            restorer.restore(sess, prefix)
            results.append(sess.run("out:0", {"x:0": x_val}))
    np.testing.assert_allclose(results[1], results[0], atol=0.02)


# ------------------------------------------------------------------------------ bad input


def test_load_model_rejects_bad_paths(tmp_path, module_model):
    with pytest.raises(GraphFormatError, match="no such file"):
        sm.load_model(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(GraphFormatError, match="not a SavedModel"):
        sm.load_model(tmp_path / "empty")
    with pytest.raises(GraphFormatError, match="pass its directory"):
        sm.load_model(module_model / "saved_model.pb")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "saved_model.pb").write_bytes(b"\x0a\xff\xff\xff garbage")
    with pytest.raises(GraphFormatError, match="corrupt saved_model.pb"):
        sm.load_model(corrupt)


# ------------------------------------------------------------------------------ atomic output


@pytest.mark.parametrize("error", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_failure_while_writing_leaves_no_output(module_model, tmp_path, monkeypatch, error):
    def boom(*args, **kwargs):
        raise error

    monkeypatch.setattr(sm, "_fingerprint", boom)  # fails after variables were copied
    out = tmp_path / "out"
    with pytest.raises(type(error)):
        sm.rewrite_saved_model(module_model, out, report_file=tmp_path / "r.json",
                               dump_dir=tmp_path / "dumps", **CPU_BF16)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_existing_output_rules(module_model, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(AmpRewriteError, match="not empty; pass --overwrite"):
        sm.rewrite_saved_model(module_model, out, **CPU_BF16)
    assert (out / "keep.txt").read_text() == "mine"
    sm.rewrite_saved_model(module_model, out, overwrite=True, **CPU_BF16)
    assert not (out / "keep.txt").exists() and (out / "saved_model.pb").exists()
    assert _leftovers(tmp_path) == []
    with pytest.raises(AmpRewriteError, match="same as .or inside. INPUT"):
        sm.rewrite_saved_model(module_model, module_model, overwrite=True, **CPU_BF16)
    with pytest.raises(AmpRewriteError, match="inside. INPUT"):
        sm.rewrite_saved_model(module_model, module_model / "sub", **CPU_BF16)
    with pytest.raises(AmpRewriteError, match="--report .* inside INPUT"):
        sm.rewrite_saved_model(module_model, tmp_path / "o2", report_file=module_model / "r.json", **CPU_BF16)
    (tmp_path / "empty").mkdir()  # an empty directory is fine without --overwrite
    sm.rewrite_saved_model(module_model, tmp_path / "empty", **CPU_BF16)
    assert (tmp_path / "empty" / "saved_model.pb").exists()


def test_outputs_into_new_directories_are_created_whole(module_model, tmp_path):
    out = tmp_path / "new" / "deeper" / "model"
    sm.rewrite_saved_model(module_model, out, dump_dir=tmp_path / "dumps", report_file=tmp_path / "r" / "r.json",
                           **CPU_BF16)
    assert (out / "saved_model.pb").exists() and (tmp_path / "r" / "r.json").exists()
    dumps = sorted(p.name for p in (tmp_path / "dumps").iterdir())
    assert dumps == ["graphdef_AutoMixedPrecision_meta_graph_0_serve.pb.txt",
                     "graphdef_preop_meta_graph_0_serve.pb.txt",
                     "paintbuckets_AutoMixedPrecision_meta_graph_0_serve.txt"]
    text = (tmp_path / "dumps" / "graphdef_AutoMixedPrecision_meta_graph_0_serve.pb.txt").read_text()
    assert "DT_BFLOAT16" in text
    assert "DT_BFLOAT16" not in (tmp_path / "dumps" / "graphdef_preop_meta_graph_0_serve.pb.txt").read_text()
    buckets = (tmp_path / "dumps" / "paintbuckets_AutoMixedPrecision_meta_graph_0_serve.txt").read_text()
    assert buckets.startswith("AllowList:\n") and "\nMatMul\n" in buckets
    mode = os.stat(out / "saved_model.pb").st_mode & 0o777
    assert mode & 0o044, "outputs get ordinary permissions, not mkstemp's 0600"
    assert _leftovers(tmp_path) == [] and _leftovers(tmp_path / "new" / "deeper") == []


# ------------------------------------------------------------------------------ progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_on_a_terminal_and_is_silent_in_a_pipe(module_model, tmp_path):
    piped, tty = io.StringIO(), _Tty()
    with Progress(piped) as p1:
        sm.rewrite_saved_model(module_model, tmp_path / "a", progress=p1, **CPU_BF16)
    with Progress(tty) as p2:
        sm.rewrite_saved_model(module_model, tmp_path / "b", progress=p2, **CPU_BF16)
    assert piped.getvalue() == ""
    drawn = tty.getvalue()
    assert "\ramp-rewrite: rewriting meta graph 0 [serve] [" in drawn and "writing the output" in drawn
    assert drawn.endswith("\r")  # the line is erased at the end
