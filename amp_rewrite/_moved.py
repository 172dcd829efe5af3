"""Backwards-compatible names of the modules that moved into stage packages (issue 25).

Until 2026-11 every module sat flat in ``amp_rewrite/``; code that imports the old names
(``import amp_rewrite.graph_io``, ``from amp_rewrite.cost_model import node_cost``) keeps
working: a meta-path finder hands out the moved module itself under its old name, so both names
are one module object (monkeypatching either patches both).  Nothing in the package imports
the old names.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

#: old module (under ``amp_rewrite.``) -> its home now (under ``amp_rewrite.``).
MOVED: dict[str, str] = {
    "ir": "graph.ir",
    "graph_io": "graph.io",
    "tensor_names": "graph.tensor_names",
    "type_attrs": "graph.type_attrs",
    "type_graph": "graph.type_graph",
    "dtypes": "graph.dtypes",
    "op_registry": "graph.op_registry",
    "shape_inference": "graph.shapes",
    "inert_graph": "graph.inert",
    "lists": "plan.lists",
    "decide": "plan.painter",
    "normalization": "plan.normalization",
    "cost_model": "plan.cost_model",
    "placement": "plan.mincut",
    "optimal": "plan.optimal",
    "targets": "plan.targets",
    "exclude": "plan.exclude",
    "saved_model": "models.saved_model",
    "staging": "models.staging",
    "explain": "report.explain",
    "draw": "report.draw",
}

_PACKAGE = __name__.rpartition(".")[0]


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``amp_rewrite.<old name>`` and loads it as the module it moved to."""

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package != _PACKAGE or name not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        # The moved module itself, so that the old and the new name are one object.
        return importlib.import_module(f"{_PACKAGE}.{MOVED[spec.name.rpartition('.')[2]]}")

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: :meth:`create_module` returned a module that is already loaded."""


def install() -> None:
    """Put the finder first on ``sys.meta_path``, once (mutates ``sys.meta_path``).  First,
    because a stale file of an older install (an editable checkout from before the move) must
    not shadow the moved module under its old name."""
    if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedModules())
