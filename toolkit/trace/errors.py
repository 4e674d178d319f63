"""Errors raised while tracing: they name the primitive and where it occurs in the jaxpr."""

from __future__ import annotations

from toolkit.errors import ToolkitError


class UnsupportedPrimitive(ToolkitError):
    """A jaxpr equation the tracer cannot turn into graph nodes (or run).

    ``primitive`` is the primitive's name, ``where`` the equation path ("equation 3 >
    jit 'block' equation 7") and ``source`` the user source line from the equation's
    source_info ("model.py:12:8 (attention)"), or "" when JAX kept none.
    """

    def __init__(self, primitive: str, where: str, source: str, reason: str) -> None:
        self.primitive = primitive
        self.where = where
        self.source = source
        self.reason = reason
        at = f" at {source}" if source else ""
        super().__init__(f"cannot trace primitive '{primitive}' ({where}){at}: {reason}")
