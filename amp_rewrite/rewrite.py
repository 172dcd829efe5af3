"""The rewrite stage: carry out a :class:`~amp_rewrite.plan.painter.Plan` on the IR.

It changes the type attributes the plan converts, renames FusedBatchNorm nodes, and
inserts one ``Cast`` per (producer output, direction) wherever a low-precision tensor meets
a float32 consumer or the other way round; every consumer that needs it reads that one Cast.
Cast names follow TensorFlow's (``<producer>-<port>-CastToFp16-<k>-AutoMixedPrecision``,
``k`` the smallest free number), and each Cast is placed right after its producer in the
exported node order, so output is deterministic.
"""

from __future__ import annotations

import logging
import operator
from dataclasses import dataclass
from typing import Iterable, Mapping

import networkx as nx

from .graph import dtypes as dt
from .graph import ir
from .plan.painter import Plan
from .graph.type_attrs import NodeTypes, TypeAttr, get_dtype

__all__ = ["CastInfo", "RewriteStats", "apply_plan"]

log = logging.getLogger(__name__)

_CONST_OR_VARIABLE = frozenset({
    "Const", "Variable", "VariableV2", "AutoReloadVariable", "VarHandleOp", "ReadVariableOp",
    "_VarHandlesOp", "_ReadVariablesOp",
})


@dataclass(frozen=True)
class CastInfo:
    """One inserted Cast: its name, the tensor it reads, and its destination dtype."""

    name: str
    source: str
    port: int
    dst_dtype: int
    consumers: tuple[str, ...]


@dataclass(frozen=True)
class RewriteStats:
    """What :func:`apply_plan` did: converted attributes and inserted casts."""

    converted: tuple[tuple[str, TypeAttr], ...]
    casts: tuple[CastInfo, ...]
    #: TensorFlow's own count: casts to low precision not fed by a Const or variable.
    tf_style_casts: int
    #: Existing Casts that now read a low-precision tensor directly (their ``SrcT`` changed
    #: when a Cast -> Cast chain was folded); also listed in ``converted``.
    folded: tuple[str, ...] = ()


def _token(dtype: int) -> str:
    return {dt.HALF: "CastToFp16", dt.BFLOAT16: "CastToBf16"}.get(dtype, "CastToFp32")


def _set_dtype(data: dict, ta: TypeAttr, value: int) -> None:
    types = data["dtypes"]
    if ta.index < 0:
        types[ta.attr] = value
    else:
        lst = list(types[ta.attr])
        lst[ta.index] = value
        types[ta.attr] = tuple(lst)
    data.setdefault("changed_attrs", set()).add(ta.attr)
    data["dirty"] = True


def _reads_ref_var(g: nx.MultiDiGraph, name: str) -> bool:
    seen = set()
    while name not in seen:
        seen.add(name)
        ins = ir.data_inputs(g, name)
        op = g._node[name]["op"]
        if not ins:
            return False
        if op == "Identity":
            return g._node[ins[0][0]]["op"] in ("Variable", "VariableV2")
        if op != "Enter":
            return False
        name = ins[0][0]
    return False


#: Source dtypes whose conversion to float32 is exact, so X -> float32 -> Y == X -> Y.
_EXACT_IN_FLOAT = frozenset({
    dt.BOOL, dt.INT8, dt.UINT8, dt.INT16, dt.UINT16, dt.HALF, dt.BFLOAT16, dt.FLOAT,
})


def _exact(src: int, dst: int) -> bool:
    return src == dst or (dst == dt.FLOAT and src in _EXACT_IN_FLOAT)


def _rewire_consumers(g: nx.MultiDiGraph, node: str, to: tuple[str, int]) -> None:
    for dst, q, key in ir.consumers(g, node, 0):
        g.remove_edge(node, dst, key=key)
        ir.add_data_edge(g, to[0], to[1], dst, q, None)
        g._node[dst]["dirty"] = True
        g._node[dst]["inputs_changed"] = True


def _fold_cast_chains(
    g: nx.MultiDiGraph, casts: list[CastInfo], plan: Plan, folded: list[str],
    candidates: set[str] | None = None,
) -> list[CastInfo]:
    """Remove Cast -> Cast chains that involve an inserted Cast.  Mutates ``g``.

    ``A -> B -> C`` becomes ``A -> C`` (or nothing when ``A == C``) when ``A -> B`` is exact,
    so values are unchanged.  Two shapes occur: an inserted cast after an existing Cast
    (``bool -> float`` feeding float16 consumers), and an existing Cast after an inserted one
    (a ``float -> int32`` Cast reading a tensor that is now float16).

    ``candidates``, when given, names the inserted casts whose producer or one of whose
    consumers is a Cast: no other cast can be part of a chain, so the others are skipped
    without looking at the graph.
    """
    if candidates is not None:
        if not candidates:
            return casts
        casts_in_chains = [c for c in casts if c.name in candidates]
    else:
        casts_in_chains = casts
    inserted = {c.name: c for c in casts}
    removed: set[str] = set()
    for c in casts_in_chains:
        (src, port), = ir.data_inputs(g, c.name)
        prev = g._node[src]
        if prev["op"] != "Cast" or not _exact(prev["dtypes"]["SrcT"], prev["dtypes"]["DstT"]):
            continue
        origin = ir.data_inputs(g, src)[0]
        data = g._node[c.name]
        if prev["dtypes"]["SrcT"] == data["dtypes"]["DstT"]:
            _rewire_consumers(g, c.name, origin)
            g.remove_node(c.name)
            removed.add(c.name)
        else:
            g.remove_edge(src, c.name, key=0)
            ir.add_data_edge(g, origin[0], origin[1], c.name, 0, None)
            data["dtypes"]["SrcT"] = prev["dtypes"]["SrcT"]
        if src in inserted and g.out_degree(src) == 0:
            g.remove_node(src)
            removed.add(src)
    for c in casts_in_chains:
        if c.name in removed or not _exact(g._node[c.name]["dtypes"]["SrcT"], dt.FLOAT):
            continue
        (origin,) = ir.data_inputs(g, c.name)
        for dst, q, key in ir.consumers(g, c.name, 0):
            data = g._node[dst]
            if data["op"] != "Cast" or dst in inserted or data["dtypes"].get("SrcT") != dt.FLOAT:
                continue
            decision = plan.nodes.get(dst)
            if decision is None or not decision.processed:
                # A preserved Cast, or one on a device we do not rewrite, keeps its types.
                continue
            g.remove_edge(c.name, dst, key=key)
            ir.add_data_edge(g, origin[0], origin[1], dst, q, None)
            data["dtypes"]["SrcT"] = g._node[c.name]["dtypes"]["SrcT"]
            data.setdefault("changed_attrs", set()).add("SrcT")
            data["dirty"] = True
            data["inputs_changed"] = True
            folded.append(dst)
        if g.out_degree(c.name) == 0:
            g.remove_node(c.name)
            removed.add(c.name)
    return [c for c in casts if c.name not in removed]


def apply_plan(g: nx.MultiDiGraph, plan: Plan, *, fold_casts: bool = True) -> RewriteStats:
    """Carry out ``plan`` on ``g``.  **Mutates** ``g`` (callers pass an IR they own).

    Assumes ``plan`` was made by :func:`~amp_rewrite.plan.painter.decide` for this very graph.
    ``fold_casts`` removes Cast -> Cast chains (off for exact parity with TensorFlow, which
    leaves them).
    """
    if plan.skipped is not None:
        return RewriteStats((), (), 0)
    _apply_renames(g, plan)
    low = plan.target_dtype
    allow = plan.allow
    rewriter = _Rewriter(g, plan)
    # Every node with its dicts, in order, without a lookup by name per node (a million-entry
    # dict misses the CPU caches on every lookup).  The plan's types are in the same order
    # when decide made them for this graph.
    order, datas, outs, _ = ir.ordered_entries(g, pred=False)
    node_types = _types_in_order(plan.types, order)
    # Per NodeTypes object (shared by the nodes of one op and attrs): its float32 attrs, each
    # with the output ports it governs.  id() is stable while ``plan.types`` holds the objects.
    float_attrs: dict[int, list[tuple[TypeAttr, list[int]]]] = {}
    # Checked once: log.debug's own check and its arguments cost a call per converted attr.
    debug = log.isEnabledFor(logging.DEBUG)
    converted = rewriter.converted
    for name, nt, data, out in zip(order, node_types, datas, outs):
        if nt is None:
            continue
        todo = float_attrs.get(id(nt))
        if todo is None:
            todo = float_attrs[id(nt)] = _float_attrs(nt)
        if not todo:
            continue
        rewriter.seq = 0
        # Snapshot of the consumers before any cast of this node is inserted.
        fanout = ir.consumers_of(out)
        for ta, ports in todo:
            # A fixed-type port cannot change type; painting it (TensorFlow does under
            # UNSAFE_FORCE_ALL) must not reach here.
            src_allow = bool(ta.attr) and (name, ta) in allow  # ta.attr: not ta.is_fixed
            if src_allow:
                _set_dtype(data, ta, low)
                converted.append((name, ta))
                if debug:
                    log.debug("changing type %s of %s node %s to %s", ta, data["op"], name, dt.name(low))
            for port in ports:
                rewriter.rewire(name, data, out, port, src_allow, fanout.get(port, ()))
    nx._clear_cache(g)  # once, for the dicts written directly above
    casts = rewriter.casts
    folded: list[str] = []
    if fold_casts:
        casts = _fold_cast_chains(g, casts, plan, folded, rewriter.fold_candidates)
        converted += [(name, TypeAttr("SrcT", -1, 0)) for name in folded]
    return RewriteStats(tuple(converted), tuple(casts), rewriter.tf_style, tuple(folded))


def _apply_renames(g: nx.MultiDiGraph, plan: Plan) -> None:
    """Give the renamed nodes (FusedBatchNorm -> V2) their new op and ``U = float32``.
    **Mutates** ``g``."""
    nodes = g._node  # networkx's dicts, written directly as in ir.add_node / add_data_edge
    for name, op in sorted(plan.renames.items()):
        data = nodes[name]
        data["op"] = op
        data["dtypes"]["U"] = dt.FLOAT
        data.setdefault("changed_attrs", set()).add("U")
        data["dirty"] = True


def _types_in_order(types: Mapping[str, NodeTypes], order: list[str]) -> list[NodeTypes | None]:
    """The :class:`NodeTypes` of the nodes of ``order`` (``None`` for a node the plan does not
    know).  Pure."""
    if len(types) == len(order) and all(map(operator.is_, types, order)):
        return list(types.values())
    return list(map(types.get, order))


def _float_attrs(nt: NodeTypes) -> list[tuple[TypeAttr, list[int]]]:
    """The float32 type attributes of ``nt``, each with the output ports it governs.  Pure.

    One pass over the outputs: a training step's IdentityN has hundreds of outputs, each with
    its own attr, and a scan per attr would be quadratic."""
    ports_of: dict[TypeAttr, list[int]] = {}
    for port, out_ta in enumerate(nt.outputs):
        ports_of.setdefault(out_ta, []).append(port)
    return [(ta, ports_of.get(ta, [])) for ta in nt.attrs if get_dtype(nt.dtypes, ta) == dt.FLOAT]


class _Rewriter:
    """Inserts the Casts of one :func:`apply_plan` run and rewires consumers to them,
    collecting what it did (``converted``, ``casts``, ``tf_style``, ``fold_candidates``).
    **Mutates** the graph it is given."""

    def __init__(self, g: nx.MultiDiGraph, plan: Plan) -> None:
        self.g = g
        self.nodes = g._node  # networkx's dicts, written directly as in ir.add_node / add_data_edge
        self.pred = g._pred
        self.types = plan.types
        self.allow = plan.allow
        self.low = plan.target_dtype
        self.tokens = {dtype: _token(dtype) for dtype in (self.low, dt.FLOAT)}
        self.debug = log.isEnabledFor(logging.DEBUG)
        self.converted: list[tuple[str, TypeAttr]] = []
        self.casts: list[CastInfo] = []
        self.tf_style = 0
        # Inserted casts whose producer, or one of whose consumers, is a Cast: the only ones
        # _fold_cast_chains can change.
        self.fold_candidates: set[str] = set()
        #: Casts inserted for the current node so far (orders them after it).
        self.seq = 0

    def rewire(self, name: str, data: dict, out: dict, port: int, src_allow: bool,
               consumers: Iterable[tuple[str, int, int]]) -> None:
        """Give output ``port`` of node ``name`` (``data``, its successor dict ``out``) one
        Cast for the ``consumers`` whose side (allow or not) differs from ``src_allow``, and
        move those consumers onto it."""
        types, allow, nodes, pred = self.types, self.allow, self.nodes, self.pred
        cast_name = None
        rewired = []
        for dst, q, key in consumers:
            dst_types = types.get(dst)
            dst_allow = dst_types is not None and (dst, dst_types.inputs[q]) in allow
            if dst_allow == src_allow:
                continue
            if cast_name is None:
                cast_name, cast_out = self._new_cast(name, data, out, port, src_allow, dst_allow)
            # g.remove_edge(name, dst, key=key), inlined.
            keydict = out[dst]
            del keydict[key]
            dst_pred = pred[dst]
            if not keydict:
                del out[dst]
                del dst_pred[name]
            ir.link(cast_out, dst_pred, cast_name, dst, 0, q, None)
            dst_data = nodes[dst]
            dst_data["dirty"] = True
            dst_data["inputs_changed"] = True
            if dst_data["op"] == "Cast":
                self.fold_candidates.add(cast_name)
            rewired.append(dst)
        if cast_name is not None:
            self.casts.append(CastInfo(cast_name, name, port, self.low if not src_allow else dt.FLOAT,
                                       tuple(rewired)))

    def _new_cast(self, name: str, data: dict, out: dict, port: int, src_allow: bool,
                  dst_allow: bool) -> tuple[str, dict]:
        """Insert the Cast of output ``port`` of ``name`` to the consumers' side, fed by that
        output; returns its name and successor dict."""
        low = self.low
        to_dtype = low if dst_allow else dt.FLOAT
        token = self.tokens[to_dtype]
        k = 0
        while f"{name}-{port}-{token}-{k}-AutoMixedPrecision" in self.nodes:
            k += 1
        cast_name = f"{name}-{port}-{token}-{k}-AutoMixedPrecision"
        self.seq += 1
        cast_data, cast_out, cast_in = ir.add_new_node(
            self.g, cast_name, op="Cast", device=data["device"],
            order=(data["order"][0], data["order"][1] + self.seq),
            dtypes={"SrcT": low if src_allow else dt.FLOAT, "DstT": to_dtype},
        )
        cast_data["bools"] = {"Truncate": False}
        # ir.add_data_edge(g, name, port, cast_name, 0, None), inlined: the cast is new, so the
        # edge is too.
        out[cast_name] = cast_in[name] = {
            0: {"src_port": port, "dst_port": 0, "pos": 0, "text": None}}
        op = data["op"]
        if op == "Cast":
            self.fold_candidates.add(cast_name)
        # Only an Identity or Enter can read a ref variable (_reads_ref_var).
        if dst_allow and op not in _CONST_OR_VARIABLE and not (
                op in ("Identity", "Enter") and _reads_ref_var(self.g, name)):
            self.tf_style += 1
        if self.debug:
            log.debug("inserting cast to %s at %s:%d", dt.name(to_dtype), name, port)
        return cast_name, cast_out
