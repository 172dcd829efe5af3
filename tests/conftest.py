"""Shared fixtures.  The tests directory is on sys.path (pytest rootdir import mode), so
``corpus`` and ``tf_oracle`` import as plain modules."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_tf_amp_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never inherit TensorFlow's AMP list variables from the caller's shell."""
    for key in list(os.environ):
        if key.startswith("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_"):
            monkeypatch.delenv(key)
