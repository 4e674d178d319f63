"""Builders for the scheduler tests' setups (fake GPU align 128 + host CPU align 32), as measured on the C code."""

from __future__ import annotations

from collections.abc import Callable

from toolkit.backend import Backend, Buffer, profiles
from toolkit.ggml import F32, Graph, Tensor, ops
from toolkit.ggml.tensor import BufferUsage
from toolkit.sched import Scheduler


def gpu(i: int = 0, **kw: object) -> Backend:
    """The fake "GPU": align 128, not host, every op, own buft only, CUDA batch rule with threshold 32."""
    return profiles.cuda_like(i, min_batch=32, **kw)  # type: ignore[arg-type]


def cpu() -> Backend:
    """The "CPU": last backend, host buft of alignment 32."""
    return profiles.cpu()


def weight(be: Backend, name: str, *ne: int) -> Tensor:
    w = ops.new_tensor(F32, ne, name)
    w.buffer = Buffer(be.buft, w.nbytes, BufferUsage.WEIGHTS)
    return w


def graph_of(*outs: Tensor, size: int = 2048) -> Graph:
    g = Graph(size)
    for t in outs:
        g.build_forward_expand(t)
    return g


def reserve_then_alloc(s: Scheduler, build: Callable[[], Graph],
                       pins: Callable[[Scheduler, Graph], None] | None = None) -> tuple[Graph, Graph]:
    """The measuring protocol: reserve graph A, reset, alloc_graph on an identical graph B."""
    a = build()
    if pins:
        pins(s, a)
    assert s.reserve(a)
    s.reset()
    b = build()
    if pins:
        pins(s, b)
    assert s.alloc_graph(b)
    return a, b
