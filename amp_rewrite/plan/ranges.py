"""Value ranges a graph proves: intervals of float tensors, from the ops that bound them.

A deny-list op is denied for a reason that often depends on its input's values: ``Exp`` in
float16 because ``exp(x)`` overflows float16 (largest finite value 65504) for ``x`` above
about 11.09.  Many of its inputs cannot exceed that by construction:

* ``exp(-x^2)``: the gradient of ``Erf`` (and so of an exact GELU) is ``2/sqrt(pi) *
  exp(-square(x)) * dy``; a Gaussian is ``exp(-0.5 * x * x)``;
* ``exp(x - max(x))``: a softmax or log-sum-exp written out (``tf.reduce_logsumexp``);
* ``exp(-softplus(x))``, ``exp(log_sigmoid(x))`` and the like.

:class:`RangeProver` bounds a tensor by interval arithmetic over the ops that produce it
(:data:`_FIXED` ranges such as ``Sigmoid`` in [0, 1], and transfer functions for ``Neg``,
``Square``, ``Add``, ``Mul``, ``Maximum`` ...), plus two relations interval arithmetic alone
cannot see: ``x * x >= 0`` and ``x - max(x) <= 0`` (a max reduction of the same tensor, kept
dimensions).  Constants are read through :func:`amp_rewrite.graph.node_values.float_const_range`.
Anything else -- a function argument, a loop, an op without a rule -- is unbounded, so a
bound is only ever claimed when every step of its derivation holds; the derivation is kept as
text (:attr:`Bound.why`) for the plan's reason.

Bounds are computed in float64 on exact values.  In low precision every op rounds, but
round-to-nearest is monotone, so a bound of 0 reached through monotone steps without constants
(``-x^2``, ``x - max(x)``) holds exactly, and constants are only used up to
:data:`MAX_CONSTANT`, whose float16 rounding is at most 1.  A list's limit keeps more margin
than that: ``Exp``'s ``input_max`` is 0 (an output at most 1, which its consumers may run in
float16 like any other; a limit near 11.09 would leave them an input of up to 65504).

Pure: the graph is only read.  Work is demand-driven (only the tensors asked about and what
feeds them through ops with a rule) and memoized per prover: each tensor is derived once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import networkx as nx

from ..graph import dtypes as dt
from ..graph import ir
from ..graph.node_values import bool_attr, float_const_range

__all__ = ["Bound", "UNBOUNDED", "RangeProver", "MAX_CONSTANT"]

INF = math.inf
_WHY_CHARS = 120
#: Most nodes the even-product walk (``x * x``, ``-0.5 * x * x``) visits in one product tree.
MAX_PRODUCT_NODES = 48
#: Largest constant magnitude a derivation uses.  In float16 a constant rounds by up to
#: ``|c| * 2**-11``; up to this size that is at most 1, so a bound proven in exact arithmetic
#: holds in float16 up to a rounding far below any limit that matters (round-to-nearest is
#: monotone, so a bound of 0 reached without constants holds exactly).  A larger constant
#: proves nothing.
MAX_CONSTANT = 2048.0


@dataclass(frozen=True)
class Bound:
    """A closed interval ``[lo, hi]`` holding every value of a tensor (``-inf``/``inf`` where
    unbounded), and how it was derived (``""`` for nothing proven)."""

    lo: float
    hi: float
    why: str = ""

    def __post_init__(self) -> None:
        # Derivations nest their inputs' text: kept short, so a deep one stays one line (and
        # a wide DAG cannot grow it without bound).
        if len(self.why) > _WHY_CHARS:
            object.__setattr__(self, "why", self.why[:_WHY_CHARS - 3] + "...")

    @property
    def known(self) -> bool:
        """Whether either end is finite: something is proven."""
        return self.lo > -INF or self.hi < INF


UNBOUNDED = Bound(-INF, INF)

#: Ops whose output range does not depend on their input: ``(lo, hi)``.
_FIXED: dict[str, tuple[float, float]] = {
    "Sigmoid": (0.0, 1.0), "Tanh": (-1.0, 1.0), "Softsign": (-1.0, 1.0), "Erf": (-1.0, 1.0),
    "Erfc": (0.0, 2.0), "Sin": (-1.0, 1.0), "Cos": (-1.0, 1.0), "Softmax": (0.0, 1.0),
    "Softplus": (0.0, INF), "Sqrt": (0.0, INF), "Rsqrt": (0.0, INF), "Relu": (0.0, INF),
    "Relu6": (0.0, 6.0), "Elu": (-1.0, INF), "Selu": (-1.7580993408473766, INF),
    "Abs": (0.0, INF), "Square": (0.0, INF), "Exp": (0.0, INF), "LogSoftmax": (-INF, 0.0),
    "ZerosLike": (0.0, 0.0), "OnesLike": (1.0, 1.0),
}
_FLOATS = frozenset({dt.FLOAT, dt.DOUBLE, dt.HALF, dt.BFLOAT16})
#: Ops whose output values are among their input 0's values (a subset, rearranged or
#: repeated) or, for ``AvgPool``, averages of them (a window is never empty): the output lies
#: in the input's range.  (``Cast`` and ``Gather`` have rules of their own.)  Reductions are
#: not here: over an empty axis ``Max``/``Min`` give -inf/+inf and ``Mean`` NaN.
_SAME_VALUES = frozenset({
    "Identity", "Snapshot", "StopGradient", "PreventGradient", "EnsureShape", "CheckNumerics",
    "Reshape", "Squeeze", "ExpandDims", "Transpose", "Tile", "BroadcastTo", "Slice",
    "StridedSlice", "Reverse", "ReverseV2", "MirrorPad", "MaxPool", "MaxPoolV2", "AvgPool",
    "Copy", "CopyHost",
})
#: Ops whose data inputs all pass through: the output lies in their union.
_UNION_OF_INPUTS = frozenset({"Pack", "AddN"})


def _nan_to(value: float, fallback: float) -> float:
    return fallback if math.isnan(value) else value


def _interval_mul(a: Bound, b: Bound) -> tuple[float, float]:
    """The interval product (``0 * inf`` taken as 0: an infinite end is never attained)."""
    products = [_nan_to(x * y, 0.0) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
    return min(products), max(products)


class RangeProver:
    """Bounds of the float tensors of one graph (a main graph or a function body).

    ``bound(name, port)`` is the interval of output ``port`` of node ``name``.  Reads ``g``
    only; caches per ``(name, port)``.
    """

    def __init__(self, g: nx.MultiDiGraph) -> None:
        self._g = g
        self._nodes = g._node
        self._memo: dict[tuple[str, int], Bound] = {}

    def bound(self, name: str, port: int = 0) -> Bound:
        """The proven interval of tensor ``name:port`` (:data:`UNBOUNDED` when nothing is).

        Every tensor the answer depends on is bounded first, producers before consumers, with
        an explicit stack (no recursion limit, no depth limit), and remembered: each tensor is
        derived once per prover whatever the order of the questions, so an answer never
        depends on which was asked first.  A cycle (a valid graph closes one only through a
        loop's ``Merge``, an op without a rule, so it is never walked) would leave the tensor
        that closes it unbounded."""
        key = (name, port)
        memo = self._memo
        if key in memo:
            return memo[key]
        active: set[tuple[str, int]] = set()
        stack: list[tuple[tuple[str, int], bool]] = [(key, False)]
        while stack:
            k, ready = stack.pop()
            if k in memo:
                continue
            if ready:
                active.discard(k)
                memo[k] = self._derive(*k)
                continue
            if k in active:
                continue
            active.add(k)
            stack.append((k, True))
            stack.extend((dep, False) for dep in reversed(self._needs(*k)) if dep not in memo and dep not in active)
        return memo[key]

    def _needs(self, name: str, port: int) -> list[tuple[str, int]]:
        """The tensors :meth:`_derive` reads the bounds of for ``name:port``: a ruled op's
        data inputs, none for anything else."""
        data = self._nodes.get(name)
        if data is None or port != 0:
            return []
        op = data["op"]
        if op in _FIXED or op in _SAME_VALUES or op in _RULES or op in _UNION_OF_INPUTS or op in ("ConcatV2", "Concat"):
            return self._inputs(name)
        return []

    def _inputs(self, name: str) -> list[tuple[str, int]]:
        return ir.data_inputs(self._g, name)

    def _derive(self, name: str, port: int) -> Bound:
        """The bound of ``name:port`` from its op's rule, its inputs' bounds already derived
        (:meth:`bound`; an input not derived counts as unbounded)."""
        data = self._nodes.get(name)
        if data is None or port != 0:
            return UNBOUNDED  # every rule below is about output 0
        op = data["op"]
        ins = self._inputs(name)
        memo = self._memo
        sub = lambda i: memo.get(ins[i], UNBOUNDED) if i < len(ins) else UNBOUNDED  # noqa: E731
        if op == "Const":
            values = float_const_range(data)
            if values is None or max(abs(values[0]), abs(values[1])) > MAX_CONSTANT:
                return UNBOUNDED
            return Bound(values[0], values[1], _number(values))
        if op in _FIXED:
            return self._fixed(op, ins, sub)
        if op in _SAME_VALUES:
            inner = sub(0)
            return Bound(inner.lo, inner.hi, inner.why) if inner.known else UNBOUNDED
        rule = _RULES.get(op)
        if rule is not None:
            return rule(self, name, ins, sub)
        if op in _UNION_OF_INPUTS or op in ("ConcatV2", "Concat"):
            return self._union(op, ins, sub)
        return UNBOUNDED

    # ------------------------------------------------------------------ rules

    def _fixed(self, op: str, ins: Sequence[tuple[str, int]], sub: Callable[[int], Bound]) -> Bound:
        """A range fixed by the op, tightened by its input's where the op is monotone (or,
        for ``Square`` and ``Abs``, monotone on each side of 0)."""
        lo, hi = _FIXED[op]
        if op in ("Square", "Abs"):
            inner = sub(0) if ins else UNBOUNDED
            if inner.lo > -INF and inner.hi < INF:
                f = (lambda e: e * e) if op == "Square" else abs
                top = max(f(inner.lo), f(inner.hi))
                low = 0.0 if inner.lo <= 0.0 <= inner.hi else min(f(inner.lo), f(inner.hi))
                return Bound(low, top, f"{op} of ({inner.why})")
            return Bound(lo, hi, op)
        if op in _MONOTONE and ins:
            inner = sub(0)
            if inner.known:
                f = _MONOTONE[op]
                return Bound(max(lo, f(inner.lo)), min(hi, f(inner.hi)), f"{op} of ({inner.why})")
        return Bound(lo, hi, op)

    def _neg(self, name: str, ins: Sequence[tuple[str, int]], sub: Callable[[int], Bound]) -> Bound:
        inner = sub(0)
        return Bound(-inner.hi, -inner.lo, f"Neg of ({inner.why})") if inner.known else UNBOUNDED

    def _add(self, name: str, ins: Sequence[tuple[str, int]], sub: Callable[[int], Bound]) -> Bound:
        a, b = sub(0), sub(1)
        if not (a.known and b.known):
            return UNBOUNDED
        lo, hi = _nan_to(a.lo + b.lo, -INF), _nan_to(a.hi + b.hi, INF)
        return _made(lo, hi, f"({a.why}) + ({b.why})")

    def _sub(self, name: str, ins: Sequence[tuple[str, int]], sub: Callable[[int], Bound]) -> Bound:
        if len(ins) == 2 and self._is_max_of(ins[1], ins[0]):
            # x - max(x): every element is at most its group's maximum.
            return Bound(-INF, 0.0, "x - max(x)")
        a, b = sub(0), sub(1)
        if not (a.known and b.known):
            return UNBOUNDED
        lo, hi = _nan_to(a.lo - b.hi, -INF), _nan_to(a.hi - b.lo, INF)
        return _made(lo, hi, f"({a.why}) - ({b.why})")

    def _mul(self, name: str, ins: Sequence[tuple[str, int]], sub: Callable[[int], Bound]) -> Bound:
        even = self._even_product(name)
        if even is not None:
            # A product in which every tensor appears an even number of times (x * x,
            # -0.5 * x * x) is its constant factor times a non-negative number.
            lo, hi = _interval_mul(even, Bound(0.0, INF))
            return _made(lo, hi, f"({even.why}) * x^2")
        a, b = sub(0), sub(1)
        if not (a.known and b.known):
            return UNBOUNDED
        lo, hi = _interval_mul(a, b)
        return _made(lo, hi, f"({a.why}) * ({b.why})")

    def _even_product(self, name: str) -> Bound | None:
        """The constant factor of the product ``name`` (a tree of ``Mul`` and ``Neg`` over
        constants and tensors) when every non-constant tensor in it appears an even number of
        times, else ``None``."""
        factor = Bound(1.0, 1.0, "1")
        counts: dict[tuple[str, int], int] = {}
        stack = [(name, 0)]
        steps = 0
        while stack:
            steps += 1
            if steps > MAX_PRODUCT_NODES:
                return None
            tensor = self._alias_source(stack.pop())
            data = self._nodes.get(tensor[0])
            op = data["op"] if data is not None and tensor[1] == 0 else None
            if op in ("Mul", "Neg"):
                if op == "Neg":
                    factor = Bound(-factor.hi, -factor.lo, factor.why)
                stack.extend(self._inputs(tensor[0]))
                continue
            constant = float_const_range(data) if op == "Const" else None
            if constant is not None and max(abs(constant[0]), abs(constant[1])) > MAX_CONSTANT:
                return None
            if constant is not None:
                lo, hi = _interval_mul(factor, Bound(*constant))
                factor = Bound(lo, hi, _number((lo, hi)))
            else:
                counts[tensor] = counts.get(tensor, 0) + 1
        if not counts or any(n % 2 for n in counts.values()):
            return None
        return factor

    def _div(self, name: str, ins: Sequence[tuple[str, int]], sub: Callable[[int], Bound]) -> Bound:
        a, b = sub(0), sub(1)
        if not (a.known and b.known) or b.lo <= 0.0 <= b.hi:
            return UNBOUNDED  # a divisor that may be 0 (or of unknown sign) bounds nothing
        lo, hi = _interval_mul(a, Bound(1.0 / b.hi, 1.0 / b.lo))
        return _made(lo, hi, f"({a.why}) / ({b.why})")

    def _maximum(self, name: str, ins: Sequence[tuple[str, int]], sub: Callable[[int], Bound]) -> Bound:
        a, b = sub(0), sub(1)
        return _made(max(a.lo, b.lo), max(a.hi, b.hi), f"max(({a.why}), ({b.why}))")

    def _minimum(self, name: str, ins: Sequence[tuple[str, int]], sub: Callable[[int], Bound]) -> Bound:
        a, b = sub(0), sub(1)
        return _made(min(a.lo, b.lo), min(a.hi, b.hi), f"min(({a.why}), ({b.why}))")

    def _clip(self, name: str, ins: Sequence[tuple[str, int]], sub: Callable[[int], Bound]) -> Bound:
        # max(min(x, high), low), end by end: both functions are monotone in every argument.
        x, low, high = sub(0), sub(1), sub(2)
        lo = max(min(x.lo, high.lo), low.lo)
        hi = max(min(x.hi, high.hi), low.hi)
        return _made(lo, hi, "clip_by_value")

    def _select(self, name: str, ins: Sequence[tuple[str, int]], sub: Callable[[int], Bound]) -> Bound:
        a, b = sub(1), sub(2)
        if not (a.known and b.known):
            return UNBOUNDED
        return _made(min(a.lo, b.lo), max(a.hi, b.hi), f"select(({a.why}), ({b.why}))")

    def _pad(self, name: str, ins: Sequence[tuple[str, int]], sub: Callable[[int], Bound]) -> Bound:
        inner = sub(0)
        fill = sub(2) if self._nodes[name]["op"] == "PadV2" else Bound(0.0, 0.0, "0")
        if not (inner.known and fill.known):
            return UNBOUNDED
        return _made(min(inner.lo, fill.lo), max(inner.hi, fill.hi), f"pad of ({inner.why})")

    def _cast(self, name: str, ins: Sequence[tuple[str, int]], sub: Callable[[int], Bound]) -> Bound:
        # Between float types a Cast only rounds (the limits absorb a rounding); to or from
        # an integer type it truncates or its source is unbounded.
        types = self._nodes[name]["dtypes"]
        if types.get("SrcT") not in _FLOATS or types.get("DstT") not in _FLOATS:
            return UNBOUNDED
        inner = sub(0)
        return Bound(inner.lo, inner.hi, inner.why) if inner.known else UNBOUNDED

    def _gather(self, name: str, ins: Sequence[tuple[str, int]], sub: Callable[[int], Bound]) -> Bound:
        # An index out of range gives 0 on a GPU (an error on a CPU): the params' values or 0.
        inner = sub(0)
        if not inner.known:
            return UNBOUNDED
        return _made(min(inner.lo, 0.0), max(inner.hi, 0.0), f"gather of ({inner.why})")

    def _fill(self, name: str, ins: Sequence[tuple[str, int]], sub: Callable[[int], Bound]) -> Bound:
        inner = sub(1)  # Fill(dims, value)
        return Bound(inner.lo, inner.hi, inner.why) if inner.known else UNBOUNDED

    def _sum(self, name: str, ins: Sequence[tuple[str, int]], sub: Callable[[int], Bound]) -> Bound:
        # A sum of values of one sign keeps that sign.
        inner = sub(0)
        if inner.lo >= 0.0:
            return Bound(0.0, INF, f"sum of ({inner.why})")
        if inner.hi <= 0.0:
            return Bound(-INF, 0.0, f"sum of ({inner.why})")
        return UNBOUNDED

    def _union(self, op: str, ins: Sequence[tuple[str, int]], sub: Callable[[int], Bound]) -> Bound:
        # ConcatV2's last input (Concat's first) is the axis, not data.
        idx = range(len(ins) - 1) if op == "ConcatV2" else range(1, len(ins)) if op == "Concat" else range(len(ins))
        parts = [sub(i) for i in idx]
        if not parts or not all(p.known for p in parts):
            return UNBOUNDED
        if op == "AddN":
            lo = sum(p.lo for p in parts)
            hi = sum(p.hi for p in parts)
            return _made(_nan_to(lo, -INF), _nan_to(hi, INF), " + ".join(f"({p.why})" for p in parts))
        return _made(min(p.lo for p in parts), max(p.hi for p in parts), f"{op} of bounded inputs")

    # ------------------------------------------------------------------ relations

    def _alias_source(self, tensor: tuple[str, int]) -> tuple[str, int]:
        """``tensor`` with value-preserving single-input ops (Identity, StopGradient ...)
        stripped: the tensor it is a copy of."""
        seen = 0
        while seen < MAX_PRODUCT_NODES:
            name, port = tensor
            data = self._nodes.get(name)
            if data is None or port != 0 or data["op"] not in ("Identity", "Snapshot", "StopGradient",
                                                               "PreventGradient", "EnsureShape"):
                return tensor
            ins = self._inputs(name)
            if not ins:
                return tensor
            tensor = ins[0]
            seen += 1
        return tensor

    def _same_tensor(self, a: tuple[str, int], b: tuple[str, int]) -> bool:
        return self._alias_source(a) == self._alias_source(b)

    def _is_max_of(self, reduced: tuple[str, int], x: tuple[str, int]) -> bool:
        """Whether ``reduced`` is ``Max(x, axes, keep_dims=True)`` (through copies): then
        ``x - reduced`` broadcasts each element against its own group's maximum.  Without
        kept dimensions the broadcast may pair an element with another group's maximum."""
        name, port = self._alias_source(reduced)
        data = self._nodes.get(name)
        if data is None or port != 0 or data["op"] != "Max" or bool_attr(data, "keep_dims") is not True:
            return False
        ins = self._inputs(name)
        return bool(ins) and self._same_tensor(ins[0], x)


def _made(lo: float, hi: float, why: str) -> Bound:
    return Bound(lo, hi, why) if (lo > -INF or hi < INF) else UNBOUNDED


def _fmt(value: float) -> str:
    return "inf" if value == INF else "-inf" if value == -INF else f"{value:g}"


def _number(values: tuple[float, float]) -> str:
    lo, hi = values
    return _fmt(lo) if lo == hi else f"constant in [{_fmt(lo)}, {_fmt(hi)}]"


def _safe_exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return INF


def _softplus(x: float) -> float:
    if x == INF:
        return INF
    if x == -INF:
        return 0.0
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


def _sigmoid(x: float) -> float:
    if x == INF:
        return 1.0
    if x == -INF:
        return 0.0
    return 1.0 / (1.0 + _safe_exp(-x))


def _elu(x: float) -> float:
    return x if x >= 0 else (-1.0 if x == -INF else math.expm1(x))


#: Monotone non-decreasing ops: the output's ends are the function of the input's ends.
_MONOTONE: dict[str, Callable[[float], float]] = {
    "Exp": _safe_exp,
    "Relu": lambda x: max(x, 0.0),
    "Relu6": lambda x: min(max(x, 0.0), 6.0),
    "Sigmoid": _sigmoid,
    "Tanh": lambda x: 1.0 if x == INF else -1.0 if x == -INF else math.tanh(x),
    "Erf": lambda x: 1.0 if x == INF else -1.0 if x == -INF else math.erf(x),
    "Softplus": _softplus,
    "Elu": _elu,
    "Softsign": lambda x: 1.0 if x == INF else -1.0 if x == -INF else x / (1.0 + abs(x)),
}

_RULES: dict[str, Callable[[RangeProver, str, Sequence[tuple[str, int]], Callable[[int], Bound]], Bound]] = {
    "Neg": RangeProver._neg,
    "Add": RangeProver._add, "AddV2": RangeProver._add, "BiasAdd": RangeProver._add,
    "Sub": RangeProver._sub,
    "Mul": RangeProver._mul,
    "RealDiv": RangeProver._div, "Div": RangeProver._div,
    "Maximum": RangeProver._maximum, "Minimum": RangeProver._minimum,
    "ClipByValue": RangeProver._clip,
    "Select": RangeProver._select, "SelectV2": RangeProver._select,
    "Pad": RangeProver._pad, "PadV2": RangeProver._pad,
    "Cast": RangeProver._cast, "Fill": RangeProver._fill,
    "GatherV2": RangeProver._gather, "Gather": RangeProver._gather,
    "Sum": RangeProver._sum,
}
