"""Model files: SavedModels, MetaGraphs and frozen GraphDefs in and out.

:mod:`.saved_model` reads a model file, rewrites every graph in it through
:mod:`amp_rewrite.api` and writes the result; :mod:`.staging` stages every output beside its
destination and commits all of them or none (never a half-written output, never a file the
user did not name with ``--overwrite``).
"""
