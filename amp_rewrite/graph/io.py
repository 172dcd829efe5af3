"""Import and export: GraphDef / FunctionDef protobufs <-> the networkx IR.

This module and its parts are the only ones that read or write protobuf messages.  Import
builds one ``MultiDiGraph`` for the GraphDef and one per function in its library (see
:mod:`amp_rewrite.graph.ir` for the schema); export turns them back into a GraphDef.  Nodes the
rewrite did not touch are emitted as copies of their original NodeDef, and functions with no
changed node as copies of their original FunctionDef, so a round trip without changes is
byte-identical.  The caller's protobuf is never modified.

The parts: :mod:`.reading` (bytes and ``.pb``/``.pbtxt`` files to GraphDef messages),
:mod:`.importer` (GraphDef to IR), :mod:`.exporter` (IR to GraphDef) and :mod:`.call_graph`
(the library's call graph: what the graph calls, what runs in loops, the recursion check).
Every name stays importable from here.
"""

from __future__ import annotations

# The parts, re-exported: every name below stays importable from this module.
from .call_graph import (  # noqa: F401
    _LOOP_OPS,
    MAX_CALL_DEPTH,
    called_functions,
    _calls_closure,
    check_call_graph,
    functions_named_outside,
    loop_functions,
    reachable_functions,
)
from .exporter import (  # noqa: F401
    _apply_changes,
    _edge_text,
    _export_function,
    _export_main_in_place,
    _export_nodes,
    _fill_from,
    _inputs_from,
    _node_inputs,
    _set_type_attr,
    export_graph_def,
)
from .importer import (  # noqa: F401
    ImportedGraph,
    _add_proto_node,
    _attr_values,
    _check_input_order,
    _check_unique,
    _import_function,
    _import_main,
    _is_parametrized,
    _op_signature,
    import_graph_def,
)
from .reading import _graph_def_class, check_binary_readable, load_graph_def, parse_graph_def  # noqa: F401

__all__ = [
    "ImportedGraph",
    "parse_graph_def",
    "load_graph_def",
    "import_graph_def",
    "export_graph_def",
    "reachable_functions",
    "called_functions",
    "check_call_graph",
    "functions_named_outside",
    "check_binary_readable",
    "MAX_CALL_DEPTH",
]
