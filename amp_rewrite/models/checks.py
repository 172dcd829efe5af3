"""Checking a rewrite's options and paths before any work: a bad option is reported as such,
and no output may replace an input, a special file, or (without ``--overwrite``) an existing
file.  Reads the file system only; writes nothing."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from ..api import resolve_lists, resolve_target
from ..errors import AmpRewriteError
from ..plan.targets import Target
from .formats import ModelFile, check_not_keras
from .staging import (check_distinct_outputs, check_not_input, check_output, check_replaceable, check_writable,
                      is_within)

if TYPE_CHECKING:
    from .tuning import Autotuner


def check_options(
    src: str | os.PathLike[str],
    *,
    target: str | Target = "auto",
    precision: str = "auto",
    lists: str | os.PathLike[str] = "default",
    lists_file: str | os.PathLike[str] | None = None,
    add: Mapping[str, Iterable[str] | str] | None = None,
    remove: Mapping[str, Iterable[str] | str] | None = None,
    level: str | None = None,
    exclude: str | Sequence[str] | None = None,
    planner: str | None = None,
    use_env: bool = True,
) -> None:
    """Check the rewrite options and the kind of ``src`` without reading the model or
    looking at any output path: an unknown target, precision, list profile, level, list edit
    or planner, a bad ``exclude`` pattern, and a Keras model file, raise
    :class:`AmpRewriteError` (or a subclass).  :func:`rewrite_saved_model` and the CLI call
    it first, so a bad option is reported as such even when OUTPUT exists already.

    List *files* (``lists`` naming a file, ``lists_file``) are not read here: one may also be
    named as an output, and refusing that ("an input is never modified") comes first; they
    are read, and checked, by the rewrite itself."""
    from ..plan.exclude import NameMatcher
    from ..plan.lists import PLANNERS
    from ..plan.targets import resolve_precision

    check_not_keras(src)
    tgt = resolve_target(target)
    chosen, _ = resolve_precision(precision, tgt)
    if lists_file is None and not os.path.isfile(os.fspath(lists)):
        resolve_lists(lists, target=tgt, precision=chosen, add=add, remove=remove,
                      level=level, environ=os.environ if use_env else {})
    NameMatcher.compile(exclude)
    if planner is not None and planner not in PLANNERS:
        raise AmpRewriteError(f"planner must be one of {', '.join(PLANNERS)}, not {planner!r}")


#: How the files :func:`dump_files` writes begin: a --dump-dir holding such files would have
#: them replaced by the next run.
_DUMP_PREFIXES = ("graphdef_preop_", "graphdef_AutoMixedPrecision_", "paintbuckets_AutoMixedPrecision_")


def check_paths(src: str, dst: str, *, overwrite: bool, lists: str | os.PathLike[str],
                lists_file: str | os.PathLike[str] | None, report_file: str | os.PathLike[str] | None,
                graph_file: str | os.PathLike[str] | None, dump_dir: str | os.PathLike[str] | None,
                tensorboard_dir: str | os.PathLike[str] | None) -> list[tuple[str, str]]:
    """Check every output path of :func:`~amp_rewrite.models.saved_model.rewrite_saved_model`
    against its rules (see there) and the inputs it reads; return those inputs as ``(path,
    what)``, to protect while staging.  Raises :class:`AmpRewriteError` (or a subclass) for
    the first path refused, in the order the checks always ran.  Writes nothing.

    ``dst`` equal to or inside ``src``, or an existing non-empty ``dst`` without
    ``overwrite``, is refused.  So are an existing ``report_file`` or ``graph_file`` without
    ``overwrite``, a ``dump_dir`` holding dumps without it, any output that is a device,
    FIFO or socket (even with it), and any output that would replace an input (``src``,
    ``lists_file``, ``lists`` when it is a file).  A file of ``dump_dir`` or
    ``tensorboard_dir`` that exists is replaced only with ``overwrite`` (checked when it is
    staged).
    """
    check_output(src, dst, overwrite=overwrite)
    check_writable(dst)
    for extra, what in ((report_file, "--report"), (graph_file, "--graph"), (dump_dir, "--dump-dir"),
                        (tensorboard_dir, "--tensorboard")):
        if extra is not None and is_within(os.fspath(extra), src) and os.path.isdir(src):
            raise AmpRewriteError(f"{what} {os.fspath(extra)} is inside INPUT; the input is never modified")
        if extra is not None and os.path.realpath(os.fspath(extra)) == os.path.realpath(src):
            raise AmpRewriteError(f"{what} is the same as INPUT; the input is never modified")
        if extra is not None:
            check_writable(os.fspath(extra))
    # Extra files follow OUTPUT's rule.  --dump-dir and --tensorboard are directories written
    # into, not replaced: their files are checked one by one when staged (an existing one
    # needs overwrite), and a dump directory holding an earlier run's dumps, whose names
    # every run repeats, is refused here already.
    for extra, what in ((report_file, "--report"), (graph_file, "--graph")):
        if extra is not None:
            check_replaceable(os.fspath(extra), overwrite=overwrite, what=what)
    if dump_dir is not None and not overwrite and os.path.isdir(dump_dir):
        dumps = sorted(n for n in os.listdir(dump_dir) if n.startswith(_DUMP_PREFIXES))
        if dumps:
            raise AmpRewriteError(f"--dump-dir {os.fspath(dump_dir)} holds dumps already ({dumps[0]}...); "
                                  "pass --overwrite to replace them")
    outputs = [(os.path.abspath(os.fspath(path)), what, is_dir) for path, what, is_dir in (
        (dst, "OUTPUT", os.path.isdir(src)), (report_file, "--report", False), (graph_file, "--graph", False),
        (dump_dir, "--dump-dir", True), (tensorboard_dir, "--tensorboard", True)) if path is not None]
    # Every file read is protected, even with overwrite: INPUT, and the list files.
    inputs = [(src, "INPUT")]
    if lists_file is not None:
        inputs.append((os.fspath(lists_file), "--lists-file"))
    if os.path.isfile(os.fspath(lists)):
        inputs.append((os.fspath(lists), "--lists"))
    # Only OUTPUT is replaced as a whole; the extra directories are written into.
    check_not_input([(p, w, d and w == "OUTPUT") for p, w, d in outputs], inputs)
    check_distinct_outputs(outputs)
    if graph_file is not None:
        from ..report.draw import graph_format

        graph_format(graph_file)  # an unknown extension fails before the work
    return inputs


def check_autotune(autotune: Autotuner | None, *, graph_file: object, tensorboard_dir: object,
                   dump_dir: object) -> None:
    """Refuse the outputs and options that cannot go with ``autotune``, and its own bad
    settings (``autotune.check()``).  Raises :class:`AmpRewriteError` (or a subclass)."""
    if autotune is not None:
        if graph_file is not None or tensorboard_dir is not None or dump_dir is not None:
            raise AmpRewriteError("--autotune writes the fastest model and its report; --graph, "
                                  "--tensorboard and --dump-dir describe a single rewrite and cannot go with it")
        autotune.check()


def check_xla_input(model: ModelFile) -> None:
    """Refuse ``--xla`` for a model that is not a SavedModel: only a TF2 SavedModel has
    functions to mark.  Raises :class:`AmpRewriteError`."""
    if model.format != "saved_model":
        raise AmpRewriteError(f"--xla marks a TF2 SavedModel's functions for XLA; INPUT is a "
                              f"{model.format.replace('_', ' ')}, which has none")
