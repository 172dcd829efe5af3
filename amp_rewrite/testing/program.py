"""Drawn graphs as small readable programs, and their materialization into GraphDefs.

A :class:`Program` is a list of :class:`Step` s in data-flow order; each step is one node
(or, for ``While`` / ``Call`` / ``Cond``, a loop, a function call or a conditional with a body
program of its own).
The strategies in :mod:`amp_rewrite.testing.strategies` draw programs; :func:`materialize`
builds the GraphDef with TensorFlow's own op constructors, so every node carries the full
attribute set TensorFlow gives it and shape inference checks the program on the way.

Every tensor a program makes has a known shape, dtype and an interval that bounds its
values (:class:`Val`).  The strategies use the intervals to keep values well inside the
float16 range and away from the singular points of Log, Sqrt, division, ..., so that the
float32 graph and its low-precision rewrite can be compared numerically.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

__all__ = ["Val", "Step", "Program", "materialize", "format_program", "Materialized"]


@dataclass(frozen=True)
class Val:
    """A tensor a program can use: reference, dtype, static shape, value bounds.

    ``smooth`` is False when the value depends discontinuously on the inputs (comparisons,
    ArgMax, float -> int casts): rounding can then move it by a whole step, so numerics
    are not compared on it.
    """

    ref: str
    dtype: str
    shape: tuple[int, ...]
    lo: float = 0.0
    hi: float = 0.0
    smooth: bool = True

    @property
    def mag(self) -> float:
        return max(abs(self.lo), abs(self.hi))

    @property
    def is_float(self) -> bool:
        return self.dtype in ("float32", "float16")


@dataclass(frozen=True)
class Step:
    """One node of a program (or one loop / call with a body)."""

    name: str
    op: str
    inputs: tuple[str, ...] = ()
    params: tuple[tuple[str, Any], ...] = ()
    device: str = ""
    control: tuple[str, ...] = ()
    body: "Program | None" = None

    def param(self, key: str, default: Any = None) -> Any:
        for k, v in self.params:
            if k == key:
                return v
        return default


@dataclass(frozen=True)
class Program:
    """Steps in data-flow order.  A body program also has arguments and results."""

    steps: tuple[Step, ...]
    args: tuple[Val, ...] = ()
    results: tuple[str, ...] = ()


# ----------------------------------------------------------------------------- formatting


def _fmt_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return "[" + ",".join(_fmt_value(v) for v in value) + "]"
    return repr(value) if isinstance(value, str) else str(value)


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def format_program(program: Program, indent: str = "  ") -> list[str]:
    """The program as lines of pseudo-code, one per node."""
    lines = []
    for step in program.steps:
        if step.op == "Placeholder":
            rhs = f"Placeholder({step.param('dtype')}{_shape(step.param('shape'))})"
        elif step.op == "Const":
            rhs = (f"Const({step.param('dtype')}{_shape(step.param('shape'))} in "
                   f"[{step.param('lo'):g}, {step.param('hi'):g}])")
        else:
            shown = [(k, v) for k, v in step.params if not k.startswith("_")]
            args = list(step.inputs) + [f"{k}={_fmt_value(v)}" for k, v in shown]
            rhs = f"{step.op}({', '.join(args)})"
        if step.device:
            rhs += f" @{step.device}"
        if step.control:
            rhs += " " + " ".join("^" + c for c in step.control)
        lines.append(f"{indent}{step.name} = {rhs}")
        if step.body is not None:
            args = ", ".join(f"{a.ref}: {a.dtype}{_shape(a.shape)}" for a in step.body.args)
            lines.append(f"{indent}  body({args}):")
            lines.extend(format_program(step.body, indent + "    "))
            lines.append(f"{indent}    return {', '.join(step.body.results)}")
    return lines


# ----------------------------------------------------------------------------- building

_FIRST_ARG = {
    "Softplus": "features", "Softsign": "features", "Elu": "features", "Selu": "features",
    "LeakyRelu": "features", "Relu": "features", "Relu6": "features", "Identity": "input",
    "Snapshot": "input", "StopGradient": "input", "Softmax": "logits", "LogSoftmax": "logits",
}
UNARY_OPS = frozenset({
    "Tanh", "Sigmoid", "Softplus", "Softsign", "Elu", "Selu", "LeakyRelu", "Erf", "Log1p", "Log",
    "Sqrt", "Reciprocal", "Rsqrt", "Exp", "Expm1", "Relu", "Relu6", "Abs", "Neg", "Identity",
    "Snapshot", "StopGradient", "Sin", "Cos", "Atan", "Square", "ZerosLike", "OnesLike", "Softmax",
    "LogSoftmax",
})
BINARY_OPS = frozenset({"AddV2", "Add", "Sub", "Mul", "RealDiv", "Maximum", "Minimum",
                        "SquaredDifference", "Pow", "Greater", "Less"})
REDUCTIONS = frozenset({"Sum", "Mean", "Max", "Min", "Prod", "EuclideanNorm"})


def _tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    return tf


def _const_values(step: Step, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, step.param("_index")])
    values = rng.uniform(step.param("lo"), step.param("hi"), step.param("shape"))
    return values.astype(np.float16 if step.param("dtype") == "float16" else np.float32)


def _build_step(tf: Any, step: Step, ins: list[Any], seed: int) -> list[Any]:
    raw = tf.raw_ops
    op, name, p = step.op, step.name, dict(step.params)
    if op == "Placeholder":
        return [tf.compat.v1.placeholder(getattr(tf, p["dtype"]), p["shape"], name=name)]
    if op == "Const":
        return [tf.constant(_const_values(step, seed), name=name)]
    if op in UNARY_OPS:
        kwargs = {_FIRST_ARG.get(op, "x"): ins[0], "name": name}
        if op == "LeakyRelu":
            kwargs["alpha"] = p["alpha"]
        return [getattr(raw, op)(**kwargs)]
    if op in BINARY_OPS:
        return [getattr(raw, op)(x=ins[0], y=ins[1], name=name)]
    if op == "MatMul":
        return [raw.MatMul(a=ins[0], b=ins[1], transpose_a=p["transpose_a"], transpose_b=p["transpose_b"], name=name)]
    if op == "BatchMatMulV2":
        return [raw.BatchMatMulV2(x=ins[0], y=ins[1], adj_x=p["adj_x"], adj_y=p["adj_y"], name=name)]
    if op == "Einsum":
        return [raw.Einsum(inputs=ins, equation=p["equation"], name=name)]
    if op in ("Conv2D", "DepthwiseConv2dNative"):
        return [getattr(raw, op)(input=ins[0], filter=ins[1], strides=[1, 1, 1, 1], padding="SAME", name=name)]
    if op == "BiasAdd":
        return [raw.BiasAdd(value=ins[0], bias=ins[1], name=name)]
    if op == "AvgPool":
        k = p["ksize"]
        return [raw.AvgPool(value=ins[0], ksize=[1, k, k, 1], strides=[1, 1, 1, 1], padding="SAME", name=name)]
    if op == "MaxPool":
        k = p["ksize"]
        return [raw.MaxPool(input=ins[0], ksize=[1, k, k, 1], strides=[1, 1, 1, 1], padding="SAME", name=name)]
    if op == "FusedBatchNormV3":
        out = raw.FusedBatchNormV3(x=ins[0], scale=ins[1], offset=ins[2], mean=ins[3], variance=ins[4],
                                   epsilon=0.001, is_training=False, name=name)
        return list(out)
    if op == "AddN":
        return [raw.AddN(inputs=ins, name=name)]
    if op in REDUCTIONS:
        return [getattr(raw, op)(input=ins[0], axis=p["axis"], keep_dims=False, name=name)]
    if op == "Cumsum":
        return [raw.Cumsum(x=ins[0], axis=p["axis"], exclusive=p["exclusive"], reverse=p["reverse"], name=name)]
    if op == "L2Loss":
        return [raw.L2Loss(t=ins[0], name=name)]
    if op == "SoftmaxCrossEntropyWithLogits":
        return list(raw.SoftmaxCrossEntropyWithLogits(features=ins[0], labels=ins[1], name=name))
    if op == "Pack":
        return [raw.Pack(values=ins, axis=p["axis"], name=name)]
    if op == "Unpack":
        return list(raw.Unpack(value=ins[0], num=8, axis=p["axis"], name=name))
    if op == "IdentityN":
        return list(raw.IdentityN(input=ins, name=name))
    if op == "Reshape":
        return [raw.Reshape(tensor=ins[0], shape=list(p["shape"]), name=name)]
    if op == "Transpose":
        return [raw.Transpose(x=ins[0], perm=list(p["perm"]), name=name)]
    if op == "ReverseV2":
        return [raw.ReverseV2(tensor=ins[0], axis=[p["axis"]], name=name)]
    if op == "ClipByValue":
        dtype = ins[0].dtype
        low = tf.constant(p["min"], dtype, name=f"{name}/min")
        high = tf.constant(p["max"], dtype, name=f"{name}/max")
        return [raw.ClipByValue(t=ins[0], clip_value_min=low, clip_value_max=high, name=name)]
    if op == "Select":
        return [raw.Select(condition=ins[0], x=ins[1], y=ins[2], name=name)]
    if op == "SelectV2":
        return [raw.SelectV2(condition=ins[0], t=ins[1], e=ins[2], name=name)]
    if op == "ArgMax":
        return [raw.ArgMax(input=ins[0], dimension=p["axis"], output_type=tf.int64, name=name)]
    if op == "Cast":
        return [raw.Cast(x=ins[0], DstT=getattr(tf, p["to"]), name=name)]
    raise ValueError(f"no builder for op {op!r}")


@contextlib.contextmanager
def _control_flow(v2: bool) -> Any:
    """TensorFlow's control flow version while a loop is built: v1 (``Enter``/``Merge``/
    ``Switch``/``NextIteration``/``Exit`` in the graph) or v2 (a functional ``While`` or
    ``StatelessWhile`` whose ``cond`` and ``body`` are functions of the library)."""
    from tensorflow.python.ops import control_flow_util

    was = control_flow_util.ENABLE_CONTROL_FLOW_V2
    control_flow_util.ENABLE_CONTROL_FLOW_V2 = v2
    try:
        yield
    finally:
        control_flow_util.ENABLE_CONTROL_FLOW_V2 = was


@dataclass
class Materialized:
    graph_def: Any
    tensors: dict[str, str] = field(default_factory=dict)  # program ref -> tensor name
    vals: dict[str, Val] = field(default_factory=dict)  # tensor name -> Val


class _Builder:
    def __init__(self, tf: Any, seed: int) -> None:
        self.tf = tf
        self.seed = seed
        self.renames: dict[str, str] = {}  # node renames applied to the GraphDef afterwards
        self.function_renames: dict[str, str] = {}

    def build(self, program: Program, env: dict[str, Any], vals: dict[str, Val] | None = None) -> None:
        tf = self.tf
        graph = tf.compat.v1.get_default_graph()
        for step in program.steps:
            device = tf.device(step.device) if step.device else contextlib.nullcontext()
            deps = [graph.get_operation_by_name(self._node_of(env, c)) for c in step.control]
            # control_dependencies(None) would also leave the loop's control flow context.
            control = tf.control_dependencies(deps) if deps else contextlib.nullcontext()
            with device, control:
                ins = [env[r] for r in step.inputs]
                if step.op == "While":
                    outs = self._while(step, ins, env)
                elif step.op == "Call":
                    outs = self._call(step, ins)
                elif step.op == "Cond":
                    outs = self._cond(step, ins)
                else:
                    outs = _build_step(tf, step, ins, self.seed)
            for i, t in enumerate(outs):
                env[f"{step.name}:{i}"] = t
                if i == 0:
                    env[step.name] = t
            env["@node:" + step.name] = outs[0].op.name if outs else step.name

    @staticmethod
    def _node_of(env: dict[str, Any], name: str) -> str:
        return env.get("@node:" + name, name)

    def _while(self, step: Step, ins: list[Any], env: dict[str, Any]) -> list[Any]:
        tf = self.tf
        body = step.body
        assert body is not None
        iterations = step.param("iterations")

        def cond(i, *vs):
            return tf.less(i, iterations)

        def loop_body(i, *vs):
            local = dict(env)
            for arg, v in zip(body.args, vs):
                local[arg.ref] = v
            self.build(body, local)
            return [i + 1] + [local[r] for r in body.results]

        functional = bool(step.param("functional", False))
        with _control_flow(v2=functional):
            i0 = tf.constant(0, name=f"{step.name}_i0")
            outs = tf.compat.v1.while_loop(cond, loop_body, [i0, *ins], name=step.name,
                                           back_prop=False)
        if functional:
            # TensorFlow numbers a functional loop's functions process-wide: name them after
            # the step, so the same program gives the same bytes.
            loop = tf.compat.v1.get_default_graph().get_operation_by_name(step.name)
            self.function_renames[loop.get_attr("cond").name] = f"{step.name}_cond"
            self.function_renames[loop.get_attr("body").name] = f"{step.name}_body"
        return list(outs[1:])

    def _call(self, step: Step, ins: list[Any]) -> list[Any]:
        tf = self.tf
        body = step.body
        assert body is not None
        specs = [tf.TensorSpec(a.shape, getattr(tf, a.dtype)) for a in body.args]

        def fn(*args):
            local: dict[str, Any] = {}
            for arg, v in zip(body.args, args):
                local[arg.ref] = tf.identity(v, name=arg.ref)
            self.build(body, local)
            return [local[r] for r in body.results]

        concrete = tf.function(fn, input_signature=specs, autograph=False).get_concrete_function()
        with tf.name_scope(step.name):
            outs = concrete(*ins)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        call_node = outs[0].op.name
        self.renames[call_node] = step.name
        self.function_renames[concrete.function_def.signature.name] = f"{step.name}_body"
        return outs

    def _cond(self, step: Step, ins: list[Any]) -> list[Any]:
        """TF2's ``tf.cond`` on a constant predicate, each branch running ``step.body``: a
        functional ``If``/``StatelessIf`` named ``step.name``, its branches named
        ``<step>_then`` and ``<step>_else`` (TensorFlow numbers them process-wide)."""
        tf = self.tf
        body = step.body
        assert body is not None

        def branch() -> list[Any]:
            local: dict[str, Any] = {}
            for arg, v in zip(body.args, ins):
                local[arg.ref] = tf.identity(v, name=arg.ref)
            self.build(body, local)
            return [local[r] for r in body.results]

        with _control_flow(v2=True):
            pred = tf.constant(bool(step.param("then")), name=f"{step.name}_pred")
            outs = tf.cond(pred, branch, branch, name=step.name)
        then_fn, else_fn = _cond_branches(tf.compat.v1.get_default_graph(), step.name)
        self.function_renames[then_fn] = f"{step.name}_then"
        self.function_renames[else_fn] = f"{step.name}_else"
        return list(outs) if isinstance(outs, (list, tuple)) else [outs]


def _cond_branches(graph: Any, name: str) -> tuple[str, str]:
    """The ``then_branch`` and ``else_branch`` functions of the ``If``/``StatelessIf`` that
    ``tf.cond`` built under the name scope ``name``."""
    node = graph.get_operation_by_name(name)
    return node.get_attr("then_branch").name, node.get_attr("else_branch").name


def _rename_function(f: Any, new: str) -> None:
    """Give FunctionDef ``f`` the name ``new``, and its arguments that TensorFlow named after
    its old name (a loop's ``cond`` takes the loop variables it does not read as
    ``<function>___redundant_placeholder<k>``) names after the new one.  Mutates ``f``."""
    old = f.signature.name
    f.signature.name = new
    args = {a.name: new + a.name[len(old):] for a in f.signature.input_arg if a.name.startswith(old)}
    if not args:
        return
    for a in f.signature.input_arg:
        a.name = args.get(a.name, a.name)

    def fix(text: str) -> str:
        ctrl = "^" if text.startswith("^") else ""
        name, sep, rest = text[len(ctrl):].partition(":")
        return ctrl + args.get(name, name) + sep + rest

    for node in f.node_def:
        node.input[:] = [fix(t) for t in node.input]
    for key in list(f.ret):
        f.ret[key] = fix(f.ret[key])


def _rename(graph_def: Any, renames: Mapping[str, str], function_renames: Mapping[str, str]) -> None:
    """Give call nodes and their functions the program's names.  Mutates ``graph_def``."""
    if not renames and not function_renames:
        return

    def fix(text: str) -> str:
        ctrl = text.startswith("^")
        base = text[1:] if ctrl else text
        name, sep, port = base.partition(":")
        name = renames.get(name, name)
        return ("^" if ctrl else "") + name + sep + port

    for node in graph_def.node:
        node.name = renames.get(node.name, node.name)
        node.input[:] = [fix(t) for t in node.input]
        for value in node.attr.values():
            if value.WhichOneof("value") == "func" and value.func.name in function_renames:
                value.func.name = function_renames[value.func.name]
    for f in graph_def.library.function:
        if f.signature.name in function_renames:
            _rename_function(f, function_renames[f.signature.name])
    # TensorFlow orders the library by its own function names, which carry process-wide
    # counters; order it by the program's calls instead, so the bytes are reproducible.
    rank = {name: i for i, name in enumerate(function_renames.values())}
    functions = sorted(graph_def.library.function, key=lambda f: (rank.get(f.signature.name, len(rank)),
                                                                   f.signature.name))
    copies = [type(f)() for f in functions]
    for copy, f in zip(copies, functions):
        copy.CopyFrom(f)
    del graph_def.library.function[:]
    graph_def.library.function.extend(copies)


def materialize(program: Program, seed: int) -> Materialized:
    """Build the GraphDef of ``program``; Const values come from ``seed``."""
    tf = _tf()
    graph = tf.Graph()
    builder = _Builder(tf, seed)
    env: dict[str, Any] = {}
    # TensorFlow draws from Python's global random state while it builds functions; keep
    # that state as it was, so drawing a graph does not perturb it (Hypothesis checks).
    state = random.getstate()
    try:
        with graph.as_default():
            builder.build(program, env)
    finally:
        random.setstate(state)
    graph_def = graph.as_graph_def()
    _rename(graph_def, builder.renames, builder.function_renames)
    tensors = {}
    for ref, t in env.items():
        if ref.startswith("@node:") or not hasattr(t, "name"):
            continue
        node, _, port = t.name.partition(":")
        tensors[ref] = f"{builder.renames.get(node, node)}:{port}"
    return Materialized(graph_def, tensors)


# ----------------------------------------------------------------------------- intervals


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def softplus(x: float) -> float:
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


def selu(x: float) -> float:
    return 1.0507009873554805 * (x if x > 0 else 1.6732632423543772 * math.expm1(x))
