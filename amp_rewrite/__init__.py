"""amp_rewrite: TensorFlow's automatic mixed precision graph rewrite, on networkx.

Public API::

    from amp_rewrite import rewrite_graph_def
    result = rewrite_graph_def(graph_def, target="gpu:8.0", precision="float16")
    result.graph_def, result.report

    from amp_rewrite import rewrite_saved_model
    report = rewrite_saved_model("model_dir", "model_bf16", target="cpu", precision="bfloat16")

Stages (one module each): :mod:`~amp_rewrite.graph.io` (protobuf <-> networkx),
:mod:`~amp_rewrite.plan.painter` (painting -> plan), :mod:`~amp_rewrite.rewrite` (plan -> casts and
types), export in :mod:`~amp_rewrite.graph.io`; lists in :mod:`~amp_rewrite.plan.lists`,
targets in :mod:`~amp_rewrite.plan.targets`.
"""

from __future__ import annotations

from . import _moved
from .api import (RewriteResult, StepEstimates, estimate_node_times, estimate_step_time, resolve_lists,
                  resolve_planner, resolve_target, rewrite_graph_def)
from .autotune import AutotuneOptions, AutotuneResult, autotune, autotune_model
from .errors import (
    AmpRewriteError,
    AutotuneInputError,
    GraphFormatError,
    InvalidGraphError,
    ListError,
    RewriteError,
    TargetError,
)
from .report.explain import Explanation, explain_node
from .graph.io import load_graph_def, parse_graph_def
from .graph.shape_process import isolated_shape_inference
from .models.saved_model import ModelRewrite, load_model, rewrite_model, rewrite_saved_model
from .plan.targets import Device, Target, parse_target

_moved.install()

# The training API (amp_rewrite.training) imports TensorFlow, and Keras for Keras optimizers;
# its names are resolved on first use so that `import amp_rewrite` stays fast and light.
_TRAINING = (
    "enable_mixed_precision_graph_rewrite",
    "disable_mixed_precision_graph_rewrite",
    "function",
    "Session",
    "rewrite_graph",
    "rewrite_graph_with_result",
    "rewrite_training_meta_graph",
    "DynamicLossScale",
    "AutoLossScale",
    "FixedLossScale",
)


def __getattr__(name: str) -> object:
    if name in _TRAINING:
        from . import training

        return getattr(training, name)
    import importlib
    import importlib.util

    # A submodule not imported yet (``amp_rewrite.training``, ``amp_rewrite.demo``): imported
    # now, as attribute access finds any submodule once it has been imported.
    if not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "rewrite_graph_def",
    "estimate_step_time",
    "estimate_node_times",
    "autotune",
    "autotune_model",
    "AutotuneOptions",
    "AutotuneResult",
    "rewrite_saved_model",
    "rewrite_model",
    "load_model",
    "ModelRewrite",
    "explain_node",
    "Explanation",
    "RewriteResult",
    "StepEstimates",
    "resolve_lists",
    "resolve_planner",
    "resolve_target",
    "load_graph_def",
    "parse_graph_def",
    "isolated_shape_inference",
    "Target",
    "Device",
    "parse_target",
    "AmpRewriteError",
    "AutotuneInputError",
    "GraphFormatError",
    "InvalidGraphError",
    "ListError",
    "RewriteError",
    "TargetError",
    *_TRAINING,
]

__version__ = "0.1.0"
