"""The draw loop of the graph strategies and the structure it draws besides single ops:
while loops (TF1 frames or TF2 functional loops), function calls and functional conditionals
(TF2's ``tf.cond``: an ``If``/``StatelessIf`` whose branches are functions), each with a body
drawn by a nested :class:`~.drawer._Drawer`, and the ``Identity`` output nodes of a finished
graph.
"""

from __future__ import annotations

from typing import Sequence

from .draw_ops import _OPS
from .drawer import _Drawer, _floats
from .program import Program, Step, Val


# -- the draw loop
def _draw_steps(d: _Drawer, least: int, most: int) -> None:
    """Draw between ``least`` and ``most`` ops into ``d`` (mutating it).  Each op past ``least``
    is preceded by a "go on?" draw, so the shrinker can delete any one op's draws as a block."""
    weights = d.opts.weights
    for i in range(most):
        if i >= least and d.integer(0, 99) < 15:
            return
        feasible = [(op, w) for op, w in weights.items() if w > 0 and _OPS[op][0](d)]
        if not d.body:
            if d.opts.while_loops and _while_candidates(d):
                feasible.append(("While", 2))
            if d.opts.functions and _call_candidates(d):
                feasible.append(("Call", 2))
        if not feasible:
            return
        r = d.integer(0, sum(w for _, w in feasible) - 1)
        for op, w in feasible:
            if r < w:
                break
            r -= w
        if op == "While":
            _while_emit(d)
        elif op == "Call":
            _call_emit(d)
        else:
            _OPS[op][1](d, op)


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
    sub = _Drawer(d.draw, d.opts, args=[arg], captured=list(reversed(captured)), body=True,
                  first=d.count)
    _draw_steps(sub, 0, d.opts.body_nodes)
    same = [x for x in reversed(sub.made) if x.shape == v.shape and x.dtype == v.dtype]
    r = d.pick(same + [arg])
    (bounded,) = sub.emit("Tanh", [r], {}, [(v.dtype, v.shape, (-1.0, 1.0), r.smooth)])
    d.count = sub.count  # names stay unique across the program and its loop bodies
    body = Program(_prune(sub.steps, [bounded.ref]), (arg,), (bounded.ref,))
    # TF2's loops are functional (``tf.function`` builds a StatelessWhile whose cond and body
    # are functions, each rewritten on its own); TF1's are Enter/Merge/... frames in the graph.
    params = {"iterations": iterations, "functional": True} if d.chance(50) else {"iterations": iterations}
    d.emit("While", [v], params,
           [(v.dtype, v.shape, (min(v.lo, -1.0), max(v.hi, 1.0)), v.smooth and bounded.smooth)],
           body=body)


def _call_candidates(d: _Drawer) -> list[Val]:
    return _floats(d)


def _call_emit(d: _Drawer) -> None:
    first = d.pick(_call_candidates(d))
    ins = [first] + ([d.pick(_call_candidates(d))] if d.chance(40) else [])
    args = [Val(f"a{i}", v.dtype, v.shape, v.lo, v.hi, v.smooth) for i, v in enumerate(ins)]
    sub = _Drawer(d.draw, d.opts, args=args, body=True)
    _draw_steps(sub, 1, d.opts.body_nodes)
    results_pool = [x for x in reversed(sub.made) if x.is_float] or args
    results = [d.pick(results_pool)]
    if d.chance(30):
        results.append(d.pick(results_pool))
    body = Program(_prune(sub.steps, [r.ref for r in results]), tuple(args), tuple(r.ref for r in results))
    # A third of the calls are conditionals (TF2's ``tf.cond``): an If whose two branches,
    # functions rewritten on their own, both run the body (the predicate, a constant, picks
    # one); its type attributes must stay its branches' signatures, as a loop's do (KD-6).
    op, params = ("Cond", {"then": d.chance(50)}) if d.chance(33) else ("Call", {})
    d.emit(op, ins, params, [(r.dtype, r.shape, (r.lo, r.hi), r.smooth) for r in results], body=body)


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
