"""A pytest plugin that writes every fuzzed API input to disk before the API sees it.

A mutant that crashes the process (TensorFlow's C++ aborting, as one deep run did on
2026-11-28 while importing the inert copy of a mutated graph for static shapes) leaves no
Hypothesis report behind: the process is gone.  With this plugin the last input is on disk,
synced, when that happens: ``PATH.bin`` (the serialized GraphDef, or its text) and ``PATH.txt``
(the mutant's description and the options).

    PYTHONPATH=.:bench python -m pytest tests/test_fuzz.py -p fuzz_mutant_log \\
        --hypothesis-profile=deep -p no:cacheprovider

``PATH`` is ``$AMP_REWRITE_MUTANT_LOG``, else ``/tmp/amp_rewrite_last_mutant``.  The plugin
replaces ``amp_rewrite.testing.check_api_boundary`` when pytest loads it, before the test
modules import it.  Costs two small synced writes per example.
"""

from __future__ import annotations

import os
from typing import Any

import amp_rewrite.testing as testing
import amp_rewrite.testing.fuzz as fuzz

_PATH = os.environ.get("AMP_REWRITE_MUTANT_LOG", "/tmp/amp_rewrite_last_mutant")
_check_api_boundary = fuzz.check_api_boundary


def _write_synced(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def logged_check_api_boundary(mutant: Any, **options: Any) -> str:
    """:func:`amp_rewrite.testing.check_api_boundary`, after writing ``mutant`` and ``options``."""
    _write_synced(_PATH + ".bin", mutant.data)
    _write_synced(_PATH + ".txt", f"{mutant!r}\n{options!r}\n".encode("utf-8", "backslashreplace"))
    return _check_api_boundary(mutant, **options)


testing.check_api_boundary = logged_check_api_boundary
fuzz.check_api_boundary = logged_check_api_boundary
