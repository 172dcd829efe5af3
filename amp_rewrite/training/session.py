"""TF1 graphs: ``rewrite_graph(tf.Graph) -> tf.Graph`` and ``amp_rewrite.Session``.

``rewrite_graph`` exports the graph as a MetaGraphDef (GraphDef with function library, plus
the serializable collections: variables, train_op, losses, savers...), rewrites the GraphDef
with :func:`amp_rewrite.rewrite_graph_def`, and imports both into a new ``tf.Graph``.  Every op
keeps its name (the rewrite only adds Cast nodes), so fetching and feeding by name work.

``rewrite_graph`` uses the options of the loss-scaled optimizer that built a train op in the
graph (:func:`amp_rewrite.enable_mixed_precision_graph_rewrite`'s ``target``, ``precision``...),
overridden by the options passed to it.

``Session`` is a drop-in for ``tf.compat.v1.Session`` that runs the rewritten graph.  It takes
fetches and feeds from the *original* graph (tensors, ops, variables or names) and maps them
by name.  A fetched tensor that the rewrite turned into float16/bfloat16 is cast back to its
original dtype, and a fed value is cast to the dtype the rewritten graph expects, so results
look exactly like the float32 graph's.  The graph is rewritten at the first ``run``, with the
options of the loss-scaled optimizer that built a train op in it (if any), overridden by the
options given to the Session.

Assumptions: the graph is complete at the first ``run`` (adding ops afterwards is an error,
because the running session's state belongs to the graph rewritten then).  ``partial_run``
works like ``run``: names of the original graph, values in their original dtypes.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.client import session as _tf_session
from tensorflow.python.client.session import SessionInterface
from tensorflow.python.framework import meta_graph
from tensorflow.python.framework import stack as tf_stack

from ..api import RewriteResult, rewrite_graph_def
from ..errors import AmpRewriteError
from ._common import (
    check_rewrite_options,
    mark_graph_rewritten,
    report_rewrite,
    warn_if_float16_without_loss_scaling,
    without_training_options,
)
from .optimizer import graph_rewrite_options

__all__ = ["rewrite_graph", "rewrite_graph_with_result", "graph_options", "Session"]

log = logging.getLogger(__name__)

# TensorFlow's own Session class, taken at import: the launcher (amp-rewrite run) replaces
# tf.compat.v1.Session with amp_rewrite's, which must still open TensorFlow's underneath.
_TFSession = _tf_session.Session


def graph_options(graph: tf.Graph, rewrite_options: Mapping[str, Any] | None = None,
                  fetches: Sequence[str] | None = None) -> tuple[dict[str, Any], list[str] | None]:
    """The rewrite options and fetches for ``graph``: those of the loss-scaled optimizer that
    built a train op in it, overridden by ``rewrite_options``; the fetches are the union of
    ``fetches`` and both option sets' ``fetches`` (``None`` when none names any).  Pure.

    Raises
    ------
    AmpRewriteError
        For an unknown rewrite option.
    """
    registered = graph_rewrite_options(graph) or {}
    explicit = dict(rewrite_options or {})
    names: set[str] | None = None
    for source in (fetches, registered.pop("fetches", None), explicit.pop("fetches", None)):
        if source is not None:
            names = (names or set()) | set(source)
    options = check_rewrite_options({**registered, **explicit})
    return options, None if names is None else sorted(names)


def rewrite_graph_with_result(
    graph: tf.Graph, *, fetches: Sequence[str] | None = None, **rewrite_options: Any
) -> tuple[tf.Graph, RewriteResult]:
    """:func:`rewrite_graph` that also returns the :class:`~amp_rewrite.RewriteResult`
    (``.report`` says what was converted, or in ``skipped`` why nothing was).

    Logs one INFO line per graph with what was converted, or one WARNING with the reason when
    nothing was (the graph would train in float32).  The ops that apply the loss scale stay
    float32 (:func:`amp_rewrite.rewrite_graph_def` keeps what is under
    :data:`amp_rewrite.training.loss_scale.SCOPE`).
    """
    options, fetches = graph_options(graph, rewrite_options, fetches)
    mark_graph_rewritten(graph)
    start = time.perf_counter()
    with graph.as_default():  # TensorFlow exports meta graphs only in graph mode
        meta = tf.compat.v1.train.export_meta_graph(graph=graph, clear_devices=False)
    options = without_training_options(options, "a TF1 graph")
    result = rewrite_graph_def(meta.graph_def, fetches=fetches, **options)
    meta.graph_def.CopyFrom(result.graph_def)
    _drop_dangling_collection_entries(meta)
    new_graph = tf.Graph()
    with new_graph.as_default():
        meta_graph.import_scoped_meta_graph(meta, clear_devices=False, graph=new_graph)
    _copy_unserializable_collections(graph, new_graph)
    report_rewrite(graph, "TF1 graph", result.report, time.perf_counter() - start)
    warn_if_float16_without_loss_scaling(
        graph, "TF1 graph", result.report, result.graph_def,
        "wrap its optimizer with amp_rewrite.enable_mixed_precision_graph_rewrite before minimize (or use its "
        "get_scaled_loss and get_unscaled_gradients around tf.gradients), or rewrite to bfloat16")
    return new_graph, result


def rewrite_graph(
    graph: tf.Graph, *, fetches: Sequence[str] | None = None, **rewrite_options: Any
) -> tf.Graph:
    """A new ``tf.Graph``: ``graph`` rewritten to mixed precision, same op names and collections.

    Does not mutate ``graph``.  ``fetches`` are node names whose dtypes must not change
    (default: the graph's outputs, the nodes nothing reads from); ``rewrite_options`` go to
    :func:`amp_rewrite.rewrite_graph_def` (``target`` defaults to ``"auto"``), over the options
    of the loss-scaled optimizer that built a train op in ``graph``.  Collections
    that TensorFlow cannot serialize are copied where their items are ops or tensors (mapped
    by name) and otherwise dropped with a DEBUG log line.
    """
    return rewrite_graph_with_result(graph, fetches=fetches, **rewrite_options)[0]


def _drop_dangling_collection_entries(meta: Any) -> None:
    """Remove node-list collection entries that name nodes the graph does not have.

    A TF1 optimizer that runs inside a ``tf.cond`` branch puts an op of the branch function in
    TRAIN_OP; TensorFlow exports the name and then cannot import it.  Mutates ``meta``.
    """
    names = {node.name for node in meta.graph_def.node}
    for key, collection in meta.collection_def.items():
        if collection.WhichOneof("kind") != "node_list":
            continue
        values = list(collection.node_list.value)
        kept = [v for v in values if v.split(":")[0].lstrip("^") in names]
        if len(kept) != len(values):
            log.debug("collection %r: dropped %d entries naming no node of the graph",
                      key, len(values) - len(kept))
            del collection.node_list.value[:]
            collection.node_list.value.extend(kept)


def _copy_unserializable_collections(old: tf.Graph, new: tf.Graph) -> None:
    present = set(new.get_all_collection_keys())
    for key in old.get_all_collection_keys():
        if key in present:
            continue
        items = old.get_collection(key)
        mapped = []
        for item in items:
            if isinstance(item, (tf.Tensor, tf.Operation)):
                mapped.append(new.as_graph_element(item.name))
            else:
                mapped = None
                break
        if mapped is None:
            log.debug("collection %r not copied to the rewritten graph (items are not ops)", key)
            continue
        for item in mapped:
            new.add_to_collection(key, item)


def _flatten(structure: Any) -> list[Any]:
    """The leaves of a fetch structure, as ``Session.run`` sees them.

    Lists, tuples (namedtuples too) and dicts are containers; everything else is a leaf.
    ``tf.nest`` is not used because it looks inside variables and composite tensors.
    """
    if isinstance(structure, (list, tuple)):
        return [leaf for item in structure for leaf in _flatten(item)]
    if isinstance(structure, dict):
        return [leaf for value in structure.values() for leaf in _flatten(value)]
    return [structure]


def _pack(structure: Any, values: Any) -> Any:
    """Rebuild ``structure`` with the next items of the iterator ``values`` as leaves."""
    if isinstance(structure, list):
        return [_pack(item, values) for item in structure]
    if isinstance(structure, tuple):
        items = [_pack(item, values) for item in structure]
        return type(structure)(*items) if hasattr(structure, "_fields") else type(structure)(items)
    if isinstance(structure, dict):
        return type(structure)((key, _pack(value, values)) for key, value in structure.items())
    return next(values)


def _element_name(element: Any, graph: tf.Graph, what: str) -> str:
    """The name of a fetch/feed ``element`` of ``graph`` (tensor, op, variable or name)."""
    if isinstance(element, str):
        return element
    if isinstance(element, bytes):
        return element.decode()
    if hasattr(element, "_as_graph_element") and not isinstance(element, (tf.Tensor, tf.Operation)):
        element = element._as_graph_element()  # a variable: its value tensor, as Session does
    if isinstance(element, (tf.Tensor, tf.Operation)):
        if element.graph is not graph:
            raise ValueError(f"{what} {element.name!r} is not an element of this session's graph")
        return element.name
    raise TypeError(f"cannot {what} {element!r} ({type(element).__name__}) through amp_rewrite.Session")


class Session(SessionInterface):
    """A ``tf.compat.v1.Session`` that runs ``graph`` rewritten to mixed precision.

    Parameters
    ----------
    target, config
        As for ``tf.compat.v1.Session``.
    graph
        The graph to run (default: the default graph).  Not modified.
    fetches
        Node names whose dtypes the rewrite must keep (see :func:`rewrite_graph`).
    rewrite_options
        Options for :func:`amp_rewrite.rewrite_graph_def`, as a dict (``target`` here is the
        TensorFlow server, as in ``tf.compat.v1.Session``, so the rewrite's ``target`` goes
        in this dict); they override the options of the loss-scaled optimizer registered on
        the graph.
    """

    def __init__(
        self,
        target: str = "",
        graph: tf.Graph | None = None,
        config: Any = None,
        *,
        fetches: Sequence[str] | None = None,
        rewrite_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._graph = graph if graph is not None else tf.compat.v1.get_default_graph()
        check_rewrite_options(rewrite_options or {})  # fail now, not at the first run
        mark_graph_rewritten(self._graph)  # its optimizers need not warn that it is not
        self._explicit_options = dict(rewrite_options or {})
        self._fetches = list(fetches) if fetches is not None else None
        self._target = target
        self._config = config
        self._session: tf.compat.v1.Session | None = None
        self._rewritten: tf.Graph | None = None
        self._result: RewriteResult | None = None
        self._version: int | None = None
        self._closed = False

    # -- SessionInterface -----------------------------------------------------------------
    @property
    def graph(self) -> tf.Graph:
        """The original graph (what callers build and fetch from)."""
        return self._graph

    @property
    def sess_str(self) -> str:
        return self._target

    @property
    def rewritten_graph(self) -> tf.Graph:
        """The graph that runs (rewritten at the first ``run``)."""
        self._ensure_started()
        assert self._rewritten is not None
        return self._rewritten

    @property
    def rewrite_result(self) -> RewriteResult:
        """The :class:`~amp_rewrite.RewriteResult` of the rewrite (report, plans)."""
        self._ensure_started()
        assert self._result is not None
        return self._result

    def rewrite_options(self) -> dict[str, Any]:
        """The options the graph is (or will be) rewritten with."""
        return graph_options(self._graph, self._explicit_options)[0]

    def _ensure_started(self) -> None:
        if self._closed:
            raise RuntimeError("Attempted to use a closed Session.")
        if self._session is None:
            # `fetches` may come from the optimizer's options as well as from this Session:
            # the rewrite keeps the nodes both name (graph_options).
            rewritten, result = rewrite_graph_with_result(
                self._graph, fetches=self._fetches, **self._explicit_options
            )
            self._adopt(rewritten, result, _TFSession(self._target, graph=rewritten,
                                                      config=self._config))
        elif self._graph.version != self._version:
            raise AmpRewriteError(
                "the graph changed after this amp_rewrite.Session first ran it; build the whole "
                "graph (including Savers and summaries) before the first run, or open a new "
                "Session"
            )

    def _adopt(self, rewritten: tf.Graph, result: RewriteResult, session: Any) -> None:
        """Run ``session`` (TensorFlow's, on ``rewritten``, the rewrite of this Session's graph
        described by ``result``) from now on.  Used at the first run, and by
        :class:`~amp_rewrite.training.monitored.MixedPrecisionSessionCreator`, whose session
        TensorFlow's SessionManager opened and initialized.  Mutates this Session."""
        self._rewritten, self._result = rewritten, result
        self._version = self._graph.version
        self._session = session

    def run(self, fetches: Any, feed_dict: Mapping[Any, Any] | None = None,
            options: Any = None, run_metadata: Any = None) -> Any:
        """Run ``fetches`` of the original graph on the rewritten graph.

        Same contract as ``tf.compat.v1.Session.run``; fetched tensors come back in their
        original dtypes.
        """
        self._ensure_started()
        assert self._session is not None
        new_fetches, dtypes = self._map_fetches(fetches)
        values = self._session.run(new_fetches, self._map_feed(feed_dict), options, run_metadata)
        return self._restore(fetches, values, new_fetches, dtypes)

    def _map_fetches(self, fetches: Any) -> tuple[list[Any], list[Any]]:
        """The rewritten graph's elements for ``fetches`` (flattened), and the original
        dtypes to give the values back in (``None`` for ops)."""
        assert self._rewritten is not None
        new_fetches = []
        dtypes: list[Any] = []
        for leaf in _flatten(fetches):
            name = _element_name(leaf, self._graph, "fetch")
            old = self._graph.as_graph_element(name)
            new_fetches.append(self._rewritten.as_graph_element(name))
            dtypes.append(old.dtype if isinstance(old, tf.Tensor) else None)
        return new_fetches, dtypes

    def _map_feed_key(self, key: Any) -> tuple[Any, Any]:
        """The rewritten graph's tensor for a feed key, and the original tensor."""
        assert self._rewritten is not None
        name = _element_name(key, self._graph, "feed")
        tensor = self._rewritten.as_graph_element(name)
        if not isinstance(tensor, tf.Tensor):
            raise TypeError(f"cannot feed {name!r}: it is not a tensor")
        return tensor, self._graph.as_graph_element(name)

    def _map_feed(self, feed_dict: Mapping[Any, Any] | None) -> dict[Any, Any] | None:
        new_feed = {}
        for key, value in (feed_dict or {}).items():
            tensor, old = self._map_feed_key(key)
            if tensor.dtype != old.dtype:
                value = np.asarray(value).astype(tensor.dtype.as_numpy_dtype)
            new_feed[tensor] = value
        return new_feed or None

    @staticmethod
    def _restore(fetches: Any, values: Sequence[Any], new_fetches: Sequence[Any], dtypes: Sequence[Any]) -> Any:
        out = []
        for value, dtype, new in zip(values, dtypes, new_fetches):
            if dtype is not None and new.dtype != dtype:
                value = np.asarray(value).astype(dtype.as_numpy_dtype)
            out.append(value)
        return _pack(fetches, iter(out))

    def make_callable(self, fetches: Any, feed_list: Sequence[Any] | None = None,
                      accept_options: bool = False) -> Any:
        """A function ``f(*feed_values)`` that runs ``fetches`` (simple form of TF's)."""
        feed_list = list(feed_list or [])

        def call(*values: Any, **kwargs: Any) -> Any:
            return self.run(fetches, dict(zip(feed_list, values)),
                            kwargs.get("options"), kwargs.get("run_metadata"))

        return call

    def partial_run_setup(self, fetches: Any, feeds: Sequence[Any] | None = None) -> Any:
        """Set up a partial run of the rewritten graph (``tf.compat.v1.Session``'s contract,
        in the original graph's names)."""
        self._ensure_started()
        assert self._session is not None
        new_fetches, _ = self._map_fetches(fetches)
        return self._session.partial_run_setup(new_fetches, [self._map_feed_key(f)[0] for f in feeds or []])

    def partial_run(self, handle: Any, fetches: Any, feed_dict: Mapping[Any, Any] | None = None) -> Any:
        """Continue a partial run; values come back in the original dtypes."""
        self._ensure_started()
        assert self._session is not None
        new_fetches, dtypes = self._map_fetches(fetches)
        values = self._session.partial_run(handle, new_fetches, self._map_feed(feed_dict))
        return self._restore(fetches, values, new_fetches, dtypes)

    def list_devices(self) -> Any:
        self._ensure_started()
        assert self._session is not None
        return self._session.list_devices()

    def as_default(self) -> Any:
        """Make this session the default one (``Tensor.eval()`` and ``Operation.run()`` use it)."""
        return tf_stack.default_session(self)

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
        self._closed = True

    def __enter__(self) -> "Session":
        self._default_cm = self.as_default()
        self._default_cm.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        cm = getattr(self, "_default_cm", None)
        if cm is not None:
            cm.__exit__(*exc)
            self._default_cm = None
        self.close()
