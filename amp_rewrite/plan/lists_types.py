"""The value types of the op lists: categories, levels, precisions, backends, planners, and
:class:`ListContext`, :class:`ListEdit` and :class:`OpLists`.

Part of :mod:`amp_rewrite.plan.lists` (which re-exports every name here; import them from
there).  Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, cast, get_args

from ..errors import ListError

Category = Literal["allow", "infer", "deny", "clear"]
CATEGORIES: tuple[Category, ...] = ("allow", "infer", "deny", "clear")
Level = Literal["DEFAULT", "TENSOR_CORES_ONLY", "TREAT_INFER_AS_DENY", "UNSAFE_FORCE_ALL"]
LEVELS: tuple[Level, ...] = cast("tuple[Level, ...]", get_args(Level))
Precision = Literal["float16", "bfloat16"]
PRECISIONS: tuple[Precision, ...] = ("float16", "bfloat16")
Backend = Literal["cuda", "onednn"]
BACKENDS: tuple[Backend, ...] = ("cuda", "onednn")
#: Values of the top-level ``planner`` key: TensorFlow's greedy passes, or the cost-aware
#: minimum cut with normalization-aware safety (``amp_rewrite.plan.optimal``).
PLANNERS = ("greedy", "optimal", "min-casts")
#: Values of ``apply`` in a profile's ``[normalization]`` table: where the ops that apply a
#: moment-based normalization's float32 statistics to a full-size tensor run.  ``"float32"``:
#: deny propagates from the statistics into them and on through what reads them
#: (TensorFlow's passes); ``"fenced"``: they stay float32, but deny stops at the
#: normalization's output, whose readers are painted as if it were in low precision (what
#: Keras 3's mixed policies do: a norm layer computes in float32 and casts its output);
#: ``"low"``: deny stops at their statistic inputs, and they are painted like any infer op
#: (:mod:`amp_rewrite.plan.normalization`).
NORMALIZATION_APPLY = ("float32", "fenced", "low")
#: Ops a profile's ``[<precision>.identity]`` table may name: reductions of input 0 over the
#: axes of input 1, whose output holds as many values as their input exactly when every axis
#: they reduce has one element, and which then copy their input (a sum, mean, product, maximum
#: or minimum of one value is that value).  ``EuclideanNorm`` is not one: of one value it is
#: ``|x|``, computed as ``sqrt(x * x)``, whose square overflows float16 above 256.
IDENTITY_REDUCTIONS = frozenset({"Sum", "Mean", "Prod", "Max", "Min"})
# TensorFlow op names: a capital letter (or "_" for internal ops) then letters, digits, "_", ">".
_OP_NAME = re.compile(r"_?[A-Za-z][A-Za-z0-9_>]*")


# ---------------------------------------------------------------------------------------------
# Public value types
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ListContext:
    """Which lists to build: the low precision, the backend and (for cuda) the library versions.

    ``cuda_version`` / ``cudnn_version`` are decimal like TensorFlow's (CUDA 12.9 -> ``12090``,
    cuDNN 9.10.0 -> ``91000``); the defaults are what TF 2.21 wheels are built with.  They only
    matter for the cuda backend.  To mirror TensorFlow's modes: CUDA mode is
    ``("float16", "cuda", <GPU's versions>)``, the CPU fp16-emulation mode is
    ``("float16", "cuda", 10000, 8000)``, the oneDNN float16 mode is ``("float16", "onednn")``
    and the oneDNN bfloat16 mode is ``("bfloat16", "onednn")``.
    """

    precision: Precision
    backend: Backend
    cuda_version: int = 12090
    cudnn_version: int = 91000

    def __post_init__(self) -> None:
        # Validate eagerly: a typo here would otherwise silently select no gated entries.
        if self.precision not in PRECISIONS:
            raise ListError(f"unknown precision {self.precision!r}; expected one of {list(PRECISIONS)}")
        if self.backend not in BACKENDS:
            raise ListError(f"unknown backend {self.backend!r}; expected one of {list(BACKENDS)}")
        for label, value in (("cuda_version", self.cuda_version), ("cudnn_version", self.cudnn_version)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ListError(f"{label} must be a non-negative integer, got {value!r}")


@dataclass(frozen=True)
class ListEdit:
    """One edit of one list: ``add`` inserts ``op`` into ``category``, ``remove`` erases it.

    ``origin`` says where the edit came from, for messages and :attr:`OpLists.origins`
    (e.g. ``"argument"`` or ``"environment TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_DENYLIST_ADD"``).
    """

    action: Literal["add", "remove"]
    category: Category
    op: str
    origin: str = "argument"

    def __post_init__(self) -> None:
        if self.action not in ("add", "remove"):
            raise ListError(f"edit action must be 'add' or 'remove', got {self.action!r} ({self.origin})")
        if self.category not in CATEGORIES:
            raise ListError(
                f"edit category must be one of {list(CATEGORIES)}, got {self.category!r} ({self.origin})"
            )
        if not isinstance(self.op, str) or not _OP_NAME.fullmatch(self.op):
            raise ListError(f"edit names an invalid op name {self.op!r} ({self.origin})", op=str(self.op))


@dataclass(frozen=True)
class OpLists:
    """The effective lists for one :class:`ListContext`, after all layers, edits and the level.

    Immutable.  ``reasons`` maps every listed op to a one-line reason (ops added by an edit get
    ``"added by <origin>"``); ``origins`` maps every listed op to where its entry came from
    (``"profile tensorflow"``, ``"file /x.toml"`` or an edit's origin).  ``profile`` names the
    layers used (``"default"``, or ``"default + file /x.toml"`` with a user file).
    """

    allow: frozenset[str]
    infer: frozenset[str]
    deny: frozenset[str]
    clear: frozenset[str]
    # Mappings are not hashable; leave them out of __hash__ (they still take part in ==).
    reasons: Mapping[str, str] = field(default_factory=dict, hash=False)
    origins: Mapping[str, str] = field(default_factory=dict, hash=False)
    profile: str = ""
    #: The planner the profile asks for (``"greedy"`` or ``"optimal"``); the last layer of the
    #: ``extends`` chain that sets ``planner`` wins.
    planner: str = "greedy"
    #: Where a moment-based normalization's apply ops run (:data:`NORMALIZATION_APPLY`); the
    #: last layer of the ``extends`` chain with a ``[normalization]`` table wins.
    normalization_apply: str = "float32"
    #: That layer's reason for it (empty when no layer sets it).
    normalization_reason: str = ""
    #: Whether the rewrite hoists its loop-invariant Casts out of loop bodies
    #: (:mod:`amp_rewrite.loop_hoist`); the last layer with a ``[loops]`` table wins, and
    #: without one they stay where TensorFlow's pass puts them.
    hoist_loop_casts: bool = False
    #: That layer's reason for it (empty when no layer sets it).
    hoist_loop_casts_reason: str = ""
    #: Deny-list ops that are inferred where their input is proven at most a limit
    #: (``[<precision>.bounded]``: op -> (input_max, reason)), e.g. ``Exp`` of a non-positive
    #: number cannot overflow float16.  Only ops on the final deny list are kept; empty under
    #: level ``TREAT_INFER_AS_DENY``.  See :mod:`amp_rewrite.plan.ranges`.
    bounded: Mapping[str, tuple[float, str]] = field(default_factory=dict, hash=False)
    #: Deny-list reductions (:data:`IDENTITY_REDUCTIONS`) that are cleared where static shapes
    #: show they reduce nothing (``[<precision>.identity]``: op -> reason): the gradient of a
    #: broadcasting ``BatchMatMulV2`` sums its non-broadcast operand's gradient over no axis,
    #: and on the deny list that copy would keep everything downstream float32.  Same rules of
    #: survival as ``bounded``.
    identity: Mapping[str, str] = field(default_factory=dict, hash=False)
    #: Deny-list ops that keep their inputs float32 back to the nearest allow-list op
    #: (``[<precision>.float32_inputs]``: op -> reason): a logarithm of a float16 probability
    #: that underflowed to 0 is ``-inf``, and denying the ``Log`` alone would cast that 0.
    #: Kept for the ops on the final deny list, under every level.
    float32_inputs: Mapping[str, str] = field(default_factory=dict, hash=False)
    #: The TensorFlow release (``"2.16"``) the lists were loaded for (versioned files gave
    #: that release's lists; the painter reproduces that release's pass), or ``None`` when
    #: loaded without one (each file's own tables; the newest pass).
    tf_version: str | None = None

    def category_of(self, op: str) -> Category | None:
        """The list ``op`` is on, or ``None`` when it is on none (the lists never overlap)."""
        for category in CATEGORIES:
            if op in getattr(self, category):
                return category
        return None

    def as_dict(self) -> dict[str, list[str]]:
        """A new ``{category: sorted op names}`` dict in the order allow, infer, deny, clear."""
        return {category: sorted(getattr(self, category)) for category in CATEGORIES}

