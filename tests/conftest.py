"""Shared fixtures.  The tests directory is on sys.path (pytest rootdir import mode), so
``corpus`` and ``tf_oracle`` import as plain modules."""

from __future__ import annotations

import logging
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The bf16 parity tests' oracle, TensorFlow's auto_mixed_precision_onednn_bfloat16 pass, exists
# only while oneDNN is on, and TensorFlow turns oneDNN on by default only on CPUs with
# AVX512-VNNI/BF16, AVX-VNNI or AMX: on an AVX2-only CPU its meta optimizer logs "Can't
# register an optimizer by name" and returns the graph unchanged.  The suite turns it on
# (before anything imports TensorFlow), so it checks the same thing on every CI machine; on
# such a CPU the float32 kernels the numeric tests run are then oneDNN's too, as on the CPUs
# mixed precision is for.  A user's own setting is kept for the subprocesses that stand for a
# user's run (the ``user_environ`` fixture).
_USER_ONEDNN = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1"

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_tf_amp_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never inherit TensorFlow's AMP list variables from the caller's shell."""
    for key in list(os.environ):
        if key.startswith("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_"):
            monkeypatch.delenv(key)


class _TypeCheckFailures(logging.Handler):
    """Collects the WARNINGs of rewrites that failed amp_rewrite's own type check."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "failed its type check" in message:
            self.messages.append(message)


@pytest.fixture(autouse=True)
def _no_type_check_failures(request: pytest.FixtureRequest):
    """A rewrite that fails its type check is a bug of ours.  The product recovers from one
    (it rewrites again with the nodes involved kept float32, with a WARNING), which would let
    a test pass over the bug: so every test fails on that WARNING, but those marked
    ``type_check_failures`` (which make such failures on purpose)."""
    handler = _TypeCheckFailures()
    logger = logging.getLogger("amp_rewrite")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
    if handler.messages and request.node.get_closest_marker("type_check_failures") is None:
        pytest.fail(f"a rewrite failed amp_rewrite's type check: {handler.messages[0]}")


@pytest.fixture
def user_environ() -> dict[str, str]:
    """The environment a user's shell would give a subprocess: ``os.environ`` with the user's
    own oneDNN setting instead of the suite's (on an AVX2-only CPU, oneDNN forced on makes
    TensorFlow log an error line about bfloat16 that a user's run never shows)."""
    env = dict(os.environ)
    if _USER_ONEDNN is None:
        env.pop("TF_ENABLE_ONEDNN_OPTS", None)
    else:
        env["TF_ENABLE_ONEDNN_OPTS"] = _USER_ONEDNN
    return env


# ----------------------------------------------------------------------------------------
# Hypothesis profiles for the property-based tests (tests/test_property_*.py, test_fuzz.py).
#
#   ci    (default)  a bounded number of examples per test, derandomized so CI is stable;
#   deep             thousands of examples per test (>= 2,000 graphs per invariant and
#                    >= 10,000 fuzzed inputs), for a person to run before a release.
#
# Pick one with HYPOTHESIS_PROFILE=deep or pytest's --hypothesis-profile=deep.
# bench/run_property_deep.py runs the deep profile and writes bench/property_report.md.

from hypothesis import HealthCheck, settings  # noqa: E402

_SLOW_IS_FINE = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile("ci", max_examples=30, deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=_SLOW_IS_FINE)
settings.register_profile("deep", max_examples=2000, deadline=None, print_blob=True,
                          suppress_health_check=_SLOW_IS_FINE)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def examples(ci: int, deep: int = 2000) -> int:
    """Examples for one property test: ``ci`` under the ci profile; under a profile with at
    least 1,000 examples (deep), that profile's number and at least ``deep``."""
    active = settings.default.max_examples
    return max(active, deep) if active >= 1000 else ci
