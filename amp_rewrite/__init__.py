"""amp_rewrite: TensorFlow's automatic mixed precision graph rewrite, on networkx.

Public API::

    from amp_rewrite import rewrite_graph_def
    result = rewrite_graph_def(graph_def, target="gpu:8.0", precision="float16")
    result.graph_def, result.report

Stages (one module each): :mod:`~amp_rewrite.graph_io` (protobuf <-> networkx),
:mod:`~amp_rewrite.decide` (painting -> plan), :mod:`~amp_rewrite.rewrite` (plan -> casts and
types), export in :mod:`~amp_rewrite.graph_io`; lists in :mod:`~amp_rewrite.lists`,
targets in :mod:`~amp_rewrite.targets`.
"""

from __future__ import annotations

from .api import RewriteResult, resolve_lists, resolve_target, rewrite_graph_def
from .errors import (
    AmpRewriteError,
    GraphFormatError,
    InvalidGraphError,
    ListError,
    RewriteError,
    TargetError,
)
from .graph_io import load_graph_def, parse_graph_def
from .targets import Device, Target, parse_target

__all__ = [
    "rewrite_graph_def",
    "RewriteResult",
    "resolve_lists",
    "resolve_target",
    "load_graph_def",
    "parse_graph_def",
    "Target",
    "Device",
    "parse_target",
    "AmpRewriteError",
    "GraphFormatError",
    "InvalidGraphError",
    "ListError",
    "RewriteError",
    "TargetError",
]

__version__ = "0.1.0"
