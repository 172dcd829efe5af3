"""What Grappler removes from a graph before it runs, so that the cost model prices none of it:
element-wise ops folded into a frozen dense op (constant folding pushes an inference batch
norm's scale and shift into the weights and a bias, and the remapper fuses the bias and the
activation after it), and a swish fused into one kernel.

The planner (:mod:`.optimal`) and the whole-step estimate (:mod:`.step_cost`) both read these,
so that without XLA the step estimate, which checks the planner's plans, prices the graph the
planner priced (under XLA the estimate prices XLA's own fusion instead).  Pure functions of a
graph's ops and data inputs; they change nothing.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import networkx as nx

__all__ = ["FOLDABLE_AFFINE", "FORWARD_DENSE", "FUSABLE_ACTIVATIONS", "FUSED_SWISH", "is_folded", "swish_parts"]

Inputs = Mapping[str, Sequence[tuple[str, int]]]

#: Element-wise ops with one constant operand that Grappler folds into the frozen convolution
#: or MatMul before them (constant folding pushes the scale and shift of an inference batch
#: norm into the weights and a bias; the remapper fuses the bias), and the activations the
#: remapper fuses after such a bias.
FOLDABLE_AFFINE = frozenset({"Add", "AddV2", "Sub", "Mul", "BiasAdd", "RealDiv"})
FUSABLE_ACTIVATIONS = frozenset({"Relu", "Relu6", "Elu", "LeakyRelu"})
FORWARD_DENSE = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative", "MatMul", "_FusedConv2D",
                           "_FusedMatMul"})


def is_folded(g: nx.MultiDiGraph, ops: Mapping[str, str], inputs: Inputs, name: str, consts: frozenset[str],
              memo: dict[str, bool]) -> bool:
    """Whether element-wise ``name`` of ``g`` disappears when the graph is loaded, folded or
    fused into the dense op with constant weights (``consts``: the constant nodes) before it,
    through other such ops, each the only consumer of its input.  ``ops`` and ``inputs`` are
    ``g``'s ops and data inputs by node.  Such a node costs nothing at run time in either
    precision: pricing it as a kernel, as the model prices other element-wise ops, charged
    every batch norm of a frozen model as if it ran and kept its convolutions float32.

    Mutates only ``memo``, the cache of answers (node name -> folded), which it fills for
    every node it walks through.  Iterative: the walk follows a chain of single-input ops
    upstream, and a chain of 100,000 Relus is a valid graph, so recursing once per node
    would overflow Python's stack.  A node met again on the walk (a cycle, which only a
    malformed loop could make) counts as not folded.
    """
    path: list[str] = []
    x = name
    while True:
        got = memo.get(x)
        if got is not None:
            # Answered before, or on the current walk (a cycle): seeded False below.
            answer = got
            break
        # Seed False before following the input, so that a cycle ends the walk unfolded.
        memo[x] = False
        path.append(x)
        op, ins = ops[x], inputs[x]
        src = None
        if op in FOLDABLE_AFFINE and len(ins) == 2:
            variable = [i for i in ins if i[0] not in consts]
            src = variable[0][0] if len(variable) == 1 else None
        elif op in FUSABLE_ACTIVATIONS and len(ins) == 1:
            src = ins[0][0]
        if src is None or sum(1 for _ in g.successors(src)) != 1:
            answer = False
            break
        src_ins = inputs[src]
        if ops[src] in FORWARD_DENSE and len(src_ins) > 1 and src_ins[1][0] in consts:
            answer = True
            break
        # Otherwise ``x`` is folded exactly when its single-consumer input ``src`` is.
        x = src
    # Every node on the path is folded exactly when the last one is.
    for y in path:
        memo[y] = answer
    return answer


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
