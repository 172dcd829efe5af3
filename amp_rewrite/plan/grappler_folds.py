"""What Grappler removes from a graph before it runs, so that the cost model prices none of it:
element-wise ops folded into a frozen dense op (constant folding pushes an inference batch
norm's scale into a convolution's weights, and the remapper fuses the adds after it as a bias
and the activation behind that bias; which chains fold was measured: the table above
:data:`FOLDABLE_SCALES`),
and a swish fused into one kernel.

The planner (:mod:`.optimal`) and the whole-step estimate (:mod:`.step_cost`) both read these,
so that without XLA the step estimate, which checks the planner's plans, prices the graph the
planner priced (under XLA the estimate prices XLA's own fusion instead).  Pure functions of a
graph's ops and data inputs; they change nothing.
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple, Sequence

import networkx as nx

from ..graph import dtypes as dt

__all__ = ["FOLDABLE_AFFINE", "FOLDABLE_BIASES", "FOLDABLE_SCALES", "FORWARD_DENSE", "FUSABLE_ACTIVATIONS",
           "FUSED_SWISH", "FoldMemo", "SCALABLE_DENSE", "float32_fusion", "is_folded", "swish_parts"]

Inputs = Mapping[str, Sequence[tuple[str, int]]]

#: How Grappler (TensorFlow 2.21, oneDNN on a CPU) folds the element-wise ops after a dense op
#: with constant weights, measured with step stats on small graphs in float32 and bfloat16
#: alike (each row: what ran as a kernel besides the convolution):
#:
#: * ``conv * s + b -> Relu6`` (a frozen batch norm, MobileNetV2's): nothing.  Constant folding
#:   pushes a Mul by a constant directly on a convolution into its weights; the remapper fuses
#:   the adds of constants after it as the bias, and an activation after that bias;
#: * ``conv + b1 + b2 -> Relu``: nothing (adds of constants fold into one bias);
#: * ``BiasAdd(conv, b) * s + t -> Relu`` (a convolution with a bias before its batch norm,
#:   ResNet50's): Mul, AddV2, Relu.  A Mul after the bias is not pushed into the weights, and
#:   nothing after it fuses;
#: * ``(conv - m) * s + b -> Relu``: Sub, Mul, AddV2, Relu (a Sub is not taken as a bias);
#: * ``conv -> Relu`` and ``conv * s -> Relu``: Relu.  An activation fuses only behind a bias,
#:   so a zero bias, which Grappler drops (Keras initializes biases to zero), leaves it a kernel;
#: * ``depthwise * s + b -> Relu6`` (MobileNetV2's): Mul, AddV2, Relu6.  A scale is not pushed
#:   into a depthwise convolution, and nothing after it fuses; ``depthwise + b -> Relu6``
#:   fuses (``_FusedDepthwiseConv2dNative``);
#: * ``conv + c`` with ``c`` a scalar or a whole feature map, ``conv * map``, and ``c / conv``:
#:   every op runs.  A bias must hold one value per channel (``[C]`` or ``[1, 1, 1, C]``), a
#:   scale that or a scalar (``conv * 0.5 + b -> Relu`` folds), and only ``x / c`` becomes a
#:   scale.
#:
#: A MatMul's bias and activation fuse as a convolution's (``_FusedMatMul``), but a Mul is
#: pushed only into a Conv2D's or Conv3D's weights.  (Checked against Grappler by
#: ``tests/test_grappler_folds.py`` and ``bench/fold_probe.py``.)
#:
#: On a GPU (TensorFlow 2.21 on an H200, ``bench/gpu_runs/2026-11-28b-h200/fold_probe.txt``,
#: the same graphs) constant folding does the same: a scale directly on a convolution goes into
#: its weights, and adds of constants after it become one.  But that one add runs, and so does
#: every activation: the remapper fuses neither an add into a convolution nor anything into a
#: MatMul there.  TensorFlow's sources (``remapper.cc``) name its one GPU fusion of a frozen
#: dense op: a ``BiasAdd`` (not an ``Add``) directly on a float32 ``Conv2D`` that is not 1x1,
#: followed by a ``Relu``, into cuDNN's fused convolution (a MatMul's only with cuBLASLt, which
#: is off by default).  Its versions test different filter dimensions for "not 1x1" (height
#: and width, or width and input channels): the rules take a filter whose first three
#: dimensions are all known and above 1, which every version fuses.  A float16 or bfloat16
#: convolution fuses nothing, so converting one brings its bias and Relu back as kernels
#: (:func:`float32_fusion` says which nodes those are).  A device class says which rules hold
#: (:attr:`~amp_rewrite.plan.cost_model.DeviceCosts.fuses_bias_activation`).
#: Ops by a constant that scale (folded into a convolution's weights when directly on it;
#: Grappler turns a division by a constant into a Mul).
FOLDABLE_SCALES = frozenset({"Mul", "RealDiv"})
#: Ops by a constant that become the fused bias.
FOLDABLE_BIASES = frozenset({"Add", "AddV2", "BiasAdd"})
#: Either: what may stand between a dense op and its fused activation.
FOLDABLE_AFFINE = FOLDABLE_SCALES | FOLDABLE_BIASES
#: Activations the remapper fuses behind a bias.
FUSABLE_ACTIVATIONS = frozenset({"Relu", "Relu6", "Elu", "LeakyRelu"})
#: Convolutions whose weights a Mul by a constant is pushed into.
SCALABLE_DENSE = frozenset({"Conv2D", "Conv3D"})
#: Dense ops the remapper fuses a bias and an activation into.
FORWARD_DENSE = SCALABLE_DENSE | frozenset({"MatMul", "DepthwiseConv2dNative"})

# The states of a chain from a dense op outwards (:func:`_step`).  Folded: scales in the
# weights, biases and an activation fused (oneDNN), a bias merged into an earlier one (a GPU).
# Not folded: a bias that runs as the chain's one add (a GPU), and a BiasAdd that cuDNN fuses
# only when a Relu follows it (:func:`is_folded` looks ahead).
_SCALING, _BIASED, _ACTIVATED, _UNFOLDED, _BIAS_RUNS, _BIAS_MERGED, _BIAS_CUDNN = range(7)
_FOLDED = frozenset({_SCALING, _BIASED, _ACTIVATED, _BIAS_MERGED})


class _Dense(NamedTuple):
    """What a chain's dense op (``name``) allows: a scale pushed into its weights
    (``scalable``), the remapper's CPU fusions (``onednn``), or on a GPU cuDNN's ``BiasAdd`` +
    ``Relu`` fusion (``cudnn_conv``: a float32 Conv2D whose filter passes the remapper's shape
    test)."""

    scalable: bool
    onednn: bool
    cudnn_conv: bool
    name: str = ""


_NO_DENSE = _Dense(False, True, False)
#: ``is_folded``'s cache: node -> the state of the chain ending there, and its dense op's rules.
FoldMemo = dict[str, tuple[int, _Dense]]


def _step(state: int, op: str, dense: _Dense) -> int:
    """The state after element-wise ``op`` in a chain that was in ``state`` (see the table
    above).  With oneDNN: scales only directly on a scalable convolution, biases until an
    activation, one activation behind a bias.  On a GPU: the same scales; the first bias runs
    (a cuDNN-fusable ``BiasAdd`` waits for its Relu) and later biases merge into it."""
    if op in FOLDABLE_SCALES and state == _SCALING and dense.scalable:
        return _SCALING
    if dense.onednn:
        if op in FOLDABLE_BIASES and state in (_SCALING, _BIASED):
            return _BIASED
        if op in FUSABLE_ACTIVATIONS and state == _BIASED:
            return _ACTIVATED
        return _UNFOLDED
    if op in FOLDABLE_BIASES and state == _SCALING:
        return _BIAS_CUDNN if op == "BiasAdd" and dense.cudnn_conv else _BIAS_RUNS
    if op in FOLDABLE_BIASES and state in (_BIAS_RUNS, _BIAS_MERGED, _BIAS_CUDNN):
        return _BIAS_MERGED
    if op == "Relu" and state == _BIAS_CUDNN:
        return _ACTIVATED
    return _UNFOLDED


def is_folded(g: nx.MultiDiGraph, ops: Mapping[str, str], inputs: Inputs, name: str, consts: frozenset[str],
              memo: FoldMemo, onednn: Callable[[str], bool] = lambda _dense: True) -> bool:
    """Whether element-wise ``name`` of ``g`` disappears when the graph is loaded, folded or
    fused into the dense op with constant weights (``consts``: the constant nodes) before it,
    through a chain of ops each the only consumer of its input, as the table above says
    Grappler does.  ``ops`` and ``inputs`` are ``g``'s ops and data inputs by node.  Such a
    node costs nothing at run time in either precision: pricing it as a kernel, as the model
    prices other element-wise ops, charged every batch norm of a frozen model as if it ran
    and kept its convolutions float32.  ``onednn(dense)``: whether the device of dense op
    ``dense`` fuses a bias and an activation as oneDNN does (a CPU), or only as a GPU does.

    Mutates only ``memo``, the callers' cache (node -> the state of the chain ending there,
    and its dense op's rules), which it fills for every node it walks through.
    Iterative: the walk follows a chain of single-input ops upstream, and a chain of 100,000
    Relus is a valid graph, so recursing once per node would overflow Python's stack; asked
    in topological order, each walk stops at the previous node's answer.  A node met again
    on the walk (a cycle, which only a malformed loop could make) counts as not folded.
    """
    if name not in memo:
        _fill_chain(g, ops, inputs, name, consts, memo, onednn)
    state = memo[name][0]
    if state == _BIAS_CUDNN:
        readers = list(g.successors(name))
        return len(readers) == 1 and ops.get(readers[0]) == "Relu" and len(inputs.get(readers[0], ())) == 1
    return state in _FOLDED


def float32_fusion(g: nx.MultiDiGraph, ops: Mapping[str, str], inputs: Inputs, name: str, consts: frozenset[str],
                   memo: FoldMemo, onednn: Callable[[str], bool] = lambda _dense: True) -> str | None:
    """The convolution whose float32 kernel fuses element-wise ``name`` (cuDNN's ``BiasAdd`` +
    ``Relu`` on a GPU), where that is why :func:`is_folded` says ``name`` is folded; else
    ``None``.  Converting that convolution brings ``name`` back as a kernel: a planner prices
    it with the convolution's low precision.  Arguments and mutation as :func:`is_folded`'s."""
    if not is_folded(g, ops, inputs, name, consts, memo, onednn):
        return None
    state, dense = memo[name]
    if dense.cudnn_conv and not dense.onednn and state in (_BIAS_CUDNN, _ACTIVATED):
        return dense.name
    return None


def _foldable_operand(g: nx.MultiDiGraph, op: str, tensor: tuple[str, int]) -> bool:
    """Whether constant ``tensor`` can be folded as ``op``'s operand: a bias must hold one value
    per channel (``[C]``, or ``[1, 1, 1, C]`` as Keras reshapes a batch norm's), a scale that
    or a scalar; a shape the graph does not know counts as foldable."""
    shapes = (g.graph.get("shapes") or {}).get(tensor[0])
    if not shapes or tensor[1] >= len(shapes) or shapes[tensor[1]] is None:
        return True
    shape = shapes[tensor[1]]
    if not shape:
        return op in FOLDABLE_SCALES
    return all(d == 1 for d in shape[:-1])


def _link(g: nx.MultiDiGraph, ops: Mapping[str, str], inputs: Inputs, name: str,
          consts: frozenset[str]) -> str | None:
    """The input ``name`` folds onto: its one non-constant input, when ``name`` is an op by a
    foldable constant (a division only by one) or an activation, and is that input's only
    consumer; else ``None``."""
    op, ins = ops[name], inputs[name]
    src = None
    if op in FOLDABLE_AFFINE and len(ins) == 2:
        variable = [i for i in ins if i[0] not in consts]
        constant = [i for i in ins if i[0] in consts]
        if (len(variable) == 1 and _foldable_operand(g, op, constant[0])
                and (op != "RealDiv" or ins[1] == constant[0])):
            src = variable[0][0]
    elif op in FUSABLE_ACTIVATIONS and len(ins) == 1:
        src = ins[0][0]
    if src is None or sum(1 for _ in g.successors(src)) != 1:
        return None
    return src


#: Ops through which a filter's shape is its input's (a Cast the rewrite inserted has none of
#: its own).
_SHAPE_PRESERVING = frozenset({"Cast", "Identity"})


def _cudnn_fusable_filter(g: nx.MultiDiGraph, ops: Mapping[str, str], inputs: Inputs,
                          tensor: tuple[str, int]) -> bool:
    """Whether a Conv2D's filter ``tensor`` passes every version of the remapper's test for
    cuDNN's fused convolution: rank 4 with its first three dimensions known and above 1 (the
    versions test two of them; a 1x1 filter never fuses).  Looks through Casts and Identities
    to a known shape.  Pure."""
    shapes_of = g.graph.get("shapes") or {}
    seen: set[str] = set()
    while True:
        shapes = shapes_of.get(tensor[0])
        shape = shapes[tensor[1]] if shapes and tensor[1] < len(shapes) else None
        if shape is not None or ops.get(tensor[0]) not in _SHAPE_PRESERVING or tensor[0] in seen:
            break
        seen.add(tensor[0])
        ins = inputs.get(tensor[0]) or ()
        if len(ins) != 1:
            break
        tensor = ins[0]
    return (shape is not None and len(shape) == 4
            and all(isinstance(d, int) and d > 1 for d in shape[:3]))


def _dense_rules(g: nx.MultiDiGraph, ops: Mapping[str, str], inputs: Inputs, dense: str,
                 onednn: Callable[[str], bool]) -> _Dense:
    """The folding rules of a chain starting at dense op ``dense`` (:class:`_Dense`): cuDNN
    fuses a float32 Conv2D only.  Pure."""
    op = ops[dense]
    float32 = (g._node[dense].get("dtypes") or {}).get("T", dt.FLOAT) == dt.FLOAT
    return _Dense(scalable=op in SCALABLE_DENSE, onednn=onednn(dense),
                  cudnn_conv=op == "Conv2D" and float32 and _cudnn_fusable_filter(g, ops, inputs, inputs[dense][1]),
                  name=dense)


def _fill_chain(g: nx.MultiDiGraph, ops: Mapping[str, str], inputs: Inputs, name: str, consts: frozenset[str],
                memo: FoldMemo, onednn: Callable[[str], bool]) -> None:
    """Sets ``memo`` for ``name`` and every node on its chain up to a dense op with constant
    weights or a node already answered (see :func:`is_folded`)."""
    chain: list[str] = []
    seen: set[str] = set()
    start: tuple[int, _Dense] = (_UNFOLDED, _NO_DENSE)
    x = name
    while x not in seen:
        seen.add(x)
        src = _link(g, ops, inputs, x, consts)
        if src is None:
            chain.append(x)
            break
        chain.append(x)
        src_ins = inputs[src]
        if ops[src] in FORWARD_DENSE and len(src_ins) > 1 and src_ins[1][0] in consts:
            start = (_SCALING, _dense_rules(g, ops, inputs, src, onednn))
            break
        if src in memo:
            start = memo[src]
            break
        x = src
    # Otherwise (no dense op, or a cycle through ``name``) ``start`` stays unfolded.
    state, dense = start
    for y in reversed(chain):
        state = _step(state, ops[y], dense) if state != _UNFOLDED else _UNFOLDED
        memo[y] = (state, dense)


#: The fused swish kernel's name in a device class's element-wise table
#: (:attr:`~amp_rewrite.plan.cost_model.DeviceCosts.elementwise`): a class that lists it (the
#: x86 bfloat16 classes, where it was measured) runs Grappler's swish fusion, which is
#: oneDNN's (``_MklSwish``): never a GPU.
FUSED_SWISH = "_Swish"


def swish_parts(g: nx.MultiDiGraph, ops: Mapping[str, str], inputs: Inputs, name: str,
                consts: frozenset[str]) -> tuple[str, ...]:
    """The Muls fused with Sigmoid ``name`` into one swish kernel, or ``()`` when it is not
    half of a swish.  A swish is ``x * sigmoid(x)`` or Keras 3's ``x * sigmoid(x * beta)``
    with a constant ``beta``: Grappler's remapper fuses it into one kernel (oneDNN's
    ``_MklSwish``, on CPUs only: see :data:`FUSED_SWISH`), which runs neither the slow
    element-wise bfloat16 Sigmoid nor the Muls the cost model would price.  Pure."""
    if len(inputs[name]) != 1:
        return ()
    arg = inputs[name][0]
    inner: dict[tuple[str, int], tuple[str, ...]] = {arg: ()}
    if ops.get(arg[0]) == "Mul" and len(inputs[arg[0]]) == 2:
        a, b = inputs[arg[0]]
        inner.update({x: (arg[0],) for x, c in ((a, b), (b, a)) if c[0] in consts})
    for consumer in sorted(g.successors(name)):
        ins = inputs.get(consumer, [])
        if ops.get(consumer) == "Mul" and len(ins) == 2 and (name, 0) in ins:
            other = ins[0] if ins[1] == (name, 0) else ins[1]
            if other in inner:
                return (consumer, *inner[other])
    return ()
