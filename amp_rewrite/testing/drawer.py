"""The drawing context of the graph strategies: :class:`_Drawer` draws the steps of one
program (the main graph or a loop or function body) into a pool of values, with primitive
draws that shrink towards 0, the first choice or False.

Which ops to draw and the draw loop live in :mod:`.draw_ops` and :mod:`.draw_program`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from hypothesis import strategies as st

from .draw_bounds import SCALAR, VEC, Interval
from .program import Program, Step, Val


@dataclass
class _Options:
    min_nodes: int
    max_nodes: int
    weights: dict[str, int]
    control_edges: bool
    devices: tuple[str, ...]
    while_loops: bool
    functions: bool
    max_inputs: int
    body_nodes: int
    const_counter: list[int] = field(default_factory=lambda: [0])


class _Drawer:
    """Draws the steps of one program (the main graph or a body) into a pool of values."""

    def __init__(self, draw: Any, opts: _Options, *, args: Sequence[Val] = (),
                 captured: Sequence[Val] = (), body: bool = False,
                 first: int = 0) -> None:
        self.draw = draw
        self.opts = opts
        self.args = list(args)
        self.pool: list[Val] = list(captured) + list(args)
        self.made: list[Val] = []  # values made by this drawer's own steps
        self.steps: list[Step] = []
        self.body = body
        # Step names are numbered from ``first``: a loop body numbers its steps after the
        # enclosing program's, so none of its names can shadow a captured outer value.
        self.count = first

    # -- primitive draws (each shrinks towards 0 / the first choice / False)
    def integer(self, lo: int, hi: int) -> int:
        return lo if lo >= hi else self.draw(st.integers(lo, hi))

    def pick(self, seq: Sequence[Any]) -> Any:
        return seq[self.integer(0, len(seq) - 1)]

    def chance(self, percent: int) -> bool:
        return self.integer(0, 99) >= 100 - percent

    def device(self) -> str:
        return self.pick(self.opts.devices)

    def recent(self, pred: Callable[[Val], bool]) -> list[Val]:
        return [v for v in reversed(self.pool) if pred(v)]

    def fresh(self, op: str) -> str:
        name = f"{op.lower()}_{self.count}"
        self.count += 1
        return name

    # -- adding steps
    def emit(self, op: str, inputs: Sequence[Val], params: Mapping[str, Any],
             outs: Sequence[tuple[str, tuple[int, ...], Interval, bool]], *,
             body: Program | None = None) -> list[Val]:
        name = self.fresh(op)
        control: tuple[str, ...] = ()
        if self.opts.control_edges and not self.body and op != "While":
            plain = [s.name for s in reversed(self.steps) if s.op != "While"]
            if plain and self.chance(20):
                control = (self.pick(plain),)
        assert all(shape is not None for _, shape, _, _ in outs), (op, inputs, outs)
        step = Step(name, op, tuple(v.ref for v in inputs), tuple(params.items()), self.device(),
                    control, body)
        self.steps.append(step)
        vals = [
            Val(name if i == 0 else f"{name}:{i}", dtype, shape, iv[0], iv[1], smooth)
            for i, (dtype, shape, iv, smooth) in enumerate(outs)
        ]
        self.pool.extend(vals)
        self.made.extend(vals)
        return vals

    def const(self, dtype: str, shape: tuple[int, ...], lo: float, hi: float, *, offer: bool = True) -> Val:
        """A new Const; ``offer`` makes it available to later ops (not for filters)."""
        name = f"c_{self.count}"
        self.count += 1
        index = self.opts.const_counter[0]
        self.opts.const_counter[0] += 1
        params = (("dtype", dtype), ("shape", shape), ("lo", lo), ("hi", hi), ("_index", index))
        self.steps.append(Step(name, "Const", (), params, self.device()))
        val = Val(name, dtype, shape, lo, hi, True)
        if offer:
            self.pool.append(val)
        return val

    def placeholder(self, shape: tuple[int, ...]) -> Val:
        name = f"x_{self.count}"
        self.count += 1
        self.steps.append(Step(name, "Placeholder", (), (("dtype", "float32"), ("shape", shape)),
                               self.device()))
        val = Val(name, "float32", shape, -1.0, 1.0, True)
        self.pool.append(val)
        return val

    def partner(self, a: Val, ok: Callable[[Val], bool], const_range: Interval,
                shapes: Sequence[tuple[int, ...]] | None = None) -> Val:
        """An existing value that ``ok`` accepts, or a new Const."""
        existing = self.recent(lambda b: b.dtype == a.dtype and ok(b))
        choice = self.pick(existing + [None])
        if choice is not None:
            return choice
        if shapes is None:
            shapes = [a.shape] + ([VEC] if a.shape and a.shape != VEC else []) + [SCALAR]
        return self.const(a.dtype, self.pick(list(shapes)), *const_range)


def _floats(d: _Drawer, pred: Callable[[Val], bool] = lambda v: True) -> list[Val]:
    return d.recent(lambda v: v.is_float and pred(v))
