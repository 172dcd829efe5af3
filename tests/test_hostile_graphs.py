"""Hostile graphs (issue 24, F1, F2, F5, F9): nothing of the input runs, nothing crashes the
process, the caller's GraphDef is never touched, and nothing recursive walks user-sized
structures.  Each test reproduces the defect the adversarial review found."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, function_pb2, graph_pb2, types_pb2

import amp_rewrite
from amp_rewrite.errors import AmpRewriteError, GraphFormatError, InvalidGraphError, ListError
from amp_rewrite.graph.io import MAX_CALL_DEPTH
from amp_rewrite.graph.node_checks import MAX_GRAPH_PORTS
from amp_rewrite.graph.tensor_names import MAX_PORTS
from amp_rewrite.graph.shapes import function_shapes, graph_shapes

F32 = types_pb2.DT_FLOAT


def _node(gd_nodes, name, op, inputs=(), **attrs):
    nd = gd_nodes.add()
    nd.name = name
    nd.op = op
    nd.input.extend(inputs)
    for key, value in attrs.items():
        if isinstance(value, attr_value_pb2.AttrValue):
            nd.attr[key].CopyFrom(value)
        elif key in ("T", "dtype", "DstT", "SrcT", "out_type", "Tshape", "Tidx", "index_type"):
            nd.attr[key].type = value
        else:
            nd.attr[key].CopyFrom(value)
    return nd


def _placeholder(nodes, name, shape, dtype=F32):
    nd = _node(nodes, name, "Placeholder", dtype=dtype)
    for d in shape:
        nd.attr["shape"].shape.dim.add().size = d
    return nd


def _const(nodes, name, value, dtype=None):
    tensor = tf.make_tensor_proto(value, dtype=dtype)
    nd = _node(nodes, name, "Const")
    nd.attr["dtype"].type = tensor.dtype
    nd.attr["value"].tensor.CopyFrom(tensor)
    return nd


def _func_attr(name):
    return attr_value_pb2.AttrValue(func=attr_value_pb2.NameAttrList(name=name))


def _types(*ts):
    return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(type=list(ts)))


def _call_function(fdef, name, callee):
    """Add to ``fdef`` a PartitionedCall of ``callee`` on its argument ``x``; return it."""
    call = fdef.node_def.add()
    call.name = name
    call.op = "PartitionedCall"
    call.input.append("x")
    call.attr["Tin"].CopyFrom(_types(F32))
    call.attr["Tout"].CopyFrom(_types(F32))
    call.attr["f"].CopyFrom(_func_attr(callee))
    return call


def _function(name, callee=None):
    fdef = function_pb2.FunctionDef()
    fdef.signature.name = name
    arg = fdef.signature.input_arg.add()
    arg.name, arg.type = "x", F32
    out = fdef.signature.output_arg.add()
    out.name, out.type = "y", F32
    if callee is None:
        relu = fdef.node_def.add()
        relu.name, relu.op = "relu", "Relu"
        relu.input.append("x")
        relu.attr["T"].type = F32
        fdef.ret["y"] = "relu:activations:0"
    else:
        _call_function(fdef, "call", callee)
        fdef.ret["y"] = "call:output:0"
    return fdef


def _calling_graph(functions, entry):
    """A main graph ``MatMul(call(x), w)`` whose call enters ``entry`` of ``functions``."""
    gd = graph_pb2.GraphDef()
    gd.versions.producer = 1700
    gd.library.function.extend(functions)
    _placeholder(gd.node, "x", (4, 4))
    _const(gd.node, "w", [[1.0] * 4] * 4, dtype=tf.float32)
    call = _node(gd.node, "call", "PartitionedCall", ["x"])
    call.attr["Tin"].CopyFrom(_types(F32))
    call.attr["Tout"].CopyFrom(_types(F32))
    call.attr["f"].CopyFrom(_func_attr(entry))
    _node(gd.node, "mm", "MatMul", ["call", "w"], T=F32)
    _node(gd.node, "out", "Identity", ["mm"], T=F32)
    return gd


def _recursive():
    return _calling_graph([_function("f", callee="f")], "f")


def _mutual():
    return _calling_graph([_function("f", callee="g"), _function("g", callee="f")], "f")


def _deep(depth):
    fns = [_function(f"f{i}", callee=f"f{i + 1}") for i in range(depth)] + [_function(f"f{depth}")]
    return _calling_graph(fns, "f0")


# ----------------------------------------------------------------------------------- F1


@pytest.mark.parametrize("build", [_recursive, _mutual, lambda: _deep(MAX_CALL_DEPTH + 10)],
                         ids=["recursive", "mutual", "deep"])
@pytest.mark.parametrize("planner", ["greedy", "optimal", "min-casts"])
def test_recursive_or_deep_call_graphs_are_refused(build, planner):
    gd = build()
    before = gd.SerializeToString()
    with pytest.raises(InvalidGraphError, match="recursive|nest"):
        amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", planner=planner, use_env=False,
                                      fetches=["out"])
    assert gd.SerializeToString() == before


def test_a_call_chain_within_the_limit_is_rewritten():
    gd = _deep(8)
    result = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="optimal", use_env=False,
                                           fetches=["out"])
    assert result.report["nodes"]["mm"]["op"] == "MatMul"


#: A child process that runs ``amp-rewrite`` (``cli.main``) on each argument list of its JSON
#: argument and prints ``[[exit code, stderr], ...]``.
_CLI_CASES = """
import contextlib, io, json, sys
from amp_rewrite.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    results.append([code, err.getvalue()])
print(json.dumps(results))
"""


def test_cli_does_not_crash_on_a_recursive_library(tmp_path):
    """The optimal planner used to hand this graph to TensorFlow's shape inference, which
    overflowed the C++ stack: exit 139 and nothing printed.  Run in a child process, as a
    crash would take pytest down with it (one for every case: a process costs TensorFlow's
    import); ``explain`` with the min-casts planner refuses a mutually recursive one too."""
    src, mutual = tmp_path / "rec.pb", tmp_path / "mutual.pb"
    src.write_bytes(_recursive().SerializeToString())
    mutual.write_bytes(_mutual().SerializeToString())
    cases = [["rewrite", str(src), str(tmp_path / "o.pb"), "--target", "gpu:8.0", *extra]
             for extra in (["--lists", "optimal"], ["--planner", "min-casts"])]
    cases.append(["explain", str(mutual), "mm", "--target", "gpu:8.0", "--planner", "min-casts"])
    proc = subprocess.run([sys.executable, "-c", _CLI_CASES, json.dumps(cases)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == len(cases)
    for code, stderr in results:
        assert code == 1, stderr[-2000:]
        assert "recursive" in stderr
        assert "Traceback" not in stderr
    assert not (tmp_path / "o.pb").exists()


# ----------------------------------------------------------------------------------- F2


def _reshape_by(value_nodes, value_name):
    """``Reshape(x, ExpandDims(<value>, 0))`` then a MatMul, so the planner prices it."""
    gd = graph_pb2.GraphDef()
    gd.versions.producer = 1700
    _placeholder(gd.node, "x", (-1,))
    value_nodes(gd)
    _const(gd.node, "axis", 0, dtype=tf.int32)
    _node(gd.node, "dims", "ExpandDims", [value_name, "axis"], T=types_pb2.DT_INT32,
          Tdim=attr_value_pb2.AttrValue(type=types_pb2.DT_INT32))
    _node(gd.node, "reshaped", "Reshape", ["x", "dims"], T=F32, Tshape=types_pb2.DT_INT32)
    _const(gd.node, "shape2", [1, -1], dtype=tf.int32)
    _node(gd.node, "row", "Reshape", ["reshaped", "shape2"], T=F32, Tshape=types_pb2.DT_INT32)
    _node(gd.node, "mm", "MatMul", ["row", "row"], T=F32,
          transpose_b=attr_value_pb2.AttrValue(b=True))
    _node(gd.node, "out", "Identity", ["mm"], T=F32)
    return gd


def _read_file_graph(path):
    def value(gd):
        _const(gd.node, "path", str(path).encode(), dtype=tf.string)
        _node(gd.node, "contents", "ReadFile", ["path"])
        _node(gd.node, "number", "StringToNumber", ["contents"], out_type=types_pb2.DT_INT32)

    return _reshape_by(value, "number")


def test_shape_inference_does_not_read_files_the_model_names(tmp_path):
    """TensorFlow's shape refiner used to run ReadFile to learn the Reshape's shape: the model
    read a file of its choosing, and the file's contents showed up in the shapes."""
    secret = tmp_path / "secret.txt"
    secret.write_text("7")
    gd = _read_file_graph(secret)
    shapes = graph_shapes(gd)
    assert shapes["reshaped"] in (((None,),), (None,)), shapes["reshaped"]
    assert "contents" not in shapes or shapes["contents"] in (((),), (None,))
    # The rewrite as a whole is the same whatever the file holds.
    reports = []
    for text in ("7", "100"):
        secret.write_text(text)
        result = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="optimal",
                                               use_env=False, fetches=["out"])
        reports.append(result.report["nodes"])
    assert reports[0] == reports[1]


def test_shape_inference_does_not_compute_the_inputs_products():
    """``MatMul(Fill([N, N]), Fill([N, N]))`` feeding a shape made the rewriter compute the
    product (N**3 work chosen by a 587-byte file).  With N=3 the old code folded it to a
    shape of 27 elements; now its value is never computed."""
    n = 3

    def value(gd):
        _const(gd.node, "fill_dims", [n, n], dtype=tf.int32)
        _const(gd.node, "one", 1.0, dtype=tf.float32)
        _node(gd.node, "a", "Fill", ["fill_dims", "one"], T=F32, index_type=types_pb2.DT_INT32)
        _node(gd.node, "prod", "MatMul", ["a", "a"], T=F32)
        _const(gd.node, "axes", [0, 1], dtype=tf.int32)
        _node(gd.node, "total", "Sum", ["prod", "axes"], T=F32, Tidx=types_pb2.DT_INT32,
              keep_dims=attr_value_pb2.AttrValue(b=False))
        _node(gd.node, "count", "Cast", ["total"], SrcT=F32, DstT=types_pb2.DT_INT32)

    gd = _reshape_by(value, "count")
    shapes = graph_shapes(gd)
    assert shapes["reshaped"][0] != (n ** 3,)
    assert shapes["reshaped"][0] in ((None,), None)
    # Severing Fill's value operand keeps what its shape function says about its dims.
    assert shapes["a"] == ((n, n),) and shapes["prod"] == ((n, n),)


def test_shape_arithmetic_is_still_folded():
    """What real models put in front of a shape (Shape, StridedSlice, Pack of constants)
    still gives exact shapes: the cut costs nothing on them."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (8, 6, 4), name="x")
        batch = tf.shape(x)[0]
        flat = tf.reshape(x, tf.stack([batch, -1]), name="flat")
        tf.identity(tf.matmul(flat, tf.ones((24, 2))), name="out")
    shapes = graph_shapes(graph.as_graph_def())
    assert shapes["flat"] == ((8, 24),)


def test_function_bodies_are_inert_too(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("5")
    body = _read_file_graph(secret)
    fdef = function_pb2.FunctionDef()
    fdef.signature.name = "reader"
    arg = fdef.signature.input_arg.add()
    arg.name, arg.type = "x", F32
    out = fdef.signature.output_arg.add()
    out.name, out.type = "y", F32
    for nd in body.node:
        if nd.name == "x":
            continue
        copy = fdef.node_def.add()
        copy.CopyFrom(nd)
        del copy.input[:]
        for text in nd.input:
            name, _, port = text.partition(":")
            if name == "x":
                copy.input.append("x")
                continue
            producer = next(p for p in body.node if p.name == name)
            arg_name = {"Const": "output", "ReadFile": "contents", "StringToNumber": "output",
                        "ExpandDims": "output", "Reshape": "output", "MatMul": "product"}[producer.op]
            copy.input.append(f"{name}:{arg_name}:{port or 0}")
    fdef.ret["y"] = "mm:product:0"
    shapes = function_shapes(fdef)
    assert shapes["reshaped"][0] in ((None,), None), shapes["reshaped"]


# ----------------------------------------------------------------------------------- F5


@pytest.mark.parametrize("lists", ["default", "optimal"])
def test_the_callers_graph_def_is_never_modified(lists):
    """TensorFlow's import adds default attrs to the GraphDef it is given; the optimal planner
    gave it the caller's.  A MatMul without its ``transpose_a`` attr shows it."""
    gd = graph_pb2.GraphDef()
    gd.versions.producer = 1700
    _placeholder(gd.node, "x", (2, 2))
    _node(gd.node, "mm", "MatMul", ["x", "x"], T=F32)
    _node(gd.node, "out", "Identity", ["mm"], T=F32)
    before = gd.SerializeToString(deterministic=True)
    result = amp_rewrite.rewrite_graph_def(gd, target="cpu", precision="float16", lists=lists,
                                           use_env=False, fetches=["out"])
    assert gd.SerializeToString(deterministic=True) == before
    assert "transpose_a" not in gd.node[1].attr
    if result.report["converted_nodes"] == 0:
        assert result.graph_def.SerializeToString(deterministic=True) == before


@pytest.mark.parametrize("lists", ["default", "optimal"])
def test_the_callers_function_library_is_never_modified(lists):
    """Regression (found by the full suite's plan digests, 2026-11-25): shape inference of a
    function body handed the caller's FunctionDef to TensorFlow's ``function_def_to_graph_def``,
    which reads ``arg_attr[i]`` of every argument -- and reading a protobuf map inserts the
    key, so the caller's library grew empty ``arg_attr`` entries and a second rewrite of the
    same GraphDef saw a different graph."""
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([4, 8], tf.float32)] + [tf.TensorSpec([8, 8], tf.float32)] * 2)
    def body(x, w, v):
        return tf.nn.relu(tf.matmul(x, w)) + tf.matmul(x, v)

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 8], name="x")
        w = tf.constant(np.ones((8, 8), np.float32), name="w")
        tf.identity(body(x, w, w), name="out")
    gd = g.as_graph_def()
    for f in gd.library.function:  # as in exported graphs: not every argument has attrs
        del f.arg_attr[1]
        del f.arg_attr[2]
    keys = [sorted(f.arg_attr) for f in gd.library.function]
    assert keys == [[0]]
    before = gd.SerializeToString(deterministic=True)
    amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", precision="float16", lists=lists,
                                  use_env=False, fetches=["out"])
    assert [sorted(f.arg_attr) for f in gd.library.function] == keys
    assert gd.SerializeToString(deterministic=True) == before


# ----------------------------------------------------------------------------------- F9


_DEPTHS = (109, 150, 1000)


def _deeply_nested_text(depth: int) -> str:
    """A text GraphDef whose ``func`` attr nests ``depth`` deep."""
    text = 'node { name: "x" op: "Placeholder" attr { key: "dtype" value { type: DT_FLOAT } } }\n'
    text += ('node { name: "n" op: "PartitionedCall" input: "x" '
             'attr { key: "Tin" value { list { type: DT_FLOAT } } } '
             'attr { key: "Tout" value { list { type: DT_FLOAT } } } attr { key: "f" value { ')
    text += 'func { name: "f" attr { key: "a" value { ' * depth
    return text + "} } } " * depth + "} } }"


@pytest.mark.parametrize("depth", _DEPTHS)
def test_text_graph_nesting_func_attrs_deeply_is_a_format_error(tmp_path, depth):
    """a) ``func`` attrs nested 109 deep or more in a text GraphDef: a RecursionError, or
    (109-999) a DecodeError traceback when written as text, or a binary output that nothing
    can read back."""
    path = tmp_path / "deep.pbtxt"
    path.write_text(_deeply_nested_text(depth))
    with pytest.raises(GraphFormatError, match="nested too deeply"):
        amp_rewrite.load_graph_def(path)


def test_the_cli_refuses_deeply_nested_text_graphs_in_one_line(tmp_path):
    """The same inputs through ``amp-rewrite rewrite``, written as binary and as text: exit 1,
    one line, no traceback, no output file.  In a child process (a crash of TensorFlow's
    parser would take pytest down with it), which runs every case: a process costs
    TensorFlow's import."""
    cases, outputs = [], []
    for depth in _DEPTHS:
        path = tmp_path / f"deep{depth}.pbtxt"
        path.write_text(_deeply_nested_text(depth))
        for suffix in ("pb", "pbtxt"):
            out = tmp_path / f"o{depth}.{suffix}"
            cases.append(["rewrite", str(path), str(out), "--target", "gpu:8.0"])
            outputs.append(out)
    proc = subprocess.run([sys.executable, "-c", _CLI_CASES, json.dumps(cases)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == len(cases)
    for (code, stderr), out in zip(results, outputs):
        assert code == 1 and "Traceback" not in stderr, (out.name, stderr[-2000:])
        assert "nested too deeply" in stderr, out.name
        assert not out.exists()


def test_list_file_nesting_arrays_deeply_is_a_list_error(tmp_path):
    """b) a list file with 3000 nested arrays raised RecursionError."""
    path = tmp_path / "deep.toml"
    path.write_text("schema_version = 1\nx = " + "[" * 3000 + "]" * 3000 + "\n")
    with pytest.raises(ListError, match="nested"):
        amp_rewrite.rewrite_graph_def(_recursive_free_graph(), target="gpu:8.0", lists_file=str(path),
                                      use_env=False)


def _recursive_free_graph():
    gd = graph_pb2.GraphDef()
    _placeholder(gd.node, "x", (2, 2))
    _node(gd.node, "mm", "MatMul", ["x", "x"], T=F32)
    return gd


def test_exclude_with_a_huge_repeat_count_is_our_error():
    """d) ``--exclude 'x{99999999999}'`` raised OverflowError."""
    with pytest.raises(AmpRewriteError, match="exclude"):
        amp_rewrite.rewrite_graph_def(_recursive_free_graph(), target="gpu:8.0",
                                      exclude="x{99999999999}", use_env=False)


# ------------------------------------------------------------------ IGNORE_PERFORMANCE


_IGNORE_PERFORMANCE_SCRIPT = r"""
import json, sys
sys.path.insert(0, {tests!r})
import numpy as np
import tensorflow as tf
import amp_rewrite
from tf_oracle import converted_type_attrs, tf_amp_rewrite

graph = tf.Graph()
with graph.as_default():
    x = tf.compat.v1.placeholder(tf.float32, [8, 16], name="x")
    w = tf.constant(np.ones((16, 4), np.float32), name="w")
    tf.identity(tf.matmul(x, w, name="logits"), name="out")
gd = graph.as_graph_def()
ours = amp_rewrite.rewrite_graph_def(gd, target="gpu:6.1", precision="float16", fetches=["out"])
theirs = tf_amp_rewrite(gd, ["out"], gpus=("6.1",))
print(json.dumps({{"ours": ours.report["nodes"].get("logits", {{}}).get("dtype", "float32"),
                   "skipped": ours.report["skipped"],
                   "tf": sorted(n for _, n, _ in converted_type_attrs(gd, theirs))}}))
"""


@pytest.mark.parametrize("value", ["1", "true", "0"])
def test_ignore_performance_variable_is_honoured_like_tensorflow(tmp_path, value):
    """TensorFlow's own AMP tests set it so that pre-Volta GPUs are rewritten; with it set and
    a 6.1 GPU, TensorFlow rewrote and we returned the graph unchanged.  TensorFlow reads the
    variable once per process, so each value runs in its own."""
    script = tmp_path / "ignore_perf.py"
    script.write_text(_IGNORE_PERFORMANCE_SCRIPT.format(tests=os.path.dirname(__file__)))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
           "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_IGNORE_PERFORMANCE": value}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if value == "0":
        assert got["ours"] == "float32" and got["tf"] == [] and got["skipped"]
    else:
        assert got["tf"] == ["logits"]
        assert got["ours"] == "float16"


def test_ignore_performance_variable_with_a_bad_value_is_our_error(monkeypatch):
    from amp_rewrite.errors import TargetError

    monkeypatch.setenv("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_IGNORE_PERFORMANCE", "maybe")
    with pytest.raises(TargetError, match="IGNORE_PERFORMANCE"):
        amp_rewrite.rewrite_graph_def(_recursive_free_graph(), target="gpu:6.1")
    # use_env=False ignores it, as every TF_AUTO_MIXED_PRECISION_* variable.
    amp_rewrite.rewrite_graph_def(_recursive_free_graph(), target="gpu:6.1", use_env=False)


# ------------------------------------------------- counts and constants TensorFlow cannot take
#
# Found by the fuzzer (a deep run aborted in TensorFlow's import; an exhaustive byte-flip run
# then reproduced it): a count attribute or an input's port of two billion made TensorFlow's
# import, and this package's, allocate per-port lists until the process was killed; a Const
# whose value is a tensor of another type than its dtype attribute made a shape function fail
# a CHECK and abort the process.


def _unpacked(num, count=1):
    """``count`` Unpacks of ``x`` (4x4) with ``num`` outputs each; a MatMul reads the first."""
    gd = graph_pb2.GraphDef()
    gd.versions.producer = 1700
    _placeholder(gd.node, "x", (4, 4))
    for k in range(count):
        _node(gd.node, f"u{k}", "Unpack", ["x"], T=F32, num=attr_value_pb2.AttrValue(i=num),
              axis=attr_value_pb2.AttrValue(i=0))
    _node(gd.node, "row", "Reshape", ["u0", "shape"], T=F32, Tshape=types_pb2.DT_INT32)
    _const(gd.node, "shape", [2, 2], dtype=tf.int32)
    _node(gd.node, "mm", "MatMul", ["row", "row"], T=F32)
    _node(gd.node, "out", "Identity", ["mm"], T=F32)
    return gd


def _added(n):
    gd = _recursive_free_graph()
    _node(gd.node, "sum", "AddN", ["mm", "mm"], T=F32, N=attr_value_pb2.AttrValue(i=n))
    return gd


@pytest.mark.parametrize("build", [lambda n: _unpacked(n), _added], ids=["Unpack num", "AddN N"])
@pytest.mark.parametrize("count", [MAX_PORTS + 1, 2 ** 31 - 1, 2 ** 40, -1])
def test_a_count_past_the_limit_is_refused_before_anything_expands_it(build, count):
    gd = build(count)
    before = gd.SerializeToString()
    with pytest.raises(InvalidGraphError, match=f"= {count}; amp_rewrite reads counts from 0 to {MAX_PORTS}"):
        amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="optimal", use_env=False)
    assert gd.SerializeToString() == before


def test_a_count_at_the_limit_is_read():
    """The limit is the first count refused: ``MAX_PORTS`` outputs are imported (only the
    type analysis is asked: TensorFlow's import of a million ports takes a while)."""
    from amp_rewrite.graph.io import import_graph_def
    from amp_rewrite.graph.op_registry import default_registry
    from amp_rewrite.graph.type_attrs import output_dtypes

    imported = import_graph_def(_unpacked(MAX_PORTS), default_registry())
    data = imported.graph.nodes["u0"]
    sig = default_registry().op("Unpack")
    assert len(output_dtypes(sig, data["dtypes"], data["ints"])) == MAX_PORTS


def test_counted_ports_are_bounded_for_the_whole_graph():
    count = MAX_GRAPH_PORTS // MAX_PORTS + 1
    with pytest.raises(InvalidGraphError, match=f"the graph declares {count * MAX_PORTS} output ports"):
        amp_rewrite.rewrite_graph_def(_unpacked(MAX_PORTS, count), target="gpu:8.0", use_env=False)


@pytest.mark.parametrize("port", [MAX_PORTS, 2 ** 31 - 1, 2 ** 64])
def test_an_input_past_the_port_limit_is_refused(port):
    """An op nobody knows has as many outputs as the highest port read from it: a consumer
    reading port 2**31 - 1 made the painter list two billion outputs."""
    gd = _recursive_free_graph()
    _node(gd.node, "custom", "SomeCustomOp", ["mm"])
    _node(gd.node, "reader", "Identity", [f"custom:{port}"], T=F32)
    with pytest.raises(InvalidGraphError, match=f"'reader'.*reads output port {port}; amp_rewrite reads nodes "
                                                f"of at most {MAX_PORTS} outputs"):
        amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", use_env=False)


def test_unknown_ops_ports_are_bounded_for_the_whole_graph():
    gd = _recursive_free_graph()
    count = MAX_GRAPH_PORTS // MAX_PORTS + 1
    for k in range(count):
        _node(gd.node, f"custom{k}", "SomeCustomOp", ["mm"])
        _node(gd.node, f"reader{k}", "Identity", [f"custom{k}:{MAX_PORTS - 1}"], T=F32)
    with pytest.raises(InvalidGraphError, match=f"declares {count * MAX_PORTS} output ports"):
        amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", use_env=False)


def _summed(gd, src, axes):
    """``gd`` with a ``Sum`` of ``src`` over ``axes`` added (a reduction the default profile's
    identity rule reads shapes for); returns ``gd``."""
    _const(gd.node, "axes", axes, dtype=tf.int32)
    _node(gd.node, "sum", "Sum", [src, "axes"], T=F32, Tidx=types_pb2.DT_INT32,
          keep_dims=attr_value_pb2.AttrValue(b=False))
    return gd


#: What every child process below starts with: the tests importable, amp_rewrite imported,
#: warnings off.  The case's own lines follow; its last output line is JSON.
_CHILD_PREAMBLE = r"""
import json, logging, sys
sys.path.insert(0, {tests!r})
import amp_rewrite
logging.disable(logging.WARNING)
"""


def _run_in_child(tmp_path, body):
    """Run ``body`` after :data:`_CHILD_PREAMBLE` in a child process (an abort there would take
    pytest down with it), check that it exited normally, and return the JSON it printed last."""
    script = tmp_path / "child.py"
    script.write_text(_CHILD_PREAMBLE.format(tests=os.path.dirname(__file__)) + body)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _retyped_axis_graph(in_function):
    """``ReverseV2(MatMul(x, x), axis)`` then a Sum, with ``axis`` a Const that declares int32
    but holds a quint16 tensor: TensorFlow's shape function read it as int32 and aborted."""
    gd = graph_pb2.GraphDef()
    gd.versions.producer = 1700
    nodes = gd.node
    if in_function:
        fdef = gd.library.function.add()
        fdef.signature.name = "reverse"
        arg = fdef.signature.input_arg.add()
        arg.name, arg.type = "x", F32
        out = fdef.signature.output_arg.add()
        out.name, out.type = "y", F32
        nodes = fdef.node_def
    axis = _const(nodes, "axis", [1], dtype=tf.int32)
    axis.attr["value"].tensor.dtype = types_pb2.DT_QUINT16
    reversed_input = "x" if in_function else "mm"
    _node(nodes, "rev", "ReverseV2", [reversed_input, "axis" if not in_function else "axis:output:0"], T=F32,
          Tidx=types_pb2.DT_INT32)
    _placeholder(gd.node, "x", (4, 4))
    _node(gd.node, "mm", "MatMul", ["x", "x"], T=F32)
    if in_function:
        fdef.ret["y"] = "rev:output:0"
        call = _node(gd.node, "rev", "PartitionedCall", ["mm"])
        call.attr["Tin"].CopyFrom(_types(F32))
        call.attr["Tout"].CopyFrom(_types(F32))
        call.attr["f"].CopyFrom(_func_attr("reverse"))
    return _summed(gd, "rev", [0, 1])


_RETYPED_CASES = r"""
from amp_rewrite.errors import InvalidGraphError
from test_hostile_graphs import _retyped_axis_graph

results = []
for in_function in (False, True):
    for lists in ("default", "optimal"):
        try:
            result = amp_rewrite.rewrite_graph_def(_retyped_axis_graph(in_function), target="gpu:8.0",
                                                   lists=lists, use_env=False)
            results.append(["skipped", result.report["skipped_functions"]])
        except InvalidGraphError as exc:
            results.append(["refused", str(exc)])
print(json.dumps(results))
"""


def test_a_constant_whose_value_has_another_type_is_refused_without_crashing(tmp_path):
    """In a child process, as the crash took pytest down with it: refused in the main graph;
    a function holding one is left unchanged (TensorFlow never imports its body)."""
    results = _run_in_child(tmp_path, _RETYPED_CASES)
    message = "Const node 'axis' declares dtype int32 but its value is a quint16 tensor"
    assert [kind for kind, _ in results] == ["refused", "refused", "skipped", "skipped"], results
    assert all(message in detail for _, detail in results[:2]), results
    for _, skipped in results[2:]:
        assert list(skipped) == ["reverse"] and message in skipped["reverse"], skipped


def _gather_graph(batch_dims):
    """``GatherV2(params, indices, axis)`` with the axis a placeholder (not a constant) and the
    given ``batch_dims``, then a MatMul and a Sum, so shapes are read."""
    gd = graph_pb2.GraphDef()
    gd.versions.producer = 1700
    _placeholder(gd.node, "params", (4, 32))
    _placeholder(gd.node, "indices", (16,), dtype=types_pb2.DT_INT32)
    _placeholder(gd.node, "axis", (), dtype=types_pb2.DT_INT32)
    _node(gd.node, "gather", "GatherV2", ["params", "indices", "axis"],
          Tparams=attr_value_pb2.AttrValue(type=F32), Tindices=attr_value_pb2.AttrValue(type=types_pb2.DT_INT32),
          Taxis=attr_value_pb2.AttrValue(type=types_pb2.DT_INT32), batch_dims=attr_value_pb2.AttrValue(i=batch_dims))
    _node(gd.node, "mm", "MatMul", ["params", "params"], T=F32, transpose_b=attr_value_pb2.AttrValue(b=True))
    return _summed(gd, "gather", [0])


_GATHER_CASES = r"""
from amp_rewrite.graph.shapes import graph_shapes
from test_hostile_graphs import _gather_graph

results = {}
for batch_dims in (8, -2 ** 31 + 1, 1, 0):
    gd = _gather_graph(batch_dims)
    amp_rewrite.estimate_step_time(gd, target="gpu:8.0")
    amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", lists="optimal", use_env=False)
    results[batch_dims] = graph_shapes(gd).get("gather")
print(json.dumps(results))
"""


def test_gather_batch_dims_that_abort_tensorflows_shape_function_are_not_imported(tmp_path):
    """``GatherV2`` with ``batch_dims = 8`` and an axis that is not a constant: TensorFlow's
    shape function made a shape of rank -6 and failed a CHECK, aborting the process (found by
    ``bench/hunt_aborts.py``).  Such a node is left out of the inert copy, like a call: it has
    no static shape.  ``batch_dims`` 0 and 1 keep theirs.  In a child process, as the abort
    took the process down."""
    shapes = _run_in_child(tmp_path, _GATHER_CASES)
    assert shapes[str(8)] is None and shapes[str(-2 ** 31 + 1)] is None, shapes
    assert shapes["0"] is not None and shapes["1"] is not None, shapes
