"""Loop-invariant Casts hoisted out of loop bodies (amp_rewrite.loop_hoist, lists' [loops]).

A Cast the rewrite puts in a While body runs every iteration; where its input is the same in
every iteration (a variable the loop does not write, a loop variable passed through) the
default profile makes it once, before the loop.  These check that it does, that the graph it
makes runs and computes bitwise what the unhoisted graph computes, and where it must not.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import amp_rewrite
from amp_rewrite.errors import ListError
from amp_rewrite.graph.io import functions_named_outside
from amp_rewrite.plan.lists import ListContext, load_lists

NO_HOIST = """schema_version = 1
name = "no-hoist"
extends = "default"
[loops]
hoist_invariant_casts = false
reason = "the comparison: Casts where TensorFlow's pass puts them"
"""

OPTS = dict(target="cpu", precision="bfloat16")


@pytest.fixture
def no_hoist(tmp_path):
    path = tmp_path / "no_hoist.toml"
    path.write_text(NO_HOIST)
    return str(path)


def _rng_var(rng, *shape):
    return tf.Variable(rng.normal(0, 0.3, shape).astype("float32"))


def _decoder(seed=0, steps=6, d=16):
    """A recurrent loop reading two weight variables in its body: (function, weights)."""
    rng = np.random.default_rng(seed)
    w, u = _rng_var(rng, d, d), _rng_var(rng, d, d)

    def run(x):
        def body(i, h):
            return i + 1, tf.tanh(tf.matmul(h, w) + tf.matmul(x, u))
        return tf.while_loop(lambda i, h: i < steps, body, (0, tf.zeros_like(x)))[1]

    return run, (w, u)


def _rewrite(fn, *args, **opts):
    concrete = tf.function(fn).get_concrete_function(*args)
    return amp_rewrite.rewrite_graph_def(concrete.graph.as_graph_def(), fetches=[t.name for t in concrete.outputs],
                                         **{**OPTS, **opts})


def _loop_bodies(gd):
    """{body name: FunctionDef} of the main graph's loops, and the loops."""
    loops = [n for n in gd.node if n.op in ("While", "StatelessWhile")]
    fdefs = {f.signature.name: f for f in gd.library.function}
    return {n.attr["body"].func.name: fdefs[n.attr["body"].func.name] for n in loops}, loops


def _casts(fdef):
    return [n for n in fdef.node_def if n.op == "Cast"]


def test_weight_reads_are_cast_once_before_the_loop(no_hoist):
    x = tf.constant(np.ones((4, 16), "float32"))
    fn, _ = _decoder()
    hoisted = _rewrite(fn, x)
    plain = _rewrite(fn, x, lists_file=no_hoist)

    # Both weights' reads, and x, which the body reads but never changes.
    entries = hoisted.report["hoisted_casts"]
    sources = sorted(e["source"].split(" ")[1] for e in entries)
    assert sources == ["read", "read", "variable"], entries
    assert "hoisted_casts" not in plain.report

    (body_name, body), = _loop_bodies(hoisted.graph_def)[0].items()
    (_, plain_body), = _loop_bodies(plain.graph_def)[0].items()
    # The three Casts left the body; the state's Cast (it changes every iteration) stays.
    assert len(_casts(plain_body)) - len(_casts(body)) == 3
    assert len(_casts(body)) >= 1
    by_name = {n.name: n for n in body.node_def}
    assert not any(by_name.get(c.input[0].split(":")[0], c).op == "ReadVariableOp" for c in _casts(body))
    # The loop grew three bfloat16 loop variables, passed through by the body.
    (loop,) = _loop_bodies(hoisted.graph_def)[1]
    (plain_loop,) = _loop_bodies(plain.graph_def)[1]
    assert list(loop.attr["T"].list.type) == list(plain_loop.attr["T"].list.type) + [tf.bfloat16.as_datatype_enum] * 3
    assert len(loop.attr["output_shapes"].list.shape) == len(loop.attr["T"].list.type)
    new_args = [a.name for a in body.signature.input_arg][-3:]
    assert all(body.ret[o.name] == a for o, a in zip(body.signature.output_arg[-3:], new_args))
    # ... fed by Casts before the loop, of the two reads made there and of x.
    main = {n.name: n for n in hoisted.graph_def.node}
    feeds = [main[i.split(":")[0]] for i in [i for i in loop.input if not i.startswith("^")][-3:]]
    assert [f.op for f in feeds] == ["Cast", "Cast", "Cast"]
    assert sorted(main[f.input[0].split(":")[0]].op for f in feeds) == ["Placeholder", "ReadVariableOp",
                                                                        "ReadVariableOp"]
    assert body_name in {f.signature.name for f in hoisted.graph_def.library.function}


def test_hoisted_graph_runs_and_computes_bitwise_what_the_unhoisted_one_does(no_hoist, caplog):
    x = tf.constant(np.random.default_rng(3).normal(size=(4, 16)).astype("float32"))
    results = {}
    for label, opts in (("hoisted", {}), ("plain", {"lists_file": no_hoist})):
        fn, _ = _decoder(seed=5)
        with caplog.at_level("INFO", logger="amp_rewrite"):
            results[label] = amp_rewrite.function(fn, **OPTS, **opts)(x).numpy()
    fn, _ = _decoder(seed=5)
    float32 = tf.function(fn)(x).numpy()
    assert np.array_equal(results["hoisted"], results["plain"])
    assert not np.array_equal(results["hoisted"], float32)  # it ran in bfloat16
    np.testing.assert_allclose(results["hoisted"], float32, atol=0.05)
    assert "3 of them hoisted out of loop bodies" in caplog.text


def test_a_loop_that_writes_a_variable_keeps_its_reads_in_the_body(no_hoist):
    rng = np.random.default_rng(1)
    w = _rng_var(rng, 8, 8)
    counter = tf.Variable(0.0)

    def fn(x):
        def body(i, h):
            counter.assign_add(1.0)  # a write through a resource the loop is handed
            return i + 1, tf.tanh(tf.matmul(h, w))
        return tf.while_loop(lambda i, h: i < 3, body, (0, x))[1]

    x = tf.constant(np.ones((2, 8), "float32"))
    assert "hoisted_casts" not in _rewrite(fn, x).report
    counter.assign(0.0)
    out = amp_rewrite.function(fn, **OPTS)(x).numpy()
    assert counter.numpy() == 3.0
    assert np.isfinite(out).all()


def test_a_write_inside_the_loop_to_the_weight_itself_is_seen_every_iteration():
    rng = np.random.default_rng(2)
    w = _rng_var(rng, 8, 8)

    def fn(x):
        def body(i, h):
            w.assign(w * 2.0)
            return i + 1, tf.matmul(h, w)
        return tf.while_loop(lambda i, h: i < 3, body, (0, x))[1]

    x = tf.constant(np.ones((2, 8), "float32"))
    assert "hoisted_casts" not in _rewrite(fn, x).report
    start = w.numpy()
    out = amp_rewrite.function(fn, **OPTS)(x).numpy()
    expected = np.ones((2, 8), "float32") @ (start * 2) @ (start * 4) @ (start * 8)
    np.testing.assert_allclose(out, expected, rtol=0.1, atol=0.1 * np.abs(expected).max())


def test_a_write_before_the_loop_is_read_by_the_hoisted_cast():
    """The read made before the loop waits for what the loop waits for (its control
    inputs, which order it after the assignment)."""
    rng = np.random.default_rng(4)
    w = _rng_var(rng, 8, 8)

    def fn(x):
        w.assign(tf.ones([8, 8]) * 0.5)
        def body(i, h):
            return i + 1, tf.matmul(h, w)
        return tf.while_loop(lambda i, h: i < 2, body, (0, x))[1]

    x = tf.constant(np.ones((2, 8), "float32"))
    result = _rewrite(fn, x)
    assert len(result.report["hoisted_casts"]) == 1
    (loop,) = _loop_bodies(result.graph_def)[1]
    main = {n.name: n for n in result.graph_def.node}
    data_inputs = [i for i in loop.input if not i.startswith("^")]
    read = main[main[data_inputs[-1].split(":")[0]].input[0]]
    assert read.op == "ReadVariableOp"
    waits = [i for i in loop.input if i.startswith("^")]
    assert any(main[w[1:]].op == "AssignVariableOp" for w in waits)
    assert [i for i in read.input if i.startswith("^")] == waits
    for _ in range(3):
        w.assign(rng.normal(size=(8, 8)).astype("float32"))
        out = amp_rewrite.function(fn, **OPTS)(x).numpy()
        np.testing.assert_array_equal(out, np.full((2, 8), 16.0, "float32"))  # (8 * 0.5) * 8 * 0.5


def test_a_loop_variable_the_body_passes_through_is_cast_once(no_hoist):
    rng = np.random.default_rng(6)
    w0 = tf.constant(rng.normal(0, 0.3, (8, 8)).astype("float32"))

    def fn(x, scale):
        w = w0 * scale  # computed before the loop, so a loop variable, not a variable read

        def body(i, h):
            return i + 1, tf.tanh(tf.matmul(h, w))
        return tf.while_loop(lambda i, h: i < 4, body, (0, x))[1]

    x = tf.constant(np.ones((2, 8), "float32"))
    s = tf.constant(1.5)
    result = _rewrite(fn, x, s)
    (entry,) = result.report["hoisted_casts"]
    assert entry["source"].endswith("which the body passes through unchanged")
    got = amp_rewrite.function(fn, **OPTS)(x, s).numpy()
    plain = amp_rewrite.function(fn, **OPTS, lists_file=no_hoist)(x, s).numpy()
    assert np.array_equal(got, plain)


def test_nested_loops_hoist_a_weight_out_of_both():
    rng = np.random.default_rng(7)
    w = _rng_var(rng, 8, 8)

    def fn(x):
        def outer(i, h):
            def inner(j, g):
                return j + 1, tf.tanh(tf.matmul(g, w))
            return i + 1, tf.while_loop(lambda j, g: j < 3, inner, (0, h))[1]
        return tf.while_loop(lambda i, h: i < 2, outer, (0, x))[1]

    x = tf.constant(np.ones((2, 8), "float32"))
    result = _rewrite(fn, x)
    hoisted = result.report["hoisted_casts"]
    assert [h["graph"] == "" for h in hoisted] == [False, True]  # inner body -> outer body -> main
    (loop,) = _loop_bodies(result.graph_def)[1]
    main = {n.name: n for n in result.graph_def.node}
    assert main[[i for i in loop.input if not i.startswith("^")][-1].split(":")[0]].op == "Cast"
    fdefs = {f.signature.name: f for f in result.graph_def.library.function}
    for body in (hoisted[0]["body"], hoisted[1]["body"]):
        nodes = {n.name: n for n in fdefs[body].node_def}
        assert not any(nodes.get(c.input[0].split(":")[0], c).op == "ReadVariableOp" for c in _casts(fdefs[body]))
    got = amp_rewrite.function(fn, **OPTS)(x).numpy()
    float32 = tf.function(fn)(x).numpy()
    np.testing.assert_allclose(got, float32, atol=0.05)
    assert not np.array_equal(got, float32)


def test_keras_lstm_training_trains_bitwise_as_without_hoisting(no_hoist):
    import keras

    def train(**opts):
        keras.utils.set_random_seed(1)
        inp = keras.Input((6,), dtype="int32")
        h = keras.layers.Embedding(32, 16)(inp)
        h = keras.layers.LSTM(16)(h)
        model = keras.Model(inp, keras.layers.Dense(3)(h))
        opt = keras.optimizers.SGD(0.1)
        lossf = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        @amp_rewrite.function(**OPTS, **opts)
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = lossf(y, model(x, training=True))
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        rng = np.random.default_rng(0)
        start = [v.numpy() for v in model.trainable_variables]
        losses = [float(step(rng.integers(0, 32, (4, 6)).astype("int32"), rng.integers(0, 3, (4,)).astype("int32")))
                  for _ in range(3)]
        return losses, start, [v.numpy() for v in model.trainable_variables]

    losses, start, weights = train()
    plain_losses, _, plain_weights = train(lists_file=no_hoist)
    assert losses == plain_losses
    assert all(np.array_equal(a, b) for a, b in zip(weights, plain_weights))
    assert all(not np.array_equal(a, b) for a, b in zip(weights, start))  # every weight trained


def test_tensorflow_profile_and_tensorflow_bugs_leave_casts_in_the_loop():
    x = tf.constant(np.ones((4, 16), "float32"))
    fn, _ = _decoder()
    assert "hoisted_casts" not in _rewrite(fn, x, lists="tensorflow").report
    assert "hoisted_casts" not in _rewrite(fn, x, tensorflow_bugs=True).report


def test_profiles_say_whether_they_hoist():
    ctx = ListContext("bfloat16", "onednn")
    known = lambda op: True  # noqa: E731
    assert load_lists("default", context=ctx, is_known_op=known).hoist_loop_casts
    assert load_lists("optimal", context=ctx, is_known_op=known).hoist_loop_casts  # inherited
    tf_lists = load_lists("tensorflow", context=ctx, is_known_op=known)
    assert not tf_lists.hoist_loop_casts and tf_lists.hoist_loop_casts_reason == ""


@pytest.mark.parametrize("table, message", [
    ("[loops]\nhoist_invariant_casts = true\n", "reason"),
    ("[loops]\nhoist_invariant_casts = 1\nreason = \"r\"\n", "true or false"),
    ("[loops]\nreason = \"r\"\n", "missing"),
    ("[loops]\nhoist_invariant_casts = true\nreason = \"r\"\nhoist = true\n", "hoist"),
    ("loops = 3\n", "table"),
])
def test_a_bad_loops_table_is_refused(tmp_path, table, message):
    path = tmp_path / "bad.toml"
    path.write_text(f'schema_version = 1\nextends = "default"\n{table}')
    with pytest.raises(ListError, match=message):
        load_lists(str(path), context=ListContext("bfloat16", "onednn"), is_known_op=lambda op: True)


def test_a_body_something_else_names_keeps_its_signature():
    x = tf.constant(np.ones((4, 16), "float32"))
    fn, _ = _decoder()
    concrete = tf.function(fn).get_concrete_function(x)
    gd = concrete.graph.as_graph_def()
    (body_name,) = _loop_bodies(gd)[0]
    grad = gd.library.gradient.add(function_name=body_name, gradient_func=body_name)
    assert body_name in functions_named_outside(gd, {f.signature.name for f in gd.library.function})
    assert grad.function_name == body_name
    result = amp_rewrite.rewrite_graph_def(gd, fetches=[t.name for t in concrete.outputs], **OPTS)
    assert "hoisted_casts" not in result.report
    fdefs = {f.signature.name: f for f in result.graph_def.library.function}
    original = {f.signature.name: f for f in gd.library.function}
    assert fdefs[body_name].signature == original[body_name].signature


def test_drawn_loops_compute_bitwise_what_they_compute_unhoisted(tmp_path):
    """Property: on drawn graphs with functional loops whose bodies read values from outside
    (captured: loop variables passed through), the hoisted rewrite's outputs are bitwise those
    of the rewrite that leaves the Casts in the bodies, and some draws do hoist."""
    from hypothesis import HealthCheck, given, settings

    from amp_rewrite.testing.strategies import graphs

    path = tmp_path / "no_hoist.toml"
    path.write_text(NO_HOIST)
    seen = {"hoisted": 0}

    @settings(max_examples=40, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(graphs(ops={"MatMul": 4, "Tanh": 1, "Add": 1, "Relu": 1}, while_loops=True, body_nodes=4))
    def check(case):
        opts = dict(target="gpu:8.0", precision="float16", use_env=False)
        hoisted = amp_rewrite.rewrite_graph_def(case.graph_def, **opts)
        if not hoisted.report.get("hoisted_casts"):
            return
        seen["hoisted"] += 1
        plain = amp_rewrite.rewrite_graph_def(case.graph_def, lists_file=str(path), **opts)
        for a, b in zip(case.run(hoisted.graph_def), case.run(plain.graph_def)):
            assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)

    check()
    assert seen["hoisted"] >= 3


def test_the_optimal_planner_prices_a_hoisted_cast_once_per_loop(tmp_path):
    """A large weight computed before the loop (a loop variable passed through) and a batch
    of one: cast every iteration, converting costs more than it saves, and the planner keeps
    the loop float32; cast once, before the loop, the bfloat16 MatMul wins."""
    no_hoist = tmp_path / "optimal_no_hoist.toml"
    no_hoist.write_text(NO_HOIST.replace('extends = "default"', 'extends = "optimal"'))
    w0 = tf.constant(np.random.default_rng(0).normal(0, 0.02, (1024, 1024)).astype("float32"))

    def fn(x, scale):
        w = w0 * scale

        def body(i, h):
            return i + 1, tf.tanh(tf.matmul(h, w))
        return tf.while_loop(lambda i, h: i < 64, body, (0, x))[1]

    args = (tf.constant(np.ones((1, 1024), "float32")), tf.constant(1.0))
    hoisting = _rewrite(fn, *args, lists="optimal")
    plain = _rewrite(fn, *args, lists_file=str(no_hoist))
    assert plain.report["converted_nodes"] == 0
    assert hoisting.report["converted_nodes"] > 0 and len(hoisting.report["hoisted_casts"]) == 1
    (body,) = [s for f, s in hoisting.report["functions"].items() if "placement" in s and "body" in f]
    est = body["placement"]["estimated_us"]
    assert est["optimal"] < est["float32"]


def test_a_loop_left_inconsistent_is_a_rewrite_error_before_anything_is_written():
    """The self-check after each hoist: a loop whose types and body signature disagree (here
    made so by hand) raises the product's error naming the loop."""
    import dataclasses

    from amp_rewrite import loop_hoist
    from amp_rewrite.errors import RewriteError
    from amp_rewrite.graph.io import import_graph_def
    from amp_rewrite.graph.op_registry import default_registry

    x = tf.constant(np.ones((4, 16), "float32"))
    fn, _ = _decoder()
    gd = _rewrite(fn, x).graph_def
    imported = import_graph_def(gd, default_registry())
    (loop,) = [n for n, d in imported.graph.nodes(data=True) if d["op"] in loop_hoist.LOOP_OPS]
    callees = dict(imported.graph.nodes[loop]["func_attrs"])
    body, cond = imported.functions[callees["body"]], imported.functions[callees["cond"]]
    loop_hoist._check_loop(imported.graph, loop, body, cond)  # as exported: consistent
    signatures = imported.graph.graph["signatures"]
    sig = signatures[callees["body"]]
    signatures[callees["body"]] = dataclasses.replace(sig, outputs=sig.outputs[:-1])
    with pytest.raises(RewriteError, match="body results"):
        loop_hoist._check_loop(imported.graph, loop, body, cond)


def test_a_loop_body_learns_the_shapes_of_the_variables_it_reads():
    """The variables behind a loop's resources (``variable_shapes``, which the training paths
    pass for a traced step's captured variables) reach its body where the body passes the
    resource through, so its weight reads and MatMuls are priced at their size, not the cost
    model's default."""
    from amp_rewrite.training.tf_function import captured_variable_shapes

    x = tf.constant(np.ones((4, 64), "float32"))
    fn, _ = _decoder(d=64)
    concrete = tf.function(fn).get_concrete_function(x)
    gd = concrete.graph.as_graph_def()
    shapes = captured_variable_shapes(concrete.graph)
    assert sorted(map(tuple, shapes.values())) == [(64, 64), (64, 64)]

    def body_matmuls(**kw):
        nodes = amp_rewrite.estimate_node_times(gd, target="gpu:8.0", **kw)
        (body,) = [f for f in nodes if "body" in f]
        return [t for t in nodes[body].values() if t.op == "MatMul"]

    assert not any(t.known_shape for t in body_matmuls())
    known = body_matmuls(variable_shapes=shapes)
    assert len(known) == 2 and all(t.known_shape for t in known)


# --- TensorFlow 1 loops (frames) ------------------------------------------------------------


def _tf1_graph(build):
    """``build()``'s graph with control flow v1 (TF1 frames: Enter/Merge/Switch/NextIteration/
    Exit), an ``init`` op beside it."""
    from tensorflow.python.ops import control_flow_util

    g = tf.Graph()
    old = control_flow_util.ENABLE_CONTROL_FLOW_V2
    control_flow_util.ENABLE_CONTROL_FLOW_V2 = False
    try:
        with g.as_default():
            build()
            tf.group(tf.compat.v1.global_variables_initializer(), name="init")
    finally:
        control_flow_util.ENABLE_CONTROL_FLOW_V2 = old
    return g.as_graph_def()


def _tf1_loop_out(x, step, nested: bool) -> None:
    """``out``: three iterations of ``h = step(h)`` from ``x`` in a TF1 while loop, each step
    in an inner loop of two iterations where ``nested``."""
    def body(i, h):
        if nested:
            h = tf.while_loop(lambda j, k: j < 2, lambda j, k: (j + 1, step(k)), (0, h))[1]
        else:
            h = step(h)
        return i + 1, h

    tf.identity(tf.while_loop(lambda i, h: i < 3, body, (0, x))[1], name="out")


def _tf1_loop_graph(resource, *, write=False, nested=False, d=16):
    """A TF1 while loop whose body multiplies by a weight variable; an ``init`` op and an
    ``out`` fetch."""
    def build():
        x = tf.compat.v1.placeholder(tf.float32, [4, d], name="x")
        w = tf.compat.v1.get_variable(
            "w", initializer=np.random.default_rng(0).normal(0, 0.3, (d, d)).astype("float32"),
            use_resource=resource)
        counter = tf.compat.v1.get_variable("counter", initializer=0.0, use_resource=resource)

        def step(h):
            deps = [counter.assign_add(1.0)] if write else []
            with tf.control_dependencies(deps):
                return tf.tanh(tf.matmul(h, w))

        _tf1_loop_out(x, step, nested)

    return _tf1_graph(build)


def _run_tf1(gd, x):
    g = tf.Graph()
    with g.as_default():
        tf.graph_util.import_graph_def(gd, name="")
    with tf.compat.v1.Session(graph=g) as sess:
        sess.run("init")
        return sess.run("out:0", {"x:0": x})


def _frame_casts(gd):
    """Inserted Casts that read an Enter (or a read of one) inside a frame."""
    nodes = {n.name: n for n in gd.node}
    found = []
    for n in gd.node:
        if n.op == "Cast" and "AutoMixedPrecision" in n.name:
            src = nodes[n.input[0].split(":")[0]]
            if src.op == "ReadVariableOp":
                src = nodes[src.input[0].split(":")[0]]
            if src.op == "Enter":
                found.append(n.name)
    return found


@pytest.mark.parametrize("resource", [False, True], ids=["ref-variable", "resource-variable"])
def test_a_tf1_loop_casts_its_weight_once_before_the_frame(resource, no_hoist):
    gd = _tf1_loop_graph(resource)
    opts = dict(target="gpu:8.0", precision="float16", fetches=["out"], use_env=False)
    hoisted = amp_rewrite.rewrite_graph_def(gd, **opts)
    plain = amp_rewrite.rewrite_graph_def(gd, lists_file=no_hoist, **opts)
    (entry,) = hoisted.report["hoisted_casts"]
    assert entry["body"] == "" and entry["index"] is None and entry["loop"].startswith("while")
    assert _frame_casts(plain.graph_def) and not _frame_casts(hoisted.graph_def)
    nodes = {n.name: n for n in hoisted.graph_def.node}
    enters = [n for n in hoisted.graph_def.node if n.op == "Enter" and n.attr["is_constant"].b
              and n.attr["T"].type == tf.float16.as_datatype_enum]
    assert len(enters) == 1
    assert enters[0].attr["frame_name"].s == nodes["while/Enter"].attr["frame_name"].s
    assert nodes[enters[0].input[0]].name == entry["outer_cast"]
    x = np.random.default_rng(1).normal(size=(4, 16)).astype("float32")
    got = _run_tf1(hoisted.graph_def, x)
    ref = _run_tf1(plain.graph_def, x)
    f32 = _run_tf1(gd, x)
    assert np.array_equal(got, ref) and not np.array_equal(got, f32)
    np.testing.assert_allclose(got, f32, atol=0.02)


@pytest.mark.parametrize("nested", [False, True], ids=["one-frame", "written-two-frames-deep"])
def test_a_tf1_loop_that_writes_a_resource_keeps_its_reads_in_the_frame(nested):
    gd = _tf1_loop_graph(True, write=True, nested=nested)
    result = amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", precision="float16", fetches=["out"],
                                           use_env=False)
    assert "hoisted_casts" not in result.report
    assert _frame_casts(result.graph_def)


@pytest.mark.parametrize("resource", [False, True], ids=["ref-variable", "resource-variable"])
def test_a_weight_in_nested_tf1_loops_leaves_both_frames(resource, no_hoist):
    gd = _tf1_loop_graph(resource, nested=True)
    opts = dict(target="gpu:8.0", precision="float16", fetches=["out"], use_env=False)
    hoisted = amp_rewrite.rewrite_graph_def(gd, **opts)
    frames = [h["loop"] for h in hoisted.report["hoisted_casts"]]
    assert len(frames) == 2 and frames[0] != frames[1]  # out of the inner frame, then the outer
    assert not _frame_casts(hoisted.graph_def)
    x = np.random.default_rng(2).normal(size=(4, 16)).astype("float32")
    plain = amp_rewrite.rewrite_graph_def(gd, lists_file=no_hoist, **opts)
    assert np.array_equal(_run_tf1(hoisted.graph_def, x), _run_tf1(plain.graph_def, x))


@pytest.mark.parametrize("nested", [False, True], ids=["one-frame", "two-frames"])
def test_a_tf1_read_ordered_after_a_write_by_a_control_edge_stays_in_its_frame(nested, no_hoist):
    """A read in the loop under ``tf.control_dependencies`` on something after a write outside
    the loop (the variable's handle entered earlier, without it): a read made before the loop
    would read the value before the write (a second review, 2026-11-28)."""
    rng = np.random.default_rng(0)
    w0 = rng.normal(0, 0.3, (16, 16)).astype("float32")

    def build():
        x = tf.compat.v1.placeholder(tf.float32, [4, 16], name="x")
        w = tf.compat.v1.get_variable("w", initializer=w0, use_resource=True)
        with tf.control_dependencies([w.assign(0.5 * w0, read_value=False)]):
            marker = tf.constant(0.0) + 0.0

        def step(h):
            w.read_value()  # enters the handle into the frame, with no control input
            with tf.control_dependencies([marker]):
                return tf.tanh(tf.matmul(h, w))

        _tf1_loop_out(x, step, nested)

    gd = _tf1_graph(build)
    opts = dict(target="gpu:8.0", precision="float16", fetches=["out"], use_env=False)
    hoisted = amp_rewrite.rewrite_graph_def(gd, **opts)
    plain = amp_rewrite.rewrite_graph_def(gd, lists_file=no_hoist, **opts)
    assert plain.report["converted_nodes"] > 0 and _frame_casts(hoisted.graph_def)
    x = np.random.default_rng(1).normal(size=(4, 16)).astype("float32")
    assert np.array_equal(_run_tf1(hoisted.graph_def, x), _run_tf1(plain.graph_def, x))


def test_a_tf1_inner_frame_keeps_its_cast_where_the_enclosing_frame_writes_the_variable(no_hoist):
    """An inner loop reads ``w``, the outer loop assigns it after the inner one: a read made
    before the inner frame runs in the outer one, where the next iteration's read could pass
    the previous iteration's write (parallel iterations).  Nothing is hoisted."""
    w0 = np.random.default_rng(0).normal(0, 0.3, (16, 16)).astype("float32")

    def build():
        x = tf.compat.v1.placeholder(tf.float32, [4, 16], name="x")
        w = tf.compat.v1.get_variable("w", initializer=w0, use_resource=True)

        def body(i, h):
            h = tf.while_loop(lambda j, k: j < 2, lambda j, k: (j + 1, tf.tanh(tf.matmul(k, w))), (0, h))[1]
            with tf.control_dependencies([h]):
                update = w.assign(w * 0.5, read_value=False)
            with tf.control_dependencies([update]):
                return i + 1, tf.identity(h)

        tf.identity(tf.while_loop(lambda i, h: i < 3, body, (0, x))[1], name="out")

    gd = _tf1_graph(build)
    opts = dict(target="gpu:8.0", precision="float16", fetches=["out"], use_env=False)
    hoisted = amp_rewrite.rewrite_graph_def(gd, **opts)
    plain = amp_rewrite.rewrite_graph_def(gd, lists_file=no_hoist, **opts)
    assert "hoisted_casts" not in hoisted.report and _frame_casts(hoisted.graph_def)
    x = np.random.default_rng(1).normal(size=(4, 16)).astype("float32")
    assert np.array_equal(_run_tf1(hoisted.graph_def, x), _run_tf1(plain.graph_def, x))


# --- What a review found (2026-11-28): files that must still load, writes that must be seen ---


def _decoder_module(d=16):
    rng = np.random.default_rng(0)

    class Decoder(tf.Module):
        def __init__(self):
            self.w = tf.Variable(rng.normal(0, 0.3, (d, d)).astype("float32"))
            self.u = tf.Variable(rng.normal(0, 0.3, (d, d)).astype("float32"))

        @tf.function(input_signature=[tf.TensorSpec([None, d], tf.float32)])
        def __call__(self, x):
            def body(i, h):
                return i + 1, tf.tanh(tf.matmul(h, self.w) + tf.matmul(x, self.u))
            return tf.while_loop(lambda i, h: i < 5, body, (0, tf.zeros_like(x)))[1]

    return Decoder()


def test_a_rewritten_saved_model_with_a_loop_loads_runs_and_differentiates(tmp_path, no_hoist):
    """A TF2 SavedModel whose loop's signature grew: ``tf.saved_model.load`` checks each
    function's ``_input_shapes`` against its arguments, and differentiating the loaded function
    rebuilds the loop's gradient from its ``_num_original_outputs``: it must load, compute what
    the Casts left in the loop compute, and give the weight its gradient (it came out 0)."""
    from amp_rewrite.models.saved_model import rewrite_saved_model

    tf.saved_model.save(_decoder_module(), str(tmp_path / "f32"))
    x = tf.constant(np.random.default_rng(1).normal(size=(3, 16)).astype("float32"))
    got = {}
    for label, opts in (("hoisted", {}), ("plain", {"lists_file": no_hoist})):
        report = rewrite_saved_model(str(tmp_path / "f32"), str(tmp_path / label), target="cpu", precision="bfloat16",
                                     use_env=False, **opts)
        assert (sum(len(g.get("hoisted_casts", ())) for g in report["graphs"]) > 0) == (label == "hoisted")
        model = tf.saved_model.load(str(tmp_path / label))
        with tf.GradientTape() as tape:
            y = model(x)
            loss = tf.reduce_sum(y)
        got[label] = (y.numpy(), tape.gradient(loss, model.w).numpy(),
                      list(model.signatures["serving_default"](x=x).values())[0].numpy())
    model = tf.saved_model.load(str(tmp_path / "f32"))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x))
    f32_grad = tape.gradient(loss, model.w).numpy()
    assert np.array_equal(got["hoisted"][0], got["plain"][0])
    assert np.array_equal(got["hoisted"][2], got["plain"][2])

    def err(g):
        return float(np.abs(g - f32_grad).max() / np.abs(f32_grad).max())

    # The hoisted weight's gradient is summed over the iterations in bfloat16 (the loop variable's
    # type), where the Cast in the loop summed float32 ones: a little further from float32.
    assert err(got["hoisted"][1]) < max(3 * err(got["plain"][1]), 0.05)


def test_a_graph_def_that_records_every_output_shape_still_imports(no_hoist):
    """``as_graph_def(add_shapes=True)`` gives every node ``_output_shapes``; importing checks
    that a loop has one per output."""
    fn, _ = _decoder()
    x = tf.constant(np.ones((4, 16), "float32"))
    concrete = tf.function(fn).get_concrete_function(x)
    gd = concrete.graph.as_graph_def(add_shapes=True)
    result = amp_rewrite.rewrite_graph_def(gd, fetches=[t.name for t in concrete.outputs], **OPTS)
    assert result.report["hoisted_casts"]
    (loop,) = _loop_bodies(result.graph_def)[1]
    assert len(loop.attr["_output_shapes"].list.shape) == len(loop.attr["T"].list.type)
    with tf.Graph().as_default():
        tf.graph_util.import_graph_def(result.graph_def, name="")


def test_a_tf1_meta_graph_and_saved_model_with_a_hoisted_frame_still_load(tmp_path):
    """TensorFlow 1's while_context collection names the frame's nodes; importing looks each
    one up, so the frame's Enter and read stay (unused) when the Cast leaves."""
    from tensorflow.python.ops import control_flow_util

    from amp_rewrite.models.saved_model import rewrite_saved_model

    old = control_flow_util.ENABLE_CONTROL_FLOW_V2
    control_flow_util.ENABLE_CONTROL_FLOW_V2 = False
    try:
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [None, 16], name="x")
            w = tf.compat.v1.get_variable(
                "w", initializer=np.random.default_rng(0).normal(0, 0.3, (16, 16)).astype("float32"), use_resource=True)
            out = tf.identity(tf.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, tf.tanh(tf.matmul(h, w))),
                                            (0, x))[1], name="out")
            init = tf.compat.v1.global_variables_initializer()
            tf.compat.v1.train.export_meta_graph(str(tmp_path / "m.meta"))
            with tf.compat.v1.Session() as sess:
                sess.run(init)
                builder = tf.compat.v1.saved_model.Builder(str(tmp_path / "sm"))
                builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={
                    "serving_default": tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"out": out})})
                builder.save()
    finally:
        control_flow_util.ENABLE_CONTROL_FLOW_V2 = old
    opts = dict(target="gpu:8.0", precision="float16", use_env=False)
    report = rewrite_saved_model(str(tmp_path / "m.meta"), str(tmp_path / "out.meta"), **opts)
    assert report["graphs"][0]["hoisted_casts"]
    with tf.Graph().as_default():
        tf.compat.v1.train.import_meta_graph(str(tmp_path / "out.meta"))
    report = rewrite_saved_model(str(tmp_path / "sm"), str(tmp_path / "sm_out"), **opts)
    assert report["graphs"][0]["hoisted_casts"]
    xv = np.ones((2, 16), "float32")
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        tf.compat.v1.saved_model.load(sess, ["serve"], str(tmp_path / "sm_out"))
        assert np.isfinite(sess.run("out:0", {"x:0": xv})).all()


def _py_function_write():
    v = tf.Variable(np.full((8, 8), 0.05, "float32"))

    def bump():
        v.assign_add(tf.ones([8, 8]) * 0.05)
        return tf.constant(0.0)

    def fn(x):
        def body(i, h):
            t = tf.py_function(bump, [], tf.float32)
            with tf.control_dependencies([t]):
                w = tf.raw_ops.ReadVariableOp(resource=v.handle, dtype=tf.float32)
            return i + 1, tf.matmul(h, w)
        return tf.while_loop(lambda i, h: i < 3, body, (0, x))[1]

    return fn, lambda: v.assign(np.full((8, 8), 0.05, "float32"))


def _handle_made_in_the_body_write():
    w = tf.Variable(np.full((8, 8), 0.05, "float32"))

    def fn(x):
        def body(i, h):
            hn = tf.matmul(h, w)
            alias = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[8, 8], shared_name="unrelated")
            with tf.control_dependencies([hn]):
                a = tf.raw_ops.AssignVariableOp(resource=alias, value=tf.ones([8, 8]))
            with tf.control_dependencies([a]):
                return i + 1, tf.identity(hn)
        return tf.while_loop(lambda i, h: i < 3, body, (0, x))[1]

    return fn, lambda: w.assign(np.full((8, 8), 0.05, "float32"))


@pytest.mark.parametrize("build", [_py_function_write, _handle_made_in_the_body_write],
                         ids=["py_function", "VarHandleOp"])
def test_a_loop_that_may_write_a_variable_unseen_keeps_its_reads(build, no_hoist):
    """A ``py_function`` may assign any variable it closes over, and a handle made in the body
    may name one the loop reads: neither is a consumer of the loop's resources, so the loop's
    stateful ops are what tells.  Here the py_function does write the weight the body reads."""
    fn, reset = build()
    x = tf.ones((4, 8))
    assert "hoisted_casts" not in _rewrite(fn, x).report
    reset()
    got = amp_rewrite.function(fn, **OPTS)(x).numpy()
    reset()
    plain = amp_rewrite.function(fn, **OPTS, lists_file=no_hoist)(x).numpy()
    assert np.array_equal(got, plain)


def test_a_tf1_loop_that_assigns_a_ref_variable_keeps_its_cast_in_the_frame(no_hoist):
    """A ref variable's read shares the variable's buffer: assigned in the loop (through a
    RefEnter; Assign ops are not marked stateful), the value entered as a constant changes
    between iterations, and a Cast made once before the loop would miss it."""
    from tensorflow.python.ops import control_flow_util

    old = control_flow_util.ENABLE_CONTROL_FLOW_V2
    control_flow_util.ENABLE_CONTROL_FLOW_V2 = False
    try:
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [4, 16], name="x")
            w = tf.compat.v1.get_variable("w", initializer=np.full((16, 16), 0.05, "float32"), use_resource=False)

            def body(i, h):
                h2 = tf.matmul(h, w)
                with tf.control_dependencies([h2]):
                    a = tf.compat.v1.assign_add(w, tf.ones([16, 16]) * 0.05)
                with tf.control_dependencies([a]):
                    return i + 1, tf.identity(h2)

            tf.identity(tf.while_loop(lambda i, h: i < 3, body, (0, x))[1], name="out")
            tf.group(tf.compat.v1.global_variables_initializer(), name="init")
    finally:
        control_flow_util.ENABLE_CONTROL_FLOW_V2 = old
    gd = g.as_graph_def()
    opts = dict(target="gpu:8.0", precision="float16", fetches=["out"], use_env=False)
    result = amp_rewrite.rewrite_graph_def(gd, **opts)
    assert "hoisted_casts" not in result.report
    xv = np.ones((4, 16), "float32")
    np.testing.assert_allclose(_run_tf1(result.graph_def, xv), _run_tf1(gd, xv), rtol=0.01)


def test_a_loop_variable_the_loop_never_changes_is_cast_once(no_hoist):
    """``tf.while_loop`` returns each loop variable through an ``Identity``: one the body hands
    back unchanged (a weight passed as a loop variable) is the same every iteration too."""
    rng = np.random.default_rng(8)

    def fn(x, w):
        def body(i, h, w):
            return i + 1, tf.tanh(tf.matmul(h, w)), w
        return tf.while_loop(lambda i, h, w: i < 4, body, (0, x, w))[1]

    args = (tf.constant(np.ones((2, 16), "float32")), tf.constant(rng.normal(0, 0.3, (16, 16)).astype("float32")))
    (entry,) = _rewrite(fn, *args).report["hoisted_casts"]
    assert entry["source"].endswith("which the body passes through unchanged")
    got = amp_rewrite.function(fn, **OPTS)(*args).numpy()
    plain = amp_rewrite.function(fn, **OPTS, lists_file=no_hoist)(*args).numpy()
    assert np.array_equal(got, plain)
