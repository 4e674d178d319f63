"""One probe: ``common_get_device_memory_data_impl`` over a :class:`~toolkit.context.Context`.

The context is created with the probe's parameters, ``no_alloc`` and no memory-mapped weights
(``LLAMA_LOAD_MODE_NONE``) and read as ``llama_get_memory_breakdown``, with the compute buffers of
the pp graph only: what ``ggml_backend_sched_reserve_size`` reports. That call resets the scheduler
before splitting, so the backends ``llama_context::graph_get_cb`` pinned while the graph was built
(``norm`` on its layer's device, the merged heads on the CPU with ``-nkvo``) do not hold there.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from toolkit.memory import (
    Breakdown,
    DeviceMemory,
    breakdown_table,
    context_breakdown,
    devices_breakdown,
    strip_budget,
)
from toolkit.models.cparams import ContextParams
from toolkit.models.hparams import HParams


@dataclass(frozen=True)
class ProbeParams:
    """The model and context parameters one probe is created with."""

    n_ctx: int
    n_gpu_layers: int                      # llama.cpp's encoding: -1 auto (every layer)
    tensor_split: tuple[float, ...] | None
    tensor_overrides: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Probe:
    """``common_get_device_memory_data_impl``: one no-alloc context and its memory per device."""

    params: ProbeParams
    breakdown: Breakdown
    compute_bytes: tuple[tuple[str, int], ...]     # per backend buft (pp reserve only unless exact)
    context_bytes: tuple[tuple[str, int], ...]     # the context's memory (KV, ...) per buffer
    n_copies: int
    table: tuple[str, ...]                         # common_memory_breakdown_print lines

    def used(self, i: int) -> int:
        return self.breakdown.used(i)

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_ctx": self.params.n_ctx, "n_gpu_layers": self.params.n_gpu_layers,
            "tensor_split": list(self.params.tensor_split) if self.params.tensor_split else None,
            "tensor_overrides": [list(x) for x in self.params.tensor_overrides],
            "devices": [{"model": r.model, "context": r.context, "compute": r.compute} for r in self.breakdown.devices],
            "host": {"model": self.breakdown.host.model, "context": self.breakdown.host.context,
                     "compute": self.breakdown.host.compute},
            "compute_buffer": [{"buft": b, "bytes": n} for b, n in self.compute_bytes],
            "context": [{"buft": b, "bytes": n} for b, n in self.context_bytes], "n_copies": self.n_copies,
        }


def default_split(cp: ContextParams, memory: Sequence[DeviceMemory]) -> tuple[float, ...] | None:
    """``llama_model::load_tensors``: without a user split, layers are split by each device's free memory."""
    if cp.tensor_split is not None and any(cp.tensor_split):
        return cp.tensor_split
    if len(memory) < 2:
        return cp.tensor_split
    return tuple(float(m.free) for m in memory)


def real_context(hp: HParams, cp: ContextParams, memory: Sequence[DeviceMemory]) -> tuple[Any, Any, str]:
    """A context as a real program gets it: ``(unlimited, limited, error)``.

    ``unlimited`` is planned without memory limits (what ``no_alloc`` sees). When its compute
    buffers exceed what a device has left after its weights and KV cache, the context is planned
    again with that rest as the device's compute budget, so llama.cpp's retry without pipeline
    parallelism happens as in a real run (``limited``); ``error`` says why no context could be made.
    RPC servers are not limited (the oracle's servers only report a size).
    """
    from toolkit.context import Context  # the context layer sits above models
    base = cp.replace(devices=tuple(strip_budget(s) for s in cp.devices), tensor_split=default_split(cp, memory))
    ctx = Context(hp, base)
    bd, _ = context_breakdown(ctx, exact=True)
    specs = list(base.devices)
    kinds = [s.partition(":")[0].lower() for s in specs]
    gpu_specs = [i for i, k in enumerate(kinds) if k not in ("cpu", "blas")]
    over = False
    for j, i in enumerate(gpu_specs[:len(memory)]):
        if kinds[i] == "rpc" or j >= len(bd.devices):
            continue
        rest = memory[j].free - bd.devices[j].model - bd.devices[j].context
        if bd.devices[j].compute > rest:
            over = True
        specs[i] = f"{kinds[i]}:{max(rest, 0)}"
    if not over:
        return ctx, ctx, ""
    try:
        return ctx, Context(hp, base.replace(devices=tuple(specs))), ""
    except ValueError as e:
        return ctx, None, str(e)


# the newest probes by (id(hparams), cparams, memory, exact); each entry holds its HParams, so the id stays its own
_PROBES: OrderedDict[tuple[int, ContextParams, tuple[DeviceMemory, ...], bool], tuple[HParams, Probe]] = OrderedDict()
PROBES_KEPT = 64


def probe(hp: HParams, cp: ContextParams, memory: Sequence[DeviceMemory], *, exact: bool = False) -> Probe:
    """One ``common_get_device_memory_data_impl``: plan ``cp`` with no memory-mapped weights.

    ``exact`` reads the buffers a real context allocates instead: the full reserve sequence
    (pp → tg → pp), with the retry without pipeline parallelism when a device runs out of memory.

    A probe is a function of its arguments (frozen data), so the last :data:`PROBES_KEPT` answers are
    kept: fitting measures some parameters twice (the chosen ones again after the search, and once
    more for the real run's estimate), and a what-if over the same model repeats most of them.
    """
    key = (id(hp), cp, tuple(memory), exact)
    hit = _PROBES.get(key)
    if hit is not None and hit[0] is hp:
        _PROBES.move_to_end(key)
        return hit[1]
    p = _probe(hp, cp, memory, exact=exact)
    _PROBES[key] = (hp, p)
    while len(_PROBES) > PROBES_KEPT:
        _PROBES.popitem(last=False)
    return p


def _probe(hp: HParams, cp: ContextParams, memory: Sequence[DeviceMemory], *, exact: bool) -> Probe:
    from toolkit.context import Context  # the context layer sits above models
    pcp = cp.replace(use_mmap=False, devices=tuple(strip_budget(s) for s in cp.devices),
                     tensor_split=default_split(cp, memory))
    params = ProbeParams(cp.n_ctx, cp.n_gpu_layers, cp.tensor_split)
    if exact:
        unlimited, ctx, _ = real_context(hp, pcp, memory)
        ctx = ctx if ctx is not None else unlimited   # out of memory: the unlimited need, above the free memory
        bd, comp = context_breakdown(ctx, exact=True)
        return Probe(params, bd, comp, tuple(ctx.events[-1].context_memory().items()), ctx.n_copies,
                     tuple(breakdown_table(bd, memory)))
    # the no_alloc context as memory fitting reads it: model and memory placed, the pp graph sized
    ctx = Context(hp, pcp, no_alloc=True, reserve=False)
    compute = ctx.reserve_size()
    context: dict[str, int] = {}
    for bufs in ctx.setup.memory.groups.values():
        for name, n in bufs.items():
            context[name] = context.get(name, 0) + n
    bd = devices_breakdown(ctx.setup.devices, ctx.model_buffers_bytes, context, compute)
    return Probe(params, bd, tuple(compute.items()), tuple(context.items()), ctx.n_copies,
                 tuple(breakdown_table(bd, memory)))


__all__ = ["PROBES_KEPT", "Probe", "ProbeParams", "default_split", "probe", "real_context"]
