"""A per-node cost model: estimated nanoseconds for an op in float32 or in low precision.

Used by the cost-aware planner (:mod:`amp_rewrite.plan.mincut`) to decide where converting
pays.  The model is deliberately simple -- a roofline per node plus a fixed cost per extra
op -- because its job is to rank colourings, not to predict step times:

* dense math (MatMul, BatchMatMul, Conv2D/3D and their gradients, Einsum) costs
  ``flops / rate(dtype) + bytes / bandwidth``, or, for an op whose time the device class
  measured inside models (:attr:`DeviceCosts.dense`), that roofline scaled to the measured
  float32 time, times the measured low-precision ratio, both for ops of that size
  (:class:`DenseBand`);
* cuDNN's recurrent layers (``CudnnRNN*``, what Keras 3's LSTM and GRU become on a GPU) are
  dense math too: the GEMMs of every gate block and time step (:func:`_rnn_work`; twice
  that backward) at the share of the rates such calls reach, plus a fixed time per time
  step, since the recurrence runs them one after another (both fitted to an H200's LSTM
  steps, :data:`GPU_RNN_STEP_TIME`);
* ops that only forward or re-describe a tensor (:data:`ALIAS_OPS`), or read only its shape
  (:data:`METADATA_OPS`), cost nothing;
* everything else is element-wise: ``bytes / bandwidth``, times a per-op factor for ops
  whose float32 kernel is compute bound (Erfc, Softplus, Selu ...), and in low precision
  times the device's ratio for that op (:attr:`DeviceCosts.elementwise`) or its generic one;
  a class measured at large sizes too has a second table for tensors past an edge
  (:attr:`DeviceCosts.large_elementwise`: large tensors stream from memory, where small ones
  stay in the caches and pay fixed costs);
* a Cast costs ``op_overhead + elements * (4 + 2) / bandwidth * cast_traffic`` (the
  class's measured traffic factor, :attr:`DeviceCosts.cast_traffic`), or, for a tensor of known
  shape on a device class whose Casts were measured in place inside models
  (:attr:`DeviceCosts.cast_in_place`), that measured fixed cost plus cost per element;
* a dense op in low precision whose weights change every step (a variable's read, and any
  filter gradient) also pays the class's :attr:`DeviceCosts.low_dense_overhead`, the library's
  re-layout of them per call; frozen weights are laid out once.

Under XLA (``compiled=True``: ``jit_compile=True``, ``amp-rewrite rewrite --xla``) the graph
is not run op by op.  XLA fuses every element-wise op and every Cast into a neighbouring
kernel (a loop fusion, or the prologue/epilogue of a GEMM or convolution), so they launch
nothing, and a tensor passed between two fused ops never reaches memory.  The model keeps
only what a fused op still moves, one consistent rule for both kinds:

* an element-wise op costs the bytes of its *output* once (written at the fusion's boundary,
  or, when fused into its consumer, the bytes that consumer would otherwise read), in the
  precision it runs in, plus the arithmetic part of its float32 time (the per-op compute
  factor of :attr:`DeviceCosts.elementwise` above 1, which XLA does in float32 registers in
  either precision, so it does not change with the colour; 1 on a GPU, whose factors measure
  TensorFlow's own kernels, :attr:`DeviceCosts.tables_unfused_only`).  The class's measured
  low/float32 ratios are those of TensorFlow's own kernels and do not apply to XLA's
  generated code;
* a Cast costs no fixed time (no launch, no executor overhead) and writes one extra copy of
  its tensor in the low-precision type: ``elements * low_bytes / bandwidth``.  (Its read is
  shared with the fused producer or replaces the consumer's read of the float32 tensor.)

Dense ops are priced as without XLA: XLA calls the same GEMM/convolution libraries (but for a
GPU's measured depthwise bands, which are TensorFlow's own float32 kernels).  This
makes converting cheap and memory traffic what remains, which is what XLA's fusion does; the
model deliberately ignores fusions XLA may fail to form (a fusion's size limits, ops it
cannot fuse), so it leans towards converting under XLA.

Rates are per device class (:data:`DEVICE_COSTS`).  The class for this repository's CPU was
calibrated by timing every node of Keras models in float32 and in bfloat16, in place
(``bench/calibrate_in_place.py``), and Casts inserted into models (see CONTRIBUTING.md).
GPUs have one class per compute-capability family (:func:`gpu_costs`): Hopper's rates were
measured on an H100 through TensorFlow, Ampere's and Volta's are NVIDIA's published peaks, and
float32 is TF32 from 8.0 unless TF32 is off (:data:`TF32_OFF`).  Without XLA, TensorFlow's
executor also spends host time on each kernel (:data:`GPU_HOST_PER_KERNEL`, measured in whole
steps on the H100's host), which overlaps the device: a step of many small kernels waits for
its host, and a rewrite's Casts lengthen it (``StepEstimate.total_ns``); and TensorFlow's own
kernels there, its Casts among them, were timed node by node inside training steps on an H200
(:data:`GPU_ELEMENTWISE`, :data:`GPU_DENSE`, :data:`GPU_CAST_TRAFFIC`): reductions and
broadcasts run several times their bytes' time, float32 depthwise convolutions several times
their roofline, and most element-wise ops take 0.4-0.7 of their float32 time in float16.  The
AMX ones follow the vendors' published ratios (AMX about 8x AVX-512 float32).
Shape-aware: a matrix whose dimensions miss the device's preferred multiple loses part of
the low-precision speed-up (:func:`alignment_efficiency`).

The planner sums only what a colouring changes.  A whole step -- to compare with a measured
one -- is priced by :mod:`amp_rewrite.plan.step_cost` with these same per-node rules, plus a
fixed time per kernel (:attr:`DeviceCosts.kernel_overhead`) and, under XLA, fusion
boundaries read from the graph instead of the per-op rule above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping, NamedTuple, Sequence

from ..graph import dtypes as dt
from ..graph.op_registry import OpRegistry
from ..graph.shapes import Shape, numel
from .targets import Device

__all__ = ["DeviceCosts", "DenseBand", "dense_band", "conv_positions", "elementwise_entry",
           "X86_BF16_LARGE_ELEMENTWISE", "X86_BF16_LARGE_ELEMENTS", "DEVICE_COSTS", "costs_for", "gpu_costs",
           "TF32_OFF",
           "GPU_DENSE_EFFICIENCY", "GPU_KERNEL_OVERHEAD", "GPU_HOST_PER_KERNEL", "GPU_LOW_ELEMENTWISE", "GPU_ELEMENTWISE",
           "GPU_DENSE", "GPU_CAST_TRAFFIC", "GPU_GUESSED_LOW", "NodeCost", "node_cost", "compiled_compute_factor",
           "cast_cost", "DENSE_OPS", "RNN_OPS", "RNN_GRAD_OPS", "ALIAS_OPS", "METADATA_OPS", "misaligned_dims",
           "alignment_efficiency", "elements", "constant_nodes"]

#: Dense ops whose cost is dominated by multiply-accumulates.
MATMUL_OPS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum",
                        "_FusedMatMul", "SparseMatMul"})
CONV_OPS = frozenset({"Conv2D", "Conv3D", "Conv2DBackpropInput", "Conv2DBackpropFilter",
                      "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2", "_FusedConv2D"})
DEPTHWISE_OPS = frozenset({"DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
                           "DepthwiseConv2dNativeBackpropFilter"})
#: cuDNN's fused recurrent layers (Keras 3's LSTM and GRU trace to ``CudnnRNNV3`` on a GPU):
#: a GEMM per gate block and time step, run one time step after another.
RNN_OPS = frozenset({"CudnnRNN", "CudnnRNNV2", "CudnnRNNV3"})
RNN_GRAD_OPS = frozenset({"CudnnRNNBackprop", "CudnnRNNBackpropV2", "CudnnRNNBackpropV3"})
DENSE_OPS = MATMUL_OPS | CONV_OPS | DEPTHWISE_OPS | RNN_OPS | RNN_GRAD_OPS
#: Ops that forward or re-describe their input without a kernel touching the data: free in
#: either precision (pricing them as element-wise ops charged every weight's ``Identity``).
ALIAS_OPS = frozenset({"Identity", "IdentityN", "Snapshot", "StopGradient", "PreventGradient",
                       "Reshape", "Squeeze", "ExpandDims", "EnsureShape"})
#: Ops that read only their input's shape, never its data: free in either precision (the
#: step stats of the DenseNet121 training step show its 88 ``ShapeN`` taking no measurable
#: time; priced as element-wise ops they cost 1.8 ms there).
METADATA_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})

def constant_nodes(order: Sequence[str], ops: Mapping[str, str],
                   inputs: Mapping[str, Sequence[tuple[str, int]]], registry: OpRegistry) -> frozenset[str]:
    """Nodes whose value constant folding computes once, when the graph is loaded: ``Const``
    nodes and every stateless op whose data inputs (``inputs``: node -> ``(producer, port)``)
    are all such nodes (frozen weights behind ``Identity``, the Casts of a frozen graph's
    weights, an inference batch norm's ``gamma * rsqrt(var + eps)``).  Pure; assumes ``order``
    lists producers before consumers (a loop's back edge makes its ``Merge`` non-constant,
    which is the safe answer)."""
    consts: set[str] = set()
    for name in order:
        op = ops[name]
        if op == "Const":
            consts.add(name)
            continue
        ins = inputs.get(name) or ()
        sig = registry.op(op)
        if ins and sig is not None and not sig.is_stateful and all(src in consts for src, _ in ins):
            consts.add(name)
    return frozenset(consts)


#: Elements assumed for one unknown dimension (typically a batch) and for an unknown rank.
UNKNOWN_DIM = 32
UNKNOWN_TENSOR = 65536


class DenseBand(NamedTuple):
    """A dense op's measured behaviour for one range of sizes (multiply-add flops).

    Both numbers change with size: a small convolution spends most of its time in fixed
    costs (primitive dispatch, threads waking, in-place contention) that low precision does
    not shrink, a large one in the math that it does.
    """

    below_flops: float  #: upper end of the range (exclusive); ``math.inf`` for the last band
    scale: float  #: float32 time over the roofline estimate
    #: low-precision time over float32 time, without :attr:`DeviceCosts.low_dense_overhead`
    #: (added apart, only where the weights change every step).
    ratio: float
    #: The band applies only to convolutions with fewer output positions times batch than this
    #: (:func:`conv_positions`): the skinny GEMMs of deep layers at a small batch, which behave
    #: unlike a wide convolution of the same flops.  Such a band comes before the band of the
    #: same size range that serves every other op.
    below_positions: float = math.inf
    #: The band applies only to convolutions with constant (``True``) or variable (``False``)
    #: weights; ``None``: to both.  oneDNN re-lays out a constant filter once and a variable
    #: one on every call, so the same shapes can gain in one case and lose in the other.
    constant_weights: bool | None = None


@dataclass(frozen=True)
class DeviceCosts:
    """Throughputs of one class of device.  Rates in operations or bytes per nanosecond."""

    name: str
    f32_flops: float  #: dense float32 multiply-add rate (flop/ns)
    low_flops: float  #: dense low-precision rate on aligned shapes (flop/ns)
    bandwidth: float  #: memory bandwidth for element-wise ops and casts (bytes/ns)
    #: time of a low-precision element-wise op relative to float32 on the same element
    #: count (0.5 = half, as memory traffic halves; >0.5 where kernels convert per element).
    low_elementwise: float
    #: speed of depthwise convolution in low precision relative to float32.
    low_depthwise: float
    op_overhead: float  #: fixed cost of one more op (a Cast) in the executor (ns)
    multiple: int  #: preferred multiple of matrix dimensions for the fast low-precision path
    #: low-precision dense rate when shapes miss ``multiple`` (no Tensor Cores / tiles).
    misaligned_low_flops: float
    #: Per element-wise op: (float32 time over the memory-bound estimate, low-precision time
    #: over float32 time).  Ops not listed use (1, ``low_elementwise``).
    elementwise: Mapping[str, tuple[float, float]] = field(default_factory=lambda: MappingProxyType({}),
                                                           hash=False)
    #: A Cast of a tensor of known shape inserted into a model, measured in place
    #: (``bench/calibrate_casts.py``): (fixed ns, ns per element).  ``None``: ``op_overhead +
    #: elements * (4 + low bytes) / bandwidth * cast_traffic``, which also prices a Cast of
    #: unknown size.
    cast_in_place: tuple[float, float] | None = None
    #: Fixed extra time of a dense op in low precision whose weights change every step
    #: (variables, and every filter gradient): the library re-lays them out per call (ns).
    low_dense_overhead: float = 0.0
    #: Per dense op, measured inside models (``bench/calibrate_in_place.py``): one
    #: :class:`DenseBand` per size range, smallest first, the last one open-ended.  Ops not listed
    #: use the rates above.
    dense: Mapping[str, tuple[DenseBand, ...]] = field(default_factory=lambda: MappingProxyType({}),
                                                       hash=False)
    #: Convolutions' own float32 and low-precision rates (flop/ns), where the libraries reach
    #: other rates on them than on GEMMs (cuDNN against cuBLAS).  ``None``: the GEMM rates.
    conv_rates: tuple[float, float] | None = None
    #: The fraction of the nominal dense rates that a model's GEMMs and convolutions reach,
    #: over float32 and low precision alike (its shapes are smaller than a benchmark's).
    dense_efficiency: float = 1.0
    #: Fixed device time per kernel a step launches (ns), whatever its precision: its launch
    #: and latency floor without XLA (the executor's host time is ``host_per_kernel``), each
    #: dense op's library call (and the fusions around it) under XLA.  A colouring changes it only through its Casts (``op_overhead``), so the
    #: planner never sees it; the step estimate (:mod:`amp_rewrite.plan.step_cost`) does.
    kernel_overhead: float = 0.0
    #: Host time of TensorFlow's executor per kernel it launches without XLA (ns): it runs
    #: beside the device's work, so a step takes the longer of the two (``StepEstimate``).
    #: Zero where the host is the device (CPU classes: their per-op costs hold it).
    host_per_kernel: float = 0.0
    #: The model's error on this class's whole steps without XLA, as a fraction of the float32
    #: step: the least estimated gain a whole-step check asks of a rewrite there
    #: (:func:`amp_rewrite.step_check.whole_step_margin`), where it exceeds the planner's 3%.
    unfused_step_error: float = 0.0
    #: Element-wise ops on tensors of at least ``large_elements`` elements (inputs and outputs
    #: together), measured in place at those sizes: (float32 time over the memory-bound
    #: estimate, low-precision time over float32 time), as :attr:`elementwise` is for smaller
    #: ones.  A kernel's fixed costs and cache-resident data shape the small ratios; streaming
    #: from memory shapes the large ones.  Ops not listed use :attr:`elementwise`.  A large
    #: tensor is never priced under the largest small one (:func:`node_cost`).
    large_elementwise: Mapping[str, tuple[float, float]] = field(default_factory=lambda: MappingProxyType({}),
                                                                 hash=False)
    large_elements: int = 0
    #: Fixed time of one time step of a cuDNN recurrent call (ns), in either precision: the
    #: recurrence runs its steps one after another, each a few small kernels and a
    #: synchronisation.  ``0``: one :attr:`kernel_overhead` per step.
    rnn_step_time: float = 0.0
    #: The shares of the nominal float32 and low-precision GEMM rates a cuDNN recurrent call
    #: reaches (its GEMMs are one time step of a batch at a time).  ``None``:
    #: :attr:`dense_efficiency` for both.
    rnn_efficiency: tuple[float, float] | None = None
    #: Whether Grappler's remapper fuses the bias and the activation after a frozen dense op
    #: into it as with oneDNN on a CPU; ``False``: only as on a GPU, where one add and every
    #: activation run but a Conv2D's ``BiasAdd`` + ``Relu`` (:mod:`.grappler_folds`).
    fuses_bias_activation: bool = True
    #: The convolution types TensorFlow's layout optimizer counts as running fastest
    #: channels-last on this GPU (:mod:`.gpu_layout`): float16 from compute capability 7.0,
    #: bfloat16 and TF32 float32 from 8.0 (float32 only where TF32 is on).  ``None``: not a GPU;
    #: the optimizer leaves the layout of the graphs it runs as it is.
    layout_nhwc_types: frozenset[int] | None = None
    #: Whether :attr:`elementwise` and :attr:`dense` describe TensorFlow's own kernels run op by
    #: op (a GPU's: Eigen's broadcasting and reduction kernels, TensorFlow's float32 depthwise
    #: convolutions), so that a graph compiled by XLA, which emits its own kernels, is priced
    #: without them.  ``False``: they hold under XLA too (a CPU's: the compute factors are the
    #: ops' arithmetic, and the dense bands its libraries' calls).
    tables_unfused_only: bool = False
    #: A Cast's time over the memory-bound time of its bytes (``4 + low bytes`` per element),
    #: where :attr:`cast_in_place` does not price it: 1 for a kernel at the device's bandwidth.
    cast_traffic: float = 1.0
    #: Ops of :attr:`elementwise` whose float32 factor was measured but not their low ratio (no
    #: such node was converted where they were timed): priced with the generic ratio, and not
    #: counted as measured (:attr:`NodeCost.measured`), so the planner takes no gain from them
    #: without XLA.
    guessed_low: frozenset[str] = frozenset()


#: Element-wise ops in bfloat16 on x86 CPUs, measured on this repository's benchmark CPU (AMD
#: EPYC, AVX512-BF16, no AMX) with ``bench/calibrate_elementwise.py``: two runs, each the
#: geometric mean over 16k and 262k elements; (float32 time / memory-bound estimate, floored at
#: 1; bfloat16 time / float32 time).  AVX512-BF16 (and AMX, whose tiles only multiply) has
#: conversions and dot products but no bf16 arithmetic, and TensorFlow's element-wise kernels
#: are Eigen's, converting element by element: transcendental functions and most activation
#: gradients run 1.4-5.5x slower than in float32 (GELU's Erfc in a BERT-like encoder took 861
#: us against 122 us per step).  The second group was measured in place, inside models; the
#: planner counts a listed op's gain as well as its loss, and only the loss of an unlisted one.
X86_BF16_ELEMENTWISE: Mapping[str, tuple[float, float]] = MappingProxyType({
    "Erfc": (4.2, 5.5), "Erf": (1.6, 1.7), "Tanh": (1.5, 1.65), "Sigmoid": (1.5, 2.9),
    "Exp": (1.7, 1.5), "Log": (1.8, 1.5), "Softplus": (11.8, 1.4), "Rsqrt": (1.0, 1.65),
    "Sqrt": (1.0, 1.35), "Relu6": (1.0, 2.9), "Elu": (1.9, 2.2), "Selu": (2.7, 3.15),
    "Sin": (3.2, 1.3), "Reciprocal": (1.0, 1.3), "SquaredDifference": (1.0, 1.5),
    "Relu6Grad": (1.0, 2.3), "EluGrad": (1.0, 1.9), "SeluGrad": (1.0, 1.85),
    "SoftplusGrad": (1.8, 2.6), "SigmoidGrad": (1.3, 1.6), "TanhGrad": (1.4, 1.8),
    "RsqrtGrad": (1.3, 2.2), "SqrtGrad": (1.0, 1.75), "ReciprocalGrad": (1.15, 1.45),
    # Measured in place (bench/calibrate_in_place.py, two runs over eight Keras models,
    # float32 against TensorFlow's bfloat16 rewrite, each node's own time): plain arithmetic,
    # which timed alone is within the noise, runs 1.2-2.4x slower in bfloat16 inside models,
    # and data movement (Pad, ConcatV2, Tile) and reductions gain from the halved bytes.
    # "_Swish" is x * sigmoid(x), which Grappler fuses into one oneDNN kernel: as fast as
    # float32.  (Relu6 and Relu6Grad above: in place, not alone.)
    "Relu": (1.0, 2.4), "ReluGrad": (1.0, 1.65), "AddV2": (1.0, 1.6), "AddN": (1.0, 2.05),
    "Sub": (1.0, 1.45), "Mul": (1.0, 1.2), "RealDiv": (1.0, 3.5), "_Swish": (4.4, 1.0),
    "Pad": (1.0, 0.6), "ConcatV2": (1.0, 0.6), "Tile": (1.5, 0.75), "Mean": (1.3, 0.7),
    "Sum": (1.2, 0.8),
})

#: Element-wise ops on tensors of at least :data:`X86_BF16_LARGE_ELEMENTS` elements (inputs
#: and outputs), measured in place in bfloat16 on the same CPU (``bench/calibrate_in_place.py
#: --batch 8``: ResNet50, MobileNetV2, EfficientNetB0, DenseNet121 and InceptionV3 inference at
#: 224x224, and the first three's training steps at 128x128, 2026-11-27; the dumps and commands
#: are in ``bench/cpu_runs/2026-11-27-sizes/``).  Same columns as above, but the float32
#: column is not floored at 1: streaming a large tensor, simple arithmetic runs at 2-5x the
#: class's memory-bound estimate (whose bandwidth prices the batch-2 tensors, fixed costs
#: included), and a swish kernel at 0.4 of it, where at batch 2 it took 4.4.  The ratios move
#: too: Relu and AddV2 lose less in bfloat16 (1.7 and 1.3 rather than 2.4 and 1.6), Relu6
#: more (4.8), and pooling and slicing, which the small table leaves at the generic 1.2, gain
#: 30-45% from the halved bytes.  The edge, 2^19 elements, splits the two calibrations: 2% of
#: the batch-2 element-wise time lies above it, 81% of the batch-8 time.
X86_BF16_LARGE_ELEMENTS = 2**19
X86_BF16_LARGE_ELEMENTWISE: Mapping[str, tuple[float, float]] = MappingProxyType({
    "Mul": (0.38, 1.33), "Mean": (0.86, 0.7), "SquaredDifference": (0.92, 1.26), "Relu": (0.24, 1.73),
    "Sum": (0.99, 0.62), "AddV2": (0.29, 1.34), "_Swish": (0.4, 0.96), "Sub": (0.49, 1.71),
    "ConcatV2": (0.39, 0.42), "AddN": (0.22, 2.23), "Tile": (0.96, 0.79), "Pad": (0.44, 0.47),
    "Sigmoid": (0.85, 3.17), "RealDiv": (0.21, 2.84), "Relu6": (0.17, 4.76), "ReluGrad": (0.28, 1.54),
    "Relu6Grad": (0.25, 2.31), "MaxPool": (0.68, 0.59), "AvgPool": (0.91, 0.68), "Slice": (0.43, 0.55),
})

#: Dense ops in bfloat16 on this repository's benchmark CPU, measured in place with
#: ``bench/calibrate_in_place.py`` over fourteen corpus items (every convolutional model's
#: training step and inference graph, VGG16's and DenseNet121's included, and the BERT-like
#: encoder) at batch 2, in one run on 2026-11-25, summed per op and size band: (below flops,
#: float32 time / roofline estimate, bfloat16 time / float32 time net of the 20 us weight
#: re-layout).  The gain grows with size, and one number per op cannot serve both ends: a
#: forward convolution under 20 Mflop gains 15-20%, a larger one 35-45%; the filter gradient
#: gains nothing below 200 Mflop and a third above (VGG16's); the input gradient gains 25% on
#: the smallest and half on the largest.  Small ops run 1.5-4x their roofline time (fixed
#: costs), large ones well inside it (oneDNN's float32 kernels beat the nominal rate).
#: Depthwise gradients run 2.5x slower in bfloat16 at every size.  Matrix dimensions that miss
#: the multiple of 16 measured no worse here, so a measured op's ratio is not lowered for them
#: (they are still reported).  A second run agreed within 0.06 on 9 of the 12 convolution
#: bands; the forward convolution's varied most (0.71, 0.80 and 0.68 for the first, third and
#: last band).  A third, its rounds spread over three pairs of fresh sessions, agreed within
#: 0.08 on all 12 (forward: 0.72, 0.81, 0.72, 0.60).  The three runs' medians would move the
#: forward bands to 0.72, 0.82, 0.72 and 0.60, which converts 1x1 convolutions of the
#: MobileNetV2 and EfficientNetB0 training steps for estimated gains of 3% -- the size of gain
#: that ran 10% slower there before (``optimal.MIN_ESTIMATED_GAIN``) -- so the table stays.
#: An interleaved A/B of the four training plans the medians change (12 rounds over three
#: sets of sessions, 2026-11-25) agreed: MobileNetV2 1.15 of float32 against the table's
#: 1.01, EfficientNetB0 0.97 against 0.94 (the table's plan is the float32 graph there),
#: InceptionV3 0.93 against 0.93, DenseNet121 1.03 against 1.02.
#: Models, and runs, differ around these sums: DenseNet121's narrow 3x3x128x32 convolutions
#: gained 7-12% in one profile and 9-24% in another, mostly below their bands.
#:
#: The 5-200 Mflop convolution bands were refitted on 2026-11-27 (``bench/fit_conv_bands.py
#: --ranges 2e7,2e8`` over six in-place calibration dumps: the training steps of ResNet50,
#: MobileNetV2, EfficientNetB0, DenseNet121, InceptionV3 and VGG16 at batch 2 and 8, and five
#: inference graphs at batch 1, 2 and 8; ``bench/cpu_runs/2026-11-27-wide/``).  In those ranges
#: one band per op and size mixed two kinds of convolution:
#:
#: * by output positions times batch (:func:`conv_positions`, the rows of the GEMM): a deep layer
#:   at a small batch is a skinny GEMM reading a large filter.  Under 16 and under 64 positions
#:   the float32 time is 0.9-3.4x the roofline, over 64 positions 0.3-1.4x, and the gain in
#:   bfloat16 differs as well (20-200 Mflop input gradients: 0.41-0.46 skinny, 0.64 wide;
#:   filter gradients lose 4-22% skinny and gain 11-20% wide);
#: * for the forward convolution, by constant or variable weights (:attr:`DenseBand.constant_weights`):
#:   oneDNN re-lays out a constant filter once and a variable one every step, so a frozen
#:   graph's convolutions gain 29-43% where a training step's gain 26-37%.
#:
#: The first skinny tiers (fitted the same morning on ResNet50, MobileNetV2 and EfficientNetB0
#: alone: up to 1.74x slower in bfloat16 under 16 positions) did not hold for DenseNet121,
#: InceptionV3 and VGG16; with them, a skinny forward convolution with variable weights gains
#: nothing or 3-11%, and only its float32 time stays far above the roofline.
#:
#: A band per (op, range, positions tier, kind of weights) with at least 6 nodes, ratios of
#: sums.  Checked on models the fit had not seen (each model's items priced by bands fitted on
#: the other five), the error of the convolutions' modelled saving fell from a median 5.5% of
#: an item's float32 time (largest 24.6%) with the bands of 2026-11-25 to 4.1% (13.6%).
#: Refitting the bands below 5 and above 200 Mflop too did worse on that median and largest
#: error (4.8%, 16.6%; with the first four dumps, no better on any measure), so those stay.
#: Eight corpus plans changed; timed against the old ones, interleaved (the four largest changes
#: in four or five processes each), new over old had a geometric mean of 0.983 (ResNet50's
#: training step at batch 8: 0.930; InceptionV3's: 1.018).  Times of
#: small convolutions measured in place depend on what runs beside them (the same 4x96 1x1
#: convolution took 22 us at batch 2 and 96 us at batch 8), which is what a band per size
#: cannot carry from one model to another.
_X86_BF16_CONV2D = (DenseBand(5e6, 2.3, 0.8),
                    DenseBand(2e7, 1.85, 0.97, below_positions=16, constant_weights=False),
                    DenseBand(2e7, 1.15, 0.79, below_positions=64, constant_weights=False),
                    DenseBand(2e7, 0.89, 0.74, constant_weights=False),
                    DenseBand(2e7, 0.55, 0.7, below_positions=64, constant_weights=True),
                    DenseBand(2e7, 0.5, 0.71, constant_weights=True),
                    DenseBand(2e8, 1.24, 0.89, below_positions=16, constant_weights=False),
                    DenseBand(2e8, 0.86, 0.47, below_positions=64, constant_weights=False),
                    DenseBand(2e8, 0.43, 0.63, constant_weights=False),
                    DenseBand(2e8, 0.35, 0.61, below_positions=64, constant_weights=True),
                    DenseBand(2e8, 0.28, 0.57, constant_weights=True),
                    DenseBand(math.inf, 0.2, 0.57))
X86_BF16_DENSE: Mapping[str, tuple[DenseBand, ...]] = MappingProxyType({
    "Conv2D": _X86_BF16_CONV2D, "_FusedConv2D": _X86_BF16_CONV2D,
    "Conv2DBackpropInput": (DenseBand(5e6, 2.9, 0.74),
                            DenseBand(2e7, 3.37, 0.64, below_positions=16),
                            DenseBand(2e7, 1.55, 0.72, below_positions=64),
                            DenseBand(2e7, 1.05, 0.73),
                            DenseBand(2e8, 2.81, 0.46, below_positions=16),
                            DenseBand(2e8, 1.28, 0.41, below_positions=64),
                            DenseBand(2e8, 0.59, 0.64),
                            DenseBand(math.inf, 0.4, 0.5)),
    "Conv2DBackpropFilter": (DenseBand(5e6, 3.8, 1.0),
                             DenseBand(2e7, 2.5, 1.22, below_positions=16),
                             DenseBand(2e7, 1.51, 1.13, below_positions=64),
                             DenseBand(2e7, 1.37, 0.89),
                             DenseBand(2e8, 1.9, 1.13, below_positions=16),
                             DenseBand(2e8, 1.42, 1.04, below_positions=64),
                             DenseBand(2e8, 0.63, 0.8),
                             DenseBand(math.inf, 0.42, 0.66)),
    # Depthwise convolutions above 5 Mflop were measured at batch 8 (the large element-wise
    # ops' run, above): the forward one gains a third there, where the small ones gain
    # nothing, and all of them run far inside the small ones' multiple of the roofline.  The
    # two filter gradients above 20 Mflop (0.9 and 0.92 in the run) are too few to price;
    # they keep the band below.
    "DepthwiseConv2dNative": (DenseBand(5e6, 3.5, 1.0), DenseBand(2e7, 0.43, 0.67), DenseBand(math.inf, 0.38, 0.57)),
    "DepthwiseConv2dNativeBackpropInput": (DenseBand(5e6, 5.0, 2.45), DenseBand(2e7, 1.05, 2.53),
                                           DenseBand(math.inf, 0.68, 7.1)),
    "DepthwiseConv2dNativeBackpropFilter": (DenseBand(5e6, 21.0, 2.5), DenseBand(math.inf, 2.3, 3.06)),
})

#: The device feature of a GPU whose float32 math is strict FP32: TF32 switched off
#: (``tf.config.experimental.enable_tensor_float_32_execution(False)`` or
#: ``NVIDIA_TF32_OVERRIDE=0``).  Without it a GPU of compute capability >= 8.0 runs float32
#: MatMul and convolutions on TF32 Tensor Cores, TensorFlow's default.
TF32_OFF = "tf32_off"

#: GPU classes, one per compute-capability family (issue 22).  Rates in flop/ns (TFLOP/s x
#: 1000), bandwidth in bytes/ns (GB/s).  float32 is what TensorFlow runs by default: TF32 Tensor
#: Cores from 8.0, the CUDA cores' FP32 before; ``-fp32`` classes are 8.x/9.x with TF32 off.
#:
#: * 9.x (Hopper) is measured: through ``../shared/gpu`` on an H100 80GB HBM3 (TensorFlow 2.21,
#:   the machine's CUDA 13 libraries, inside a ``tf.function``, 2026-11-25), an 8192^3 GEMM
#:   ran at 707 TFLOP/s in float16 and 366 in TF32, a 3x3 convolution (batch 64, 56x56, 256
#:   channels) at 576 and 336; a device-to-device copy moved 3.0 TB/s (4.3 on an H200).
#:   Strict FP32 is the H100 SXM's published 67 TFLOP/s.
#: * 8.x (Ampere, A100) and 7.x (Volta, V100) are NVIDIA's published peaks (A100: 312 float16,
#:   156 TF32, 19.5 FP32, 1.6-2.0 TB/s; V100: 125 float16 Tensor Core, 15.7 FP32, 0.9 TB/s),
#:   with convolutions at Hopper's measured share of the GEMM rate.  Not measured here.
#:
#: A model's dense ops are smaller than those benchmarks: ``dense_efficiency`` is the share of
#: the rates they reach, and every kernel a step launches costs ``kernel_overhead`` (2 us, the
#: launch and latency floor the classes already charged a Cast) whatever its size.  Both were
#: checked against whole steps an H200 ran (bench/gpu_runs/2026-11-26-h200, priced by
#: :mod:`amp_rewrite.plan.step_cost` at the H200's measured 4.3 TB/s; ``bench/gpu_predict.py``):
#: with 2 us per kernel, the share each of the four XLA training steps that involve no code of
#: ours implies is 0.42 (ResNet50 float32, batch 64), 0.48 (the same in Keras's
#: ``mixed_float16``), 0.39 (BERT-base float32, batch 32) and 0.36 (its ``mixed_float16``).
#: One share, 0.4, prices all four within 9% and their low/float32 ratios within 4%; the
#: previous fit, 0.2 with no per-kernel time, came from the first step alone and put the
#: steps' fixed costs into their dense ops, which float16 then seemed to halve.
#: The same share and overhead are assumed for every family.  Casts and element-wise ops are
#: priced from the bandwidth, so a plan's low/float32 ratio follows from measured rates and these.
GPU_DENSE_EFFICIENCY = 0.4
#: Fixed time of one kernel on a GPU (ns): its launch and latency floor (see above).
GPU_KERNEL_OVERHEAD = 2_000.0
#: Without XLA, TensorFlow's executor spends host time on every kernel, and a step with many
#: small ones waits for it.  On the lent H100's host (16 cores of a Xeon, TensorFlow 2.21),
#: steps of which kernel counts say they wait for the host ran at 10-14 us per kernel, in
#: float32 and mixed precision alike (``bench/grappler_counts.py`` against the measured steps,
#: bench/GPU_RESULTS.md): ResNet50 inference at batch 1 (13.3 float32, 12.8 TensorFlow's pass)
#: and BERT-base's training step (12.5, 11.5, ours 10.2).  12 us.  A host's speed changes it.
#: The step estimate charges it per kernel the model prices (float nodes that launch, before
#: Grappler): 548 of Grappler's 548 at batch 1, 5614 of 5733 for BERT's float32 step, but
#: 3134 of 3818 for ResNet50's (whose float32 layout Transposes and integer ops it does not
#: see), so there the host share is priced low.
GPU_HOST_PER_KERNEL = 12_000.0
#: Without XLA, TensorFlow runs a GPU step op by op, each in its own kernel, and those kernels
#: were measured node by node inside real training steps on an H200 (``bench/gpu_profile.py
#: --nodes``, 2026-11-28, ``bench/gpu_runs/2026-11-28c-h200/nodes.json.gz``: every kernel's
#: time per TensorFlow node, three steps each of MobileNetV2, EfficientNetB0 and ResNet50 at
#: 224x224, batch 64, in float32 (channels-first, as the layout optimizer runs them) and in our
#: default lists' float16 (channels-last); ``bench/calibrate_gpu_in_place.py`` matched them to
#: the model's nodes).  Per op, over nodes moving at least 2M elements (inputs and outputs),
#: each less the kernels' fixed time (the small kernels' median, 1.1-1.2 us, which the step
#: charges apart as :data:`GPU_KERNEL_OVERHEAD`): the summed time over the memory-bound time
#: at the H200's 4.3 TB/s, and the summed low-precision time over the same nodes' float32 time
#: where the rewrite converted them:
#:
#: * streaming kernels ran at the bandwidth: ``AddN`` 1.01, ``RealDiv`` 0.94, ``Relu`` 0.94,
#:   ``Relu6`` 0.96;
#: * binary ops that broadcast a per-channel operand (a batch norm's ``x - mean``) 2.3-2.5
#:   (``Sub`` 2.42, ``AddV2`` 2.27, ``SquaredDifference`` 2.53), ``Mul`` (a mix) 1.45,
#:   ``BiasAdd`` 1.56;
#: * the unfused batch norm's reductions (``Mean``, ``Sum``; 4.5-8.8 by model and layout) 7.00
#:   and 7.29, its gradient's ``Tile`` 3.72 (2.5 channels-last, 5.8-6.1 channels-first),
#:   ``BiasAddGrad`` 3.15, ``Pad`` 2.94; together the device time the model had missed (on
#:   MobileNetV2's float32 step it had priced 33.8 ms of the 51.4 these nodes took);
#: * converted to float16: 0.38-0.66 of float32 for most (``ReluGrad`` 0.38, ``Relu`` 0.46,
#:   ``AddN`` 0.48, ``Sub``/``AddV2``/``RealDiv`` 0.57-0.58, ``Mul`` 0.66), ``Sigmoid`` 0.89,
#:   ``BiasAdd`` 0.80, ``Relu6Grad`` 0.82, and ``Relu6`` 1.66 (channels-last in float16
#:   against channels-first in float32).  Over every converted element-wise node, the generic
#:   ratio (:data:`GPU_LOW_ELEMENTWISE`), which also prices the measured ops of which the
#:   rewrite converted none (:data:`GPU_GUESSED_LOW`: the planner takes no gain from them).
#:   The whole-step inference of 2026-11-26 (1.0: no gain) had the unseen reductions and
#:   layouts in it.
#:
#: The ratios pool both layouts, weighted as these steps run them; per model they vary as the
#: bullets say.  Under XLA none of this applies (:attr:`DeviceCosts.tables_unfused_only`).
#: ``bench/calibrate_gpu_in_place.py nodes.json.gz --fit --bandwidth 4300`` prints these
#: tables from the profile (``fit_tables.md`` beside it; ``tests/test_gpu_cost_tables.py``
#: checks that they are its figures).
GPU_LOW_ELEMENTWISE = 0.66
GPU_ELEMENTWISE: Mapping[str, tuple[float, float]] = MappingProxyType({
    "AddN": (1.01, 0.48), "RealDiv": (0.94, 0.57), "Relu": (0.94, 0.46), "Relu6": (0.96, 1.66),
    "Sub": (2.42, 0.57), "AddV2": (2.27, 0.58), "SquaredDifference": (2.53, GPU_LOW_ELEMENTWISE),
    "Mul": (1.45, 0.66), "BiasAdd": (1.56, 0.80), "Mean": (7.00, GPU_LOW_ELEMENTWISE),
    "Sum": (7.29, GPU_LOW_ELEMENTWISE), "Tile": (3.72, 0.25), "BiasAddGrad": (3.15, GPU_LOW_ELEMENTWISE),
    "Pad": (2.94, 0.35), "Sigmoid": (1.85, 0.89), "ReluGrad": (1.19, 0.38), "Relu6Grad": (1.18, 0.82),
    "Slice": (1.56, 0.87),
})
#: The ops above whose low ratio the profile did not measure.
GPU_GUESSED_LOW = frozenset({"SquaredDifference", "Mean", "Sum", "BiasAddGrad"})
#: The depthwise convolutions of the same steps (:class:`DenseBand`: float32 time over the
#: roofline at the class's rates, low precision over float32): in float32 TensorFlow runs its
#: own kernels, 4.01-9.27x the roofline, in float16 cuDNN's, at 0.18-0.33 of that (the
#: TF32-off classes take the same bands over their own roofline, unmeasured).  Conv2D and its gradients are not banded.  They ran at
#: 1.07-1.47x their roofline in float32 and at 0.31-0.33 of that in float16, but that ratio
#: spans two layouts (float32 channels-first, as the layout optimizer runs a training step,
#: against float16 channels-last), which an inference step, whose float32 convolutions stay
#: channels-last with TF32, does not share: priced with such bands, the H100's batch-64
#: inference (2026-11-26, whole steps) came out 28-30% under its measured ratio, without them
#: 20-22%, and the training steps moved by 1-13% either way.  Conv2D keeps the rates until a
#: per-node profile of an inference step (channels-last in both precisions) measures it.
GPU_DENSE: Mapping[str, tuple[DenseBand, ...]] = MappingProxyType({
    "DepthwiseConv2dNative": (DenseBand(math.inf, 4.01, 0.32),),
    "DepthwiseConv2dNativeBackpropInput": (DenseBand(math.inf, 8.59, 0.33),),
    "DepthwiseConv2dNativeBackpropFilter": (DenseBand(math.inf, 9.27, 0.18),),
})
#: A Cast in our rewrite's steps (1,187 of them): 1.06 us of busy time (the median below 4,096
#: elements) plus 0.0029 ns per element, 2.08 times the memory-bound time of its 6 bytes per
#: element at 4.3 TB/s; the same line prices TensorFlow's pass's Casts in those steps within
#: 0.3%.  A Cast's fixed time stays every kernel's (:data:`GPU_KERNEL_OVERHEAD`, which also
#: holds the gap a kernel leaves on the device): the traffic factor is what the fit changes.
GPU_CAST_TRAFFIC = 2.08
#: The model's error on a GPU's whole steps without XLA.  On the lent H100 (2026-11-26) the
#: predicted low/float32 ratios of the mixed training steps without XLA came out 6-10% under
#: the measured ones (TensorFlow's pass on ResNet50 and BERT-base, ours on ResNet50; ours on
#: BERT 7% over), and of batch-64 inference 4-7% over, after the host time per kernel above
#: had been fitted to those same steps: an in-sample figure, a floor on the true error.  A
#: rewrite estimated less than this much faster is about as likely to be slower, so the
#: whole-step checks (the planner's, and the training path's against the float32 step without
#: loss scaling) ask this gain of a GPU without XLA; under XLA, whose steps the model priced
#: within 2% of every ratio but BERT's, the planner's 3% stands.
GPU_UNFUSED_STEP_ERROR = 0.10
_CONV_SHARE = (336 / 366, 576 / 707)  # Hopper, measured: convolution rate / GEMM rate
#: cuDNN's recurrent calls (``CudnnRNNV3`` and its backward), fitted to whole training steps an
#: H200 ran (bench/gpu_runs/2026-11-28-h200, ``lstm-train-b64``: an embedding, two LSTMs of
#: 1024 units over 64 time steps, batch 64, Adam): 11.58 ms per step with TF32, 21.51 with
#: TF32 off, 11.05 with the two layers' calls in float16 (ours, ``lists="optimal"``).  The
#: rest of the step priced as before (1.6 ms of element-wise work), the TF32/strict difference
#: puts the recurrent GEMMs at half the nominal float32 rates; what is left of the TF32 step is
#: 7.6 ms over 256 sequential time steps (two calls forward, two backward, 64 steps each): 30
#: us a step, five times the step's GEMM at that rate; and the float16 step puts its GEMMs at
#: 0.38 of the nominal float16 rate.  So converting a recurrent layer gains about 5% of the
#: step, not the 23% the model had priced: the recurrence's fixed time dominates at this size.
#: (The model had priced the step at 5.05 ms, and its float16 layers at 0.77 of float32.)
#: One workload: the fit prices its three steps by construction, and more hidden units or a
#: larger batch (more GEMM work per step) are extrapolated.  Assumed for every family.
GPU_RNN_STEP_TIME = 30_000.0
GPU_RNN_EFFICIENCY = (0.5, 0.38)


def _gpu_class(name: str, f32: float, low: float, bandwidth: float, misaligned_low: float,
               nhwc_types: frozenset[int]) -> DeviceCosts:
    return DeviceCosts(name, f32, low, bandwidth, GPU_LOW_ELEMENTWISE, 1.5, GPU_KERNEL_OVERHEAD, 8, misaligned_low,
                       GPU_ELEMENTWISE, dense=GPU_DENSE, tables_unfused_only=True, cast_traffic=GPU_CAST_TRAFFIC,
                       guessed_low=GPU_GUESSED_LOW,
                       conv_rates=(f32 * _CONV_SHARE[0], low * _CONV_SHARE[1]),
                       dense_efficiency=GPU_DENSE_EFFICIENCY, kernel_overhead=GPU_KERNEL_OVERHEAD,
                       host_per_kernel=GPU_HOST_PER_KERNEL, unfused_step_error=GPU_UNFUSED_STEP_ERROR,
                       rnn_step_time=GPU_RNN_STEP_TIME, rnn_efficiency=GPU_RNN_EFFICIENCY,
                       fuses_bias_activation=False, layout_nhwc_types=nhwc_types)


#: The convolution types the layout optimizer keeps channels-last, per GPU family: float16
#: Tensor Cores from 7.0; bfloat16 and TF32 from 8.0 (float32 where TF32 is on).
_VOLTA_NHWC = frozenset({dt.HALF})
_AMPERE_NHWC = frozenset({dt.HALF, dt.BFLOAT16, dt.FLOAT})
_AMPERE_FP32_NHWC = frozenset({dt.HALF, dt.BFLOAT16})


DEVICE_COSTS: dict[str, DeviceCosts] = {
    # Tensor Cores at about 8x the CUDA cores' FP32.  Without multiples of 8 cuBLAS of that
    # era falls back to half-precision FMA, about 2x FP32.
    "gpu-volta": _gpu_class("gpu-volta", 15_700.0, 125_000.0, 900.0, 31_400.0, _VOLTA_NHWC),
    # TF32 is float32's default: Tensor Cores in both precisions, float16 at 2x.  Misaligned
    # float16 is taken to gain nothing over TF32.
    "gpu-ampere": _gpu_class("gpu-ampere", 156_000.0, 312_000.0, 1_800.0, 156_000.0, _AMPERE_NHWC),
    "gpu-ampere-fp32": _gpu_class("gpu-ampere-fp32", 19_500.0, 312_000.0, 1_800.0, 39_000.0, _AMPERE_FP32_NHWC),
    "gpu-hopper": _gpu_class("gpu-hopper", 366_000.0, 707_000.0, 3_000.0, 366_000.0, _AMPERE_NHWC),
    "gpu-hopper-fp32": _gpu_class("gpu-hopper-fp32", 67_000.0, 707_000.0, 3_000.0, 134_000.0, _AMPERE_FP32_NHWC),
    # Sapphire Rapids AMX (bf16 and fp16 tiles): ~8x AVX-512 float32 on dense math;
    # element-wise float16 runs natively (AVX512-FP16).  Tiles are 16 rows x 32 bf16/fp16
    # values.  bfloat16 has no element-wise arithmetic there: see "cpu-amx-bf16" below.
    "cpu-amx": DeviceCosts("cpu-amx", 100.0, 800.0, 40.0, 0.55, 1.0, 4_000.0, 32, 200.0),
    # AVX512-FP16 without AMX: native fp16 FMA at twice the float32 lanes.
    "cpu-avx512-fp16": DeviceCosts("cpu-avx512-fp16", 100.0, 200.0, 40.0, 0.55, 1.0, 4_000.0, 16, 200.0),
    # AVX512-BF16 only (this repository's benchmark machine, AMD EPYC): large MatMul ~2x
    # (convolutions and depthwise ones are priced from X86_BF16_DENSE, measured in models);
    # a Cast of n elements, timed in a chain, ~0.36 ns/element plus ~20 us of executor
    # overhead (inside a model: below).  The ISA has bf16 dot products and conversions but
    # no bf16 arithmetic, so an element-wise op converts every element both ways: slower on
    # the small, cache-resident activations of training steps.  The generic 1.2 keeps
    # unmeasured element-wise ops float32 unless that costs Casts.
    # A Cast inside a model costs far less than one timed in a chain of Casts, where each
    # waits for the previous one: bench/calibrate_casts.py put 128 bfloat16 round trips into
    # EfficientNetB0 and DenseNet121 and measured no fixed cost within the noise (-3 to 0 us)
    # and 0.15-0.24 ns per element.  Priced that way, alone, the planner converted the batch-2
    # 1x1 convolutions of the MobileNetV2 training step and ran 13% slower than float32:
    # timed 16 at a time, such a convolution in bfloat16 with a weight read every step, and
    # its filter gradient, take 13-26 us *more* than in float32 (a weight re-layout per call),
    # hence ``low_dense_overhead``.
    # The in-place price needs a known size: a tensor of unknown shape (a loop body's, mostly)
    # keeps the chain's price, since a loop runs its Casts one after another, once per step.
    "cpu-avx512-bf16": DeviceCosts("cpu-avx512-bf16", 40.0, 70.0, 16.0, 1.2, 1.0, 20_000.0, 16, 60.0,
                                   X86_BF16_ELEMENTWISE, cast_in_place=(1_000.0, 0.2),
                                   low_dense_overhead=20_000.0, dense=X86_BF16_DENSE,
                                   large_elementwise=X86_BF16_LARGE_ELEMENTWISE,
                                   large_elements=X86_BF16_LARGE_ELEMENTS),
}
# Before Volta the rates are Volta's (such a GPU is never converted for: it cannot profit), but
# the layout optimizer counts no convolution type there as channels-last.
DEVICE_COSTS["gpu-pre-volta"] = replace(DEVICE_COSTS["gpu-volta"], name="gpu-pre-volta",
                                        layout_nhwc_types=frozenset())
# AMX in bfloat16: the tiles' dense rates, with the element-wise kernels of any x86 CPU
# without bf16 arithmetic (above).
DEVICE_COSTS["cpu-amx-bf16"] = replace(DEVICE_COSTS["cpu-amx"], name="cpu-amx-bf16", low_elementwise=1.2,
                                       elementwise=X86_BF16_ELEMENTWISE)


def gpu_costs(device: Device) -> DeviceCosts:
    """The class of a GPU by compute-capability family (an unknown capability counts as the
    newest), strict FP32 where TF32 is off.  bfloat16 (>= 8.0) runs at float16's rates."""
    major = device.capability[0] if device.capability else 9
    if major < 7:  # no Tensor Cores: the layout optimizer keeps no type channels-last
        return DEVICE_COSTS["gpu-pre-volta"]
    if major < 8:
        return DEVICE_COSTS["gpu-volta"]
    family = "gpu-ampere" if major == 8 else "gpu-hopper"
    return DEVICE_COSTS[family + "-fp32" if TF32_OFF in device.features else family]


def costs_for(device: Device, precision: str) -> DeviceCosts:
    """The cost class of ``device`` for ``precision`` (a device assumed fast when unknown)."""
    if device.type == "GPU":
        return gpu_costs(device)
    feats = device.features
    # No features: ``target="cpu"``, a CPU assumed to have AMX.
    if not feats or "amx_bf16" in feats or "amx_fp16" in feats or "amx_tile" in feats:
        return DEVICE_COSTS["cpu-amx-bf16" if precision == "bfloat16" else "cpu-amx"]
    if precision == "float16" and "avx512_fp16" in feats:
        return DEVICE_COSTS["cpu-avx512-fp16"]
    # bfloat16 on AVX512-BF16.  (float16 reaches here only on a CPU without AMX-FP16 or
    # AVX512-FP16, which the target's device gating skips before any planning.)
    return DEVICE_COSTS["cpu-avx512-bf16"]


@dataclass(frozen=True)
class NodeCost:
    """Estimated time of one node in float32 and in low precision (ns), and why."""

    high: float
    low: float
    flops: float
    misaligned: tuple[int, ...] = ()
    #: Priced from the device class's measurements of this op at this size (an element-wise
    #: op listed in :attr:`DeviceCosts.elementwise` or :attr:`DeviceCosts.large_elementwise`),
    #: so a gain it shows is as sure as its loss.  Dense ops are always priced.
    measured: bool = False


def elements(shape: Shape) -> int:
    """Elements of ``shape``, counting unknown dimensions and ranks as the defaults above."""
    if shape is None:
        return UNKNOWN_TENSOR
    return numel(shape, UNKNOWN_DIM)


def _dims(shape: Shape) -> tuple[int, ...] | None:
    if shape is None or any(d is None for d in shape):
        return None
    return tuple(int(d) for d in shape)  # type: ignore[arg-type]


def _dense_flops(op: str, ins: Sequence[Shape], outs: Sequence[Shape]) -> tuple[float, tuple[int, ...]]:
    """Multiply-add flops of a dense op and the matrix dimensions that decide alignment."""
    out = outs[0] if outs else None
    n_out = elements(out)
    if op in MATMUL_OPS:
        a = ins[0] if ins else None
        last = (out[-1] if out and out[-1] is not None else UNKNOWN_DIM) if out else UNKNOWN_DIM
        k = max(1, elements(a) * last // max(1, n_out))
        rows = max(1, n_out // max(1, last))
        return 2.0 * n_out * k, (rows, k, last)
    if op in CONV_OPS:
        filt, dy = _conv_operands(op, ins, outs)
        fd = _dims(filt)
        if fd and len(fd) >= 2:
            cin, cout = fd[-2], fd[-1]
            per_out = elements(filt) // max(1, cout)
        else:
            # Filter shape unknown (a variable without shape information): take the input
            # channels from the activation (forward input / backprop-input output) and assume
            # a 3x3 window.
            act = outs[0] if "BackpropInput" in op else (ins[0] if ins else None)
            cin = act[-1] if act and act[-1] is not None else UNKNOWN_DIM
            cout = dy[-1] if dy and dy[-1] is not None else UNKNOWN_DIM
            per_out = 9 * cin
        return 2.0 * elements(dy) * per_out, (cin, cout)
    if op in DEPTHWISE_OPS:
        filt = ins[1] if len(ins) > 1 else (out if "Filter" in op else None)
        fd = _dims(filt)
        taps = (fd[0] * fd[1]) if fd and len(fd) >= 2 else 9
        dy = out if not op.endswith("Filter") else (ins[2] if len(ins) > 2 else None)
        return 2.0 * elements(dy) * taps, ()
    return 0.0, ()


def _conv_operands(op: str, ins: Sequence[Shape], outs: Sequence[Shape]) -> tuple[Shape, Shape]:
    """``(filter, output-side tensor)`` of a convolution or one of its gradients.  Forward: the
    filter is input 1 and the output is its own; backprop input: filter input 1, dy input 2;
    backprop filter: the output is the filter gradient, dy input 2.  Pure."""
    out = outs[0] if outs else None
    if op.startswith("Conv2DBackpropFilter") or op.startswith("Conv3DBackpropFilter"):
        return out, (ins[2] if len(ins) > 2 else None)
    if "BackpropInput" in op:
        return (ins[1] if len(ins) > 1 else None), (ins[2] if len(ins) > 2 else None)
    return (ins[1] if len(ins) > 1 else None), out


def conv_positions(op: str, ins: Sequence[Shape], outs: Sequence[Shape]) -> int | None:
    """Output positions times batch (``N * H_out * W_out``, and ``* D_out`` in 3-D) of a
    convolution or one of its gradients: the rows of the GEMM it amounts to, or ``None`` when
    the op is not a convolution or the shape is not fully known.  The weights' share of the
    work is one over twice this: a deep layer at a small batch (a few positions) is a skinny
    GEMM that reads a large filter for little arithmetic.  Pure."""
    if op not in CONV_OPS:
        return None
    _, dy = _conv_operands(op, ins, outs)
    dims = _dims(dy)
    if not dims or len(dims) < 2:
        return None
    return math.prod(dims[:-1])


def _rnn_work(ins: Sequence[Shape]) -> tuple[float, tuple[int, ...], int]:
    """``(flops, GEMM dims, sequential steps)`` of one cuDNN RNN forward call, from its inputs
    ``input`` ([seq, batch, in], or [batch, seq, in] batch-major), ``input_h`` ([layers x
    directions, batch, units], or [batch, layers x directions, units]) and ``params`` (every
    weight and bias, flattened).  The gates per step (LSTM 4, GRU 3, plain RNN 1) are read
    from the weights' size, ``gates * units * (in + units + 2)`` for one layer and direction;
    each further layer and direction counts as one more with ``in = units``.  Every time step
    of every layer is a step of its own (the recurrence).  Unknown sizes count as
    :data:`UNKNOWN_DIM`.  The backward call (``CudnnRNNBackprop*``) does about twice this:
    gradients of the inputs and of the weights.  Pure."""
    x = _dims(ins[0]) if ins else None
    h0 = _dims(ins[1]) if len(ins) > 1 else None
    params = elements(ins[3]) if len(ins) > 3 and ins[3] is not None else None
    stacks, batch, units = 1, UNKNOWN_DIM, UNKNOWN_DIM
    if h0 and len(h0) == 3:
        # [stacks, batch, units] time-major, [batch, stacks, units] batch-major (the op's
        # time_major attribute, which the shapes show: the batch is the dimension the
        # input shares at the same place).
        batch_major = bool(x) and len(x) == 3 and h0[0] == x[0] and h0[1] != x[1]
        time_major = bool(x) and len(x) == 3 and h0[1] == x[1] and h0[0] != x[0]
        a, b = (h0[1], h0[0]) if batch_major else (h0[0], h0[1]) if time_major else sorted(h0[:2])
        stacks, batch, units = a, b, h0[2]
    width = x[-1] if x else UNKNOWN_DIM
    rows = elements(ins[0]) // max(1, width) if ins else UNKNOWN_DIM * UNKNOWN_DIM  # seq * batch
    seq = max(1, rows // max(1, batch))
    gates = 4
    if params is not None and params != UNKNOWN_TENSOR and stacks == 1:
        gates = max(1, round(params / max(1, units * (width + units + 2))))
    per_row = gates * units * ((width + units) + (stacks - 1) * 2 * units)
    return 2.0 * rows * per_row, (batch, width + units, gates * units), seq * stacks


def _dense_rates(costs: DeviceCosts, op: str) -> tuple[float, float]:
    """The float32 and low-precision rates (flop/ns) a model's ``op`` reaches on ``costs``'
    device class: the class's convolution or GEMM rates, times its dense efficiency (a
    recurrent call's own, where the class measured one).  Pure."""
    f32, low = costs.conv_rates if costs.conv_rates and op in CONV_OPS else (costs.f32_flops, costs.low_flops)
    if costs.rnn_efficiency is not None and (op in RNN_OPS or op in RNN_GRAD_OPS):
        return f32 * costs.rnn_efficiency[0], low * costs.rnn_efficiency[1]
    return f32 * costs.dense_efficiency, low * costs.dense_efficiency


def dense_band(costs: DeviceCosts, op: str, flops: float, positions: int | None = None, *,
               constant_weights: bool = False) -> DenseBand | None:
    """The measured band of ``op`` at ``flops`` on ``costs``' device class, if it has one: the
    first band of the op whose flops range, positions tier (:attr:`DenseBand.below_positions`)
    and kind of weights (:attr:`DenseBand.constant_weights`) admit the node.  ``positions``
    (:func:`conv_positions`) selects a skinny convolution's band; unknown, the op is priced as
    a wide one.  Pure."""
    for band in costs.dense.get(op, ()):
        if flops >= band.below_flops:
            continue
        if band.constant_weights is not None and band.constant_weights != constant_weights:
            continue
        if band.below_positions != math.inf and (positions is None or positions >= band.below_positions):
            continue
        return band
    return None


def misaligned_dims(dims: Sequence[int], multiple: int) -> tuple[int, ...]:
    """The dimensions of ``dims`` that are not multiples of ``multiple``."""
    return tuple(d for d in dims if d % multiple)


def alignment_efficiency(dims: Sequence[int], multiple: int) -> float:
    """Useful fraction of the padded work when every dim is rounded up to ``multiple``."""
    eff = 1.0
    for d in dims:
        if d > 0:
            eff *= d / (-(-d // multiple) * multiple)
    return eff


def node_cost(
    op: str,
    in_shapes: Sequence[Shape],
    out_shapes: Sequence[Shape],
    low_bytes: int,
    costs: DeviceCosts,
    *,
    shape_aware: bool = True,
    constant_weights: bool = False,
    compiled: bool = False,
) -> NodeCost:
    """Estimated time of one node (float32 and low precision).  Pure.

    ``in_shapes``/``out_shapes`` are the shapes of its float tensors (others do not change
    with the colour).  Unknown dimensions count as :data:`UNKNOWN_DIM`.  ``compiled``: the
    graph runs under XLA, and an element-wise op is priced as fused (module docstring);
    dense ops are priced the same either way (but for the measured bands of a class whose tables
    describe TensorFlow's own kernels, :attr:`DeviceCosts.tables_unfused_only`, which XLA does
    not run).
    """
    if op in ALIAS_OPS or op in METADATA_OPS:
        return NodeCost(0.0, 0.0, 0.0)
    if compiled and op not in DENSE_OPS:
        # Fused: only the output's bytes move, once; the arithmetic beyond the memory-bound
        # time (the compute factor) is done in float32 registers in either precision.
        compute = compiled_compute_factor(costs, op)
        out_elems = sum(elements(s) for s in out_shapes)
        arithmetic = (compute - 1.0) * out_elems * 4 / costs.bandwidth
        return NodeCost(out_elems * 4 / costs.bandwidth + arithmetic,
                        out_elems * low_bytes / costs.bandwidth + arithmetic, 0.0)
    elems = sum(elements(s) for s in in_shapes) + sum(elements(s) for s in out_shapes)
    mem_high = elems * 4 / costs.bandwidth
    mem_low = elems * low_bytes / costs.bandwidth
    if op in DENSE_OPS:
        serial = 0.0
        if op in RNN_OPS or op in RNN_GRAD_OPS:
            flops, dims, steps = _rnn_work(in_shapes)
            flops *= 2 if op in RNN_GRAD_OPS else 1
            # A recurrence runs its time steps one after another, in either precision.
            serial = steps * (costs.rnn_step_time or costs.kernel_overhead)
        else:
            flops, dims = _dense_flops(op, in_shapes, out_shapes)
        f32_rate, low_rate = _dense_rates(costs, op)
        bad: tuple[int, ...] = ()
        if op in DEPTHWISE_OPS:
            low_rate = f32_rate * costs.low_depthwise
        elif shape_aware and dims and all(isinstance(d, int) for d in dims):
            bad = misaligned_dims(dims, costs.multiple)
            if bad:
                low_rate = max(costs.misaligned_low_flops * costs.dense_efficiency,
                               low_rate * alignment_efficiency(dims, costs.multiple))
        fixed = 0.0 if constant_weights and "BackpropFilter" not in op else costs.low_dense_overhead
        band = None if compiled and costs.tables_unfused_only else dense_band(
            costs, op, flops, conv_positions(op, in_shapes, out_shapes), constant_weights=constant_weights)
        if band is None:
            return NodeCost(flops / f32_rate + mem_high + serial, flops / low_rate + mem_low + fixed + serial,
                            flops, bad)
        # Measured in place, over aligned and misaligned shapes alike: float32 time relative
        # to the roofline, and the low-precision ratio, for ops of this size.
        high = (flops / f32_rate + mem_high) * band.scale
        return NodeCost(high, high * band.ratio + fixed, flops, bad)
    entry = elementwise_entry(costs, op, elems)
    compute, low_ratio = entry or (1.0, costs.low_elementwise)
    high = mem_high * compute
    low = high * low_ratio
    if _large(costs, op, elems):
        # Never cheaper than the largest tensor under the edge: the small table's prices hold
        # fixed costs that a larger tensor pays too (priced per element alone, a tensor just
        # past the edge cost a quarter of one just under it).
        small_compute, small_ratio = costs.elementwise.get(op, (1.0, costs.low_elementwise))
        floor = costs.large_elements * 4 / costs.bandwidth * small_compute
        high, low = max(high, floor), max(low, floor * small_ratio)
    return NodeCost(high, low, 0.0, measured=entry is not None and op not in costs.guessed_low)


def _large(costs: DeviceCosts, op: str, elems: int) -> bool:
    """Whether ``op`` on ``elems`` elements is priced from the class's large-tensor table."""
    return bool(costs.large_elements) and elems >= costs.large_elements and op in costs.large_elementwise


def compiled_compute_factor(costs: DeviceCosts, op: str) -> float:
    """Under XLA, element-wise ``op``'s float32 time over its memory-bound time on ``costs``'
    class: its arithmetic, which XLA's fused kernel still does.  1 where the class's table
    measured TensorFlow's own kernels (:attr:`DeviceCosts.tables_unfused_only`), whose
    inefficiencies XLA's kernels do not share.  Pure."""
    if costs.tables_unfused_only:
        return 1.0
    return costs.elementwise.get(op, (1.0, costs.low_elementwise))[0]


def elementwise_entry(costs: DeviceCosts, op: str, elems: int) -> tuple[float, float] | None:
    """The measured ``(float32 scale, low/float32 ratio)`` of element-wise ``op`` on
    ``costs``' class for a node reading and writing ``elems`` elements, or ``None`` where the
    class has not measured it at that size.  Pure."""
    if _large(costs, op, elems):
        return costs.large_elementwise[op]
    return costs.elementwise.get(op)


def cast_cost(shape: Shape, low_bytes: int, costs: DeviceCosts, *, compiled: bool = False) -> float:
    """Estimated time of one Cast between float32 and low precision (ns).  Pure.

    ``compiled``: under XLA the Cast is fused into its producer or consumer, so it costs no
    fixed time, only writing the low-precision copy once (module docstring).
    """
    if compiled:
        return elements(shape) * low_bytes / costs.bandwidth
    if costs.cast_in_place is not None and _dims(shape) is not None:
        fixed, per_element = costs.cast_in_place
        return fixed + elements(shape) * per_element
    return costs.op_overhead + elements(shape) * (4 + low_bytes) / costs.bandwidth * costs.cast_traffic
