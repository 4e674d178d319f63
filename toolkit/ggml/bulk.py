"""Pausing CPython's cyclic garbage collector while graphs are built, copied, split and planned.

These steps create thousands of small objects (tensors, source lists, hash nodes, records) that all
stay alive until the next graph replaces them. With the collector running, every 700 allocations
start a young-generation pass, and every tenth of those an older one, which rescans everything
kept from earlier graphs; planning time then grows faster than the graph. Reference counting
still frees what becomes garbage, and the collector resumes afterwards.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar


@contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic collection inside the block; nested blocks leave it to the outermost one."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_F = TypeVar("_F", bound=Callable[..., Any])


def with_paused_gc(fn: _F) -> _F:
    """``fn`` runs inside :func:`paused_gc`."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with paused_gc():
            return fn(*args, **kwargs)
    return wrapper  # type: ignore[return-value]


__all__ = ["paused_gc", "with_paused_gc"]
