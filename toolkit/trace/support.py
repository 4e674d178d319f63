"""Per-backend support for JAX primitives, on top of the device profiles' ggml-op rules.

Every traced node carries ``op_params["primitive"]``, so a backend can refuse a primitive
whatever ggml op it mapped to (``lacking(sim, "cumsum", "erf")``) or accept only a set
(``only(accel, {"dot_general", "add"})``). The scheduler then treats such nodes exactly as
ggml treats an op a device does not support: pass 2 does not expand onto it, pass 3 picks the
backend with the most supported inputs, pass 4 the first supporting one
(the passes of ``ggml_backend_sched_split_graph``).

Op offload needs nothing new: a profile's ``offload_op`` reads the node's ggml op and ``ne``,
so a MUL_MAT-mapped dot_general offloads by its rows (``ne[1]``), a GET_ROWS gather never, and
an Op.JAX node by ``ne[1]*ne[2]*ne[3]`` — the batch rule of CUDA's ``get_op_batch_size``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from toolkit.backend import Backend, cuda_batch_size
from toolkit.ggml.tensor import Tensor


def primitive_of(t: Tensor) -> str | None:
    """The JAX primitive a traced node came from (None for hand-built ggml nodes)."""
    p = t.op_params.get("primitive")
    return None if p is None else str(p)


def _add_filter(backend: Backend, pred: Callable[[Tensor], bool]) -> Backend:
    old = backend.profile.op_filter

    def both(t: Tensor) -> bool:
        return (old is None or bool(old(t))) and pred(t)

    backend.profile.op_filter = both
    return backend


def lacking(backend: Backend, *primitives: str) -> Backend:
    """Make ``backend`` refuse nodes traced from these primitives (returns the backend)."""
    deny = frozenset(primitives)
    return _add_filter(backend, lambda t: primitive_of(t) not in deny)


def only(backend: Backend, primitives: Iterable[str]) -> Backend:
    """Make ``backend`` accept only traced nodes of these primitives (hand-built ggml nodes pass)."""
    allow = frozenset(primitives)
    return _add_filter(backend, lambda t: primitive_of(t) is None or primitive_of(t) in allow)


def offload_batch(t: Tensor) -> int:
    """The op-offload batch size of a node (CUDA's ``get_op_batch_size``, the rule the simulated devices use)."""
    return cuda_batch_size(t)


def support_table(nodes: Iterable[Tensor], backends: list[Backend]) -> str:
    """One line per distinct (primitive, ggml op): which backends support it."""
    rows: dict[tuple[str, str], list[str]] = {}
    for t in nodes:
        key = (primitive_of(t) or "-", t.op_desc())
        if key not in rows:
            rows[key] = [b.name for b in backends if b.supports_op(t)]
    width = max((len(p) for p, _ in rows), default=9)
    lines = [f"{'primitive':<{width}}  {'ggml op':<12} supported by"]
    for (p, op), names in sorted(rows.items()):
        lines.append(f"{p:<{width}}  {op:<12} {', '.join(names) or 'NONE'}")
    return "\n".join(lines)
