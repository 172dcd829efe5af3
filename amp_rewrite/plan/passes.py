"""TensorFlow's painting passes, as functions over one :class:`~.painting.PaintingState`.

Each pass reads the state's facts and paints: it adds vertices to ``state.allow`` or
``state.deny`` and records why in ``state.reason`` (mutating the state, nothing else).
:func:`amp_rewrite.plan.painter.paint_passes` calls them in TensorFlow's order, which the module
docstring of :mod:`amp_rewrite.plan.painter` describes pass by pass.
"""

from __future__ import annotations

from ..errors import InvalidGraphError
from ..graph import dtypes as dt
from ..graph import ir
from ..graph.shapes import tensor_numel
from ..graph.type_attrs import TypeAttr
from .normalization import Normalization, NormalizationInfo, find_normalizations, upstream_of_fragile
from .painting import PaintingState

__all__ = [
    "paint_allow", "propagate_deny", "paint_between_allow", "paint_infer_after_allow",
    "paint_through_clear", "drop_unconvertible", "tensor_list_clusters", "tensor_list_edges",
    "tensor_list_match", "recurrent_match", "existing_casts",
]

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


def _op_reason(state: PaintingState, v: int, template: str) -> str:
    """``template`` naming the op of vertex ``v``: reasons that name only an op are made once
    per op and shared by its vertices (:meth:`PaintingState.text`)."""
    return state.text(template, state.ops_l[state.v_node[v]])


# ---------------------------------------------------------------------------- TensorLists

def tensor_list_clusters(state: PaintingState) -> list[list[str]]:
    """Find float32 TensorList clusters; deny those that cross a boundary (TF's D0)."""
    tg = state.tg
    comp: dict[int, int] = {}
    clusters: list[list[str]] = []
    # Only TensorList ops have a float element type (tl_float); most graphs have none, so
    # the scan over vertices is limited to their nodes (in order, as the vertices are).
    tl_ops = {op for op in state.op_set if "TensorList" in op}
    if not tl_ops:
        return clusters
    bases = state.bases
    candidates = (v for i, op in enumerate(state.ops_l) if op in tl_ops
                  for v in range(bases[i], bases[i + 1]))
    for r in candidates:
        name = tg.node[r]
        ta = tg.attr[r]
        if not (state.v_proc[r] and ta.is_fixed and ta.fixed == dt.VARIANT):
            continue
        rf = state.tl_float(name)
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
            i = state.index[member]
            op = state.ops_l[i]
            if state.tl_float(member) is not None and not state.proc_l[i]:
                why = f"TensorList cluster includes {member!r}, which is not rewritten"
            elif op in _SOURCE_OR_SINK or op in state.signatures:
                why = f"TensorList handle crosses {op} node {member!r}"
            elif state.g._node[member]["funcs"] and not state.options.tensorflow_bugs:
                # Known difference KD-3: TensorFlow lets a list cross While/If/Case and
                # paints it half while the function body still reads float elements.
                why = (f"[KD-3] TensorList handle crosses {op} node {member!r}, "
                       "whose functions read its elements as float32")
            else:
                continue
            if rf not in state.deny:
                state.deny.add(rf)
                state.reason[rf] = why
    return [
        [m for m in members if state.tl_float(m) is not None] for members in clusters
    ]

def tensor_list_edges(state: PaintingState, clusters: list[list[str]]) -> None:
    """Add implicit writer -> reader edges between element-type vertices."""
    tg = state.tg
    ops = state.ops_l
    index = state.index
    for members in clusters:
        for reader in members:
            if ops[index[reader]] not in _TL_READERS:
                continue
            start = tg.find(reader, TypeAttr("", -1, dt.VARIANT))
            if start is None or not state.v_proc[start]:
                continue
            target = state.tl_float(reader)
            seen = {start}
            stack = [start]
            while stack:
                x = stack.pop()
                writer = tg.node[x]
                if ops[index[writer]] in _TL_WRITERS:
                    wf = state.tl_float(writer)
                    if wf is not None and target is not None:
                        tg.add_edge(wf, target)
                for y in tg.fanin[x]:
                    if y not in seen and state.v_proc[y]:
                        seen.add(y)
                        stack.append(y)
    if clusters:  # the adjacency lists are finalized already unless edges were added
        tg.finalize()

def tensor_list_match(state: PaintingState, clusters: list[list[str]]) -> None:
    for members in clusters:
        vs = [v for v in (state.tl_float(m) for m in members) if v is not None]
        if any(v in state.deny for v in vs):
            for v in vs:
                state.allow.discard(v)
                if v not in state.deny:
                    state.deny.add(v)
                    state.reason[v] = "a sibling in its TensorList cluster is deny"
        elif any(v in state.allow for v in vs):
            for v in vs:
                if v not in state.allow:
                    state.allow.add(v)
                    state.reason[v] = "a sibling in its TensorList cluster is allow"


# ------------------------------------------------------------------ the passes


# ---------------------------------------------------------------------------- passes 1 to 5

def paint_allow(state: PaintingState) -> list[int]:
    """Pass 1: paint allow-list ops (and everything forceable under UNSAFE_FORCE_ALL).
    Returns the allow-list vertices painted (the roots of pass 3), in vertex order."""
    tg = state.tg
    cat = state.v_cat
    proc = state.v_proc
    v_dtype = state.v_dtype
    node_of = tg.node
    allow = state.allow
    reason = state.reason
    FLOAT = dt.FLOAT
    supports_dtype = state.supports_dtype
    supports = state.supports
    bugs = state.options.tensorflow_bugs
    force_all = state.options.force_all
    roots = []
    for v in range(len(tg)):
        if not proc[v]:
            continue
        if cat[v] == "allow":
            if (not bugs and v_dtype[v] == FLOAT and supports_dtype(v)
                    and not state.has_kernel(v)):
                # Known difference KD-1: TensorFlow converts it and the graph cannot run.
                state.kernel_missing.add(v)
                continue
            roots.append(v)
            allow.add(v)
            reason[v] = _op_reason(state, v, "{} is on the allow list")
        elif force_all and not bugs and state.is_boundary_cast(node_of[v]):
            reason[v] = (f"[KD-5] a Cast between float32 and {dt.name(state.low)} is a "
                         "precision boundary: UNSAFE_FORCE_ALL does not force it")
        elif force_all and state.can_force(node_of[v]) and (bugs or supports(v)):
            # Known difference KD-4: TensorFlow also paints attributes the op cannot take in
            # low precision (SparseMatMul's fixed float output, its float/bfloat16-only Ta),
            # which fails the pass or yields a graph that does not import; we skip them.
            allow.add(v)
            reason[v] = "UNSAFE_FORCE_ALL paints every op that can be forced"
    return roots


def propagate_deny(state: PaintingState) -> None:
    """Pass 2: deny propagates forward through clear/infer when it reaches deny/infer.
    Normalization-aware: not from a statistic into the op that applies it.  Fenced: not
    from a normalization's output into what reads it (``state.fence_readers``).  Moments kept
    float32: their Mean nodes are denied like deny-list ops.  Sets ``state.norm_info``."""
    tg = state.tg
    n = len(tg)
    cat = state.v_cat
    aware, pin = state.options.normalization_aware, state.options.moments_float32
    fenced = state.options.normalization_fenced and not aware
    info = state.norm_info = find_normalizations(state.g, state.inputs) if aware or pin or fenced else None
    # Under UNSAFE_FORCE_ALL nothing propagates, so no apply op is exempted from it.
    blocked: set[tuple[int, int]] = set()
    fenced_names: set[str] = set()
    if info is not None and not state.options.force_all:
        if aware:
            blocked = _normalization_blocks(state, info)
        elif fenced:
            blocked, fenced_names = _normalization_fences(state, info)
    moments = ({v for name in info.moments for v in tg.by_node.get(name, ()) if state.is_f32(v)}
               if pin and info is not None else set())
    # A fenced normalization computes in float32, its apply ops too (TensorFlow's pass 4 would
    # otherwise convert ``x * scale`` after a convolution): they are denied like deny-list ops.
    fenced_apply = {v for name in fenced_names for v in tg.by_node.get(name, ()) if state.is_f32(v)}
    if state.options.force_all:
        return
    feeding = _float32_input_chains(state)
    roots = moments | fenced_apply | set(feeding)
    fanin_of = tg.fanin
    fanout_of = tg.fanout
    deny = state.deny
    reason = state.reason
    reach: set[int] = {v for v in range(n) if cat[v] in ("deny", "infer")}
    stack = list(reach)
    while stack:
        x = stack.pop()
        for y in fanin_of[x]:
            if y not in reach and cat[y] == "clear":
                reach.add(y)
                stack.append(y)
    for r in range(n):
        if (cat[r] != "deny" and r not in roots) or r in deny:
            continue
        deny.add(r)
        if cat[r] == "deny":
            reason[r] = _op_reason(state, r, "{} is on the deny list")
        elif r in feeding:
            reason[r] = feeding[r]
        elif r not in moments:
            reason[r] = f"{state.ops_l[state.v_node[r]]} {state.normalized[tg.node[r]]}"
        else:
            # A profile may let Mean run in low precision (its kernels accumulate in
            # float32), but a normalization's statistics stay float32 regardless.
            reason[r] = (f"{state.ops_l[state.v_node[r]]} computes a normalization's moment statistic: "
                         "statistics stay float32 whatever the lists say")
        stack = [r]
        while stack:
            x = stack.pop()
            for y in fanout_of[x]:
                if y not in deny and y in reach and (not blocked or (x, y) not in blocked):
                    deny.add(y)
                    state.deny_parent[y] = x
                    reason[y] = "deny propagated"
                    stack.append(y)


def _float32_input_chains(state: PaintingState) -> dict[int, str]:
    """The infer and clear attributes that feed a deny-list op of ``state.lists.float32_inputs``
    (a logarithm), back to the nearest allow, deny or unlisted op, each with its reason: they
    run in float32 with it.  Denying the ``Log`` alone would cast its input up after float16
    had flushed a probability below 6e-8 to zero (a sigmoid of -17), and its log is ``-inf``;
    so what computes that input, the ``Sigmoid`` and a ``1 - p``, stays float32, and the
    float16 value cast up is the allow op's output it starts from.  Pure."""
    wanted = state.lists.float32_inputs
    if not wanted:
        return {}
    tg, cat = state.tg, state.v_cat
    out: dict[int, str] = {}
    for r in range(len(tg)):
        op = state.ops_l[state.v_node[r]]
        if cat[r] != "deny" or op not in wanted:
            continue
        why = f"feeds {op} {tg.node[r]!r}, whose inputs stay float32 back to the nearest allow-list op: {wanted[op]}"
        stack = [r]
        while stack:
            for y in tg.fanin[stack.pop()]:
                if y not in out and cat[y] in ("infer", "clear") and state.is_f32(y):
                    out[y] = why
                    stack.append(y)
    return out


def paint_between_allow(state: PaintingState, roots: list[int]) -> None:
    """Pass 3: clear/infer attributes on a forward path between two allow-list ops (from the
    ``roots`` of pass 1) become allow.  A fenced normalization's output counts as the first of
    the two (``state.fence_readers``): it is cast to low precision for its readers, as Keras's
    mixed policies cast a norm layer's output, so what lies between it and an allow-list op
    converts too.  Its full-size input counts as the second (``state.fence_writers``): the
    norm casts it to float32, as Keras's norm layers upcast theirs."""
    tg = state.tg
    cat = state.v_cat
    proc = state.v_proc
    v_dtype = state.v_dtype
    fanin_of = tg.fanin
    fanout_of = tg.fanout
    allow = state.allow
    deny = state.deny
    reason = state.reason
    FLOAT = dt.FLOAT
    supports = state.supports

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
    # What only a fenced normalization's output reaches: the same walk from its readers.
    fenced: set[int] = set()
    stack = [y for y in sorted(state.fence_readers) if y not in down and elig3(y)]
    fenced.update(stack)
    while stack:
        x = stack.pop()
        for y in fanout_of[x]:
            if y not in down and y not in fenced and elig3(y):
                fenced.add(y)
                stack.append(y)
    down |= fenced
    up: set[int] = set()
    between = {c: f"{c} op on a path between allow-list ops" for c in ("clear", "infer")}
    after_fence = {c: (f"{c} op on a path from a normalization's output, cast to {state.precision} after its "
                       "float32 apply, to an allow-list op") for c in ("clear", "infer")}
    # A fenced normalization's full-size input counts as the second of the two: the norm casts
    # it to float32 (Keras's norm layers upcast their input), so what lies between an
    # allow-list op and it converts too -- in the backward pass, the sum of the gradients
    # that reach the norm's low-precision output.
    before_fence = {c: (f"{c} op on a path from an allow-list op to a normalization's input, which it casts "
                        "to float32 for its statistics and apply") for c in ("clear", "infer")}
    writers = [(w, True) for w in sorted(state.fence_writers) if w in down]
    # Allow-list roots first: where both hold, TensorFlow's own reason is given.
    for r, into_fence in [*((r, False) for r in roots), *writers]:
        if r in up:
            continue
        up.add(r)
        if r not in allow:  # a fence writer, not an allow-list root
            allow.add(r)
            reason[r] = (after_fence if r in fenced else before_fence)[cat[r]]  # type: ignore[index]
        stack = [r]
        while stack:
            x = stack.pop()
            for y in fanin_of[x]:
                if y in down and y not in up:
                    up.add(y)
                    if y not in allow:
                        allow.add(y)
                        why = after_fence if y in fenced else before_fence if into_fence else between
                        reason[y] = why[cat[y]]  # type: ignore[index]
                    stack.append(y)


def paint_infer_after_allow(state: PaintingState) -> None:
    """Pass 4: infer ops fed directly by allow, in node order.  The design notes say this
    pass is bfloat16-only; TensorFlow 2.20 and later run it in every mode (seen in their logs
    and outputs), older releases only in their bfloat16 mode."""
    if not (state.precision == "bfloat16" or _infer_after_allow_in_every_mode(state.lists.tf_version)):
        return
    tg = state.tg
    cat = state.v_cat
    proc = state.v_proc
    v_dtype = state.v_dtype
    fanin_of = tg.fanin
    node_of = tg.node
    allow = state.allow
    deny = state.deny
    FLOAT = dt.FLOAT
    supports_dtype = state.supports_dtype
    for v in range(len(tg)):
        if not (proc[v] and v not in deny and v not in allow and cat[v] == "infer"
                and v_dtype[v] == FLOAT and supports_dtype(v)):
            continue
        fanin = fanin_of[v]
        if any(f in deny for f in fanin):
            continue
        src = next((f for f in fanin if f in allow), None)
        if src is not None:
            allow.add(v)
            state.reason[v] = f"infer op fed by allow node {node_of[src]!r}"


def paint_through_clear(state: PaintingState) -> None:
    """Pass 5: spread allow through connected clear ops (both directions)."""
    tg = state.tg
    cat = state.v_cat
    proc = state.v_proc
    v_dtype = state.v_dtype
    fanin_of = tg.fanin
    fanout_of = tg.fanout
    node_of = tg.node
    v_node = state.v_node
    allow = state.allow
    deny = state.deny
    FLOAT = dt.FLOAT
    supports = state.supports

    def elig5(x: int) -> bool:
        return (
            cat[x] == "clear"
            and x not in allow
            and x not in deny
            and proc[x]
            and v_dtype[x] == FLOAT
            and supports(x)
            and not state.reads_ref_var_at(v_node[x])
        )

    seen: set[int] = set()
    for r in range(len(tg)):
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
                        state.reason[y] = why
                        stack.append(y)


# ---------------------------------------------------------------------------- pass 6: clean-up

def drop_unconvertible(state: PaintingState) -> None:
    """Pass 6, first step: drop allow-list attributes that cannot take the type (and those of
    quantized nodes)."""
    cat = state.v_cat
    v_node = state.v_node
    ops_l = state.ops_l
    allow = state.allow
    reason = state.reason
    quantized = state.quantized
    types_l = state.types_l
    for v in sorted(v for v in allow if cat[v] == "allow"):
        if not state.supports_dtype(v):
            allow.discard(v)
            reason[v] = f"{ops_l[v_node[v]]} does not accept {state.precision} for {state.tg.attr[v]}"
        elif quantized[id(types_l[v_node[v]])]:
            allow.discard(v)
            reason[v] = "quantized node"


def _normalization_blocks(state: PaintingState, info: NormalizationInfo) -> set[tuple[int, int]]:
    """(statistic vertex, apply vertex) pairs along which deny must not propagate.
    Records each apply node's reason in :attr:`normalized`."""
    tg = state.tg
    blocked: set[tuple[int, int]] = set()
    for name, (ports, norm) in sorted(info.apply.items()):
        types = state.types.get(name)
        if types is None or name not in state.inputs:
            continue
        for q in sorted(ports):
            src, sp = state.inputs[name][q]
            src_types = state.types.get(src)
            if src_types is None or sp >= len(src_types.outputs) or q >= len(types.inputs):
                continue
            blocked.add((tg.index[(src, src_types.outputs[sp])], tg.index[(name, types.inputs[q])]))
        state.normalized[name] = (
            f"applies the statistics of normalization {norm.mean!r}/{norm.variance!r} to a "
            "full-size tensor: bounded by construction, so deny does not propagate from the "
            "statistics (they stay float32)"
        )
    return blocked


def _normalization_fences(state: PaintingState, info: NormalizationInfo) -> tuple[set[tuple[int, int]], set[str]]:
    """The fences of the normalizations in ``info``: (apply vertex, reader vertex) pairs along
    which deny must not propagate -- every data edge from a normalization's apply op to a node
    that is neither an apply op nor a statistic, the normalization's output (``x * scale +
    offset``, or ``dy * scale`` in its gradient) --, and the apply nodes fenced, which run in
    float32 (:func:`propagate_deny` denies them), with the norm's input products
    (:func:`_input_products`).  Records the readers' vertices in
    ``state.fence_readers``, the vertices that hand a fenced apply op its full-size input in
    ``state.fence_writers`` (:func:`_add_fence_writers`), and each fenced apply node's reason
    in ``state.normalized``.

    A fence stops deny from any source, not only from the statistics (an ``Exp`` upstream of
    ``x`` too): the norm itself runs in float32, and its output is bounded by construction
    whatever fed it (Keras casts it to the layer's low precision regardless).

    Not fenced: a normalization whose apply feeds a fragile one (statistics over two or three
    values: :func:`~amp_rewrite.plan.normalization.upstream_of_fragile`), whose output flips
    with any rounding upstream; TensorFlow's rules paint it.  Reads the graph; mutates
    ``state`` as said."""
    tg = state.tg
    fences: set[tuple[int, int]] = set()
    fenced: set[str] = set()
    inside = set(info.apply) | set(info.stats)
    fragile = upstream_of_fragile(state.g, info) if info.fragile else {}
    # Per norm, once: its apply ops, what it owns (every norm's apply ops and statistics, and
    # its interior) and the size of its input.
    apply_of: dict[Normalization, set[str]] = {}
    for name, (_, norm) in info.apply.items():
        apply_of.setdefault(norm, set()).add(name)
    owns: dict[Normalization, set[str]] = {}
    full_size: dict[Normalization, int | None] = {}
    shapes = state.g.graph.get("shapes") or {}
    for name, (stat_ports, norm) in sorted(info.apply.items()):
        src_types = state.types.get(name)
        if name in fragile or src_types is None:
            continue
        fenced.add(name)
        if norm not in owns:
            owns[norm] = inside | _interior(state, norm, apply_of[norm], inside)
            moments_input = state.inputs.get(norm.mean) or []
            full_size[norm] = tensor_numel(shapes, moments_input[0]) if moments_input else None
            for product in _input_products(state, norm, owns[norm]):
                fenced.add(product)
                state.normalized[product] = (
                    f"multiplies the input of normalization {norm.mean!r}/{norm.variance!r} into its own gradient "
                    "(dy * x, summed for the statistics' gradients): fenced, it runs in float32, as the "
                    "norm does")
        if full_size[norm] is not None:
            _add_fence_writers(state, name, stat_ports, full_size[norm], owns[norm])
        for y_name in sorted(set(state.g.successors(name))):
            y_types = state.types.get(y_name)
            if y_name in inside or y_name not in state.inputs or y_types is None:
                continue
            for q, (src, sp) in enumerate(state.inputs[y_name]):
                if src != name or sp >= len(src_types.outputs) or q >= len(y_types.inputs):
                    continue
                x = tg.index.get((name, src_types.outputs[sp]))
                y = tg.index.get((y_name, y_types.inputs[q]))
                if x is not None and y is not None:
                    fences.add((x, y))
                    state.fence_readers.add(y)
        state.normalized[name] = (
            f"applies the statistics of normalization {norm.mean!r}/{norm.variance!r}: fenced, it runs in "
            "float32, and deny stops at the normalization's output, which its readers may take in low "
            "precision (as Keras's mixed policies compute a norm layer in float32 and cast its output)"
        )
    return fences, fenced


def _interior(state: PaintingState, norm: Normalization, own_apply: set[str], inside: set[str]) -> set[str]:
    """The nodes computed from ``norm``'s moments inside the norm: reached from its ``Mean``
    nodes along data edges, going past no allow-list op, and one step at most through a fence
    (an edge from one of its apply ops, ``own_apply``, to a node outside ``inside``: its
    output).  In its gradient, ``dy * (x - mean)``, summed from the products of an apply op,
    is such a node: full-size and fed back into the norm, but its own work, float32 in Keras.
    The ``dy`` that reaches the norm from outside is not one.  Pure."""
    seen: set[str] = set()
    stack = [norm.mean, norm.variance]
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        index = state.index.get(x)
        if index is not None and state.cats_l[index] == "allow":
            continue
        for y in state.g.successors(x):
            if y in seen:
                continue
            if x in own_apply and y not in inside:
                seen.add(y)  # reads the norm's output: its own when it also feeds the norm
            else:
                stack.append(y)
    return seen


def _input_products(state: PaintingState, norm: Normalization, own: set[str]) -> list[str]:
    """The nodes outside ``own`` (the norm's apply ops, statistics and interior) that read the
    norm's input ``x`` and feed nothing but the norm (:func:`_feeds_only`): in its gradient,
    ``dy * x``, summed (over the rows of a layer norm, the batch and positions of a batch norm)
    into the gradient of its statistics.  Keras computes it in float32 with the rest of the
    norm; TensorFlow's pass 4 would convert it once ``dy`` and ``x`` are in low precision, and a
    float16 product of a loss-scaled gradient and an activation can overflow.  Reads
    ``state``."""
    ins = state.inputs.get(norm.mean) or []
    if not ins:
        return []
    x = ins[0]
    return [reader for reader in sorted(set(state.g.successors(x[0])) - own)
            if x in state.inputs.get(reader, ()) and _feeds_only(state, reader, own)]


#: How many ops a product of the norm's input may pass through (its sum, a reshape, a sum of
#: such gradients) before it reaches the norm, for :func:`_feeds_only`.
_PRODUCT_REACH = 4


def _feeds_only(state: PaintingState, node: str, own: set[str]) -> bool:
    """Whether every path from ``node`` reaches ``own`` within :data:`_PRODUCT_REACH` ops
    through ops that are neither allow-list ops nor sinks (a fetched gradient, an update).
    Reads ``state``."""
    frontier = {node}
    for _ in range(_PRODUCT_REACH):
        following: set[str] = set()
        for x in frontier:
            successors = set(state.g.successors(x))
            if not successors:
                return False
            for y in successors - own:
                index = state.index.get(y)
                if index is None or state.cats_l[index] == "allow":
                    return False
                following.add(y)
        if not following:
            return True
        frontier = following
    return False


def _add_fence_writers(state: PaintingState, name: str, stat_ports: frozenset[int], full: int,
                       inside: set[str]) -> None:
    """Add to ``state.fence_writers`` the vertices that give the fenced apply op ``name`` a
    full-size input (``full`` values) from outside its normalization (``inside``: the apply ops and
    statistics, and the norm's interior, :func:`_interior`): ``x`` in the forward pass, and in
    the backward the gradient ``dy`` that reaches the norm.  Keras's norm layers upcast their
    input to float32, so what they read is in low precision, and so is the gradient of their
    low-precision output.  Full-size means
    as many values as the ``x`` the statistics are computed from, both known from static
    shapes: the norm's backward also sums statistic-sized gradients (of ``rsqrt(var)``, say)
    outside its apply ops, and those stay float32, as in Keras.  Mutates
    ``state.fence_writers`` only."""
    types = state.types.get(name)
    if types is None or name not in state.inputs:
        return
    shapes = state.g.graph.get("shapes") or {}
    tg = state.tg
    for q, (src, sp) in enumerate(state.inputs[name]):
        src_types = state.types.get(src)
        if (q in stat_ports or src in inside or src_types is None or sp >= len(src_types.outputs)
                or tensor_numel(shapes, (src, sp)) != full):
            continue
        v = tg.index.get((src, src_types.outputs[sp]))
        if v is not None:
            state.fence_writers.add(v)


def recurrent_match(state: PaintingState) -> None:
    """Force NextIteration and the Merge nodes it feeds to one colour."""
    tg = state.tg
    ops_l = state.ops_l
    index = state.index
    for i in state.nodes_with_op("NextIteration"):
        name = state.order[i]
        t_attr = TypeAttr("T", -1, 0)
        ni = tg.find(name, t_attr)
        if ni is None:
            continue
        merges = []
        for dst, _, _ in ir.consumers(state.g, name, 0):
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
            state.allow.add(ni)
            state.reason.setdefault(ni, "dangling NextIteration (no Merge to match)")
            continue
        if all(m in state.allow for m in merges):
            if ni not in state.allow:
                state.allow.add(ni)
                state.reason[ni] = "loop back edge: its Merge is allow"
        else:
            for v in merges + [ni]:
                if v in state.allow:
                    state.allow.discard(v)
                    state.reason[v] = "loop back edge: NextIteration and Merge must match"

def existing_casts(state: PaintingState) -> None:
    """An existing Cast to float32 whose consumers are all allow casts to the target."""
    tg = state.tg
    for i in state.nodes_with_op("Cast"):
        name = state.order[i]
        if name in state.options.preserve and not state.options.tensorflow_bugs:
            # Known difference KD-2: a fetched Cast keeps its dtype.
            continue
        dst_attr = TypeAttr("DstT", -1, 0)
        v = tg.find(name, dst_attr)
        if v is None or state.v_dtype[v] != dt.FLOAT:
            continue
        cons = ir.consumers(state.g, name, 0)
        if not cons:
            continue
        if all(tg.vertex(c, state.types[c].inputs[q]) in state.allow for c, q, _ in cons):
            state.allow.add(v)
            state.reason[v] = "existing Cast feeds only allow consumers"
