"""The ``amp-rewrite`` command: a thin layer over the library.

Subcommands, each a call into one typed library function:

* ``rewrite INPUT OUTPUT``: :func:`amp_rewrite.saved_model.rewrite_saved_model` (SavedModel
  directory, ``.meta`` MetaGraphDef, or ``.pb``/``.pbtxt`` frozen GraphDef);
* ``explain INPUT NODE``: :func:`amp_rewrite.saved_model.rewrite_model` in memory, then
  :func:`amp_rewrite.explain.explain_node`;
* ``lists``: :func:`amp_rewrite.api.resolve_lists`, printed;
* ``demo``: :func:`amp_rewrite.demo.run_demo`.

Known errors (:class:`~amp_rewrite.errors.AmpRewriteError`, and OS errors on paths) print
one line on stderr and exit with status 1; Ctrl-C exits with 130 and SIGTERM with 143, after
the library has removed its temporaries.  A progress line is drawn on stderr only when it is
a terminal.
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

from .errors import AmpRewriteError

__all__ = ["build_parser", "main"]

log = logging.getLogger(__name__)

_CATEGORIES = ("allow", "infer", "deny", "clear")


def _precision(text: str) -> str:
    """``--precision``: any spelling :func:`amp_rewrite.targets.parse_precision` accepts."""
    from .targets import parse_precision

    try:
        return parse_precision(text)
    except AmpRewriteError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_list_options(p: argparse.ArgumentParser, *, precision_default: str = "auto") -> None:
    p.add_argument("--target", default="auto",
                   help="auto (this machine), cpu, or gpu:X.Y[,X.Y...] (default: auto)")
    p.add_argument("--precision", default=precision_default, type=_precision,
                   metavar="auto|float16|bfloat16",
                   help="low-precision type; auto picks float16 on a GPU and bfloat16 on a CPU "
                        "with fast bfloat16 math; fp16, half and bf16 are accepted too "
                        f"(default: {precision_default})")
    p.add_argument("--lists", default="default", help="default, optimal, tensorflow, or a list FILE (.toml)")
    p.add_argument("--lists-file", help="a list file layered on top of --lists")
    p.add_argument("--planner", choices=("greedy", "optimal", "min-casts"),
                   help="greedy (TensorFlow's passes), optimal (cost-aware min cut, "
                        "normalization-aware) or min-casts (every allow op converts, Cast bytes "
                        "minimized); default: the --lists profile's")
    p.add_argument("--level", help="DEFAULT, TENSOR_CORES_ONLY, TREAT_INFER_AS_DENY, UNSAFE_FORCE_ALL")
    for cat in _CATEGORIES:
        p.add_argument(f"--{cat}", action="append", default=[], metavar="OP[,OP]",
                       help=f"add ops to the {cat} list")
        p.add_argument(f"--remove-{cat}", action="append", default=[], metavar="OP[,OP]",
                       help=f"remove ops from the {cat} list")


def _add_model_options(p: argparse.ArgumentParser) -> None:
    _add_list_options(p)
    p.add_argument("--exclude", metavar="REGEX", help="keep nodes whose name matches in float32")
    p.add_argument("--fetch", action="append", default=None, metavar="NODE",
                   help="main-graph node to preserve exactly (repeatable)")
    p.add_argument("--tags", metavar="TAG[,TAG]",
                   help="rewrite only the meta graph with exactly these tags (default: all)")
    p.add_argument("--signature", action="append", default=None, metavar="KEY",
                   help="rewrite only what this signature runs (repeatable; default: everything)")
    p.add_argument("--keep-io-types", action=argparse.BooleanOptionalAction, default=True,
                   help="keep the dtypes of every signature input and output (default: on)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="amp-rewrite",
        description="Rewrite TensorFlow models to mixed precision (float16/bfloat16), offline.",
    )
    # -v/-q work before or after the subcommand; SUPPRESS keeps a subcommand's default from
    # undoing a flag given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="per-node decisions (DEBUG log)")
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="only errors")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("-v", "--verbose", action="store_true", help="per-node decisions (DEBUG log)")
    parser.add_argument("-q", "--quiet", action="store_true", help="only errors")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", parents=[common],
                          help="save a small Keras model, rewrite it for this machine, compare both")
    demo.add_argument("--target", default="auto", help="auto (default), cpu, or gpu:X.Y")
    demo.add_argument("--precision", default="auto", choices=("auto", "float16", "bfloat16"),
                      help="auto (default): the best type the target has fast math for")
    demo.add_argument("--save", metavar="DIR", help="keep the float32 and rewritten SavedModels in DIR")
    demo.add_argument("--overwrite", action="store_true",
                      help="with --save: replace DIR/float32 and DIR/rewritten if they exist")

    rw = sub.add_parser(
        "rewrite", parents=[common],
        help="rewrite a SavedModel directory, a .meta MetaGraphDef or a .pb/.pbtxt GraphDef",
        description="Rewrite INPUT to mixed precision and write OUTPUT in the same form.",
    )
    rw.add_argument("input", metavar="INPUT")
    rw.add_argument("output", metavar="OUTPUT")
    _add_model_options(rw)
    rw.add_argument("--report", metavar="FILE.json", help="write the decision report as JSON")
    rw.add_argument("--dump-dir", metavar="DIR",
                    help="write the graph before and after as text protos (like TensorFlow's LOG_PATH)")
    rw.add_argument("--graph", metavar="FILE", help="draw the rewritten graph: FILE.svg, FILE.html or FILE.dot")
    rw.add_argument("--tensorboard", metavar="LOGDIR", help="write before/after graphs for TensorBoard")
    rw.add_argument("--overwrite", action="store_true", help="replace an existing OUTPUT")
    rw.add_argument("--xla", action="store_true",
                    help="mark a TF2 SavedModel's signature functions for XLA compilation "
                         "(_XlaMustCompile, as tf.function(jit_compile=True)) and plan the rewrite for XLA")
    rw.add_argument("--loss-scale", metavar="dynamic|N",
                    help="INPUT is a TF1 training MetaGraphDef (.meta): also rewrite its optimizer "
                         "with dynamic (or fixed N) loss scaling")
    rw.add_argument("--train-op", metavar="NAME",
                    help="with --loss-scale: the train op, when the train_op collection has several")
    tune = rw.add_argument_group(
        "autotuning", "time each candidate rewrite and the float32 model on this machine (random "
                      "inputs) and write the fastest; float32 wins when no rewrite is faster")
    tune.add_argument("--autotune", action="store_true", help="measure instead of trusting one plan")
    tune.add_argument("--autotune-candidates", metavar="NAME[,NAME]", default="tensorflow,greedy,optimal",
                      help="candidates to time besides float32: tensorflow (TensorFlow's lists), greedy, "
                           "optimal, min-casts (default: %(default)s)")
    tune.add_argument("--autotune-batch", type=int, default=1, metavar="N",
                      help="batch size for inputs whose first dimension is unknown (default: 1)")
    tune.add_argument("--autotune-shape", action="append", default=[], metavar="INPUT=D0,D1,...",
                      help="the shape of one input (repeatable)")
    tune.add_argument("--autotune-signature", metavar="KEY",
                      help="the SavedModel signature to time (default: serving_default, else the first)")
    tune.add_argument("--autotune-repeats", type=int, default=5, metavar="N",
                      help="rounds of timing per candidate, interleaved (default: 5)")
    tune.add_argument("--autotune-max-repeats", type=int, metavar="N",
                      help="most rounds, timed while a rewrite looks faster but not yet beyond chance "
                           "(default: 3x --autotune-repeats, at least 10)")
    tune.add_argument("--autotune-sessions", type=int, metavar="N",
                      help="fresh loads of every model the rounds are spread over: a model's speed also "
                           "depends on the session it runs in (default: 3)")
    tune.add_argument("--autotune-min-gain", type=float, default=0.02, metavar="F",
                      help="keep float32 unless a rewrite is faster by at least this fraction (default: 0.02)")
    tune.add_argument("--autotune-max-error", type=float, metavar="E",
                      help="rule out candidates whose outputs differ from float32's by more than E "
                           "(max abs difference over max abs value)")

    ex = sub.add_parser("explain", parents=[common],
                        help="say why NODE got its colour and dtype",
                        description="Rewrite INPUT in memory (nothing is written) and explain NODE.")
    ex.add_argument("input", metavar="INPUT")
    ex.add_argument("node", metavar="NODE")
    ex.add_argument("--function", metavar="NAME", help="look for NODE only in this library function")
    _add_model_options(ex)

    ls = sub.add_parser("lists", parents=[common], help="print the effective op lists after all overrides")
    _add_list_options(ls)
    return parser


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("amp_rewrite")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


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


def _autotune_options(args: argparse.Namespace) -> Any:
    """``--autotune*`` as :class:`~amp_rewrite.autotune.AutotuneOptions` (``None`` without
    ``--autotune``).  Raises :class:`AmpRewriteError` for a malformed ``--autotune-shape``."""
    tuning_flags = (args.autotune_shape or args.autotune_signature or args.autotune_max_error is not None
                    or args.autotune_batch != 1 or args.autotune_repeats != 5 or args.autotune_min_gain != 0.02
                    or args.autotune_max_repeats is not None or args.autotune_sessions is not None)
    if not args.autotune:
        if tuning_flags:
            raise AmpRewriteError("the --autotune-* options need --autotune")
        return None
    from .autotune import DEFAULT_SESSIONS, AutotuneOptions

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

    from .saved_model import load_model
    from .staging import Staging, check_distinct_outputs, check_not_input, check_output, check_writable
    from .training import rewrite_training_meta_graph

    if not args.input.endswith(".meta"):
        raise AmpRewriteError("--loss-scale needs a TF1 training MetaGraphDef (a .meta file) as INPUT")
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


def _cmd_rewrite(args: argparse.Namespace, progress: Any) -> int:
    from .saved_model import rewrite_saved_model, summary_line

    autotune = _autotune_options(args)
    if args.loss_scale is not None:
        if autotune is not None:
            raise AmpRewriteError("--autotune times models for inference; it cannot go with --loss-scale")
        if args.xla:
            raise AmpRewriteError("--xla marks a TF2 SavedModel's functions; a TF1 training graph "
                                  "(--loss-scale) has none")
        progress.close()
        return _cmd_rewrite_training(args)

    report = rewrite_saved_model(
        args.input, args.output, overwrite=args.overwrite, report_file=args.report,
        dump_dir=args.dump_dir, graph_file=args.graph, tensorboard_dir=args.tensorboard,
        progress=progress, autotune=autotune, xla=args.xla, **_model_options(args),
    )
    progress.close()
    if not args.quiet:
        print(terminal_safe(f"{summary_line(report)}{_hint(report, args.target)}"))
        extras = (("report", args.report), ("graph", args.graph), ("dumps in", args.dump_dir),
                  ("TensorBoard logs in", args.tensorboard))
        print(terminal_safe(f"wrote {args.output}" + "".join(f", {what} {path}" for what, path in extras if path)))
    return 0


def _cmd_explain(args: argparse.Namespace, progress: Any) -> int:
    from .explain import explain_node, explain_text
    from .saved_model import load_model, rewrite_model

    model = load_model(args.input)
    rewrite = rewrite_model(model, progress=progress, **_model_options(args))
    progress.close()
    blocks = []
    misses = []
    for g in rewrite.graphs:
        try:
            explanations = explain_node(g.result, args.node, lists=rewrite.lists, function=args.function)
        except AmpRewriteError as exc:
            misses.append(exc)
            continue
        text = explain_text(explanations)
        blocks.append(text if len(rewrite.graphs) == 1 else f"[{g.label}]\n{text}")
    if not blocks:
        raise misses[0]
    r = rewrite.report
    print(f"# {r['target']}, {r['precision']}, lists {r['lists']}, level {r['level']}")
    # Names come from the model file: escape them, line by line.
    print("\n".join(terminal_safe(line) for line in "\n\n".join(blocks).split("\n")))
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
    for cat, ops in lists.as_dict().items():
        print(f"\n[{cat}]  ({len(ops)} ops)")
        for op in ops:
            print(f"{op:40s} {lists.reasons.get(op, '')}")
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
    started = False
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            import tensorflow as tf

            tf.config.list_physical_devices("GPU")
            started = True
        finally:
            sys.stderr.flush()
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            if not started:
                capture.seek(0)
                sys.stderr.write(capture.read().decode("utf-8", "replace"))


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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
        with _sigterm_raises():
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
