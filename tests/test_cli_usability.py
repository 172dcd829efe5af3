"""Issue 23, usability of ``amp-rewrite``: --fail-if-unchanged and --dry-run, repeatable and
anchored --exclude (and ``nodes`` to preview it), the per-signature summary, the report's
JSON Schema, ``explain`` by op type / layer name / substring, and option checking before
the output path is looked at (plus Keras files and saved_model_cli's flag names)."""

from __future__ import annotations

import json
import pathlib

import jsonschema
import numpy as np
import pytest
import tensorflow as tf

import amp_rewrite
from amp_rewrite.models import saved_model as sm
from amp_rewrite.cli import EXIT_UNCHANGED, main
from amp_rewrite.errors import AmpRewriteError, GraphFormatError
from amp_rewrite.plan.exclude import NameMatcher, keras_scoped
from graphs import graph_def, v1

GPU = ["--target", "gpu:8.0", "--precision", "float16"]
OLD_GPU = ["--target", "gpu:6.1", "--precision", "float16"]  # float16 gains nothing there
SCHEMA = json.loads((pathlib.Path(amp_rewrite.__file__).parent / "report_schema.json").read_text())


def _blocks() -> None:
    """MatMuls in name scopes blk_1, blk_10 and blk_2: a pattern for one must not take the others."""
    x = v1.placeholder(tf.float32, (8, 16), name="x")
    w = tf.constant(np.ones((16, 16), np.float32), name="w")
    h = x
    for scope in ("blk_1", "blk_10", "blk_2"):
        h = tf.matmul(h, w, name=f"{scope}/mm")
    tf.identity(h, name="out")


@pytest.fixture()
def pb(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "in.pb"
    path.write_bytes(graph_def(_blocks).SerializeToString())
    return path


@pytest.fixture(scope="module")
def keras_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A Keras 3 ``model.export`` with layers conv2d_1 and conv2d_10 (and a Dense)."""
    import keras

    inp = keras.Input((8, 8, 8), batch_size=2)
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="conv2d_1")(inp)
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="conv2d_10")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    out = keras.layers.Dense(8, name="dense")(x)
    path = tmp_path_factory.mktemp("keras") / "model"
    # Named: an automatic name counts the models built before in the process.
    keras.Model(inp, out, name="functional").export(str(path), verbose=False)
    return path


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.startswith("amp-rewrite: error:") and err.count("\n") == 1, err
    return err


def _function_nodes(report: dict, op: str) -> dict[str, dict]:
    """``{node: entry}`` of every node of type ``op`` in the functions of the first graph."""
    return {n: e for f in report["graphs"][0]["functions"].values() for n, e in f["nodes"].items()
            if e["op"] == op}


# ------------------------------------------------------------------ --fail-if-unchanged, --dry-run


def test_fail_if_unchanged_exits_3_with_the_reason(pb, tmp_path, capsys):
    out = tmp_path / "o.pb"
    assert main(["rewrite", str(pb), str(out), *OLD_GPU, "--fail-if-unchanged"]) == EXIT_UNCHANGED == 3
    captured = capsys.readouterr()
    assert "nothing converted: no GPU can profit from float16" in captured.err
    assert "nothing rewritten: no GPU can profit" in captured.out
    assert out.exists()  # the unchanged copy is still written, as documented
    assert main(["rewrite", str(pb), str(tmp_path / "o2.pb"), *GPU, "--fail-if-unchanged", "-q"]) == 0


def test_dry_run_writes_nothing_and_prints_the_table(keras_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["rewrite", str(keras_dir), str(out), *GPU, "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert "dry run: nothing written" in printed and "wrote" not in printed
    assert "serving_default" in printed and "(save/restore)" in printed and "Conv2D 2/2" in printed
    # OUTPUT may be left out; nothing to convert with --fail-if-unchanged is status 3.
    assert main(["rewrite", str(keras_dir), *OLD_GPU, "--dry-run", "--fail-if-unchanged", "-q"]) == 3
    captured = capsys.readouterr()  # -q: the reason is still said, on stderr only
    assert captured.out == "" and captured.err.startswith("amp-rewrite: nothing converted: no GPU")
    # --dry-run writes nothing, so an extra output is refused rather than silently skipped.
    assert main(["rewrite", str(keras_dir), *GPU, "--dry-run", "--report", str(tmp_path / "r.json")]) == 1
    assert "--report cannot go with it" in _one_error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_rewrite_needs_output_unless_dry_run(pb, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["rewrite", str(pb)])
    assert exc.value.code == 2 and "OUTPUT (or --dry-run)" in capsys.readouterr().err


# ------------------------------------------------------------------ --exclude


def test_exclude_is_repeatable_and_anchored(pb, tmp_path):
    report_file = tmp_path / "r.json"
    assert main(["rewrite", str(pb), str(tmp_path / "o.pb"), *GPU, "--exclude", "blk_1",
                 "--exclude", "blk_2/mm", "--report", str(report_file), "-q"]) == 0
    nodes = json.loads(report_file.read_text())["graphs"][0]["nodes"]
    assert nodes["blk_1/mm"]["dtype"] == "float32" and nodes["blk_2/mm"]["dtype"] == "float32"
    assert nodes["blk_10/mm"]["dtype"] == "float16"  # blk_1 is anchored: not a prefix of blk_10
    assert nodes["blk_1/mm"]["reason"].startswith("preserved: excluded by --exclude 'blk_1'")
    assert "path component 'blk_1'" in nodes["blk_1/mm"]["reason"]
    assert "'blk_2/mm'" in nodes["blk_2/mm"]["reason"] and "its name" in nodes["blk_2/mm"]["reason"]


def test_exclude_in_the_api_takes_a_list_or_a_str(pb):
    gd = tf.compat.v1.GraphDef.FromString(pb.read_bytes())
    kw = dict(target="gpu:8.0", precision="float16", use_env=False)
    both = amp_rewrite.rewrite_graph_def(gd, exclude=["blk_1", "blk_10"], **kw).report
    assert both["excluded"] == {"blk_1": 1, "blk_10": 1}
    assert [both["nodes"][f"{s}/mm"]["dtype"] for s in ("blk_1", "blk_10", "blk_2")] == \
        ["float32", "float32", "float16"]
    one = amp_rewrite.rewrite_graph_def(gd, exclude="blk_.*", **kw).report
    assert one["excluded"] == {"blk_.*": 3} and one["converted_nodes"] == 0
    assert "excluded or fetched" in one["skipped"]
    with pytest.raises(AmpRewriteError, match="exclude must be a str or a list"):
        amp_rewrite.rewrite_graph_def(gd, exclude=3, **kw)
    with pytest.raises(AmpRewriteError, match=r"bad --exclude regular expression '\('"):
        amp_rewrite.rewrite_graph_def(gd, exclude=["ok", "("], **kw)


def test_no_exclude_gives_the_same_bytes_as_an_empty_list(pb):
    gd = tf.compat.v1.GraphDef.FromString(pb.read_bytes())
    kw = dict(target="gpu:8.0", precision="float16", use_env=False)
    plain = amp_rewrite.rewrite_graph_def(gd, **kw)
    empty = amp_rewrite.rewrite_graph_def(gd, exclude=[], **kw)
    unmatched = amp_rewrite.rewrite_graph_def(gd, exclude=["nothing_here"], **kw)
    data = plain.graph_def.SerializeToString(deterministic=True)
    assert data == empty.graph_def.SerializeToString(deterministic=True)
    assert data == unmatched.graph_def.SerializeToString(deterministic=True)
    assert "excluded" not in plain.report and unmatched.report["excluded"] == {"nothing_here": 0}


def test_exclude_a_keras_layer_and_not_its_namesakes(keras_dir, tmp_path):
    report_file = tmp_path / "r.json"
    assert main(["rewrite", str(keras_dir), str(tmp_path / "o"), *GPU, "--exclude", "conv2d_1",
                 "--report", str(report_file), "-q"]) == 0
    convs = _function_nodes(json.loads(report_file.read_text()), "Conv2D")
    layer = {n.split("/")[1]: e for n, e in convs.items()}
    # Keras 3 traces spell the scopes with a suffix (conv2d_1_1, conv2d_10_1).
    assert sorted(layer) == ["conv2d_10_1", "conv2d_1_1"]
    assert layer["conv2d_1_1"]["dtype"] == "float32" and layer["conv2d_10_1"]["dtype"] == "float16"
    assert "Keras layer 'conv2d_1'" in layer["conv2d_1_1"]["reason"]


def test_keras_scope_suffixes_are_recognised_only_in_keras3_traces():
    matcher = NameMatcher.compile(["dense"])
    keras3 = ["functional_1/dense_1/MatMul", "functional_1/dense_1_2/MatMul", "x"]
    keras2 = ["model/dense/MatMul", "model/dense_1/MatMul"]
    assert keras_scoped(keras3) and not keras_scoped(keras2) and not keras_scoped(["a/b", "c"])
    # Keras 3: dense_1 is the scope of the layer dense, dense_1_2 that of dense_1.
    assert [matcher.match(n, True) is not None for n in keras3[:2]] == [True, False]
    # Keras 2: scopes are the layer names themselves.
    assert [matcher.match(n, False) is not None for n in keras2] == [True, False]


def test_nodes_previews_what_a_pattern_matches(keras_dir, capsys):
    assert main(["nodes", str(keras_dir), "conv2d_1", "nope"]) == 0
    out = capsys.readouterr().out
    assert "# 'nope' matches 0 node(s)" in out
    lines = [line for line in out.splitlines() if line.startswith("  ")]
    conv_lines = [line for line in lines if " Conv2D " in line]
    assert len(conv_lines) == 1 and "conv2d_1_1/" in conv_lines[0]
    assert not any("conv2d_10" in line for line in lines)
    assert any("VarHandleOp" in line and "(main graph)" in line for line in lines)


# ------------------------------------------------------------------ the per-signature summary


def test_signature_summary_counts_what_each_signature_runs(keras_dir, tmp_path, capsys):
    report_file = tmp_path / "r.json"
    assert main(["rewrite", str(keras_dir), str(tmp_path / "o"), *GPU, "--report", str(report_file)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(report_file.read_text())
    graph = report["graphs"][0]
    rows = graph["summary"]
    serving = report["signatures"]["serving_default"]
    assert serving["function"] == graph["signatures"]["serving_default"]["function"]
    assert serving["function"] in serving["functions"]
    assert serving["by_op"]["Conv2D"] == {"converted": 2, "total": 2}
    assert serving["converted"] == report["converted_nodes"]  # nothing else converts
    assert serving["casts_to_low"] + serving["casts_to_high"] == report["casts_to_low"] + report["casts_to_high"]
    assert serving["total"] < report["total_nodes"] / 2  # save/restore is most of the graph
    assert rows[sm.SAVE_RESTORE_ROW]["total"] > serving["total"]
    assert any("traced_save" in f for f in rows[sm.SAVE_RESTORE_ROW]["functions"])
    # What no signature runs is partitioned into save/restore and the rest.
    gd = sm.load_model(keras_dir).meta_graphs[0].graph_def
    sig_functions = set().union(*(r["functions"] for r in rows.values() if r["kind"] == "signature"))
    in_functions = sum(len(f.node_def) for f in gd.library.function if f.signature.name in sig_functions)
    rest = rows[sm.SAVE_RESTORE_ROW]["total"] + rows[sm.OTHER_ROW]["total"]
    assert in_functions < report["total_nodes"] - rest <= in_functions + len(gd.node)
    line = next(line for line in printed.splitlines() if line.strip().startswith("serving_default"))
    assert f"{serving['converted']}/{serving['total']}" in line.replace(" ", "")
    assert serving["function"] in line


def test_graph_def_summary_is_one_row_for_the_whole_graph(pb, tmp_path):
    report = sm.rewrite_saved_model(pb, tmp_path / "o.pb", target="gpu:8.0", precision="float16", use_env=False)
    (row,) = report["graphs"][0]["summary"].values()
    assert row["kind"] == "graph" and report["signatures"] == {}
    assert (row["converted"], row["total"]) == (report["converted_nodes"], report["total_nodes"]) == (3, 6)
    assert row["by_op"]["MatMul"] == {"converted": 3, "total": 3}


# ------------------------------------------------------------------ the report's JSON Schema


def _errors(instance: object, ref: str = "#/$defs/model") -> list[str]:
    validator = jsonschema.Draft202012Validator({**SCHEMA, "$ref": ref})
    return [f"{e.json_path}: {e.message}" for e in validator.iter_errors(instance)]


def test_the_schema_is_valid_and_shipped():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    pyproject = (pathlib.Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert "report_schema.json" in pyproject


def test_real_reports_follow_the_schema(pb, keras_dir, tmp_path):
    graph_report = tmp_path / "g.json"
    assert main(["rewrite", str(pb), str(tmp_path / "o.pb"), *GPU, "--exclude", "blk_1",
                 "--report", str(graph_report), "-q"]) == 0
    model_report = tmp_path / "m.json"
    assert main(["rewrite", str(keras_dir), str(tmp_path / "o"), "--target", "cpu", "--precision", "bfloat16",
                 "--lists", "optimal", "--report", str(model_report), "-q"]) == 0
    for path in (graph_report, model_report):
        data = json.loads(path.read_text())
        assert _errors(data) == [], path
    data = json.loads(model_report.read_text())
    # The optimal planner's section is there to be checked too.
    assert any("placement" in f for f in data["graphs"][0]["functions"].values())
    gd = tf.compat.v1.GraphDef.FromString(pb.read_bytes())
    core = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", precision="float16", use_env=False).report
    assert _errors(core, "#/$defs/core") == []
    # The schema is strict enough to fail: a missing key, a key it does not know, a bad colour.
    broken = json.loads(graph_report.read_text())
    del broken["graphs"][0]["summary"]
    broken["surprise"] = 1
    broken["graphs"][0]["nodes"]["blk_1/mm"]["color"] = "purple"
    found = "\n".join(_errors(broken))
    assert "'summary' is a required property" in found and "surprise" in found and "purple" in found


# ------------------------------------------------------------------ explain


def test_explain_by_op_type_layer_name_and_substring(keras_dir, capsys):
    assert main(["explain", str(keras_dir), "--op", "Conv2D", *GPU]) == 0
    out = capsys.readouterr().out
    assert "matches 2 node(s) by op type" in out and out.count("(Conv2D, in function") == 2
    assert main(["explain", str(keras_dir), "conv2d_1", *GPU, "--limit", "1"]) == 0
    out = capsys.readouterr().out
    assert "by path component" in out and "the first 1, computations first" in out
    first = next(line for line in out.splitlines() if "(" in line and not line.startswith("#"))
    assert first.startswith("functional_1/conv2d_1_1/") and "(Conv2D," in first  # not its kernel variable
    assert main(["explain", str(keras_dir), "ONVOLUTIO", *GPU, "--limit", "0"]) == 0
    out = capsys.readouterr().out
    assert "by substring" in out and "conv2d_10_1/convolution" in out


def test_explain_miss_suggests_computations_first(keras_dir, capsys):
    assert main(["explain", str(keras_dir), "conv2d_3", *GPU]) == 1
    err = _one_error_line(capsys)
    assert "no node 'conv2d_3'" in err
    suggestions = err.split("did you mean ", 1)[1]
    assert suggestions.startswith("conv2d_1") and "kernel" not in suggestions.split(",")[0]
    with pytest.raises(SystemExit):
        main(["explain", str(keras_dir)])  # NODE or --op is required


# ------------------------------------------------------------------ errors and conventions


@pytest.mark.parametrize("flags, message", [
    (["--lists", "nosuch"], "unknown profile 'nosuch'"),
    (["--target", "tpu:1"], "target"),
    (["--level", "FAST"], "unknown level"),
    (["--exclude", "("], "bad --exclude regular expression"),
    (["--deny", "NoSuchOp"], "NoSuchOp"),
])
def test_bad_options_are_reported_even_when_output_exists(flags, message, pb, tmp_path, capsys):
    out = tmp_path / "exists.pb"
    out.write_bytes(b"keep")
    assert main(["rewrite", str(pb), str(out), "--target", "gpu:8.0", "--precision", "float16", *flags]) == 1
    err = _one_error_line(capsys)
    assert message in err and "--overwrite" not in err
    assert out.read_bytes() == b"keep"


def test_bad_precision_is_a_usage_error_even_when_output_exists(pb, tmp_path, capsys):
    out = tmp_path / "exists.pb"
    out.write_bytes(b"keep")
    with pytest.raises(SystemExit) as exc:
        main(["rewrite", str(pb), str(out), "--precision", "float8"])
    assert exc.value.code == 2 and "--precision" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["model.keras", "weights.h5", "m.HDF5"])
def test_keras_files_are_refused_with_the_export_hint(name, tmp_path, capsys):
    path = tmp_path / name
    path.write_bytes(b"PK\x03\x04 not a graph")
    assert main(["rewrite", str(path), str(tmp_path / "o"), *GPU]) == 1
    assert "export it with `model.export(dir)` first" in _one_error_line(capsys)
    with pytest.raises(GraphFormatError, match="model.export"):
        sm.load_model(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_saved_model_cli_flag_names_are_accepted(keras_dir, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["rewrite", "--dir", str(keras_dir), str(out), *GPU, "--tag_set", "serve",
                 "--signature_def", "serving_default", "-q"]) == 0
    assert (out / "saved_model.pb").exists()
    capsys.readouterr()
    assert main(["explain", "--dir", str(keras_dir), "dense", *GPU, "--limit", "1"]) == 0
    assert "(MatMul, in function" in capsys.readouterr().out
    assert main(["nodes", "--dir", str(keras_dir), "pool"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("# 'pool' matches ") and not first.startswith("# 'pool' matches 0 ")
    with pytest.raises(SystemExit):
        main(["rewrite", "--dir", str(keras_dir), str(keras_dir), str(out)])  # INPUT twice
