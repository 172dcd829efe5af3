"""The package's shape (issue 25): stages in folders, no import circle, layers in order, the old
module names still importable."""

from __future__ import annotations

import ast
import importlib
import pathlib

import networkx as nx
import pytest

import amp_rewrite
from amp_rewrite._moved import MOVED

PACKAGE = pathlib.Path(amp_rewrite.__file__).parent


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    """Absolute names an ``ImportFrom`` node imports (a module, or its submodules by name)."""
    if node.level == 0:
        base = node.module or ""
    else:
        parts = module.split(".")
        keep = len(parts) - node.level + (1 if is_package else 0)
        base = ".".join(parts[:keep] + ([node.module] if node.module else []))
    return [base] + [f"{base}.{a.name}" for a in node.names]


def import_graph() -> nx.DiGraph:
    """module -> module it imports, over every module of the package, counting imports inside
    functions and under ``TYPE_CHECKING`` too (a circle there is still a circle to a reader)."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    g = nx.DiGraph()
    g.add_nodes_from(files)
    for name, path in files.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                targets = _resolve(name, path.name == "__init__.py", node)
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                if target in files and target != name:
                    g.add_edge(name, target)
    return g


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_the_import_graph_has_no_cycle():
    g = import_graph()
    # A package's __init__ re-exporting its own modules is not a circle of the design.
    g.remove_edges_from([(a, b) for a, b in list(g.edges) if a.endswith("__init__") or
                         b == a.rpartition(".")[0] or (a == "amp_rewrite")])
    cycles = list(nx.simple_cycles(g))
    assert not cycles, cycles[:5]


@pytest.mark.parametrize("layer, may_import", [
    ("graph", {"graph", "errors"}),
    ("plan", {"graph", "plan", "errors"}),
    ("rewrite", {"graph", "plan", "errors"}),
    ("rewrite_check", {"graph", "errors"}),
    ("loop_hoist", {"graph", "errors"}),
])
def test_lower_layers_import_nothing_above_them(layer, may_import):
    g = import_graph()
    bad = sorted((a, b) for a, b in g.edges
                 if _layer(a) == layer and _layer(b) not in may_import and b != "amp_rewrite")
    assert not bad, bad


def test_plan_imports_no_models_report_or_training():
    g = import_graph()
    bad = sorted((a, b) for a, b in g.edges if _layer(a) == "plan"
                 and _layer(b) in {"models", "report", "training", "api", "cli", "autotune", "demo"})
    assert not bad, bad


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_old_module_names_import_the_moved_module(old, new):
    assert importlib.import_module(f"amp_rewrite.{old}") is importlib.import_module(f"amp_rewrite.{new}")


def test_old_report_module_names_still_work():
    from amp_rewrite.report import build_report
    from amp_rewrite.report.build import build_report as moved

    assert build_report is moved


def _matmul_ir():
    """The IR of ``out = Identity(MatMul(x, x))`` and what ``decide`` needs besides."""
    import numpy as np
    import tensorflow as tf

    from amp_rewrite.graph.io import import_graph_def
    from amp_rewrite.graph.op_registry import default_registry
    from amp_rewrite.plan.lists import ListContext, load_lists
    from amp_rewrite.plan.targets import parse_target

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [64, 64], name="x")
        w = tf.constant(np.ones((64, 64), np.float32), name="w")
        tf.identity(tf.matmul(x, w, name="mm"), name="out")
    registry = default_registry()
    ir = import_graph_def(g.as_graph_def(), registry)
    lists = load_lists("default", context=ListContext("float16", "cuda"),
                       is_known_op=lambda op: True)
    return ir.graph, lists, parse_target("gpu:8.0"), registry


def test_a_planner_plugs_into_the_painter_through_the_placement_interface():
    """The documented interface (docs/architecture.md): ``decide`` calls the placement it is
    handed with the painting state after TensorFlow's passes; what the placement paints is the
    plan, and without one a cost-aware planner is refused with the product's error."""
    from amp_rewrite.errors import RewriteError
    from amp_rewrite.plan.painter import DecideOptions, decide

    g, lists, target, registry = _matmul_ir()
    greedy = decide(g, lists, target, "float16", registry)
    assert "mm" in {node for node, _ in greedy.allow}

    calls = []

    def keep_everything_float32(state, clusters, options):
        calls.append((options.planner, sorted(state.tg.node[v] for v in state.allow)))
        state.allow = set()
        return "summary"

    plan = decide(g, lists, target, "float16", registry, DecideOptions(planner="optimal"),
                  keep_everything_float32)
    assert calls and calls[0][0] == "optimal" and "mm" in calls[0][1]
    assert not plan.allow and plan.placement == "summary"
    with pytest.raises(RewriteError, match="needs a placement"):
        decide(g, lists, target, "float16", registry, DecideOptions(planner="optimal"))
