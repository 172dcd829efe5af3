"""The README's property-testing example runs: its test is collected from the README block
and run like pytest would (tests/test_readme.py only executes the block, which defines it).

The block is compiled under its own file name, registered with ``linecache``: Hypothesis
reads a test's source to key its example database, and the README is not Python."""

from __future__ import annotations

import linecache
import pathlib
import re

README = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_readme_property_example_runs():
    blocks = [b for b in re.findall(r"```python\n(.*?)```", README, re.S) if "amp_rewrite.testing" in b]
    assert len(blocks) == 1, "the README shows one property-testing example"
    (block,) = blocks
    assert len(block.strip().splitlines()) <= 14, "the example should stay about ten lines"
    filename = "<README.md property-testing example>"
    linecache.cache[filename] = (len(block), None, block.splitlines(keepends=True), filename)
    namespace: dict = {}
    exec(compile(block, filename, "exec"), namespace)
    tests = [f for name, f in namespace.items() if name.startswith("test_") and callable(f)]
    assert tests
    for test in tests:
        test()
