"""The parity tier under the oldest supported TensorFlow (2.16), in a virtual environment of its own.

amp_rewrite supports TensorFlow 2.16 to 2.21 (pyproject: ``tensorflow>=2.16,<2.22``) and uses the
installed release's op lists and pass behaviour.  This module builds (once, then reuses) a venv
with TensorFlow 2.16 from PyPI, outside the repository, and runs the parity tests there against
TensorFlow 2.16's own pass: the list oracle (``test_lists.py``), the version tables
(``test_tf_versions.py``), the golden and known-difference tests, the property parity tests, the
corpus oracle tests and the corpus parity tests of ``test_corpus.py``.  It fails with the tier's
output when any of them fails.

It is part of the default run (``pytest``, what CI runs).  Measured on 2 shared cores: a cold run
(no cached venv; it downloads TensorFlow 2.16, ~600 MB, from PyPI) took 4 minutes (venv 147 s,
tier 85 s), a warm one 1.5 minutes.  It is marked ``oldest_tf``: ``pytest -m oldest_tf`` runs only
this, ``pytest -m "not oldest_tf"`` leaves it out (offline, or no 2.3 GB to spare for the venv).

The venv is cached in ``$XDG_CACHE_HOME/amp_rewrite`` (``~/.cache/amp_rewrite``), keyed by its
requirements; delete that folder to rebuild it.  amp_rewrite itself is not installed there: the
tier imports this checkout (``PYTHONPATH``), so one venv serves every checkout.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.oldest_tf

REPO = Path(__file__).resolve().parent.parent
#: The oldest supported TensorFlow.  numpy<2: TensorFlow 2.16 was built against numpy 1.
OLDEST_TF = "2.16.2"
REQUIREMENTS = (f"tensorflow=={OLDEST_TF}", "numpy<2", "networkx>=3.2", "pytest>=8", "hypothesis>=6.100",
                "scikit-learn>=1.3")
#: The parity tier: every test that compares with TensorFlow's own lists or pass.
TIER = ("tests/test_lists.py", "tests/test_tf_versions.py", "tests/test_golden.py",
        "tests/test_known_differences.py", "tests/test_property_parity.py", "tests/test_corpus_oracle.py",
        "tests/test_corpus.py::test_parity_with_tensorflow",
        "tests/test_corpus.py::test_default_mode_differs_from_tensorflow_only_where_tensorflow_is_broken")
INSTALL_TIMEOUT_S = 1800
TIER_TIMEOUT_S = 3600
# A venv is complete only once this file exists: an interrupted build is rebuilt, never reused.
_COMPLETE = "amp_rewrite-venv-complete"


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "amp_rewrite"


def _venv_dir() -> Path:
    # Keyed by the requirements and this interpreter's version: a change of either builds anew.
    key = hashlib.sha256("\n".join((*REQUIREMENTS, sys.version)).encode()).hexdigest()[:12]
    return _cache_root() / f"tf{OLDEST_TF.replace('.', '')}-{key}"


def _run(cmd: list[str], *, timeout: float, env: dict[str, str] | None = None,
         cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


def _tail(proc: subprocess.CompletedProcess[str], chars: int = 20000) -> str:
    return (proc.stdout + "\n" + proc.stderr)[-chars:]


def _ensure_venv() -> tuple[Path, float]:
    """The venv's python, building the venv first when the cache has none; and the seconds
    the build took (0 when reused).  Fails the test with pip's output when the build fails."""
    venv = _venv_dir()
    python = venv / "bin" / "python"
    if (venv / _COMPLETE).is_file() and python.exists():
        return python, 0.0
    start = time.monotonic()
    if venv.exists():
        shutil.rmtree(venv)  # an earlier build was interrupted
    venv.parent.mkdir(parents=True, exist_ok=True)
    made = _run([sys.executable, "-m", "venv", str(venv)], timeout=300)
    if made.returncode != 0:
        pytest.fail(f"could not create the venv {venv}:\n{_tail(made)}", pytrace=False)
    pip = _run([str(python), "-m", "pip", "install", "--disable-pip-version-check", *REQUIREMENTS],
               timeout=INSTALL_TIMEOUT_S)
    if pip.returncode != 0:
        pytest.fail(f"pip could not install {' '.join(REQUIREMENTS)} into {venv}:\n{_tail(pip)}", pytrace=False)
    (venv / _COMPLETE).write_text("\n".join(REQUIREMENTS) + "\n")
    return python, time.monotonic() - start


def test_parity_tier_passes_under_the_oldest_supported_tensorflow() -> None:
    python, built_s = _ensure_venv()
    env = {key: value for key, value in os.environ.items() if not key.startswith("TF_AUTO_MIXED_PRECISION_")}
    # This checkout, not an installed amp_rewrite: the lists come from its lists/ folder.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), env.get("PYTHONPATH"))))
    version = _run([str(python), "-c", "import tensorflow as tf, amp_rewrite; print(tf.__version__); "
                    "print(amp_rewrite.__file__)"], timeout=300, env=env, cwd=REPO)
    assert version.returncode == 0, _tail(version)
    lines = version.stdout.split()
    assert lines[-2] == OLDEST_TF, f"the venv has TensorFlow {lines[-2]}, not {OLDEST_TF}"
    assert Path(lines[-1]).resolve().is_relative_to(REPO), f"imported {lines[-1]}, not this checkout's amp_rewrite"
    start = time.monotonic()
    tier = _run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *TIER],
                timeout=TIER_TIMEOUT_S, env=env, cwd=REPO)
    took = time.monotonic() - start
    summary = tier.stdout.strip().splitlines()[-1] if tier.stdout.strip() else "(no output)"
    print(f"TensorFlow {OLDEST_TF}: venv {'built in %.0f s' % built_s if built_s else 'reused'}, "
          f"tier {took:.0f} s: {summary}")
    if tier.returncode != 0:
        pytest.fail(f"the parity tier failed under TensorFlow {OLDEST_TF} ({python}):\n{_tail(tier)}",
                    pytrace=False)
    assert " passed" in summary and "skipped" not in summary, summary
