"""The rewrite's self-check: a rewritten graph must still be typed as TensorFlow will run it.

A plan that paints one end of an edge and not the other gets a Cast between them; a call
(``While``, ``If``, ``Case``, ``PartitionedCall``) must pass its callees exactly the types
of their signatures, since each function is rewritten on its own and keeps its signature.
Where the rewrite breaks either rule, TensorFlow rejects the graph only when it builds it:
at the first training step, at ``tf.saved_model.load``, or in TF Serving ("passed bfloat16
expected float", KD-6's symptom).  This check finds such a break when the graph is
rewritten and names the nodes it involves (:func:`check_rewritten` raises
:class:`TypeCheckFailed`); :func:`amp_rewrite.api.rewrite_graph_def` then makes the rewrite
again with those nodes kept float32 (with a WARNING), and raises the
:class:`~amp_rewrite.errors.RewriteError` where that does not avoid it, before anything is
written or run.

Only what the rewrite changed is checked: edges it made (to and from its Casts, and
consumers moved onto a Cast) and edges whose end has a type attribute it changed; calls whose
type attributes it changed; and that each type attribute it changed holds a type its op
allows.  A mismatch the input graph had already is not the
rewrite's to report (TensorFlow reports it as it did before).  The check reads the IR and
the plan's port analysis (:class:`~amp_rewrite.graph.type_attrs.NodeTypes`), not protobuf.
"""

from __future__ import annotations

import logging
from typing import Iterable, Mapping, NamedTuple

import networkx as nx

from .errors import RewriteError
from .graph import dtypes as dt
from .graph.ir import node_entries
from .graph.op_registry import ArgSpec, OpRegistry, OpSignature
from .graph.type_attrs import NodeTypes, TypeAttr, get_dtype, node_types

__all__ = ["CALL_TYPE_ATTRS", "TypeBreak", "TypeCheckFailed", "check_rewritten", "rewrite_type_errors"]

log = logging.getLogger(__name__)

#: How many type errors one check collects (each one's nodes are kept float32 on the next
#: try), and how many of them a message quotes.
TYPE_BREAKS_KEPT = 100
TYPE_BREAKS_SHOWN = 5

#: The rewrite inserts at most one Cast between two nodes of the graph as given (a chain of
#: them is folded); more in a row means the graph is not what the check expects.
_MOST_INSERTED_IN_A_ROW = 2

#: Ops that call functions through attributes: per op, the attributes naming its callees,
#: the type attribute their arguments must equal, and the one their results must equal
#: (``None`` for a callee whose results are not the call's: a loop's ``cond`` returns a bool).
CALL_TYPE_ATTRS: Mapping[str, tuple[Mapping[str, str | None], str]] = {
    **dict.fromkeys(("While", "StatelessWhile"), ({"cond": None, "body": "T"}, "T")),
    **dict.fromkeys(("If", "StatelessIf"), ({"then_branch": "Tout", "else_branch": "Tout"}, "Tin")),
    **dict.fromkeys(("Case", "StatelessCase"), ({"branches": "Tout"}, "Tin")),
    **dict.fromkeys(("PartitionedCall", "StatefulPartitionedCall"), ({"f": "Tout"}, "Tin")),
}


class TypeBreak(NamedTuple):
    """One type error the rewrite made: the node that would not build, why, and the nodes of
    the graph as given that it involves (an edge's two ends; an inserted Cast stands for the
    node it reads), which kept float32 would not be retyped."""

    node: str
    message: str
    involves: tuple[str, ...] = ()


class TypeCheckFailed(RewriteError):
    """A rewritten graph failed its type check (:func:`check_rewritten`): a bug of ours.
    ``where`` names the graph, ``reasons`` the breaks, and ``keep`` the nodes of the graph as
    given (per graph: ``""`` or a function's name) that kept float32 would not be retyped,
    each with the reason the report gives them."""

    def __init__(self, where: str, reasons: str, keep: dict[str, dict[str, str]], node: str) -> None:
        super().__init__(f"the rewrite of {where} failed its type check, so nothing was written: {reasons}.  "
                         "This is a bug in amp_rewrite; please report it with the graph", node=node)
        self.where = where
        self.reasons = reasons
        self.keep = keep


def check_rewritten(g: nx.MultiDiGraph, types: Mapping[str, NodeTypes], registry: OpRegistry, *,
                    parity: bool) -> None:
    """Raise :class:`TypeCheckFailed` where the rewrite of ``g`` (done, in place; ``types``
    the plan's port analysis of it as given) made a graph that TensorFlow would not build.
    With TensorFlow's bugs kept (``parity``), whose pass makes such graphs
    (KNOWN_DIFFERENCES.md), only warn.  Reads ``g``."""
    errors = rewrite_type_errors(g, types, registry, limit=TYPE_BREAKS_KEPT)
    if not errors:
        return
    function = g.graph["kind"] == "function"
    where = f"function {g.graph['name']}" if function else "the main graph"
    shown = errors[:TYPE_BREAKS_SHOWN]
    reasons = "; ".join(e.message for e in shown)
    if len(errors) > len(shown):
        reasons += f" (and {len(errors) - len(shown)}{'+' if len(errors) == TYPE_BREAKS_KEPT else ''} more)"
    if parity:
        log.warning("amp_rewrite: the rewrite of %s will not run, as TensorFlow's own pass's would not "
                    "(tensorflow_bugs=True): %s", where, reasons)
        return
    keep: dict[str, str] = {}
    for e in errors:
        for name in e.involves:
            keep.setdefault(name, f"preserved: kept float32 after the rewrite that converted it failed amp_rewrite's "
                                  f"type check ({e.message}; a bug in amp_rewrite); keeps its dtypes")
    raise TypeCheckFailed(where, reasons, {g.graph["name"] if function else "": keep}, errors[0].node)


def rewrite_type_errors(g: nx.MultiDiGraph, types: Mapping[str, NodeTypes], registry: OpRegistry, *,
                        limit: int = 5) -> list[TypeBreak]:
    """The type errors the rewrite made in ``g`` (rewritten in place), at most ``limit``, in
    node order; empty when there are none.

    ``types`` is the plan's port analysis of ``g`` as given (:attr:`Plan.types`); nodes
    outside it (the inserted Casts) are analysed from ``registry``.  What the rewrite did is
    read from the IR (its schema): the nodes it changed or inserted are ``dirty`` (so is every
    node an edge it made leads to), their changed type attributes are ``changed_attrs``, and
    the edges it made have no ``text``.  Reads ``g``, changes nothing.

    Each edge is looked at once: the data inputs of every dirty node, and the outputs of every
    retyped node into nodes that are not dirty (a consumer the rewrite left alone reading a
    retyped tensor: where it forgot a Cast).  Linear in the nodes, and in those edges.
    """
    analysis = _Analysis(g, types, registry)
    nodes = g._node
    errors: list[TypeBreak] = []
    # Each node with its dicts, in the graph's own order: walking them costs far less than a
    # lookup by name per node in a large graph.
    for name, data, outs, preds in zip(*node_entries(g)):
        if not data["dirty"]:
            continue
        nt = analysis.node_types(name)
        if nt is None:
            continue
        errors += analysis.bad_inputs(name, data, nt, preds)
        if data.get("changed_attrs"):
            for v, keyed in outs.items():
                if not nodes[v]["dirty"]:
                    errors += analysis.bad_edges(name, v, keyed)
            errors += _call_errors(g, name, analysis)
            errors += analysis.disallowed_types(name, data)
        if len(errors) >= limit:
            break
    return [e._replace(involves=analysis.given_nodes(e.involves or (e.node,))) for e in errors[:limit]]


class _Analysis:
    """Each node's ports and current dtypes, from the plan's analysis or, for nodes the
    rewrite inserted, from the registry.  Reads ``g``; caches what it derives."""

    def __init__(self, g: nx.MultiDiGraph, types: Mapping[str, NodeTypes], registry: OpRegistry) -> None:
        self.g = g
        self.types = types
        self.registry = registry
        self.signatures: Mapping[str, OpSignature] = g.graph.get("signatures", {})
        #: Inserted nodes' analyses, by name and by what they are a function of (thousands
        #: of Casts share a few).
        self._by_name: dict[str, NodeTypes | None] = {}
        self._derived: dict[tuple, NodeTypes | None] = {}
        #: (op, attr, value) -> the dtype of the value the op refuses, or None.
        self._refused: dict[tuple, int | None] = {}

    def node_types(self, name: str) -> NodeTypes | None:
        """``name``'s ports, or ``None`` for an op neither the registry nor the library has."""
        nt = self.types.get(name)
        if nt is not None:
            return nt
        if name in self._by_name:
            return self._by_name[name]
        data = self.g._node[name]
        n_inputs = sum(1 for keyed in self.g._pred[name].values() for q in keyed if q >= 0)
        # Unsorted: the rewrite writes every Cast's attributes in one order, and a dict in
        # another order only costs one more entry.
        key = (data["op"], tuple(data["dtypes"].items()), tuple(data["ints"].items()), data["attr_names"],
               n_inputs)
        if key not in self._derived:
            sig = self.registry.op(data["op"]) or self.signatures.get(data["op"])
            self._derived[key] = None if sig is None else node_types(
                name, data["op"], data["dtypes"], data["ints"], data["attr_names"], n_inputs, sig)
        nt = self._by_name[name] = self._derived[key]
        return nt

    def disallowed_types(self, name: str, data: Mapping) -> list[TypeBreak]:
        """The type attributes of ``name`` that the rewrite changed to a dtype its op does not
        allow (TensorFlow refuses such a node when it builds the graph)."""
        op = data["op"]
        bad = []
        for attr in data["changed_attrs"]:
            value = data["dtypes"].get(attr)
            key = (op, attr, value)
            refused = self._refused.get(key, ...)
            if refused is ...:
                refused = self._refused[key] = self._refused_dtype(op, attr, value)
            if refused is not None:
                bad.append(TypeBreak(name, f"{op} node {name!r} has {attr} {dt.name(refused)}, which op {op} does not "
                                           "allow"))
        return sorted(bad)  # changed_attrs is a set: its order is the hash seed's

    def _refused_dtype(self, op: str, attr: str, value: int | tuple[int, ...] | None) -> int | None:
        """The first dtype of ``value`` (type attribute ``attr`` of an ``op`` node) that the op
        does not allow, ``None`` where it allows them all or is not known."""
        sig = self.registry.op(op) or self.signatures.get(op)
        spec = None if sig is None else sig.attrs.get(attr)
        if spec is None or spec.allowed is None or value is None:
            return None
        return next((d for d in (value if isinstance(value, tuple) else (value,)) if d not in spec.allowed), None)

    def given_nodes(self, names: Iterable[str]) -> tuple[str, ...]:
        """``names`` as nodes of the graph as given: an inserted node (a Cast) stands for the
        node it reads.  In order, without repeats."""
        out: dict[str, None] = {}
        for name in names:
            source = self.given_source(name, 0)
            out.setdefault(name if source is None else source[0], None)
        return tuple(out)

    def given_source(self, u: str, p: int) -> tuple[str, int] | None:
        """The node of the graph as given, and its output, whose tensor ``u:p`` carries:
        ``(u, p)`` itself, or through the Casts the rewrite inserted back to what they read;
        ``None`` where an inserted node does not read exactly one tensor."""
        for _ in range(_MOST_INSERTED_IN_A_ROW + 1):
            if u in self.types:
                return u, p
            ins = [(w, d["src_port"]) for w, keyed in self.g._pred[u].items() for k, d in keyed.items() if k >= 0]
            if len(ins) != 1:
                return None
            (u, p), = ins
        return None

    def bad_inputs(self, v: str, data_v: Mapping, nt_v: NodeTypes,
                   preds: Mapping[str, Mapping[int, Mapping]]) -> list[TypeBreak]:
        """The data inputs of ``v`` (dirty; ``data_v`` its attributes, ``nt_v`` its ports,
        ``preds`` networkx's predecessor dict) that do not type, of those the rewrite made or
        whose end it retyped."""
        # Runs for every node the rewrite touched (hundreds of thousands in large graphs):
        # the lookups are inlined, and the common case (scalar type attributes or fixed types
        # that agree) is decided without a call.
        nodes, types, node_types = self.g._node, self.types, self.node_types
        changed_v = data_v.get("changed_attrs", ())
        dtypes_v = data_v["dtypes"]
        inputs = nt_v.inputs
        bad: list[TypeBreak] = []
        for u, keyed in preds.items():
            nt_u = types.get(u) or node_types(u)
            if nt_u is None:
                continue
            data_u = nodes[u]
            changed_u = data_u.get("changed_attrs", ())
            dtypes_u = data_u["dtypes"]
            outputs = nt_u.outputs
            for q, d in keyed.items():
                if q < 0:
                    continue
                p = d["src_port"]
                if p >= len(outputs) or q >= len(inputs):
                    continue  # the import's checks own malformed ports
                out_ta, in_ta = outputs[p], inputs[q]
                a, b = out_ta.attr, in_ta.attr
                if not (d["text"] is None or a in changed_u or b in changed_v):
                    continue
                got = (dtypes_u.get(a) if out_ta.index < 0 else None) if a else out_ta.fixed
                want = (dtypes_v.get(b) if in_ta.index < 0 else None) if b else in_ta.fixed
                if got is not None and got == want:
                    continue
                error = self.edge_error(u, p, data_u, nt_u, v, q, data_v, nt_v)
                if error:
                    bad.append(error)
        return bad

    def bad_edges(self, u: str, v: str, keyed: Mapping[int, Mapping]) -> list[TypeBreak]:
        """The data edges ``keyed`` (networkx's key -> edge data) from ``u``, a retyped node,
        to ``v``, one the rewrite did not touch, that no longer type."""
        nt_u, nt_v = self.node_types(u), self.node_types(v)
        if nt_u is None or nt_v is None:
            return []
        data_u, data_v = self.g._node[u], self.g._node[v]
        changed = data_u.get("changed_attrs", ())
        bad = []
        for q, d in keyed.items():
            p = d["src_port"]
            if q < 0 or p >= len(nt_u.outputs) or nt_u.outputs[p].attr not in changed:
                continue
            error = self.edge_error(u, p, data_u, nt_u, v, q, data_v, nt_v)
            if error:
                bad.append(error)
        return bad

    def edge_error(self, u: str, p: int, data_u: Mapping, nt_u: NodeTypes, v: str, q: int, data_v: Mapping,
                   nt_v: NodeTypes) -> TypeBreak | None:
        """Why the edge ``u:p -> v`` (input ``q``) does not type, ``None`` where it does, where
        an end's type is not known, or where the graph as given had the same edge mistyped
        already (each end's attributes and ports given).  An op missing from the registry
        has its ports described from its neighbours as they were before the rewrite, so it
        must be handed what it had."""
        if q >= len(nt_v.inputs):
            return None
        out_ta, in_ta = nt_u.outputs[p], nt_v.inputs[q]
        got, want = _dtype(data_u, nt_u, out_ta), _dtype(data_v, nt_v, in_ta)
        if got == want or dt.INVALID in (got, want) or self._mistyped_as_given(u, p, v, q):
            return None
        return TypeBreak(v, f"{data_v['op']} node {v!r} reads {dt.name(got)} from output {p} of {data_u['op']} "
                            f"node {u!r} at input {q}, which is {dt.name(want)} ({in_ta})", (v, u))

    def _mistyped_as_given(self, u: str, p: int, v: str, q: int) -> bool:
        """Whether, in the graph as given, the tensor that ``u:p`` carries now (through the
        Casts the rewrite inserted, back to the node that makes it) already had a type other
        than input ``q`` of ``v`` read: TensorFlow's error to report, not the rewrite's.
        ``False`` where ``v`` is an inserted node (it reads what it is made to read)."""
        given_v, source = self.types.get(v), self.given_source(u, p)
        if given_v is None or source is None:
            return False
        u, p = source
        given_u = self.types[u]
        if given_u is None or p >= len(given_u.outputs) or q >= len(given_v.inputs):
            return False
        was, read = get_dtype(given_u.dtypes, given_u.outputs[p]), get_dtype(given_v.dtypes, given_v.inputs[q])
        return was != read and dt.INVALID not in (was, read)


def _dtype(data: Mapping, nt: NodeTypes, ta: TypeAttr) -> int:
    """The dtype ``ta`` has now: the node's own attribute (``data``), which the rewrite may
    have changed, else the analysis's (``nt``, with OpDef defaults filled in)."""
    if ta.attr and ta.attr in data["dtypes"]:
        return get_dtype(data["dtypes"], ta)
    return get_dtype(nt.dtypes, ta)


def _call_errors(g: nx.MultiDiGraph, name: str, analysis: _Analysis) -> list[TypeBreak]:
    """Where ``name`` calls functions and the rewrite changed its type attributes: one
    :class:`TypeBreak` naming the first callee whose signature its arguments or results no
    longer match, and how many such mismatches there are."""
    data = g._node[name]
    spec = CALL_TYPE_ATTRS.get(data["op"])
    changed = data.get("changed_attrs", ())
    if spec is None or not changed:
        return []
    callees, in_attr = spec
    if not ({in_attr, *filter(None, callees.values())} & set(changed)):
        return []
    given = analysis.node_types(name)
    mismatches = []
    for attr, callee in data.get("func_attrs", ()):
        sig = analysis.signatures.get(callee)
        if attr not in callees or sig is None:
            continue
        for type_attr, what, args in ((in_attr, "arguments", sig.inputs), (callees[attr], "results", sig.outputs)):
            declared = _signature_types(args)
            if type_attr is None or declared is None:
                continue
            passed = _types_of(data["dtypes"], type_attr)
            before = _types_of(given.dtypes, type_attr) if given is not None else passed
            # Only the elements the rewrite changed: a call the input had mismatched already
            # is TensorFlow's to report.
            at = [i for i, (now, was, want) in enumerate(zip(passed, before, declared)) if now != want and now != was]
            if at and len(passed) == len(declared):
                mismatches.append(_call_error(data["op"], name, type_attr, attr, callee, what, at[0],
                                              passed[at[0]], declared[at[0]]))
    if not mismatches:
        return []
    more = f" (and {len(mismatches) - 1} more of its callees' arguments or results)" if len(mismatches) > 1 else ""
    return [TypeBreak(name, mismatches[0] + more)]


def _types_of(dtypes: Mapping[str, int | tuple[int, ...]], attr: str) -> tuple[int, ...]:
    """The dtypes of list attribute ``attr`` in ``dtypes`` (a scalar as one).  Pure."""
    value = dtypes.get(attr, ())
    return value if isinstance(value, tuple) else (value,)


def _signature_types(args: Iterable[ArgSpec]) -> tuple[int, ...] | None:
    """A library function's declared argument (or result) types; ``None`` for a polymorphic
    function (a TF1 ``Defun`` typed by attributes), whose types a call sets itself."""
    declared = []
    for arg in args:
        if arg.type_attr or arg.type_list_attr or arg.number_attr:
            return None
        declared.append(arg.fixed_type)
    return tuple(declared)


def _call_error(op: str, name: str, type_attr: str, attr: str, callee: str, what: str, at: int, got: int,
                want: int) -> str:
    """The sentence for a call whose element ``at`` of ``type_attr`` is ``got`` where its
    callee declares ``want``.  Pure."""
    return (f"{op} node {name!r} passes {what} {type_attr} that do not match its {attr} {callee!r}: element "
            f"{at} is {dt.name(got)} where {callee!r} declares {dt.name(want)}")
