"""The ops the graph strategies draw: for each op, which values it may take as inputs
(candidates) and how it is drawn (emit), in the table ``_OPS``; :data:`OPS` is the op mix
with default weights.

Each emitter draws its operands and parameters from a :class:`~.drawer._Drawer` and appends
one step (mutating the drawer); the bounds of its outputs stay within :data:`LIMIT`.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

import numpy as np

from .draw_bounds import (
    _BINARY,
    _UNARY,
    IMG,
    LIMIT,
    SCALAR,
    VEC,
    M,
    _add,
    _broadcast,
    _fits,
    _hull,
    _square,
)
from .drawer import _Drawer, _floats
from .program import Val

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
