"""The ``amp-rewrite`` command: a thin layer over :mod:`amp_rewrite.api`.

Subcommands: ``demo`` (rewrite a small in-process Keras model and explain it), ``rewrite``
(GraphDef file to GraphDef file), ``lists`` (print the effective op lists).  Environment
variables are read here and in :mod:`amp_rewrite.api` only.  Known errors print one line and
exit with status 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from typing import Sequence

from .errors import AmpRewriteError

__all__ = ["build_parser", "main"]

log = logging.getLogger(__name__)

_CATEGORIES = ("allow", "infer", "deny", "clear")


def _add_list_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="auto", help="auto, cpu, or gpu:X.Y[,X.Y...] (default: auto)")
    p.add_argument("--precision", default="float16", choices=("float16", "bfloat16"))
    p.add_argument("--lists", default="default", help="default, tensorflow, or a list FILE (.toml)")
    p.add_argument("--lists-file", help="a list file layered on top of --lists")
    p.add_argument("--level", help="DEFAULT, TENSOR_CORES_ONLY, TREAT_INFER_AS_DENY, UNSAFE_FORCE_ALL")
    for cat in _CATEGORIES:
        p.add_argument(f"--{cat}", action="append", default=[], metavar="OP[,OP]",
                       help=f"add ops to the {cat} list")
        p.add_argument(f"--remove-{cat}", action="append", default=[], metavar="OP[,OP]",
                       help=f"remove ops from the {cat} list")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="amp-rewrite",
        description="Rewrite TensorFlow graphs to mixed precision (float16/bfloat16).",
    )
    # -v/-q work before or after the subcommand; SUPPRESS keeps a subcommand's default from
    # undoing a flag given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="per-node decisions (DEBUG log)")
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="only errors")
    parser.add_argument("-v", "--verbose", action="store_true", help="per-node decisions (DEBUG log)")
    parser.add_argument("-q", "--quiet", action="store_true", help="only errors")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", parents=[common],
                          help="rewrite a small Keras model built in-process and explain it")
    demo.add_argument("--target", default="gpu:8.0")
    demo.add_argument("--precision", default="float16", choices=("float16", "bfloat16"))

    rw = sub.add_parser("rewrite", parents=[common], help="rewrite a GraphDef file (.pb binary or .pbtxt text)")
    rw.add_argument("input")
    rw.add_argument("output")
    _add_list_options(rw)
    rw.add_argument("--fetch", action="append", default=None, metavar="NODE",
                    help="node to preserve exactly (repeatable; default: the graph's outputs)")
    rw.add_argument("--exclude", metavar="REGEX", help="keep nodes whose name matches in float32")
    rw.add_argument("--report", metavar="FILE.json", help="write the decision report as JSON")
    rw.add_argument("--overwrite", action="store_true", help="replace an existing OUTPUT")

    ls = sub.add_parser("lists", parents=[common], help="print the effective op lists after all overrides")
    _add_list_options(ls)
    return parser


def _ops(values: list[str]) -> list[str]:
    return [op.strip() for v in values for op in v.split(",") if op.strip()]


def _overrides(args: argparse.Namespace) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    add = {c: _ops(getattr(args, c)) for c in _CATEGORIES if getattr(args, c)}
    remove = {c: _ops(getattr(args, f"remove_{c}")) for c in _CATEGORIES if getattr(args, f"remove_{c}")}
    return add, remove


def _write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary sibling, so no half file is left."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".amp-rewrite-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _cmd_rewrite(args: argparse.Namespace) -> int:
    from google.protobuf import text_format

    from .api import rewrite_graph_def
    from .graph_io import load_graph_def

    if os.path.abspath(args.input) == os.path.abspath(args.output):
        raise AmpRewriteError("OUTPUT is the same file as INPUT; the input is never overwritten")
    if os.path.exists(args.output) and not args.overwrite:
        raise AmpRewriteError(f"{args.output} exists; pass --overwrite to replace it")
    graph_def = load_graph_def(args.input)
    add, remove = _overrides(args)
    result = rewrite_graph_def(
        graph_def, target=args.target, precision=args.precision, lists=args.lists,
        lists_file=args.lists_file, fetches=args.fetch, add=add, remove=remove, level=args.level,
        exclude=args.exclude,
    )
    if args.output.endswith((".pbtxt", ".txt")):
        data = text_format.MessageToString(result.graph_def).encode("utf-8")
    else:
        data = result.graph_def.SerializeToString(deterministic=True)
    if args.report:
        _write_atomic(args.report, json.dumps(result.report, indent=1).encode("utf-8"))
    _write_atomic(args.output, data)
    r = result.report
    if not args.quiet:
        print(
            f"converted {r['converted_nodes']} of {r['total_nodes']} nodes, {r['casts_to_low']} "
            f"cast(s) to {args.precision}, {r['casts_to_high']} to float32"
            + (f" (skipped: {r['skipped']})" if r["skipped"] else "")
        )
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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.ERROR if args.quiet else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        if args.command == "demo":
            from .demo import run_demo

            return run_demo(sys.stdout, target=args.target, precision=args.precision)
        if args.command == "rewrite":
            return _cmd_rewrite(args)
        return _cmd_lists(args)
    except AmpRewriteError as exc:
        print(f"amp-rewrite: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("amp-rewrite: interrupted; nothing was written", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
