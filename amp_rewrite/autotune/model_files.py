"""Autotuning model files: :func:`autotune_model` times a SavedModel's signature or a frozen
GraphDef's placeholders, on random inputs or the caller's, with :class:`AutotuneOptions`.

This module builds on :mod:`amp_rewrite.models` (it rewrites and stages each candidate with
its functions); that package never imports autotune.  ``rewrite_saved_model(...,
autotune=AutotuneOptions(...))`` reaches :func:`autotune_model` through
:meth:`AutotuneOptions.tune_model`, the one method it calls besides ``check``.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .inputs import InputArrays, _fit_inputs, _input_arrays
from .measure import (DEFAULT_CANDIDATES, DEFAULT_SESSIONS, _check_rounds, _graph_runner, _same_as, _tune,
                               _unchanged, StepFn, candidate_options)
from .stats import FLOAT32, result_line, wins_needed
from ..errors import AmpRewriteError
from ..progress import Progress


@dataclass(frozen=True)
class AutotuneOptions:
    """How :func:`autotune_model` measures.

    ``candidates`` as for :func:`candidate_options`; ``repeats`` rounds of ``steps`` steps
    per candidate (medians), and more up to ``max_repeats`` (default
    :func:`default_max_repeats`) while a rewrite looks faster but is not proven; ``batch`` replaces each input's unknown first dimension, and
    ``shapes`` gives whole shapes by input name; ``signature`` picks the SavedModel
    signature to time (default ``serving_default``, else the first); ``max_rel_error``
    rules out candidates whose outputs differ more from float32's (max abs difference over
    max abs value, per output); a rewrite is chosen only when it beats float32 by
    ``min_gain`` (a fraction of float32's step time); ``seed`` makes the random inputs reproducible;
    the rounds are spread over ``sessions`` fresh sessions (or loads) of every graph, since a
    graph's speed also depends on the session it runs in (:func:`_tune`).

    ``inputs`` replaces the random inputs with the caller's data, for the timing and for the
    output error check alike: an ``.npz`` path (read by :func:`load_inputs`, never
    unpickled), a mapping of arrays, or :class:`InputArrays`, keyed by input name (a
    SavedModel signature's input keys, a GraphDef's placeholder names); every input that
    has no default needs one, of the model's dtype and a shape it takes.  ``batch`` and
    ``shapes`` shape random inputs and cannot go with it.  ``progress`` (a
    :class:`~amp_rewrite.progress.Progress`) is told of each candidate's rewrite and each
    round (:meth:`~amp_rewrite.progress.Progress.event`); it is no part of the measurement.
    """

    candidates: Sequence[str] | Mapping[str, Mapping[str, Any]] = DEFAULT_CANDIDATES
    repeats: int = 5
    steps: int = 3
    max_repeats: int | None = None
    batch: int = 1
    shapes: Mapping[str, Sequence[int]] = field(default_factory=dict)
    signature: str | None = None
    max_rel_error: float | None = None
    min_gain: float = 0.02
    seed: int = 0
    sessions: int = DEFAULT_SESSIONS
    inputs: str | os.PathLike[str] | Mapping[str, Any] | InputArrays | None = None
    progress: Progress | None = field(default=None, compare=False, repr=False)

    def check(self) -> None:
        """Raises :class:`AmpRewriteError` for settings that cannot be measured, and
        :class:`AutotuneInputError` for ``inputs`` that cannot be read (a path is read here,
        and again when the model is timed)."""
        _check_rounds(self.repeats, self.steps, self.sessions, self.max_repeats)
        if self.inputs is not None:
            if self.batch != 1 or self.shapes:
                raise AmpRewriteError("autotune's batch and shapes shape random inputs; they cannot go "
                                      "with the caller's inputs")
            _input_arrays(self.inputs)
        if self.batch < 1:
            raise AmpRewriteError("autotune needs a batch size >= 1")
        if not 0 <= self.min_gain < 1:
            raise AmpRewriteError("autotune's min_gain must be in [0, 1)")
        if self.max_rel_error is not None and not self.max_rel_error >= 0:
            raise AmpRewriteError("autotune's max relative error must be >= 0")
        for name, dims in self.shapes.items():
            if any(int(d) < 0 for d in dims):
                raise AmpRewriteError(f"autotune shape for {name!r} has a negative dimension")
        candidate_options(self.candidates)

    def tune_model(self, model: Any, *, tags: Sequence[str] | None = None, xla: bool = False,
                   **rewrite_options: Any) -> ModelAutotune:
        """:func:`autotune_model` of ``model`` with these options: how
        ``rewrite_saved_model(..., autotune=self)`` runs it, without importing autotune
        (:class:`amp_rewrite.models.tuning.Autotuner`)."""
        return autotune_model(model, self, tags=tags, xla=xla, **rewrite_options)


@dataclass(frozen=True)
class ModelAutotune:
    """The winner of :func:`autotune_model`.  ``rewrite`` is the winning candidate's
    :class:`~amp_rewrite.models.saved_model.ModelRewrite`, ``None`` when float32 won; ``rule`` why
    (:func:`decision_rule`); ``input_source`` where the inputs came from (random, or the
    caller's file or arrays).  The other fields are :class:`AutotuneResult`'s."""

    choice: str
    rewrite: Any
    step_ms: Mapping[str, float]
    rel_error: Mapping[str, float]
    inputs: Mapping[str, tuple[int, ...]]
    signature: str | None
    candidates: Mapping[str, Mapping[str, Any]]
    same_as: Mapping[str, str] = field(default_factory=dict)
    ratio_to_float32: Mapping[str, float] = field(default_factory=dict)
    wins: Mapping[str, int] = field(default_factory=dict)
    rounds: int = 0
    sessions: int = 1
    rule: str = ""
    p_value: Mapping[str, float] = field(default_factory=dict)
    min_gain: float = 0.02
    max_rel_error: float | None = None
    input_source: str = "random"
    #: Every graph (float32's too) was marked for XLA and timed compiled.
    xla: bool = False

    def line(self) -> str:
        """:func:`result_line` for this result: what the CLI prints."""
        return result_line(step_ms=self.step_ms, ratio=self.ratio_to_float32, wins=self.wins,
                           rel_error=self.rel_error, same_as=self.same_as, rounds=self.rounds,
                           sessions=self.sessions, min_gain=self.min_gain, rule=self.rule)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, for the report: the measurements, the rule (``decision``: the clause
        of :func:`decision_rule`; ``wins_needed``: the rounds the sign test asks for, or
        ``None``) and the whole line (``summary``, :meth:`line`)."""
        return {
            "choice": self.choice,
            "summary": self.line(),
            "decision": self.rule,
            "step_ms": {k: round(v, 4) for k, v in self.step_ms.items()},
            "ratio_to_float32": {k: round(v, 4) for k, v in self.ratio_to_float32.items()},
            "faster_rounds": dict(self.wins),
            "sign_test_p": {k: float(f"{v:.4g}") for k, v in self.p_value.items()},
            "wins_needed": wins_needed(self.rounds),
            "min_gain": self.min_gain,
            "max_rel_error": self.max_rel_error,
            "rounds": self.rounds,
            "sessions": self.sessions,
            "input_source": self.input_source,
            "xla": self.xla,
            "rel_error": dict(self.rel_error),
            "same_graph_as": dict(self.same_as),
            "signature": self.signature,
            "inputs": {k: list(v) for k, v in self.inputs.items()},
            "candidates": {k: {o: str(v) for o, v in opts.items()} for k, opts in self.candidates.items()},
        }


def _input_value(name: str, dtype: Any, dims: Sequence[int | None], opts: AutotuneOptions,
                 rng: np.random.Generator) -> np.ndarray:
    """A random input: unknown first dimension -> ``opts.batch``; ``opts.shapes[name]``
    overrides the whole shape.  Floats are standard normal, integers and booleans zero (a
    valid index and a valid mask)."""
    if name in opts.shapes:
        shape = tuple(int(d) for d in opts.shapes[name])
    else:
        if dims is None:
            raise AmpRewriteError(f"input {name!r} has unknown rank; give its shape "
                                  f"(--autotune-shape {name}=D0,D1,...)")
        shape_l = []
        for i, d in enumerate(dims):
            if d is None or d < 0:
                if i != 0:
                    raise AmpRewriteError(f"input {name!r} has an unknown dimension {i}; give its shape "
                                          f"(--autotune-shape {name}=D0,D1,...)")
                d = opts.batch
            shape_l.append(int(d))
        shape = tuple(shape_l)
    np_dtype = np.dtype(dtype)
    if np_dtype.kind == "f":
        return rng.standard_normal(shape).astype(np_dtype)
    if np_dtype.kind in "iub":
        return np.zeros(shape, np_dtype)
    raise AmpRewriteError(f"autotune cannot make random inputs of dtype {np_dtype} for {name!r}; "
                          "use amp_rewrite.autotune with your own feeds")


def _graph_def_inputs(graph_def: Any, opts: AutotuneOptions, given: InputArrays | None) -> dict[str, np.ndarray]:
    """Feeds (``"name:0"`` -> array) for a frozen GraphDef's placeholders: the caller's
    ``given`` arrays, checked against the placeholders' dtypes and shapes
    (:func:`_fit_inputs`; a PlaceholderWithDefault may be left out), else random values
    (:func:`_input_value`).  Raises :class:`AmpRewriteError`; reads ``graph_def`` only."""
    import tensorflow as tf

    rng = np.random.default_rng(opts.seed)
    specs: dict[str, tuple[Any, list[int] | None]] = {}
    required = []
    for node in graph_def.node:
        if node.op not in ("Placeholder", "PlaceholderWithDefault"):
            continue
        dtype = tf.dtypes.as_dtype(node.attr["dtype"].type).as_numpy_dtype
        shape = node.attr["shape"].shape
        dims = None if shape.unknown_rank or "shape" not in node.attr else [d.size for d in shape.dim]
        specs[node.name] = (dtype, dims)
        if node.op == "Placeholder":
            required.append(node.name)
    if given is not None:
        return {name + ":0": value for name, value in
                _fit_inputs(given, specs, required, "graph's placeholders").items()}
    feeds = {}
    for name, (dtype, dims) in specs.items():
        if name not in required and name not in opts.shapes:
            continue  # a PlaceholderWithDefault has a value already
        feeds[name + ":0"] = _input_value(name, dtype, dims, opts, rng)
    return feeds


def _graph_def_fetches(graph_def: Any, outputs: Sequence[str]) -> list[str]:
    """The output tensors of the graph-output nodes (nodes with no outputs are skipped)."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    return [t.name for name in outputs for t in graph.get_operation_by_name(name).outputs]


def _saved_model_runner(path: str, tags: Sequence[str] | None, signature: str,
                        inputs: Mapping[str, np.ndarray]) -> tuple[StepFn, Callable[[], None]]:
    import tensorflow as tf

    loaded = tf.saved_model.load(path, tags=list(tags) if tags else None)
    fn = loaded.signatures[signature]
    args = {k: tf.constant(v) for k, v in inputs.items()}

    def step() -> list[Any]:
        out = fn(**args)
        return [out[k].numpy() for k in sorted(out)]

    return step, lambda: None


def _signature_inputs(path: str, tags: Sequence[str] | None, want: str | None, opts: AutotuneOptions,
                      given: InputArrays | None) -> tuple[str, dict[str, np.ndarray]]:
    """The signature to time (``want``, else ``serving_default``, else the first) and its
    inputs by key: the caller's ``given`` arrays, checked against the signature's specs
    (:func:`_fit_inputs`), else random values.  Raises :class:`AmpRewriteError`; loads the
    SavedModel, writes nothing."""
    import tensorflow as tf

    loaded = tf.saved_model.load(path, tags=list(tags) if tags else None)
    keys = sorted(loaded.signatures.keys())
    if not keys:
        raise AmpRewriteError("the SavedModel has no signatures to time; autotune needs one")
    key = want or ("serving_default" if "serving_default" in keys else keys[0])
    if key not in keys:
        raise AmpRewriteError(f"no signature {key!r} to time (the model has: {', '.join(keys)})")
    specs = loaded.signatures[key].structured_input_signature[1]
    shapes = {name: (spec.dtype.as_numpy_dtype, None if spec.shape.rank is None else list(spec.shape.as_list()))
              for name, spec in specs.items()}
    if given is not None:
        return key, _fit_inputs(given, shapes, sorted(shapes), f"signature {key!r}")
    rng = np.random.default_rng(opts.seed)
    return key, {name: _input_value(name, dtype, dims, opts, rng) for name, (dtype, dims) in sorted(shapes.items())}


def autotune_model(model: Any, opts: AutotuneOptions, *, tags: Sequence[str] | None = None, xla: bool = False,
                   **rewrite_options: Any) -> ModelAutotune:
    """Rewrite ``model`` (a :class:`~amp_rewrite.models.saved_model.ModelFile`) once per candidate
    with :func:`~amp_rewrite.models.saved_model.rewrite_model`, time each and float32 on random
    inputs or the caller's (``opts.inputs``), and return the fastest.

    A SavedModel is timed through one signature (``opts.signature``), each candidate
    written to a temporary directory and loaded with ``tf.saved_model.load``; a frozen
    GraphDef through its placeholders and output nodes.  A MetaGraphDef cannot be run
    without its checkpoint and is refused.  The inputs are made (or the caller's checked
    against the model) before any rewrite.  ``opts.progress`` hears of each rewrite and
    round.  Raises :class:`AmpRewriteError` (:class:`AutotuneInputError` for inputs that do
    not fit); ``model`` is not modified and nothing is left on disk.

    ``xla`` (a SavedModel only): what is served will run compiled, so every candidate is
    marked for XLA (:func:`~amp_rewrite.models.saved_model.mark_for_xla`) and so is the
    float32 model it is timed against (a marked copy), each compiled in its warm-up step.
    The rewrite options should then plan for XLA (``compiled=True``, as ``--xla`` does).
    """
    from ..models.rewriting import _unchanged as unchanged_model
    from ..models.saved_model import _graph_outputs, mark_for_xla, rewrite_model, stage_model
    from ..models.staging import Staging

    opts.check()
    if xla and model.format != "saved_model":
        raise AmpRewriteError("autotune under XLA times a TF2 SavedModel's served functions compiled; "
                              f"the model is a {model.format.replace('_', ' ')}, which has none")
    options = candidate_options(opts.candidates)
    if model.format == "meta_graph":
        raise AmpRewriteError("autotune runs SavedModels and frozen GraphDefs; a MetaGraphDef (.meta) "
                              "needs its checkpoint to run")
    given = None if opts.inputs is None else _input_arrays(opts.inputs)
    source = given.source if given is not None else f"random (seed {opts.seed})"
    if model.format == "graph_def":
        feeds = _graph_def_inputs(model.message, opts, given)
        fetches = _graph_def_fetches(model.message, sorted(_graph_outputs(model.message)))
        if not fetches:
            raise AmpRewriteError("the graph has no outputs to time")
    else:
        key, values = _signature_inputs(model.path, tags, opts.signature, opts, given)
        marked = rewrite_options.get("signatures")
        if xla and marked and key not in marked:
            raise AmpRewriteError(f"autotune would time signature {key!r} without XLA: --signatures marks only "
                                  f"{', '.join(marked)} for XLA; time one of those (--autotune-signature)")
    rewrites = {}
    for i, (name, o) in enumerate(options.items(), 1):
        if opts.progress is not None:
            opts.progress.event(f"autotune: rewriting candidate {i}/{len(options)} ({name})")
        rewrites[name] = rewrite_model(model, tags=tags, **{**rewrite_options, **o})
    same_as = _same_as({FLOAT32: None, **{
        n: None if _unchanged(r.report) else r.message.SerializeToString(deterministic=True)
        for n, r in rewrites.items()}})
    tune: dict[str, Any] = dict(repeats=opts.repeats, steps=opts.steps, max_rel_error=opts.max_rel_error, min_gain=opts.min_gain,
                same_as=same_as, max_repeats=opts.max_repeats, sessions=opts.sessions, progress=opts.progress)
    if model.format == "graph_def":
        graphs = {FLOAT32: model.message, **{n: r.message for n, r in rewrites.items()}}
        tuned = _tune({n: (lambda gd=gd: _graph_runner(gd, feeds, fetches)) for n, gd in graphs.items()}, **tune)
        inputs = {k.rsplit(":", 1)[0]: tuple(v.shape) for k, v in feeds.items()}
        signature = None
    else:
        with tempfile.TemporaryDirectory(prefix="amp-rewrite-autotune-") as tmp:
            staged = dict(rewrites)
            paths = {FLOAT32: model.path}
            if xla:
                # float32 as it would be served: a copy of the model, marked like the rewrites.
                reference = next(iter(rewrites.values()))
                staged = {FLOAT32: unchanged_model(model, reference, "float32, marked for XLA", copy=True),
                          **rewrites}
                mark_for_xla(staged[FLOAT32], rewrite_options.get("signatures"), graphs=reference.graphs)
                for rw in rewrites.values():
                    mark_for_xla(rw, rewrite_options.get("signatures"))
            for name, rw in staged.items():
                paths[name] = os.path.join(tmp, f"candidate{len(paths) if name != FLOAT32 else 0}")
                with Staging() as staging:
                    stage_model(staging, rw, paths[name])
                    staging.commit()
            tuned = _tune({n: (lambda p=p: _saved_model_runner(p, tags, key, values)) for n, p in paths.items()},
                          **tune)
        inputs = {k: tuple(v.shape) for k, v in values.items()}
        signature = key
    return ModelAutotune(tuned.choice, rewrites.get(tuned.choice), tuned.step_ms, tuned.rel_error, inputs,
                         signature, options, same_as, tuned.ratio, tuned.wins, tuned.rounds, tuned.sessions,
                         tuned.rule, tuned.p_value, opts.min_gain, opts.max_rel_error, source, xla)
