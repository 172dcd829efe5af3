"""TF1 ``MonitoredSession`` / ``MonitoredTrainingSession`` running the rewritten graph.

TensorFlow's ``MonitoredTrainingSession`` opens its session through a ``SessionManager`` that
calls TensorFlow's ``Session`` class directly, so :class:`amp_rewrite.Session` cannot be slipped
in.  :class:`MixedPrecisionSessionCreator` is a ``tf.compat.v1.train.SessionCreator`` that:

1. finalizes the scaffold (init op, ready ops, saver) in the user's graph, as TensorFlow's
   creators do;
2. rewrites that graph (:func:`~amp_rewrite.training.session.rewrite_graph_with_result`; every
   op keeps its name, so the scaffold's ops exist in the rewritten graph too);
3. lets TensorFlow's own ``SessionManager`` open, restore or initialize, and check a session on
   the *rewritten* graph (chief: ``prepare_session``; worker: ``wait_for_session``), with the
   scaffold's ops and saver mapped there by name;
4. returns an :class:`amp_rewrite.Session` holding it, so hooks and ``run`` keep using the
   original graph's tensors, and fetched values keep their original dtypes.

Use it as ``tf.compat.v1.train.MonitoredSession(session_creator=MixedPrecisionSessionCreator(
...), hooks=...)``, or call :func:`MonitoredTrainingSession`, a drop-in for TensorFlow's that
uses it (the same arguments and hooks, plus ``rewrite_options``/``fetches``).

Checkpoints are compatible both ways: the rewrite leaves variables float32 and their names
unchanged.  The scaffold's ``init_fn`` is called with the :class:`amp_rewrite.Session`.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.training import basic_session_run_hooks
from tensorflow.python.training import monitored_session as tf_monitored
from tensorflow.python.training import session_manager as tf_session_manager

from ..errors import AmpRewriteError
from ._common import check_rewrite_options, mark_graph_rewritten
from .session import Session, rewrite_graph_with_result

__all__ = ["MixedPrecisionSessionCreator", "MonitoredTrainingSession"]

log = logging.getLogger(__name__)

USE_DEFAULT = tf_monitored.USE_DEFAULT


class MixedPrecisionSessionCreator(tf.compat.v1.train.SessionCreator):
    """A ``SessionCreator`` whose sessions run the default graph rewritten to mixed precision.

    Parameters
    ----------
    scaffold, master, config, checkpoint_dir, checkpoint_filename_with_path
        As for ``tf.compat.v1.train.ChiefSessionCreator``.
    is_chief
        ``False`` waits for the chief to initialize the variables (as
        ``WorkerSessionCreator``), for at most ``max_wait_secs``.
    fetches, rewrite_options
        As for :class:`amp_rewrite.Session`: nodes whose dtypes the rewrite must keep, and
        options over those of the loss-scaled optimizer that built the train op.

    The graph is the default graph when :meth:`create_session` is first called (as for
    TensorFlow's creators); it is rewritten once and the rewrite reused when the session is
    re-created (``MonitoredSession`` recovers from an aborted session that way).
    """

    def __init__(
        self,
        scaffold: Any = None,
        master: str = "",
        config: Any = None,
        checkpoint_dir: str | None = None,
        checkpoint_filename_with_path: str | None = None,
        *,
        is_chief: bool = True,
        max_wait_secs: float = 30 * 60,
        fetches: Sequence[str] | None = None,
        rewrite_options: Mapping[str, Any] | None = None,
    ) -> None:
        check_rewrite_options(rewrite_options or {})  # fail now, not when the session opens
        self._scaffold = scaffold or tf.compat.v1.train.Scaffold()
        self._master = master
        self._config = config
        self._checkpoint_dir = checkpoint_dir
        self._checkpoint_filename_with_path = checkpoint_filename_with_path
        self._is_chief = is_chief
        self._max_wait_secs = max_wait_secs
        self._fetches = list(fetches) if fetches is not None else None
        self._rewrite_options = dict(rewrite_options or {})
        self._rewrite: tuple[tf.Graph, int, tf.Graph, Any] | None = None
        mark_graph_rewritten(tf.compat.v1.get_default_graph())

    def _rewritten(self, graph: tf.Graph) -> tuple[tf.Graph, Any]:
        if self._rewrite is None or self._rewrite[0] is not graph or self._rewrite[1] != graph.version:
            new, result = rewrite_graph_with_result(graph, fetches=self._fetches,
                                                    **self._rewrite_options)
            self._rewrite = (graph, graph.version, new, result)
        return self._rewrite[2], self._rewrite[3]

    def create_session(self) -> Session:
        """Open, restore or initialize a session on the rewritten graph; see the module doc."""
        self._scaffold.finalize()
        graph = tf.compat.v1.get_default_graph()
        new, result = self._rewritten(graph)
        scaffold = self._scaffold
        session = Session(self._master, graph=graph, config=self._config, fetches=self._fetches,
                          rewrite_options=self._rewrite_options)

        def mapped(element: Any) -> Any:
            return None if element is None else new.as_graph_element(element.name)

        def mapped_feed(feed: Mapping[Any, Any] | None) -> dict[Any, Any] | None:
            if not feed:
                return None
            out = {}
            for key, value in feed.items():
                old = graph.as_graph_element(key if isinstance(key, str) else key.name)
                tensor = new.as_graph_element(old.name)
                if tensor.dtype != old.dtype:  # fed in the rewritten graph's dtype
                    value = np.asarray(value).astype(tensor.dtype.as_numpy_dtype)
                out[tensor] = value
            return out

        saver = None
        if scaffold.saver is not None:
            with new.as_default():  # a Saver from its SaverDef: names only, no new ops
                saver = tf.compat.v1.train.Saver(saver_def=scaffold.saver.as_saver_def())
        manager = tf_session_manager.SessionManager(
            local_init_op=mapped(scaffold.local_init_op),
            local_init_feed_dict=mapped_feed(scaffold.local_init_feed_dict),
            ready_op=mapped(scaffold.ready_op),
            ready_for_local_init_op=mapped(scaffold.ready_for_local_init_op),
            graph=new,
        )
        if not self._is_chief:
            raw = manager.wait_for_session(self._master, config=self._config,
                                           max_wait_secs=self._max_wait_secs)
            session._adopt(new, result, raw)  # noqa: SLF001 - our own class
            return session

        def init_fn(raw: Any) -> None:
            # The user's init_fn sees the amp_rewrite.Session (original names and dtypes).
            session._adopt(new, result, raw)  # noqa: SLF001
            scaffold.init_fn(session)

        raw = manager.prepare_session(
            self._master, saver=saver, checkpoint_dir=self._checkpoint_dir,
            checkpoint_filename_with_path=self._checkpoint_filename_with_path,
            config=self._config, init_op=mapped(scaffold.init_op),
            init_feed_dict=mapped_feed(scaffold.init_feed_dict),
            init_fn=init_fn if scaffold.init_fn is not None else None,
        )
        session._adopt(new, result, raw)  # noqa: SLF001
        return session


def _refuse_distribute_coordinator() -> None:
    """Raise :class:`AmpRewriteError` under TensorFlow's distribute coordinator (a worker
    context), whose session creation :func:`MonitoredTrainingSession` does not reproduce."""
    from tensorflow.python.distribute import distribute_coordinator_context

    if distribute_coordinator_context.get_current_worker_context():
        raise AmpRewriteError(
            "amp_rewrite's MonitoredTrainingSession does not support TensorFlow's distribute "
            "coordinator; use MixedPrecisionSessionCreator with MonitoredSession"
        )


def _schedule(steps: Any, secs: Any, default: tuple[Any, Any]) -> tuple[Any, Any]:
    """``(steps, secs)`` of a periodic hook with ``USE_DEFAULT`` resolved as TensorFlow does:
    both left at ``USE_DEFAULT`` give ``default``; one given, the other becomes ``None``.
    Pure."""
    if steps == USE_DEFAULT and secs == USE_DEFAULT:
        return default
    if secs == USE_DEFAULT:
        return steps, None
    if steps == USE_DEFAULT:
        return None, secs
    return steps, secs


def _chief_hooks(scaffold: Any, checkpoint_dir: str | None, summary_dir: str | None,
                 log_step_count_steps: int, summaries: tuple[Any, Any], checkpoints: tuple[Any, Any],
                 save_graph_def: bool) -> list[Any]:
    """The hooks TensorFlow's ``MonitoredTrainingSession`` adds on the chief, in its order:
    step counter and summary saver (with a ``summary_dir``), checkpoint saver (with a
    ``checkpoint_dir``).  ``summaries`` and ``checkpoints`` are resolved ``(steps, secs)``
    pairs (:func:`_schedule`).  Creates the hooks, changes nothing else."""
    save_summaries_steps, save_summaries_secs = summaries
    save_checkpoint_steps, save_checkpoint_secs = checkpoints
    out: list[Any] = []
    if summary_dir:
        if log_step_count_steps and log_step_count_steps > 0:
            out.append(basic_session_run_hooks.StepCounterHook(
                output_dir=summary_dir, every_n_steps=log_step_count_steps))
        if (save_summaries_steps and save_summaries_steps > 0) or (
                save_summaries_secs and save_summaries_secs > 0):
            out.append(basic_session_run_hooks.SummarySaverHook(
                scaffold=scaffold, save_steps=save_summaries_steps,
                save_secs=save_summaries_secs, output_dir=summary_dir))
    if checkpoint_dir and ((save_checkpoint_secs and save_checkpoint_secs > 0) or (
            save_checkpoint_steps and save_checkpoint_steps > 0)):
        out.append(basic_session_run_hooks.CheckpointSaverHook(
            checkpoint_dir, save_steps=save_checkpoint_steps, save_secs=save_checkpoint_secs,
            scaffold=scaffold, save_graph_def=save_graph_def))
    return out


def MonitoredTrainingSession(  # noqa: N802 - TensorFlow's name, as a drop-in
    master: str = "",
    is_chief: bool = True,
    checkpoint_dir: str | None = None,
    scaffold: Any = None,
    hooks: Sequence[Any] | None = None,
    chief_only_hooks: Sequence[Any] | None = None,
    save_checkpoint_secs: Any = USE_DEFAULT,
    save_summaries_steps: Any = USE_DEFAULT,
    save_summaries_secs: Any = USE_DEFAULT,
    config: Any = None,
    stop_grace_period_secs: int = 120,
    log_step_count_steps: int = 100,
    max_wait_secs: int = 7200,
    save_checkpoint_steps: Any = USE_DEFAULT,
    summary_dir: str | None = None,
    save_graph_def: bool = True,
    *,
    fetches: Sequence[str] | None = None,
    rewrite_options: Mapping[str, Any] | None = None,
) -> Any:
    """``tf.compat.v1.train.MonitoredTrainingSession`` running the rewritten default graph.

    The same arguments, defaults and hooks as TensorFlow 2.21's (step counter, summary and
    checkpoint hooks on the chief); the session comes from a
    :class:`MixedPrecisionSessionCreator`.  ``fetches`` and ``rewrite_options`` as for
    :class:`amp_rewrite.Session`.

    Raises
    ------
    AmpRewriteError
        Under TensorFlow's distribute coordinator (a worker context), whose session creation
        this does not reproduce; and for an unknown rewrite option.
    """
    _refuse_distribute_coordinator()
    # TensorFlow's defaults: summaries every 100 steps, checkpoints every 600 s.
    save_summaries_steps, save_summaries_secs = _schedule(
        save_summaries_steps, save_summaries_secs, (100, None))
    save_checkpoint_steps, save_checkpoint_secs = _schedule(
        save_checkpoint_steps, save_checkpoint_secs, (None, 600))

    scaffold = scaffold or tf.compat.v1.train.Scaffold()
    creator = MixedPrecisionSessionCreator(
        scaffold=scaffold, master=master, config=config, checkpoint_dir=checkpoint_dir,
        is_chief=is_chief, max_wait_secs=max_wait_secs, fetches=fetches,
        rewrite_options=rewrite_options,
    )
    if not is_chief:
        return tf.compat.v1.train.MonitoredSession(
            session_creator=creator, hooks=list(hooks or []),
            stop_grace_period_secs=stop_grace_period_secs)

    all_hooks = list(chief_only_hooks or [])
    all_hooks += _chief_hooks(
        scaffold, checkpoint_dir, summary_dir or checkpoint_dir, log_step_count_steps,
        (save_summaries_steps, save_summaries_secs), (save_checkpoint_steps, save_checkpoint_secs),
        save_graph_def)
    all_hooks.extend(hooks or [])
    return tf.compat.v1.train.MonitoredSession(
        session_creator=creator, hooks=all_hooks, stop_grace_period_secs=stop_grace_period_secs)
