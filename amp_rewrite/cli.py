"""The ``amp-rewrite`` command: a thin layer over the library.

Subcommands, each a call into one typed library function:

* ``rewrite INPUT OUTPUT``: :func:`amp_rewrite.models.saved_model.rewrite_saved_model` (SavedModel
  directory, ``.meta`` MetaGraphDef, or ``.pb``/``.pbtxt`` frozen GraphDef);
* ``explain INPUT NODE``: :func:`amp_rewrite.models.saved_model.rewrite_model` in memory, then
  :func:`amp_rewrite.report.explain.explain_query` (NODE: a name, op type, layer name or substring);
* ``nodes INPUT REGEX...``: :func:`amp_rewrite.plan.exclude.matching_nodes`, a preview of what
  ``--exclude REGEX`` keeps float32;
* ``lists``: :func:`amp_rewrite.api.resolve_lists`, printed;
* ``demo``: :func:`amp_rewrite.demo.run_demo`;
* ``run SCRIPT.py ARGS...``: :func:`amp_rewrite.training.launcher.main_run`, an unmodified
  training script trained rewritten (it reads ``TF_ENABLE_AUTO_MIXED_PRECISION``).

Known errors (:class:`~amp_rewrite.errors.AmpRewriteError`, and OS errors on paths) print
one line on stderr and exit with status 1; ``rewrite --fail-if-unchanged`` exits with 3
(:data:`EXIT_UNCHANGED`) when nothing was converted; Ctrl-C exits with 130 and SIGTERM with 143, after
the library has removed its temporaries.  A progress line is drawn on stderr only when it is
a terminal; elsewhere (a pipe, a CI log) ``--autotune``, which can take minutes, writes plain
progress lines instead (:meth:`~amp_rewrite.progress.Progress.event`).  ``--quiet`` silences both.
TensorFlow's own ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_*`` variables are honoured (they
are read in :mod:`amp_rewrite.api`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import tempfile
import threading
from typing import Any, Iterator, Sequence

from .cli_parser import _CATEGORIES, EXIT_UNCHANGED, build_parser
from .errors import AmpRewriteError

__all__ = ["build_parser", "main"]

log = logging.getLogger(__name__)


def _lists_version(args: argparse.Namespace) -> contextlib.AbstractContextManager[None]:
    """The ``--tf-version`` override for the whole command, or nothing.  The API (which loads
    TensorFlow's protos) is imported only when the option is given, so a missing INPUT is
    still reported before TensorFlow starts."""
    version = getattr(args, "tf_version", None)
    if version is None:
        return contextlib.nullcontext()
    from .api import tensorflow_lists_version

    return tensorflow_lists_version(version)


def terminal_safe(text: str) -> str:
    """``text`` with every non-printable character (newlines, escape sequences, NUL...)
    written as a Python escape, so names from a model file cannot move the cursor, recolour
    the terminal or split one error into several lines.  Pure."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class _TerminalSafeFormatter(logging.Formatter):
    """Log lines with :func:`terminal_safe` applied: messages carry node, op and function
    names from the input, which a hostile model can fill with escape sequences.  Tracebacks
    (``-v``) keep their line breaks."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return terminal_safe(super().formatMessage(record))


def _ops(values: list[str]) -> list[str]:
    return [op.strip() for v in values for op in v.split(",") if op.strip()]


def _overrides(args: argparse.Namespace) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    add = {c: _ops(getattr(args, c)) for c in _CATEGORIES if getattr(args, c)}
    remove = {c: _ops(getattr(args, f"remove_{c}")) for c in _CATEGORIES if getattr(args, f"remove_{c}")}
    return add, remove


def _model_options(args: argparse.Namespace) -> dict[str, Any]:
    add, remove = _overrides(args)
    return dict(
        target=args.target, precision=args.precision, lists=args.lists, lists_file=args.lists_file,
        add=add, remove=remove, level=args.level, exclude=args.exclude, fetches=args.fetch,
        tags=[t for t in args.tags.split(",")] if args.tags else None,
        signatures=args.signature, keep_io_types=args.keep_io_types, planner=args.planner,
    )


def _autotune_options(args: argparse.Namespace, progress: Any = None) -> Any:
    """``--autotune*`` as :class:`~amp_rewrite.autotune.AutotuneOptions` (``None`` without
    ``--autotune``), reporting rounds to ``progress``.  ``--autotune-inputs`` is read here,
    before anything looks at OUTPUT, so a bad file is reported as such.  Raises
    :class:`AmpRewriteError` for a malformed ``--autotune-shape``, random-input flags with
    ``--autotune-inputs``, or a file that cannot be read."""
    tuning_flags = (args.autotune_shape or args.autotune_signature or args.autotune_max_error is not None
                    or args.autotune_batch != 1 or args.autotune_repeats != 5 or args.autotune_min_gain != 0.02
                    or args.autotune_max_repeats is not None or args.autotune_sessions is not None
                    or args.autotune_inputs is not None)
    if not args.autotune:
        if tuning_flags:
            raise AmpRewriteError("the --autotune-* options need --autotune")
        return None
    from .autotune import DEFAULT_SESSIONS, AutotuneOptions, load_inputs

    inputs = None
    if args.autotune_inputs is not None:
        if args.autotune_shape or args.autotune_batch != 1:
            raise AmpRewriteError("--autotune-batch and --autotune-shape shape random inputs; they cannot go "
                                  "with --autotune-inputs, whose arrays have their shapes")
        inputs = load_inputs(args.autotune_inputs)

    shapes = {}
    for item in args.autotune_shape:
        name, sep, dims = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name.strip()] = tuple(int(d) for d in dims.split(",") if d.strip())
        except ValueError:
            raise AmpRewriteError(f"bad --autotune-shape {item!r}; expected INPUT=D0,D1,...") from None
    return AutotuneOptions(
        candidates=tuple(_ops([args.autotune_candidates])), repeats=args.autotune_repeats,
        max_repeats=args.autotune_max_repeats, batch=args.autotune_batch, shapes=shapes, signature=args.autotune_signature,
        max_rel_error=args.autotune_max_error, min_gain=args.autotune_min_gain,
        sessions=DEFAULT_SESSIONS if args.autotune_sessions is None else args.autotune_sessions,
        inputs=inputs, progress=progress,
    )


def _hint(report: dict[str, Any], target: str) -> str:
    """A suggestion when nothing was rewritten only because of the chosen precision."""
    if not report.get("skipped"):
        return ""
    from .api import resolve_target

    try:
        tgt = resolve_target(target)
    except AmpRewriteError:
        return ""
    other = "bfloat16" if report["precision"] == "float16" else "float16"
    if tgt.skip_reason(report["precision"]) and not tgt.skip_reason(other):  # type: ignore[arg-type]
        return f" (this target has fast {other} math: try --precision {other})"
    return ""


def _cmd_rewrite_training(args: argparse.Namespace) -> int:
    """``rewrite --loss-scale``: a TF1 training MetaGraphDef, optimizer included."""
    import json

    from .models.saved_model import load_model
    from .models.staging import Staging, check_distinct_outputs, check_not_input, check_output, check_writable
    from .training import rewrite_training_meta_graph

    if not args.input.endswith(".meta"):
        raise AmpRewriteError("--loss-scale needs a TF1 training MetaGraphDef (a .meta file) as INPUT")
    _check_model_options(args)  # before any output path is looked at
    check_output(args.input, args.output, overwrite=args.overwrite)
    check_writable(args.output)
    outputs = [(os.path.abspath(args.output), "OUTPUT", False)]
    if args.report:
        check_output(args.input, args.report, overwrite=args.overwrite, what="--report")
        check_writable(args.report)
        outputs.append((os.path.abspath(args.report), "--report", False))
        check_distinct_outputs(outputs)
    # The list files are read too, and never replaced, even with --overwrite.
    inputs = [(args.input, "INPUT")] + [(path, what) for path, what in (
        (args.lists_file, "--lists-file"), (args.lists, "--lists")) if path and os.path.isfile(path)]
    check_not_input(outputs, inputs)
    model = load_model(args.input)
    options = _model_options(args)
    for key in ("tags", "signatures", "keep_io_types"):
        options.pop(key, None)
    result = rewrite_training_meta_graph(model.message, args.loss_scale, train_op=args.train_op, **options)
    with Staging(protect=[path for path, _ in inputs]) as staging:
        staging.add_file(args.output, result.meta_graph_def.SerializeToString(deterministic=True),
                         replace=args.overwrite)
        if args.report:
            staging.add_file(args.report, json.dumps(result.report, indent=1).encode("utf-8"),
                             replace=args.overwrite)
        staging.commit()
    if not args.quiet:
        r = result.report
        print(f"converted {r['converted_nodes']} of {r['total_nodes']} nodes, {r['casts_to_low']} cast(s) "
              f"to {r['precision']}, {r['casts_to_high']} to float32; loss scaling "
              f"{args.loss_scale} added to train op")
        print(terminal_safe(f"wrote {args.output}" + (f", report {args.report}" if args.report else "")))
    return 0


def _check_model_options(args: argparse.Namespace) -> None:
    """:func:`amp_rewrite.models.saved_model.check_options` for the parsed options."""
    from .models.saved_model import check_options

    options = _model_options(args)
    check_options(args.input, **{k: options[k] for k in (
        "target", "precision", "lists", "lists_file", "add", "remove", "level", "exclude", "planner")})


def _check_dry_run(args: argparse.Namespace, autotune: Any) -> None:
    """``--dry-run`` writes nothing: refuse the options that only say what to write, and
    those that need a run of their own."""
    for flag, value in (("--report", args.report), ("--graph", args.graph), ("--dump-dir", args.dump_dir),
                        ("--tensorboard", args.tensorboard)):
        if value is not None:
            raise AmpRewriteError(f"--dry-run writes nothing; {flag} cannot go with it")
    if autotune is not None:
        raise AmpRewriteError("--dry-run cannot go with --autotune, which times the models it would write")


def _nothing_converted(report: dict[str, Any]) -> str | None:
    """Why ``report`` converted nothing (its ``skipped``), or ``None`` if it converted nodes."""
    if report.get("skipped"):
        return str(report["skipped"])
    return None if report.get("converted_nodes") else "no node was converted"


def _dry_run(args: argparse.Namespace, progress: Any) -> dict[str, Any]:
    """``rewrite --dry-run``: the rewrite in memory, its report; nothing is written."""
    from .models.checks import check_xla_input
    from .models.saved_model import load_model, rewrite_model

    model = load_model(args.input)
    if args.xla:
        check_xla_input(model)
    return rewrite_model(model, progress=progress, compiled=args.xla, **_model_options(args)).report


def _cmd_rewrite(args: argparse.Namespace, progress: Any) -> int:
    from .models.saved_model import rewrite_saved_model, summary_line, summary_table

    autotune = _autotune_options(args, progress)
    if args.dry_run:
        _check_dry_run(args, autotune)
    if args.loss_scale is not None:
        if args.dry_run or args.fail_if_unchanged:
            raise AmpRewriteError("--dry-run and --fail-if-unchanged cannot go with --loss-scale")
        if autotune is not None:
            raise AmpRewriteError("--autotune times models for inference; it cannot go with --loss-scale")
        if args.xla:
            raise AmpRewriteError("--xla marks a TF2 SavedModel's functions; a TF1 training graph "
                                  "(--loss-scale) has none")
        progress.close()
        return _cmd_rewrite_training(args)

    if args.dry_run:
        report = _dry_run(args, progress)
    else:
        report = rewrite_saved_model(
            args.input, args.output, overwrite=args.overwrite, report_file=args.report,
            dump_dir=args.dump_dir, graph_file=args.graph, tensorboard_dir=args.tensorboard,
            progress=progress, autotune=autotune, xla=args.xla, **_model_options(args),
        )
    progress.close()  # an --exclude pattern that matched no node: the rewrite warned (plan.exclude)
    if not args.quiet:
        # The autotune section gets a line of its own (its summary says why the choice won),
        # not summary_line's short form of it.
        tuned = report.get("autotune")
        brief = {k: v for k, v in report.items() if k != "autotune"}
        print(terminal_safe(f"{summary_line(brief)}{_hint(report, args.target)}"))
        if tuned:
            print(terminal_safe(tuned["summary"]))
        for line in summary_table(report):
            print(terminal_safe(line))
        if args.dry_run:
            print("dry run: nothing written")
        else:
            extras = (("report", args.report), ("graph", args.graph), ("dumps in", args.dump_dir),
                      ("TensorBoard logs in", args.tensorboard))
            print(terminal_safe(f"wrote {args.output}" + "".join(f", {what} {path}" for what, path in extras if path)))
    unchanged = _nothing_converted(report)
    if args.fail_if_unchanged and unchanged is not None:
        print(terminal_safe(f"amp-rewrite: nothing converted: {unchanged}"), file=sys.stderr)
        return EXIT_UNCHANGED
    return 0


def _cmd_explain(args: argparse.Namespace, progress: Any) -> int:
    from .report.explain import explain_query, explain_text
    from .models.saved_model import load_model, rewrite_model

    if args.limit < 0:
        raise AmpRewriteError(f"--limit must be 0 (all) or more, not {args.limit}")
    model = load_model(args.input)
    rewrite = rewrite_model(model, progress=progress, **_model_options(args))
    progress.close()
    blocks = []
    misses = []
    query = args.node if args.node is not None else f"--op {args.op}"
    for g in rewrite.graphs:
        try:
            explanations, how, count = explain_query(g.result, args.node, op=args.op, lists=rewrite.lists,
                                                     function=args.function, limit=args.limit or None)
        except AmpRewriteError as exc:
            misses.append(exc)
            continue
        text = explain_text(explanations)
        if how != "name" or count > len(explanations):
            # Say what the query matched, so a layer name or op type is not taken for a node.
            note = f"# {query!r} matches {count} node(s) by {how}"
            if count > len(explanations):
                note += f"; the first {len(explanations)}, computations first (--limit 0 shows all)"
            text = f"{note}\n{text}"
        blocks.append(text if len(rewrite.graphs) == 1 else f"[{g.label}]\n{text}")
    if not blocks:
        raise misses[0]
    r = rewrite.report
    print(f"# {r['target']}, {r['precision']}, lists {r['lists']}, level {r['level']}")
    # Names come from the model file: escape them, line by line.
    print("\n".join(terminal_safe(line) for line in "\n\n".join(blocks).split("\n")))
    return 0


def _cmd_nodes(args: argparse.Namespace) -> int:
    """``nodes INPUT REGEX...``: what each pattern would exclude, graph by graph."""
    from .plan.exclude import NameMatcher, matching_nodes
    from .models.saved_model import load_model

    if not args.patterns:
        raise AmpRewriteError("nodes needs at least one REGEX to match node names with")
    matchers = [(p, NameMatcher.compile([p])) for p in args.patterns]  # all checked before loading
    model = load_model(args.input)
    if model.format == "graph_def":
        graphs = [("graph", model.message)]
    else:
        graphs = [("graph" if model.format == "meta_graph" else
                   f"meta graph {i} [{','.join(mg.meta_info_def.tags)}]", mg.graph_def)
                  for i, mg in enumerate(model.meta_graphs)]
    for pattern, matcher in matchers:
        for label, graph_def in graphs:
            hits = matching_nodes(graph_def, matcher)
            where = f" in {label}" if len(graphs) > 1 else ""
            print(terminal_safe(f"# {pattern!r} matches {len(hits)} node(s){where}"))
            for function, node, op, _, how in hits:
                part = "whole name" if how == "name" else f"part {how!r}"
                print(terminal_safe(f"  {function or '(main graph)'}  {node}  {op}  [{part}]"))
    return 0


def _cmd_lists(args: argparse.Namespace) -> int:
    from .api import resolve_lists, resolve_target

    add, remove = _overrides(args)
    target = resolve_target(args.target)
    lists, level = resolve_lists(
        args.lists, target=target, precision=args.precision, lists_file=args.lists_file,
        add=add, remove=remove, level=args.level, environ=os.environ,
    )
    print(f"# lists {lists.profile!r} for {target.description}, {args.precision}, level {level}")
    print(f"# planner {lists.planner}; a normalization's apply ops: {lists.normalization_apply}"
          + (f" ({lists.normalization_reason})" if lists.normalization_reason else " (TensorFlow's deny propagation)"))
    for cat, ops in lists.as_dict().items():
        print(f"\n[{cat}]  ({len(ops)} ops)")
        for op in ops:
            print(f"{op:40s} {lists.reasons.get(op, '')}")
    if lists.bounded:
        print(f"\n[bounded]  ({len(lists.bounded)} deny-list ops inferred where their input is proven at most the limit)")
        for op, (limit, why) in lists.bounded.items():
            print(f"{op:40s} input <= {limit:g}: {why}")
    if lists.identity:
        print(f"\n[identity]  ({len(lists.identity)} deny-list reductions cleared where static shapes show they "
              "reduce no element)")
        for op, why in lists.identity.items():
            print(f"{op:40s} {why}")
    return 0


def _start_tensorflow_quietly() -> None:
    """Import TensorFlow and initialise its devices without its start-up noise.

    TensorFlow's runtime writes its start-up notices (absl's "before InitializeLog" banner,
    oneDNN and CUDA messages) straight to file descriptor 2, and ``TF_CPP_MIN_LOG_LEVEL``
    does not silence all of them, so an error would not be "one line".  File descriptor 2 is
    pointed at a temporary file for the import and the device scan only; if they fail, the
    captured text is shown after all.  Later output, including any crash, goes to the real
    stderr.  Does nothing if TensorFlow is already imported or stderr is not file
    descriptor 2 (tests capture it).
    """
    if "tensorflow" in sys.modules:
        return
    try:
        if sys.stderr.fileno() != 2:
            return
    except (AttributeError, ValueError, OSError):
        return
    sys.stderr.flush()
    saved_fd = os.dup(2)
    started = interrupted = False
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            with _sigint_deferred():
                import tensorflow as tf

                tf.config.list_physical_devices("GPU")
            started = True
        except KeyboardInterrupt:
            interrupted = True  # the caller says so in one line; the banner is noise then
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            if not started and not interrupted:
                capture.seek(0)
                sys.stderr.write(capture.read().decode("utf-8", "replace"))


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """While the block runs, Ctrl-C is noted instead of raised, and raised as
    ``KeyboardInterrupt`` when the block ends (a second Ctrl-C changes nothing).

    Why: a Ctrl-C sent while TensorFlow's library was loading was once lost: the command went
    on, wrote its output and exited 0 (seen in a full test run, under load). TensorFlow's
    Python code has bare ``except:`` clauses, which swallow a ``KeyboardInterrupt`` raised
    inside them. Deferring costs the user the rest of the import (a few seconds) and never
    loses the keystroke. Signal handlers can only be set in the main thread; elsewhere the
    block runs as is.
    """
    pressed: list[int] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pressed:
        raise KeyboardInterrupt


class _Terminated(BaseException):
    """SIGTERM, raised where the program is (see :func:`_sigterm_raises`).  A
    ``BaseException``, like ``KeyboardInterrupt``, so that no ``except Exception`` swallows
    it and every ``with Staging()`` on the way out deletes its temporaries."""


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """While the block runs, SIGTERM raises :class:`_Terminated` instead of killing the
    process at once (which would leave a staged output of hundreds of MB behind under a
    hidden ``.amp-rewrite-*`` name).  Restores the previous handler afterwards.  Only in the
    CLI, and only in the main thread (the one signals are delivered to)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, frame: Any) -> None:
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _check_positionals(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Take INPUT from ``--dir`` (saved_model_cli's name for it), where the positionals then
    shift by one, and report a missing INPUT, OUTPUT (unless ``--dry-run``) or NODE (unless
    ``--op``) as argparse reports a missing argument (status 2)."""
    if not hasattr(args, "dir"):
        return
    cmd = args.command
    if args.dir is not None:
        if cmd == "rewrite":
            if args.output is not None:
                parser.error("rewrite: INPUT given twice, as --dir and as an argument")
            args.output, args.input = args.input, args.dir
        elif cmd == "explain":
            if args.node is not None:
                parser.error("explain: INPUT given twice, as --dir and as an argument")
            args.node, args.input = args.input, args.dir
        else:
            args.patterns = ([args.input] if args.input is not None else []) + list(args.patterns)
            args.input = args.dir
    if args.input is None:
        parser.error(f"{cmd}: the following arguments are required: INPUT (or --dir)")
    if cmd == "rewrite" and args.output is None and not args.dry_run:
        parser.error("rewrite: the following arguments are required: OUTPUT (or --dry-run)")
    if cmd == "explain" and args.node is None and args.op is None:
        parser.error("explain: the following arguments are required: NODE (or --op)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "run":
        # The script owns the process from here: its logging, environment and exit status.
        from .training.launcher import main_run

        return main_run(args)
    _check_positionals(parser, args)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_TerminalSafeFormatter("%(levelname)s %(name)s: %(message)s"))
    # -v is about this package's decisions, not every library's debug chatter.
    root, ours = logging.getLogger(), logging.getLogger("amp_rewrite")
    old_levels = root.level, ours.level
    root.setLevel(logging.ERROR if args.quiet else logging.WARNING)
    ours.setLevel(logging.DEBUG if args.verbose else logging.ERROR if args.quiet else logging.WARNING)
    root.addHandler(handler)
    try:
        # A missing INPUT is reported at once, without waiting for TensorFlow to start.
        if not args.verbose and os.path.exists(getattr(args, "input", ".")):
            try:
                _start_tensorflow_quietly()
            except KeyboardInterrupt:
                # Ctrl-C while TensorFlow loads: one line, not the import machinery's stack.
                print("amp-rewrite: interrupted; nothing was written", file=sys.stderr)
                return 130
        # --tf-version (validated by argparse) holds for every rewrite of the command.  The
        # files a command reads may come from anyone: TensorFlow's shape functions run on
        # them in a helper process, whose crash costs shapes, not this process
        # (graph/shape_process.py).  The demo builds its own models.
        from . import isolated_shape_inference

        isolated = contextlib.nullcontext() if args.command == "demo" else isolated_shape_inference()
        with _sigterm_raises(), _lists_version(args), isolated:
            return _run(args)
    finally:
        root.removeHandler(handler)
        root.setLevel(old_levels[0])
        ours.setLevel(old_levels[1])


def _run(args: argparse.Namespace) -> int:
    from .progress import Progress

    progress = Progress(sys.stderr, enabled=None if not args.quiet else False)
    try:
        if args.command == "demo":
            from .demo import run_demo

            return run_demo(sys.stdout, target=args.target, precision=args.precision, save=args.save,
                            overwrite=args.overwrite)
        if args.command == "rewrite":
            return _cmd_rewrite(args, progress)
        if args.command == "explain":
            return _cmd_explain(args, progress)
        if args.command == "nodes":
            return _cmd_nodes(args)
        return _cmd_lists(args)
    except AmpRewriteError as exc:
        progress.close()
        print(f"amp-rewrite: error: {terminal_safe(str(exc))}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (``amp-rewrite lists | head``): not an error worth a message.
        # Point stdout at /dev/null so the interpreter's final flush does not complain.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 1
    except OSError as exc:
        progress.close()
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"amp-rewrite: error: {terminal_safe(f'{where}{exc.strerror or exc}')}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        progress.close()
        print("amp-rewrite: interrupted; nothing was written", file=sys.stderr)
        return 130
    except _Terminated:
        progress.close()
        print("amp-rewrite: terminated; nothing was written", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        progress.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
