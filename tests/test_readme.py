"""The README's examples run, and its two commands are the ones CI and users run."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert blocks, "the README should show the Python API"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```bash\n(.*?)```", README, re.S)
    assert "pip install . && amp-rewrite demo" in commands[0]
    test_command = commands[1].strip()
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_command in ci.splitlines()


def test_every_subpackage_is_installed_by_pyproject():
    # pyproject lists packages explicitly (lists/ is mapped onto amp_rewrite._lists), so a new
    # subpackage must be added there or a non-editable install silently lacks it.
    import tomllib

    packages = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.relative_to(ROOT).parent.parts) for p in (ROOT / "amp_rewrite").rglob("__init__.py")}
    assert found <= packages, f"missing from pyproject packages: {sorted(found - packages)}"
