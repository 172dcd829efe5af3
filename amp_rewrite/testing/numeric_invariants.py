"""The numeric invariants: *numerics* (the rewritten graph's float outputs stay within a
tolerance of the float32 graph's) and *parity* (the same conversions as TensorFlow's own
pass, with no more casts).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .facts import (
    DT_FLOAT,
    Scope,
    library_of,
    low_dtype,
    output_dtypes,
    parse_input,
    scopes,
    tensor_dtype,
    type_values,
    converted_type_attrs,
)
from .invariant_support import InvariantError, _graph_def

#: Error allowed per level of low-precision ops, relative to the magnitude of the values
#: involved: a few roundings (unit roundoff 2**-11 for float16, 2**-8 for bfloat16) per op.
NUMERIC_TOLERANCE = {"float16": 4 * 2.0 ** -11, "bfloat16": 4 * 2.0 ** -8}


# ----------------------------------------------------------------------------- numerics


#: Loop iterations the numerics tolerance counts (the strategies draw loops of 1 to 3).
LOOP_ITERATIONS_COUNTED = 3


def _low_depth(before: Any, after: Any, low: int) -> dict[str, int]:
    """Per main-graph node of ``after``: the most low-precision ops on a path into it, a
    loop's body counted :data:`LOOP_ITERATIONS_COUNTED` times (a TF1 frame's through its
    back edges, a functional loop's as its body function's depth)."""
    a_scopes = scopes(after)
    library = library_of(after)

    def weight(scope: Scope, node: Any, fdepth: Mapping[str, int]) -> int:
        if node.op in ("PartitionedCall", "StatefulPartitionedCall"):
            return fdepth.get(node.attr["f"].func.name, 0)
        if node.op in ("If", "StatelessIf"):  # whichever branch runs
            return max(fdepth.get(node.attr[b].func.name, 0) for b in ("then_branch", "else_branch"))
        own = 1 if low in type_values(node).values() else 0
        if node.op in ("While", "StatelessWhile"):
            return own + LOOP_ITERATIONS_COUNTED * fdepth.get(node.attr["body"].func.name, 0)
        return own

    def longest(scope: Scope, fdepth: Mapping[str, int], floor: Mapping[str, int]) -> dict[str, int]:
        depth: dict[str, int] = {}
        order = list(scope.nodes)
        pending = set(order)
        # Iterate to a fixed point over the DAG (loop back edges from NextIteration ignored;
        # ``floor`` carries what they bring from the iteration before).
        for _ in range(len(order) + 1):
            progress = False
            for name in order:
                if name not in pending:
                    continue
                node = scope.nodes[name]
                srcs = [parse_input(t)[0] for t in node.input]
                srcs = [s for s in srcs if s in scope.nodes and scope.nodes[s].op != "NextIteration"]
                if any(s in pending for s in srcs):
                    continue
                depth[name] = max(max([depth[s] for s in srcs], default=0) + weight(scope, node, fdepth),
                                  floor.get(name, 0))
                pending.discard(name)
                progress = True
            if not progress:
                break
        for name in pending:
            depth[name] = len(order)
        return depth

    def with_loops(scope: Scope, fdepth: Mapping[str, int]) -> dict[str, int]:
        """:func:`longest`, a TF1 frame's Merge raised each pass to what its NextIteration
        brings from the pass before."""
        back: dict[str, list[str]] = {}
        for name, node in scope.nodes.items():
            if node.op in ("Merge", "RefMerge"):
                srcs = [src for src in (parse_input(t)[0] for t in node.input)
                        if src in scope.nodes and scope.nodes[src].op == "NextIteration"]
                if srcs:
                    back[name] = srcs
        depth = longest(scope, fdepth, {})
        for _ in range(LOOP_ITERATIONS_COUNTED - 1 if back else 0):
            depth = longest(scope, fdepth, {m: max(depth[n] for n in srcs) for m, srcs in back.items()})
        return depth

    fdepth: dict[str, int] = {}
    for fname, scope in a_scopes.items():
        if fname:
            fdepth[fname] = max(longest(scope, {}, {}).values(), default=0)
    del library
    return with_loops(a_scopes[""], fdepth)


def check_numerics(before: Any, after: Any, report: Any = None, *,
                   feeds: Mapping[str, np.ndarray] | None = None, outputs: Sequence[str] | None = None,
                   precision: str = "float16", rtol: float | None = None) -> None:
    """**numerics**: every float output of the rewritten graph is within a tolerance of the
    float32 graph's, and finite wherever the float32 output is finite.

    The tolerance is ``rtol`` (default :data:`NUMERIC_TOLERANCE`) times one plus the number of
    low-precision ops on the longest path into the output, times the largest magnitude of the
    output and of the float32 values it is computed from (at least 1).
    """
    from .execute import graph_outputs, loop_frame_nodes, random_feeds, run_graph

    before, after = _graph_def(before), _graph_def(after)
    if feeds is None:
        feeds = random_feeds(before)
    if outputs is None:
        outputs = graph_outputs(before)
    library = library_of(before)
    main = scopes(before)[""]
    outputs = [o for o in outputs if tensor_dtype(main, o, library) == DT_FLOAT]
    if not outputs:
        return
    # Every float32 tensor of the main graph (outside loops), to know the magnitudes involved.
    frame = loop_frame_nodes(before)
    inner = []
    for node in before.node:
        if node.name in frame:
            continue
        for port, t in enumerate(output_dtypes(node, library)):
            if t == DT_FLOAT:
                inner.append(f"{node.name}:{port}")
    ref_all = run_graph(before, feeds, list(outputs) + inner)
    got = run_graph(after, feeds, outputs)
    ref, inner_values = ref_all[:len(outputs)], dict(zip(inner, ref_all[len(outputs):]))
    ancestors = _ancestors(before)
    depth = _low_depth(before, after, low_dtype(precision))
    per_level = rtol if rtol is not None else NUMERIC_TOLERANCE[precision]
    for name, r, g in zip(outputs, ref, got):
        node = parse_input(name)[0]
        if g.dtype != r.dtype or g.shape != r.shape:
            raise InvariantError("numerics", f"output {name} is {g.dtype}{list(g.shape)}, float32 gave "
                                 f"{r.dtype}{list(r.shape)}", node=node)
        finite = np.isfinite(r)
        if not np.all(np.isfinite(g[finite])):
            raise InvariantError("numerics", f"output {name} is not finite where float32 is", node=node)
        scale = 1.0
        for a in ancestors.get(node, ()) | {node}:
            for key, value in inner_values.items():
                if parse_input(key)[0] == a and value.size:
                    with np.errstate(invalid="ignore"):
                        m = np.max(np.abs(value[np.isfinite(value)]), initial=0.0)
                    scale = max(scale, float(m))
        if np.any(finite):
            err = float(np.max(np.abs(g[finite].astype(np.float64) - r[finite].astype(np.float64))))
            levels = depth.get(node, 0) + 1
            tol = per_level * levels * scale
            if not err <= tol:
                raise InvariantError("numerics", f"output {name} differs from float32 by {err:.3g} > "
                                     f"{tol:.3g} ({levels} level(s) x {per_level:.2g} x magnitude {scale:.3g})",
                                     node=node)


def _ancestors(graph_def: Any) -> dict[str, set[str]]:
    preds = {n.name: [parse_input(t)[0] for t in n.input] for n in graph_def.node}
    memo: dict[str, set[str]] = {}
    for start in preds:
        seen: set[str] = set()
        stack = list(preds[start])
        while stack:
            x = stack.pop()
            if x in seen or x not in preds:
                continue
            seen.add(x)
            stack.extend(preds[x])
        memo[start] = seen
    return memo


# ----------------------------------------------------------------------------- parity


def check_parity(before: Any, after: Any, report: Any = None, *, reference: Any,
                 precision: str = "float16") -> None:
    """**parity**: the (node, type attribute) pairs converted equal those of ``reference``
    (TensorFlow's own pass on the same graph, see :func:`~amp_rewrite.testing.reference.
    tensorflow_reference`), and we insert no more casts than it does.
    """
    before, after, reference = _graph_def(before), _graph_def(after), _graph_def(reference)
    low = low_dtype(precision)
    ours = converted_type_attrs(before, after, low)
    theirs = converted_type_attrs(before, reference, low)
    if ours != theirs:
        only_ours, only_theirs = sorted(ours - theirs), sorted(theirs - ours)
        first = (only_ours or only_theirs)[0]
        raise InvariantError("parity", f"only amp_rewrite converted {only_ours[:6]}; only TensorFlow "
                             f"converted {only_theirs[:6]}", node=first[1], scope=first[0])
    b_scopes = scopes(before)

    def new_casts(gd: Any) -> int:
        return sum(1 for name, sc in scopes(gd).items() for n, node in sc.nodes.items()
                   if node.op == "Cast" and n not in b_scopes.get(name, Scope("", {})).nodes)

    if new_casts(after) > new_casts(reference):
        raise InvariantError("parity", f"{new_casts(after)} casts inserted, TensorFlow needs "
                             f"{new_casts(reference)}")
