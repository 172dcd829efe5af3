"""Node-name patterns for ``--exclude`` (``exclude=`` in the API) and ``amp-rewrite nodes``.

A pattern is a Python regular expression.  It matches a node when it matches, in full
(:func:`re.fullmatch`, so it is anchored at both ends):

* the whole node name, e.g. ``model/conv2d_1/Conv2D`` or ``.*/Conv2D``; or
* one ``/``-separated component of the name, which is how a Keras layer name appears in the
  nodes it created (``functional/conv2d_1/convolution`` has the components ``functional``,
  ``conv2d_1`` and ``convolution``).

So ``conv2d_1`` matches every node of the layer ``conv2d_1`` and nothing of ``conv2d_10``;
write ``conv2d_1.*`` to mean both.  Several patterns exclude the union of what each matches.

Keras 3's ``model.export`` traces the model into functions whose name scopes TensorFlow has
made unique with a ``_N`` suffix: the layers ``dense``, ``dense_1`` and ``conv2d_1`` appear as
``functional_1/dense_1/MatMul``, ``functional_1/dense_1_2/MatMul`` and
``functional_1/conv2d_1_1/convolution``.  In such a graph (:func:`keras_scoped`: every node
name of three or more components has a second component ending in ``_N``) a component is
compared without its last ``_N``, so ``dense_1`` names the layer ``dense_1`` there as well,
and not the layer ``dense`` whose scope is spelled ``dense_1``.  Elsewhere (Keras 2 models,
TF1 graphs, the main graph of any SavedModel, where variables keep their layer's name)
components are compared as they are.

Pure: nothing here reads files or graphs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..errors import AmpRewriteError

__all__ = ["NameMatcher", "exclude_patterns", "keras_scoped", "matching_nodes"]


def exclude_patterns(exclude: str | Sequence[str] | None) -> tuple[str, ...]:
    """``exclude`` as a tuple of patterns: ``None`` -> ``()``, a str -> one pattern, a
    sequence of str -> its items (empty strings dropped: they would match nothing useful
    and ``--exclude ""`` is a slip).  Raises :class:`AmpRewriteError` for anything else."""
    if exclude is None:
        return ()
    if isinstance(exclude, str):
        items: Iterable[object] = [exclude]
    elif isinstance(exclude, (bytes, bytearray)) or not isinstance(exclude, Iterable):
        raise AmpRewriteError(f"exclude must be a str or a list of str, not {type(exclude).__name__}")
    else:
        items = list(exclude)
    out = []
    for item in items:
        if not isinstance(item, str):
            raise AmpRewriteError(f"exclude patterns must be str, not {type(item).__name__} ({item!r})")
        if item:
            out.append(item)
    return tuple(out)


@dataclass(frozen=True)
class NameMatcher:
    """Compiled ``--exclude`` patterns.  :meth:`match` says which pattern (if any) matches a
    node name, and how, so that the report can name it."""

    patterns: tuple[tuple[str, "re.Pattern[str]"], ...]

    @classmethod
    def compile(cls, exclude: str | Sequence[str] | None) -> "NameMatcher":
        """Compile every pattern of ``exclude`` (see :func:`exclude_patterns`).  Raises
        :class:`AmpRewriteError` naming the first bad one."""
        compiled = []
        for text in exclude_patterns(exclude):
            try:
                compiled.append((text, re.compile(text)))
            except (re.error, OverflowError, RecursionError) as exc:
                # OverflowError: a repeat count beyond the engine's limit (``x{99999999999}``).
                raise AmpRewriteError(f"bad --exclude regular expression {text!r}: {exc}") from None
        return cls(tuple(compiled))

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def match(self, name: str, keras3: bool = False) -> tuple[str, str] | None:
        """``(pattern, how)`` for the first pattern that matches ``name`` -- ``how`` is
        ``"name"`` (the whole name) or the matching path component -- else ``None``.
        ``keras3``: the name comes from a graph whose scopes Keras 3 made unique
        (:func:`keras_scoped`); components are compared without their ``_N`` suffix."""
        parts: list[tuple[str, str]] | None = None
        for text, rx in self.patterns:
            if rx.fullmatch(name):
                return text, "name"
            if parts is None:
                parts = [(part, _unsuffixed(part) if keras3 else part)
                         for part in name.split("/")] if "/" in name else []
            for part, compared in parts:
                if rx.fullmatch(compared):
                    return text, part
        return None

    def reason(self, name: str, keras3: bool = False) -> str | None:
        """The report's reason for a node this matcher excludes (``None`` if it does not).
        Starts with ``preserved`` like every reason of a preserved node, which
        :func:`amp_rewrite.report.build.nothing_converted_reason` and ``explain`` rely on."""
        hit = self.match(name, keras3)
        if hit is None:
            return None
        pattern, how = hit
        if how == "name":
            where = "its name"
        elif keras3 and _unsuffixed(how) != how:
            where = f"path component {how!r}, Keras layer {_unsuffixed(how)!r}"
        else:
            where = f"path component {how!r}"
        return f"preserved: excluded by --exclude {pattern!r} (matches {where}); keeps its dtypes"


_SUFFIXED = re.compile(r"(.+)_[0-9]+")


def _unsuffixed(part: str) -> str:
    """``part`` without one trailing ``_N`` (``dense_1_2`` -> ``dense_1``)."""
    m = _SUFFIXED.fullmatch(part)
    return m.group(1) if m else part


def keras_scoped(names: Iterable[str]) -> bool:
    """Whether ``names`` (the node names of one graph or function) look like a Keras 3
    ``model.export`` trace: some name has three or more ``/``-separated components and in
    every such name the second one (the layer's scope under the model's) ends in ``_N``.
    A Keras 2 or TF1 graph has unsuffixed layer scopes (``model/dense/MatMul``).  Pure."""
    seen = False
    for name in names:
        first = name.find("/")
        if first < 0:
            continue
        second = name.find("/", first + 1)
        if second < 0:
            continue
        seen = True
        if not _SUFFIXED.fullmatch(name[first + 1:second]):
            return False
    return seen


def matching_nodes(graph_def: object, matcher: NameMatcher) -> list[tuple[str, str, str, str, str]]:
    """Every node of ``graph_def`` (main graph, then each library function by name) that
    ``matcher`` matches, as ``(function, node, op, pattern, how)``: ``function`` is ``""``
    for the main graph, ``how`` as in :meth:`NameMatcher.match`.  What ``--exclude`` with
    the same patterns would keep float32 (``amp-rewrite nodes``).  Pure."""
    out = []
    graphs = [("", getattr(graph_def, "node"))]
    graphs += sorted(((f.signature.name, f.node_def) for f in getattr(graph_def, "library").function),
                     key=lambda item: item[0])
    for fname, nodes in graphs:
        keras3 = keras_scoped(nd.name for nd in nodes)
        for nd in nodes:
            hit = matcher.match(nd.name, keras3)
            if hit is not None:
                out.append((fname, nd.name, nd.op, hit[0], hit[1]))
    return out
