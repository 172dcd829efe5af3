"""The ``amp-rewrite`` command line: its parser, one function per subcommand.

:func:`build_parser` is all :mod:`amp_rewrite.cli` needs from here; the option types
(:func:`_precision`, :func:`_tf_version`) report a bad value as argparse reports one.
Importing this module imports no TensorFlow.
"""

from __future__ import annotations

import argparse

from .errors import AmpRewriteError

_CATEGORIES = ("allow", "infer", "deny", "clear")
#: ``rewrite --fail-if-unchanged``: the exit status when nothing was converted.
EXIT_UNCHANGED = 3


def _precision(text: str) -> str:
    """``--precision``: any spelling :func:`amp_rewrite.plan.targets.parse_precision` accepts."""
    from .plan.targets import parse_precision

    try:
        return parse_precision(text)
    except AmpRewriteError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _tf_version(text: str) -> str:
    """``--tf-version``: a TensorFlow release, ``major.minor`` (``2.16``) or a full version."""
    from .plan.lists import tf_major_minor

    try:
        return tf_major_minor(text)
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
    p.add_argument("--tf-version", type=_tf_version, metavar="X.Y",
                   help="use TensorFlow X.Y's op lists (2.16 to 2.21) instead of the installed "
                        "TensorFlow's, e.g. to plan for another machine")
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
    p.add_argument("--exclude", metavar="REGEX", action="append", default=None,
                   help="keep the nodes REGEX matches float32 (repeatable: the union of all).  It "
                        "must match a node's whole name, or one '/'-separated part of it such as a "
                        "Keras layer name (re.fullmatch): 'conv2d_1' matches 'model/conv2d_1/Conv2D' "
                        "but not 'model/conv2d_10/Conv2D'.  Preview with: amp-rewrite nodes INPUT REGEX")
    p.add_argument("--fetch", action="append", default=None, metavar="NODE",
                   help="main-graph node to preserve exactly (repeatable)")
    p.add_argument("--tags", "--tag_set", metavar="TAG[,TAG]",
                   help="rewrite only the meta graph with exactly these tags (default: all)")
    p.add_argument("--signature", "--signature_def", action="append", default=None, metavar="KEY",
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
    _add_demo_parser(sub, common)
    _add_rewrite_parser(sub, common)
    _add_explain_parser(sub, common)
    _add_nodes_parser(sub, common)
    _add_lists_parser(sub, common)
    _add_run_parser(sub)
    return parser


def _add_demo_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                     common: argparse.ArgumentParser) -> None:
    """``amp-rewrite demo``."""
    demo = sub.add_parser("demo", parents=[common],
                          help="save a small Keras model, rewrite it for this machine, compare both")
    demo.add_argument("--target", default="auto", help="auto (default), cpu, or gpu:X.Y")
    demo.add_argument("--precision", default="auto", choices=("auto", "float16", "bfloat16"),
                      help="auto (default): the best type the target has fast math for")
    demo.add_argument("--save", metavar="DIR", help="keep the float32 and rewritten SavedModels in DIR")
    demo.add_argument("--overwrite", action="store_true",
                      help="with --save: replace DIR/float32 and DIR/rewritten if they exist")


def _add_rewrite_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                        common: argparse.ArgumentParser) -> None:
    """``amp-rewrite rewrite INPUT OUTPUT``, its autotuning options included."""
    rw = sub.add_parser(
        "rewrite", parents=[common],
        help="rewrite a SavedModel directory, a .meta MetaGraphDef or a .pb/.pbtxt GraphDef",
        description="Rewrite INPUT to mixed precision and write OUTPUT in the same form.",
    )
    # Both optional for argparse: INPUT may come as --dir (saved_model_cli's name), and
    # OUTPUT is not needed with --dry-run; _check_positionals says what is missing.
    rw.add_argument("input", metavar="INPUT", nargs="?")
    rw.add_argument("output", metavar="OUTPUT", nargs="?")
    rw.add_argument("--dir", dest="dir", metavar="INPUT", help="INPUT, as saved_model_cli names it")
    _add_model_options(rw)
    rw.add_argument("--dry-run", action="store_true",
                    help="decide and print the summary and the per-signature table; write nothing "
                         "(OUTPUT may be left out; --report, --graph, --dump-dir and --tensorboard "
                         "cannot go with it)")
    rw.add_argument("--fail-if-unchanged", action="store_true",
                    help=f"exit with status {EXIT_UNCHANGED} when nothing was converted, after printing "
                         "why (OUTPUT, an unchanged copy, is still written unless --dry-run)")
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
    _add_autotune_options(rw)


def _add_autotune_options(rw: argparse.ArgumentParser) -> None:
    """``rewrite``'s ``--autotune*`` options, in a group of their own."""
    tune = rw.add_argument_group(
        "autotuning", "time each candidate rewrite and the float32 model on this machine (random "
                      "inputs, or --autotune-inputs) and write the fastest; float32 wins when no rewrite "
                      "is faster by the margin in enough rounds (see docs/autotune.md)")
    tune.add_argument("--autotune", action="store_true", help="measure instead of trusting one plan")
    tune.add_argument("--autotune-candidates", metavar="NAME[,NAME]", default="tensorflow,greedy,optimal",
                      help="candidates to time besides float32: tensorflow (TensorFlow's lists), greedy, "
                           "optimal, min-casts (default: %(default)s)")
    tune.add_argument("--autotune-batch", type=int, default=1, metavar="N",
                      help="batch size for inputs whose first dimension is unknown (default: 1)")
    tune.add_argument("--autotune-shape", action="append", default=[], metavar="INPUT=D0,D1,...",
                      help="the shape of one input (repeatable)")
    tune.add_argument("--autotune-inputs", metavar="FILE.npz",
                      help="time and check the output error on these arrays instead of random ones: an .npz "
                           "(numpy.savez) keyed by input name (the signature's input keys, or a GraphDef's "
                           "placeholder names); never unpickled")
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


def _add_explain_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                        common: argparse.ArgumentParser) -> None:
    """``amp-rewrite explain INPUT NODE``."""
    ex = sub.add_parser("explain", parents=[common],
                        help="say why NODE got its colour and dtype",
                        description="Rewrite INPUT in memory (nothing is written) and explain NODE.")
    ex.add_argument("input", metavar="INPUT", nargs="?")
    ex.add_argument("node", metavar="NODE", nargs="?",
                    help="a node name, an op type (Conv2D), a Keras layer name (a '/'-separated part "
                         "of node names) or a substring of node names, tried in that order")
    ex.add_argument("--dir", dest="dir", metavar="INPUT", help="INPUT, as saved_model_cli names it")
    ex.add_argument("--op", metavar="OPTYPE", help="explain the nodes of this op type (with NODE: only those)")
    ex.add_argument("--limit", type=int, default=10, metavar="N",
                    help="explain at most N of the nodes matched, computations first (default: 10; 0: all)")
    ex.add_argument("--function", metavar="NAME", help="look for NODE only in this library function")
    _add_model_options(ex)


def _add_nodes_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                      common: argparse.ArgumentParser) -> None:
    """``amp-rewrite nodes INPUT REGEX...``."""
    nd = sub.add_parser("nodes", parents=[common],
                        help="preview which nodes --exclude REGEX patterns match, with op types",
                        description="List the nodes of INPUT (main graph and functions) that each "
                                    "REGEX matches, as --exclude would: the whole node name or one "
                                    "'/'-separated part of it, with re.fullmatch.  Nothing is rewritten.")
    nd.add_argument("input", metavar="INPUT", nargs="?")
    nd.add_argument("patterns", metavar="REGEX", nargs="*")
    nd.add_argument("--dir", dest="dir", metavar="INPUT", help="INPUT, as saved_model_cli names it")


def _add_lists_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                      common: argparse.ArgumentParser) -> None:
    """``amp-rewrite lists``."""
    ls = sub.add_parser("lists", parents=[common], help="print the effective op lists after all overrides")
    _add_list_options(ls)


def _add_run_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``amp-rewrite run SCRIPT.py ARGS...`` (no ``-v``/``-q``: the script owns its output)."""
    # amp_rewrite.training.launcher: an unmodified training script, trained rewritten.
    run = sub.add_parser(
        "run", help="run a training script with the rewrite on (Keras compile, TF1 sessions)",
        description="Run SCRIPT.py as __main__ with sys.argv = [SCRIPT.py, ARGS...], its Keras "
                    "optimizers and TF1 sessions/optimizers patched to train rewritten with loss "
                    "scaling; one summary line per rewritten function. "
                    "TF_ENABLE_AUTO_MIXED_PRECISION=0 runs it unchanged.")
    run.add_argument("--target", default="auto", help="auto (default: this machine), cpu, or gpu:X.Y")
    run.add_argument("--precision", default="auto",
                     help="auto (default), float16 or bfloat16 (any usual spelling)")
    run.add_argument("script", metavar="SCRIPT.py")
    run.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's arguments")


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("amp_rewrite")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"
