"""Hostile files and file systems (issue 24): links and special files in and around a model,
outputs that exist, appear or collide with inputs, signals and failures while the outputs
are committed, and a second rewrite of a rewritten SavedModel.

The rule under test: bad input gets an :class:`AmpRewriteError` (the CLI: one line, exit 1)
and loses nothing -- no half-written output, no modified input, no replaced file that was
not named with ``--overwrite``, no temporary left behind.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from amp_rewrite import demo
from amp_rewrite.models import saved_model as sm
from amp_rewrite.cli import main
from amp_rewrite.errors import AmpRewriteError, GraphFormatError
from graphs import SmallModule, graph_def, v1

CPU_BF16 = dict(target="cpu", precision="bfloat16", use_env=False)
GPU = ["--target", "gpu:8.0"]


@pytest.fixture(scope="module")
def saved_original(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("hostile") / "model"
    m = SmallModule()
    tf.saved_model.save(m, str(path), signatures={"serving_default": m.__call__})
    (path / "assets" / "vocab.txt").write_text("a\nb\n")
    return path


@pytest.fixture()
def saved(saved_original, tmp_path) -> pathlib.Path:
    """A private copy of a small TF2 SavedModel, for a test to plant things in."""
    path = tmp_path / "in"
    shutil.copytree(saved_original, path)
    return path


@pytest.fixture()
def pb(tmp_path) -> pathlib.Path:
    def build():
        x = v1.placeholder(tf.float32, (4, 4), name="x")
        tf.identity(tf.nn.softmax(tf.matmul(x, x, name="mm"), name="sm"), name="out")

    path = tmp_path / "in.pb"
    path.write_bytes(graph_def(build).SerializeToString())
    return path


def _snapshot(root: pathlib.Path) -> dict[str, object]:
    """Every entry under ``root``: file bytes, link targets, and the kind of anything else."""
    out: dict[str, object] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        elif p.is_file():
            out[rel] = p.read_bytes()
        elif not p.is_dir():
            out[rel] = ("special", stat.S_IFMT(p.lstat().st_mode))
        else:
            out[rel] = "dir"
    return out


def _leftovers(root: pathlib.Path) -> list[str]:
    return sorted(str(p) for p in root.rglob(".amp-rewrite-*"))


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("amp-rewrite: error:") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def _unblock_fifo_later(path: pathlib.Path, after: float = 20.0) -> threading.Timer:
    """Should a FIFO ever be opened for reading, open its write end after ``after`` seconds
    and close it, so that the reader sees end of file: a regression fails instead of
    hanging the suite."""
    def release() -> None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return  # nobody is reading: nothing to release
        os.close(fd)

    timer = threading.Timer(after, release)
    timer.daemon = True
    timer.start()
    return timer


def _unix_socket(path: pathlib.Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    return sock


# ------------------------------------------------------------------------------ F3: links and special files in a SavedModel


@pytest.mark.parametrize("plant", ["file_link_out", "dir_link_out", "link_out_and_back", "absolute_link",
                                   "socket", "fifo"])
def test_saved_model_with_links_out_or_special_files_is_refused(plant, saved, tmp_path):
    secret_dir = tmp_path / "secrets"
    secret_dir.mkdir()
    (secret_dir / "secret.txt").write_text("do not copy me")
    assets = saved / "assets"
    holder = None
    if plant == "file_link_out":      # assets/x -> /etc/secret
        planted = assets / "x"
        planted.symlink_to(os.path.relpath(secret_dir / "secret.txt", assets))
    elif plant == "dir_link_out":     # a link to / (here: to a directory outside the model)
        planted = assets / "root"
        planted.symlink_to(os.path.relpath(secret_dir, assets))
    elif plant == "link_out_and_back":  # in the copy it would lead back into the input
        planted = assets / "back"
        planted.symlink_to(os.path.join("..", "..", "..", tmp_path.name, "in", "assets", "vocab.txt"))
    elif plant == "absolute_link":    # inside the model, but the copy would point into the input
        planted = assets / "abs"
        planted.symlink_to(assets / "vocab.txt")
    elif plant == "socket":
        planted = assets / "sock"
        holder = _unix_socket(planted)
    else:
        planted = assets / "pipe"
        os.mkfifo(planted)
        holder = _unblock_fifo_later(planted)
    before = _snapshot(tmp_path)
    out = tmp_path / "out"
    try:
        with pytest.raises(GraphFormatError) as info:
            sm.rewrite_saved_model(saved, out, **CPU_BF16)
    finally:
        if holder is not None:
            holder.close() if isinstance(holder, socket.socket) else holder.cancel()
    assert str(planted) in str(info.value)
    assert _snapshot(tmp_path) == before  # no OUTPUT, no temporaries, input untouched


def test_device_in_saved_model_is_refused_before_anything_is_copied(saved, tmp_path):
    # Creating a device node needs root, which the project's machines and CI run as
    # (CONTRIBUTING.md); FIFOs and sockets are covered without it above.
    os.mknod(saved / "variables" / "zero", stat.S_IFCHR | 0o666, os.makedev(1, 5))  # /dev/zero
    with pytest.raises(GraphFormatError, match="character device"):
        sm.rewrite_saved_model(saved, tmp_path / "out", **CPU_BF16)
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


def test_relative_link_inside_the_model_is_copied_as_a_link(saved, tmp_path):
    (saved / "assets" / "alias").symlink_to("vocab.txt")
    (saved / "assets.extra").mkdir()
    (saved / "assets.extra" / "vocabs").symlink_to(os.path.join("..", "assets"))
    out = tmp_path / "out"
    sm.rewrite_saved_model(saved, out, **CPU_BF16)
    assert os.readlink(out / "assets" / "alias") == "vocab.txt"
    assert os.path.realpath(out / "assets" / "alias") == os.path.realpath(out / "assets" / "vocab.txt")
    assert os.readlink(out / "assets.extra" / "vocabs") == os.path.join("..", "assets")
    y = tf.saved_model.load(str(out)).signatures["serving_default"](x=np.ones((2, 8), np.float32))["y"]
    assert y.shape == (2, 4)


# ------------------------------------------------------------------------------ F19: special and huge INPUT files


@pytest.mark.parametrize("kind", ["fifo", "fifo_meta", "link_to_dev_zero", "socket"])
def test_non_regular_input_is_refused_before_it_is_opened(kind, tmp_path, capsys):
    src = tmp_path / ("in.meta" if kind == "fifo_meta" else "in.pb")
    holder = None
    if kind.startswith("fifo"):
        os.mkfifo(src)
        holder = _unblock_fifo_later(src)
    elif kind == "socket":
        holder = _unix_socket(src)
    else:
        src.symlink_to("/dev/zero")
    try:
        start = time.monotonic()
        with pytest.raises(GraphFormatError, match="not a regular file"):
            sm.load_model(src)
        out = tmp_path / ("out" + src.suffix)
        assert main(["rewrite", str(src), str(out), *GPU]) == 1
        assert time.monotonic() - start < 15, "refused at once, not after reading or waiting"
    finally:
        if holder is not None:
            holder.close() if isinstance(holder, socket.socket) else holder.cancel()
    assert "not a regular file" in _one_error_line(capsys)
    assert not out.exists()


def test_fifo_as_saved_model_pb_is_refused(saved, tmp_path):
    (saved / "saved_model.pb").unlink()
    os.mkfifo(saved / "saved_model.pb")
    timer = _unblock_fifo_later(saved / "saved_model.pb")
    try:
        with pytest.raises(GraphFormatError, match="saved_model.pb: a FIFO"):
            sm.load_model(saved)
    finally:
        timer.cancel()


def test_input_over_two_gib_is_refused_without_reading_it(tmp_path):
    src = tmp_path / "huge.pb"
    with open(src, "wb") as f:
        f.truncate(2**31)  # sparse: no disk used, and never read
    with pytest.raises(GraphFormatError, match="2 GiB"):
        sm.load_model(src)
    meta = tmp_path / "huge.meta"
    os.link(src, meta)
    with pytest.raises(GraphFormatError, match="2 GiB"):
        sm.load_model(meta)


# ------------------------------------------------------------------------------ F4: existing and special outputs


def test_existing_empty_output_file_needs_overwrite(pb, tmp_path, capsys):
    out = tmp_path / "out.pb"
    out.write_bytes(b"")
    assert main(["rewrite", str(pb), str(out), *GPU]) == 1
    assert "pass --overwrite" in _one_error_line(capsys)
    assert out.read_bytes() == b"" and _leftovers(tmp_path) == []
    assert main(["rewrite", str(pb), str(out), *GPU, "--overwrite", "-q"]) == 0
    assert out.stat().st_size > 0


def _special_outputs(tmp_path: pathlib.Path) -> list[pathlib.Path]:
    fifo = tmp_path / "fifo.pb"
    os.mkfifo(fifo)
    link = tmp_path / "link.pb"  # like /dev/stdout: a link to something special
    link.symlink_to(fifo)
    paths = [fifo, link]
    if os.geteuid() == 0:  # a /dev/null of our own
        null = tmp_path / "null.pb"
        os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        paths.append(null)
    return paths


def test_special_output_is_refused_even_with_overwrite(pb, tmp_path, capsys):
    for out in _special_outputs(tmp_path):
        before = _snapshot(tmp_path)
        assert main(["rewrite", str(pb), str(out), *GPU, "--overwrite"]) == 1
        assert "never replaced" in _one_error_line(capsys)
        assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("option", ["--report", "--graph"])
def test_extra_output_files_follow_the_output_rules(option, pb, tmp_path, capsys):
    extra = tmp_path / ("extra.json" if option == "--report" else "extra.html")
    extra.write_text("keep me")
    out = tmp_path / "out.pb"
    assert main(["rewrite", str(pb), str(out), *GPU, option, str(extra)]) == 1
    assert "pass --overwrite" in _one_error_line(capsys)
    assert extra.read_text() == "keep me" and not out.exists()
    (tmp_path / "specials").mkdir()
    for special in _special_outputs(tmp_path / "specials"):
        before = _snapshot(tmp_path)
        assert main(["rewrite", str(pb), str(out), *GPU, option, str(special), "--overwrite"]) == 1
        assert "never replaced" in _one_error_line(capsys)
        assert _snapshot(tmp_path) == before
    assert main(["rewrite", str(pb), str(out), *GPU, option, str(extra), "--overwrite", "-q"]) == 0
    assert extra.read_text() != "keep me"


def test_dump_dir_of_an_earlier_run_needs_overwrite_and_tensorboard_dir_may_hold_runs(pb, tmp_path, capsys):
    dumps, logs, out = tmp_path / "dumps", tmp_path / "logs", tmp_path / "out.pb"
    logs.mkdir()
    (logs / "other_run").mkdir()
    (logs / "other_run" / "events.out.tfevents.1.x").write_bytes(b"theirs")
    assert main(["rewrite", str(pb), str(out), *GPU, "--dump-dir", str(dumps), "--tensorboard", str(logs), "-q"]) == 0
    first = _snapshot(dumps)
    (dumps / "graphdef_preop_graph.pb.txt").write_text("edited by hand")
    assert main(["rewrite", str(pb), str(tmp_path / "o2.pb"), *GPU, "--dump-dir", str(dumps)]) == 1
    assert "--dump-dir" in _one_error_line(capsys) and not (tmp_path / "o2.pb").exists()
    assert (dumps / "graphdef_preop_graph.pb.txt").read_text() == "edited by hand"
    assert main(["rewrite", str(pb), str(tmp_path / "o2.pb"), *GPU, "--dump-dir", str(dumps), "--overwrite", "-q"]) == 0
    assert _snapshot(dumps) == first
    assert (logs / "other_run" / "events.out.tfevents.1.x").read_bytes() == b"theirs"
    assert _leftovers(tmp_path) == []


def test_special_file_inside_dump_dir_is_refused_even_with_overwrite(pb, tmp_path, capsys):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    os.mkfifo(dumps / "graphdef_AutoMixedPrecision_graph.pb.txt")
    before = _snapshot(tmp_path)
    assert main(["rewrite", str(pb), str(tmp_path / "out.pb"), *GPU, "--dump-dir", str(dumps), "--overwrite"]) == 1
    assert "never replaced" in _one_error_line(capsys)
    assert _snapshot(tmp_path) == before


# ------------------------------------------------------------------------------ F6: output that appears during the run


@pytest.mark.parametrize("when", ["rewriting", "staging"])
@pytest.mark.parametrize("form", ["saved_model", "graph_def"])
def test_output_that_appears_during_the_run_is_kept(form, when, saved, pb, tmp_path, monkeypatch):
    src, out = (saved, tmp_path / "out") if form == "saved_model" else (pb, tmp_path / "out.pb")
    # While rewriting: found when the output is staged.  While staging (the dumps are made
    # after the model is staged): found only by the final rename.
    name = "rewrite_model" if when == "rewriting" else "dump_files"
    real = getattr(sm, name)

    def concurrent_run_wins(*args, **kwargs):
        result = real(*args, **kwargs)
        if form == "saved_model":  # another run committed its output meanwhile
            out.mkdir()
            (out / "saved_model.pb").write_bytes(b"the other run's")
        else:
            out.write_bytes(b"the other run's")
        return result

    monkeypatch.setattr(sm, name, concurrent_run_wins)
    report, dumps = tmp_path / "r.json", tmp_path / "dumps"
    expected = "pass --overwrite" if when == "rewriting" else "appeared while the rewrite ran"
    with pytest.raises(AmpRewriteError, match=expected):
        sm.rewrite_saved_model(src, out, report_file=report, dump_dir=dumps, **CPU_BF16)
    kept = out / "saved_model.pb" if form == "saved_model" else out
    assert kept.read_bytes() == b"the other run's"
    assert not report.exists() and not dumps.exists() and _leftovers(tmp_path) == []


def test_output_that_appears_during_the_run_is_replaced_with_overwrite(saved, tmp_path, monkeypatch):
    out = tmp_path / "out"
    real = sm.rewrite_model

    def concurrent(*args, **kwargs):
        result = real(*args, **kwargs)
        out.mkdir()
        (out / "stale").write_text("x")
        return result

    monkeypatch.setattr(sm, "rewrite_model", concurrent)
    sm.rewrite_saved_model(saved, out, overwrite=True, **CPU_BF16)
    assert not (out / "stale").exists() and (out / "saved_model.pb").exists()
    assert _leftovers(tmp_path) == []


# ------------------------------------------------------------------------------ F7: outputs never replace inputs


def _lists_file(tmp_path: pathlib.Path) -> pathlib.Path:
    lists = tmp_path / "L.toml"
    lists.write_text('extends = "default"\n\n[float16.deny]\nTanh = "mine"\n')
    return lists


def test_extra_output_on_a_list_file_is_refused_even_with_overwrite(pb, tmp_path, capsys):
    lists = _lists_file(tmp_path)
    before = _snapshot(tmp_path)
    for args in (["--lists-file", str(lists), "--report", str(lists)],
                 ["--lists", str(lists), "--report", str(lists)]):
        assert main(["rewrite", str(pb), str(tmp_path / "out.pb"), *GPU, *args, "--overwrite"]) == 1
        assert "never modified" in _one_error_line(capsys)
        assert _snapshot(tmp_path) == before
    # The training path (checked before INPUT is even read).
    meta = tmp_path / "train.meta"
    meta.write_bytes(b"")
    before = _snapshot(tmp_path)
    assert main(["rewrite", str(meta), str(tmp_path / "out.meta"), "--loss-scale", "dynamic", *GPU,
                 "--lists-file", str(lists), "--report", str(lists), "--overwrite"]) == 1
    assert "never modified" in _one_error_line(capsys)
    assert _snapshot(tmp_path) == before


def test_list_file_inside_output_directory_is_never_deleted(saved, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    lists = _lists_file(out)
    before = _snapshot(tmp_path)
    assert main(["rewrite", str(saved), str(out), "--lists-file", str(lists), "--overwrite"]) == 1
    assert "never modified" in _one_error_line(capsys)
    assert _snapshot(tmp_path) == before


def test_dump_dir_never_overwrites_an_input_inside_it(pb, tmp_path, capsys):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    src = dumps / "graphdef_preop_graph.pb.txt"  # the very name of a dump file
    text = "# my own copy\n" + tf.compat.v1.GraphDef.FromString(pb.read_bytes()).__str__()
    src.write_text(text)
    assert main(["rewrite", str(src), str(tmp_path / "out.pbtxt"), *GPU, "--dump-dir", str(dumps),
                 "--overwrite"]) == 1
    assert "never modified" in _one_error_line(capsys)
    assert src.read_text() == text and not (tmp_path / "out.pbtxt").exists()
    assert _leftovers(tmp_path) == []
    # An input in the dump directory under another name is fine.
    other = tmp_path / "dumps2" / "model.pbtxt"
    other.parent.mkdir()
    other.write_text(text)
    assert main(["rewrite", str(other), str(tmp_path / "out.pbtxt"), *GPU, "--dump-dir", str(other.parent),
                 "-q"]) == 0
    assert other.read_text() == text


# ------------------------------------------------------------------------------ F8: demo --save


def test_demo_save_refuses_a_file_and_existing_models_before_any_work(tmp_path, capsys, monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("the demo built its model before checking --save")

    monkeypatch.setattr(demo, "build_demo_model", no_work)
    afile = tmp_path / "afile"
    afile.write_text("mine")
    assert main(["demo", "--save", str(afile)]) == 1
    assert "not a directory" in _one_error_line(capsys)
    assert afile.read_text() == "mine"
    save = tmp_path / "models"
    (save / "rewritten").mkdir(parents=True)
    (save / "rewritten" / "keep.txt").write_text("mine")
    before = _snapshot(tmp_path)
    assert main(["demo", "--save", str(save)]) == 1
    assert "pass --overwrite" in _one_error_line(capsys)
    assert _snapshot(tmp_path) == before


@pytest.fixture()
def quick_demo(monkeypatch):
    """The demo with its timing cut to the bone (the models and the rewrite are the same)."""
    monkeypatch.setattr(demo, "_ROUNDS", 1)
    monkeypatch.setattr(demo, "time_side_by_side",
                        lambda fns, rounds=1, warmup=0: {name: 1e-3 for name in fns})


def test_demo_save_writes_both_models_together_or_neither(quick_demo, tmp_path, monkeypatch, capsys):
    save = tmp_path / "models"
    (save / "rewritten").mkdir(parents=True)
    (save / "rewritten" / "stale.txt").write_text("old")

    def broken(*args, **kwargs):
        raise AmpRewriteError("the rewrite failed")

    with monkeypatch.context() as m:
        m.setattr(sm, "rewrite_model", broken)
        assert main(["demo", "--save", str(save), "--overwrite"]) == 1
    assert "the rewrite failed" in _one_error_line(capsys)
    assert sorted(p.name for p in save.iterdir()) == ["rewritten"], "no float32/ without its rewrite"
    assert (save / "rewritten" / "stale.txt").read_text() == "old"

    assert main(["demo", "--save", str(save), "--overwrite"]) == 0
    printed = capsys.readouterr().out
    assert f"Saved both models in {save}" in printed
    assert not (save / "rewritten" / "stale.txt").exists()
    for name in ("float32", "rewritten"):
        assert (save / name / "saved_model.pb").is_file()
        tf.saved_model.load(str(save / name))
    assert _leftovers(tmp_path) == []


# ------------------------------------------------------------------------------ F13: SIGTERM while staging

_SLOW_STAGING = """
import sys, time
import amp_rewrite.models.saved_model as sm
from amp_rewrite.cli import main

real = sm._fingerprint

def slow(directory, old):  # runs inside the staged copy of the model
    open(sys.argv[1], "w").close()
    time.sleep(300)
    return real(directory, old)

sm._fingerprint = slow
sys.exit(main(sys.argv[2:]))
"""


def test_sigterm_while_staging_removes_the_temporaries(saved, tmp_path, user_environ):
    marker, out = tmp_path / "staging-started", tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_STAGING, str(marker), "rewrite", str(saved), str(out),
                             "--target", "cpu", "--precision", "bfloat16"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=user_environ)
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "staging never started"
            time.sleep(0.2)
        assert _leftovers(tmp_path), "the staged copy exists while the step runs"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err[-2000:]
    assert err.strip().splitlines()[-1] == "amp-rewrite: terminated; nothing was written"
    assert "Traceback" not in err
    assert _leftovers(tmp_path) == [] and not out.exists()


def test_main_restores_the_sigterm_handler_it_replaced(capsys):
    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        assert main(["lists", "--target", "cpu", "--precision", "bfloat16"]) == 0
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


# ------------------------------------------------------------------------------ F14, F15: the commit


def _fail_moves_onto(monkeypatch, final: pathlib.Path, error: OSError) -> None:
    """Make moving a staged temporary onto ``final`` fail (os.rename, os.replace, os.link)."""
    for name in ("rename", "replace", "link"):
        real = getattr(os, name)

        def fake(src, dst, *args, _real=real, **kwargs):
            if os.fspath(dst) == str(final) and os.path.basename(os.fspath(src)).startswith(".amp-rewrite-") \
                    and "-old-" not in os.fspath(src):
                raise error
            return _real(src, dst, *args, **kwargs)

        monkeypatch.setattr(os, name, fake)


@pytest.mark.parametrize("failing", ["report", "graph", "output"])
def test_commit_is_all_or_nothing(failing, saved, tmp_path, monkeypatch):
    out, report, graph = tmp_path / "out", tmp_path / "r.json", tmp_path / "g.dot"
    out.mkdir()
    (out / "old.txt").write_text("old output")
    report.write_text("old report")
    before = _snapshot(tmp_path)
    target = {"report": report, "graph": graph, "output": out}[failing]
    _fail_moves_onto(monkeypatch, target, OSError(28, "No space left on device"))
    with pytest.raises(AmpRewriteError, match="No space left"):
        sm.rewrite_saved_model(saved, out, report_file=report, graph_file=graph, overwrite=True, **CPU_BF16)
    monkeypatch.undo()
    assert _snapshot(tmp_path) == before, "every output as it was, nothing left aside"


def test_failed_overwrite_of_a_directory_leaves_nothing_aside(saved, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old output")
    os.chmod(out, 0o555)  # read-only; root ignores that, so the rename below is made to fail
    real = os.rename

    def refuse(src, dst, *args, **kwargs):
        if os.fspath(src) == str(out):
            raise PermissionError(13, "Permission denied", str(src))
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", refuse)
    try:
        with pytest.raises(AmpRewriteError, match="Permission denied"):
            sm.rewrite_saved_model(saved, out, overwrite=True, **CPU_BF16)
        monkeypatch.undo()
        assert (out / "old.txt").read_text() == "old output"
        assert _leftovers(tmp_path) == []
        sm.rewrite_saved_model(saved, out, overwrite=True, **CPU_BF16)  # a read-only OUTPUT is replaced
        assert (out / "saved_model.pb").exists() and _leftovers(tmp_path) == []
    finally:
        os.chmod(out, 0o755)


# ------------------------------------------------------------------------------ F16: a fixed point


def test_rewriting_a_rewritten_keras_model_again_changes_no_byte(tmp_path):
    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((6, 6, 2)), keras.layers.Conv2D(4, 3, activation="relu"),
                              keras.layers.Flatten(), keras.layers.Dense(3), keras.layers.Softmax()])
    src, once, twice = tmp_path / "exported", tmp_path / "once", tmp_path / "twice"
    model.export(str(src), verbose=False)
    sm.rewrite_saved_model(src, once, **CPU_BF16)
    sm.rewrite_saved_model(once, twice, **CPU_BF16)
    assert _snapshot(twice) == _snapshot(once)
    assert (once / "fingerprint.pb").read_bytes() != (src / "fingerprint.pb").read_bytes()
    assert json.dumps(sorted(_snapshot(once))) == json.dumps(sorted(_snapshot(src)))


def _without_root_powers() -> list[str]:
    """A command prefix that runs a process bound by permission bits, as a user is: as root,
    setpriv without capabilities; as a user, nothing."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    # Root ignores permission bits; util-linux's setpriv (on every Debian-based machine) drops
    # that power for the child.
    assert setpriv is not None, "as root this test needs setpriv (util-linux) to drop capabilities"
    return [setpriv, "--bounding-set=-all", "--inh-caps=-all"]


def test_overwrite_of_a_read_only_output_directory(saved, tmp_path, user_environ):
    prefix = _without_root_powers()
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "old.txt").write_text("old output")
    for d in (out / "sub", out):
        os.chmod(d, 0o555)
    try:
        proc = subprocess.run([*prefix, sys.executable, "-m", "amp_rewrite", "rewrite", str(saved), str(out),
                               "--target", "cpu", "--precision", "bfloat16", "--overwrite", "-q"],
                              capture_output=True, text=True, timeout=300, env=user_environ)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert (out / "saved_model.pb").is_file() and not (out / "sub").exists()
        assert _leftovers(tmp_path) == []
    finally:
        for d in (out / "sub", out):
            if d.exists():
                os.chmod(d, 0o755)
