"""The invariants of a mixed precision rewrite, each callable on its own.

Every ``check_*`` function takes the GraphDef before the rewrite, the GraphDef after it and
the report (``None`` where it is not needed), plus the options the rewrite ran with, and
raises :class:`InvariantError` (an ``AssertionError``) naming the invariant and the node when
the invariant does not hold.  :func:`check_rewrite` runs several at once.

The checks read GraphDefs with TensorFlow's own op registry and kernel registry, not with
amp_rewrite's type analysis, so they do not trust the code they check.  Only the op lists
(:func:`amp_rewrite.resolve_lists`) and device placement (:class:`amp_rewrite.Target`)
come from the product: they are its specification.

The checks live by kind -- :mod:`.structural_invariants` (valid, interface, minimal casts),
:mod:`.list_invariants` (allow/deny, monotone), :mod:`.rerun_invariants` (idempotent,
deterministic), :mod:`.numeric_invariants` (numerics, parity) and their shared
:mod:`.invariant_support` -- and are all importable from here.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from .invariant_support import REWRITE_OPTIONS  # noqa: F401  (importable from here, as before the split)
from .invariant_support import InvariantError, _graph_def, _options
from .list_invariants import check_allow_deny, check_monotone
from .numeric_invariants import NUMERIC_TOLERANCE, check_numerics, check_parity
from .rerun_invariants import check_deterministic, check_idempotent
from .structural_invariants import check_interface, check_minimal_casts, check_valid

__all__ = [
    "InvariantError",
    "INVARIANTS",
    "DEFAULT_INVARIANTS",
    "check_rewrite",
    "check_valid",
    "check_allow_deny",
    "check_interface",
    "check_minimal_casts",
    "check_idempotent",
    "check_deterministic",
    "check_monotone",
    "check_numerics",
    "check_parity",
    "NUMERIC_TOLERANCE",
]


# ----------------------------------------------------------------------------- all at once

INVARIANTS: dict[str, Callable[..., None]] = {
    "valid": check_valid,
    "allow/deny": check_allow_deny,
    "interface": check_interface,
    "minimal casts": check_minimal_casts,
    "idempotent": check_idempotent,
    "deterministic": check_deterministic,
    "monotone": check_monotone,
    "numerics": check_numerics,
    "parity": check_parity,
}

#: What :func:`check_rewrite` checks unless told otherwise (parity needs a reference graph).
DEFAULT_INVARIANTS = ("valid", "interface", "allow/deny", "minimal casts", "idempotent",
                      "deterministic", "monotone", "numerics")


def check_rewrite(before: Any, after: Any, report: Mapping[str, Any] | None, *,
                  invariants: Sequence[str] = DEFAULT_INVARIANTS,
                  feeds: Mapping[str, np.ndarray] | None = None, outputs: Sequence[str] | None = None,
                  reference: Any = None, hash_seeds: Sequence[int] = (), monotone_ops: Iterable[str] | None = None,
                  rtol: float | None = None, **rewrite_options: Any) -> None:
    """Check the invariants of one rewrite: ``after``/``report`` came from
    ``amp_rewrite.rewrite_graph_def(before, **rewrite_options)``.

    ``invariants`` picks which (names as in :data:`INVARIANTS`); ``feeds``/``outputs`` run the
    graphs for *valid* and *numerics*; ``reference`` (TensorFlow's own rewrite of ``before``)
    is needed for *parity*; ``hash_seeds`` makes *deterministic* also compare fresh processes.
    Raises :class:`InvariantError` for the first invariant that does not hold.
    """
    options = _options(rewrite_options)
    unknown = sorted(set(invariants) - set(INVARIANTS))
    if unknown:
        raise ValueError(f"unknown invariant(s) {unknown}; known: {list(INVARIANTS)}")
    before, after = _graph_def(before), _graph_def(after)
    precision = options.get("precision", "float16")
    for name in invariants:
        if name == "valid":
            check_valid(before, after, report, feeds=feeds, outputs=outputs)
        elif name == "allow/deny":
            check_allow_deny(before, after, report, **{k: v for k, v in options.items() if k != "registry"})
        elif name == "interface":
            check_interface(before, after, report, fetches=options.get("fetches"))
        elif name == "minimal casts":
            check_minimal_casts(before, after, report, **{k: v for k, v in options.items()
                                                          if k in ("target", "precision", "fetches", "exclude")})
        elif name == "idempotent":
            check_idempotent(before, after, report, **options)
        elif name == "deterministic":
            check_deterministic(before, after, report, hash_seeds=hash_seeds, **options)
        elif name == "monotone":
            check_monotone(before, after, report, ops=monotone_ops, **options)
        elif name == "numerics":
            check_numerics(before, after, report, feeds=feeds, outputs=outputs, precision=precision, rtol=rtol)
        elif name == "parity":
            if reference is None:
                raise ValueError("the parity invariant needs reference= (TensorFlow's own rewrite)")
            check_parity(before, after, report, reference=reference, precision=precision)
