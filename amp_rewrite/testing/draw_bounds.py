"""Value bounds for the graph strategies: the shapes they use, interval arithmetic, and which
unary and binary ops keep a value within :data:`LIMIT` (with the inputs each op accepts).

Pure functions of numbers and :class:`~amp_rewrite.testing.program.Val` bounds; no drawing.
"""

from __future__ import annotations

import math
from typing import Callable

from .program import Val, selu, sigmoid, softplus

#: Largest magnitude a drawn tensor may reach (float16 tops out at 65504).
LIMIT = 64.0

M = (8, 8)
IMG = (1, 2, 4, 8)
VEC = (8,)
SCALAR: tuple[int, ...] = ()


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
