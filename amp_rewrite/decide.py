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
   in node order (TensorFlow 2.21 runs this pass in every mode, not only for bfloat16).
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
from typing import Any, Iterable, Iterator, Literal, Mapping

import networkx as nx

from . import dtypes as dt
from . import ir
from .errors import InvalidGraphError
from .normalization import find_normalizations
from .op_registry import KernelSpec, OpRegistry, OpSignature
from .targets import Target, parse_device_name
from .type_attrs import NodeTypes, TypeAttr, get_dtype, node_types, opaque_node_types
from .type_graph import build_type_graph

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
                 vreason: list[str], vsource: list[str | None], low: int) -> None:
        self._order = order
        self._index = {n: i for i, n in enumerate(order)}
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
    #: Reproduce TensorFlow 2.21's known bugs (KNOWN_DIFFERENCES.md) for exact parity,
    #: even where its output cannot run.
    tensorflow_bugs: bool = False
    #: ``"greedy"``: TensorFlow's passes.  ``"optimal"``: then re-colour the free vertices
    #: with the cost-aware minimum cut (:mod:`amp_rewrite.optimal`).  ``"min-casts"``: the
    #: same cut, but every allow-list op converts (as in TensorFlow) and only the bytes moved
    #: by Casts are minimized.
    planner: Literal["greedy", "optimal", "min-casts"] = "greedy"
    #: Stop deny propagation at the apply ops of moment-based normalizations
    #: (:mod:`amp_rewrite.normalization`).
    normalization_aware: bool = False
    #: Let the cost model penalize matrices whose dimensions miss the device's multiple.
    shape_aware: bool = True


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
    #: The ``optimal`` planner's summary (:class:`amp_rewrite.optimal.PlacementSummary`).
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


class _Lists:
    """Fast membership tests on the effective lists (any object with four frozensets)."""

    def __init__(self, lists: object) -> None:
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
    """State of one run of the painting passes over one graph.  Internal to :func:`decide`."""

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
        self.order = ir.ordered_nodes(g)
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
        self.had_allow = False  # pass 1 painted something (the planner may undo it all)

    # ------------------------------------------------------------------ model construction

    def build(self) -> None:
        g = self.g
        preserve = self.options.preserve
        self.ops: dict[str, str] = {}
        self.processed: dict[str, bool] = {}
        self.renames: dict[str, str] = {}
        self.inputs: dict[str, list[tuple[str, int]]] = {}
        nodes = g._node
        # Graphs repeat a handful of device strings over thousands of nodes.
        eligible: dict[str, bool] = {}
        data_inputs = ir.data_inputs
        for name in self.order:
            data = nodes[name]
            device = data["device"]
            ok = eligible.get(device)
            if ok is None:
                ok = eligible[device] = self.target.node_is_eligible(device, self.precision)
            ok = ok and name not in preserve
            self.processed[name] = ok
            op = data["op"]
            if ok and op in _BATCH_NORM_RENAMES:
                op = _BATCH_NORM_RENAMES[op]
                self.renames[name] = op
            self.ops[name] = op
            self.inputs[name] = data_inputs(g, name)
        self.types = self._node_types()
        self.tg = build_type_graph(self.order, self.types, self.inputs)
        # Per-vertex copies of per-node facts, filled node by node (vertices of a node are
        # consecutive, see build_type_graph).
        cat = self.lists.category
        v_cat: list[str | None] = []
        v_proc: list[bool] = []
        v_dtype: list[int] = []
        types = self.types
        ops = self.ops
        processed = self.processed
        # The dtypes of a node's vertices depend only on its NodeTypes, shared by the nodes
        # of one op and attrs (id() is stable: ``types`` holds the objects).
        dtypes_of: dict[int, list[int]] = {}
        for name in self.order:
            nt = types[name]
            k = len(nt.attrs)
            if not k:
                continue
            v_cat += [cat(ops[name])] * k
            v_proc += [processed[name]] * k
            chunk = dtypes_of.get(id(nt))
            if chunk is None:
                chunk = dtypes_of[id(nt)] = [get_dtype(nt.dtypes, ta) for ta in nt.attrs]
            v_dtype += chunk
        self.v_cat = v_cat
        self.v_proc = v_proc
        self.v_dtype = v_dtype

    def _node_types(self) -> dict[str, NodeTypes]:
        types: dict[str, NodeTypes] = {}
        cache: dict[tuple[object, ...], NodeTypes] = {}
        unknown: list[str] = []
        nodes = self.g._node
        sigs: dict[str, OpSignature | None] = {}
        for name in self.order:
            data = nodes[name]
            op = self.ops[name]
            if op in sigs:
                sig = sigs[op]
            else:
                sig = sigs[op] = self.registry.op(op) or self.signatures.get(op)
            if sig is None:
                unknown.append(name)
                self.unknown_ops[op] = self.unknown_ops.get(op, 0) + 1
                continue
            dtypes = data["dtypes"]
            if name in self.renames:
                dtypes = {**dtypes, "U": dt.FLOAT}
            n_in = len(self.inputs[name])
            # Most nodes share their op and attrs with many others: expand each signature once.
            key = (op, tuple(dtypes.items()), tuple(data["ints"].items()), data["attr_names"], n_in)
            nt = cache.get(key)
            if nt is None:
                nt = node_types(name, op, dtypes, data["ints"], data["attr_names"], n_in, sig)
                cache[key] = nt
            types[name] = nt
        for name in unknown:
            in_dtypes = []
            for src, port in self.inputs[name]:
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
        for op, count in sorted(self.unknown_ops.items()):
            log.warning(
                "op %s is not in TensorFlow's op registry (a custom op?); its %d node(s) stay "
                "float32", op, count,
            )
        return types

    # ------------------------------------------------------------------ predicates

    def is_f32(self, v: int) -> bool:
        return self.v_dtype[v] == dt.FLOAT

    def supports_dtype(self, v: int) -> bool:
        """TensorFlow's ``SupportsF16DataType``: the op (global registry) accepts the type."""
        name = self.tg.node[v]
        ta = self.tg.attr[v]
        nt = self.types[name]
        # The answer depends on the op and the attr only (and on ``known``, a property of the
        # op too); graphs ask it for thousands of vertices of a few ops.
        key = (self.ops[name], ta, nt.known)
        cached = self._supports_cache.get(key)
        if cached is None:
            cached = self._supports_cache[key] = self._supports_dtype(name, ta)
        return cached

    def _supports_dtype(self, name: str, ta: TypeAttr) -> bool:
        if not self.types[name].known:
            return False
        sig = self.registry.op(self.ops[name])
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
        name = self.tg.node[v]
        ta = self.tg.attr[v]
        if ta.is_fixed:
            return False
        data = self.g._node[name]
        # Everything below depends on the node's op and dtypes (one NodeTypes object per op
        # and attrs; id() is stable while self.types holds it), its device, its kernel label
        # and ``ta``: look that up first, before parsing the device name.
        quick = (id(self.types[name]), ta, data["device"], data["label"])
        cached = self._has_kernel_cache.get(quick)
        if cached is None:
            cached = self._has_kernel_cache[quick] = self._has_kernel(name, ta, data)
        return cached

    def _has_kernel(self, name: str, ta: TypeAttr, data: Mapping[str, object]) -> bool:
        device = data["device"] or self.target.default_device().name  # type: ignore[operator]
        parsed = parse_device_name(device)
        if parsed is None or parsed.type is None:
            return False
        op = self.ops[name]
        types = dict(self.types[name].dtypes)
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
        key = (op, parsed.type, data["label"], tuple(types.items()))
        cached = self._kernel_cache.get(key)
        if cached is not None:
            return cached
        # Like TensorFlow's kernel lookup, fall back to DEVICE_DEFAULT registrations (used by
        # GPU and pluggable devices for ops such as IdentityN) when no kernel of the device
        # type matches.
        found = _kernel_matches(self.registry.kernels(op, parsed.type), data["label"], types) or (
            _kernel_matches(self.registry.kernels(op, "DEFAULT"), data["label"], types)
        )
        self._kernel_cache[key] = found
        return found

    def supports(self, v: int) -> bool:
        return self.supports_dtype(v) and self.has_kernel(v)

    def reads_ref_var(self, name: str) -> bool:
        """Identity of a ref variable, or Enter of such a read (TensorFlow keeps them float)."""
        seen = set()
        while name not in seen:
            seen.add(name)
            op = self.ops.get(name)
            ins = self.inputs.get(name) or []
            if not ins:
                return False
            src = ins[0][0]
            if op == "Identity":
                return self.ops.get(src) in ("Variable", "VariableV2")
            if op == "Enter":
                name = src
                continue
            return False
        return False

    def can_force(self, name: str) -> bool:
        op = self.ops[name]
        if op in ("Const", "SoftmaxCrossEntropyWithLogits"):
            return False
        sig = self.registry.op(op)
        return sig is not None and not sig.is_stateful and not sig.has_ref_args()

    # ------------------------------------------------------------------ TensorList helpers

    def tl_float(self, name: str) -> int | None:
        if "TensorList" not in self.ops[name]:
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
        for r in range(len(tg)):
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
                if self.tl_float(member) is not None and not self.processed[member]:
                    why = f"TensorList cluster includes {member!r}, which is not rewritten"
                elif self.ops[member] in _SOURCE_OR_SINK or self.ops[member] in self.signatures:
                    why = f"TensorList handle crosses {self.ops[member]} node {member!r}"
                elif self.g._node[member]["funcs"] and not self.options.tensorflow_bugs:
                    # Known difference KD-3: TensorFlow lets a list cross While/If/Case and
                    # paints it half while the function body still reads float elements.
                    why = (f"[KD-3] TensorList handle crosses {self.ops[member]} node {member!r}, "
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
        for members in clusters:
            for reader in members:
                if self.ops[reader] not in _TL_READERS:
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
                    if self.ops[writer] in _TL_WRITERS:
                        wf = self.tl_float(writer)
                        if wf is not None and target is not None:
                            tg.add_edge(wf, target)
                    for y in tg.fanin[x]:
                        if y not in seen and self.v_proc[y]:
                            seen.add(y)
                            stack.append(y)
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
        op_of = lambda v: self.ops[tg.node[v]]  # noqa: E731

        clusters = self.tensor_list_clusters()
        self.tensor_list_edges(clusters)

        # Pass 1: allow-list ops (and everything forceable under UNSAFE_FORCE_ALL).
        roots = []
        for v in range(n):
            if not proc[v]:
                continue
            if cat[v] == "allow":
                if (not self.options.tensorflow_bugs and self.is_f32(v) and self.supports_dtype(v)
                        and not self.has_kernel(v)):
                    # Known difference KD-1: TensorFlow converts it and the graph cannot run.
                    self.kernel_missing.add(v)
                    continue
                roots.append(v)
                self.allow.add(v)
                self.reason[v] = f"{op_of(v)} is on the allow list"
            elif self.options.force_all and self.can_force(tg.node[v]) and (
                    self.options.tensorflow_bugs or self.supports(v)):
                # Known difference KD-4: TensorFlow also paints attributes the op cannot take in
                # low precision (SparseMatMul's fixed float output, its float/bfloat16-only Ta),
                # which fails the pass or yields a graph that does not import; we skip them.
                self.allow.add(v)
                self.reason[v] = "UNSAFE_FORCE_ALL paints every op that can be forced"
        if not self.allow:
            return
        self.had_allow = True

        # Pass 2: deny propagates forward through clear/infer when it reaches deny/infer.
        # Normalization-aware: not from a statistic into the op that applies it.
        blocked = self._normalization_blocks() if self.options.normalization_aware else set()
        if not self.options.force_all:
            reach: set[int] = {v for v in range(n) if cat[v] in ("deny", "infer")}
            stack = list(reach)
            while stack:
                x = stack.pop()
                for y in tg.fanin[x]:
                    if y not in reach and cat[y] == "clear":
                        reach.add(y)
                        stack.append(y)
            for r in range(n):
                if cat[r] != "deny" or r in self.deny:
                    continue
                self.deny.add(r)
                self.reason[r] = f"{op_of(r)} is on the deny list"
                stack = [r]
                while stack:
                    x = stack.pop()
                    for y in tg.fanout[x]:
                        if y not in self.deny and y in reach and (x, y) not in blocked:
                            self.deny.add(y)
                            self.deny_parent[y] = x
                            self.reason[y] = "deny propagated"
                            stack.append(y)

        self.tensor_list_match(clusters)

        # Pass 3: clear/infer between two allow-list ops.
        def elig3(x: int) -> bool:
            return (
                cat[x] in ("clear", "infer")
                and x not in self.deny
                and proc[x]
                and self.is_f32(x)
                and self.supports(x)
            )

        down: set[int] = set(roots)
        stack = list(roots)
        while stack:
            x = stack.pop()
            for y in tg.fanout[x]:
                if y not in down and elig3(y):
                    down.add(y)
                    stack.append(y)
        up: set[int] = set()
        for r in roots:
            if r in up:
                continue
            up.add(r)
            stack = [r]
            while stack:
                x = stack.pop()
                for y in tg.fanin[x]:
                    if y in down and y not in up:
                        up.add(y)
                        if y not in self.allow:
                            self.allow.add(y)
                            self.reason[y] = f"{cat[y]} op on a path between allow-list ops"
                        stack.append(y)

        # Pass 4: infer ops fed directly by allow, in node order.  The design notes say this
        # pass is bfloat16-only; TensorFlow 2.21 runs it in every mode (seen in its logs).
        if True:
            for v in range(n):
                if not (proc[v] and v not in self.deny and v not in self.allow and cat[v] == "infer"
                        and self.is_f32(v) and self.supports_dtype(v)):
                    continue
                fanin = tg.fanin[v]
                if any(f in self.deny for f in fanin):
                    continue
                src = next((f for f in fanin if f in self.allow), None)
                if src is not None:
                    self.allow.add(v)
                    self.reason[v] = f"infer op fed by allow node {tg.node[src]!r}"

        # Pass 5: spread allow through connected clear ops (both directions).
        def elig5(x: int) -> bool:
            return (
                cat[x] == "clear"
                and x not in self.allow
                and x not in self.deny
                and proc[x]
                and self.is_f32(x)
                and self.supports(x)
                and not self.reads_ref_var(tg.node[x])
            )

        seen: set[int] = set()
        for r in range(n):
            if not proc[r] or r in seen or r not in self.allow:
                continue
            seen.add(r)
            stack = [r]
            while stack:
                x = stack.pop()
                for y in tg.fanin[x] + tg.fanout[x]:
                    if y not in seen and elig5(y):
                        seen.add(y)
                        self.allow.add(y)
                        self.reason[y] = f"clear op connected to allow node {tg.node[r]!r}"
                        stack.append(y)

        # Pass 6: drop allow-list attributes that cannot take the type.
        for v in sorted(self.allow):
            if cat[v] != "allow":
                continue
            if not self.supports_dtype(v):
                self.allow.discard(v)
                self.reason[v] = f"{op_of(v)} does not accept {self.precision} for {tg.attr[v]}"
            elif any(self.v_dtype[u] in dt.QUANTIZED for u in tg.by_node[tg.node[v]]):
                self.allow.discard(v)
                self.reason[v] = "quantized node"

        self.tensor_list_match(clusters)
        self.recurrent_match()
        self.existing_casts()
        if self.options.planner in ("optimal", "min-casts") and not self.options.force_all:
            from .optimal import place_optimally  # deferred: imports the cost model

            self.placement = place_optimally(self, clusters, self.options.shape_aware,
                                             goal=self.options.planner)

    def _normalization_blocks(self) -> set[tuple[int, int]]:
        """(statistic vertex, apply vertex) pairs along which deny must not propagate."""
        tg = self.tg
        info = find_normalizations(self.g, self.inputs)
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

    def recurrent_match(self) -> None:
        """Force NextIteration and the Merge nodes it feeds to one colour."""
        tg = self.tg
        for name in self.order:
            if self.ops[name] != "NextIteration":
                continue
            t_attr = TypeAttr("T", -1, 0)
            ni = tg.find(name, t_attr)
            if ni is None:
                continue
            merges = []
            for dst, _, _ in ir.consumers(self.g, name, 0):
                if self.ops[dst] != "Merge":
                    raise InvalidGraphError(
                        f"NextIteration node {name!r} feeds {self.ops[dst]} node {dst!r}; "
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
        for name in self.order:
            if self.ops[name] != "Cast":
                continue
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
        vert = lambda v: (tg.node[v], tg.attr[v])  # noqa: E731
        allow = frozenset(vert(v) for v in self.allow)
        convert = tuple(vert(v) for v in sorted(self.allow) if self.is_f32(v))
        vcolor: list[str] = []
        vdtype: list[int] = []
        vreason: list[str] = []
        vsource: list[str | None] = []
        vattr: list[TypeAttr] = []
        start: list[int] = []
        cats: list[str | None] = []
        category = self.lists.category
        ops = self.ops
        by_node = tg.by_node
        attr_of = tg.attr
        decision = self._attr_decision_fields
        debug = log.isEnabledFor(logging.DEBUG)
        for name in self.order:
            start.append(len(vattr))
            cats.append(category(ops[name]))
            for v in by_node[name]:
                color, dtype, reason, source = decision(v)
                vattr.append(attr_of[v])
                vcolor.append(color)
                vdtype.append(dtype)
                vreason.append(reason)
                vsource.append(source)
                if debug and color in ("allow", "deny"):
                    log.debug("%s: %s %s of %s node %s: %s", graph_name or "graph", color.upper(),
                              attr_of[v], ops[name], name, reason)
        start.append(len(vattr))
        nodes = NodeDecisions(
            self.order, [self.ops[n] for n in self.order], cats,
            [self.processed[n] for n in self.order], start, vattr, vcolor, vdtype, vreason,
            vsource, self.low,
        )
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

    def _attr_decision(self, v: int) -> AttrDecision:
        """The decision for vertex ``v`` (after :meth:`run`).  Pure."""
        return AttrDecision(*self._attr_decision_fields(v))  # type: ignore[arg-type]

    def _attr_decision_fields(self, v: int) -> tuple[str, int, str, str | None]:
        """``(color, dtype, reason, source)`` of vertex ``v``: :meth:`_attr_decision`'s fields
        without the object, as :meth:`plan` stores them in flat lists.  Pure."""
        tg = self.tg
        name = tg.node[v]
        dtype = self.v_dtype[v]
        cat = self.v_cat[v]
        if v in self.allow:
            final = self.low if dtype == dt.FLOAT else dtype
            reason = self.reason.get(v, "allow")
            if name in self.normalized:
                reason = f"{reason}; normalization-aware: {self.normalized[name]}"
            return "allow", final, reason, None
        if v in self.deny:
            reason = self.reason.get(v, "deny")
            source = None
            if v in self.deny_parent:
                root = v
                hops = []
                while root in self.deny_parent and len(hops) < 10_000:
                    root = self.deny_parent[root]
                    hops.append(root)
                source = tg.node[root]
                via = [tg.node[h] for h in reversed(hops[:-1])]
                reason = f"downstream of deny node {source!r} ({self.ops[source]})" + (
                    " via " + " -> ".join(repr(x) for x in via[-6:]) if via else ""
                )
            return "deny", dtype, reason, source
        color: Color = cat if cat in ("infer", "clear") else "none"  # type: ignore[assignment]
        if v in self.reason:
            reason = self.reason[v]
        elif not self.types[name].known:
            reason = f"op {self.ops[name]} is not in the op registry"
        elif not self.processed[name]:
            if name in self.options.preserve:
                reason = "preserved (fetched or excluded): keeps its dtypes"
            else:
                device = self.g._node[name]["device"] or "(default device)"
                reason = f"device {device} is not eligible for {self.precision}"
        elif dtype != dt.FLOAT:
            reason = f"type {dt.name(dtype)} is not float32"
        elif v in self.kernel_missing:
            reason = f"no {self.precision} kernel for {self.ops[name]} on this device"
        elif cat == "allow":
            reason = "allow-list op not painted"
        elif cat == "infer":
            reason = "infer op not between allow-list ops"
        elif cat == "clear":
            reason = "clear op with no allow neighbour" if self.supports(v) else (
                f"no {self.precision} kernel for {self.ops[name]}")
        elif self.had_allow:
            reason = f"{self.ops[name]} is on no list"
        else:
            reason = "no allow-list op in the graph"
        if name in self.normalized:
            reason = f"{reason}; normalization-aware: {self.normalized[name]}"
        return color, dtype, reason, None


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
    names (an :class:`amp_rewrite.lists.OpLists`).  Raises
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
