"""Hypothesis strategies that draw random, valid and runnable TensorFlow graphs.

:func:`graphs` draws a :class:`GraphCase`: a GraphDef, the feeds that run it, its outputs and
the small program it was built from (shown when a test fails, so a shrunk counterexample
reads like code).  Graphs are DAGs of real ops from all four lists (allow, infer, deny,
clear) and ops on no list, with consistent shapes and dtypes; optionally with control edges,
several outputs, nodes on several devices, while loops (TF1 frames and TF2 functional loops),
function calls (``PartitionedCall`` into a ``FunctionDef``) and TF2 conditionals (``If``).

Values stay well inside the float16 range: each tensor carries bounds, and an op is only
drawn where its result stays within :data:`LIMIT` and away from singular points (Log of
values >= 0.5, division by values of magnitude >= 0.5, ...).  Every op drawn has CPU
kernels for float32, float16 and bfloat16, so a rewritten graph runs on this machine.

The drawing itself lives in :mod:`.draw_bounds` (shapes and value bounds), :mod:`.drawer`
(the drawing context), :mod:`.draw_ops` (the op table) and :mod:`.draw_program` (the draw
loop, loops and calls); this module holds the public strategies and :class:`GraphCase`.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import tensorflow as _tensorflow  # noqa: F401  (imported up front: it changes the recursion limit)
from hypothesis import strategies as st

from .draw_bounds import IMG, LIMIT, VEC, M
from .draw_ops import OPS
from .draw_program import _draw_steps, _wrap_outputs
from .drawer import _Drawer, _Options
from .execute import graph_outputs, run_graph
from .facts import sinks
from .program import Program, format_program, materialize

__all__ = [
    "GraphCase",
    "graphs",
    "graph_defs",
    "OPS",
    "LIMIT",
    "MULTI_DEVICES",
    "precisions",
    "graphs_with_options",
]

#: Device strings for ``graphs(devices=MULTI_DEVICES)``: the default device, GPU:0, GPU:1
#: (compute capability 6.1 in the case's target, so not eligible for float16) and the CPU.
MULTI_DEVICES = ("", "/device:GPU:0", "/device:GPU:1", "/device:CPU:0")


def precisions() -> st.SearchStrategy[str]:
    """``"float16"`` or ``"bfloat16"``."""
    return st.sampled_from(("float16", "bfloat16"))


# ----------------------------------------------------------------------------- the case


class GraphCase:
    """A drawn graph: its GraphDef, how to run it, and the program it was built from.

    ``fetches`` are the graph's outputs (the nodes nothing reads from), ``outputs`` the
    tensors to evaluate, ``smooth_outputs`` those that depend continuously on the inputs (the
    others go through comparisons or float -> int casts), ``feeds`` values for the
    placeholders, ``target`` a target with a GPU:1 of compute capability 6.1 when the graph
    uses that device.
    """

    def __init__(self, program: Program | None, seed: int, graph_def: Any, feeds: Mapping[str, np.ndarray],
                 smooth: Iterable[str], bounds: Mapping[str, tuple[float, float]] | None = None,
                 description: str = "") -> None:
        self.program = program
        self.seed = seed
        self.graph_def = graph_def
        self.feeds = dict(feeds)
        self.fetches = tuple(sinks(graph_def))
        self.outputs = tuple(graph_outputs(graph_def))
        smooth = set(smooth)
        self.smooth_outputs = tuple(t for t in self.outputs if t in smooth)
        #: Bounds the strategies guarantee for the values of main-graph tensors.
        self.bounds = dict(bounds or {})
        self.description = description
        uses_gpu1 = any("GPU:1" in n.device for n in graph_def.node) or any(
            "GPU:1" in n.device for f in graph_def.library.function for n in f.node_def)
        self.target = "gpu:8.0,6.1" if uses_gpu1 else "gpu:8.0"

    @property
    def ops(self) -> list[str]:
        """Op types of the main graph and every function body, sorted."""
        found = {n.op for n in self.graph_def.node}
        for f in self.graph_def.library.function:
            found |= {n.op for n in f.node_def}
        return sorted(found)

    def run(self, graph_def: Any = None, outputs: Sequence[str] | None = None) -> list[np.ndarray]:
        """Evaluate ``outputs`` (default: all) of ``graph_def`` (default: the drawn graph)."""
        return run_graph(graph_def if graph_def is not None else self.graph_def, self.feeds,
                         list(outputs if outputs is not None else self.outputs))

    @classmethod
    def from_graph_def(cls, graph_def: Any, feeds: Mapping[str, np.ndarray] | None = None, *,
                       smooth: bool = True, description: str = "") -> "GraphCase":
        """A case for a GraphDef made by hand (an ``@example`` regression, say).  ``feeds``
        default to uniform values in [-1, 1]; ``smooth``: compare every output numerically."""
        from .execute import random_feeds

        feeds = random_feeds(graph_def) if feeds is None else feeds
        outputs = graph_outputs(graph_def)
        return cls(None, 0, graph_def, feeds, outputs if smooth else (), description=description)

    def __repr__(self) -> str:
        lines = [f"GraphCase(target={self.target!r}, seed={self.seed}, fetches={list(self.fetches)!r}):"]
        if self.program is not None:
            lines += format_program(self.program)
        else:
            lines += [f"  {self.description or 'a GraphDef made by hand'}"]
            lines += [f"  {n.name} = {n.op}({', '.join(n.input)})" + (f" @{n.device}" if n.device else "")
                      for n in self.graph_def.node]
        return "\n".join(lines)


def _normalize_ops(ops: Iterable[str] | Mapping[str, int] | None) -> dict[str, int]:
    if ops is None:
        return dict(OPS)
    if isinstance(ops, Mapping):
        weights = {op: int(w) for op, w in ops.items()}
    else:
        weights = {op: OPS.get(op, 1) for op in ops}
    unknown = sorted(set(weights) - set(OPS))
    if unknown:
        raise ValueError(f"graphs(ops=...) names ops the strategies cannot draw: {unknown}; "
                         f"known: {sorted(OPS)}")
    return {op: weights[op] for op in OPS if op in weights}


def graphs(
    *,
    min_nodes: int = 2,
    max_nodes: int = 12,
    ops: Iterable[str] | Mapping[str, int] | None = None,
    control_edges: bool = True,
    devices: Sequence[str] = ("",),
    while_loops: bool = False,
    functions: bool = False,
    max_inputs: int = 3,
    body_nodes: int = 3,
    output_identities: bool | None = None,
) -> st.SearchStrategy[GraphCase]:
    """Draw a :class:`GraphCase`: a valid GraphDef that runs, with feeds and outputs.

    Parameters
    ----------
    min_nodes, max_nodes
        How many ops to draw (Placeholders, Consts and output Identities come on top).
    ops
        The op mix: op names (each with its default weight) or a mapping op -> weight;
        default :data:`OPS`, every op the strategies know.
    control_edges
        Give some nodes a control input from an earlier node.
    devices
        Device strings to place nodes on, e.g. :data:`MULTI_DEVICES`.  The first one is what
        the shrinker moves towards.
    while_loops, functions
        Also draw while loops, TF1's (``Enter/Merge/Switch/NextIteration/Exit``) and TF2's
        functional ones (``While``/``StatelessWhile`` with ``cond`` and ``body`` functions), and
        calls (``PartitionedCall``) into a FunctionDef, a third of them TF2 conditionals
        (``tf.cond``: a ``StatelessIf`` whose ``then_branch`` and ``else_branch`` functions
        both run the drawn body); each has a body of up to ``body_nodes`` drawn ops.
    output_identities
        Whether unused values get an ``Identity`` output node (``None``: drawn per graph).
        Without them the last op of a chain is itself an output and is preserved.
    """
    if not 0 <= min_nodes <= max_nodes:
        raise ValueError(f"need 0 <= min_nodes <= max_nodes, got {min_nodes}, {max_nodes}")
    if not devices:
        raise ValueError("devices must name at least one device string ('' is the default device)")
    weights = _normalize_ops(ops)

    @st.composite
    def _draw(draw: Any) -> GraphCase:
        opts = _Options(min_nodes, max_nodes, weights, control_edges, tuple(devices), while_loops,
                        functions, max_inputs, body_nodes)
        seed = draw(st.integers(0, 2 ** 16))
        d = _Drawer(draw, opts)
        for _ in range(d.integer(1, max_inputs)):
            d.placeholder(d.pick([M, IMG, VEC]))
        _draw_steps(d, min_nodes, max_nodes)
        wrap = output_identities if output_identities is not None else not d.chance(30)
        if wrap:
            _wrap_outputs(d)
        program = Program(tuple(d.steps))
        built = materialize(program, seed)
        feeds = {}
        for i, step in enumerate(s for s in program.steps if s.op == "Placeholder"):
            rng = np.random.default_rng([seed, 1_000_000 + i])
            feeds[built.tensors[step.name]] = rng.uniform(-1.0, 1.0, step.param("shape")).astype(np.float32)
        smooth = {built.tensors[v.ref] for v in d.pool if v.smooth and v.ref in built.tensors}
        smooth |= {built.tensors[v.ref + ":0"] for v in d.pool
                   if v.smooth and ":" not in v.ref and v.ref + ":0" in built.tensors}
        bounds = {built.tensors[v.ref]: (v.lo, v.hi) for v in d.pool if v.is_float and v.ref in built.tensors}
        return GraphCase(program, seed, built.graph_def, feeds, smooth, bounds)

    return _draw()


#: The optimization levels drawn by :func:`graphs_with_options` (``None``: the default).
LEVELS: tuple[str | None, ...] = (None, None, None, "TENSOR_CORES_ONLY", "TREAT_INFER_AS_DENY",
                                  "UNSAFE_FORCE_ALL")


def graphs_with_options(*, lists: Sequence[str] = ("default", "tensorflow", "optimal"), cpu: bool = True,
                        planners: Sequence[str | None] = (None, None, "min-casts", "optimal", "greedy"),
                        levels: Sequence[str | None] = LEVELS,
                        **graph_options: Any) -> st.SearchStrategy[tuple[GraphCase, dict[str, Any]]]:
    """Draw ``(case, options)``: a :class:`GraphCase` and keyword arguments for
    ``rewrite_graph_def`` (target: the case's GPU target or, when ``cpu``, sometimes ``"cpu"``;
    precision; one of ``lists``; fetches: the case's outputs, or ``None`` which means the
    same; ``use_env=False``; and sometimes one of ``planners`` -- ``None`` leaves the
    profile's planner, ``"min-casts"`` exercises the min cut on the small drawn graphs, where
    the time-based ``optimal`` planner rightly keeps almost everything float32 -- and one of
    ``levels`` (``None`` leaves the default; ``UNSAFE_FORCE_ALL`` is drawn only with a GPU
    target, as TensorFlow refuses it for CPUs))."""

    @st.composite
    def _draw(draw: Any) -> tuple[GraphCase, dict[str, Any]]:
        case = draw(graphs(**graph_options))
        options: dict[str, Any] = {
            "target": "cpu" if cpu and draw(st.integers(0, 3)) == 3 else case.target,
            "precision": draw(precisions()),
            "lists": draw(st.sampled_from(list(lists))),
            "fetches": None if draw(st.booleans()) else list(case.fetches),
            "use_env": False,
        }
        planner = draw(st.sampled_from(list(planners)))
        if planner is not None:
            options["planner"] = planner
        level = draw(st.sampled_from(list(levels)))
        if level == "UNSAFE_FORCE_ALL" and options["target"] == "cpu":
            level = None
        if level is not None:
            options["level"] = level
        return case, options

    return _draw()


def graph_defs(**options: Any) -> st.SearchStrategy[Any]:
    """Like :func:`graphs`, but draws the GraphDef alone."""
    return graphs(**options).map(lambda case: case.graph_def)
