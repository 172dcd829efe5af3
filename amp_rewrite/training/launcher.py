"""``amp-rewrite run SCRIPT.py ARGS...``: an unmodified training script, trained rewritten.

The zero-code switch, in place of TensorFlow's ``TF_ENABLE_AUTO_MIXED_PRECISION=1``.  Before
the script runs (as ``__main__``, through :mod:`runpy`, with ``sys.argv`` set to the script and
its arguments), :func:`install` patches, for this process only:

* ``keras.Model.compile``: the optimizer (object, name or config) is wrapped with
  :func:`amp_rewrite.enable_mixed_precision_graph_rewrite`, so ``fit``/``evaluate``/``predict``
  run rewritten with dynamic loss scaling.  A model already compiled with a loss-scaled
  optimizer, or under a mixed Keras dtype policy, is left as it is (with one WARNING).
* ``tf.compat.v1.Session``: :class:`amp_rewrite.Session` (same constructor), so every TF1
  graph runs rewritten; ``tf.compat.v1.train.MonitoredTrainingSession``: amp_rewrite's
  (:mod:`.monitored`).
* ``tf.compat.v1.train.Optimizer.compute_gradients`` / ``apply_gradients`` (and so
  ``minimize``): delegated to a loss-scaled wrapper of the optimizer
  (:class:`~amp_rewrite.training.optimizer.LossScaleOptimizerV1`, one per optimizer), so the
  loss is scaled, the gradients unscaled, and a non-finite step skipped.

Every rewritten function prints one summary line on stderr (``amp-rewrite run: ...``): what
was converted, or why nothing was.  ``--target``/``--precision`` choose the rewrite (default
``auto``: this machine).

Environment: ``TF_ENABLE_AUTO_MIXED_PRECISION`` or ``TF_ENABLE_AUTO_MIXED_PRECISION_GRAPH_REWRITE``
set to ``0`` runs the script unpatched; ``1`` (or unset) patches.  Both are removed from the
script's environment when patching, because TensorFlow's own Grappler pass reads them too and
would rewrite the rewritten graphs again.  They are read here, at the command boundary, only.

Not patched: ``tf.compat.v1.InteractiveSession``, ``tf.compat.v1.train.MonitoredSession`` with
TensorFlow's own session creators (use
:class:`~amp_rewrite.training.monitored.MixedPrecisionSessionCreator`), ``tf.function`` training
loops (use :func:`amp_rewrite.function`) and Estimators.  A script that ran to its end without
training through anything patched (a custom ``tf.function`` loop) gets one warning line
saying it ran in float32, and how to rewrite it.
"""

from __future__ import annotations

import os
import runpy
import sys
import threading
import weakref
from typing import Any, Callable, Mapping, MutableMapping, Sequence, TextIO

from ..errors import AmpRewriteError
from ._common import add_rewrite_listener, set_tf1_sessions_rewritten, warn_once

__all__ = ["ENV_SWITCHES", "switch_from_env", "install", "check_run", "run_script", "main_run"]

#: The environment variables of TensorFlow's zero-code switch, honoured by ``run``.
ENV_SWITCHES = ("TF_ENABLE_AUTO_MIXED_PRECISION", "TF_ENABLE_AUTO_MIXED_PRECISION_GRAPH_REWRITE")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def switch_from_env(environ: Mapping[str, str]) -> bool | None:
    """``True``/``False`` from :data:`ENV_SWITCHES` in ``environ``, ``None`` if neither is set.

    Raises
    ------
    AmpRewriteError
        For a value that is neither on (1/true/yes/on) nor off (0/false/no/off), or the two
        variables set to opposite values.
    """
    found: dict[str, bool] = {}
    for name in ENV_SWITCHES:
        value = environ.get(name)
        if value is None or value.strip() == "":
            continue
        text = value.strip().lower()
        if text not in _TRUE | _FALSE:
            raise AmpRewriteError(f"{name}={value!r}: expected 1 (on) or 0 (off)")
        found[name] = text in _TRUE
    if len(set(found.values())) > 1:
        raise AmpRewriteError(f"{' and '.join(f'{k}={int(v)}' for k, v in found.items())} "
                              "disagree; set one of them")
    return next(iter(found.values()), None)


def install(rewrite_options: Mapping[str, Any], out: TextIO | None = None) -> Callable[[], None]:
    """Patch Keras and TF1 training (see the module docstring) to train rewritten.

    ``rewrite_options`` go to every rewrite (``target``, ``precision``...); ``out`` receives one
    summary line per rewritten function (default ``sys.stderr`` at the time of the line).
    Mutates process-wide state: Keras's ``Model``, TensorFlow's ``tf.compat.v1`` namespace and
    v1 ``Optimizer`` class.  Returns a function that undoes every patch.
    """
    import tensorflow as tf

    from ._common import check_rewrite_options
    from .monitored import MonitoredTrainingSession
    from .optimizer import enable_mixed_precision_graph_rewrite, graph_rewrite_options, LossScaleOptimizerV1
    from .session import Session

    options = check_rewrite_options(rewrite_options)
    undo: list[Callable[[], None]] = []

    def patch(owner: Any, name: str, value: Any) -> None:
        # A class may inherit the attribute (keras.Model.compile is Trainer's): undoing then
        # deletes the override instead of copying the inherited one onto the class.
        inherited = isinstance(owner, type) and name not in owner.__dict__
        old = getattr(owner, name)
        setattr(owner, name, value)
        undo.append((lambda: delattr(owner, name)) if inherited else (lambda: setattr(owner, name, old)))

    def own_options(graph: Any) -> dict[str, Any] | None:
        # A graph whose optimizer the script wrapped itself keeps that optimizer's options.
        return None if graph_rewrite_options(graph) is not None else dict(options)

    class LauncherSession(Session):
        """``tf.compat.v1.Session`` under ``amp-rewrite run``: amp_rewrite.Session with the
        launcher's options (unless the graph's optimizer has its own)."""

        def __init__(self, target: str = "", graph: Any = None, config: Any = None) -> None:
            super().__init__(target, graph, config)

        def _ensure_started(self) -> None:
            if self._session is None and not self._closed:
                self._explicit_options = own_options(self._graph) or {}
            super()._ensure_started()

    def monitored_training_session(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("rewrite_options", own_options(tf.compat.v1.get_default_graph()))
        return MonitoredTrainingSession(*args, **kwargs)

    for v1 in _v1_namespaces():
        patch(v1, "Session", LauncherSession)
        patch(v1.train, "MonitoredTrainingSession", monitored_training_session)
    _patch_v1_optimizer(patch, tf.compat.v1.train.Optimizer, LossScaleOptimizerV1,
                        lambda opt: enable_mixed_precision_graph_rewrite(opt, **options))
    _patch_keras_compile(patch, options)

    set_tf1_sessions_rewritten(True)
    undo.append(lambda: set_tf1_sessions_rewritten(False))

    def print_summary(message: str, report: Mapping[str, Any]) -> None:
        stream = out if out is not None else sys.stderr
        print(f"amp-rewrite run: {message.removeprefix('amp_rewrite: ')}", file=stream, flush=True)

    undo.append(add_rewrite_listener(print_summary))

    def uninstall() -> None:
        while undo:
            undo.pop()()

    return uninstall


def _v1_namespaces() -> list[Any]:
    """Every module object that serves ``tf.compat.v1`` now.

    TensorFlow wraps its API modules (``TFModuleWrapper``), and ``tf.compat.v1`` and
    ``import tensorflow.compat.v1`` are two wrappers with attribute caches of their own, so
    each one is patched.
    """
    import importlib

    import tensorflow as tf

    importlib.import_module("tensorflow.compat.v1")  # a script's usual spelling; loaded now
    found: dict[int, Any] = {id(tf.compat.v1): tf.compat.v1}
    for name, module in list(sys.modules.items()):
        if name.startswith("tensorflow") and name.endswith("compat.v1") and hasattr(module, "Session"):
            found.setdefault(id(module), module)
    return list(found.values())


def _patch_v1_optimizer(patch: Callable[[Any, str, Any], None], base: type, wrapper_type: type,
                        wrap: Callable[[Any], Any]) -> None:
    """Route ``compute_gradients``/``apply_gradients`` of every v1 optimizer through its
    loss-scaled wrapper (``minimize`` calls both).

    A loss-scaled wrapper (ours, or one the script made itself) calls its inner optimizer's
    methods, which are these patched ones: while any wrapper method runs, a flag sends those
    calls to TensorFlow's originals, so nothing is scaled twice.  The flag is process-wide, not
    per thread, because under ``tf.distribute`` the wrapper calls the inner optimizer from the
    strategy's replica threads (as :func:`~._common.rewrite_trace` explains).  One wrapper per
    optimizer (weakly held), so its loss-scale state is shared by every step it builds.
    """
    names = ("compute_gradients", "apply_gradients")
    wrappers: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
    lock = threading.Lock()
    inside = [0]  # wrapper methods running now

    def guarded(original: Callable[..., Any]) -> Callable[..., Any]:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            with lock:
                inside[0] += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                with lock:
                    inside[0] -= 1

        method.__name__ = method.__qualname__ = original.__name__
        method.__doc__ = original.__doc__
        return method

    def routed(original: Callable[..., Any]) -> Callable[..., Any]:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(self, wrapper_type) or inside[0]:
                return original(self, *args, **kwargs)
            wrapper = wrappers.get(self)
            if wrapper is None:
                wrapper = wrappers[self] = wrap(self)
            return getattr(wrapper, original.__name__)(*args, **kwargs)

        method.__name__ = method.__qualname__ = original.__name__
        method.__doc__ = original.__doc__
        return method

    for name in names:
        patch(wrapper_type, name, guarded(getattr(wrapper_type, name)))
        patch(base, name, routed(getattr(base, name)))


def _patch_keras_compile(patch: Callable[[Any, str, Any], None], options: Mapping[str, Any]) -> None:
    """Wrap the optimizer given to ``keras.Model.compile`` (if Keras is installed)."""
    try:
        import keras
    except ImportError:  # a TF1-only environment: nothing to patch
        return
    from .keras_optimizer import LossScaleOptimizer
    from .optimizer import enable_mixed_precision_graph_rewrite

    original = keras.Model.compile

    def compile(self: Any, optimizer: Any = "rmsprop", *args: Any, **kwargs: Any) -> Any:  # noqa: A001
        if optimizer is None:  # nothing to wrap; Keras reports what it makes of it
            return original(self, optimizer, *args, **kwargs)
        opt = keras.optimizers.get(optimizer)
        policy = keras.mixed_precision.global_policy().name
        if isinstance(opt, LossScaleOptimizer):
            pass  # the script enabled the rewrite itself
        elif isinstance(opt, keras.optimizers.LossScaleOptimizer) or policy.startswith("mixed_"):
            warn_once(self, "launcher-keras-mixed", (
                f"amp_rewrite: model {self.name!r} uses Keras mixed precision (dtype policy "
                f"{policy!r}); amp-rewrite run leaves it as it is"
            ))
        else:
            opt = enable_mixed_precision_graph_rewrite(opt, **options)
        return original(self, opt, *args, **kwargs)

    compile.__doc__ = original.__doc__
    patch(keras.Model, "compile", compile)


def check_run(script: str, *, target: str, precision: str, environ: Mapping[str, str]) -> bool:
    """Check what ``run`` needs before the script starts; returns whether to patch.  Pure
    apart from reading ``script``'s metadata (and the devices, for ``target="auto"``).

    Raises
    ------
    AmpRewriteError
        A bad switch value, target or precision, or a script that is not a file.
    """
    from ..api import resolve_target
    from ..plan.targets import parse_precision

    switch = switch_from_env(environ)
    if not os.path.isfile(script):
        raise AmpRewriteError(f"{script}: no such script")
    if switch is not False:
        parse_precision(precision)
        resolve_target(target)  # a bad target fails now, not at the script's first step
    return switch is not False


def run_script(
    script: str,
    argv: Sequence[str] = (),
    *,
    target: str = "auto",
    precision: str = "auto",
    environ: MutableMapping[str, str] | None = None,
    out: TextIO | None = None,
) -> int:
    """Run ``script`` as ``__main__`` with ``sys.argv = [script, *argv]``, rewritten unless
    :data:`ENV_SWITCHES` say ``0``.

    Mutates the process for the script's run: ``sys.argv``, ``sys.path[0]`` (the script's
    directory, as ``python script.py`` has it), the patches of :func:`install`, and removes
    :data:`ENV_SWITCHES` from ``environ`` (default ``os.environ``) when patching.  Restores all
    but the environment afterwards.  Returns 0; the script's ``sys.exit`` and exceptions
    propagate as they would from ``python script.py``.

    Raises
    ------
    AmpRewriteError
        Before the script runs (:func:`check_run`).
    """
    environ = os.environ if environ is None else environ
    patching = check_run(script, target=target, precision=precision, environ=environ)
    uninstall: Callable[[], None] | None = None
    if not patching:
        print(f"amp-rewrite run: {'/'.join(n for n in ENV_SWITCHES if n in environ)}=0: "
              f"running {script} without the rewrite",
              file=out if out is not None else sys.stderr, flush=True)
    else:
        for name in ENV_SWITCHES:
            environ.pop(name, None)
        uninstall = install({"target": target, "precision": precision}, out=out)
    heard: list[str] = []
    stop_hearing = add_rewrite_listener(lambda message, report: heard.append(message)) if patching else None
    saved_argv, saved_path0 = sys.argv, sys.path[0] if sys.path else None
    sys.argv = [script, *argv]
    script_dir = os.path.dirname(os.path.abspath(script))
    if sys.path:
        sys.path[0] = script_dir
    else:
        sys.path.insert(0, script_dir)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code in (None, 0) and stop_hearing is not None and not heard:
            _say_nothing_was_rewritten(script, out)
        raise
    else:
        if stop_hearing is not None and not heard:
            _say_nothing_was_rewritten(script, out)
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path:
            sys.path[0] = saved_path0
        if stop_hearing is not None:
            stop_hearing()
        if uninstall is not None:
            uninstall()
    return 0


def _say_nothing_was_rewritten(script: str, out: TextIO | None) -> None:
    """The line for a script that ran to its end through none of the patched training APIs:
    mixed precision was asked for and did not happen (a custom ``tf.function`` loop, which
    ``run`` cannot reach)."""
    print(f"amp-rewrite run: warning: {script} ran no training step this command rewrites (Keras "
          "compile/fit/evaluate/predict, tf.compat.v1 sessions and optimizers): it ran in float32. A custom "
          "tf.function training loop is rewritten by decorating it with amp_rewrite.function and wrapping its "
          "optimizer with amp_rewrite.enable_mixed_precision_graph_rewrite (README, \"Train\").",
          file=out if out is not None else sys.stderr, flush=True)


def main_run(args: Any) -> int:
    """``amp-rewrite run``: ``args`` from :func:`amp_rewrite.cli.build_parser` (``script``,
    ``args``, ``target``, ``precision``).  Errors before the script starts print one line and
    return 1; the script's own errors are its own (a traceback, its exit status)."""
    try:
        check_run(args.script, target=args.target, precision=args.precision, environ=os.environ)
    except AmpRewriteError as exc:
        print(f"amp-rewrite: error: {exc}", file=sys.stderr)
        return 1
    return run_script(args.script, list(args.args), target=args.target, precision=args.precision)
