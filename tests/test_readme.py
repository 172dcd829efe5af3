"""The README's and docs/'s examples run, the README's two commands are the ones CI and users
run, its first screen sends each kind of user somewhere, and every link between them resolves.

Every ```python block of README.md and docs/*.md is executed; a block meant only to be read is
fenced ```text instead."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = sorted((ROOT / "docs").glob("*.md"))
FIRST_SCREEN = 45  # lines


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_readme_python_examples_run():
    blocks = _python_blocks(README)
    assert blocks, "the README should show the Python API"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_docs_python_examples_run(doc: pathlib.Path):
    for block in _python_blocks(doc.read_text()):
        exec(compile(block, f"docs/{doc.name}", "exec"), {})


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```bash\n(.*?)```", README, re.S)
    assert "pip install . && amp-rewrite demo" in commands[0]
    test_command = commands[1].strip()
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_command in ci.splitlines()


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _outside_code(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.S)


def _anchors(path: pathlib.Path) -> set[str]:
    found: set[str] = set()
    for heading in re.findall(r"^#+ (.+)$", _outside_code(path.read_text()), re.M):
        slug, n = _slug(heading), 1
        while slug in found:  # GitHub numbers repeated headings: -1, -2...
            slug, n = f"{_slug(heading)}-{n}", n + 1
        found.add(slug)
    return found


def test_the_first_screen_tells_each_user_what_to_do():
    first = "\n".join(README.splitlines()[:FIRST_SCREEN])
    assert "pip install . && amp-rewrite demo" in first
    assert 'pip install ".[test]" && pytest' in first
    anchors = _anchors(ROOT / "README.md")
    for user, section in (("train", "#train-"), ("serve", "#serve-"), ("test", "#test-")):
        links = re.findall(rf"\*\*{user}\*\*.*?\]\(({section}[^)]*)\)", first)
        assert links, f"the first screen should send a user who wants to {user} to a section"
        assert links[0][1:] in anchors, links[0]
        # ...and that section shows a program that test_readme_python_examples_run runs.
        sections = {_slug(chunk.split("\n", 1)[0]): chunk for chunk in README.split("\n## ")[1:]}
        assert "```python\n" in sections[links[0][1:]], f"{links[0]} should show a tested program"


def test_the_old_calls_are_mapped_to_new_ones():
    table = README[README.index("### Old call → new call"):]
    table = table[:table.index("\n### ")]
    for old in ("tf.train.experimental.enable_mixed_precision_graph_rewrite",
                "tf.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite",
                "TF_ENABLE_AUTO_MIXED_PRECISION=1", '"mixed_float16"'):
        assert old in table, old
    assert "### What is and is not rewritten" in README


@pytest.mark.parametrize("doc", [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *DOCS], ids=lambda p: p.name)
def test_links_resolve(doc: pathlib.Path):
    for target in re.findall(r"\]\(([^)\s]+)\)", _outside_code(doc.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        assert linked.exists(), f"{doc.name}: {target}: no such file"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked), f"{doc.name}: {target}: no such heading"


def test_every_subpackage_is_installed_by_pyproject():
    # pyproject lists packages explicitly (lists/ is mapped onto amp_rewrite._lists), so a new
    # subpackage must be added there or a non-editable install silently lacks it.
    import tomllib

    packages = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.relative_to(ROOT).parent.parts) for p in (ROOT / "amp_rewrite").rglob("__init__.py")}
    assert found <= packages, f"missing from pyproject packages: {sorted(found - packages)}"
