"""Make a training step's variable updates wait until everything they read is computed.

A traced training step updates each variable as soon as that variable's gradient is ready:
the last layer's update can run while an earlier layer's gradient is still being computed.
When such a step fails part way (out of device memory, the usual way a float32 step fails
on a batch sized for mixed precision), some variables are already updated and others are not,
and running the batch again with another step (``measure_steps``, :mod:`.step_choice`) would
update those twice.

:func:`updates_after_inputs` adds one ``NoOp`` (:data:`BARRIER`) that waits for every value the
step's writes read from outside the update itself (the gradients, the learning rate, the
variables' reads before the update), and makes every write wait for it.  A step then runs its
whole forward and backward pass before any variable changes, which is also the order a
loss-scaled step has (its update waits for the check that every gradient is finite), so
the two time alike.  The memory peak of a step is its backward pass: a step that runs out of
memory there has updated nothing.  (An allocation that fails in the update itself, after the
barrier, still leaves a part done.)  Costs: every gradient stays alive until the last one is
computed (the model's size in gradients, as for a loss-scaled step), and updates no longer
overlap the backward pass.
"""

from __future__ import annotations

from typing import Any

from ..graph.io import called_functions
from ..graph.tensor_names import node_name
from ..graph.training_ops import WRITE_OPS

__all__ = ["BARRIER", "WRITE_OPS", "updates_after_inputs"]

#: The barrier's node name.
BARRIER = "amp_rewrite_updates_after_inputs"


def _downstream(graph_def: Any, roots: set[str]) -> set[str]:
    """``roots`` and every node of ``graph_def``'s main graph reached from them by data or
    control edges.  Pure."""
    consumers: dict[str, list[str]] = {}
    for node in graph_def.node:
        for text in node.input:
            consumers.setdefault(node_name(text), []).append(node.name)
    seen, stack = set(roots), list(roots)
    while stack:
        for consumer in consumers.get(stack.pop(), ()):
            if consumer not in seen:
                seen.add(consumer)
                stack.append(consumer)
    return seen


def _writing_functions(graph_def: Any) -> set[str]:
    """The functions of ``graph_def``'s library that write a variable, themselves or through a
    function they call.  Pure."""
    library = {f.signature.name: f for f in graph_def.library.function}
    calls = {name: called_functions(f.node_def, set(library)) for name, f in library.items()}
    writing = {name for name, f in library.items() if any(WRITE_OPS.match(n.op) for n in f.node_def)}
    grew = True
    while grew:
        more = {name for name, called in calls.items() if name not in writing and called & writing}
        writing |= more
        grew = bool(more)
    return writing


def updates_after_inputs(graph_def: Any) -> tuple[Any, int]:
    """A copy of ``graph_def`` whose variable writes wait for :data:`BARRIER`, which waits for
    every node outside the writes and what follows them that feeds them, placeholders aside
    (module docstring); and how many writes it gates.  A write is a main-graph op of
    :data:`WRITE_OPS`, or a call of a function that writes (a ``tf.cond`` around the update, as
    Keras's gradient accumulation builds it): TensorFlow runs a lowered branch's ops as their
    own inputs allow, and an inlined call's too, but passes the call's control inputs on to
    them.  ``graph_def`` is unchanged; one without writes, or already gated, comes back as it
    is (a copy).

    No cycle is possible: the barrier waits only for nodes that no write reaches, and only
    writes (and so what follows them) wait for it."""
    out = type(graph_def)()
    out.CopyFrom(graph_def)
    writing = _writing_functions(out)
    writes = {node.name for node in out.node if WRITE_OPS.match(node.op) or called_functions([node], writing)}
    if not writes or any(node.name == BARRIER for node in out.node):
        return out, 0
    after = _downstream(out, writes)
    ops = {node.name: node.op for node in out.node}
    # A placeholder holds at the start of the step: nothing to wait for (and the runner
    # replaces the step's placeholders by its arguments, so an edge to one would dangle).
    feeds = sorted({node_name(text) for node in out.node if node.name in after for text in node.input}
                   - after - {name for name, op in ops.items() if op == "Placeholder"})
    barrier = out.node.add(name=BARRIER, op="NoOp")
    barrier.input.extend(f"^{name}" for name in feeds)
    for node in out.node:
        if node.name in writes:
            node.input.append(f"^{BARRIER}")
    return out, len(writes)
