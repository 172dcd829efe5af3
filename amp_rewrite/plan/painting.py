"""The painting state: what the passes of :mod:`amp_rewrite.plan.passes` read and paint.

:class:`PaintingState` holds one graph's facts, built once (:meth:`PaintingState.build`): per
node (op, whether it is processed, data inputs, type attributes) in lists aligned with
:attr:`~PaintingState.order`, the type graph, and per vertex (one type attribute of one node)
its list category, dtype and node.  The passes paint by adding vertices to its ``allow`` and
``deny`` sets and recording why in ``reason``.

:class:`Placement` is the one interface between the painter and a cost-aware planner (such as
:func:`amp_rewrite.plan.optimal.min_cut_placement`): the caller hands one to
:func:`amp_rewrite.plan.painter.decide`, which runs it on the state after TensorFlow's passes.
The painter imports no planner.
"""

from __future__ import annotations

import logging
from itertools import chain
from typing import Any, Mapping, Protocol

import networkx as nx

from ..graph import dtypes as dt
from ..graph import ir
from ..graph.op_registry import OpRegistry, OpSignature, kernel_accepts
from ..graph.shapes import tensor_numel
from ..graph.type_attrs import NodeTypes, TypeAttr, get_dtype, node_types, opaque_node_types
from ..graph.type_graph import build_type_graph_from_lists
from .decisions import DecideOptions, Precision
from .normalization import NormalizationInfo
from .ranges import RangeProver
from .targets import Target, parse_device_name

__all__ = ["PaintingState", "Placement"]

# The painter's logger, under the name its messages have always had (the CLI prints it).
log = logging.getLogger("amp_rewrite.plan.painter")

_BATCH_NORM_RENAMES = {"FusedBatchNorm": "FusedBatchNormV2", "FusedBatchNormGrad": "FusedBatchNormGradV2"}
_UNSEEN: Any = object()  # a cache miss, where None is a cached answer


class _Lists:
    """Fast membership tests on the effective lists (any object with four frozensets)."""

    def __init__(self, lists: object) -> None:
        # The release the lists are for (OpLists.tf_version) decides how its pass behaves.
        self.tf_version: str | None = getattr(lists, "tf_version", None)
        self.allow = frozenset(getattr(lists, "allow"))
        self.infer = frozenset(getattr(lists, "infer"))
        self.deny = frozenset(getattr(lists, "deny"))
        self.clear = frozenset(getattr(lists, "clear"))
        #: Deny-list ops inferred where their input is proven at most a limit (OpLists.bounded).
        self.bounded: Mapping[str, tuple[float, str]] = dict(getattr(lists, "bounded", None) or {})
        #: Deny-list reductions cleared where they reduce nothing (OpLists.identity).
        self.identity: Mapping[str, str] = dict(getattr(lists, "identity", None) or {})
        #: Deny-list ops whose inputs stay float32 back to the nearest allow op
        #: (OpLists.float32_inputs).
        self.float32_inputs: Mapping[str, str] = dict(getattr(lists, "float32_inputs", None) or {})
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


def _data_inputs(pred: Mapping[str, Mapping[int, Mapping[str, Any]]]) -> list[tuple[str, int]]:
    """The data inputs ``(producer, port)`` of a node by destination port, from its
    non-empty predecessor dict: :func:`_inputs_by_port`, fast for the usual order.  Pure.

    Edge keys are the destination port for data edges, negative for control ones.  Import
    adds a node's edges port by port, so they are usually met in port order and the list is
    made directly; otherwise they are put in order by port.
    """
    ins: list[tuple[str, int]] = []
    for u, keyed in pred.items():
        for q, d in keyed.items():
            if q == len(ins):
                ins.append((u, d["src_port"]))
            elif q >= 0:
                return _inputs_by_port(pred)
    return ins


def _copied_values(shapes: Mapping[str, tuple[Any, ...]], source: tuple[str, int], node: str) -> int | None:
    """The number of values a reduction ``node`` of input ``source`` copies when its static
    shapes (fully known, at least one value) show it reduces no element, else ``None``: a
    reduction's output holds its input's count divided by the sizes of the axes it reduces, so
    equal counts mean each of them has size 1.  Pure."""
    before, after = tensor_numel(shapes, source), tensor_numel(shapes, (node, 0))
    return before if before is not None and before > 0 and before == after else None


class PaintingState:
    """The state of one run of the painting passes over one graph (made by
    :func:`amp_rewrite.plan.painter.decide`).  Call :meth:`build` once before anything else.

    The documented interface, for the passes and for a :class:`Placement`:

    * Inputs, read-only: ``g`` (the IR, never modified), ``lists``, ``target``, ``precision``
      and ``low`` (its dtype), ``registry``, ``options`` (:class:`DecideOptions`).
    * Per node, aligned with ``order`` (node names in graph order; ``index`` maps a name to
      its position): ``ops_l`` (op, FusedBatchNorm already renamed), ``proc_l`` (processed:
      not preserved and on an eligible device), ``ins_l`` (data inputs ``(producer, port)``
      by port), ``types_l`` (:class:`NodeTypes`), ``cats_l`` (list category), ``device_l``,
      ``label_l``; ``types``, ``renames`` and ``unknown_ops`` keyed by name, and the
      name-keyed views ``ops``, ``processed`` and ``inputs``, built on first use.
    * Per vertex (one type attribute of one node; see :attr:`tg`, the type graph):
      ``v_cat``, ``v_proc``, ``v_dtype``, ``v_node`` (position of its node); a node's
      vertices are ``range(bases[i], bases[i + 1])``.
    * The paint, which passes and placements write: ``allow`` and ``deny`` (sets of
      vertices; a placement may replace ``allow``), ``reason`` (vertex -> why),
      ``deny_parent`` (propagated deny vertex -> the vertex it came from), ``kernel_missing``,
      ``normalized`` (node -> why deny does not propagate into it, or out of it where fenced),
      ``fence_readers`` (vertices reading a fenced normalization's output), ``fence_writers``
      (vertices whose output it reads as its input), ``norm_info``,
      ``had_allow`` and ``placement`` (what the placement returned); ``placement_memo``, the
      placement's own (work it keeps between colourings of one painting).
    * Queries, pure: :meth:`is_f32`, :meth:`supports_dtype`, :meth:`has_kernel`,
      :meth:`supports`, :meth:`reads_ref_var`, :meth:`can_force`, :meth:`is_boundary_cast`,
      :meth:`tl_float`, :meth:`nodes_with_op`; :meth:`text` shares formatted reasons.

    Per-node facts live in lists aligned with :attr:`order` and per-vertex facts in lists
    indexed by vertex: on graphs of a million nodes each lookup in a name-keyed dict of that
    size misses the CPU caches, and such lookups dominated the run time.
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
        #: Work a placement keeps between colourings of one painting (see
        #: :class:`amp_rewrite.plan.painter.Painting`), which restores the paint before each.
        self.placement_memo: dict[Any, Any] = {}
        self.normalized: dict[str, str] = {}
        #: Vertices that read a fenced normalization's output (pass 2 fills it; pass 3 reads it).
        self.fence_readers: set[int] = set()
        #: Vertices whose output a fenced normalization's apply op reads as its full-size
        #: input (``x``, or ``dy`` in its gradient); pass 2 fills it, pass 3 reads it.
        self.fence_writers: set[int] = set()
        #: Deny-list nodes inferred because their input is proven in range (node -> why).
        self.bounded: dict[str, str] = {}
        #: Deny-list reductions cleared because their shapes show they reduce nothing (node -> why).
        self.identity: dict[str, str] = {}
        #: Listed nodes taken off their list because their types are their functions'
        #: signatures (node -> why; known difference KD-6).
        self.signature_bound: dict[str, str] = {}
        #: What :func:`find_normalizations` found (pass 2), for the optimal planner.
        self.norm_info: NormalizationInfo | None = None
        self.had_allow = False  # pass 1 painted something (the planner may undo it all)
        self._ops: dict[str, str] | None = None
        self._processed: dict[str, bool] | None = None
        self._inputs: dict[str, list[tuple[str, int]]] | None = None
        self._texts: dict[tuple[str, object], str] = {}  # see text()

    # ------------------------------------------------------------------ name-keyed views

    @property
    def ops(self) -> dict[str, str]:
        """Node -> op, FusedBatchNorm already renamed.  Built on first use."""
        if self._ops is None:
            self._ops = dict(zip(self.order, self.ops_l))
        return self._ops

    @property
    def processed(self) -> dict[str, bool]:
        """Node -> whether it is rewritten at all (not preserved, on an eligible device)."""
        if self._processed is None:
            self._processed = dict(zip(self.order, self.proc_l))
        return self._processed

    @property
    def inputs(self) -> dict[str, list[tuple[str, int]]]:
        """Node -> its data inputs as ``(producer, port)`` in port order."""
        if self._inputs is None:
            self._inputs = dict(zip(self.order, self.ins_l))
        return self._inputs

    # ------------------------------------------------------------------ model construction

    def build(self) -> None:
        """Per-node facts (op, processed, data inputs, type ids), the type graph and the
        per-vertex facts the passes read.  Reads ``self.g`` only; sets the attributes listed
        in the class docstring.

        One pass over the nodes fills lists in node order; the per-vertex lists are expanded
        from them by C-level passes.  Each node's dicts are read once, while in the cache.
        """
        unknown = self._node_facts()
        self._node_types(unknown)
        self._vertex_facts()
        self._infer_bounded()
        self._clear_identity_reductions()
        self._bind_function_signatures()

    def _node_facts(self) -> list[int]:
        """Fill the per-node lists (``ops_l``, ``proc_l``, ``ins_l``, ``device_l``,
        ``label_l``, and ``types_l`` with ``None`` for ops missing from the registry),
        ``renames``, ``unknown_ops``, ``op_set`` and ``index``.  Returns the positions of the
        nodes whose op is not in the registry."""
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
            ins = _data_inputs(pred) if pred else []
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
        self.ops_l = ops_l
        self.op_set = set(ops_l)
        self.proc_l = proc_l
        self.ins_l = ins_l
        self.device_l = device_l
        self.label_l = label_l
        self.types_l = types_l  # type: ignore[assignment]  # completed by _node_types
        #: node name -> position in ``order`` (shared with the plan's NodeDecisions).
        self.index = dict(zip(order, range(len(order))))
        return unknown

    def _node_types(self, unknown: list[int]) -> None:
        """Fill ``types`` (name -> :class:`NodeTypes`) and complete ``types_l`` with an opaque
        description of the nodes at the positions ``unknown`` (ops missing from the registry),
        warning once per such op."""
        order = self.order
        types_l = self.types_l
        if unknown:
            # Known nodes first, then the others (in order), as they are described.
            self.types = {n: t for n, t in zip(order, types_l) if t is not None}
            self._describe_unknown([order[i] for i in unknown])
            for i in unknown:
                types_l[i] = self.types[order[i]]
        else:
            self.types = dict(zip(order, types_l))
        for op, count in sorted(self.unknown_ops.items()):
            log.warning(
                "op %s is not in TensorFlow's op registry (a custom op?); its %d node(s) stay "
                "float32", op, count,
            )

    def _vertex_facts(self) -> None:
        """Build the type graph ``tg`` and the per-vertex lists (``bases``, ``v_node``,
        ``v_cat``, ``v_proc``, ``v_dtype``), ``cats_l`` and ``quantized`` from the per-node
        lists."""
        self.tg = build_type_graph_from_lists(self.order, self.types_l, self.ins_l, self.index)
        # Per-vertex copies of per-node facts (vertices of a node are consecutive, see
        # build_type_graph), made by C-level passes rather than a loop per node.
        #: first vertex of each node, then the number of vertices
        self.bases = self.tg.bases
        #: vertex -> position of its node in ``order``
        self.v_node = v_node = self.tg.node_pos
        # Each node's list category (the C-level dict lookup behind _Lists.category).
        self.cats_l = list(map(self.lists._category.get, self.ops_l))
        self.v_cat = list(map(self.cats_l.__getitem__, v_node))
        self.v_proc = list(map(self.proc_l.__getitem__, v_node))
        # The dtypes of a node's vertices depend only on its NodeTypes, shared by the nodes
        # of one op and attrs (id() is stable: ``types_l`` holds the objects).
        dtypes_of: dict[int, list[int]] = {}
        for nt in dict(zip(map(id, self.types_l), self.types_l)).values():
            dtypes_of[id(nt)] = [get_dtype(nt.dtypes, ta) for ta in nt.attrs]
        self.v_dtype = list(chain.from_iterable(map(dtypes_of.__getitem__, map(id, self.types_l))))
        #: id(NodeTypes) -> whether one of its attrs is quantized (pass 6 drops such nodes)
        self.quantized = {k: any(d in dt.QUANTIZED for d in ds) for k, ds in dtypes_of.items()}

    def _infer_bounded(self) -> None:
        """Move to infer the deny-list nodes whose op has a ``bounded`` entry and whose input 0
        is proven at most its limit (:class:`~amp_rewrite.plan.ranges.RangeProver`), recording
        the proof in :attr:`bounded`.  Only their ``cats_l``/``v_cat`` change; nothing is
        painted here.  Not under ``UNSAFE_FORCE_ALL`` (nothing is denied there)."""
        bounded = self.lists.bounded
        if not bounded or self.options.force_all or not (self.op_set & bounded.keys()):
            return
        prover = RangeProver(self.g)
        for i, op in enumerate(self.ops_l):
            if op not in bounded or self.cats_l[i] != "deny" or not self.proc_l[i] or not self.ins_l[i]:
                continue
            limit, why = bounded[op]
            proof = prover.bound(*self.ins_l[i][0])
            if proof.hi > limit:
                continue
            self.cats_l[i] = "infer"
            for v in range(self.bases[i], self.bases[i + 1]):
                self.v_cat[v] = "infer"
            # (A derivation is kept to one short line by Bound itself.)
            self.bounded[self.order[i]] = (f"{op}'s input is at most {proof.hi:g} ({proof.why}), "
                                           f"within its limit {limit:g}: {why}")

    def _clear_identity_reductions(self) -> None:
        """Move to clear the deny-list reductions whose op has an ``identity`` entry and whose
        static shapes (``g.graph["shapes"]``, both fully known) give their output as many
        values as their input: each axis they reduce has one element, so they copy it (the
        gradient of a broadcasting ``BatchMatMulV2`` sums its other operand's gradient over
        no axis).  A copy is exact in any precision, so it follows its neighbours, like
        ``Identity``; on the deny list it would keep everything downstream of it float32.
        Records the proof in :attr:`identity`.  Only ``cats_l``/``v_cat`` change.  Not under
        ``UNSAFE_FORCE_ALL``; nothing without shapes (a graph imported without them)."""
        identity = self.lists.identity
        shapes = self.g.graph.get("shapes")
        if not identity or not shapes or self.options.force_all or not (self.op_set & identity.keys()):
            return
        for i, op in enumerate(self.ops_l):
            if op not in identity or self.cats_l[i] != "deny" or not self.proc_l[i] or not self.ins_l[i]:
                continue
            if dt.FLOAT not in self.v_dtype[self.bases[i]:self.bases[i + 1]]:
                continue  # an integer product of shape dimensions, say: nothing to paint
            name = self.order[i]
            values = _copied_values(shapes, self.ins_l[i][0], name)
            if values is None:
                continue
            self.cats_l[i] = "clear"
            for v in range(self.bases[i], self.bases[i + 1]):
                self.v_cat[v] = "clear"
            self.identity[name] = (f"{op} reduces no element (input and output both hold {values} values): "
                                   f"cleared, {identity[op]}")

    def _bind_function_signatures(self) -> None:
        """Take off its list every node that calls functions through its attributes
        (``While``/``StatelessWhile``: ``T`` is the loop variables' types in ``cond`` and
        ``body``; ``If``, ``Case`` and calls: ``Tin``/``Tout``).  Each function is rewritten on
        its own with its signature unchanged, so a type attribute of such a node painted low
        would hand its functions a type they do not take.  TensorFlow's bfloat16 lists clear
        ``While`` and ``StatelessWhile`` and its pass paints them (known difference KD-6: a
        Keras LSTM's loop state painted bfloat16 fails at run time with "passed bfloat16
        expected float"); unlisted, the node is a float32 boundary, as ``While`` is in
        TensorFlow's float16 mode.  Only ``cats_l``/``v_cat`` change; the reason is kept in
        :attr:`signature_bound`.  Not under ``tensorflow_bugs``."""
        if self.options.tensorflow_bugs:
            return
        for i, data in enumerate(self._datas):
            if self.cats_l[i] is None or not data["funcs"]:
                continue
            op = self.ops_l[i]
            self.cats_l[i] = None
            for v in range(self.bases[i], self.bases[i + 1]):
                self.v_cat[v] = None
            self.signature_bound[self.order[i]] = (
                f"[KD-6] {op} is on no list here: its types are those of the functions it calls "
                f"({', '.join(data['funcs'])}), which keep their signatures")

    def _describe_unknown(self, unknown: list[str]) -> None:
        """Give each node of ``unknown`` (ops missing from the registry) an opaque
        description from the dtypes seen on its edges.  Adds to ``self.types``."""
        types = self.types
        for name in unknown:
            in_dtypes = []
            for src, port in self.ins_l[self.index[name]]:
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
        i = self.v_node[v]
        ta = self.tg.attr[v]
        op = self.ops_l[i]
        known = self.types_l[i].known
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
        i = self.v_node[v]
        nt = self.types_l[i]
        device = self.device_l[i]
        label = self.label_l[i]
        # Everything below depends on the node's op and dtypes (one NodeTypes object per op
        # and attrs; id() is stable while self.types_l holds it), its device, its kernel
        # label and ``ta``: look that up first, before parsing the device name.
        quick = (id(nt), ta, device, label)
        cached = self._has_kernel_cache.get(quick)
        if cached is None:
            cached = self._has_kernel_cache[quick] = self._has_kernel(self.ops_l[i], nt, ta, device, label)
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
        found = kernel_accepts(self.registry.kernels(op, parsed.type), label, types) or (
            kernel_accepts(self.registry.kernels(op, "DEFAULT"), label, types)
        )
        self._kernel_cache[key] = found
        return found

    def supports(self, v: int) -> bool:
        return self.supports_dtype(v) and self.has_kernel(v)

    def reads_ref_var(self, name: str) -> bool:
        """Identity of a ref variable, or Enter of such a read (TensorFlow keeps them float)."""
        ops = self.ops_l
        index = self.index
        seen = set()
        while name not in seen:
            seen.add(name)
            i = index.get(name)
            if i is None:
                return False
            op = ops[i]
            ins = self.ins_l[i]
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
        op = self.ops_l[self.index[name]]
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
        if self.ops_l[self.index[name]] != "Cast":
            return False
        types = {self.tg.attr[v].attr: self.v_dtype[v] for v in self.tg.by_node.get(name, ())}
        return {types.get("SrcT"), types.get("DstT")} == {dt.FLOAT, self.low}

    # ------------------------------------------------------------------ TensorList helpers

    def tl_float(self, name: str) -> int | None:
        if "TensorList" not in self.ops_l[self.index[name]]:
            return None
        for v in self.tg.by_node[name]:
            ta = self.tg.attr[v]
            if ta.attr and ta.index < 0 and self.v_dtype[v] == dt.FLOAT:
                return v
        return None

    def reads_ref_var_at(self, i: int) -> bool:
        """:meth:`reads_ref_var` for the node at position ``i`` of ``order``."""
        op = self.ops_l[i]
        if op != "Identity" and op != "Enter":
            return False  # what reads_ref_var answers for every other op
        return self.reads_ref_var(self.order[i])


    def nodes_with_op(self, op: str) -> list[int]:
        """Positions in ``order`` of the nodes whose (renamed) op is ``op``, in order."""
        if op not in self.op_set:  # most graphs lack the op asked for
            return []
        return [i for i, o in enumerate(self.ops_l) if o == op]


    def text(self, template: str, arg: object) -> str:
        """``template.format(arg)``, made once per (template, arg): thousands of vertices
        share each of these reasons, and one string object serves them all."""
        key = (template, arg)
        text = self._texts.get(key)
        if text is None:
            text = self._texts[key] = template.format(arg)
        return text


class Placement(Protocol):
    """A cost-aware planner, run by :func:`amp_rewrite.plan.painter.decide` after TensorFlow's
    passes when ``options.planner`` is not ``"greedy"`` (and the level is not
    ``UNSAFE_FORCE_ALL``).  The caller chooses it and hands it in; the painter knows none.

    It is called as ``placement(state, clusters, options)``: ``state`` is the
    :class:`PaintingState` after the clean-up pass, ``clusters`` the float32 TensorList
    clusters (node names; see :func:`amp_rewrite.plan.passes.tensor_list_clusters`), and
    ``options`` the :class:`DecideOptions` of the run.  It may replace ``state.allow``, write
    ``state.reason`` and keep its own work in ``state.placement_memo`` (for further colourings
    of the same painting), and must not touch the graph or anything else; the painter then
    matches existing Casts again and stores what it returns (a summary for the report, or
    ``None``) as the plan's ``placement``.
    """

    def __call__(self, state: PaintingState, clusters: list[list[str]], options: DecideOptions) -> Any:
        ...
