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

The Keras training path knows better than any rule on names: while it traces a model's train,
test or predict step it records the name scope each of the model's layers got in that trace
(:mod:`amp_rewrite.training.keras_optimizer`), and passes the rewrite a matcher bound to that
record (:meth:`NameMatcher.bind_layer_scopes`).  Such a matcher compares a component that ends a
recorded scope as the name of the layer that opened it, and every other component as it is,
whatever the graph looks like: in a Keras 3 train step the first ``Dense`` layer's scope is
``sequential_1/dense_1`` and the second's (``dense_1``) ``sequential_1/dense_1_2``, and the loss,
optimizer and loss-scale nodes around them (``compile_loss/...``, ``SGD/...``) have unsuffixed
scopes, so neither rule above would name the layers right.  A recorded scope is found anywhere
in a name, which is how the gradients of a layer's ops are named
(``gradient_tape/sequential_1/dense_1_2/MatMul/MatMul``).

A pattern that matches no node is worth a WARNING, not silence: :func:`warn_unmatched`, once
per pattern per rewrite (:func:`unmatched_warned_once` widens "rewrite" to every graph a caller
rewrites for one thing, such as a training step traced again).

Pure except for that logging: nothing here reads files or graphs.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import re
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, Sequence

from ..errors import AmpRewriteError

__all__ = ["NameMatcher", "exclude_patterns", "keras_scoped", "matching_nodes", "unmatched_warned_once",
           "warn_unmatched"]

log = logging.getLogger(__name__)


def exclude_patterns(exclude: "str | Sequence[str] | NameMatcher | None") -> tuple[str, ...]:
    """``exclude`` as a tuple of patterns: ``None`` -> ``()``, a str -> one pattern, a
    sequence of str -> its items (empty strings dropped: they would match nothing useful
    and ``--exclude ""`` is a slip), a :class:`NameMatcher` -> its patterns' texts.  Raises
    :class:`AmpRewriteError` for anything else."""
    if exclude is None:
        return ()
    if isinstance(exclude, NameMatcher):
        return tuple(text for text, _ in exclude.patterns)
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
    node name, and how, so that the report can name it.

    ``layer_scopes``, where given (:meth:`bind_layer_scopes`), maps name scopes of one traced
    graph (``"sequential_1/dense_1_2"``) to the Keras layer that opened each (``"dense_1"``);
    see the module docstring.  :func:`amp_rewrite.rewrite_graph_def` takes a matcher as its
    ``exclude`` too, which is how the training path hands one over."""

    patterns: tuple[tuple[str, "re.Pattern[str]"], ...]
    # Not compared or hashed: two matchers of the same patterns are equal whatever they know.
    layer_scopes: Mapping[str, str] | None = dataclasses.field(default=None, compare=False, hash=False)
    #: Every prefix of a recorded scope (derived), so that a name's components are walked
    #: only as far as some recorded scope goes: most nodes stop at their first component.
    _scope_prefixes: frozenset[str] = dataclasses.field(init=False, default=frozenset(), repr=False,
                                                        compare=False, hash=False)

    def __post_init__(self) -> None:
        prefixes: set[str] = set()
        for scope in self.layer_scopes or ():
            parts = scope.split("/")
            prefixes.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
        object.__setattr__(self, "_scope_prefixes", frozenset(prefixes))  # frozen: set once, here

    @classmethod
    def compile(cls, exclude: "str | Sequence[str] | NameMatcher | None") -> "NameMatcher":
        """Compile every pattern of ``exclude`` (see :func:`exclude_patterns`); a matcher is
        returned as it is.  Raises :class:`AmpRewriteError` naming the first bad pattern."""
        if isinstance(exclude, NameMatcher):
            return exclude
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

    def bind_layer_scopes(self, layer_scopes: Mapping[str, str]) -> "NameMatcher":
        """This matcher for one traced graph whose layer scopes are known: ``layer_scopes``
        maps each name scope a Keras layer opened in the trace to the layer's name (see the
        module docstring).  A new matcher; ``self`` and ``layer_scopes`` are not mutated
        (the mapping is copied)."""
        return dataclasses.replace(self, layer_scopes=dict(layer_scopes))

    def _components(self, name: str, keras3: bool) -> list[tuple[str, str]]:
        """``(component, compared)`` for each ``/``-separated component of ``name`` (none for a
        name of one component, which only the whole-name match sees): ``compared`` is what a
        pattern is matched against -- the layer's name for a component that ends a recorded
        layer scope, else (without recorded scopes) the component without its ``_N`` in a
        Keras 3 trace (``keras3``), else the component itself."""
        if "/" not in name:
            return []
        parts = name.split("/")
        if self.layer_scopes is None:
            return [(part, _unsuffixed(part) if keras3 else part) for part in parts]
        # Recorded scopes are exact, so keras3's guess is not made: a component no recorded
        # scope ends (an op's name, the loss's or optimizer's scope) is compared as it is.
        compared = list(parts)
        named = [False] * len(parts)
        prefixes = self._scope_prefixes
        for start in range(len(parts)):
            path = ""
            for i in range(start, len(parts)):
                path = parts[i] if i == start else f"{path}/{parts[i]}"
                if path not in prefixes:
                    break
                layer = self.layer_scopes.get(path)
                # The outermost match names a component: a scope found from the start of the
                # name is the node's own, one found later (under gradient_tape/) its forward op's.
                if layer is not None and not named[i]:
                    compared[i], named[i] = layer, True
        return list(zip(parts, compared))

    def _hit(self, name: str, keras3: bool) -> tuple[str, str, str] | None:
        """``(pattern, how, compared)`` for the first pattern that matches ``name``: ``how``
        as in :meth:`match`, ``compared`` what the pattern matched (the name, or the
        component as :meth:`_components` compares it)."""
        parts: list[tuple[str, str]] | None = None
        for text, rx in self.patterns:
            if rx.fullmatch(name):
                return text, "name", name
            if parts is None:
                parts = self._components(name, keras3)
            for part, compared in parts:
                if rx.fullmatch(compared):
                    return text, part, compared
        return None

    def match(self, name: str, keras3: bool = False) -> tuple[str, str] | None:
        """``(pattern, how)`` for the first pattern that matches ``name`` -- ``how`` is
        ``"name"`` (the whole name) or the matching path component -- else ``None``.
        ``keras3``: the name comes from a graph whose scopes Keras 3 made unique
        (:func:`keras_scoped`); components are compared without their ``_N`` suffix.  A
        matcher with recorded layer scopes (:meth:`bind_layer_scopes`) ignores ``keras3``."""
        hit = self._hit(name, keras3)
        return None if hit is None else hit[:2]

    def reason(self, name: str, keras3: bool = False) -> str | None:
        """The report's reason for a node this matcher excludes (``None`` if it does not).
        Starts with ``preserved`` like every reason of a preserved node, which
        :func:`amp_rewrite.report.build.nothing_converted_reason` and ``explain`` rely on."""
        hit = self._hit(name, keras3)
        if hit is None:
            return None
        pattern, how, compared = hit
        if how == "name":
            where = "its name"
        elif compared != how:
            where = f"path component {how!r}, Keras layer {compared!r}"
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


#: Per :func:`unmatched_warned_once` scope: the patterns already warned about, and what the
#: warnings say was rewritten.  ``None`` outside any scope: every rewrite warns for itself.
_WARNED: contextvars.ContextVar[tuple[set[str], str] | None] = contextvars.ContextVar(
    "amp_rewrite_exclude_warned", default=None)


def warn_unmatched(counts: Mapping[str, int], where: str = "") -> list[str]:
    """Log a WARNING for each pattern of ``counts`` (a report's ``excluded``: pattern -> nodes
    matched) that matched no node: such a pattern keeps nothing float32, which a user who
    mistyped a layer name would otherwise learn only from the report.  ``where`` names what
    was rewritten (empty: "the graph"); inside :func:`unmatched_warned_once` its own
    ``where`` wins, and a pattern already warned about in that scope is not warned about
    again.  Returns the patterns warned about.  Reads ``counts``; mutates only the enclosing
    scope's record."""
    scope = _WARNED.get()
    seen, where = scope if scope is not None else (set(), where)
    out = []
    for pattern, count in counts.items():
        if count or pattern in seen:
            continue
        seen.add(pattern)
        out.append(pattern)
        log.warning("amp_rewrite: %sexclude pattern %r matches no node%s, so it keeps nothing float32 "
                    "(the report's nodes are the names a pattern can match)",
                    f"{where}: " if where else "", pattern, "" if where else " of the graph")
    return out


@contextlib.contextmanager
def unmatched_warned_once(seen: set[str], where: str) -> Iterator[None]:
    """Within this block, :func:`warn_unmatched` warns about a pattern only if it is not in
    ``seen``, adds it to ``seen`` (mutated: a caller that keeps the set across blocks warns
    once in all), and says the rewrite was of ``where``.  For a caller that rewrites several
    graphs for one purpose (a training step, traced again without loss scaling, priced
    against its float32 twin): one warning per pattern, not one per graph.  Blocks nest; the
    innermost wins."""
    token = _WARNED.set((seen, where))
    try:
        yield
    finally:
        _WARNED.reset(token)
