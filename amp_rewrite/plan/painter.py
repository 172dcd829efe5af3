"""The decision stage: paint every (node, type attribute) and return an explainable plan.

:func:`decide` is a pure function of a graph (IR), the effective op lists, a target and a
registry.  It reproduces the passes of TensorFlow's ``auto_mixed_precision`` optimizer, in
the same order and with the same rules (see ``shared/design/grappler_amp.md``):

0. *Gating.*  A node is processed iff it is not preserved (fetched) and is placed on a
   target device that profits from the precision.  ``FusedBatchNorm``/``FusedBatchNormGrad``
   on processed nodes become their V2 forms with ``U = float32``.
1. *Allow.*  Every type attribute of a processed allow-list op is painted allow (and, under
   ``UNSAFE_FORCE_ALL``, every attribute of every processed op that can be forced).
   Unlike TensorFlow, a float32 attribute with no low-precision kernel on its device stays
   float32 here (see ``KNOWN_DIFFERENCES.md``).
2. *Deny propagation.*  Deny spreads forward from deny-list ops through clear and infer ops
   whenever the path ends at a deny or infer op.
   TensorList clusters are then forced to one colour.
3. *Between allow.*  Clear and infer attributes on a forward path from an allow op to an
   allow op (and eligible) become allow.
4. *Infer after allow.*  An infer attribute fed directly by an allow one becomes allow,
   in node order (TensorFlow 2.20 and later run this pass in every mode; 2.16 to 2.19 only
   in their bfloat16 mode, see :func:`_infer_after_allow_in_every_mode`).
5. *Through clear.*  Clear attributes connected, in either direction, to an allow attribute
   through eligible clear attributes become allow.
6. *Clean-up.*  Allow-list attributes whose type cannot be the target type are removed.
   TensorList clusters are matched again, loop back edges (NextIteration -> Merge) are
   forced to one colour, and existing ``Cast`` nodes whose consumers are all allow become
   casts to the target type.

Every painted attribute records the rule that painted it and, for a propagated deny, the
attribute it came from, so a person can ask why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping

import networkx as nx

from ..graph import dtypes as dt
from ..graph import ir
from ..errors import InvalidGraphError
from .normalization import NormalizationInfo, find_normalizations
from ..graph.op_registry import KernelSpec, OpRegistry, OpSignature
from .targets import Target, parse_device_name
from ..graph.type_attrs import NodeTypes, TypeAttr, get_dtype, node_types, opaque_node_types
from ..graph.type_graph import build_type_graph_from_lists

__all__ = ["AttrDecision", "NodeDecision", "NodeDecisions", "Plan", "decide", "DecideOptions"]

log = logging.getLogger(__name__)

Precision = Literal["float16", "bfloat16"]
Color = Literal["allow", "deny", "infer", "clear", "none"]

_TL_READERS = frozenset({
    "TensorListConcat", "TensorListConcatV2", "TensorListGather", "TensorListGetItem",
    "TensorListPopBack", "TensorListStack",
})
_TL_WRITERS = frozenset({
    "TensorListFromTensor", "TensorListPushBack", "TensorListPushBackBatch", "TensorListScatter",
    "TensorListScatterV2", "TensorListScatterIntoExistingList", "TensorListSetItem",
    "TensorListSplit",
})
_SOURCE_OR_SINK = frozenset({
    "_Arg", "_Retval", "OptionalFromValue", "OptionalGetValue", "PartitionedCall", "Placeholder",
    "StatefulPartitionedCall",
})
_VARIABLE_OPS = frozenset({
    "Variable", "VariableV2", "AutoReloadVariable", "VarHandleOp", "ReadVariableOp",
    "_VarHandlesOp", "_ReadVariablesOp",
})
_BATCH_NORM_RENAMES = {"FusedBatchNorm": "FusedBatchNormV2", "FusedBatchNormGrad": "FusedBatchNormGradV2"}
_UNSEEN: Any = object()  # a cache miss, where None is a cached answer


@dataclass(frozen=True, slots=True)
class AttrDecision:
    """The decision for one type attribute: its colour, final dtype and why."""

    color: Color
    dtype: int
    reason: str
    source: str | None = None  # for a propagated deny: the deny node it came from


@dataclass(frozen=True, slots=True)
class NodeDecision:
    """The decisions for one node, and a one-line summary of them."""

    op: str
    category: str | None
    processed: bool
    attrs: Mapping[TypeAttr, AttrDecision]
    color: Color
    dtype: int
    reason: str


class NodeDecisions(Mapping[str, NodeDecision]):
    """Read-only mapping node name -> :class:`NodeDecision`, in graph order.

    Decisions are kept as flat per-vertex lists (strings and ints, which the garbage
    collector does not track) and a :class:`NodeDecision` is built when asked for: a plan for
    a million-node graph would otherwise hold millions of small objects that every full
    collection of the process has to walk.
    """

    __slots__ = ("_order", "_index", "_ops", "_cats", "_proc", "_start", "_vattr", "_vcolor",
                 "_vdtype", "_vreason", "_vsource", "_low")

    def __init__(self, order: list[str], ops: list[str], cats: list[str | None], proc: list[bool],
                 start: list[int], vattr: list[TypeAttr], vcolor: list[str], vdtype: list[int],
                 vreason: list[str], vsource: list[str | None], low: int,
                 index: dict[str, int] | None = None) -> None:
        self._order = order
        # ``index`` (name -> position in ``order``) when the caller has it already.
        self._index = index if index is not None else dict(zip(order, range(len(order))))
        self._ops, self._cats, self._proc, self._start = ops, cats, proc, start
        self._vattr, self._vcolor, self._vdtype = vattr, vcolor, vdtype
        self._vreason, self._vsource, self._low = vreason, vsource, low

    def __len__(self) -> int:
        return len(self._order)

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __getitem__(self, name: str) -> NodeDecision:
        i = self._index[name]
        attrs = {
            self._vattr[v]: AttrDecision(self._vcolor[v], self._vdtype[v], self._vreason[v], self._vsource[v])  # type: ignore[arg-type]
            for v in range(self._start[i], self._start[i + 1])
        }
        color, dtype, reason = self._summary(i)
        return NodeDecision(self._ops[i], self._cats[i], self._proc[i], attrs, color, dtype, reason)  # type: ignore[arg-type]

    def _summary(self, i: int) -> tuple[str, int, str]:
        """The node-level ``(color, dtype, reason)`` of node number ``i``: its first attribute
        that is allow in low precision, else its first deny one, else its first float one,
        else its first one.  Pure."""
        start, stop = self._start[i], self._start[i + 1]
        if start == stop:
            return "none", dt.INVALID, "node has no type attributes"
        color, dtype = self._vcolor, self._vdtype
        low = self._low
        for v in range(start, stop):
            if color[v] == "allow" and dtype[v] == low:
                return color[v], dtype[v], self._vreason[v]
        for v in range(start, stop):
            if color[v] == "deny":
                return color[v], dtype[v], self._vreason[v]
        for v in range(start, stop):
            if dtype[v] == dt.FLOAT or dtype[v] == low:
                return color[v], dtype[v], self._vreason[v]
        return color[start], dtype[start], self._vreason[start]

    def columns(self) -> tuple[list[str], list[str], list[int], list[TypeAttr], list[str], list[int],
                               list[str], list[str | None]]:
        """The flat lists behind the mapping, for readers of every node (the report):
        ``(order, ops, start, vattr, vcolor, vdtype, vreason, vsource)``; node ``i`` has the
        vertices ``range(start[i], start[i + 1])``.  Read-only."""
        return (self._order, self._ops, self._start, self._vattr, self._vcolor, self._vdtype,
                self._vreason, self._vsource)

    def summary(self, i: int) -> tuple[str, int, str]:
        """The node-level ``(color, dtype, reason)`` of node number ``i`` (see
        :meth:`columns`).  Pure."""
        return self._summary(i)

    def rows(self) -> Iterator[tuple[str, str, str, int, str, list[tuple[TypeAttr, str, int, str, str | None]]]]:
        """Every node as ``(name, op, color, dtype, reason, attrs)``, in graph order, with
        ``attrs`` a list of ``(type attr, color, dtype, reason, source)``: the content of
        ``self[name]`` without building its objects (the report reads every node).  Pure."""
        start = self._start
        vattr, vcolor, vdtype, vreason, vsource = (
            self._vattr, self._vcolor, self._vdtype, self._vreason, self._vsource)
        summary = self._summary
        for i, name in enumerate(self._order):
            attrs = [(vattr[v], vcolor[v], vdtype[v], vreason[v], vsource[v])
                     for v in range(start[i], start[i + 1])]
            color, dtype, reason = summary(i)
            yield name, self._ops[i], color, dtype, reason, attrs


@dataclass(frozen=True)
class DecideOptions:
    """Knobs of the decision stage that are not lists or targets."""

    force_all: bool = False
    #: Nodes that must keep every dtype (fetches, signature outputs, user exclusions).
    preserve: frozenset[str] = frozenset()
    #: The reason recorded for a preserved node that is not the generic one: the API puts
    #: here the ``--exclude`` pattern that excluded each node, so the report can name it.
    #: Reasons only; never changes what is decided.
    preserve_reasons: Mapping[str, str] = field(default_factory=dict, hash=False, compare=False)
    #: Reproduce TensorFlow 2.21's known bugs (KNOWN_DIFFERENCES.md) for exact parity,
    #: even where its output cannot run.
    tensorflow_bugs: bool = False
    #: ``"greedy"``: TensorFlow's passes.  ``"optimal"``: then re-colour the free vertices
    #: with the cost-aware minimum cut (:mod:`amp_rewrite.plan.optimal`).  ``"min-casts"``: the
    #: same cut, but every allow-list op converts (as in TensorFlow) and only the bytes moved
    #: by Casts are minimized.
    planner: Literal["greedy", "optimal", "min-casts"] = "greedy"
    #: Stop deny propagation at the apply ops of moment-based normalizations
    #: (:mod:`amp_rewrite.plan.normalization`).
    normalization_aware: bool = False
    #: Deny the ``Mean`` nodes of moment-based normalizations (mean and variance) even where
    #: the lists infer ``Mean``: every profile but TensorFlow's own keeps statistics float32.
    moments_float32: bool = False
    #: Let the cost model penalize matrices whose dimensions miss the device's multiple.
    shape_aware: bool = True
    #: The graph runs under XLA: the cost model prices Casts and element-wise ops as fused
    #: (:func:`amp_rewrite.plan.cost_model.node_cost`).  Only the cost-aware planners read it.
    compiled: bool = False


@dataclass(frozen=True)
class Plan:
    """What the rewrite must do to one graph; produced by :func:`decide`, read-only.

    ``allow`` holds the painted vertices (node, type attr) that run in low precision when
    float32; ``convert`` those whose dtype changes.  ``renames`` maps nodes to their new op
    (FusedBatchNorm -> V2).  ``types`` gives the ports of every type attr.
    """

    graph_name: str
    precision: Precision
    target_dtype: int
    skipped: str | None
    types: Mapping[str, NodeTypes] = field(default_factory=dict)
    allow: frozenset[tuple[str, TypeAttr]] = frozenset()
    convert: tuple[tuple[str, TypeAttr], ...] = ()
    renames: Mapping[str, str] = field(default_factory=dict)
    nodes: Mapping[str, NodeDecision] = field(default_factory=dict)
    deny_parent: Mapping[tuple[str, TypeAttr], tuple[str, TypeAttr]] = field(default_factory=dict)
    #: Ops missing from the op registry (custom ops) and how many nodes use each.
    unknown_ops: Mapping[str, int] = field(default_factory=dict)
    #: The ``optimal`` planner's summary (:class:`amp_rewrite.plan.optimal.PlacementSummary`).
    placement: Any = None
    #: Normalization apply nodes exempted from deny propagation -> the reason.
    normalized: Mapping[str, str] = field(default_factory=dict)

    def deny_path(self, node: str, ta: TypeAttr) -> list[tuple[str, TypeAttr]]:
        """The chain of attributes from the deny-list op to ``(node, ta)``, in data-flow order."""
        path = [(node, ta)]
        seen = {path[0]}
        while path[-1] in self.deny_parent:
            prev = self.deny_parent[path[-1]]
            if prev in seen:
                break
            seen.add(prev)
            path.append(prev)
        path.reverse()
        return path


#: The first TensorFlow release whose pass runs "infer after allow" (pass 4) in every mode.
#: Found by running each release's own pass (2.16 to 2.21) on MatMul -> Tanh: 2.16 to 2.19
#: convert the Tanh in their bfloat16 mode only, 2.20 and 2.21 in float16 (CUDA) mode too.
_INFER_AFTER_ALLOW_EVERY_MODE_SINCE = (2, 20)


def _infer_after_allow_in_every_mode(tf_version: str | None) -> bool:
    """Whether TensorFlow ``tf_version`` (``"2.16"``; ``None``: the newest) runs pass 4 in
    every mode rather than only in its bfloat16 mode."""
    if tf_version is None:
        return True
    major, minor = (int(part) for part in tf_version.split(".")[:2])
    return (major, minor) >= _INFER_AFTER_ALLOW_EVERY_MODE_SINCE


class _Lists:
    """Fast membership tests on the effective lists (any object with four frozensets)."""

    def __init__(self, lists: object) -> None:
        # The release the lists are for (OpLists.tf_version) decides how its pass behaves.
        self.tf_version: str | None = getattr(lists, "tf_version", None)
        self.allow = frozenset(getattr(lists, "allow"))
        self.infer = frozenset(getattr(lists, "infer"))
        self.deny = frozenset(getattr(lists, "deny"))
        self.clear = frozenset(getattr(lists, "clear"))
        # op -> its category, the first list (in this order) that holds it: one dict lookup
        # per node instead of up to four set lookups through getattr.
        self._category: dict[str, str] = {}
        for name in ("clear", "deny", "infer", "allow"):  # earlier lists win: written last
            self._category.update(dict.fromkeys(getattr(self, name), name))

    def category(self, op: str) -> str | None:
        return self._category.get(op)


#: id(lists object) -> (the object, its _Lists).  Building the frozensets and the category map
#: costs milliseconds and every graph of a call (and repeated calls) uses the same immutable
#: lists; the object is kept so its id cannot be reused while the entry exists.
_LISTS_CACHE: dict[int, tuple[object, _Lists]] = {}


def _lists_of(lists: object) -> _Lists:
    """The :class:`_Lists` of ``lists``, cached for the immutable ``OpLists``.  Does not
    modify ``lists``; other objects (which might be mutated between calls) are not cached."""
    from .lists import OpLists

    if not isinstance(lists, OpLists):
        return _Lists(lists)
    hit = _LISTS_CACHE.get(id(lists))
    if hit is not None and hit[0] is lists:
        return hit[1]
    if len(_LISTS_CACHE) >= 64:
        _LISTS_CACHE.clear()
    made = _Lists(lists)
    _LISTS_CACHE[id(lists)] = (lists, made)
    return made


def _inputs_by_port(pred: Mapping[str, Mapping[int, Mapping[str, Any]]]) -> list[tuple[str, int]]:
    """The data inputs ``(producer, port)`` of a node by destination port, from its
    predecessor dict (``g._pred[node]``), as :func:`amp_rewrite.graph.ir.data_inputs`."""
    by_port: dict[int, tuple[str, int]] = {}
    for u, keyed in pred.items():
        for q, d in keyed.items():
            if q >= 0:
                by_port[q] = (u, d["src_port"])
    return [by_port[q] for q in range(len(by_port))]


def _kernel_matches(
    kernels: Iterable[KernelSpec], label: str, types: Mapping[str, int | tuple[int, ...]]
) -> bool:
    """Whether one of ``kernels`` accepts a node with these type attrs and kernel label."""
    for kernel in kernels:
        if kernel.label != label:
            continue
        for attr, allowed in kernel.constraints:
            val = types.get(attr)
            if val is None:
                break
            if isinstance(val, tuple):
                if not all(t in allowed for t in val):
                    break
            elif val not in allowed:
                break
        else:
            return True
    return False


class _Painter:
    """State of one run of the painting passes over one graph.  Internal to :func:`decide`.

    Per-node facts live in lists aligned with :attr:`order` (``_ops_l``, ``_proc_l``...) and
    per-vertex facts in lists indexed by vertex (``v_cat``, ``_v_node``...).  The passes read
    those: on graphs of a million nodes each lookup in a name-keyed dict of that size misses
    the CPU caches, and such lookups dominated the run time.  The name-keyed dicts ``ops``,
    ``processed`` and ``inputs`` (read by the optimal planner) are built on first use.
    """

    def __init__(
        self,
        g: nx.MultiDiGraph,
        lists: _Lists,
        target: Target,
        precision: Precision,
        registry: OpRegistry,
        options: DecideOptions,
    ) -> None:
        self.g = g
        self.lists = lists
        self.target = target
        self.precision = precision
        self.low = dt.HALF if precision == "float16" else dt.BFLOAT16
        self.registry = registry
        self.options = options
        self.signatures: Mapping[str, OpSignature] = g.graph.get("signatures", {})
        # The nodes in order, with their attribute and predecessor dicts (read by build()).
        self.order, self._datas, _, self._preds = ir.ordered_entries(g, succ=False)
        self.allow: set[int] = set()
        self.deny: set[int] = set()
        self.reason: dict[int, str] = {}
        self.deny_parent: dict[int, int] = {}
        self.kernel_missing: set[int] = set()
        self._kernel_cache: dict[tuple[object, ...], bool] = {}
        self._supports_cache: dict[tuple[object, ...], bool] = {}
        self._has_kernel_cache: dict[tuple[object, ...], bool] = {}
        self.unknown_ops: dict[str, int] = {}
        self.placement: Any = None
        self.normalized: dict[str, str] = {}
        #: What :func:`find_normalizations` found (pass 2), for the optimal planner.
        self.norm_info: NormalizationInfo | None = None
        self.had_allow = False  # pass 1 painted something (the planner may undo it all)
        self._ops: dict[str, str] | None = None
        self._processed: dict[str, bool] | None = None
        self._inputs: dict[str, list[tuple[str, int]]] | None = None
        self._texts: dict[tuple[str, object], str] = {}  # see _text()

    # ------------------------------------------------------------------ name-keyed views

    @property
    def ops(self) -> dict[str, str]:
        """Node -> op, FusedBatchNorm already renamed.  Built on first use."""
        if self._ops is None:
            self._ops = dict(zip(self.order, self._ops_l))
        return self._ops

    @property
    def processed(self) -> dict[str, bool]:
        """Node -> whether it is rewritten at all (not preserved, on an eligible device)."""
        if self._processed is None:
            self._processed = dict(zip(self.order, self._proc_l))
        return self._processed

    @property
    def inputs(self) -> dict[str, list[tuple[str, int]]]:
        """Node -> its data inputs as ``(producer, port)`` in port order."""
        if self._inputs is None:
            self._inputs = dict(zip(self.order, self._ins_l))
        return self._inputs

    # ------------------------------------------------------------------ model construction

    def build(self) -> None:
        """Per-node facts (op, processed, data inputs, type ids), the type graph and the
        per-vertex facts the passes read.  Reads ``self.g`` only.

        One pass over the nodes fills lists in node order; the per-vertex lists are expanded
        from them by C-level passes.  Each node's dicts are read once, while in the cache.
        """
        order = self.order
        preserve = self.options.preserve
        node_is_eligible = self.target.node_is_eligible
        precision = self.precision
        registry_op = self.registry.op
        signatures = self.signatures
        renames: dict[str, str] = {}
        unknown_ops = self.unknown_ops
        # Graphs repeat a handful of device strings over thousands of nodes.
        eligible: dict[str, bool] = {}
        sigs: dict[str, OpSignature | None] = {}
        # Most nodes share their op and attrs with many others: expand each signature once.
        type_cache: dict[tuple[object, ...], list[tuple[Mapping, Mapping, NodeTypes]]] = {}
        ops_l: list[str] = []
        proc_l: list[bool] = []
        ins_l: list[list[tuple[str, int]]] = []
        types_l: list[NodeTypes | None] = []
        device_l: list[str] = []
        label_l: list[str] = []
        unknown: list[int] = []  # positions of nodes whose op is not in the registry
        for name, data, pred in zip(order, self._datas, self._preds):  # type: ignore[arg-type]
            device = data["device"]
            ok = eligible.get(device)
            if ok is None:
                ok = eligible[device] = node_is_eligible(device, precision)
            ok = ok and name not in preserve
            op = data["op"]
            if ok and op in _BATCH_NORM_RENAMES:
                op = _BATCH_NORM_RENAMES[op]
                renames[name] = op
            # The data inputs by port (ir.data_inputs, inlined: it runs for every node).
            # Edge keys are the destination port for data edges, negative for control ones.
            # Import adds a node's edges port by port, so they are usually met in port order
            # and the list is made directly; otherwise they are put in order by port.
            ins = []
            if pred:
                for u, keyed in pred.items():
                    for q, d in keyed.items():
                        if q == len(ins):
                            ins.append((u, d["src_port"]))
                        elif q >= 0:
                            ins = _inputs_by_port(pred)
                            break
                    else:
                        continue
                    break
            ops_l.append(op)
            proc_l.append(ok)
            ins_l.append(ins)
            device_l.append(device)
            label_l.append(data["label"])
            sig = sigs.get(op, _UNSEEN)
            if sig is _UNSEEN:
                sig = sigs[op] = registry_op(op) or signatures.get(op)
            if sig is None:
                unknown.append(len(types_l))
                types_l.append(None)
                unknown_ops[op] = unknown_ops.get(op, 0) + 1
                continue
            dtypes = data["dtypes"]
            if name in renames:
                dtypes = {**dtypes, "U": dt.FLOAT}
            ints = data["ints"]
            attr_names = data["attr_names"]
            # NodeTypes is a function of these (and the signature, fixed by the op); nodes
            # are first grouped by the hashable part, then the dicts compared (no per-node
            # tuples of their items to build and hash).
            key = (op, attr_names, len(ins))
            for seen_dtypes, seen_ints, nt in type_cache.get(key, ()):
                if seen_dtypes == dtypes and seen_ints == ints:
                    break
            else:
                nt = node_types(name, op, dtypes, ints, attr_names, len(ins), sig)
                type_cache.setdefault(key, []).append((dtypes, ints, nt))
            types_l.append(nt)
        self.renames = renames
        self._ops_l = ops_l
        self._op_set = set(ops_l)
        self._proc_l = proc_l
        self._ins_l = ins_l
        self._device_l = device_l
        self._label_l = label_l
        #: node name -> position in ``order`` (shared with the plan's NodeDecisions).
        self._index = dict(zip(order, range(len(order))))
        if unknown:
            # Known nodes first, then the others (in order), as they are described.
            self.types = {n: t for n, t in zip(order, types_l) if t is not None}
            self._describe_unknown([order[i] for i in unknown])
            for i in unknown:
                types_l[i] = self.types[order[i]]
        else:
            self.types = dict(zip(order, types_l))  # type: ignore[arg-type]
        self._types_l: list[NodeTypes] = types_l  # type: ignore[assignment]
        for op, count in sorted(unknown_ops.items()):
            log.warning(
                "op %s is not in TensorFlow's op registry (a custom op?); its %d node(s) stay "
                "float32", op, count,
            )
        self.tg = build_type_graph_from_lists(order, self._types_l, ins_l, self._index)
        # Per-vertex copies of per-node facts (vertices of a node are consecutive, see
        # build_type_graph), made by C-level passes rather than a loop per node.
        #: first vertex of each node, then the number of vertices
        self._bases = self.tg.bases
        #: vertex -> position of its node in ``order``
        self._v_node = v_node = self.tg.node_pos
        # Each node's list category (the C-level dict lookup behind _Lists.category).
        self._cats_l = list(map(self.lists._category.get, ops_l))
        self.v_cat = list(map(self._cats_l.__getitem__, v_node))
        self.v_proc = list(map(proc_l.__getitem__, v_node))
        # The dtypes of a node's vertices depend only on its NodeTypes, shared by the nodes
        # of one op and attrs (id() is stable: ``_types_l`` holds the objects).
        dtypes_of: dict[int, list[int]] = {}
        for nt in dict(zip(map(id, self._types_l), self._types_l)).values():
            dtypes_of[id(nt)] = [get_dtype(nt.dtypes, ta) for ta in nt.attrs]
        self.v_dtype = list(chain.from_iterable(map(dtypes_of.__getitem__, map(id, self._types_l))))
        #: id(NodeTypes) -> whether one of its attrs is quantized (pass 6 drops such nodes)
        self._quantized = {k: any(d in dt.QUANTIZED for d in ds) for k, ds in dtypes_of.items()}

    def _describe_unknown(self, unknown: list[str]) -> None:
        """Give each node of ``unknown`` (ops missing from the registry) an opaque
        description from the dtypes seen on its edges.  Adds to ``self.types``."""
        types = self.types
        for name in unknown:
            in_dtypes = []
            for src, port in self._ins_l[self._index[name]]:
                t = types.get(src)
                in_dtypes.append(
                    get_dtype(t.dtypes, t.outputs[port]) if t and port < len(t.outputs) else dt.INVALID
                )
            n_out = 0
            out_dtype: dict[int, int] = {}
            for _, v, d in self.g.out_edges(name, data=True):
                port = d["src_port"]
                if port < 0:
                    continue
                n_out = max(n_out, port + 1)
                t = types.get(v)
                if t is not None and d["dst_port"] < len(t.inputs):
                    out_dtype.setdefault(port, get_dtype(t.dtypes, t.inputs[d["dst_port"]]))
            types[name] = opaque_node_types(
                in_dtypes, [out_dtype.get(p, dt.INVALID) for p in range(n_out)], self.g._node[name]["dtypes"]
            )

    # ------------------------------------------------------------------ predicates

    def is_f32(self, v: int) -> bool:
        return self.v_dtype[v] == dt.FLOAT

    def supports_dtype(self, v: int) -> bool:
        """TensorFlow's ``SupportsF16DataType``: the op (global registry) accepts the type."""
        i = self._v_node[v]
        ta = self.tg.attr[v]
        op = self._ops_l[i]
        known = self._types_l[i].known
        # The answer depends on the op and the attr only (and on ``known``, a property of the
        # op too); graphs ask it for thousands of vertices of a few ops.
        key = (op, ta, known)
        cached = self._supports_cache.get(key)
        if cached is None:
            cached = self._supports_cache[key] = self._supports_dtype(op, known, ta)
        return cached

    def _supports_dtype(self, op: str, known: bool, ta: TypeAttr) -> bool:
        if not known:
            return False
        sig = self.registry.op(op)
        if sig is None:
            return False
        if ta.is_fixed:
            return ta.fixed == self.low
        spec = sig.attrs.get(ta.attr)
        if spec is None:
            return False
        return spec.allowed is None or self.low in spec.allowed

    def has_kernel(self, v: int) -> bool:
        """TensorFlow's ``HasF16Kernel``: a kernel accepts the node with ``v`` retyped."""
        ta = self.tg.attr[v]
        if ta.is_fixed:
            return False
        i = self._v_node[v]
        nt = self._types_l[i]
        device = self._device_l[i]
        label = self._label_l[i]
        # Everything below depends on the node's op and dtypes (one NodeTypes object per op
        # and attrs; id() is stable while self._types_l holds it), its device, its kernel
        # label and ``ta``: look that up first, before parsing the device name.
        quick = (id(nt), ta, device, label)
        cached = self._has_kernel_cache.get(quick)
        if cached is None:
            cached = self._has_kernel_cache[quick] = self._has_kernel(self._ops_l[i], nt, ta, device, label)
        return cached

    def _has_kernel(self, op: str, nt: NodeTypes, ta: TypeAttr, device: str, label: str) -> bool:
        device = device or self.target.default_device().name
        parsed = parse_device_name(device)
        if parsed is None or parsed.type is None:
            return False
        types = dict(nt.dtypes)
        value = types.get(ta.attr)
        if value is None:
            return False
        if ta.index < 0:
            types[ta.attr] = self.low
        else:
            lst = list(value) if isinstance(value, tuple) else []
            if ta.index >= len(lst):
                return False
            lst[ta.index] = self.low
            types[ta.attr] = tuple(lst)
        key = (op, parsed.type, label, tuple(types.items()))
        cached = self._kernel_cache.get(key)
        if cached is not None:
            return cached
        # Like TensorFlow's kernel lookup, fall back to DEVICE_DEFAULT registrations (used by
        # GPU and pluggable devices for ops such as IdentityN) when no kernel of the device
        # type matches.
        found = _kernel_matches(self.registry.kernels(op, parsed.type), label, types) or (
            _kernel_matches(self.registry.kernels(op, "DEFAULT"), label, types)
        )
        self._kernel_cache[key] = found
        return found

    def supports(self, v: int) -> bool:
        return self.supports_dtype(v) and self.has_kernel(v)

    def reads_ref_var(self, name: str) -> bool:
        """Identity of a ref variable, or Enter of such a read (TensorFlow keeps them float)."""
        ops = self._ops_l
        index = self._index
        seen = set()
        while name not in seen:
            seen.add(name)
            i = index.get(name)
            if i is None:
                return False
            op = ops[i]
            ins = self._ins_l[i]
            if not ins:
                return False
            src = ins[0][0]
            if op == "Identity":
                j = index.get(src)
                return j is not None and ops[j] in ("Variable", "VariableV2")
            if op == "Enter":
                name = src
                continue
            return False
        return False

    def can_force(self, name: str) -> bool:
        op = self._ops_l[self._index[name]]
        if op in ("Const", "SoftmaxCrossEntropyWithLogits"):
            return False
        if self.g.nodes[name].get("funcs") or op in self.g.graph.get("signatures", {}):
            # A call's Tin/Tout must match the callee's signature, which stays float32: forcing
            # them gives a graph that does not run ("Expects arg[0] to be float but half").
            return False
        sig = self.registry.op(op)
        return sig is not None and not sig.is_stateful and not sig.has_ref_args()

    def is_boundary_cast(self, name: str) -> bool:
        """Whether ``name`` is a Cast between float32 and the target low type (in either
        direction): a precision boundary, such as the Casts a previous rewrite inserted.
        Forcing its float32 side to low precision (UNSAFE_FORCE_ALL) would turn it into a
        Cast from low to low and need a new Cast beside it, so a second rewrite would add
        Casts to the first one's output (known difference KD-5)."""
        if self._ops_l[self._index[name]] != "Cast":
            return False
        types = {self.tg.attr[v].attr: self.v_dtype[v] for v in self.tg.by_node.get(name, ())}
        return {types.get("SrcT"), types.get("DstT")} == {dt.FLOAT, self.low}

    # ------------------------------------------------------------------ TensorList helpers

    def tl_float(self, name: str) -> int | None:
        if "TensorList" not in self._ops_l[self._index[name]]:
            return None
        for v in self.tg.by_node[name]:
            ta = self.tg.attr[v]
            if ta.attr and ta.index < 0 and self.v_dtype[v] == dt.FLOAT:
                return v
        return None

    def tensor_list_clusters(self) -> list[list[str]]:
        """Find float32 TensorList clusters; deny those that cross a boundary (TF's D0)."""
        tg = self.tg
        comp: dict[int, int] = {}
        clusters: list[list[str]] = []
        # Only TensorList ops have a float element type (tl_float); most graphs have none, so
        # the scan over vertices is limited to their nodes (in order, as the vertices are).
        tl_ops = {op for op in self._op_set if "TensorList" in op}
        if not tl_ops:
            return clusters
        bases = self._bases
        candidates = (v for i, op in enumerate(self._ops_l) if op in tl_ops
                      for v in range(bases[i], bases[i + 1]))
        for r in candidates:
            name = tg.node[r]
            ta = tg.attr[r]
            if not (self.v_proc[r] and ta.is_fixed and ta.fixed == dt.VARIANT):
                continue
            rf = self.tl_float(name)
            if rf is None:
                continue
            if r not in comp:
                cid = len(clusters)
                stack = [r]
                comp[r] = cid
                visited = []
                while stack:
                    x = stack.pop()
                    visited.append(x)
                    for y in tg.fanin[x] + tg.fanout[x]:
                        if y not in comp:
                            comp[y] = cid
                            stack.append(y)
                members: dict[str, None] = {}
                for x in sorted(visited):
                    members.setdefault(tg.node[x], None)
                clusters.append(list(members))
            members_list = clusters[comp[r]]
            for member in members_list:
                i = self._index[member]
                op = self._ops_l[i]
                if self.tl_float(member) is not None and not self._proc_l[i]:
                    why = f"TensorList cluster includes {member!r}, which is not rewritten"
                elif op in _SOURCE_OR_SINK or op in self.signatures:
                    why = f"TensorList handle crosses {op} node {member!r}"
                elif self.g._node[member]["funcs"] and not self.options.tensorflow_bugs:
                    # Known difference KD-3: TensorFlow lets a list cross While/If/Case and
                    # paints it half while the function body still reads float elements.
                    why = (f"[KD-3] TensorList handle crosses {op} node {member!r}, "
                           "whose functions read its elements as float32")
                else:
                    continue
                if rf not in self.deny:
                    self.deny.add(rf)
                    self.reason[rf] = why
        return [
            [m for m in members if self.tl_float(m) is not None] for members in clusters
        ]

    def tensor_list_edges(self, clusters: list[list[str]]) -> None:
        """Add implicit writer -> reader edges between element-type vertices."""
        tg = self.tg
        ops = self._ops_l
        index = self._index
        for members in clusters:
            for reader in members:
                if ops[index[reader]] not in _TL_READERS:
                    continue
                start = tg.find(reader, TypeAttr("", -1, dt.VARIANT))
                if start is None or not self.v_proc[start]:
                    continue
                target = self.tl_float(reader)
                seen = {start}
                stack = [start]
                while stack:
                    x = stack.pop()
                    writer = tg.node[x]
                    if ops[index[writer]] in _TL_WRITERS:
                        wf = self.tl_float(writer)
                        if wf is not None and target is not None:
                            tg.add_edge(wf, target)
                    for y in tg.fanin[x]:
                        if y not in seen and self.v_proc[y]:
                            seen.add(y)
                            stack.append(y)
        if clusters:  # the adjacency lists are finalized already unless edges were added
            tg.finalize()

    def tensor_list_match(self, clusters: list[list[str]]) -> None:
        for members in clusters:
            vs = [v for v in (self.tl_float(m) for m in members) if v is not None]
            if any(v in self.deny for v in vs):
                for v in vs:
                    self.allow.discard(v)
                    if v not in self.deny:
                        self.deny.add(v)
                        self.reason[v] = "a sibling in its TensorList cluster is deny"
            elif any(v in self.allow for v in vs):
                for v in vs:
                    if v not in self.allow:
                        self.allow.add(v)
                        self.reason[v] = "a sibling in its TensorList cluster is allow"

    # ------------------------------------------------------------------ the passes

    def run(self) -> None:
        tg = self.tg
        n = len(tg)
        cat = self.v_cat
        proc = self.v_proc
        v_dtype = self.v_dtype
        fanin_of = tg.fanin
        fanout_of = tg.fanout
        node_of = tg.node
        v_node = self._v_node
        ops_l = self._ops_l
        allow = self.allow
        deny = self.deny
        reason = self.reason
        FLOAT = dt.FLOAT
        supports_dtype = self.supports_dtype
        supports = self.supports
        bugs = self.options.tensorflow_bugs
        force_all = self.options.force_all
        # Reasons that name only an op are made once per op and shared by its vertices.
        op_reasons: dict[tuple[str, str], str] = {}

        def op_reason(v: int, template: str) -> str:
            op = ops_l[v_node[v]]
            text = op_reasons.get((template, op))
            if text is None:
                text = op_reasons[(template, op)] = template.format(op)
            return text

        clusters = self.tensor_list_clusters()
        self.tensor_list_edges(clusters)

        # Pass 1: allow-list ops (and everything forceable under UNSAFE_FORCE_ALL).
        roots = []
        for v in range(n):
            if not proc[v]:
                continue
            if cat[v] == "allow":
                if (not bugs and v_dtype[v] == FLOAT and supports_dtype(v)
                        and not self.has_kernel(v)):
                    # Known difference KD-1: TensorFlow converts it and the graph cannot run.
                    self.kernel_missing.add(v)
                    continue
                roots.append(v)
                allow.add(v)
                reason[v] = op_reason(v, "{} is on the allow list")
            elif force_all and not bugs and self.is_boundary_cast(node_of[v]):
                reason[v] = (f"[KD-5] a Cast between float32 and {dt.name(self.low)} is a "
                             "precision boundary: UNSAFE_FORCE_ALL does not force it")
            elif force_all and self.can_force(node_of[v]) and (bugs or supports(v)):
                # Known difference KD-4: TensorFlow also paints attributes the op cannot take in
                # low precision (SparseMatMul's fixed float output, its float/bfloat16-only Ta),
                # which fails the pass or yields a graph that does not import; we skip them.
                allow.add(v)
                reason[v] = "UNSAFE_FORCE_ALL paints every op that can be forced"
        if not allow:
            return
        self.had_allow = True

        # Pass 2: deny propagates forward through clear/infer when it reaches deny/infer.
        # Normalization-aware: not from a statistic into the op that applies it.  Moments
        # kept float32: their Mean nodes are denied like deny-list ops.
        aware, pin = self.options.normalization_aware, self.options.moments_float32
        info = self.norm_info = find_normalizations(self.g, self.inputs) if aware or pin else None
        blocked = self._normalization_blocks(info) if aware and info is not None else set()
        moments = ({v for name in info.moments for v in tg.by_node.get(name, ()) if self.is_f32(v)}
                   if pin and info is not None else set())
        if not force_all:
            reach: set[int] = {v for v in range(n) if cat[v] in ("deny", "infer")}
            stack = list(reach)
            while stack:
                x = stack.pop()
                for y in fanin_of[x]:
                    if y not in reach and cat[y] == "clear":
                        reach.add(y)
                        stack.append(y)
            for r in range(n):
                if (cat[r] != "deny" and r not in moments) or r in deny:
                    continue
                deny.add(r)
                if cat[r] == "deny":
                    reason[r] = op_reason(r, "{} is on the deny list")
                else:
                    # A profile may let Mean run in low precision (its kernels accumulate in
                    # float32), but a normalization's statistics stay float32 regardless.
                    reason[r] = (f"{ops_l[v_node[r]]} computes a normalization's moment statistic: "
                                 "statistics stay float32 whatever the lists say")
                stack = [r]
                while stack:
                    x = stack.pop()
                    for y in fanout_of[x]:
                        if y not in deny and y in reach and (not blocked or (x, y) not in blocked):
                            deny.add(y)
                            self.deny_parent[y] = x
                            reason[y] = "deny propagated"
                            stack.append(y)

        self.tensor_list_match(clusters)

        # Pass 3: clear/infer between two allow-list ops.
        def elig3(x: int) -> bool:
            return (
                cat[x] in ("clear", "infer")
                and x not in deny
                and proc[x]
                and v_dtype[x] == FLOAT
                and supports(x)
            )

        down: set[int] = set(roots)
        stack = list(roots)
        while stack:
            x = stack.pop()
            for y in fanout_of[x]:
                if y not in down and cat[y] in ("clear", "infer") and elig3(y):
                    down.add(y)
                    stack.append(y)
        up: set[int] = set()
        between = {c: f"{c} op on a path between allow-list ops" for c in ("clear", "infer")}
        for r in roots:
            if r in up:
                continue
            up.add(r)
            stack = [r]
            while stack:
                x = stack.pop()
                for y in fanin_of[x]:
                    if y in down and y not in up:
                        up.add(y)
                        if y not in allow:
                            allow.add(y)
                            reason[y] = between[cat[y]]  # type: ignore[index]
                        stack.append(y)

        # Pass 4: infer ops fed directly by allow, in node order.  The design notes say this
        # pass is bfloat16-only; TensorFlow 2.20 and later run it in every mode (seen in their
        # logs and outputs), older releases only in their bfloat16 mode.
        pass4 = self.precision == "bfloat16" or _infer_after_allow_in_every_mode(self.lists.tf_version)
        for v in range(n if pass4 else 0):
            if not (proc[v] and v not in deny and v not in allow and cat[v] == "infer"
                    and v_dtype[v] == FLOAT and supports_dtype(v)):
                continue
            fanin = fanin_of[v]
            if any(f in deny for f in fanin):
                continue
            src = next((f for f in fanin if f in allow), None)
            if src is not None:
                allow.add(v)
                reason[v] = f"infer op fed by allow node {node_of[src]!r}"

        # Pass 5: spread allow through connected clear ops (both directions).
        def elig5(x: int) -> bool:
            return (
                cat[x] == "clear"
                and x not in allow
                and x not in deny
                and proc[x]
                and v_dtype[x] == FLOAT
                and supports(x)
                and not self._reads_ref_var_at(v_node[x])
            )

        seen: set[int] = set()
        for r in range(n):
            if not proc[r] or r in seen or r not in allow:
                continue
            seen.add(r)
            stack = [r]
            why = None
            while stack:
                x = stack.pop()
                # Both directions; the order does not matter (every vertex reachable from r
                # through eligible clear vertices is painted, with r as the reason).
                for neighbours in (fanin_of[x], fanout_of[x]):
                    for y in neighbours:
                        if y not in seen and cat[y] == "clear" and elig5(y):
                            seen.add(y)
                            allow.add(y)
                            if why is None:
                                why = f"clear op connected to allow node {node_of[r]!r}"
                            reason[y] = why
                            stack.append(y)

        # Pass 6: drop allow-list attributes that cannot take the type.
        quantized = self._quantized
        types_l = self._types_l
        for v in sorted(v for v in allow if cat[v] == "allow"):
            if not supports_dtype(v):
                allow.discard(v)
                reason[v] = f"{ops_l[v_node[v]]} does not accept {self.precision} for {tg.attr[v]}"
            elif quantized[id(types_l[v_node[v]])]:
                allow.discard(v)
                reason[v] = "quantized node"

        self.tensor_list_match(clusters)
        self.recurrent_match()
        self.existing_casts()
        if self.options.planner in ("optimal", "min-casts") and not force_all:
            from .optimal import place_optimally  # deferred: imports the cost model

            self.placement = place_optimally(self, clusters, self.options.shape_aware,
                                             goal=self.options.planner, compiled=self.options.compiled)

    def _reads_ref_var_at(self, i: int) -> bool:
        """:meth:`reads_ref_var` for the node at position ``i`` of ``order``."""
        op = self._ops_l[i]
        if op != "Identity" and op != "Enter":
            return False  # what reads_ref_var answers for every other op
        return self.reads_ref_var(self.order[i])

    def _normalization_blocks(self, info: NormalizationInfo) -> set[tuple[int, int]]:
        """(statistic vertex, apply vertex) pairs along which deny must not propagate.
        Records each apply node's reason in :attr:`normalized`."""
        tg = self.tg
        blocked: set[tuple[int, int]] = set()
        for name, (ports, norm) in sorted(info.apply.items()):
            types = self.types.get(name)
            if types is None or name not in self.inputs:
                continue
            for q in sorted(ports):
                src, sp = self.inputs[name][q]
                src_types = self.types.get(src)
                if src_types is None or sp >= len(src_types.outputs) or q >= len(types.inputs):
                    continue
                blocked.add((tg.index[(src, src_types.outputs[sp])], tg.index[(name, types.inputs[q])]))
            self.normalized[name] = (
                f"applies the statistics of normalization {norm.mean!r}/{norm.variance!r} to a "
                "full-size tensor: bounded by construction, so deny does not propagate from the "
                "statistics (they stay float32)"
            )
        return blocked

    def _nodes_with_op(self, op: str) -> list[int]:
        """Positions in ``order`` of the nodes whose (renamed) op is ``op``, in order."""
        if op not in self._op_set:  # most graphs lack the op asked for
            return []
        return [i for i, o in enumerate(self._ops_l) if o == op]

    def recurrent_match(self) -> None:
        """Force NextIteration and the Merge nodes it feeds to one colour."""
        tg = self.tg
        ops_l = self._ops_l
        index = self._index
        for i in self._nodes_with_op("NextIteration"):
            name = self.order[i]
            t_attr = TypeAttr("T", -1, 0)
            ni = tg.find(name, t_attr)
            if ni is None:
                continue
            merges = []
            for dst, _, _ in ir.consumers(self.g, name, 0):
                dst_op = ops_l[index[dst]]
                if dst_op != "Merge":
                    raise InvalidGraphError(
                        f"NextIteration node {name!r} feeds {dst_op} node {dst!r}; "
                        "a loop back edge must end at a Merge",
                        node=name,
                    )
                merges.append(tg.vertex(dst, t_attr))
            if not merges:
                # TensorFlow paints a dangling NextIteration unconditionally.
                self.allow.add(ni)
                self.reason.setdefault(ni, "dangling NextIteration (no Merge to match)")
                continue
            if all(m in self.allow for m in merges):
                if ni not in self.allow:
                    self.allow.add(ni)
                    self.reason[ni] = "loop back edge: its Merge is allow"
            else:
                for v in merges + [ni]:
                    if v in self.allow:
                        self.allow.discard(v)
                        self.reason[v] = "loop back edge: NextIteration and Merge must match"

    def existing_casts(self) -> None:
        """An existing Cast to float32 whose consumers are all allow casts to the target."""
        tg = self.tg
        for i in self._nodes_with_op("Cast"):
            name = self.order[i]
            if name in self.options.preserve and not self.options.tensorflow_bugs:
                # Known difference KD-2: a fetched Cast keeps its dtype.
                continue
            dst_attr = TypeAttr("DstT", -1, 0)
            v = tg.find(name, dst_attr)
            if v is None or self.v_dtype[v] != dt.FLOAT:
                continue
            cons = ir.consumers(self.g, name, 0)
            if not cons:
                continue
            if all(tg.vertex(c, self.types[c].inputs[q]) in self.allow for c, q, _ in cons):
                self.allow.add(v)
                self.reason[v] = "existing Cast feeds only allow consumers"

    # ------------------------------------------------------------------ plan

    def plan(self, graph_name: str) -> Plan:
        tg = self.tg
        node_of = tg.node
        attr_of = tg.attr
        painted = self.allow
        # The pairs are made by C-level passes; iterating the same set twice gives the same
        # order, so the frozenset is built exactly as from a generator over the set.
        allow = frozenset(zip(map(node_of.__getitem__, painted), map(attr_of.__getitem__, painted)))
        v_dtype = self.v_dtype
        f32 = [v for v in sorted(painted) if v_dtype[v] == dt.FLOAT]
        convert = tuple(zip(map(node_of.__getitem__, f32), map(attr_of.__getitem__, f32)))
        fields = list(map(self._decision_function(), range(len(tg))))
        if fields:
            vcolor, vdtype, vreason, vsource = map(list, zip(*fields))
        else:
            vcolor, vdtype, vreason, vsource = [], [], [], []
        del fields
        order = self.order
        ops_l = self._ops_l
        bases = self._bases
        if log.isEnabledFor(logging.DEBUG):
            for i, name in enumerate(order):
                for v in range(bases[i], bases[i + 1]):
                    if vcolor[v] in ("allow", "deny"):
                        log.debug("%s: %s %s of %s node %s: %s", graph_name or "graph",
                                  vcolor[v].upper(), attr_of[v], ops_l[i], name, vreason[v])
        nodes = NodeDecisions(
            order, ops_l, self._cats_l, self._proc_l, bases, attr_of,
            vcolor, vdtype, vreason, vsource, self.low, index=self._index,
        )
        vert = lambda v: (node_of[v], attr_of[v])  # noqa: E731
        parent = {vert(k): vert(p) for k, p in self.deny_parent.items()}
        return Plan(
            graph_name=graph_name,
            precision=self.precision,
            target_dtype=self.low,
            skipped=None,
            types=self.types,
            allow=allow,
            convert=convert,
            renames=dict(self.renames),
            nodes=nodes,
            deny_parent=parent,
            unknown_ops=dict(sorted(self.unknown_ops.items())),
            placement=self.placement,
            normalized=dict(sorted(self.normalized.items())),
        )

    def _text(self, template: str, arg: object) -> str:
        """``template.format(arg)``, made once per (template, arg): thousands of vertices
        share each of these reasons, and one string object serves them all."""
        key = (template, arg)
        text = self._texts.get(key)
        if text is None:
            text = self._texts[key] = template.format(arg)
        return text

    def _attr_decision(self, v: int) -> AttrDecision:
        """The decision for vertex ``v`` (after :meth:`run`).  Pure."""
        return AttrDecision(*self._attr_decision_fields(v))  # type: ignore[arg-type]

    def _attr_decision_fields(self, v: int) -> tuple[str, int, str, str | None]:
        """``(color, dtype, reason, source)`` of vertex ``v``: :meth:`_attr_decision`'s fields
        without the object, as :meth:`plan` stores them in flat lists.  Pure."""
        return self._decision_function()(v)

    def _decision_function(self) -> Callable[[int], tuple[str, int, str, str | None]]:
        """:meth:`_attr_decision_fields` as a function with the painter's state bound once:
        :meth:`plan` calls it for every vertex, and attribute lookups on ``self`` per call
        were a good part of its cost."""
        node_of = self.tg.node
        v_dtype = self.v_dtype
        v_cat = self.v_cat
        v_node = self._v_node
        ops_l = self._ops_l
        types_l = self._types_l
        proc_l = self._proc_l
        allow = self.allow
        deny = self.deny
        deny_parent = self.deny_parent
        reasons = self.reason
        normalized = self.normalized
        kernel_missing = self.kernel_missing
        preserve = self.options.preserve
        preserve_reasons = self.options.preserve_reasons
        low = self.low
        precision = self.precision
        text = self._text
        FLOAT = dt.FLOAT

        def fields(v: int) -> tuple[str, int, str, str | None]:
            name = node_of[v]
            dtype = v_dtype[v]
            if v in allow:
                final = low if dtype == FLOAT else dtype
                reason = reasons.get(v, "allow")
                if normalized and name in normalized:
                    reason = f"{reason}; normalization-aware: {normalized[name]}"
                return "allow", final, reason, None
            if v in deny:
                reason = reasons.get(v, "deny")
                source = None
                if v in deny_parent:
                    root = v
                    hops = []
                    while root in deny_parent and len(hops) < 10_000:
                        root = deny_parent[root]
                        hops.append(root)
                    source = node_of[root]
                    via = [node_of[h] for h in reversed(hops[:-1])]
                    reason = f"downstream of deny node {source!r} ({ops_l[v_node[root]]})" + (
                        " via " + " -> ".join(repr(x) for x in via[-6:]) if via else ""
                    )
                return "deny", dtype, reason, source
            cat = v_cat[v]
            color: Color = cat if cat in ("infer", "clear") else "none"  # type: ignore[assignment]
            reason = reasons.get(v)  # type: ignore[assignment]
            if reason is None:
                i = v_node[v]
                op = ops_l[i]
                if not types_l[i].known:
                    reason = text("op {} is not in the op registry", op)
                elif not proc_l[i]:
                    if name in preserve:
                        reason = preserve_reasons.get(name) or "preserved (fetched or excluded): keeps its dtypes"
                    else:
                        device = self._device_l[i] or "(default device)"
                        reason = text("device {} is not eligible for " + precision, device)
                elif dtype != FLOAT:
                    reason = text("type {} is not float32", dt.name(dtype))
                elif v in kernel_missing:
                    reason = text("no " + precision + " kernel for {} on this device", op)
                elif cat == "allow":
                    reason = "allow-list op not painted"
                elif cat == "infer":
                    reason = "infer op not between allow-list ops"
                elif cat == "clear":
                    reason = "clear op with no allow neighbour" if self.supports(v) else (
                        text("no " + precision + " kernel for {}", op))
                elif self.had_allow:
                    reason = text("{} is on no list", op)
                else:
                    reason = "no allow-list op in the graph"
            if normalized and name in normalized:
                reason = f"{reason}; normalization-aware: {normalized[name]}"
            return color, dtype, reason, None

        return fields


def decide(
    g: nx.MultiDiGraph,
    lists: object,
    target: Target,
    precision: Precision,
    registry: OpRegistry,
    options: DecideOptions = DecideOptions(),
) -> Plan:
    """Paint ``g`` and return the plan.  Pure: ``g`` and ``lists`` are not modified.

    ``lists`` is any object with ``allow``/``infer``/``deny``/``clear`` collections of op
    names (an :class:`amp_rewrite.plan.lists.OpLists`).  Raises
    :class:`~amp_rewrite.errors.InvalidGraphError` when the graph is inconsistent with the
    op registry (wrong input count, missing type attribute, bad loop back edge).
    """
    name = g.graph.get("name", "")
    skip = target.skip_reason(precision)
    if skip is not None:
        return Plan(name, precision, dt.HALF if precision == "float16" else dt.BFLOAT16, skip)
    painter = _Painter(g, _lists_of(lists), target, precision, registry, options)
    painter.build()
    painter.run()
    return painter.plan(name)


def iter_vertices(plan: Plan) -> Iterable[tuple[str, TypeAttr, AttrDecision]]:
    """Every (node, type attr, decision) of a plan, in node order."""
    for name, nd in plan.nodes.items():
        for ta, d in nd.attrs.items():
            yield name, ta, d
