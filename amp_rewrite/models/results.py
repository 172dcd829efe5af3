"""What rewriting a model gives: one :class:`GraphRewrite` per graph, one :class:`ModelRewrite`
per model.  Plain frozen records, shared by the rewrite, the summaries and the writer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..api import RewriteResult
from ..plan.lists import OpLists
from ..plan.targets import Target
from .formats import ModelFile


@dataclass(frozen=True)
class GraphRewrite:
    """One rewritten graph of a model: a MetaGraphDef's graph, or the frozen GraphDef.

    ``label`` names it in messages and dump files (``graph``, ``meta graph 0 [serve]``);
    ``before`` is the input GraphDef (read-only); ``result`` holds the new GraphDef, the
    report and the plans (only the functions ``signatures`` selected, when given).
    """

    label: str
    index: int | None
    tags: tuple[str, ...]
    before: Any
    result: RewriteResult
    preserved: frozenset[str]


@dataclass(frozen=True)
class ModelRewrite:
    """A model rewritten in memory: the new protobuf and one :class:`GraphRewrite` per graph.

    ``message`` is a new message of the same type as ``source.message``.  ``lists`` are the
    effective op lists that were used (for ``lists`` output and dumps).
    """

    source: ModelFile
    message: Any
    graphs: tuple[GraphRewrite, ...]
    report: dict[str, Any]
    lists: OpLists
    target: Target


#: The report's counts, totalled over graphs (and over a model's functions).
_COUNTS = ("total_nodes", "converted_nodes", "converted_attrs", "casts_to_low", "casts_to_high")
