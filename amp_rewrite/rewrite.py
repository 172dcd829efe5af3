"""The rewrite stage: carry out a :class:`~amp_rewrite.decide.Plan` on the IR.

It changes the type attributes the plan converts, renames FusedBatchNorm nodes, and
inserts one ``Cast`` per (producer output, direction) wherever a low-precision tensor meets
a float32 consumer or the other way round; every consumer that needs it reads that one Cast.
Cast names follow TensorFlow's (``<producer>-<port>-CastToFp16-<k>-AutoMixedPrecision``,
``k`` the smallest free number), and each Cast is placed right after its producer in the
exported node order, so output is deterministic.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import networkx as nx

from . import dtypes as dt
from . import ir
from .decide import Plan
from .type_attrs import TypeAttr, get_dtype

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
        op = g.nodes[name]["op"]
        if not ins:
            return False
        if op == "Identity":
            return g.nodes[ins[0][0]]["op"] in ("Variable", "VariableV2")
        if op != "Enter":
            return False
        name = ins[0][0]
    return False


def apply_plan(g: nx.MultiDiGraph, plan: Plan) -> RewriteStats:
    """Carry out ``plan`` on ``g``.  **Mutates** ``g`` (callers pass an IR they own).

    Assumes ``plan`` was made by :func:`~amp_rewrite.decide.decide` for this very graph.
    """
    if plan.skipped is not None:
        return RewriteStats((), (), 0)
    low = plan.target_dtype
    allow = plan.allow
    types = plan.types
    for name, op in sorted(plan.renames.items()):
        data = g.nodes[name]
        data["op"] = op
        data["dtypes"]["U"] = dt.FLOAT
        data.setdefault("changed_attrs", set()).add("U")
        data["dirty"] = True

    converted: list[tuple[str, TypeAttr]] = []
    casts: list[CastInfo] = []
    tf_style = 0
    order = ir.ordered_nodes(g)
    for name in order:
        nt = types.get(name)
        if nt is None:
            continue
        data = g.nodes[name]
        seq = 0
        for ta in nt.attrs:
            if get_dtype(nt.dtypes, ta) != dt.FLOAT:
                continue
            src_allow = (name, ta) in allow
            if src_allow:
                _set_dtype(data, ta, low)
                converted.append((name, ta))
                log.debug("changing type %s of %s node %s to %s", ta, data["op"], name, dt.name(low))
            for port, out_ta in enumerate(nt.outputs):
                if out_ta != ta:
                    continue
                cast_name = None
                rewired = []
                for dst, q, key in ir.consumers(g, name, port):
                    dst_types = types.get(dst)
                    dst_allow = dst_types is not None and (dst, dst_types.inputs[q]) in allow
                    if dst_allow == src_allow:
                        continue
                    if cast_name is None:
                        to_dtype = low if dst_allow else dt.FLOAT
                        k = 0
                        while f"{name}-{port}-{_token(to_dtype)}-{k}-AutoMixedPrecision" in g:
                            k += 1
                        cast_name = f"{name}-{port}-{_token(to_dtype)}-{k}-AutoMixedPrecision"
                        seq += 1
                        ir.add_node(
                            g, cast_name, op="Cast", device=data["device"],
                            order=(data["order"][0], data["order"][1] + seq),
                            dtypes={"SrcT": low if src_allow else dt.FLOAT, "DstT": to_dtype},
                        )
                        g.nodes[cast_name]["bools"] = {"Truncate": False}
                        ir.add_data_edge(g, name, port, cast_name, 0, None)
                        if dst_allow and data["op"] not in _CONST_OR_VARIABLE and not _reads_ref_var(g, name):
                            tf_style += 1
                        log.debug("inserting cast to %s at %s:%d", dt.name(to_dtype), name, port)
                    g.remove_edge(name, dst, key=key)
                    ir.add_data_edge(g, cast_name, 0, dst, q, None)
                    g.nodes[dst]["dirty"] = True
                    rewired.append(dst)
                if cast_name is not None:
                    casts.append(CastInfo(cast_name, name, port, low if not src_allow else dt.FLOAT,
                                          tuple(rewired)))
    return RewriteStats(tuple(converted), tuple(casts), tf_style)
