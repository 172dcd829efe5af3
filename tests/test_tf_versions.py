"""Op lists per TensorFlow release (issue 23): the ``[versions."X.Y"]`` deltas of the
``tensorflow`` profile, their schema, and how the API and the CLI pick the installed release.

Whether each recorded delta is *right* is checked against TensorFlow itself by
``tests/test_lists.py`` (its oracle tests load the installed release's lists), run under the
oldest supported release by ``tests/test_oldest_tf.py``.
"""

from __future__ import annotations

import textwrap
import tomllib
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from amp_rewrite import rewrite_graph_def
from amp_rewrite.api import installed_tf_version, resolve_lists, resolve_target, tensorflow_lists_version
from amp_rewrite.cli import main
from amp_rewrite.errors import ListError
from amp_rewrite.plan.lists import CATEGORIES, ListContext, load_lists, supported_tf_versions, tf_major_minor
from graphs import graph_def, v1

LISTS_DIR = Path(__file__).resolve().parent.parent / "lists"
CUDA = ListContext("float16", "cuda")
BF16 = ListContext("bfloat16", "onednn")
CONTEXTS = [CUDA, ListContext("float16", "cuda", 9000, 7000), ListContext("float16", "onednn"), BF16]
SUPPORTED = ["2.16", "2.17", "2.18", "2.19", "2.20", "2.21"]
# What the releases' own "paintbuckets" dumps showed (tests/test_lists.py re-checks the
# installed one): 2.19 added VoxelMax to the float16 allow list, 2.17 added Erfc and Inv to the
# bfloat16 infer list and IdentityN, While and StatelessWhile to the bfloat16 clear list.
LATE_FLOAT16 = {"2.16": {"VoxelMax"}, "2.17": {"VoxelMax"}, "2.18": {"VoxelMax"}}
LATE_BFLOAT16 = {"2.16": {"Erfc", "Inv", "IdentityN", "While", "StatelessWhile"}}


def always_known(op: str) -> bool:
    return True


def write(tmp_path: Path, text: str, name: str = "lists.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def listed(op_lists) -> set[str]:
    return {op for category in CATEGORIES for op in getattr(op_lists, category)}


# ---------------------------------------------------------------------------------------------
# The recorded releases
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [("2.16.2", "2.16"), ("2.21.0", "2.21"), ("2.21.0-rc1", "2.21"), ("2.22.0-dev20260101", "2.22"),
     ("2.16", "2.16"), (" 2.17.1 ", "2.17"), ("2.18.0rc0", "2.18"), ("10.0.1+local", "10.0")],
)
def test_tf_major_minor(text, expected):
    assert tf_major_minor(text) == expected


@pytest.mark.parametrize("text", ["", "2", "two.16", "2.x", "v2.16", "2.16.2 extra", "02.16", None, 2.16])
def test_tf_major_minor_rejects_what_is_no_version(text):
    with pytest.raises(ListError, match="not a TensorFlow version"):
        tf_major_minor(text)  # type: ignore[arg-type]


@pytest.mark.parametrize("profile", ["tensorflow", "default", "optimal"])
def test_packaged_profiles_support_2_16_to_2_21(profile):
    assert supported_tf_versions(profile) == SUPPORTED


def test_the_installed_release_is_supported():
    # pyproject's tensorflow>=2.16,<2.22 and the recorded releases must agree.
    assert tf_major_minor(tf.__version__) in SUPPORTED
    text = (LISTS_DIR.parent / "pyproject.toml").read_text()
    assert '"tensorflow>=2.16,<2.22"' in text


def test_newest_release_is_the_files_own_tables():
    data = tomllib.loads((LISTS_DIR / "tensorflow.toml").read_text())
    assert data["tf_version"] == SUPPORTED[-1]
    assert sorted(data["versions"]) == SUPPORTED[:-1]
    for context in CONTEXTS:
        for profile in ("tensorflow", "default", "optimal"):
            unversioned = load_lists(profile, context=context)
            newest = load_lists(profile, context=context, tf_version="2.21.0")
            # Plans depend only on the lists: the same lists mean byte-identical plans.
            assert unversioned.as_dict() == newest.as_dict()
            assert dict(unversioned.reasons) == dict(newest.reasons)
            assert unversioned.tf_version is None and newest.tf_version == "2.21"


@pytest.mark.parametrize("version", SUPPORTED[:-1])
@pytest.mark.parametrize("context", CONTEXTS, ids=lambda c: f"{c.precision}-{c.backend}-{c.cuda_version}")
def test_older_release_differs_exactly_by_the_recorded_ops(version, context):
    newest = load_lists("tensorflow", context=context, tf_version="2.21")
    older = load_lists("tensorflow", context=context, tf_version=version)
    late = (LATE_FLOAT16 if context.precision == "float16" else LATE_BFLOAT16).get(version, set())
    late = late & listed(newest)  # VoxelMax is cuda-only
    for category in CATEGORIES:
        assert getattr(older, category) == getattr(newest, category) - late, category
    assert older.tf_version == version and older.profile == "tensorflow"
    # The default profile keeps its own moves on top of each release's lists.
    default = load_lists("default", context=context, tf_version=version)
    assert "Softmax" in default.deny and default.profile == "default"
    assert not late & listed(default)


def test_version_entries_carry_reasons_and_only_remove_listed_ops():
    data = tomllib.loads((LISTS_DIR / "tensorflow.toml").read_text())
    for version, table in data["versions"].items():
        assert table["note"].strip(), version
        for precision in ("float16", "bfloat16"):
            for key, entries in table.get(precision, {}).items():
                for op, value in entries.items():
                    reason = value if isinstance(value, str) else value["reason"]
                    assert reason.strip() and "\n" not in reason and len(reason) < 130, (version, op)
                    if key == "remove":
                        assert any(op in t for t in data[precision].values()), (version, op)


@pytest.mark.parametrize("version", ["2.15", "2.22", "1.15", "3.0"])
def test_unrecorded_release_is_an_error_naming_the_supported_ones(version):
    with pytest.raises(ListError, match=rf"no op lists for TensorFlow {version}; it has them for 2\.16, 2\.17"):
        load_lists("default", context=CUDA, tf_version=version)


# ---------------------------------------------------------------------------------------------
# Schema of [versions]
# ---------------------------------------------------------------------------------------------

VERSIONED = """\
    schema_version = 1
    tf_version = "2.5"
    [float16.allow]
    MatMul = "gemm"
    [float16.deny]
    Exp = "exp"
    [float16.clear]
    Relu = "relu"
    [versions."2.3"]
    note = "older"
    [versions."2.3".float16.infer]
    Exp = "in 2.3, Exp was inferred"
    Tanh = "in 2.3, Tanh was inferred"
    [versions."2.3".float16.remove]
    Relu = "in 2.3, Relu was on no list"
    [versions."2.4"]
"""


def test_delta_moves_adds_and_removes(tmp_path):
    path = write(tmp_path, VERSIONED)
    base = load_lists(str(path), context=CUDA, is_known_op=always_known)
    assert base.as_dict() == {"allow": ["MatMul"], "infer": [], "deny": ["Exp"], "clear": ["Relu"]}
    old = load_lists(str(path), context=CUDA, is_known_op=always_known, tf_version="2.3.1")
    assert old.as_dict() == {"allow": ["MatMul"], "infer": ["Exp", "Tanh"], "deny": [], "clear": []}
    assert old.reasons["Exp"] == "in 2.3, Exp was inferred" and old.tf_version == "2.3"
    # An empty table declares a release with the same lists.
    same = load_lists(str(path), context=CUDA, is_known_op=always_known, tf_version="2.4")
    assert same.as_dict() == base.as_dict() and same.tf_version == "2.4"
    assert supported_tf_versions(str(path)) == ["2.3", "2.4", "2.5"]


def test_child_layers_apply_after_the_parents_release(tmp_path):
    parent = write(tmp_path, VERSIONED, "parent.toml")
    child = write(tmp_path, f"""\
        schema_version = 1
        extends = "{parent.name}"
        [float16.deny]
        Tanh = "mine"
    """, "child.toml")
    got = load_lists(str(child), context=CUDA, is_known_op=always_known, tf_version="2.3")
    assert got.as_dict() == {"allow": ["MatMul"], "infer": ["Exp"], "deny": ["Tanh"], "clear": []}
    # A user file layered on the profile: the profile's release applies beneath it.
    user = write(tmp_path, 'schema_version = 1\n[float16.clear]\nSigmoid = "mine"\n', "user.toml")
    layered = load_lists(str(parent), context=CUDA, is_known_op=always_known, user_file=user, tf_version="2.3")
    assert layered.clear == {"Sigmoid"} and "Relu" not in listed(layered)
    # Unversioned files alone: every release is the same, and the result says none.
    plain = load_lists(str(user), context=CUDA, is_known_op=always_known, tf_version="1.0")
    assert plain.as_dict()["clear"] == ["Sigmoid"] and supported_tf_versions(str(user)) == []
    # The result still names the release it was loaded for: the pass's behaviour depends on it.
    assert plain.tf_version == "1.0"


def test_only_the_selected_releases_ops_are_checked_against_the_registry(tmp_path):
    path = write(tmp_path, VERSIONED.replace('Tanh = "in 2.3', 'NoSuchOpInThisTF = "in 2.3'))
    known = {"MatMul", "Exp", "Relu"}.__contains__
    assert load_lists(str(path), context=CUDA, is_known_op=known).allow == {"MatMul"}
    with pytest.raises(ListError, match="unknown op name.*NoSuchOpInThisTF"):
        load_lists(str(path), context=CUDA, is_known_op=known, tf_version="2.3")


BASE = '[float16.allow]\nMatMul = "gemm"\n'


@pytest.mark.parametrize(
    "body, pattern",
    [
        (BASE + '[versions."2.3"]\n', r"\[versions\] needs 'tf_version'"),
        ('tf_version = 2.5\n' + BASE, r"'tf_version' must be a TensorFlow release"),
        ('tf_version = "2.5.1"\n' + BASE, r"'tf_version' must be a TensorFlow release"),
        ('tf_version = "2.5"\nversions = 3\n' + BASE, r"'versions' must be a table"),
        ('tf_version = "2.5"\n' + BASE + '[versions."2.x"]\n', r"not a TensorFlow release"),
        ('tf_version = "2.5"\n' + BASE + '[versions."2.5"]\n', r"repeats the file's own tf_version"),
        ('tf_version = "2.5"\n' + BASE + '[versions]\n"2.3" = 1\n', r'\[versions."2.3"\] must be a table'),
        ('tf_version = "2.5"\n' + BASE + '[versions."2.3"]\ncolour = 1\n', r"unknown key.*'colour'.*versions"),
        ('tf_version = "2.5"\n' + BASE + '[versions."2.3"]\nnote = ""\n', r"note must be a non-empty string"),
        ('tf_version = "2.5"\n' + BASE + '[versions."2.3".float16.remove]\nTanh = "x"\n',
         r'versions."2.3".float16.remove\] names op\(s\) on no list of this file: Tanh'),
        ('tf_version = "2.5"\n' + BASE + '[versions."2.3".float16.allow]\nMatMul = "gemm"\n',
         r"restates entries of this file unchanged: MatMul"),
        ('tf_version = "2.5"\n' + BASE + '[versions."2.3".float16.allow]\nTanh = "x"\n'
         '[versions."2.3".float16.deny]\nTanh = "y"\n', r"Tanh is on two float16 lists in one table"),
        ('tf_version = "2.5"\n' + BASE + '[versions."2.3".float16.allow]\nTanh = { reason = "x", min_cuda = "1" }\n',
         r'versions."2.3".float16.allow.Tanh.min_cuda'),
        ('tf_version = "2.5"\n' + BASE + '[versions."2.3".float16.remove]\nMatMul = ""\n',
         r'versions."2.3".float16.remove.MatMul: the reason must be a non-empty string'),
    ],
)
def test_invalid_version_tables_are_rejected(tmp_path, body, pattern):
    path = write(tmp_path, "schema_version = 1\n" + body)
    with pytest.raises(ListError, match=pattern):
        load_lists(str(path), context=CUDA, is_known_op=always_known, tf_version="2.3")


# ---------------------------------------------------------------------------------------------
# The API and CLI boundary
# ---------------------------------------------------------------------------------------------


def test_api_uses_the_installed_release_unless_told_otherwise():
    gpu = resolve_target("gpu:8.0")
    assert installed_tf_version() == tf.__version__
    here = tf_major_minor(tf.__version__)
    assert resolve_lists("tensorflow", target=gpu, precision="float16", environ={})[0].tf_version == here
    with tensorflow_lists_version("2.16.1"):
        assert resolve_lists("tensorflow", target=gpu, precision="float16", environ={})[0].tf_version == "2.16"
        # An explicit argument beats the surrounding override.
        explicit = resolve_lists("tensorflow", target=gpu, precision="float16", environ={}, tf_version="2.18")
        assert explicit[0].tf_version == "2.18"
        with tensorflow_lists_version(None):
            assert resolve_lists("tensorflow", target=gpu, precision="float16", environ={})[0].tf_version == "2.16"
    assert resolve_lists("tensorflow", target=gpu, precision="float16", environ={})[0].tf_version == here
    with pytest.raises(ListError, match="not a TensorFlow version"):
        with tensorflow_lists_version("latest"):
            pass


def _erfc_graph():
    def build():
        x = v1.placeholder(tf.float32, (8, 8), name="x")
        tf.identity(tf.math.erfc(tf.matmul(x, x, name="mm"), name="erfc"), name="out")

    return graph_def(build)


def test_rewrite_follows_the_releases_lists():
    # TensorFlow 2.16's bfloat16 lists do not have Erfc: it stays float32 there, and is
    # inferred (bfloat16 after the MatMul) from 2.17 on.
    gd = _erfc_graph()
    options = dict(target="cpu", precision="bfloat16", lists="tensorflow", fetches=["out"], use_env=False)
    with tensorflow_lists_version("2.16"):
        old = rewrite_graph_def(gd, **options)
    with tensorflow_lists_version("2.17"):
        new = rewrite_graph_def(gd, **options)
    assert old.report["nodes"]["erfc"]["dtype"] == "float32"
    assert new.report["nodes"]["erfc"]["dtype"] == "bfloat16"
    assert old.report["nodes"]["mm"]["dtype"] == new.report["nodes"]["mm"]["dtype"] == "bfloat16"
    # Both run and stay close to float32.
    feed = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    for result in (old, new):
        graph = tf.Graph()
        with graph.as_default():
            tf.graph_util.import_graph_def(result.graph_def, name="")
        with tf.compat.v1.Session(graph=graph) as session:
            value = session.run("out:0", {"x:0": feed})
        assert value.dtype == np.float32 and np.all(np.isfinite(value))


@pytest.mark.parametrize("version, precision, converts_tanh", [
    ("2.16", "float16", False), ("2.19", "float16", False), ("2.20", "float16", True), ("2.21", "float16", True),
    ("2.16", "bfloat16", True), ("2.19", "bfloat16", True), ("2.21", "bfloat16", True),
])
def test_infer_after_allow_runs_in_every_mode_from_2_20(version, precision, converts_tanh):
    # TensorFlow 2.16 to 2.19 run "infer after allow" (an infer op fed directly by an allow op
    # becomes allow) only in their bfloat16 mode; 2.20 and 2.21 in every mode.  Each release's
    # own pass did so on this graph; tests/test_golden.py checks it against the installed one.
    def build():
        x = v1.placeholder(tf.float32, (8, 8), name="x")
        tf.identity(tf.tanh(tf.matmul(x, x, name="mm"), name="tanh"), name="out")

    target = "gpu:8.0" if precision == "float16" else "cpu"
    with tensorflow_lists_version(version):
        result = rewrite_graph_def(graph_def(build), target=target, precision=precision, lists="tensorflow",
                                   fetches=["out"], use_env=False)
    nodes = result.report["nodes"]
    assert nodes["mm"]["dtype"] == precision
    assert (nodes["tanh"]["dtype"] == precision) is converts_tanh, nodes["tanh"]


def test_default_options_plan_is_the_installed_releases(tmp_path):
    # Without an override the API's lists are exactly load_lists' for the installed release.
    gd = _erfc_graph()
    here = tf_major_minor(tf.__version__)
    implicit = rewrite_graph_def(gd, target="cpu", precision="bfloat16", fetches=["out"], use_env=False)
    with tensorflow_lists_version(here):
        explicit = rewrite_graph_def(gd, target="cpu", precision="bfloat16", fetches=["out"], use_env=False)
    assert implicit.graph_def.SerializeToString(deterministic=True) == explicit.graph_def.SerializeToString(
        deterministic=True)
    assert implicit.report == explicit.report


def test_cli_tf_version(capsys):
    argv = ["lists", "--lists", "tensorflow", "--target", "cpu", "--precision", "bfloat16"]
    assert main(argv + ["--tf-version", "2.16"]) == 0
    old = capsys.readouterr().out
    assert main(argv + ["--tf-version", "2.17.1"]) == 0
    new = capsys.readouterr().out
    assert "\nErfc " not in old and "\nErfc " in new
    assert main(argv + ["--tf-version", "2.15"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("amp-rewrite: error:") and "no op lists for TensorFlow 2.15" in err
    with pytest.raises(SystemExit) as exit_info:
        main(argv + ["--tf-version", "latest"])
    assert exit_info.value.code == 2
    assert "--tf-version: not a TensorFlow version" in capsys.readouterr().err
