"""Autotuning: time candidate plans on the local device and keep the fastest.

The optimal planner's cost model ranks colourings by estimate; on a given machine an
estimate can be wrong (kernel fusions, cache effects, a noisy neighbour).  :func:`autotune`
rewrites the graph with each candidate planner, runs every candidate and the float32
original on this machine -- interleaved, repeated, medians -- and returns the fastest,
float32 included, so that the result is never measurably slower than not rewriting.

It runs graphs, so it needs feeds for the graph's placeholders and, naturally, a machine
of the kind the graph is rewritten for.  The caller's GraphDef is never modified.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .api import RewriteResult, rewrite_graph_def
from .errors import AmpRewriteError

__all__ = ["AutotuneResult", "autotune"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AutotuneResult:
    """The winner and what was measured.

    ``choice`` is ``"float32"`` (keep the original graph) or a planner name; ``graph_def``
    is the graph to use; ``result`` the winning :class:`RewriteResult` (``None`` for
    float32); ``step_ms`` the median step time of every candidate.
    """

    choice: str
    graph_def: Any
    result: RewriteResult | None
    step_ms: Mapping[str, float] = field(default_factory=dict)


def _runner(graph_def: Any, feeds: Mapping[str, Any], fetches: Sequence[str]) -> Any:
    import tensorflow as tf
    from tensorflow.core.protobuf import rewriter_config_pb2

    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    config = tf.compat.v1.ConfigProto()
    # Grappler on, as the graph will run, but no mixed-precision pass of TensorFlow's own.
    ro = config.graph_options.rewrite_options
    off = rewriter_config_pb2.RewriterConfig.OFF
    ro.auto_mixed_precision = ro.auto_mixed_precision_onednn_bfloat16 = off
    ro.auto_mixed_precision_mkl = ro.auto_mixed_precision_cpu = off
    sess = tf.compat.v1.Session(graph=graph, config=config)
    out = [graph.get_tensor_by_name(f if ":" in f else f + ":0") for f in fetches]
    feed = {graph.get_tensor_by_name(k if ":" in k else k + ":0"): v for k, v in feeds.items()}
    sess.run(out, feed)  # warm-up: kernel creation, Grappler
    return sess, out, feed


def autotune(
    graph_def: Any,
    *,
    feeds: Mapping[str, Any],
    fetches: Sequence[str],
    planners: Sequence[str] = ("greedy", "optimal"),
    repeats: int = 5,
    steps: int = 3,
    **rewrite_options: Any,
) -> AutotuneResult:
    """Rewrite ``graph_def`` with each of ``planners``, time each candidate and float32, and
    return the fastest.  ``feeds`` maps placeholder tensors (``"x:0"``) to values;
    ``fetches`` are the tensors a step computes (also preserved by the rewrite).  Other
    options go to :func:`~amp_rewrite.api.rewrite_graph_def`.

    Raises :class:`AmpRewriteError` when the original graph cannot run with ``feeds``.
    """
    if repeats < 1 or steps < 1:
        raise AmpRewriteError("autotune needs repeats >= 1 and steps >= 1")
    results: dict[str, RewriteResult] = {}
    for planner in planners:
        results[planner] = rewrite_graph_def(graph_def, planner=planner, fetches=list(fetches),
                                             **rewrite_options)
    candidates: dict[str, Any] = {"float32": graph_def}
    candidates.update({p: r.graph_def for p, r in results.items()})
    runners = {}
    try:
        for name, gd in candidates.items():
            try:
                runners[name] = _runner(gd, feeds, fetches)
            except Exception as exc:  # noqa: BLE001 - a candidate that cannot run loses
                if name == "float32":
                    raise AmpRewriteError(f"the original graph does not run with these feeds: "
                                          f"{str(exc).splitlines()[0][:200]}") from None
                log.warning("autotune: candidate %s cannot run here: %s", name,
                            str(exc).splitlines()[0][:200])
        samples: dict[str, list[float]] = {n: [] for n in runners}
        for _ in range(repeats):  # round-robin, so drift on a shared machine hits all alike
            for name, (sess, out, feed) in runners.items():
                times = []
                for _ in range(steps):
                    t = time.perf_counter()
                    sess.run(out, feed)
                    times.append(time.perf_counter() - t)
                samples[name].append(statistics.median(times))
    finally:
        for sess, _, _ in runners.values():
            sess.close()
    step_ms = {n: statistics.median(s) * 1e3 for n, s in samples.items()}
    # Ties go to the earlier candidate: float32 first, then the planners in the order given.
    choice = min(step_ms, key=lambda n: (step_ms[n], list(step_ms).index(n)))
    log.info("autotune: %s", ", ".join(f"{n} {ms:.2f} ms" for n, ms in step_ms.items()) + f" -> {choice}")
    if choice == "float32":
        return AutotuneResult("float32", graph_def, None, step_ms)
    return AutotuneResult(choice, results[choice].graph_def, results[choice], step_ms)
