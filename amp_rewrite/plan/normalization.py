"""Recognize normalization computed from moments, so its normalized output may run in low precision.

Keras 3 (and ``tf.nn.moments`` users) compute batch and layer normalization from primitive
ops instead of ``FusedBatchNorm``::

    mean = Mean(x)                       var  = Mean(SquaredDifference(x, StopGradient(mean)))
    scale = Rsqrt(var + eps) * gamma     offset = beta - mean * scale
    y = x * scale + offset

``Mean`` is deny-listed, and TensorFlow's deny propagation then paints every ``Mul``/``Add``
after it -- and through them the ReLUs and residual adds of the whole network -- float32.
(Where a profile infers ``Mean`` -- the optimal profile in bfloat16, whose kernels sum in
float32 -- the moments found here are denied all the same: ``NormalizationInfo.moments``.)
But only the *statistics* (``mean``, ``var``, ``scale``, ``offset``: reductions and
per-channel vectors) need float32.  The *apply* ops that combine a full-size tensor with a
statistic (``x * scale``, ``+ offset``, ``x - mean``, and the same products in the
gradient, ``dy * scale``) produce values bounded by construction (about ``gamma * (x -
mean) / std + beta``), exactly what a fused batch norm computes in float16 with float32
statistics (TensorFlow's own lists let ``FusedBatchNormV3`` run with ``T=half, U=float``).

The unfused apply rounds once more than the fused kernel: ``x * scale`` is about ``x / std``,
and where ``|mean| >> std`` its rounding is large next to the centred result.  But ``x``
itself comes from a low-precision producer (the convolution), whose rounding has the same
size relative to ``std``; the extra rounding at most doubles an error every mixed-precision
batch norm already carries, fused or not (simulated in NumPy on float16 inputs with
``|mean| / std`` of 0, 10 and 100: 1.5x, 1.6x and 1.0x the RMS error of a float32 apply).
Keeping the centring ``Add``/``Sub`` in float32 instead would cost a full-size Cast per
normalization, so the cost model chooses (:mod:`amp_rewrite.plan.optimal`).

That bound needs statistics worth the name.  A batch norm over very few values per channel
(batch 2 on a 1x1 feature map: two) has a sample standard deviation that is often a small
fraction of the values' spread (below a tenth in 8% of draws for two values, and with
negligible probability for sixteen), so ``x * scale + offset`` cancels two numbers much
larger than its result, and low precision multiplies its rounding by ``|mean| / std``
(InceptionV3's training step at batch 2 lost up to 10x the loss accuracy of TensorFlow's
rewrite that way).  A normalization whose statistics are known, from static shapes, to
reduce fewer than :data:`MIN_STATISTIC_COUNT` values is therefore left out: its apply ops
stay float32, as TensorFlow keeps them.  Where a reduced dimension is unknown (a bare
training GraphDef whose weights carry no shapes) the count cannot be known, and the
normalization counts as before.

Fewer values still make the normalization itself *fragile*, whatever precision its apply
runs in: over two values it outputs the sign of their difference, so rounding anywhere
upstream can flip it.  :func:`upstream_of_fragile` finds what feeds such a normalization;
the optimal planner keeps it float32.

:func:`find_normalizations` returns those apply nodes and, for each, the input ports that
carry statistics; the decision stage then stops deny propagation along exactly those
inputs.  A profile can *fence* a normalization instead (``[normalization] apply = "fenced"``,
the default profile in float16, :func:`amp_rewrite.plan.passes.propagate_deny`): its apply
ops stay float32 and deny stops at its output, which is what Keras 3's mixed policies do (a
norm layer computes in float32 and casts its output); that avoids the extra rounding above,
and the same exclusions hold.  Pure: the graph is only read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Mapping

import networkx as nx

from ..graph import ir
from ..graph.shapes import Shape, numel

log = logging.getLogger(__name__)

__all__ = ["MIN_STATISTIC_COUNT", "MAX_FRAGILE_COUNT", "Normalization", "NormalizationInfo",
           "find_normalizations", "upstream_of_fragile"]

#: Fewest values a statistic must reduce for its normalization to run its apply in low precision.
MIN_STATISTIC_COUNT = 16
#: Most values a fragile normalization reduces: everything upstream of one stays float32 under
#: the optimal planner (:func:`upstream_of_fragile`).
MAX_FRAGILE_COUNT = 3

#: Ops that compute statistics from statistics and parameters (per-channel vectors).
_STAT_OPS = frozenset({
    "Add", "AddV2", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "Rsqrt", "Sqrt", "Reciprocal",
    "Inv", "Neg", "Maximum", "Minimum", "Squeeze", "Reshape", "ExpandDims", "StopGradient",
    "Identity", "Cast", "Square", "BroadcastTo",
})
#: Element-wise ops that apply a statistic to a full-size tensor.
_APPLY_OPS = frozenset({"Add", "AddV2", "Sub", "Mul", "RealDiv", "Div"})
#: Ops through which a parameter (weight or constant) stays a parameter.
_PARAM_OPS = frozenset({"Identity", "Reshape", "Cast", "Squeeze", "ExpandDims", "ReadVariableOp",
                        "Neg", "Mul", "Add", "AddV2", "Sub", "StopGradient"})
_PARAM_LEAVES = frozenset({"Const", "VarHandleOp", "VariableV2", "Variable", "HostConst"})


@dataclass(frozen=True)
class Normalization:
    """One recognized normalization: the normalized tensor's producer and its moments."""

    source: str  #: node producing ``x``
    mean: str  #: the ``Mean`` node of the mean
    variance: str  #: the ``Mean`` node of the variance


@dataclass(frozen=True)
class NormalizationInfo:
    """What :func:`find_normalizations` found.

    ``apply`` maps each apply node to the data input ports that carry statistics and the
    normalization it belongs to; ``stats`` are the statistic nodes (they keep float32).
    ``moments`` are the ``Mean`` nodes of every mean/variance pair found, those of
    normalizations left out for too few values included: a profile whose lists let ``Mean``
    run in low precision still keeps these float32.  ``small`` are the normalizations left
    out, each with the number of values its statistics reduce, ordered by ``mean``.
    """

    norms: tuple[Normalization, ...] = ()
    apply: Mapping[str, tuple[frozenset[int], Normalization]] = field(default_factory=dict)
    stats: frozenset[str] = frozenset()
    moments: frozenset[str] = frozenset()
    small: tuple[tuple[Normalization, int], ...] = ()

    @property
    def fragile(self) -> tuple[tuple[Normalization, int], ...]:
        """The small normalizations over 2 to :data:`MAX_FRAGILE_COUNT` values
        (:func:`upstream_of_fragile` says why they matter)."""
        return tuple((norm, count) for norm, count in self.small if 2 <= count <= MAX_FRAGILE_COUNT)


def _resource_placeholder(g: nx.MultiDiGraph, name: str) -> bool:
    data = g._node[name]
    return data["op"] == "Placeholder" and data["dtypes"].get("dtype") == 20  # DT_RESOURCE


def _statistic_count(shapes: Mapping[str, tuple[Shape, ...]], x: tuple[str, int], mean: str) -> int | None:
    """How many values each element of ``mean`` averages, from static shapes; None when a
    reduced dimension (or a shape) is unknown."""
    xs = shapes.get(x[0])
    ms = shapes.get(mean)
    if xs is None or ms is None or x[1] >= len(xs) or not ms or xs[x[1]] is None or ms[0] is None:
        return None
    xshape, mshape = xs[x[1]], ms[0]
    if len(xshape) == len(mshape):  # keepdims: the reduced dimensions are the mean's 1s
        count = 1
        for xd, md in zip(xshape, mshape):
            if md == 1 and xd != 1:
                if xd is None:
                    return None
                count *= xd
        return count
    if any(d is None for d in xshape) or any(d is None for d in mshape):
        return None
    return numel(xshape, 1) // max(1, numel(mshape, 1))


class _Reader:
    """Cached reads of one graph for :func:`find_normalizations`: ops, data inputs, data
    consumers, parameters.  Reads ``g`` only; its caches are its own (``data_inputs`` is
    copied, never mutated)."""

    def __init__(self, g: nx.MultiDiGraph, data_inputs: Mapping[str, list[tuple[str, int]]] | None) -> None:
        self.g = g
        self.ops = {n: d["op"] for n, d in g.nodes(data=True)}
        self._inputs: dict[str, list[tuple[str, int]]] = dict(data_inputs or {})
        self._param: dict[str, bool] = {}

    def inputs(self, n: str) -> list[tuple[str, int]]:
        got = self._inputs.get(n)
        if got is None:
            got = self._inputs[n] = ir.data_inputs(self.g, n)
        return got

    def consumers(self, n: str) -> list[str]:
        return sorted({dst for _, dst, d in self.g.out_edges(n, data=True) if d["src_port"] >= 0})

    def is_param(self, n: str, depth: int = 0) -> bool:
        """A weight or constant: nothing data-dependent feeds it."""
        got = self._param.get(n)
        if got is not None:
            return got
        op = self.ops[n]
        if op in _PARAM_LEAVES or _resource_placeholder(self.g, n):
            result = True
        elif op in _PARAM_OPS and depth < 16:
            ins = self.inputs(n)
            result = bool(ins) and all(self.is_param(src, depth + 1) for src, _ in ins)
        else:
            result = False
        self._param[n] = result
        return result

    def through_identity(self, n: str) -> set[str]:
        """``n`` and the StopGradient/Identity nodes that merely forward it."""
        out = {n}
        todo = [n]
        while todo:
            x = todo.pop()
            for c in self.consumers(x):
                if self.ops[c] in ("StopGradient", "Identity") and c not in out:
                    out.add(c)
                    todo.append(c)
        return out


def find_normalizations(
    g: nx.MultiDiGraph, data_inputs: Mapping[str, list[tuple[str, int]]] | None = None,
    min_count: int = MIN_STATISTIC_COUNT,
) -> NormalizationInfo:
    """Find moment-based normalizations in ``g`` (see the module docstring).  Pure.

    ``data_inputs`` may give every node's data inputs already computed (the decision stage
    has them); missing ones are read from ``g``.  Static shapes come from
    ``g.graph["shapes"]``; a normalization whose statistics are known to reduce fewer than
    ``min_count`` values is left out.
    """
    shapes: Mapping[str, tuple[Shape, ...]] = g.graph.get("shapes") or {}
    reader = _Reader(g, data_inputs)
    norms, small, moments = _find_moments(reader, shapes, min_count)
    if not norms:
        return NormalizationInfo(moments=frozenset(moments), small=tuple(small))
    stats, owner = _grow_statistics(reader, norms)
    apply = _apply_ops(reader, stats, owner)
    _add_mean_gradients(reader, apply)
    return NormalizationInfo(tuple(norms), apply, frozenset(stats), frozenset(moments), tuple(small))


def _find_moments(
    reader: _Reader, shapes: Mapping[str, tuple[Shape, ...]], min_count: int
) -> tuple[list[Normalization], list[tuple[Normalization, int]], set[str]]:
    """Every ``Mean`` with a matching variance ``Mean``, in name order: ``(norms, small,
    moments)`` -- the normalizations kept, those left out for reducing fewer than
    ``min_count`` values (with the count), and the ``Mean`` nodes of both.  Pure."""
    ops = reader.ops
    norms: list[Normalization] = []
    small: list[tuple[Normalization, int]] = []
    moments: set[str] = set()
    for m1 in sorted(n for n, op in ops.items() if op == "Mean"):
        ins = reader.inputs(m1)
        if not ins:
            continue
        x = ins[0]
        variance = _variance_of(reader, m1, x)
        if variance is not None:
            moments.update((m1, variance))
            count = _statistic_count(shapes, x, m1)
            if count is not None and count < min_count:
                log.debug("normalization %s/%s left float32: its statistics reduce %d values (fewer than %d)",
                          m1, variance, count, min_count)
                small.append((Normalization(x[0], m1, variance), count))
                continue
            norms.append(Normalization(x[0], m1, variance))
    return norms, small, moments


def _variance_of(reader: _Reader, m1: str, x: tuple[str, int]) -> str | None:
    """The ``Mean`` of the squared difference of ``x`` and the mean ``m1`` (through
    ``SquaredDifference``, or ``Sub`` then ``Square`` or a self-``Mul``), or None.  Pure."""
    ops, inputs, consumers = reader.ops, reader.inputs, reader.consumers
    mean_like = reader.through_identity(m1)
    variance = None
    for c in consumers(m1) + sorted(set().union(*(consumers(k) for k in mean_like))):
        c_ins = inputs(c)
        if len(c_ins) != 2 or x not in c_ins:
            continue
        other = c_ins[1] if c_ins[0] == x else c_ins[0]
        if other[0] not in mean_like:
            continue
        squared: list[str] = []
        if ops[c] == "SquaredDifference":
            squared = [c]
        elif ops[c] == "Sub":
            squared = [s for s in consumers(c) if ops[s] == "Square"
                       or (ops[s] == "Mul" and inputs(s) == [(c, 0), (c, 0)])]
        for sq in squared:
            var = next((v for v in consumers(sq) if ops[v] == "Mean"), None)
            if var is not None:
                variance = var
                break
        if variance:
            break
    return variance


def _grow_statistics(reader: _Reader, norms: list[Normalization]) -> tuple[set[str], dict[str, Normalization]]:
    """The statistic nodes of ``norms`` and, for each, the normalization it belongs to (the
    first in ``norms`` that reaches it).  Pure."""
    ops, consumers = reader.ops, reader.consumers
    stats: set[str] = set()
    owner: dict[str, Normalization] = {}
    for norm in norms:
        for seed in reader.through_identity(norm.mean) | reader.through_identity(norm.variance):
            stats.add(seed)
            owner.setdefault(seed, norm)
    # Grow the statistics: ops whose inputs are all statistics or parameters.  A fixed point,
    # because an op can read two statistics discovered in either order.
    frontier = sorted(stats)
    while frontier:
        new: list[str] = []
        for s in frontier:
            for c in consumers(s):
                if c in stats or ops[c] not in _STAT_OPS:
                    continue
                c_ins = reader.inputs(c)
                if all(src in stats or reader.is_param(src) for src, _ in c_ins):
                    stats.add(c)
                    owner.setdefault(c, owner[s])
                    new.append(c)
        frontier = sorted(new)
    return stats, owner


def _apply_ops(
    reader: _Reader, stats: set[str], owner: Mapping[str, Normalization]
) -> dict[str, tuple[frozenset[int], Normalization]]:
    """The apply ops: element-wise consumers of statistics with exactly one full-size data
    input, each with its statistic input ports and normalization.  Pure."""
    apply: dict[str, tuple[frozenset[int], Normalization]] = {}
    for s in sorted(stats):
        for c in reader.consumers(s):
            if c in stats or c in apply or reader.ops[c] not in _APPLY_OPS:
                continue
            c_ins = reader.inputs(c)
            stat_ports = frozenset(p for p, (src, _) in enumerate(c_ins) if src in stats)
            data_ports = [p for p, (src, _) in enumerate(c_ins) if src not in stats and not reader.is_param(src)]
            if len(data_ports) == 1 and stat_ports:
                apply[c] = (stat_ports, owner[s])
    return apply


def _add_mean_gradients(reader: _Reader, apply: dict[str, tuple[frozenset[int], Normalization]]) -> None:
    """Add to ``apply`` (in place) the gradient sums that join an apply op's gradient with
    the mean's gradient, with the ports that carry the latter."""
    ops, inputs = reader.ops, reader.inputs
    # In the gradient, dx sums the apply ops' gradients (dy * scale) with the gradient of
    # the mean: the per-channel gradient sum broadcast back (Tile/BroadcastTo) and divided by
    # the element count -- an average of gradients, bounded like the gradients themselves.
    # The division runs in float32 (it is downstream of a deny-listed Sum); only its
    # *result* may join the low-precision sum.
    for a in sorted(apply):
        for c in reader.consumers(a):
            if ops[c] not in ("AddN", "Add", "AddV2") or c in apply:
                continue
            ports = frozenset(
                q for q, (src, _) in enumerate(inputs(c))
                if src not in apply and _is_mean_gradient(src, ops, inputs, reader.is_param)
            )
            if ports:
                apply[c] = (ports, apply[a][1])


def _is_mean_gradient(name: str, ops: Mapping[str, str], inputs, is_param) -> bool:
    """``RealDiv(Tile|BroadcastTo(...), count)``: the gradient TensorFlow emits for ``Mean``."""
    if ops[name] not in ("RealDiv", "Div"):
        return False
    ins = inputs(name)
    if len(ins) != 2 or not is_param(ins[1][0]) and ops[ins[1][0]] not in ("Cast", "Prod", "Maximum"):
        return False
    return ops[ins[0][0]] in ("Tile", "BroadcastTo")


def upstream_of_fragile(g: nx.MultiDiGraph, info: NormalizationInfo) -> dict[str, tuple[Normalization, int]]:
    """Every node whose value feeds a fragile normalization (:attr:`NormalizationInfo.fragile`:
    statistics over 2 to :data:`MAX_FRAGILE_COUNT` values): the normalized tensor's producer
    and all its data ancestors, each mapped to the first fragile normalization (in
    ``info.fragile``'s order) that it feeds, with its count.  Control edges carry no value and
    are not followed.  Pure.

    Why these matter: ``(x - mean) / std`` over ``n`` values has sensitivity ``1 / std`` to
    ``x``, unbounded when the ``n`` values lie close together.  Over two values it outputs the
    sign of their difference, +-1, so any rounding upstream can flip it and the step's loss
    with it.  For a rounding ``e`` relative to the values' spread, the chance that a channel's
    output jumps is about ``e ** (n - 1)``: linear in ``e`` for two values, quadratic for three
    (with bfloat16's ``e`` of a few 1e-3, a step that normalizes 20,000 channels still
    expects a jump every step or two), and negligible from four on.  One value normalizes to the offset, whatever the
    rounding.  The InceptionV3 training step at batch 2 and 75x75 (1x1 maps in its last
    blocks) had 2.2 times the loss error of TensorFlow's float16 rewrite (0.133 against 0.060,
    median of 16 batches) from two float16 convolutions in its stem alone.
    """
    owner: dict[str, tuple[Normalization, int]] = {}
    for norm, count in info.fragile:
        if norm.source in owner or norm.source not in g:
            continue
        owner[norm.source] = (norm, count)
        stack = [norm.source]
        while stack:
            x = stack.pop()
            for src, _, d in g.in_edges(x, data=True):
                if d["src_port"] >= 0 and src not in owner:
                    owner[src] = (norm, count)
                    stack.append(src)
    return owner
