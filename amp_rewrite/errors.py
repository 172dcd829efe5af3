"""The exception hierarchy of amp_rewrite.

Every error the product raises on bad input derives from :class:`AmpRewriteError`, so callers
(and the CLI) can catch one type.  Each error carries structured fields (``node``, ``op``,
``path``) and builds a message that names the problem.
"""

from __future__ import annotations

__all__ = [
    "AmpRewriteError",
    "GraphFormatError",
    "InvalidGraphError",
    "ListError",
    "TargetError",
    "RewriteError",
]


class AmpRewriteError(Exception):
    """Root of every error raised by amp_rewrite on bad input or an impossible request."""

    def __init__(
        self,
        message: str,
        *,
        node: str | None = None,
        op: str | None = None,
        path: str | None = None,
    ) -> None:
        self.node = node
        self.op = op
        self.path = path
        parts = []
        if path:
            # Paths come from users and files: quote one that holds control characters, so a
            # message stays on one line.
            shown = path if path.isprintable() else repr(path)
            parts.append(f"{shown}: ")
        parts.append(message)
        super().__init__("".join(parts))


class GraphFormatError(AmpRewriteError):
    """The input is not a (complete) GraphDef / MetaGraphDef / SavedModel."""


class InvalidGraphError(AmpRewriteError):
    """The graph parses but is not a valid TensorFlow graph (dangling input, bad cycle, ...)."""


class ListError(AmpRewriteError):
    """An op-list profile, list file or list edit is invalid."""


class TargetError(AmpRewriteError):
    """A target or precision cannot be understood."""


class RewriteError(AmpRewriteError):
    """The rewrite could not be carried out (an internal consistency check failed)."""


class AutotuneInputError(AmpRewriteError):
    """The caller's autotune inputs (``--autotune-inputs FILE.npz`` or
    ``AutotuneOptions.inputs``) cannot be read or do not fit the model."""
