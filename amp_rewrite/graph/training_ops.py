"""What a graph says about training: whether it updates variables from gradients, and whether
anything in it scales the loss.

A float16 training step without loss scaling loses the gradients smaller than float16's
smallest value (6e-8) to zero, which is what loss scaling exists for (user_issues.md, Theme
3: TensorFlow's rewrite let such graphs train silently).  The training paths and the offline
rewrite of a ``.meta`` ask these questions of the graph they rewrite, to say so with a WARNING.
Reads graphs only; knows nothing of who built them but the names they leave.
"""

from __future__ import annotations

import re
from typing import Any, Iterator

__all__ = ["WRITE_OPS", "updates_from_gradients", "scales_loss"]

#: Ops that write a variable's value (resource and reference variables, whole or sparse).
WRITE_OPS = re.compile(
    r"^(Assign|AssignAdd|AssignSub|AssignVariableOp|AssignAddVariableOp|AssignSubVariableOp|"
    r"(Resource)?(Sparse)?Apply[A-Z][A-Za-z]*|(Resource)?Scatter[A-Za-z]*|(Resource)?StridedSliceAssign)$"
)
#: A name component of the gradient ops TensorFlow builds: ``tf.gradients`` (``gradients``,
#: ``gradients_1``) and ``tf.GradientTape`` (``gradient_tape``).
_GRADIENT_SCOPE = re.compile(r"(^|/)(gradients(_\d+)?|gradient_tape)/")
#: Names that a loss-scaling optimizer leaves: amp_rewrite's (``amp_rewrite_loss_scale`` ops,
#: ``amp_loss_scale/`` variables), Keras's ``LossScaleOptimizer`` (``dynamic_scale``) and
#: TensorFlow's TF1 one (``loss_scale``).
_LOSS_SCALE = re.compile(r"loss_scale|dynamic_scale", re.IGNORECASE)


def _nodes(graph_def: Any) -> Iterator[Any]:
    yield from graph_def.node
    for function in graph_def.library.function:
        yield from function.node_def


def updates_from_gradients(graph_def: Any) -> bool:
    """Whether ``graph_def`` (its main graph or a function) writes variables and computes
    gradients: a training step.  Pure."""
    writes = gradients = False
    for node in _nodes(graph_def):
        writes = writes or bool(WRITE_OPS.match(node.op))
        gradients = gradients or bool(_GRADIENT_SCOPE.search(node.name))
        if writes and gradients:
            return True
    return False


def scales_loss(graph_def: Any) -> bool:
    """Whether anything in ``graph_def`` looks like loss scaling: a node, or a variable's
    shared name, that names a loss scale.  Pure."""
    for node in _nodes(graph_def):
        if _LOSS_SCALE.search(node.name):
            return True
        shared = node.attr["shared_name"].s if "shared_name" in node.attr else b""
        if _LOSS_SCALE.search(shared.decode("utf-8", "replace")):
            return True
    return False
