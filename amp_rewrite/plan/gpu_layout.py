"""Where TensorFlow's layout optimizer puts Transposes in a graph that runs on a GPU without XLA.

Grappler's generic layout optimizer (TensorFlow 2.21, ``generic_layout_optimizer.cc`` and
``generic_layout_optimizer_transposer.cc``; read there, restated here in our own terms) runs
on every graph a GPU executes without XLA.  It picks one layout for the whole graph:

* it counts the graph's ``Conv2D`` and ``Conv3D`` nodes on a GPU, and among them those whose
  type the GPU runs fastest channels-last (:attr:`DeviceCosts.layout_nhwc_types`: float16 from
  compute capability 7.0, bfloat16 from 8.0, float32 on TF32 from 8.0 -- but float32 only in a
  graph with no float32 convolution gradient, so never in a float32 training step);
* where at least half of them are, it converts channels-first ops to channels-last (Keras's
  graphs are channels-last already: nothing to do); else it converts channels-last ops to
  channels-first (``NHWC`` to ``NCHW``).  So a float32 training step runs NCHW, and a float16
  rewrite of it NHWC.

A conversion is node by node (:func:`layout_transposes`):

* **layout-sensitive ops** (convolutions and their gradients, pooling, ``BiasAdd``, fused batch
  norms...) on a GPU whose ``data_format`` is the source layout and whose tensors have the
  rank the op's rule asks are converted: each data input port of the op's rule gets a Transpose
  into the new layout, each output port of its rule one back;
* **layout-agnostic ops** (element-wise ops, ``AddN``, concatenations, reductions, pads,
  slices...) are converted where one of their data inputs comes, through unconverted agnostic
  ops, from an output a converted op transposes back (:func:`_after_transform`), and their
  operands' ranks fit the op's rule: a binary op needs both ranks known, so an operand whose
  shape is unknown to shape inference keeps the op in the old layout;
* a Transpose back into the old layout feeding a Transpose into the new one cancels: what is
  left is one Transpose on every edge where exactly one end is converted, and Grappler's next
  iteration merges those of one tensor in one direction into one (common-subgraph elimination)
  and folds those of a constant.

So the Transposes fall where a converted region meets an unconverted op: Keras 3's batch norm
written as ``Mul``/``AddV2`` is converted with the convolution around it only where the
per-channel operand's rank is known (at run time a ``tf.function``'s variables' shapes are:
TensorFlow hands them to Grappler with the function's resource arguments); a ``Reshape``, a
``Softmax`` or an unknown op ends a region.

Where TensorFlow's pass fails (it cannot transpose a scalar a converted ``SelectV2`` reads, as
dropout makes one), Grappler keeps the graph as it was: so does this module.

Not modelled: loops (a graph whose loop converts anything is left without Transposes here:
Grappler converts through the loop's frames, or fails on them), the ``DataFormatVecPermute``
and ``Reshape`` nodes a conversion adds for shape vectors and per-channel operands (host-side
or free), nodes common-subgraph elimination merges before the pass, constants folded from
more than the constant subgraphs the cost model knows, and the special case of a ``Pad``
between two cancelling Transposes.  The graph is one Grappler optimizes: :mod:`.step_cost`
hands it a step with its function calls inlined (:mod:`.inlined`), as TensorFlow does; a
function body given alone is taken as inlined where it runs (no Transpose at its arguments and
results).  ``bench/grappler_counts.py --layout`` checks this module node for node against
Grappler's own output; ``tests/test_gpu_layout.py`` rule by rule.

Pure: reads the graph (its ``shapes``), changes nothing.  Imports nothing of TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

import networkx as nx

from ..graph import dtypes as dt
from ..graph.ir import data_inputs
from ..graph.node_values import bool_attr, bytes_attr, int_const_values, int_list_attr
from ..graph.shapes import Shape
from .cost_model import DeviceCosts

__all__ = ["LAYOUT_SENSITIVE_OPS", "LayoutTranspose", "NCHW", "NHWC", "layout_formats", "layout_transposes",
           "source_tensors"]

NHWC = "NHWC"
NCHW = "NCHW"

#: Convolutions the optimizer counts to pick the graph's layout.
_COUNTED_CONVS = frozenset({"Conv2D", "Conv3D"})
#: Convolution gradients whose float32 presence on a GPU takes TF32 float32 convolutions out of
#: the count (cuDNN's TF32 backward convolutions are slow channels-last).
_CONV_BACKPROPS = frozenset({"Conv2DBackpropFilter", "Conv2DBackpropInput", "Conv3DBackpropFilterV2",
                             "Conv3DBackpropInputV2"})


@dataclass(frozen=True)
class _Rule:
    """How a layout-sensitive op is converted: the data input ports that get a Transpose into
    the new layout, and the output ports that get one back."""

    ins: tuple[int, ...]
    outs: tuple[int, ...]


# --- layout-sensitive ops: (input ports transposed, output ports transposed) -----------------
_SENSITIVE: Mapping[str, _Rule] = {
    **dict.fromkeys(("AvgPool", "Conv2D", "DepthwiseConv2dNative", "DepthToSpace", "FusedBatchNorm",
                     "FusedBatchNormV2", "FusedBatchNormV3", "FusedConv2DBiasActivation", "MaxPool",
                     "SpaceToDepth", "BiasAdd", "Conv3D"), _Rule((0,), (0,))),
    "AvgPoolGrad": _Rule((1,), (0,)),
    "BiasAddGrad": _Rule((0,), ()),
    **dict.fromkeys(("Conv2DBackpropFilter", "DepthwiseConv2dNativeBackpropFilter", "Conv3DBackpropFilterV2"),
                    _Rule((0, 2), ())),
    **dict.fromkeys(("Conv2DBackpropInput", "DepthwiseConv2dNativeBackpropInput", "Conv3DBackpropInputV2"),
                    _Rule((2,), (0,))),
    **dict.fromkeys(("FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3"), _Rule((0, 1), (0,))),
    "MaxPoolV2": _Rule((0,), (0,)),
    **dict.fromkeys(("MaxPoolGrad", "MaxPoolGradGrad", "MaxPoolGradV2", "MaxPoolGradGradV2"), _Rule((0, 1, 2), (0,))),
}
#: The ops the optimizer converts whatever feeds them (convolutions, pooling, batch norms...).
LAYOUT_SENSITIVE_OPS = frozenset(_SENSITIVE)
#: Sensitive ops whose rank test reads an input (the port), not output 0.
_RANK_FROM_INPUT = {"AvgPoolGrad": 1, "BiasAddGrad": 0, "MaxPoolV2": 0}
#: Sensitive ops whose tensors must be 4-D; the rest take 4-D or 5-D.
_FOUR_D_ONLY = frozenset({"AvgPoolGrad", "Conv2DBackpropFilter", "DepthwiseConv2dNativeBackpropFilter",
                          "Conv2DBackpropInput", "DepthwiseConv2dNativeBackpropInput", "MaxPoolV2",
                          "MaxPoolGrad", "MaxPoolGradGrad", "MaxPoolGradV2", "MaxPoolGradGradV2"})
_FIVE_D_ONLY = frozenset({"Conv3D", "Conv3DBackpropFilterV2", "Conv3DBackpropInputV2"})
_FUSED_BN_GRADS = frozenset({"FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3"})
#: The convolution gradients whose ``input_sizes`` (input 0) must be a vector.
_SIZES_INPUT = frozenset({"Conv2DBackpropInput", "DepthwiseConv2dNativeBackpropInput"})

# --- layout-agnostic ops --------------------------------------------------------------------
#: Element-wise and forwarding ops converted input 0 to output 0.
_DEFAULT_AGNOSTIC = frozenset({
    "Abs", "Acos", "Acosh", "Angle", "Asin", "Asinh", "Atan", "Atanh", "Bitcast", "Cast", "Ceil", "CheckNumerics",
    "ComplexAbs", "Conj", "Cos", "Cosh", "Digamma", "Elu", "Erf", "Erfc", "Exp", "Expm1", "Floor", "Imag", "Inv",
    "IsFinite", "IsInf", "IsNan", "LeakyRelu", "Lgamma", "Log", "LogicalNot", "Log1p", "Neg", "Real", "Reciprocal",
    "Relu", "Relu6", "Rint", "Selu", "Sigmoid", "Sign", "Sin", "Sinh", "Softplus", "Round", "Rsqrt", "Sqrt",
    "Square", "Tan", "Tanh", "Enter", "Exit", "NextIteration", "GuaranteeConst", "Identity", "OnesLike",
    "PreventGradient", "Snapshot", "StopGradient", "ZerosLike", "FakeQuantWithMinMaxVars",
    "FakeQuantWithMinMaxArgs", "QuantizeAndDequantizeV2", "QuantizeAndDequantizeV3", "QuantizeAndDequantizeV4",
})
_BINARY = frozenset({
    "Add", "AddV2", "Atan2", "ApproximateEqual", "Equal", "Greater", "GreaterEqual", "Less", "LessEqual",
    "NotEqual", "Complex", "Div", "FloorDiv", "Igamma", "Igammac", "LogicalAnd", "LogicalOr", "Maximum", "Minimum",
    "Mod", "Mul", "Polygamma", "Pow", "RealDiv", "SquaredDifference", "Sub", "TruncateDiv", "TruncateMod", "Zeta",
})
_UNARY_GRAD = frozenset({"EluGrad", "InvGrad", "LeakyReluGrad", "ReciprocalGrad", "Relu6Grad", "ReluGrad",
                         "RsqrtGrad", "SeluGrad", "SigmoidGrad", "SoftplusGrad", "SoftsignGrad", "SqrtGrad",
                         "TanhGrad"})
_REDUCE = frozenset({"Sum", "Mean", "Prod", "Max", "Min", "All", "Any"})
_PAD = frozenset({"Pad", "PadV2", "MirrorPad", "MirrorPadGrad"})
_VARIADIC = frozenset({"AddN", "IdentityN", "ShapeN", "Merge", "RefMerge", "_XlaMerge"})
_SWITCH = frozenset({"Switch", "RefSwitch", "_SwitchN"})
_OTHER_AGNOSTIC = frozenset({"AddN", "Concat", "ConcatV2", "IdentityN", "Merge", "RefMerge", "_XlaMerge",
                             "Select", "SelectV2", "Betainc", "Fill", "ReverseV2", "Shape", "ShapeN", "Slice",
                             "Split", "SplitV", "Squeeze", "StridedSlice", "Tile", "Switch", "RefSwitch",
                             "_SwitchN"})
_AGNOSTIC = _DEFAULT_AGNOSTIC | _BINARY | _UNARY_GRAD | _REDUCE | _PAD | _OTHER_AGNOSTIC

#: The dimension groups a reduction without ``keep_dims`` may reduce and still be converted
#: (whole groups only), by the letters of the source layout: where they sit depends on it.
_REDUCE_GROUPS = ("NHWC", "HWC", "NHW", "HW", "C")
_REDUCE_GROUPS_5D = ("NDHWC", "DHWC", "NDHW", "DHW", "C")


@dataclass(frozen=True)
class LayoutTranspose:
    """One Transpose the layout optimizer leaves in a graph: of output ``port`` of ``node``
    into ``to_format``, read by ``readers`` (the converted or unconverted nodes on the other
    side), moving ``elements`` elements (``None``: not fully known) of ``dtype``.  ``name``
    follows Grappler's pattern: after the first reader and the port it reads for one into the
    new layout, after the producer, its port and its first consumer for one back.  Where the
    optimizer made several, common-subgraph elimination keeps one of them, whose name is among
    ``names`` (offline, on the float32 training steps of MobileNetV2 and ResNet50 ``names`` held
    every name Grappler gave, on EfficientNetB0's all but 9 of 460, where ``name`` alone held
    three in four)."""

    node: str
    port: int
    to_format: str
    readers: tuple[str, ...]
    elements: int | None
    dtype: int | None
    name: str
    #: Every name Grappler may have given it (one per edge it was made for, before
    #: common-subgraph elimination kept one): to match measured nodes by name.
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Conversion:
    """A converted node: its input ports that take the new layout, its output ports that give it."""

    ins: frozenset[int]
    outs: frozenset[int]
    #: Output ports that carry a permuted shape vector back (a converted ``Shape``'s): no
    #: Transpose, but what reads them follows a transform.
    permuted: frozenset[int] = frozenset()


def layout_formats(g: nx.MultiDiGraph, on_gpu: Callable[[str], DeviceCosts | None],
                   live: frozenset[str] | None = None) -> tuple[str, str] | None:
    """``(source, destination)`` layouts of the optimizer's conversion of ``g``: ``(NHWC, NCHW)``
    unless at least half the counted convolutions prefer channels-last (module docstring), then
    ``(NCHW, NHWC)``; ``None`` when no node runs on a GPU.  ``on_gpu`` maps a node to its GPU's
    cost class, ``None`` off a GPU.  Only ``live`` nodes count (all when ``None``).  Pure."""
    any_gpu = float32_backprop = False
    counted: list[tuple[int | None, frozenset[int]]] = []
    for name, node in g.nodes(data=True):
        if live is not None and name not in live:
            continue
        costs = on_gpu(name)
        if costs is None:
            continue
        any_gpu = True
        op = node["op"]
        t = (node.get("dtypes") or {}).get("T")
        if op in _CONV_BACKPROPS and t == dt.FLOAT:
            float32_backprop = True
        elif op in _COUNTED_CONVS:
            counted.append((t if isinstance(t, int) else None, costs.layout_nhwc_types or frozenset()))
    if not any_gpu:
        return None
    prefer = sum(t is not None and t in fast and not (t == dt.FLOAT and float32_backprop) for t, fast in counted)
    return (NCHW, NHWC) if counted and prefer * 2 >= len(counted) else (NHWC, NCHW)


def layout_transposes(g: nx.MultiDiGraph, on_gpu: Callable[[str], DeviceCosts | None], *,
                      live: frozenset[str] | None = None, results: Iterable[str] = (),
                      shapes: Mapping[str, tuple[Shape, ...]] | None = None,
                      constants: frozenset[str] = frozenset()) -> tuple[LayoutTranspose, ...]:
    """The Transposes the layout optimizer leaves in ``g`` (module docstring), in the order of
    their producers in ``g``.  ``on_gpu`` maps a node to its GPU's cost class (``None``: the node
    does not run on a GPU, and is never converted).  Only ``live`` nodes run (all when
    ``None``); ``results`` are the graph's fetches, which the optimizer preserves as they are.
    Reads ranks from ``shapes`` (default ``g.graph["shapes"]``; an unknown rank converts
    nothing).  ``constants``: nodes constant folding turns into constants before the layout
    optimizer runs (a Transpose of one is folded too).

    A function body (``g.graph["kind"] == "function"``) is taken as inlined where it runs: its
    arguments and results are edges of the graph it runs in, which carry no Transpose of
    their own here (a converted producer there feeds a converted reader here directly).

    Nothing, as Grappler leaves it: a graph with a loop (``NextIteration``: its frames are
    not modelled, and a conversion that reaches one can fail), and a graph whose conversion
    TensorFlow's pass fails on and abandons: a converted op with an input it would transpose
    whose rank is known and not 4 or 5 (a ``SelectV2`` of a 4-D tensor and a scalar, as
    dropout makes: the optimizer cannot permute a scalar's shape).  Pure."""
    formats = layout_formats(g, on_gpu, live)
    if formats is None:
        return ()
    src, _ = formats
    if any(g.nodes[n]["op"] in ("NextIteration", "RefNextIteration") for n in g.nodes
           if live is None or n in live):
        return ()
    view = _View(g, on_gpu, live, frozenset(results), shapes, constants)
    converted: dict[str, _Conversion] = {}
    for name in g.nodes:  # each on its own: the order does not matter here
        rule = view.sensitive_rule(name, src) if view.runs(name) and g.nodes[name]["op"] in _SENSITIVE else None
        if rule is not None:
            converted[name] = rule
    if not converted:
        return ()
    # An agnostic op follows its producers' conversions: producers first.
    order = view.order()
    for name in order:
        if name not in converted:
            rule = view.agnostic_rule(name, src, converted)
            if rule is not None:
                converted[name] = rule
    if any(view.in_rank(name, p) not in (None, 4, 5) for name, conv in converted.items() for p in conv.ins):
        return ()  # the pass fails on it, and Grappler keeps the graph as it was
    return view.transposes(order, converted, formats)


def source_tensors(g: nx.MultiDiGraph, transposes: Iterable[LayoutTranspose]) -> list[tuple[str, int]]:
    """The tensor each of ``transposes`` moves as Grappler's optimized graph names it: where a
    Transpose reads an ``Identity`` or a reshape to the shape it started from, which Grappler
    removes, the tensor that one hands on.  Pure."""
    view = _View(g, lambda _: None, None, frozenset())
    out = []
    for t in transposes:
        tensor, seen = (t.node, t.port), set()
        while view.op(tensor[0]) == "Identity" and view.ins(tensor[0]) and tensor[0] not in seen:
            seen.add(tensor[0])
            tensor = view.ins(tensor[0])[0]
        out.append(tensor)
    return out


def _five_d(fmt: str) -> str:
    """The 5-D layout of a 4-D one: NHWC -> NDHWC, NCHW -> NCDHW."""
    return fmt[:-2] + "D" + fmt[-2:] if fmt.endswith("HW") else fmt[0] + "D" + fmt[1:]


class _View:
    """The parts of a graph the conversion rules read: ops, ranks, running consumers."""

    def __init__(self, g: nx.MultiDiGraph, on_gpu: Callable[[str], DeviceCosts | None],
                 live: frozenset[str] | None, results: frozenset[str],
                 shapes: Mapping[str, tuple[Shape, ...]] | None = None,
                 constants: frozenset[str] = frozenset()) -> None:
        self.g = g
        self.constants = constants
        self._reaches: dict[str, bool] = {}
        self.on_gpu = on_gpu
        self.live = live
        self.results = results
        self.shapes: Mapping[str, tuple[Shape, ...]] = shapes if shapes is not None else g.graph.get("shapes") or {}
        self._ins: dict[str, list[tuple[str, int]]] = {}
        self._outs: dict[str, dict[int, list[tuple[str, int]]]] = {}
        self._ops: dict[str, str] = {}
        self._built = False

    def op(self, name: str) -> str:
        """``name``'s op as the layout optimizer meets it (:meth:`_no_op_reshape`: a ``Reshape``
        back to the shape it started from is an ``Identity``)."""
        self._build()
        if name in self.constants:
            return "Const"
        return self._ops.get(name) or self.g.nodes[name]["op"]

    def runs(self, name: str) -> bool:
        return self.live is None or name in self.live

    def ins(self, name: str) -> list[tuple[str, int]]:
        """The data inputs of ``name`` as the layout optimizer meets them."""
        self._build()
        found = self._ins.get(name)
        return found if found is not None else data_inputs(self.g, name)

    def outs(self, name: str) -> dict[int, list[tuple[str, int]]]:
        """Running consumers of each output port of ``name``: port -> ``[(consumer, its port)]``."""
        self._build()
        return self._outs.get(name, {})

    def _build(self) -> None:
        """The running graph's edges and ops once, with the earlier passes' no-op reshapes
        removed."""
        if self._built:
            return
        self._built = True
        g = self.g
        for name in g.nodes:
            if self.runs(name):
                self._ins[name] = data_inputs(g, name)
        bypassed: set[str] = set()
        for name, ins in list(self._ins.items()):
            source = self._no_op_reshape(name, ins)
            if source is not None:
                self._ops[name] = "Identity"
                self._ins[name] = [source]
                bypassed.add(ins[0][0])
        # The reshapes a folded chain no longer reads are removed with it when nothing else
        # reads them (data or control), and so on up the chain.
        readers: dict[str, int] = {}
        for name, ins in self._ins.items():
            for src, _ in ins:
                readers[src] = readers.get(src, 0) + 1
        todo = list(bypassed)
        while todo:
            name = todo.pop()
            if (name not in self._ins or g.nodes[name]["op"] != "Reshape" or readers.get(name)
                    or name in self.results or self._control_read(name)):
                continue
            for src, _ in self._ins.pop(name):
                readers[src] -= 1
                todo.append(src)
        for name, ins in self._ins.items():
            for q, (src, port) in enumerate(ins):
                self._outs.setdefault(src, {}).setdefault(port, []).append((name, q))

    def _control_read(self, name: str) -> bool:
        """Whether a running node waits on ``name`` through a control edge."""
        return any(self.runs(v) and any(k < 0 for k in keyed)
                   for v, keyed in self.g._succ[name].items())  # noqa: SLF001

    def _no_op_reshape(self, name: str, ins: list[tuple[str, int]]) -> tuple[str, int] | None:
        """The tensor a ``Reshape`` (through a chain of them) hands on unchanged, where its
        shape is that tensor's own and fully known, else ``None``.  Grappler's arithmetic
        optimizer and constant folding, which run before the layout optimizer, fold such a
        chain (``Reshape(Reshape(x))`` becomes ``Reshape(x)``) and make a reshape to the
        shape it had an ``Identity``: layout-agnostic, where a ``Reshape`` is not."""
        g = self.g
        if g.nodes[name]["op"] != "Reshape" or not ins:
            return None
        after = self.shape((name, 0))
        if after is None or not all(isinstance(d, int) and d >= 0 for d in after):
            return None
        tensor, seen = ins[0], {name}
        while g.nodes[tensor[0]]["op"] == "Reshape" and tensor[0] not in seen:
            seen.add(tensor[0])
            inner = data_inputs(g, tensor[0])
            if not inner:
                break
            tensor = inner[0]
        return tensor if self.shape(tensor) == after else None

    def shape(self, tensor: tuple[str, int]) -> Shape:
        found = self.shapes.get(tensor[0])
        return found[tensor[1]] if found is not None and tensor[1] < len(found) else None

    def out_rank(self, name: str, port: int = 0) -> int | None:
        shape = self.shape((name, port))
        return None if shape is None else len(shape)

    def in_rank(self, name: str, port: int) -> int | None:
        ins = self.ins(name)
        if port >= len(ins):
            return None
        shape = self.shape(ins[port])
        return None if shape is None else len(shape)

    def order(self) -> list[str]:
        """The running nodes in a topological order of their data and control edges (a
        loop's back edges from ``NextIteration`` ignored), ties in graph order.  Pure."""
        g = self.g
        nodes = [n for n in g.nodes if self.runs(n)]
        rank = {n: g.nodes[n].get("order", (0, 0)) for n in nodes}
        dag = nx.DiGraph()
        dag.add_nodes_from(nodes)
        dag.add_edges_from((u, v) for u, v in g.edges() if u in rank and v in rank
                           and g.nodes[u]["op"] not in ("NextIteration", "RefNextIteration"))
        try:
            return list(nx.lexicographical_topological_sort(dag, key=rank.__getitem__))
        except nx.NetworkXUnfeasible:  # a cycle not through NextIteration: graph order
            return sorted(nodes, key=rank.__getitem__)

    def processable(self, name: str) -> bool:
        """The optimizer's common test: on a GPU, not a result, read by something."""
        if self.on_gpu(name) is None or name in self.results:
            return False
        return bool(self.outs(name)) or any(self.runs(v) for v in self.g._succ[name])  # noqa: SLF001

    def sensitive_rule(self, name: str, src: str) -> _Conversion | None:
        """The conversion of layout-sensitive op ``name``, or ``None`` where it stays."""
        node = self.g.nodes[name]
        op = node["op"]
        rule = _SENSITIVE.get(op)
        if rule is None or name in self.constants or not self.processable(name):
            return None  # (constant folding computes a convolution of constants first)
        fmt = bytes_attr(node, "data_format")
        # A GraphDef saved without default attributes gets them back before Grappler runs.
        default = "NDHWC" if op.startswith("Conv3D") else "NHWC"
        data_format = fmt.decode("ascii", "replace") if fmt is not None else default
        rank = self.in_rank(name, _RANK_FROM_INPUT[op]) if op in _RANK_FROM_INPUT else self.out_rank(name)
        five_d = _five_d(src)
        if op in _FIVE_D_ONLY:
            fits = rank == 5 and data_format == five_d
        elif op in _FOUR_D_ONLY:
            fits = rank == 4 and data_format == src
        elif op in ("BiasAdd", "BiasAddGrad"):  # one data_format for both ranks
            fits = rank in (4, 5) and data_format == src
        else:
            fits = (rank == 4 and data_format == src) or (rank == 5 and data_format == five_d)
        if not fits:
            return None
        t = (node.get("dtypes") or {}).get("T")
        if op in ("Conv2D", "Conv2DBackpropInput", "Conv3D") and t not in (dt.HALF, dt.BFLOAT16, dt.FLOAT, dt.DOUBLE):
            return None
        if op in _FUSED_BN_GRADS and bool_attr(node, "is_training") is False:
            return None
        if op in _SIZES_INPUT and self.in_rank(name, 0) != 1:
            return None
        return _Conversion(frozenset(p for p in rule.ins if p < len(self.ins(name))), frozenset(rule.outs))

    def carries_back(self, tensor: tuple[str, int], converted: Mapping[str, _Conversion]) -> bool:
        """Whether the converted producer of ``tensor`` transposes it back into the source
        layout (its port is one of its rule's outputs)."""
        conv = converted.get(tensor[0])
        return conv is not None and (tensor[1] in conv.outs or tensor[1] in conv.permuted)

    def after_transform(self, name: str, converted: Mapping[str, _Conversion]) -> bool:
        """Whether a data input of ``name`` comes, through unconverted layout-agnostic ops, from
        an output a converted op transposes back (the optimizer's test for converting an
        agnostic op)."""
        ins = self.ins(name)
        return any(self._follows(ins[p], converted) for p in self.seed_ports(name) if p < len(ins))

    def _follows(self, tensor: tuple[str, int], converted: Mapping[str, _Conversion]) -> bool:
        """Whether ``tensor`` is transposed back by its converted producer, or made by an
        unconverted agnostic op that follows a transform itself (:meth:`_reach`)."""
        if self.carries_back(tensor, converted):
            return True
        src = tensor[0]
        return src not in converted and self.op(src) in _AGNOSTIC and self._reach(src, converted)

    def _reach(self, start: str, converted: Mapping[str, _Conversion]) -> bool:
        """Whether unconverted agnostic op ``start`` follows a transform, searching depth first
        and remembering each answer: the nodes above it are decided before it (topological
        order), so an answer never changes, and a long chain is searched once, not once per
        node below it.  A cycle counts as not reaching."""
        memo = self._reaches
        stack, open_ = [start], {start}
        while stack:
            n = stack[-1]
            if n in memo:
                stack.pop()
                open_.discard(n)
                continue
            ins = self.ins(n)
            found, deeper = False, None
            for p in self.seed_ports(n):
                if p >= len(ins):
                    continue
                tensor = ins[p]
                if self.carries_back(tensor, converted):
                    found = True
                    break
                src = tensor[0]
                if src in converted or self.op(src) not in _AGNOSTIC or src in open_:
                    continue
                if src not in memo:
                    deeper = src
                    break
                if memo[src]:
                    found = True
                    break
            if deeper is not None and not found:
                stack.append(deeper)
                open_.add(deeper)
                continue
            memo[n] = found
            stack.pop()
            open_.discard(n)
        return memo.get(start, False)

    def seed_ports(self, name: str) -> tuple[int, ...]:
        """The data input ports the after-transform test follows from ``name``."""
        op = self.op(name)
        n = len(self.ins(name))
        if op in ("AvgPoolGrad", "Split"):
            return (1,)
        if op == "StridedSliceGrad":
            return (4,)
        if op in _BINARY or op in _UNARY_GRAD:
            return (0, 1)
        if op in ("Betainc", "Select", "SelectV2") or op.startswith("MaxPoolGrad"):
            return (0, 1, 2)
        if op in _VARIADIC:
            return tuple(range(n))
        if op == "ConcatV2":
            return tuple(range(n - 1))
        if op == "Concat":
            return tuple(range(1, n))
        return (0,) if n else ()

    def agnostic_rule(self, name: str, src: str, converted: Mapping[str, _Conversion]) -> _Conversion | None:
        """The conversion of layout-agnostic op ``name`` given the nodes ``converted`` before it,
        or ``None`` where it stays."""
        op = self.op(name)
        if op not in _AGNOSTIC or not self.processable(name):
            return None
        if op in ("IdentityN", "ShapeN"):
            return self._variadic_rule(name, converted)
        if op in ("Merge", "RefMerge", "_XlaMerge"):
            return self._merge_rule(name, converted)
        rule = self._shape_rule(name, op, src)
        if rule is None or not self.after_transform(name, converted):
            return None
        return rule

    def _shape_rule(self, name: str, op: str, src: str) -> _Conversion | None:
        """The ports ``name`` converts if its ranks and constant operands fit its op's rule."""
        out = self.out_rank(name)
        n = len(self.ins(name))
        four_or_five = out in (4, 5)
        if op in _DEFAULT_AGNOSTIC or op in _UNARY_GRAD or op == "Betainc":
            if not four_or_five:
                return None
            ports = (0, 1) if op in _UNARY_GRAD else (0, 1, 2) if op == "Betainc" else (0,)
            return _Conversion(frozenset(p for p in ports if p < n), frozenset({0}))
        if op in _BINARY:
            a, b = self.in_rank(name, 0), self.in_rank(name, 1)
            if not four_or_five or a is None or b is None or (a, b) not in (
                    (out, 0), (out, 1), (out, out), (0, out), (1, out)):
                return None
            return _Conversion(frozenset(p for p, r in ((0, a), (1, b)) if r == out), frozenset({0}))
        if op == "AddN" or op in ("Concat", "ConcatV2"):
            if not four_or_five:
                return None
            ports = self.seed_ports(name)
            return _Conversion(frozenset(ports), frozenset({0}))
        if op in ("Select", "SelectV2"):
            cond = self.in_rank(name, 0)
            if out != 4 or cond not in (0, 1, 4):
                return None
            return _Conversion(frozenset({0, 1, 2} if cond == 4 else {1, 2}), frozenset({0}))
        if op == "ReverseV2":
            return _Conversion(frozenset({0}), frozenset({0})) if out == 4 else None
        if op in _PAD or op in ("Tile", "Fill"):
            if out != 4 or not self._const_shape_fits(name, 1 if op != "Fill" else 0,
                                                       (4, 2) if op in _PAD else (4,)):
                return None
            return _Conversion(frozenset() if op == "Fill" else frozenset({0}), frozenset({0}))
        if op in _REDUCE:
            return self._reduce_rule(name, src)
        if op == "Shape":
            return (_Conversion(frozenset({0}), frozenset(), frozenset({0})) if self.in_rank(name, 0) in (4, 5)
                    else None)
        if op in ("Slice", "StridedSlice"):
            return self._slice_rule(name, op, out)
        if op in ("Split", "SplitV"):
            outs = self.shapes.get(name) or ()
            ranks = {None if s is None else len(s) for s in outs}
            if not outs or len(ranks) != 1 or ranks.pop() not in (4, 5):
                return None
            return _Conversion(frozenset({1} if op == "Split" else {0}), frozenset(range(len(outs))))
        if op == "Squeeze":
            return self._squeeze_rule(name, out, src)
        if op in _SWITCH:
            if self.in_rank(name, 0) not in (4, 5):
                return None
            return _Conversion(frozenset({0}), frozenset(range(max(2, len(self.shapes.get(name) or ())))))
        return None

    def _const_shape_fits(self, name: str, port: int, dims: tuple[int, ...]) -> bool:
        """The optimizer's test of a shape operand: any non-constant passes; a constant must
        have shape ``dims``."""
        ins = self.ins(name)
        if port >= len(ins) or self.op(ins[port][0]) != "Const":
            return True
        shape = self.shape(ins[port])
        return shape is not None and tuple(shape) == dims

    def _reduce_rule(self, name: str, src: str) -> _Conversion | None:
        rank = self.in_rank(name, 0)
        if rank not in (4, 5):
            return None
        node = self.g.nodes[name]
        keep = bool(bool_attr(node, "keep_dims"))
        if not keep:
            # The axes must be a constant vector (a scalar axis is not) naming whole groups.
            ins = self.ins(name)
            axes_shape = self.shape(ins[1]) if len(ins) > 1 else None
            axes = int_const_values(self.g.nodes[ins[1][0]]) if len(ins) > 1 else None
            if axes is None or axes_shape is None or len(axes_shape) != 1:
                return None
            fmt = src if rank == 4 else _five_d(src)
            letters = sorted(fmt[a + rank if a < 0 else a] for a in axes if -rank <= a < rank)
            groups = _REDUCE_GROUPS if rank == 4 else _REDUCE_GROUPS_5D
            if len(letters) != len(axes) or not any(sorted(g) == letters for g in groups):
                return None
        return _Conversion(frozenset({0}), frozenset({0}) if keep else frozenset())

    def _slice_rule(self, name: str, op: str, out: int | None) -> _Conversion | None:
        if out not in (4, 5):
            return None
        if op == "StridedSlice":
            node = self.g.nodes[name]
            ints = node.get("ints") or {}
            if any(ints.get(k, 0) for k in ("ellipsis_mask", "new_axis_mask", "shrink_axis_mask")):
                return None
            if not all(self._const_shape_fits(name, p, (4,)) for p in (1, 2, 3)):
                return None
        elif not all(self._const_shape_fits(name, p, (out,)) for p in (1, 2)):
            return None
        return _Conversion(frozenset({0}), frozenset({0}))

    def _squeeze_rule(self, name: str, out: int | None, src: str) -> _Conversion | None:
        """A squeeze of a 4-D tensor whose H and W (the source layout's) are 1, down to [N, C]
        or [C]."""
        dims = int_list_attr(self.g.nodes[name], "squeeze_dims")
        shape = self.shape(self.ins(name)[0]) if self.ins(name) else None
        h, w = src.index("H"), src.index("W")
        if dims is None or shape is None or len(shape) != 4 or shape[h] != 1 or shape[w] != 1:
            return None
        letters = sorted(src[d + 4 if d < 0 else d] for d in dims if -4 <= d < 4)
        if len(letters) != len(dims):
            return None
        if (out == 2 and (not letters or letters == sorted("HW"))) or (
                out == 1 and (not letters or letters == sorted("NHW"))):
            return _Conversion(frozenset({0}), frozenset())
        return None

    def _variadic_rule(self, name: str, converted: Mapping[str, _Conversion]) -> _Conversion | None:
        """``IdentityN``/``ShapeN``: each 4-D input that follows a transform is converted."""
        ports = []
        for p, tensor in enumerate(self.ins(name)):
            shape = self.shape(tensor)
            if shape is None or len(shape) != 4:
                continue
            if self._follows(tensor, converted):
                ports.append(p)
        if not ports:
            return None
        if self.op(name) == "IdentityN":
            return _Conversion(frozenset(ports), frozenset(ports))
        return _Conversion(frozenset(ports), frozenset(), frozenset(ports))

    def _merge_rule(self, name: str, converted: Mapping[str, _Conversion]) -> _Conversion | None:
        """``Merge``: every input 4-D (or 5-D) and following a transform."""
        ins = self.ins(name)
        if not ins or self.in_rank(name, 0) not in (4, 5):
            return None
        for tensor in ins:
            shape = self.shape(tensor)
            if shape is None or len(shape) not in (4, 5) or not self._follows(tensor, converted):
                return None
        return _Conversion(frozenset(range(len(ins))), frozenset({0}))

    def transposes(self, order: list[str], converted: Mapping[str, _Conversion],
                   formats: tuple[str, str]) -> tuple[LayoutTranspose, ...]:
        """One Transpose per tensor and direction on the edges where exactly one end is
        converted; none of a constant (folded)."""
        src, dst = formats
        boundary = self.g.graph.get("kind") == "function"
        found: dict[tuple[str, int, str], list[tuple[str, int]]] = {}
        for name in order:
            conv = converted.get(name)
            for port, readers in sorted(self.outs(name).items()):
                out_side = conv is not None and port in conv.outs
                for reader, q in readers:
                    rc = converted.get(reader)
                    in_side = rc is not None and q in rc.ins
                    if out_side == in_side:
                        continue  # neither end converted, or a cancelled pair
                    if boundary and (self.g.nodes[name].get("synthetic") == "arg"
                                     or self.g.nodes[reader].get("synthetic") == "retval"):
                        continue  # an edge of the graph the function is inlined into
                    if in_side and self.op(name) == "Const":
                        continue  # a Transpose of a constant is folded
                    found.setdefault((name, port, src if out_side else dst), []).append((reader, q))
        out = []
        for (name, port, to), edges in found.items():
            readers = tuple(sorted({r for r, _ in edges}))
            if to == src:  # back: one per consumer edge of the port (converted ones too, whose
                # pairs cancel), numbered in name order
                labels = [f"{name}-{port}-{k}-Transpose{dst}To{src}"
                          for k in range(len(self.outs(name).get(port, edges)))]
            else:  # into the new layout: one per reading edge (and, after those, one per other
                # port of each reader: the arithmetic optimizer reorders an AddN's inputs)
                labels = [f"{r}-{q}-Transpose{src}To{dst}" for r, q in sorted(edges)]
                labels += [f"{r}-{q}-Transpose{src}To{dst}" for r in readers for q in range(len(self.ins(r)))
                           if (r, q) not in edges]
            shape = self.shape((name, port))
            n = None
            if shape is not None and all(isinstance(d, int) and d >= 0 for d in shape):
                n = 1
                for d in shape:
                    n *= d
            node = self.g.nodes[name]
            types = node.get("dtypes") or {}
            dtype = types.get("DstT" if node["op"] == "Cast" else "T", types.get("dtype"))
            dtype = dtype if isinstance(dtype, int) else None
            names = tuple(label + "-LayoutOptimizer" for label in labels)
            out.append(LayoutTranspose(name, port, to, readers, n, dtype, names[0], names))
        return tuple(out)
