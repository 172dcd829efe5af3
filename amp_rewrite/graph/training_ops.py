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
from typing import Any, Iterable, Iterator, Mapping

__all__ = ["LOSS_SCALE_SCOPE", "WRITE_OPS", "float16_training_unscaled", "loss_scale_scope_nodes",
           "updates_from_gradients", "scales_loss"]

#: The name scope of the ops that apply a loss scale to a loss or a gradient (amp_rewrite's
#: loss-scaled optimizers build them under it: ``amp_rewrite.training.loss_scale``).  Every
#: rewrite keeps them float32 (:func:`loss_scale_scope_nodes`): the scale starts at 2**15 and
#: doubles while steps stay finite, and float16's largest value is 65504.  A division by it
#: converted with the float16 gradient it divides (an infer-list op fed by one) made every
#: gradient 0 from 2**16 on, the finite check passed, and no weight moved again.
LOSS_SCALE_SCOPE = "amp_rewrite_loss_scale"
_SCOPED = re.compile(rf"(^|/){LOSS_SCALE_SCOPE}(_\d+)?/")

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


def loss_scale_scope_nodes(graph_def: Any) -> set[str]:
    """Names of the nodes under :data:`LOSS_SCALE_SCOPE` in ``graph_def``'s main graph and its
    library's functions (a ``tf.cond`` branch holds the update of a loss-scaled Keras step).
    Pure."""
    return {n.name for n in _nodes(graph_def) if _SCOPED.search(n.name)}


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


def scales_loss(graph_def: Any, variable_names: Iterable[str] = ()) -> bool:
    """Whether anything in ``graph_def`` looks like loss scaling: a node, or a variable's
    shared name, that names a loss scale; or one of ``variable_names``, the variables a traced
    function captured (a ``tf.function`` reads Keras's ``LossScaleOptimizer``'s
    ``dynamic_scale`` through a placeholder named for nothing).  Pure."""
    if any(_LOSS_SCALE.search(name) for name in variable_names):
        return True
    for node in _nodes(graph_def):
        if _LOSS_SCALE.search(node.name):
            return True
        shared = node.attr["shared_name"].s if "shared_name" in node.attr else b""
        if _LOSS_SCALE.search(shared.decode("utf-8", "replace")):
            return True
    return False


def float16_training_unscaled(report: Mapping[str, Any], graph_def: Any, variable_names: Iterable[str] = ()) -> bool:
    """Whether ``graph_def`` trains (:func:`updates_from_gradients`) in float16 -- its rewrite's
    ``report`` converted something to it -- with nothing that scales the loss
    (:func:`scales_loss`).  Pure."""
    return (report.get("precision") == "float16" and bool(report.get("converted_nodes"))
            and updates_from_gradients(graph_def) and not scales_loss(graph_def, variable_names))
