"""Hypothesis strategies that draw random, valid and runnable TensorFlow graphs.

:func:`graphs` draws a :class:`GraphCase`: a GraphDef, the feeds that run it, its outputs and
the small program it was built from (shown when a test fails, so a shrunk counterexample
reads like code).  Graphs are DAGs of real ops from all four lists (allow, infer, deny,
clear) and ops on no list, with consistent shapes and dtypes; optionally with control edges,
several outputs, nodes on several devices, TF1 (control flow v1) while loops and function
calls (``PartitionedCall`` into a ``FunctionDef``).

Values stay well inside the float16 range: each tensor carries bounds, and an op is only
drawn where its result stays within :data:`LIMIT` and away from singular points (Log of
values >= 0.5, division by values of magnitude >= 0.5, ...).  Every op drawn has CPU
kernels for float32, float16 and bfloat16, so a rewritten graph runs on this machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import tensorflow as _tensorflow  # noqa: F401  (imported up front: it changes the recursion limit)
from hypothesis import strategies as st

from .execute import graph_outputs, run_graph
from .facts import sinks
from .program import Program, Step, Val, format_program, materialize, selu, sigmoid, softplus

__all__ = [
    "GraphCase",
    "graphs",
    "graph_defs",
    "OPS",
    "LIMIT",
    "MULTI_DEVICES",
    "precisions",
    "graphs_with_options",
]

#: Largest magnitude a drawn tensor may reach (float16 tops out at 65504).
LIMIT = 64.0

M = (8, 8)
IMG = (1, 2, 4, 8)
VEC = (8,)
SCALAR: tuple[int, ...] = ()

#: Device strings for ``graphs(devices=MULTI_DEVICES)``: the default device, GPU:0, GPU:1
#: (compute capability 6.1 in the case's target, so not eligible for float16) and the CPU.
MULTI_DEVICES = ("", "/device:GPU:0", "/device:GPU:1", "/device:CPU:0")

#: Every op the strategies can draw, with its default weight, in the order the shrinker
#: prefers (it moves towards the first feasible op).  Grouped by TensorFlow's float16 lists.
OPS: Mapping[str, int] = {
    # allow
    "MatMul": 16, "BatchMatMulV2": 4, "Einsum": 4, "Conv2D": 8, "DepthwiseConv2dNative": 4,
    # infer
    "AddV2": 3, "Add": 1, "Sub": 2, "Mul": 2, "RealDiv": 1, "AddN": 1, "BiasAdd": 2,
    "AvgPool": 1, "FusedBatchNormV3": 2, "Tanh": 2, "Sigmoid": 2, "Softplus": 1, "Softsign": 1,
    "Elu": 1, "Selu": 1, "LeakyRelu": 1, "Erf": 1, "Log1p": 1, "Log": 1, "Sqrt": 1,
    "Reciprocal": 1,
    # deny (several are infer in the tensorflow profile)
    "Exp": 2, "Expm1": 1, "Pow": 1, "Sum": 1, "Mean": 1, "Prod": 1, "EuclideanNorm": 1,
    "Cumsum": 1, "L2Loss": 1, "Softmax": 2, "LogSoftmax": 1, "SoftmaxCrossEntropyWithLogits": 1,
    # clear
    "Relu": 3, "Relu6": 1, "Abs": 1, "Neg": 1, "Identity": 2, "Snapshot": 1, "StopGradient": 1,
    "Reshape": 2, "Transpose": 1, "ReverseV2": 1, "Pack": 1, "Unpack": 1, "IdentityN": 1,
    "MaxPool": 1, "Maximum": 1, "Minimum": 1, "Max": 1, "Min": 1, "ClipByValue": 1,
    "Greater": 1, "Less": 1, "Select": 1, "SelectV2": 1, "ArgMax": 1, "ZerosLike": 1,
    "OnesLike": 1,
    # on no float16 list
    "Sin": 1, "Cos": 1, "Atan": 1, "Square": 1, "Rsqrt": 1, "SquaredDifference": 1, "Cast": 2,
}


def precisions() -> st.SearchStrategy[str]:
    """``"float16"`` or ``"bfloat16"``."""
    return st.sampled_from(("float16", "bfloat16"))


# ----------------------------------------------------------------------------- intervals

Interval = tuple[float, float]


def _mono(f: Callable[[float], float]) -> Callable[[float, float], Interval]:
    return lambda lo, hi: (f(lo), f(hi))


def _abs(lo: float, hi: float) -> Interval:
    if lo >= 0:
        return lo, hi
    if hi <= 0:
        return -hi, -lo
    return 0.0, max(-lo, hi)


def _square(lo: float, hi: float) -> Interval:
    a, b = _abs(lo, hi)
    return a * a, b * b


def _mul(a: Interval, b: Interval) -> Interval:
    p = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
    return min(p), max(p)


def _add(a: Interval, b: Interval) -> Interval:
    return a[0] + b[0], a[1] + b[1]


def _sub(a: Interval, b: Interval) -> Interval:
    return a[0] - b[1], a[1] - b[0]


def _div(a: Interval, b: Interval) -> Interval:
    return _mul(a, (1.0 / b[1], 1.0 / b[0]))


def _sqdiff(a: Interval, b: Interval) -> Interval:
    return _square(*_sub(a, b))


def _hull(*ivs: Interval) -> Interval:
    return min(i[0] for i in ivs), max(i[1] for i in ivs)


def _fits(iv: Interval) -> bool:
    return all(math.isfinite(x) and abs(x) <= LIMIT for x in iv)


#: Unary ops: interval function and domain (the input bounds they accept).
_UNARY: dict[str, tuple[Callable[[float, float], Interval], Callable[[Val], bool] | None]] = {
    "Tanh": (_mono(math.tanh), None),
    "Sigmoid": (_mono(sigmoid), None),
    "Softplus": (_mono(softplus), None),
    "Softsign": (_mono(lambda x: x / (1 + abs(x))), None),
    "Elu": (_mono(lambda x: x if x > 0 else math.expm1(x)), None),
    "Selu": (_mono(selu), None),
    "LeakyRelu": (_mono(lambda x: x if x > 0 else 0.2 * x), None),
    "Erf": (_mono(math.erf), None),
    "Log1p": (_mono(math.log1p), lambda v: v.lo >= -0.5),
    "Log": (_mono(math.log), lambda v: v.lo >= 0.5),
    "Sqrt": (_mono(math.sqrt), lambda v: v.lo >= 0.0625),
    "Reciprocal": (lambda lo, hi: (1 / hi, 1 / lo), lambda v: v.lo >= 0.75 or v.hi <= -0.75),
    "Rsqrt": (lambda lo, hi: (1 / math.sqrt(hi), 1 / math.sqrt(lo)), lambda v: v.lo >= 0.5),
    "Exp": (_mono(math.exp), lambda v: v.hi <= 2.0),
    "Expm1": (_mono(math.expm1), lambda v: v.hi <= 2.0),
    "Relu": (_mono(lambda x: max(x, 0.0)), None),
    "Relu6": (_mono(lambda x: min(max(x, 0.0), 6.0)), None),
    "Abs": (_abs, None),
    "Neg": (lambda lo, hi: (-hi, -lo), None),
    "Identity": (lambda lo, hi: (lo, hi), None),
    "Snapshot": (lambda lo, hi: (lo, hi), None),
    "StopGradient": (lambda lo, hi: (lo, hi), None),
    "Sin": (lambda lo, hi: (-1.0, 1.0), None),
    "Cos": (lambda lo, hi: (-1.0, 1.0), None),
    "Atan": (_mono(math.atan), None),
    "Square": (_square, None),
    "ZerosLike": (lambda lo, hi: (0.0, 0.0), None),
    "OnesLike": (lambda lo, hi: (1.0, 1.0), None),
    "Softmax": (lambda lo, hi: (0.0, 1.0), lambda v: len(v.shape) >= 1),
    "LogSoftmax": (lambda lo, hi: (lo - hi - math.log(8), 0.0), lambda v: len(v.shape) >= 1),
}

#: Binary elementwise ops: interval function, the range of a new Const partner, and the
#: partner's domain.
_BINARY: dict[str, tuple[Callable[[Interval, Interval], Interval], Interval, Callable[[Val], bool] | None]] = {
    "AddV2": (_add, (-1.0, 1.0), None),
    "Add": (_add, (-1.0, 1.0), None),
    "Sub": (_sub, (-1.0, 1.0), None),
    "Mul": (_mul, (-1.0, 1.0), None),
    "RealDiv": (_div, (0.5, 1.5), lambda b: b.lo >= 0.5 or b.hi <= -0.5),
    "Maximum": (lambda a, b: (max(a[0], b[0]), max(a[1], b[1])), (-1.0, 1.0), None),
    "Minimum": (lambda a, b: (min(a[0], b[0]), min(a[1], b[1])), (-1.0, 1.0), None),
    "SquaredDifference": (_sqdiff, (-1.0, 1.0), None),
}


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape of ``a op b`` under the broadcasting the strategies use, or None."""
    if a == b:
        return a
    for big, small in ((a, b), (b, a)):
        if small == () or (len(small) == 1 and len(big) >= 1 and big[-1] == small[0]):
            return big
    return None


# ----------------------------------------------------------------------------- drawing


@dataclass
class _Options:
    min_nodes: int
    max_nodes: int
    weights: dict[str, int]
    control_edges: bool
    devices: tuple[str, ...]
    while_loops: bool
    functions: bool
    max_inputs: int
    body_nodes: int
    const_counter: list[int] = field(default_factory=lambda: [0])


class _Drawer:
    """Draws the steps of one program (the main graph or a body) into a pool of values."""

    def __init__(self, draw: Any, opts: _Options, *, args: Sequence[Val] = (),
                 captured: Sequence[Val] = (), body: bool = False) -> None:
        self.draw = draw
        self.opts = opts
        self.args = list(args)
        self.pool: list[Val] = list(captured) + list(args)
        self.made: list[Val] = []  # values made by this drawer's own steps
        self.steps: list[Step] = []
        self.body = body
        self.count = 0

    # -- primitive draws (each shrinks towards 0 / the first choice / False)
    def integer(self, lo: int, hi: int) -> int:
        return lo if lo >= hi else self.draw(st.integers(lo, hi))

    def pick(self, seq: Sequence[Any]) -> Any:
        return seq[self.integer(0, len(seq) - 1)]

    def chance(self, percent: int) -> bool:
        return self.integer(0, 99) >= 100 - percent

    def device(self) -> str:
        return self.pick(self.opts.devices)

    def recent(self, pred: Callable[[Val], bool]) -> list[Val]:
        return [v for v in reversed(self.pool) if pred(v)]

    def fresh(self, op: str) -> str:
        name = f"{op.lower()}_{self.count}"
        self.count += 1
        return name

    # -- adding steps
    def emit(self, op: str, inputs: Sequence[Val], params: Mapping[str, Any],
             outs: Sequence[tuple[str, tuple[int, ...], Interval, bool]], *,
             body: Program | None = None) -> list[Val]:
        name = self.fresh(op)
        control: tuple[str, ...] = ()
        if self.opts.control_edges and not self.body and op != "While":
            plain = [s.name for s in reversed(self.steps) if s.op != "While"]
            if plain and self.chance(20):
                control = (self.pick(plain),)
        assert all(shape is not None for _, shape, _, _ in outs), (op, inputs, outs)
        step = Step(name, op, tuple(v.ref for v in inputs), tuple(params.items()), self.device(),
                    control, body)
        self.steps.append(step)
        vals = [
            Val(name if i == 0 else f"{name}:{i}", dtype, shape, iv[0], iv[1], smooth)
            for i, (dtype, shape, iv, smooth) in enumerate(outs)
        ]
        self.pool.extend(vals)
        self.made.extend(vals)
        return vals

    def const(self, dtype: str, shape: tuple[int, ...], lo: float, hi: float, *, offer: bool = True) -> Val:
        """A new Const; ``offer`` makes it available to later ops (not for filters)."""
        name = f"c_{self.count}"
        self.count += 1
        index = self.opts.const_counter[0]
        self.opts.const_counter[0] += 1
        params = (("dtype", dtype), ("shape", shape), ("lo", lo), ("hi", hi), ("_index", index))
        self.steps.append(Step(name, "Const", (), params, self.device()))
        val = Val(name, dtype, shape, lo, hi, True)
        if offer:
            self.pool.append(val)
        return val

    def placeholder(self, shape: tuple[int, ...]) -> Val:
        name = f"x_{self.count}"
        self.count += 1
        self.steps.append(Step(name, "Placeholder", (), (("dtype", "float32"), ("shape", shape)),
                               self.device()))
        val = Val(name, "float32", shape, -1.0, 1.0, True)
        self.pool.append(val)
        return val

    def partner(self, a: Val, ok: Callable[[Val], bool], const_range: Interval,
                shapes: Sequence[tuple[int, ...]] | None = None) -> Val:
        """An existing value that ``ok`` accepts, or a new Const."""
        existing = self.recent(lambda b: b.dtype == a.dtype and ok(b))
        choice = self.pick(existing + [None])
        if choice is not None:
            return choice
        if shapes is None:
            shapes = [a.shape] + ([VEC] if a.shape and a.shape != VEC else []) + [SCALAR]
        return self.const(a.dtype, self.pick(list(shapes)), *const_range)

    # -- the draw loop
    def run(self, least: int, most: int) -> None:
        """Draw between ``least`` and ``most`` ops.  Each op past ``least`` is preceded by a
        "go on?" draw, so the shrinker can delete any one op's draws as a block."""
        weights = self.opts.weights
        for i in range(most):
            if i >= least and self.integer(0, 99) < 15:
                return
            feasible = [(op, w) for op, w in weights.items() if w > 0 and _OPS[op][0](self)]
            if not self.body:
                if self.opts.while_loops and _while_candidates(self):
                    feasible.append(("While", 2))
                if self.opts.functions and _call_candidates(self):
                    feasible.append(("Call", 2))
            if not feasible:
                return
            r = self.integer(0, sum(w for _, w in feasible) - 1)
            for op, w in feasible:
                if r < w:
                    break
                r -= w
            if op == "While":
                _while_emit(self)
            elif op == "Call":
                _call_emit(self)
            else:
                _OPS[op][1](self, op)


def _floats(d: _Drawer, pred: Callable[[Val], bool] = lambda v: True) -> list[Val]:
    return d.recent(lambda v: v.is_float and pred(v))


# -- unary
def _unary_ok(op: str) -> Callable[[Val], bool]:
    fn, dom = _UNARY[op]
    return lambda v: v.is_float and (dom is None or dom(v)) and _fits(fn(v.lo, v.hi))


def _unary_cands(op: str) -> Callable[[_Drawer], list[Val]]:
    ok = _unary_ok(op)
    return lambda d: d.recent(ok)


def _unary_emit(d: _Drawer, op: str) -> None:
    v = d.pick(d.recent(_unary_ok(op)))
    iv = _UNARY[op][0](v.lo, v.hi)
    params = {"alpha": 0.2} if op == "LeakyRelu" else {}
    d.emit(op, [v], params, [(v.dtype, v.shape, iv, v.smooth)])


# -- binary elementwise
def _binary_pair_ok(op: str, a: Val, b: Val) -> bool:
    fn, _, dom = _BINARY[op]
    return (b.dtype == a.dtype and _broadcast(a.shape, b.shape) is not None
            and (dom is None or dom(b)) and _fits(fn((a.lo, a.hi), (b.lo, b.hi))))


def _binary_cands(op: str) -> Callable[[_Drawer], list[Val]]:
    fn, crange, _ = _BINARY[op]
    # A new Const partner always exists; the first operand must stay in range with it.
    return lambda d: _floats(d, lambda a: _fits(fn((a.lo, a.hi), crange)))


def _binary_emit(d: _Drawer, op: str) -> None:
    fn, crange, _ = _BINARY[op]
    a = d.pick(_binary_cands(op)(d))
    b = d.partner(a, lambda b: _binary_pair_ok(op, a, b), crange)
    if d.chance(30) and _binary_pair_ok(op, b, a) and b.shape == a.shape:
        a, b = b, a  # the Const (or older value) as the first operand
    iv = fn((a.lo, a.hi), (b.lo, b.hi))
    d.emit(op, [a, b], {}, [(a.dtype, _broadcast(a.shape, b.shape), iv, a.smooth and b.smooth)])


def _compare_emit(d: _Drawer, op: str) -> None:
    a = d.pick(_floats(d))
    b = d.partner(a, lambda b: _broadcast(a.shape, b.shape) is not None, (-1.0, 1.0))
    d.emit(op, [a, b], {}, [("bool", _broadcast(a.shape, b.shape), (0.0, 1.0), False)])


def _pow_cands(d: _Drawer) -> list[Val]:
    return _floats(d, lambda v: any(_pow_ok(v, p) for p in (2.0, 3.0, 0.5)))


def _pow_ok(v: Val, p: float) -> bool:
    if p == 0.5 and v.lo < 0.0625:
        return False
    return v.mag ** p <= LIMIT


def _pow_emit(d: _Drawer, op: str) -> None:
    v = d.pick(_pow_cands(d))
    p = d.pick([p for p in (2.0, 3.0, 0.5) if _pow_ok(v, p)])
    e = d.const(v.dtype, SCALAR, p, p)
    if p == 2.0:
        iv = _square(v.lo, v.hi)
    elif p == 3.0:
        iv = (v.lo ** 3, v.hi ** 3)
    else:
        iv = (math.sqrt(v.lo), math.sqrt(v.hi))
    d.emit("Pow", [v, e], {}, [(v.dtype, v.shape, iv, v.smooth)])


# -- matrix products and convolutions
def _matmul_cands(d: _Drawer) -> list[Val]:
    return _floats(d, lambda v: v.shape == M)


def _gemm_emit(d: _Drawer, op: str) -> None:
    a = d.pick(_gemm_cands(op)(d))
    b = d.partner(a, lambda b: b.shape == M and _fits((-8 * a.mag * b.mag, 8 * a.mag * b.mag)),
                  (-0.125, 0.125), shapes=[M])
    bound = 8 * a.mag * b.mag
    out_shape = a.shape
    if op == "MatMul":
        params = {"transpose_a": d.chance(30), "transpose_b": d.chance(30)}
    elif op == "BatchMatMulV2":
        params = {"adj_x": a.shape == M and d.chance(30), "adj_y": d.chance(30)}
    else:
        params = {"equation": d.pick(["ij,jk->ik", "ij,kj->ik", "ji,jk->ik", "ij,jk->ki"])}
    d.emit(op, [a, b], params, [(a.dtype, out_shape, (-bound, bound), a.smooth and b.smooth)])


def _gemm_cands(op: str) -> Callable[[_Drawer], list[Val]]:
    shapes = (M, IMG) if op == "BatchMatMulV2" else (M,)
    return lambda d: _floats(d, lambda v: v.shape in shapes and v.mag <= LIMIT)


def _conv_emit(d: _Drawer, op: str) -> None:
    x = d.pick(_floats(d, lambda v: v.shape == IMG))
    k = d.pick([1, 3])
    if op == "Conv2D":
        w = d.const(x.dtype, (k, k, 8, 8), -1.0 / (k * k * 8), 1.0 / (k * k * 8), offer=False)
    else:
        w = d.const(x.dtype, (k, k, 8, 1), -1.0 / (k * k), 1.0 / (k * k), offer=False)
    d.emit(op, [x, w], {}, [(x.dtype, IMG, (-x.mag, x.mag), x.smooth)])


def _img_cands(d: _Drawer) -> list[Val]:
    return _floats(d, lambda v: v.shape == IMG)


# -- other infer / clear / deny ops
def _bias_emit(d: _Drawer, op: str) -> None:
    x = d.pick(_floats(d, lambda v: v.shape in (M, IMG) and v.mag <= LIMIT - 0.5))
    b = d.partner(x, lambda b: b.shape == VEC and _fits(_add((x.lo, x.hi), (b.lo, b.hi))),
                  (-0.5, 0.5), shapes=[VEC])
    d.emit(op, [x, b], {}, [(x.dtype, x.shape, _add((x.lo, x.hi), (b.lo, b.hi)), x.smooth and b.smooth)])


def _pool_emit(d: _Drawer, op: str) -> None:
    x = d.pick(_img_cands(d))
    d.emit(op, [x], {"ksize": d.pick([2, 1])}, [(x.dtype, IMG, (x.lo, x.hi), x.smooth)])


def _bn_bound(m: float) -> float:
    return (m + 0.5) / math.sqrt(0.5) * 1.5 + 0.5


def _bn_emit(d: _Drawer, op: str) -> None:
    x = d.pick(_floats(d, lambda v: v.shape == IMG and _bn_bound(v.mag) <= LIMIT))
    scale = d.const("float32", VEC, 0.5, 1.5)
    offset = d.const("float32", VEC, -0.5, 0.5)
    mean = d.const("float32", VEC, -0.5, 0.5)
    var = d.const("float32", VEC, 0.5, 2.0)
    bound = _bn_bound(x.mag)
    # Only y is offered to later ops; the batch statistics and reserve spaces of an
    # inference-mode batch norm are not meaningful values (reserve_space_3 is empty).
    d.emit(op, [x, scale, offset, mean, var], {}, [(x.dtype, IMG, (-bound, bound), x.smooth)])


def _addn_emit(d: _Drawer, op: str) -> None:
    a = d.pick(_floats(d, lambda v: v.mag <= LIMIT - 1))
    ins = [a]
    total = (a.lo, a.hi)
    for _ in range(d.integer(1, 2)):
        b = d.partner(a, lambda b, t=total: b.shape == a.shape and _fits(_add(t, (b.lo, b.hi))),
                      (-1.0, 1.0), shapes=[a.shape])
        ins.append(b)
        total = _add(total, (b.lo, b.hi))
    d.emit(op, ins, {}, [(a.dtype, a.shape, total, all(v.smooth for v in ins))])


_REDUCE_BOUND = {
    "Sum": lambda v: (8 * v.lo, 8 * v.hi),
    "Mean": lambda v: (v.lo, v.hi),
    "Max": lambda v: (v.lo, v.hi),
    "Min": lambda v: (v.lo, v.hi),
    "Prod": lambda v: (v.lo ** 8, v.hi ** 8) if v.lo >= 0 else (-(v.mag ** 8), v.mag ** 8),
    "EuclideanNorm": lambda v: (0.0, math.sqrt(8) * v.mag),
}


def _reduce_cands(op: str) -> Callable[[_Drawer], list[Val]]:
    return lambda d: _floats(d, lambda v: v.shape in (M, VEC) and _fits(_REDUCE_BOUND[op](v)))


def _reduce_emit(d: _Drawer, op: str) -> None:
    v = d.pick(_reduce_cands(op)(d))
    lo, hi = _REDUCE_BOUND[op](v)
    if v.shape == M:
        axis, shape = d.pick([1, 0]), VEC
    else:
        axis, shape = 0, SCALAR
    d.emit(op, [v], {"axis": axis}, [(v.dtype, shape, (min(lo, hi), max(lo, hi)), v.smooth)])


def _cumsum_emit(d: _Drawer, op: str) -> None:
    v = d.pick(_floats(d, lambda v: v.shape == M and 8 * v.mag <= LIMIT))
    params = {"axis": d.pick([1, 0]), "exclusive": d.chance(30), "reverse": d.chance(30)}
    iv = (8 * min(v.lo, 0.0), 8 * max(v.hi, 0.0))
    d.emit(op, [v], params, [(v.dtype, M, iv, v.smooth)])


def _numel(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape)) if shape else 1


def _l2_cands(d: _Drawer) -> list[Val]:
    return _floats(d, lambda v: _numel(v.shape) * v.mag ** 2 / 2 <= LIMIT)


def _l2_emit(d: _Drawer, op: str) -> None:
    v = d.pick(_l2_cands(d))
    d.emit(op, [v], {}, [(v.dtype, SCALAR, (0.0, _numel(v.shape) * v.mag ** 2 / 2), v.smooth)])


def _xent_bound(f: Val, lab: Val) -> float:
    return 8 * lab.mag * ((f.hi - f.lo) + math.log(8))


def _xent_emit(d: _Drawer, op: str) -> None:
    f = d.pick(_floats(d, lambda v: v.shape == M and _xent_bound(v, Val("", "", M, 0, 1)) <= LIMIT))
    lab = d.partner(f, lambda b: b.shape == M and _xent_bound(f, b) <= LIMIT, (0.0, 1.0), shapes=[M])
    bound = _xent_bound(f, lab)
    smooth = f.smooth and lab.smooth
    d.emit(op, [f, lab], {}, [(f.dtype, VEC, (-bound, bound), smooth),
                              (f.dtype, M, (-lab.hi, 1.0 - lab.lo), smooth)])


def _pack_emit(d: _Drawer, op: str) -> None:
    first = d.pick(_floats(d, lambda v: v.shape == VEC))
    same = _floats(d, lambda v: v.shape == VEC and v.dtype == first.dtype)
    ins = [first] + [d.pick(same) for _ in range(7)]
    iv = _hull(*[(v.lo, v.hi) for v in ins])
    d.emit(op, ins, {"axis": d.pick([0, 1])}, [(first.dtype, M, iv, all(v.smooth for v in ins))])


def _unpack_emit(d: _Drawer, op: str) -> None:
    v = d.pick(_matmul_cands(d))
    d.emit(op, [v], {"axis": d.pick([0, 1])}, [(v.dtype, VEC, (v.lo, v.hi), v.smooth)] * 8)


def _identity_n_emit(d: _Drawer, op: str) -> None:
    ins = [d.pick(d.recent(lambda v: True)) for _ in range(d.integer(1, 3))]
    d.emit(op, ins, {}, [(v.dtype, v.shape, (v.lo, v.hi), v.smooth) for v in ins])


def _reshape_emit(d: _Drawer, op: str) -> None:
    v = d.pick(_floats(d, lambda v: v.shape in (M, IMG)))
    shape = IMG if v.shape == M else M
    d.emit(op, [v], {"shape": shape}, [(v.dtype, shape, (v.lo, v.hi), v.smooth)])


def _transpose_emit(d: _Drawer, op: str) -> None:
    v = d.pick(_matmul_cands(d))
    d.emit(op, [v], {"perm": (1, 0)}, [(v.dtype, M, (v.lo, v.hi), v.smooth)])


def _reverse_emit(d: _Drawer, op: str) -> None:
    v = d.pick(_floats(d, lambda v: len(v.shape) >= 1))
    axis = d.pick([len(v.shape) - 1, 0])
    d.emit(op, [v], {"axis": axis}, [(v.dtype, v.shape, (v.lo, v.hi), v.smooth)])


def _clip_emit(d: _Drawer, op: str) -> None:
    v = d.pick(_floats(d))
    low = d.pick([-1.0, -0.5, 0.0])
    high = low + d.pick([1.0, 0.5, 2.0])
    lo, hi = min(max(v.lo, low), high), max(min(v.hi, high), low)
    d.emit(op, [v], {"min": low, "max": high}, [(v.dtype, v.shape, (lo, hi), v.smooth)])


def _bools(d: _Drawer) -> list[Val]:
    return d.recent(lambda v: v.dtype == "bool")


def _select_emit(d: _Drawer, op: str) -> None:
    cond = d.pick(_bools(d))
    if op == "Select":  # the condition has the shape of the values
        ok = lambda v: v.shape == cond.shape  # noqa: E731
    else:  # SelectV2 broadcasts the condition
        ok = lambda v: _broadcast(cond.shape, v.shape) == v.shape  # noqa: E731
    a = d.pick(_floats(d, ok) + [None])
    if a is None:
        a = d.const("float32", cond.shape, -1.0, 1.0)
    b = d.partner(a, lambda b: b.shape == a.shape, (-1.0, 1.0), shapes=[a.shape])
    d.emit(op, [cond, a, b], {}, [(a.dtype, a.shape, _hull((a.lo, a.hi), (b.lo, b.hi)), False)])


def _argmax_emit(d: _Drawer, op: str) -> None:
    v = d.pick(_matmul_cands(d))
    d.emit(op, [v], {"axis": d.pick([1, 0])}, [("int64", VEC, (0.0, 7.0), False)])


_CASTS = {
    "float32": ["float16", "int32", "bool"],
    "float16": ["float32"],
    "int32": ["float32"],
    "int64": ["float32"],
    "bool": ["float32"],
}


def _cast_emit(d: _Drawer, op: str) -> None:
    v = d.pick(d.recent(lambda v: v.dtype in _CASTS))
    to = d.pick(_CASTS[v.dtype])
    if to == "int32":
        iv, smooth = (float(math.trunc(v.lo)), float(math.trunc(v.hi))), False
    elif to == "bool":
        iv, smooth = (0.0, 1.0), False
    else:
        iv, smooth = (v.lo, v.hi), v.smooth
    d.emit(op, [v], {"to": to}, [(to, v.shape, iv, smooth)])


def _always(pred: Callable[[Val], bool]) -> Callable[[_Drawer], list[Val]]:
    return lambda d: _floats(d, pred)


_OPS: dict[str, tuple[Callable[[_Drawer], list[Val]], Callable[[_Drawer, str], None]]] = {}
for _op in _UNARY:
    _OPS[_op] = (_unary_cands(_op), _unary_emit)
for _op in _BINARY:
    _OPS[_op] = (_binary_cands(_op), _binary_emit)
for _op in ("Greater", "Less"):
    _OPS[_op] = (_always(lambda v: True), _compare_emit)
for _op in ("MatMul", "BatchMatMulV2", "Einsum"):
    _OPS[_op] = (_gemm_cands(_op), _gemm_emit)
for _op in ("Conv2D", "DepthwiseConv2dNative"):
    _OPS[_op] = (_img_cands, _conv_emit)
for _op in _REDUCE_BOUND:
    _OPS[_op] = (_reduce_cands(_op), _reduce_emit)
_OPS.update({
    "Pow": (_pow_cands, _pow_emit),
    "BiasAdd": (_always(lambda v: v.shape in (M, IMG) and v.mag <= LIMIT - 0.5), _bias_emit),
    "AvgPool": (_img_cands, _pool_emit),
    "MaxPool": (_img_cands, _pool_emit),
    "FusedBatchNormV3": (_always(lambda v: v.shape == IMG and _bn_bound(v.mag) <= LIMIT), _bn_emit),
    "AddN": (_always(lambda v: v.mag <= LIMIT - 1), _addn_emit),
    "Cumsum": (_always(lambda v: v.shape == M and 8 * v.mag <= LIMIT), _cumsum_emit),
    "L2Loss": (_l2_cands, _l2_emit),
    "SoftmaxCrossEntropyWithLogits": (
        _always(lambda v: v.shape == M and _xent_bound(v, Val("", "", M, 0, 1)) <= LIMIT), _xent_emit),
    "Pack": (_always(lambda v: v.shape == VEC), _pack_emit),
    "Unpack": (_matmul_cands, _unpack_emit),
    "IdentityN": (lambda d: d.pool, _identity_n_emit),
    "Reshape": (_always(lambda v: v.shape in (M, IMG)), _reshape_emit),
    "Transpose": (_matmul_cands, _transpose_emit),
    "ReverseV2": (_always(lambda v: len(v.shape) >= 1), _reverse_emit),
    "ClipByValue": (_always(lambda v: True), _clip_emit),
    "Select": (_bools, _select_emit),
    "SelectV2": (_bools, _select_emit),
    "ArgMax": (_matmul_cands, _argmax_emit),
    "Cast": (lambda d: d.recent(lambda v: v.dtype in _CASTS), _cast_emit),
})
assert set(_OPS) == set(OPS), set(_OPS) ^ set(OPS)


# -- structure: loops and calls
def _while_candidates(d: _Drawer) -> list[Val]:
    return _floats(d, lambda v: v.dtype == "float32")


def _prune(steps: Sequence[Step], results: Sequence[str]) -> tuple[Step, ...]:
    """Drop body steps nothing returned depends on (a loop body may not have sinks)."""
    needed = {r.partition(":")[0] for r in results}
    kept = []
    for step in reversed(steps):
        if step.name in needed:
            kept.append(step)
            needed.update(i.partition(":")[0] for i in step.inputs)
            needed.update(step.control)
    return tuple(reversed(kept))


def _while_emit(d: _Drawer) -> None:
    v = d.pick(_while_candidates(d))
    iterations = d.integer(1, 3)
    arg = Val("arg", v.dtype, v.shape, min(v.lo, -1.0), max(v.hi, 1.0), v.smooth)
    captured = _floats(d, lambda x: x.dtype == "float32")[:4]
    sub = _Drawer(d.draw, d.opts, args=[arg], captured=list(reversed(captured)), body=True)
    sub.run(0, d.opts.body_nodes)
    same = [x for x in reversed(sub.made) if x.shape == v.shape and x.dtype == v.dtype]
    r = d.pick(same + [arg])
    (bounded,) = sub.emit("Tanh", [r], {}, [(v.dtype, v.shape, (-1.0, 1.0), r.smooth)])
    body = Program(_prune(sub.steps, [bounded.ref]), (arg,), (bounded.ref,))
    d.emit("While", [v], {"iterations": iterations},
           [(v.dtype, v.shape, (min(v.lo, -1.0), max(v.hi, 1.0)), v.smooth and bounded.smooth)],
           body=body)


def _call_candidates(d: _Drawer) -> list[Val]:
    return _floats(d)


def _call_emit(d: _Drawer) -> None:
    first = d.pick(_call_candidates(d))
    ins = [first] + ([d.pick(_call_candidates(d))] if d.chance(40) else [])
    args = [Val(f"a{i}", v.dtype, v.shape, v.lo, v.hi, v.smooth) for i, v in enumerate(ins)]
    sub = _Drawer(d.draw, d.opts, args=args, body=True)
    sub.run(1, d.opts.body_nodes)
    results_pool = [x for x in reversed(sub.made) if x.is_float] or args
    results = [d.pick(results_pool)]
    if d.chance(30):
        results.append(d.pick(results_pool))
    body = Program(_prune(sub.steps, [r.ref for r in results]), tuple(args), tuple(r.ref for r in results))
    d.emit("Call", ins, {}, [(r.dtype, r.shape, (r.lo, r.hi), r.smooth) for r in results], body=body)


# ----------------------------------------------------------------------------- the case


class GraphCase:
    """A drawn graph: its GraphDef, how to run it, and the program it was built from.

    ``fetches`` are the graph's outputs (the nodes nothing reads from), ``outputs`` the
    tensors to evaluate, ``smooth_outputs`` those that depend continuously on the inputs (the
    others go through comparisons or float -> int casts), ``feeds`` values for the
    placeholders, ``target`` a target with a GPU:1 of compute capability 6.1 when the graph
    uses that device.
    """

    def __init__(self, program: Program | None, seed: int, graph_def: Any, feeds: Mapping[str, np.ndarray],
                 smooth: Iterable[str], bounds: Mapping[str, tuple[float, float]] | None = None,
                 description: str = "") -> None:
        self.program = program
        self.seed = seed
        self.graph_def = graph_def
        self.feeds = dict(feeds)
        self.fetches = tuple(sinks(graph_def))
        self.outputs = tuple(graph_outputs(graph_def))
        smooth = set(smooth)
        self.smooth_outputs = tuple(t for t in self.outputs if t in smooth)
        #: Bounds the strategies guarantee for the values of main-graph tensors.
        self.bounds = dict(bounds or {})
        self.description = description
        uses_gpu1 = any("GPU:1" in n.device for n in graph_def.node) or any(
            "GPU:1" in n.device for f in graph_def.library.function for n in f.node_def)
        self.target = "gpu:8.0,6.1" if uses_gpu1 else "gpu:8.0"

    @property
    def ops(self) -> list[str]:
        """Op types of the main graph and every function body, sorted."""
        found = {n.op for n in self.graph_def.node}
        for f in self.graph_def.library.function:
            found |= {n.op for n in f.node_def}
        return sorted(found)

    def run(self, graph_def: Any = None, outputs: Sequence[str] | None = None) -> list[np.ndarray]:
        """Evaluate ``outputs`` (default: all) of ``graph_def`` (default: the drawn graph)."""
        return run_graph(graph_def if graph_def is not None else self.graph_def, self.feeds,
                         list(outputs if outputs is not None else self.outputs))

    @classmethod
    def from_graph_def(cls, graph_def: Any, feeds: Mapping[str, np.ndarray] | None = None, *,
                       smooth: bool = True, description: str = "") -> "GraphCase":
        """A case for a GraphDef made by hand (an ``@example`` regression, say).  ``feeds``
        default to uniform values in [-1, 1]; ``smooth``: compare every output numerically."""
        from .execute import random_feeds

        feeds = random_feeds(graph_def) if feeds is None else feeds
        outputs = graph_outputs(graph_def)
        return cls(None, 0, graph_def, feeds, outputs if smooth else (), description=description)

    def __repr__(self) -> str:
        lines = [f"GraphCase(target={self.target!r}, seed={self.seed}, fetches={list(self.fetches)!r}):"]
        if self.program is not None:
            lines += format_program(self.program)
        else:
            lines += [f"  {self.description or 'a GraphDef made by hand'}"]
            lines += [f"  {n.name} = {n.op}({', '.join(n.input)})" + (f" @{n.device}" if n.device else "")
                      for n in self.graph_def.node]
        return "\n".join(lines)


def _wrap_outputs(d: _Drawer) -> None:
    """Give each unused float value an ``Identity`` output node, as exported models have."""
    used = set()
    for step in d.steps:
        used.update(i.partition(":")[0] for i in step.inputs)
        used.update(step.control)
    for v in [v for v in d.made if v.is_float]:
        name = v.ref.partition(":")[0]
        if name not in used:
            used.add(name)
            d.emit("Identity", [v], {}, [(v.dtype, v.shape, (v.lo, v.hi), v.smooth)])


def _normalize_ops(ops: Iterable[str] | Mapping[str, int] | None) -> dict[str, int]:
    if ops is None:
        return dict(OPS)
    if isinstance(ops, Mapping):
        weights = {op: int(w) for op, w in ops.items()}
    else:
        weights = {op: OPS.get(op, 1) for op in ops}
    unknown = sorted(set(weights) - set(OPS))
    if unknown:
        raise ValueError(f"graphs(ops=...) names ops the strategies cannot draw: {unknown}; "
                         f"known: {sorted(OPS)}")
    return {op: weights[op] for op in OPS if op in weights}


def graphs(
    *,
    min_nodes: int = 2,
    max_nodes: int = 12,
    ops: Iterable[str] | Mapping[str, int] | None = None,
    control_edges: bool = True,
    devices: Sequence[str] = ("",),
    while_loops: bool = False,
    functions: bool = False,
    max_inputs: int = 3,
    body_nodes: int = 3,
    output_identities: bool | None = None,
) -> st.SearchStrategy[GraphCase]:
    """Draw a :class:`GraphCase`: a valid GraphDef that runs, with feeds and outputs.

    Parameters
    ----------
    min_nodes, max_nodes
        How many ops to draw (Placeholders, Consts and output Identities come on top).
    ops
        The op mix: op names (each with its default weight) or a mapping op -> weight;
        default :data:`OPS`, every op the strategies know.
    control_edges
        Give some nodes a control input from an earlier node.
    devices
        Device strings to place nodes on, e.g. :data:`MULTI_DEVICES`.  The first one is what
        the shrinker moves towards.
    while_loops, functions
        Also draw TF1 while loops (``Enter/Merge/Switch/NextIteration/Exit``) and calls
        (``PartitionedCall``) into a FunctionDef; each has a body of up to ``body_nodes``
        drawn ops.
    output_identities
        Whether unused values get an ``Identity`` output node (``None``: drawn per graph).
        Without them the last op of a chain is itself an output and is preserved.
    """
    if not 0 <= min_nodes <= max_nodes:
        raise ValueError(f"need 0 <= min_nodes <= max_nodes, got {min_nodes}, {max_nodes}")
    if not devices:
        raise ValueError("devices must name at least one device string ('' is the default device)")
    weights = _normalize_ops(ops)

    @st.composite
    def _draw(draw: Any) -> GraphCase:
        opts = _Options(min_nodes, max_nodes, weights, control_edges, tuple(devices), while_loops,
                        functions, max_inputs, body_nodes)
        seed = draw(st.integers(0, 2 ** 16))
        d = _Drawer(draw, opts)
        for _ in range(d.integer(1, max_inputs)):
            d.placeholder(d.pick([M, IMG, VEC]))
        d.run(min_nodes, max_nodes)
        wrap = output_identities if output_identities is not None else not d.chance(30)
        if wrap:
            _wrap_outputs(d)
        program = Program(tuple(d.steps))
        built = materialize(program, seed)
        feeds = {}
        for i, step in enumerate(s for s in program.steps if s.op == "Placeholder"):
            rng = np.random.default_rng([seed, 1_000_000 + i])
            feeds[built.tensors[step.name]] = rng.uniform(-1.0, 1.0, step.param("shape")).astype(np.float32)
        smooth = {built.tensors[v.ref] for v in d.pool if v.smooth and v.ref in built.tensors}
        smooth |= {built.tensors[v.ref + ":0"] for v in d.pool
                   if v.smooth and ":" not in v.ref and v.ref + ":0" in built.tensors}
        bounds = {built.tensors[v.ref]: (v.lo, v.hi) for v in d.pool if v.is_float and v.ref in built.tensors}
        return GraphCase(program, seed, built.graph_def, feeds, smooth, bounds)

    return _draw()


#: The optimization levels drawn by :func:`graphs_with_options` (``None``: the default).
LEVELS: tuple[str | None, ...] = (None, None, None, "TENSOR_CORES_ONLY", "TREAT_INFER_AS_DENY",
                                  "UNSAFE_FORCE_ALL")


def graphs_with_options(*, lists: Sequence[str] = ("default", "tensorflow", "optimal"), cpu: bool = True,
                        planners: Sequence[str | None] = (None, None, "min-casts", "optimal", "greedy"),
                        levels: Sequence[str | None] = LEVELS,
                        **graph_options: Any) -> st.SearchStrategy[tuple[GraphCase, dict[str, Any]]]:
    """Draw ``(case, options)``: a :class:`GraphCase` and keyword arguments for
    ``rewrite_graph_def`` (target: the case's GPU target or, when ``cpu``, sometimes ``"cpu"``;
    precision; one of ``lists``; fetches: the case's outputs, or ``None`` which means the
    same; ``use_env=False``; and sometimes one of ``planners`` -- ``None`` leaves the
    profile's planner, ``"min-casts"`` exercises the min cut on the small drawn graphs, where
    the time-based ``optimal`` planner rightly keeps almost everything float32 -- and one of
    ``levels`` (``None`` leaves the default; ``UNSAFE_FORCE_ALL`` is drawn only with a GPU
    target, as TensorFlow refuses it for CPUs))."""

    @st.composite
    def _draw(draw: Any) -> tuple[GraphCase, dict[str, Any]]:
        case = draw(graphs(**graph_options))
        options: dict[str, Any] = {
            "target": "cpu" if cpu and draw(st.integers(0, 3)) == 3 else case.target,
            "precision": draw(precisions()),
            "lists": draw(st.sampled_from(list(lists))),
            "fetches": None if draw(st.booleans()) else list(case.fetches),
            "use_env": False,
        }
        planner = draw(st.sampled_from(list(planners)))
        if planner is not None:
            options["planner"] = planner
        level = draw(st.sampled_from(list(levels)))
        if level == "UNSAFE_FORCE_ALL" and options["target"] == "cpu":
            level = None
        if level is not None:
            options["level"] = level
        return case, options

    return _draw()


def graph_defs(**options: Any) -> st.SearchStrategy[Any]:
    """Like :func:`graphs`, but draws the GraphDef alone."""
    return graphs(**options).map(lambda case: case.graph_def)
