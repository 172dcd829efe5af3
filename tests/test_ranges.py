"""Unit tests: the range analysis (amp_rewrite.plan.ranges) and the constant reader under it."""

from __future__ import annotations

import math

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from amp_rewrite.graph.io import import_graph_def  # noqa: E402
from amp_rewrite.graph.node_values import bool_attr, float_const_range  # noqa: E402
from amp_rewrite.graph.op_registry import default_registry  # noqa: E402
from amp_rewrite.plan.ranges import UNBOUNDED, RangeProver  # noqa: E402


def _graph(fn, *specs):
    """The IR of ``fn`` traced on float32 inputs of ``specs`` (shapes)."""
    sig = [tf.TensorSpec(s, tf.float32) for s in specs]
    gd = tf.function(fn, autograph=False).get_concrete_function(*sig).graph.as_graph_def()
    return import_graph_def(gd, default_registry()).graph


def _exp_input_bound(fn, *specs):
    """The proven bound of the input of the (single) Exp node of ``fn``'s graph."""
    g = _graph(fn, *specs)
    exps = [n for n, d in g.nodes(data=True) if d["op"] == "Exp"]
    assert len(exps) == 1, exps
    (src, port), = [(u, d["src_port"]) for u, _, d in g.in_edges(exps[0], data=True) if d["dst_port"] == 0]
    return RangeProver(g).bound(src, port)


@pytest.mark.parametrize("fn, hi", [
    (lambda x: tf.exp(-tf.square(x)), 0.0),                                  # Erf's gradient
    (lambda x: tf.exp(-0.5 * x * x), 0.0),                                   # a Gaussian
    (lambda x: tf.exp(x - tf.reduce_max(x, axis=-1, keepdims=True)), 0.0),   # softmax written out
    (lambda x: tf.exp(x - tf.stop_gradient(tf.reduce_max(x, axis=1, keepdims=True))), 0.0),
    (lambda x: tf.exp(-tf.nn.softplus(x)), 0.0),
    (lambda x: tf.exp(tf.minimum(x, 3.0)), 3.0),
    (lambda x: tf.exp(tf.clip_by_value(x, -5.0, 8.0)), 8.0),
    (lambda x: tf.exp(4.0 * tf.tanh(x) + 2.0), 6.0),
    (lambda x: tf.exp(tf.sigmoid(x) * 10.0), 10.0),
    (lambda x: tf.exp(tf.concat([-tf.abs(x), tf.zeros_like(x)], axis=0)), 0.0),
    (lambda x: tf.exp(tf.where(x > 0, -x * x, tf.nn.relu6(x))), 6.0),
    (lambda x: tf.exp(-tf.reduce_sum(tf.square(x), axis=-1)), 0.0),
])
def test_proves_an_upper_bound(fn, hi):
    bound = _exp_input_bound(fn, [4, 8])
    assert bound.hi == pytest.approx(hi)
    assert bound.why  # the derivation is kept for the plan's reason


@pytest.mark.parametrize("fn", [
    lambda x: tf.exp(x),                                                     # anything
    lambda x: tf.exp(tf.square(x)),                                          # >= 0, not bounded above
    lambda x: tf.exp(x - tf.reduce_max(x, axis=-1)),                         # no kept dims: the broadcast
    lambda x: tf.exp(x - tf.reduce_max(tf.ones_like(x) * 3.0, axis=-1, keepdims=True)),  # max of another
    lambda x: tf.exp(-x / tf.reduce_sum(x)),                                 # divisor of unknown sign
    lambda x: tf.exp(tf.reduce_sum(-tf.square(x)) + tf.reduce_sum(x)),
    lambda x: tf.exp(tf.cast(tf.cast(-tf.square(x), tf.int32), tf.float32)),  # through an integer
])
def test_claims_nothing_it_cannot_prove(fn):
    assert _exp_input_bound(fn, [4, 4]).hi == math.inf  # square: every broadcast is valid


def test_x_minus_max_without_kept_dims_really_can_be_positive():
    # Why the rule insists on keep_dims: without it the broadcast pairs rows with columns.
    x = tf.constant([[0.0, 9.0], [5.0, 1.0]])
    assert float(tf.reduce_max(x - tf.reduce_max(x, axis=-1))) > 0


def test_a_loop_is_unbounded_not_an_error():
    def body(x):
        return tf.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, tf.exp(-tf.square(v)) + v),
                             (tf.constant(0), x))[1]

    gd = tf.function(body).get_concrete_function(tf.TensorSpec([2], tf.float32)).graph.as_graph_def()
    imported = import_graph_def(gd, default_registry())
    for g in [imported.graph, *imported.functions.values()]:
        prover = RangeProver(g)
        for name in g.nodes:
            bound = prover.bound(name, 0)
            assert bound.lo <= bound.hi
        # Inside the body the Exp's argument is still proven; the loop value is not.
        for name, data in g.nodes(data=True):
            if data["op"] == "Exp":
                (src, port), = [(u, d["src_port"]) for u, _, d in g.in_edges(name, data=True) if d["dst_port"] == 0]
                assert prover.bound(src, port).hi == 0.0


def test_answers_do_not_depend_on_the_order_of_questions_or_the_depth():
    """Every tensor is derived once, producers first, whatever Exp is asked about first; a
    proof runs as far back as the graph goes (a chain of a thousand ops, beyond Python's
    recursion limit)."""

    def fn(x):
        h = -tf.square(x)
        for _ in range(40):
            h = h + 0.0
        near = tf.exp(h, name="near")
        for _ in range(1200):
            h = h + 0.0
        return near, tf.exp(h, name="far")

    g = _graph(fn, [3])
    inputs = {e: [(u, d["src_port"]) for u, _, d in g.in_edges(e, data=True) if d["dst_port"] == 0][0]
              for e in ("near", "far")}
    answers = []
    for order in (("far", "near"), ("near", "far")):
        prover = RangeProver(g)
        answers.append({e: prover.bound(*inputs[e]).hi for e in order})
    assert answers[0] == answers[1] == {"near": 0.0, "far": 0.0}


def test_large_constants_prove_nothing():
    # In float16 a constant this large rounds by more than 1: a cancellation of two of them
    # proven <= 0 in exact arithmetic could come out positive.
    assert _exp_input_bound(lambda x: tf.exp(tf.sigmoid(x) * 10005.0 - 10005.0), [4, 8]).hi == math.inf
    assert _exp_input_bound(lambda x: tf.exp(tf.sigmoid(x) * 1000.0 - 1000.0), [4, 8]).hi == 0.0


def test_a_gather_may_add_a_zero():
    # An index out of range reads 0 on a GPU: a table of values in [-3, -1] gathers into [-3, 0].
    bound = _exp_input_bound(lambda x: tf.exp(tf.gather(-1.0 - tf.sigmoid(x) * 2.0, [0, 2])), [4])
    assert (bound.lo, bound.hi) == (-3.0, 0.0)


def test_an_inserted_node_or_a_missing_one_is_unbounded():
    g = _graph(lambda x: tf.exp(x), [2])
    prover = RangeProver(g)
    assert prover.bound("no such node") is UNBOUNDED


@pytest.mark.parametrize("value, dtype", [
    ([[-0.5, 2.0], [3.0, -7.25]], tf.float32), ([1.5], tf.float64), ([-2.0, 0.25], tf.float16),
    ([-3.0, 1.0, 0.5], tf.bfloat16), (np.linspace(-1, 4, 1000), tf.float32),
])
def test_constant_ranges_from_every_float_encoding(value, dtype):
    gd = tf.function(lambda: tf.constant(value, dtype=dtype)).get_concrete_function().graph.as_graph_def()
    (node,) = [n for n in gd.node if n.op == "Const"]
    got = float_const_range({"op": "Const", "proto": node})
    want = np.asarray(tf.constant(value, dtype=dtype).numpy(), dtype=np.float64)
    assert got == (float(want.min()), float(want.max()))


def test_constant_reader_declines_what_it_cannot_bound():
    def const(values, dtype=tf.float32):
        gd = tf.function(lambda: tf.constant(values, dtype=dtype)).get_concrete_function().graph.as_graph_def()
        return {"op": "Const", "proto": [n for n in gd.node if n.op == "Const"][0]}

    assert float_const_range(const([1.0, float("nan")])) is None
    assert float_const_range(const([1, 2], tf.int32)) is None
    assert float_const_range(const(np.zeros(1 << 17, np.float32))) is None  # too large to read
    assert float_const_range({"op": "Const", "proto": None}) is None        # inserted by the rewrite
    assert float_const_range(const(np.full((3, 3), 2.5, np.float32))) == (2.5, 2.5)  # one repeated value


def test_bool_attr_reads_keep_dims():
    gd = tf.function(lambda x: tf.reduce_max(x, axis=0, keepdims=True)).get_concrete_function(
        tf.TensorSpec([3, 2], tf.float32)).graph.as_graph_def()
    (node,) = [n for n in gd.node if n.op == "Max"]
    assert bool_attr({"proto": node}, "keep_dims") is True
    assert bool_attr({"proto": node}, "no_such_attr") is None
    assert bool_attr({"proto": None}, "keep_dims") is None


# ------------------------------------------------------------------ in the plan ([float16.bounded])

import amp_rewrite  # noqa: E402
from amp_rewrite.testing.list_invariants import check_allow_deny  # noqa: E402
from amp_rewrite.testing import InvariantError  # noqa: E402


def _softmax_by_hand():
    """MatMul -> exp(x - max(x)) / sum -> MatMul: the Exp's input is at most 0."""
    w1 = tf.constant(np.random.default_rng(0).normal(size=(16, 32)).astype(np.float32))
    w2 = tf.constant(np.random.default_rng(1).normal(size=(32, 8)).astype(np.float32))

    def f(x):
        h = tf.matmul(x, w1)
        e = tf.exp(h - tf.reduce_max(h, axis=-1, keepdims=True))
        return tf.identity(tf.matmul(e, w2), name="out")

    return tf.function(f, autograph=False).get_concrete_function(tf.TensorSpec([4, 16], tf.float32)).graph.as_graph_def()


def _rewrite(gd, **kwargs):
    options = dict(fetches=["out"], target="gpu:8.0", precision="float16", use_env=False)
    return amp_rewrite.rewrite_graph_def(gd, **{**options, **kwargs})


def _node(gd, op):
    (node,) = [n for n in gd.node if n.op == op]
    return node


def test_a_proven_exp_runs_in_float16_and_says_why():
    gd = _softmax_by_hand()
    result = _rewrite(gd, lists="default")
    exp = _node(result.graph_def, "Exp")
    assert exp.attr["T"].type == tf.float16.as_datatype_enum
    proof = result.report["bounded"][exp.name]
    assert "at most 0" in proof and "x - max(x)" in proof
    assert "range-proven" in result.report["nodes"][exp.name]["reason"]
    (explained,) = amp_rewrite.explain_node(result, exp.name)
    assert explained.color == "allow" and "range-proven" in explained.format()
    # The invariant checker accepts it because the report carries the proof, and not without.
    check_allow_deny(gd, result.graph_def, result.report, target="gpu:8.0", lists="default", use_env=False)
    stripped = {k: v for k, v in result.report.items() if k != "bounded"}
    with pytest.raises(InvariantError):
        check_allow_deny(gd, result.graph_def, stripped, target="gpu:8.0", lists="default", use_env=False)


@pytest.mark.parametrize("options", [dict(lists="tensorflow"), dict(lists="default", level="TREAT_INFER_AS_DENY"),
                                     dict(lists="default", precision="bfloat16", target="cpu")])
def test_the_exemption_is_the_default_profiles_in_float16_and_in_bfloat16_on_a_gpu_only(options):
    result = _rewrite(_softmax_by_hand(), **options)
    assert _node(result.graph_def, "Exp").attr["T"].type == tf.float32.as_datatype_enum
    assert "bounded" not in result.report


def test_a_proven_exp_runs_in_bfloat16_on_a_gpu():
    """``[bfloat16.bounded]`` (backend cuda): TensorFlow denies ``Exp`` in bfloat16 for
    precision; an input proven at most 0 bounds the output's error by the input's rounding
    error, absolute, and Keras's ``mixed_bfloat16`` computes it in bfloat16."""
    result = _rewrite(_softmax_by_hand(), lists="default", precision="bfloat16")
    exp = _node(result.graph_def, "Exp")
    assert exp.attr["T"].type == tf.bfloat16.as_datatype_enum
    assert "at most 0" in result.report["bounded"][exp.name]


def test_an_unproven_exp_stays_denied():
    w = tf.constant(np.ones((16, 16), np.float32))
    gd = tf.function(lambda x: tf.identity(tf.matmul(tf.exp(tf.matmul(x, w)), w), name="out"),
                     autograph=False).get_concrete_function(tf.TensorSpec([4, 16], tf.float32)).graph.as_graph_def()
    result = _rewrite(gd, lists="default")
    assert _node(result.graph_def, "Exp").attr["T"].type == tf.float32.as_datatype_enum
    assert result.report["nodes"][_node(gd, "Exp").name]["color"] == "deny"


def test_exact_gelu_gradient_in_float16_matches_float32():
    """The gradient of an exact GELU holds exp(-x^2); with the proof its chain (and the bias
    gradient after it) runs in float16, and the gradients stay as close to float32's as
    Keras's mixed_float16 computes them."""
    rng = np.random.default_rng(2)
    w1_values = rng.normal(0, 0.3, size=(64, 128)).astype(np.float32)
    b1_values = rng.normal(0, 0.1, size=(128,)).astype(np.float32)
    w2_values = rng.normal(0, 0.3, size=(128, 8)).astype(np.float32)
    x = rng.normal(size=(32, 64)).astype(np.float32)

    def step(x):
        # Constants made inside the function: captured ones would be placeholders.
        w1, b1, w2 = tf.constant(w1_values), tf.constant(b1_values), tf.constant(w2_values)
        with tf.GradientTape() as tape:
            tape.watch(b1)
            h = tf.nn.gelu(tf.nn.bias_add(tf.matmul(x, w1), b1), approximate=False)
            loss = tf.reduce_sum(tf.matmul(h, w2))
        return tf.identity(tape.gradient(loss, b1), name="out")

    gd = tf.function(step, autograph=False).get_concrete_function(tf.TensorSpec([32, 64], tf.float32)).graph.as_graph_def()
    default, parity = _rewrite(gd, lists="default"), _rewrite(gd, lists="tensorflow")
    (exp,) = [n for n in gd.node if n.op == "Exp"]
    assert exp.name in default.report["bounded"]
    bias_grad = _node(default.graph_def, "BiasAddGrad")
    assert bias_grad.attr["T"].type == tf.float16.as_datatype_enum          # the rewrite did something
    assert _node(parity.graph_def, "BiasAddGrad").attr["T"].type == tf.float32.as_datatype_enum

    def run(graph_def):
        fn = tf.compat.v1.wrap_function(lambda: tf.compat.v1.import_graph_def(graph_def, name=""), [])
        g = fn.graph
        pruned = fn.prune(feeds=[g.get_tensor_by_name("x:0")], fetches=g.get_tensor_by_name("out:0"))
        return pruned(tf.constant(x)).numpy().astype(np.float64)

    want = run(gd)
    ours, theirs = run(default.graph_def), run(parity.graph_def)
    err = lambda got: float(np.max(np.abs(got - want)) / np.max(np.abs(want)))  # noqa: E731
    assert err(ours) < 1e-2
    assert err(ours) < 3 * err(theirs) + 1e-3
