"""Why did a node get its colour and dtype?  Explanations built from a rewrite's plans.

:func:`explain_node` finds a node in the main graph or in any function of a rewritten
GraphDef and returns one :class:`Explanation` per place it occurs: the list its op is on
(and that list entry's reason and origin), the colour and dtype of every type attribute, the
painting pass that decided (:func:`decided_by`), for a propagated deny the chain of nodes
from the deny-list op that caused it (``Plan.deny_path``), and the Casts the rewrite put on
its inputs and outputs.  :meth:`Explanation.format` renders it as text for
``amp-rewrite explain``.

Pure: nothing here reads files or changes a plan.
"""

from __future__ import annotations

import difflib
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ..graph import dtypes as dt
from ..errors import AmpRewriteError
from ..plan.exclude import NameMatcher, _unsuffixed, keras_scoped

if TYPE_CHECKING:  # pragma: no cover
    from ..api import RewriteResult
    from ..plan.painter import Plan
    from ..plan.lists import OpLists

__all__ = ["AttrExplanation", "Explanation", "decided_by", "explain_node", "explain_query", "explain_text",
           "find_node", "find_nodes"]

log = logging.getLogger(__name__)

# The passes of amp_rewrite.plan.painter (TensorFlow's order), recognised from the reason each
# one records.  Checked in order; the first match wins.
_NOT_PAINTED = "no pass painted it"
_PASSES: tuple[tuple[str, str], ...] = (
    # Reasons that say no pass applied (checked first: they quote the passes' wording).
    ("not between allow-list ops", _NOT_PAINTED),
    ("with no allow neighbour", _NOT_PAINTED),
    ("allow-list op not painted", _NOT_PAINTED),
    ("no allow-list op in the graph", _NOT_PAINTED),
    ("UNSAFE_FORCE_ALL", "pass 1 (allow list; level UNSAFE_FORCE_ALL)"),
    ("is on the allow list", "pass 1 (allow list)"),
    ("is on the deny list", "pass 2 (deny list)"),
    ("downstream of deny node", "pass 2 (deny propagation)"),
    ("deny propagated", "pass 2 (deny propagation)"),
    ("TensorList", "TensorList cluster matching (after passes 2 and 6)"),
    # The normalization rules' reasons (amp_rewrite.plan.passes: the fence, the statistics).
    ("fenced, it runs in float32", "pass 2 (normalization fence: float32 inside)"),
    ("normalization's moment statistic", "pass 2 (normalization statistics)"),
    ("a path from a normalization's output", "pass 3 (from a fenced normalization's output to an allow op)"),
    ("a path from an allow-list op to a normalization's input",
     "pass 3 (from an allow op to a fenced normalization's input)"),
    ("between allow-list ops", "pass 3 (clear/infer between allow ops)"),
    ("infer op fed by allow node", "pass 4 (infer after allow)"),
    ("clear op connected to allow node", "pass 5 (allow through clear ops)"),
    ("does not accept", "pass 6 (clean-up: op cannot take the type)"),
    ("quantized node", "pass 6 (clean-up: quantized node)"),
    ("loop back edge", "pass 6 (loop back edges must match)"),
    ("NextIteration", "pass 6 (loop back edges must match)"),
    ("existing Cast", "pass 6 (existing casts)"),
    ("preserved", "gating (pass 0): preserved node"),
    ("is not eligible", "gating (pass 0): device not eligible"),
    ("not in the op registry", "gating (pass 0): unknown op"),
    ("kernel", "pass 1 kernel check (KD-1)"),
    ("is not float32", "not a float32 attribute"),
)


def decided_by(reason: str) -> str:
    """The pass (or gate) that produced a decision, from its recorded reason.  Pure."""
    for needle, name in _PASSES:
        if needle in reason:
            return name
    return _NOT_PAINTED


@dataclass(frozen=True)
class AttrExplanation:
    """One type attribute: colour, final dtype, reason, deciding pass, and for a propagated
    deny the path ``[(node, op, attr), ...]`` from the deny-list op to this node."""

    attr: str
    color: str
    dtype: str
    reason: str
    decided_by: str
    deny_path: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True)
class Explanation:
    """Everything known about one node of one graph (``graph == ""``: the main graph)."""

    graph: str
    node: str
    op: str
    list: str | None
    list_reason: str | None
    list_origin: str | None
    color: str
    dtype: str
    reason: str
    attrs: tuple[AttrExplanation, ...]
    casts_in: tuple[Mapping[str, Any], ...] = ()
    casts_out: tuple[Mapping[str, Any], ...] = ()
    skipped: str | None = None
    precision: str = ""
    target: str = ""
    profile: str = ""
    is_cast: bool = False

    def format(self) -> str:
        """Multi-line text for a terminal."""
        where = "the main graph" if not self.graph else f"function {self.graph}"
        lines = [f"{self.node}  ({self.op}, in {where})"]
        if self.is_cast:
            cast = self.casts_out[0] if self.casts_out else {}
            lines.append(f"  a Cast inserted by the rewrite: reads {cast.get('source', '?')}, "
                         f"casts to {cast.get('dtype', '?')} for {', '.join(cast.get('consumers', ()))}")
            return "\n".join(lines)
        if self.skipped:
            lines.append(f"  nothing was rewritten in this graph: {self.skipped}")
            return "\n".join(lines)
        if self.list:
            origin = f"; entry from {self.list_origin}" if self.list_origin else ""
            lines.append(f"  list:       {self.op} is on the {self.list} list ({self.profile} lists, "
                         f"{self.precision}{origin})")
            if self.list_reason:
                lines.append(f"              \"{self.list_reason}\"")
        else:
            lines.append(f"  list:       {self.op} is on no list ({self.profile} lists, {self.precision})")
        lines.append(f"  decision:   {self.color}, {self.dtype or 'no float type'}")
        lines.append(f"  why:        {self.reason}")
        main = next((a for a in self.attrs if a.reason == self.reason), None)
        lines.append(f"  decided by: {main.decided_by if main else decided_by(self.reason)}")
        if len(self.attrs) > 1:
            lines.append("  type attributes:")
            for a in self.attrs:
                lines.append(f"    {a.attr:12s} {a.color:6s} {a.dtype:9s} {a.reason}  [{a.decided_by}]")
        for a in self.attrs:
            if len(a.deny_path) > 1:
                chain = " -> ".join(f"{n} ({op})" for n, op, _ in a.deny_path)
                lines.append(f"  deny path ({a.attr}): {chain}")
        for c in self.casts_in:
            lines.append(f"  input cast:  {c['name']} casts {c['source']} to {c['dtype']}")
        for c in self.casts_out:
            lines.append(f"  output cast: {c['name']} casts {c['source']} to {c['dtype']} for "
                         f"{', '.join(c['consumers'])}")
        return "\n".join(lines)


def _node_ops(graph_def: Any) -> dict[str, dict[str, str]]:
    """``{graph: {node: op}}`` for the main graph (``""``) and every function."""
    out = {"": {n.name: n.op for n in graph_def.node}}
    for fdef in graph_def.library.function:
        out[fdef.signature.name] = {n.name: n.op for n in fdef.node_def}
    return out


def find_node(result: "RewriteResult", node: str, function: str | None = None) -> list[str]:
    """The graphs (``""`` or function names) of ``result.graph_def`` that hold ``node``.

    Raises :class:`AmpRewriteError` naming close matches when there is none, or when
    ``function`` is not in the library.
    """
    ops = _node_ops(result.graph_def)
    if function is not None and function not in ops:
        close = difflib.get_close_matches(function, [f for f in ops if f], n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise AmpRewriteError(f"no function {function!r} in the graph's library{hint}")
    graphs = [g for g in ops if (function is None or g == function) and node in ops[g]]
    if graphs:
        return graphs
    names = sorted({n for g, nodes in ops.items() if function is None or g == function for n in nodes})
    close = difflib.get_close_matches(node, names, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    where = f"function {function!r}" if function else "the graph or its functions"
    raise AmpRewriteError(f"no node {node!r} in {where}{hint}")


def _section(report: Mapping[str, Any], graph: str) -> Mapping[str, Any]:
    return report if not graph else report.get("functions", {}).get(graph, {})


def _explain_in(result: "RewriteResult", graph: str, node: str, op: str, lists: "OpLists | None") -> Explanation:
    report = result.report
    section = _section(report, graph)
    casts = list(section.get("casts", ()))
    common = dict(precision=report["precision"], target=report["target"], profile=report["lists"])
    own_casts = [c for c in casts if c["name"] == node]
    if own_casts:
        return Explanation(graph, node, "Cast", None, None, None, "cast", own_casts[0]["dtype"], "inserted",
                           (), (), tuple(own_casts), is_cast=True, **common)
    plan: "Plan | None" = result.plans.get(graph)
    category: str | None = None
    list_reason = list_origin = None
    if lists is not None:
        category = lists.category_of(op)
        list_reason = lists.reasons.get(op) if category else None
        list_origin = lists.origins.get(op) if category else None
    if plan is None:
        why = report.get("skipped_functions", {}).get(graph, "this function was not rewritten")
        return Explanation(graph, node, op, category, list_reason, list_origin, "none", "", why, (),
                           skipped=why, **common)
    nd = plan.nodes.get(node)
    if nd is None:
        return Explanation(graph, node, op, category, list_reason, list_origin, "none", "",
                           plan.skipped or "not painted", (), skipped=plan.skipped, **common)
    attrs = []
    for ta, d in nd.attrs.items():
        path: tuple[tuple[str, str, str], ...] = ()
        if d.color == "deny":
            chain = plan.deny_path(node, ta)
            path = tuple((n, plan.nodes[n].op if n in plan.nodes else "?", str(a)) for n, a in chain)
        attrs.append(AttrExplanation(str(ta), d.color, dt.name(d.dtype), d.reason, decided_by(d.reason), path))
    if category is None:
        category = nd.category
    # A cast's source is "node:port"; rpartition, since node names may contain ':'.
    casts_out = tuple(c for c in casts if c["source"].rpartition(":")[0] == node)
    casts_in = tuple(c for c in casts if node in c["consumers"])
    return Explanation(graph, node, nd.op, category, list_reason, list_origin, nd.color, dt.name(nd.dtype),
                       nd.reason, tuple(attrs), casts_in, casts_out, **common)


def explain_node(result: "RewriteResult", node: str, *, lists: "OpLists | None" = None,
                 function: str | None = None) -> list[Explanation]:
    """Explain ``node`` in every graph of ``result`` that has it (or only in ``function``).

    ``lists`` (the effective :class:`~amp_rewrite.plan.lists.OpLists` of the rewrite) adds each
    list entry's reason and origin.  Raises :class:`AmpRewriteError` if no graph has the
    node.  Pure.
    """
    ops = _node_ops(result.graph_def)
    return [_explain_in(result, g, node, ops[g][node], lists) for g in find_node(result, node, function)]


def explain_text(explanations: Sequence[Explanation]) -> str:
    """All explanations, separated by blank lines."""
    return "\n\n".join(e.format() for e in explanations)



#: Ops that only hold, move or reshape data: a query that matches many nodes shows the others
#: (the ones a rewrite converts or keeps float32 for a reason) first.
_PLUMBING_OPS = frozenset({
    "Const", "Identity", "IdentityN", "NoOp", "Placeholder", "PlaceholderWithDefault", "_Arg", "_Retval",
    "VarHandleOp", "ReadVariableOp", "AssignVariableOp", "VariableV2", "Variable", "Assign",
    "StatefulPartitionedCall", "PartitionedCall", "Shape", "ShapeN", "Reshape", "Squeeze", "ExpandDims",
    "StridedSlice", "Pack", "Unpack", "StopGradient", "SaveV2", "RestoreV2", "MergeV2Checkpoints",
    "StringJoin", "ShardedFilename", "Fill", "Range",
})


def _rank(op: str, lists: "OpLists | None") -> int:
    """Sort key of a node's op for suggestions and multiple matches: allow-list ops first
    (what a rewrite converts), then deny and infer ops, then other computations, then
    clear-list ops, and data plumbing (variables, constants, identities) last."""
    category = lists.category_of(op) if lists is not None else None
    if category == "allow":
        return 0
    if category in ("deny", "infer"):
        return 1
    if op in _PLUMBING_OPS:
        return 4
    return 3 if category == "clear" else 2


def _searched_graphs(ops: Mapping[str, Mapping[str, str]], function: str | None) -> list[str]:
    """The graphs a query searches: all of ``ops`` (``{graph: {node: op}}``), or only
    ``function``.  Raises :class:`AmpRewriteError` naming close function names when there is
    no such function.  Pure."""
    if function is not None and function not in ops:
        close = difflib.get_close_matches(function, [f for f in ops if f], n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise AmpRewriteError(f"no function {function!r} in the graph's library{hint}")
    return [g for g in ops if function is None or g == function]


def _op_type(op: str, all_ops: set[str], lists: "OpLists | None") -> str:
    """``op`` as spelled in the graph (matched in any case).  Raises
    :class:`AmpRewriteError` naming close op types, computations first, when no node has
    it.  Pure."""
    if op in all_ops:
        return op
    folded = {o.lower(): o for o in all_ops}
    if op.lower() in folded:
        return folded[op.lower()]
    close = sorted(difflib.get_close_matches(op, sorted(all_ops), n=3, cutoff=0.5),
                   key=lambda o: _rank(o, lists))
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise AmpRewriteError(f"no node of op type {op!r} in the graph or its functions{hint}")


def _query_hits(query: str, nodes: list[tuple[str, str]], ops: Mapping[str, Mapping[str, str]],
                keras3: Mapping[str, bool]) -> tuple[list[tuple[str, str]], str]:
    """The ``nodes`` that ``query`` names by the first test that matches any (name, op type,
    path component, substring) and that test's name; ``([], "substring")`` when none does.
    Pure."""
    lowered = query.lower()
    # A layer name is matched as --exclude matches it (Keras 3 scope suffixes included).
    layer = NameMatcher.compile([re.escape(query)])
    tests: tuple[tuple[str, Any], ...] = (
        ("name", lambda g, n: n == query),
        ("op type", lambda g, n: ops[g][n].lower() == lowered),
        ("path component", lambda g, n: "/" in n and layer.match(n, keras3[g]) is not None),
        ("substring", lambda g, n: lowered in n.lower()),
    )
    hits: list[tuple[str, str]] = []
    how = "op type"
    for how, test in tests:
        hits = [(g, n) for g, n in nodes if test(g, n)]
        if hits:
            break
    return hits, how


def _suggestions(text: str, nodes: list[tuple[str, str]], ops: Mapping[str, Mapping[str, str]],
                 keras3: Mapping[str, bool], lists: "OpLists | None") -> list[str]:
    """What the user could type instead of ``text``: node names, layer names (path components,
    without a Keras 3 scope suffix) and op types -- closest first and, among equally close
    ones, those of computations before those of variables and constants.  Pure."""
    best: dict[str, int] = {}  # candidate -> best rank of a node it names
    for g, n in nodes:
        rank = _rank(ops[g][n], lists)
        parts = n.split("/")
        candidates = {n, *parts, *(_unsuffixed(p) for p in parts)} if keras3[g] else {n, *parts}
        for c in candidates:
            if rank < best.get(c, 99):
                best[c] = rank
    matcher = difflib.SequenceMatcher(b=text)
    scored = []
    for c, rank in best.items():
        matcher.set_seq1(c)
        if matcher.real_quick_ratio() >= 0.5 and matcher.quick_ratio() >= 0.5:
            ratio = matcher.ratio()
            if ratio >= 0.5:
                scored.append((-round(ratio, 1), rank, c))
    scored.sort()
    suggestions = [c for _, _, c in scored[:3]]
    close_ops = difflib.get_close_matches(text, sorted({ops[g][n] for g, n in nodes}), n=1, cutoff=0.6)
    suggestions += [f"--op {o}" for o in close_ops if o not in suggestions]
    return suggestions


def find_nodes(
    result: "RewriteResult", query: str | None = None, *, op: str | None = None,
    function: str | None = None, lists: "OpLists | None" = None,
) -> tuple[list[tuple[str, str]], str]:
    """The ``(graph, node)`` pairs a query names, best first, and how it matched.

    ``query`` is tried as, in order: an exact node name; an op type (``Conv2D``, any case);
    a ``/``-separated component of node names, such as a Keras layer name (``conv2d_1``
    names the nodes of that layer, not those of ``conv2d_10``); and a substring of node names
    (any case).  ``op`` keeps only nodes of that op type (alone, it names them all).  Matches
    are ordered with computations before data plumbing (:func:`_rank`), then in graph order.
    ``how`` is ``"name"``, ``"op type"``, ``"path component"`` or ``"substring"``.

    Raises :class:`AmpRewriteError` when nothing matches, suggesting the closest node names
    and op types, computations first (``conv2d`` suggests the convolution, not its kernel
    variable).  Pure.
    """
    if query is None and op is None:
        raise AmpRewriteError("name a node (a name, op type, layer name or substring) or an op type")
    ops = _node_ops(result.graph_def)
    graphs = _searched_graphs(ops, function)
    if op is not None:
        op = _op_type(op, {o for g in graphs for o in ops[g].values()}, lists)
    nodes = [(g, n) for g in graphs for n, node_op in ops[g].items() if op is None or node_op == op]
    keras3 = {g: keras_scoped(ops[g]) for g in graphs}
    how = "op type"
    hits = nodes
    if query is not None:
        hits, how = _query_hits(query, nodes, ops, keras3)
    if hits:
        order = {pair: i for i, pair in enumerate(hits)}
        hits.sort(key=lambda pair: (_rank(ops[pair[0]][pair[1]], lists), order[pair]))
        return hits, how
    suggestions = _suggestions(query if query is not None else "", nodes, ops, keras3, lists)
    hint = f"; did you mean {', '.join(suggestions)}?" if suggestions else ""
    where = f"function {function!r}" if function else "the graph or its functions"
    kind = f" of op type {op!r}" if op is not None else ""
    raise AmpRewriteError(f"no node {query!r}{kind} in {where}{hint}")


def explain_query(
    result: "RewriteResult", query: str | None = None, *, op: str | None = None,
    lists: "OpLists | None" = None, function: str | None = None, limit: int | None = 10,
) -> tuple[list[Explanation], str, int]:
    """Explain the nodes :func:`find_nodes` finds for ``query``/``op``, at most ``limit``
    of them (``None``: all): ``(explanations, how it matched, how many matched)``.  Raises
    :class:`AmpRewriteError` like :func:`find_nodes`.  Pure."""
    hits, how = find_nodes(result, query, op=op, function=function, lists=lists)
    ops = _node_ops(result.graph_def)
    shown = hits if limit is None else hits[:limit]
    return [_explain_in(result, g, n, ops[g][n], lists) for g, n in shown], how, len(hits)
