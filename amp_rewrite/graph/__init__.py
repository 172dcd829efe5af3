"""Stage 1, **import/export**: the networkx IR of a GraphDef and its function library.

This is the only package that knows protobuf.  :mod:`.io` loads and exports GraphDefs and
validates them (dangling inputs, cycles not closed by a loop, recursive libraries), through
its parts :mod:`.reading`, :mod:`.importer`, :mod:`.exporter` and :mod:`.call_graph`;
:mod:`.ir` is the IR's schema; :mod:`.tensor_names` parses tensor names (the one place that
does); :mod:`.type_attrs`, :mod:`.type_graph` and :mod:`.op_registry` say which type
attributes a node has and how they are tied; :mod:`.dtypes` names the float types;
:mod:`.shapes` infers static shapes on an inert copy (:mod:`.inert`), so no kernel of the input
ever runs.  Imports nothing of the package above :mod:`amp_rewrite.errors`.
"""
