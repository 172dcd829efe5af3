"""Corpus tests: parity with TensorFlow's pass, round trip, determinism and numerics on
real Keras / TF1 graphs built in-process (see ``corpus.py``).

Parity: with ``lists="tensorflow"`` and ``target="gpu:8.0"`` the (node, type attr) pairs
converted to float16, in the main graph and in every function Grappler optimizes, equal
TensorFlow's, and we insert no more casts.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import amp_rewrite
import corpus
from amp_rewrite.graph.io import export_graph_def, import_graph_def
from amp_rewrite.graph.op_registry import default_registry
from tf_oracle import amp_cast_count, converted_type_attrs, tf_amp_rewrite

HEAVY = {"resnet50", "mobilenetv2"}


def _param(name: str):
    marks = [pytest.mark.slow] if name.split("/")[0] in HEAVY else []
    return pytest.param(name, marks=marks, id=name)


ALL = [_param(n) for n in corpus.corpus_names()]
INFERENCE = [_param(n) for n in corpus.corpus_names() if n.endswith("/inference") or n == "while_v1"]


def _ours(item, **kw):
    return amp_rewrite.rewrite_graph_def(
        item.graph_def, target="gpu:8.0", lists="tensorflow", fetches=list(item.fetches),
        functions="reachable", use_env=False, **kw,
    )


def _runs(graph_def, item) -> bool:
    try:
        corpus.run(graph_def, item)
    except tf.errors.OpError:
        return False
    return True


@pytest.mark.parametrize("name", ALL)
def test_parity_with_tensorflow(name):
    """Exact parity with TensorFlow's pass, its known bugs reproduced."""
    item = corpus.build(name)
    ref = tf_amp_rewrite(item.graph_def, list(item.fetches))
    ours = _ours(item, tensorflow_bugs=True)
    theirs_set = converted_type_attrs(item.graph_def, ref)
    ours_set = converted_type_attrs(item.graph_def, ours.graph_def)
    assert ours_set, "the corpus graph should have something to convert"
    assert ours_set == theirs_set, (
        f"only TF: {sorted(theirs_set - ours_set)[:10]}; only ours: {sorted(ours_set - theirs_set)[:10]}"
    )
    assert amp_cast_count(item.graph_def, ours.graph_def) <= amp_cast_count(item.graph_def, ref)
    assert ours.report["converted_attrs"] == len(ours_set)


@pytest.mark.parametrize("name", ALL)
def test_default_mode_differs_from_tensorflow_only_where_tensorflow_is_broken(name):
    """Without the bugs: the same result, except on graphs where TensorFlow's output cannot
    run (KNOWN_DIFFERENCES.md KD-3: a TensorList crossing a While loop); there ours runs."""
    item = corpus.build(name)
    ref = tf_amp_rewrite(item.graph_def, list(item.fetches))
    ours = _ours(item)
    theirs_set = converted_type_attrs(item.graph_def, ref)
    ours_set = converted_type_attrs(item.graph_def, ours.graph_def)
    if ours_set != theirs_set:
        assert ours_set < theirs_set, "we may only convert less, never more"
        tagged = [n for n, d in ours.report["nodes"].items() if "[KD-" in d["reason"]
                  or any("[KD-" in a["reason"] for a in d.get("attrs", {}).values())]
        assert tagged, "a difference must come from a listed known difference"
        assert not _runs(ref, item), "TensorFlow's output runs, so the difference is not justified"
        assert _runs(ours.graph_def, item)


@pytest.mark.parametrize("name", ALL)
def test_round_trip_is_byte_identical(name):
    item = corpus.build(name)
    reg = default_registry()
    out = export_graph_def(import_graph_def(item.graph_def, reg), reg)
    assert out.SerializeToString(deterministic=True) == item.graph_def.SerializeToString(deterministic=True)


def test_functions_are_rewritten_with_function_naming():
    item = corpus.build("rnn/training")
    ours = _ours(item)
    changed = {f for f, *_ in converted_type_attrs(item.graph_def, ours.graph_def) if f}
    assert changed, "the While bodies of the LSTM/GRU hold MatMuls that should convert"
    fdefs = {f.signature.name: f for f in ours.graph_def.library.function}
    for fname in changed:
        body = fdefs[fname]
        names = {n.name for n in body.node_def}
        for node in body.node_def:
            for text in node.input:
                src = text.lstrip("^").split(":")[0]
                assert src in names or any(a.name == src for a in body.signature.input_arg)
                if node.op == "Cast" or src.endswith("-AutoMixedPrecision"):
                    assert text.startswith("^") or text.count(":") in (0, 2)
    # All functions by default (a SavedModel may call ones this graph does not).
    everything = amp_rewrite.rewrite_graph_def(item.graph_def, target="gpu:8.0", fetches=list(item.fetches),
                                               lists="tensorflow", use_env=False)
    assert len(everything.report["functions"]) >= len(ours.report["functions"])


def test_output_is_deterministic_across_runs_and_hash_seeds(tmp_path):
    """Three items (a Keras training step, an RNN's with its loops, a TF1 while loop), each
    rewritten in three processes with different hash seeds: one output, the in-process one.
    One process per seed rewrites all three (a process costs TensorFlow's import)."""
    names = ["mlp/training", "rnn/training", "while_v1"]
    jobs = []
    for i, name in enumerate(names):
        item = corpus.build(name)
        path = tmp_path / f"in{i}.pb"
        path.write_bytes(item.graph_def.SerializeToString())
        jobs.append((str(path), list(item.fetches)))
    script = textwrap.dedent(f"""
        import hashlib, json, amp_rewrite
        for path, fetches in {jobs!r}:
            gd = amp_rewrite.load_graph_def(path)
            r = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", fetches=fetches, use_env=False)
            print("digest", hashlib.sha256(r.graph_def.SerializeToString(deterministic=True)).hexdigest(),
                  hashlib.sha256(json.dumps(r.report, sort_keys=True).encode()).hexdigest())
    """)
    runs = set()
    for seed in ("0", "1", "12345"):
        env = {"PYTHONHASHSEED": seed, "TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"}
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        runs.add(tuple(line for line in out.stdout.splitlines() if line.startswith("digest ")))
    assert len(runs) == 1
    (digests,) = runs
    assert len(digests) == len(names)
    for name, line in zip(names, digests):
        item = corpus.build(name)
        in_process = amp_rewrite.rewrite_graph_def(item.graph_def, target="gpu:8.0", fetches=list(item.fetches),
                                                   use_env=False)
        assert line.split()[1] == hashlib.sha256(in_process.graph_def.SerializeToString(deterministic=True)).hexdigest()


def _rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - ref)) / max(float(np.max(np.abs(ref))), 1e-6))


#: Relative tolerance of inference outputs vs float32 (max abs error over max abs value).
#: float16 keeps 11 significant bits (2**-11 ~ 5e-4 per rounding); deep nets accumulate
#: that over tens of layers, so 2e-2 leaves headroom without hiding a wrong cast.
INFERENCE_RTOL = {"float16": 2e-2, "bfloat16": 8e-2}


@pytest.mark.parametrize("precision, target", [("float16", "gpu:8.0"), ("bfloat16", "cpu")])
@pytest.mark.parametrize("name", INFERENCE)
def test_rewritten_inference_graphs_run_close_to_float32(name, precision, target):
    item = corpus.build(name)
    result = amp_rewrite.rewrite_graph_def(item.graph_def, target=target, precision=precision,
                                           fetches=list(item.fetches), use_env=False)
    assert result.report["converted_nodes"] > 0
    ref = corpus.run(item.graph_def, item)
    got = corpus.run(result.graph_def, item)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        assert np.all(np.isfinite(g)) or not np.all(np.isfinite(r))
        assert _rel_err(g, r) < INFERENCE_RTOL[precision], f"{name}: relative error {_rel_err(g, r):.3g}"


@pytest.mark.parametrize("name", [p for p in ALL if p.id.endswith("/training")])
def test_rewritten_training_steps_run(name):
    """One training step of the rewritten graph runs; its loss is finite and no further from
    float32 than TensorFlow's rewrite (ResNet50 at batch 2 normalizes by tiny batch variances,
    so both rewrites move its loss by several percent)."""
    item = corpus.build(name)
    result = amp_rewrite.rewrite_graph_def(item.graph_def, target="gpu:8.0", fetches=list(item.fetches),
                                           use_env=False)
    assert result.report["converted_nodes"] > 0
    assert_loss_as_close_as_tensorflow(item, result.graph_def)


def assert_loss_as_close_as_tensorflow(item, graph_def) -> None:
    """The rewritten training step's loss is finite and no further from float32 than
    TensorFlow's rewrite (or 10% of it), up to 1% slack."""
    loss_f32 = float(np.ravel(corpus.run(item.graph_def, item)[0])[0])
    loss = float(np.ravel(corpus.run(graph_def, item)[0])[0])
    assert np.isfinite(loss)
    ref = tf_amp_rewrite(item.graph_def, list(item.fetches))
    tf_error = abs(float(np.ravel(corpus.run(ref, item)[0])[0]) - loss_f32) if _runs(ref, item) else np.inf
    assert abs(loss - loss_f32) <= min(tf_error, 0.1 * abs(loss_f32)) + 1e-2 * max(1.0, abs(loss_f32))
