"""The right precision by default, the spellings users bring, true reasons when nothing is
converted, and terminal-safe CLI output (issues 23 and 24)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import amp_rewrite
from amp_rewrite.cli import main, terminal_safe
from amp_rewrite.errors import TargetError
from amp_rewrite.plan.targets import Device, Target, auto_precision, parse_precision, parse_target


def _graph():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 16], name="x")
        w = tf.constant(np.random.default_rng(1).standard_normal((16, 4), np.float32), name="w")
        logits = tf.matmul(x, w, name="logits")
        tf.identity(tf.nn.softmax(logits, name="probs"), name="out")
    return graph.as_graph_def()


@pytest.mark.parametrize("spelling, expected", [
    ("fp16", "float16"), ("FP16", "float16"), ("half", "float16"), ("float16", "float16"),
    ("bf16", "bfloat16"), ("BFloat16", "bfloat16"), ("auto", "auto"), (tf.float16, "float16"),
    (tf.bfloat16, "bfloat16"), (np.dtype("float16"), "float16"),
])
def test_precision_spellings(spelling, expected):
    assert parse_precision(spelling) == expected


@pytest.mark.parametrize("bad", ["float32", "int8", None, 16, tf.float32])
def test_bad_precision_is_a_target_error(bad):
    with pytest.raises(TargetError, match="precision"):
        parse_precision(bad)
    with pytest.raises(TargetError, match="precision"):
        amp_rewrite.rewrite_graph_def(_graph(), target="gpu:8.0", precision=bad, use_env=False)


def test_auto_precision_per_device():
    assert auto_precision(parse_target("gpu:8.0"))[0] == "float16"
    assert auto_precision(parse_target("cpu"))[0] == "bfloat16"
    bf16_cpu = Target("cpu", (Device("CPU", 0, None, frozenset({"avx512_bf16"})),))
    precision, why = auto_precision(bf16_cpu)
    assert precision == "bfloat16" and "avx512_bf16" in why
    fp16_only = Target("cpu", (Device("CPU", 0, None, frozenset({"avx512_fp16"})),))
    assert auto_precision(fp16_only)[0] == "float16"


def test_default_precision_is_auto_and_the_report_says_why():
    """On an offline CPU target the default used to be float16; it is now the CPU's type."""
    result = amp_rewrite.rewrite_graph_def(_graph(), target="cpu", fetches=["out"], use_env=False)
    assert result.report["precision"] == "bfloat16"
    assert "bfloat16" in result.report["precision_reason"]
    assert result.report["nodes"]["logits"]["dtype"] == "bfloat16"
    gpu = amp_rewrite.rewrite_graph_def(_graph(), target="gpu:8.0", fetches=["out"], use_env=False)
    assert gpu.report["precision"] == "float16"
    assert gpu.report["nodes"]["logits"]["dtype"] == "float16"
    assert "Tensor Cores" in gpu.report["precision_reason"]


def test_nothing_converted_reasons_tell_the_cases_apart():
    gd = _graph()
    kw = dict(target="gpu:8.0", fetches=["out"], use_env=False)
    once = amp_rewrite.rewrite_graph_def(gd, **kw)
    assert once.report["converted_nodes"] > 0
    again = amp_rewrite.rewrite_graph_def(once.graph_def, **kw)
    assert again.report["skipped"].startswith("already rewritten")
    excluded = amp_rewrite.rewrite_graph_def(gd, exclude="logits", **kw)
    assert "excluded" in excluded.report["skipped"]
    declined = amp_rewrite.rewrite_graph_def(gd, target="cpu", fetches=["out"], use_env=False,
                                             lists="optimal")
    assert declined.report["converted_nodes"] == 0
    assert declined.report["skipped"].startswith("the cost model kept 1 of 1")
    assert "no allow-list op" not in declined.report["skipped"]
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4], name="x")
        tf.identity(tf.nn.relu(x), name="out")
    nothing = amp_rewrite.rewrite_graph_def(graph.as_graph_def(), **kw)
    assert nothing.report["skipped"].startswith("no allow-list op found")


def test_terminal_safe_escapes_control_characters():
    assert terminal_safe("plain name") == "plain name"
    shown = terminal_safe("evil\x1b[31mred\nnext\x00")
    assert "\x1b" not in shown and "\n" not in shown and "\x00" not in shown
    assert "\\x1b" in shown and "\\n" in shown


def test_cli_error_stays_on_one_line_for_a_path_with_a_newline(tmp_path, capsys):
    bad = tmp_path / "a\nb.pb"
    bad.write_bytes(b"garbage that is not a graph \x01\x02")
    assert main(["rewrite", str(bad), str(tmp_path / "o.pb"), "--target", "gpu:8.0"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("amp-rewrite: error:")


def test_cli_log_lines_escape_names_from_the_model(tmp_path):
    """A function name with an escape sequence reached the terminal raw in a WARNING."""
    from tensorflow.core.framework import function_pb2

    gd = _graph()
    fdef = function_pb2.FunctionDef()
    fdef.signature.name = "evil\x1b[2Jfn"
    attr = fdef.signature.attr.add()  # parametrized: skipped with a log line naming it
    attr.name, attr.type = "T", "type"
    gd.library.function.append(fdef)
    src = tmp_path / "g.pb"
    src.write_bytes(gd.SerializeToString())
    proc = subprocess.run([sys.executable, "-m", "amp_rewrite.cli", "-v", "rewrite", str(src),
                           str(tmp_path / "o.pb"), "--target", "gpu:8.0"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "\x1b" not in proc.stderr + proc.stdout


def test_cli_accepts_precision_spellings_and_has_a_version(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("amp-rewrite ")
    assert main(["lists", "--target", "gpu:8.0", "--precision", "FP16"]) == 0
    assert "float16" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["lists", "--precision", "float32"])


# -------------------------------------------------------------- F17: wrong-type arguments

_WRONG_TYPES = [
    ("target", None), ("target", 8.0), ("target", ["gpu:8.0"]), ("target", b"gpu:8.0"),
    ("precision", None), ("precision", 16), ("precision", tf.float32), ("precision", ["float16"]),
    ("lists", None), ("lists", 3), ("lists", ["default"]), ("lists_file", 1),
    ("lists_file", ["a.toml"]), ("level", 5), ("level", ["DEFAULT"]), ("level", b"DEFAULT"),
    ("fetches", [1]), ("fetches", "out"), ("fetches", 7), ("fetches", [None]), ("fetches", [b"out"]),
    ("add", ["Tanh"]), ("add", "deny"), ("add", {"deny": 1}), ("add", {1: ["Tanh"]}),
    ("add", {"deny": [1]}), ("remove", ["Tanh"]), ("remove", {"deny": None}),
    ("functions", None), ("functions", 1), ("planner", 1), ("planner", ["optimal"]),
    ("tensorflow_bugs", "yes"), ("tensorflow_bugs", None), ("use_env", "no"), ("use_env", 1),
    ("registry", "tf"), ("registry", 1), ("variable_shapes", [1]), ("variable_shapes", "x"),
    ("compiled", "yes"),
]


@pytest.mark.parametrize("name, value", _WRONG_TYPES, ids=[f"{n}={v!r}" for n, v in _WRONG_TYPES])
def test_wrong_type_arguments_get_our_error(name, value):
    """F17: 53 such arguments escaped as TypeError/AttributeError/KeyError."""
    kwargs = dict(target="gpu:8.0", use_env=False)
    kwargs[name] = value
    with pytest.raises(amp_rewrite.AmpRewriteError):
        amp_rewrite.rewrite_graph_def(_graph(), **kwargs)


@pytest.mark.parametrize("name, value", [("target", None), ("lists", None), ("level", 5),
                                         ("precision", tf.int8), ("add", ["Tanh"])])
def test_wrong_type_arguments_of_the_model_api_get_our_error(tmp_path, name, value):
    from amp_rewrite.models.saved_model import load_model, rewrite_model

    path = tmp_path / "g.pb"
    path.write_bytes(_graph().SerializeToString())
    kwargs = dict(target="gpu:8.0", use_env=False)
    kwargs[name] = value
    with pytest.raises(amp_rewrite.AmpRewriteError):
        rewrite_model(load_model(path), **kwargs)


def test_cli_error_for_a_list_op_name_with_a_newline_is_one_line(tmp_path, capsys):
    """F11: an op name with a line break split the error over several lines."""
    src = tmp_path / "g.pb"
    src.write_bytes(_graph().SerializeToString())
    code = main(["rewrite", str(src), str(tmp_path / "o.pb"), "--target", "gpu:8.0",
                 "--deny", "Tan\nh\x1b[2J"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("amp-rewrite: error:") and "\x1b" not in err
    assert not (tmp_path / "o.pb").exists()


def test_ctrl_c_during_the_tensorflow_import_survives_code_that_swallows_it():
    """A Ctrl-C that lands inside library code catching every exception (as some of
    TensorFlow's import does) is not lost: it is raised when the import block ends."""
    import signal

    from amp_rewrite.cli import _sigint_deferred

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with _sigint_deferred():
            try:
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(1000):  # the handler runs between bytecodes
                    pass
            except BaseException:  # what a bare ``except:`` does
                pytest.fail("the interrupt was raised inside the block")
    assert signal.getsignal(signal.SIGINT) is before
    with _sigint_deferred():  # no Ctrl-C: nothing raised
        pass


def test_ctrl_c_while_tensorflow_starts_prints_one_line(tmp_path):
    """F12: Ctrl-C while TensorFlow imports printed a 60-line traceback.  SIGINT is sent as
    soon as TensorFlow's library appears in the process (its import takes seconds); the
    command says it was interrupted in one line, exits 130 and writes nothing."""
    import signal
    import time

    src = tmp_path / "g.pb"
    src.write_bytes(_graph().SerializeToString())
    proc = subprocess.Popen([sys.executable, "-m", "amp_rewrite.cli", "rewrite", str(src),
                             str(tmp_path / "o.pb"), "--target", "gpu:8.0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    try:
        # Wait until TensorFlow's library is being loaded into the process, then interrupt.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            with open(f"/proc/{proc.pid}/maps") as maps:
                if "tensorflow" in maps.read():
                    break
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == ["amp-rewrite: interrupted; nothing was written"], lines
    assert not (tmp_path / "o.pb").exists()
