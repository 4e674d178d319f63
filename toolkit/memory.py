"""Memory per device the way llama.cpp reports it: ``llama_get_memory_breakdown`` and its table.

:func:`breakdown` sorts a context's buffers into model / context (its memory: KV) / compute bytes per buffer
type (``llama_context::memory_breakdown``) and groups them into one row per model device plus a
``Host`` row (``common_get_device_memory_data_impl``: host buffer types are summed into the last
slot). :func:`breakdown_table` prints ``common_memory_breakdown_print``'s table, text for text.

The output buffer (logits) is not part of the breakdown, as in llama.cpp.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolkit.args import LlamaArgs
from toolkit.errors import ParameterError
from toolkit.models.devices import DeviceSet, make_devices, parse_bytes

MiB = 1 << 20
# common_memory_breakdown_print strips these from device descriptions
DESC_PREFIXES_STRIP = ("NVIDIA ", "GeForce ", "Tesla ", "AMD ", "Radeon ", "Instinct ")


@dataclass(frozen=True)
class MemoryRow:
    """``llama_memory_breakdown_data``: bytes of weights, of the KV cache and of compute buffers."""

    model: int = 0
    context: int = 0
    compute: int = 0

    @property
    def total(self) -> int:
        """``self`` in the table: model + context + compute."""
        return self.model + self.context + self.compute

    def __add__(self, o: MemoryRow) -> MemoryRow:
        return MemoryRow(self.model + o.model, self.context + o.context, self.compute + o.compute)

    def mib(self) -> tuple[int, int, int]:
        return self.model // MiB, self.context // MiB, self.compute // MiB


@dataclass(frozen=True)
class DeviceMemory:
    """A model device as ``ggml_backend_dev_memory`` reports it: name, description, free, total bytes."""

    name: str
    description: str
    free: int
    total: int


@dataclass(frozen=True)
class Breakdown:
    """One context's memory: a row per model device (in device order), the host row, other bufts."""

    devices: tuple[MemoryRow, ...]
    host: MemoryRow
    others: tuple[tuple[str, MemoryRow], ...] = ()
    by_buft: tuple[tuple[str, MemoryRow], ...] = ()

    def used(self, i: int) -> int:
        return self.devices[i].total


def breakdown(model: Mapping[str, int], context: Mapping[str, int], compute: Mapping[str, int],
              device_bufts: Sequence[str], host_bufts: Sequence[str]) -> Breakdown:
    """Group per-buft bytes (by buffer type name) into device rows, the host row and the rest.

    ``device_bufts[i]`` is the buft of model device i; a buft named in ``host_bufts`` is a host
    buffer type (``ggml_backend_buft_is_host``); anything else (e.g. ``CPU_REPACK``) gets its own row.
    """
    names = list(dict.fromkeys([*model, *context, *compute]))
    by = {n: MemoryRow(model.get(n, 0), context.get(n, 0), compute.get(n, 0)) for n in names}
    devs = [MemoryRow() for _ in device_bufts]
    host = MemoryRow()
    others: list[tuple[str, MemoryRow]] = []
    for n, row in by.items():
        if n in host_bufts:
            host = host + row
        elif n in device_bufts:
            i = list(device_bufts).index(n)
            devs[i] = devs[i] + row
        else:
            others.append((n, row))
    return Breakdown(tuple(devs), host, tuple(others), tuple(by.items()))


def breakdown_table(bd: Breakdown, devices: Sequence[DeviceMemory]) -> list[str]:
    """``common_memory_breakdown_print``'s lines (without the function-name prefix).

    Every column is an integer MiB division; ``unaccounted = total - free - self`` is signed and
    divided toward zero, as C++ does.
    """
    rows: list[tuple[str, list[str]]] = [
        ("header", ["memory breakdown [MiB]", "total", "free", "self", "model", "context", "compute", "unaccounted"])]
    for dm, mb in zip(devices, bd.devices):
        desc = dm.description
        for p in DESC_PREFIXES_STRIP:
            if desc.startswith(p):
                desc = desc[len(p):]
        unacc = dm.total - dm.free - mb.total
        unacc_mib = -((-unacc) // MiB) if unacc < 0 else unacc // MiB
        rows.append(("gpu", [f"  - {dm.name} ({desc})", str(dm.total // MiB), str(dm.free // MiB),
                             str(mb.total // MiB), *map(str, mb.mib()), str(unacc_mib)]))
    rows.append(("other", ["  - Host", "", "", str(bd.host.total // MiB), *map(str, bd.host.mib()), ""]))
    for name, mb in bd.others:
        rows.append(("other", [f"  - {name}", "", "", str(mb.total // MiB), *map(str, mb.mib()), ""]))
    for j in range(8):
        w = max(len(r[1][j]) for r in rows)
        for _, cells in rows:
            cells[j] = cells[j].ljust(w) if j == 0 else cells[j].rjust(w)
    out = []
    for kind, c in rows:
        if kind == "header":
            out.append(f"| {c[0]} | {c[1]}   {c[2]}    {c[3]}   {c[4]}   {c[5]}   {c[6]}    {c[7]} |")
        elif kind == "gpu":
            out.append(f"| {c[0]} | {c[1]} = {c[2]} + ({c[3]} = {c[4]} + {c[5]} + {c[6]}) + {c[7]} |")
        else:
            out.append(f"| {c[0]} | {c[1]}   {c[2]}    {c[3]} = {c[4]} + {c[5]} + {c[6]}    {c[7]} |")
    return out


def strip_budget(spec: str) -> str:
    """A device spec without its memory budget (a probe never fails an allocation)."""
    kind, _, arg = spec.partition(":")
    return spec if kind.lower() == "rpc" else kind


def device_memory(args: LlamaArgs, memory: Sequence[int] | Sequence[tuple[int, int]] | None = None
                  ) -> list[DeviceMemory]:
    """Free/total memory of the model devices: ``memory`` (bytes, or (free, total) pairs) when given,
    else each device string's budget (``sim:24G``, ``cuda:24G``). An RPC server has no budget in its
    string: give its memory explicitly (``--device-memory``)."""
    cp = args.context_params()
    ds = make_devices(tuple(strip_budget(s) for s in cp.devices), split_mode=cp.split_mode, main_gpu=cp.main_gpu)
    specs = list(_expanded(cp.devices))
    if cp.split_mode == "none" and specs:
        specs = [specs[cp.main_gpu]]
    out: list[DeviceMemory] = []
    for i, (name, be) in enumerate(zip(ds.gpu_names, ds.gpus)):
        kind, arg = specs[i]
        desc = arg if kind == "rpc" else be.profile.description
        if memory is None and args.device_memory:
            memory = list(args.device_memory)
        if memory is not None and i < len(memory):
            m = memory[i]
            free, total = (m, m) if isinstance(m, int) else (int(m[0]), int(m[1]))
        elif kind != "rpc" and arg:
            free = total = parse_bytes(arg)
        else:
            raise ParameterError("--device-memory", None, f"the free memory of {name} ({desc}): a device string "
                                 "with a size such as cuda:24G, or --device-memory BYTES[,BYTES...]")
        out.append(DeviceMemory(name, desc, free, total))
    return out


def _expanded(specs: Sequence[str]) -> list[tuple[str, str]]:
    from toolkit.models.devices import RPC_BASE_PORT
    out: list[tuple[str, str]] = []
    for s in specs:
        kind, _, arg = s.partition(":")
        kind = kind.lower()
        if kind in ("cpu", "blas"):
            continue
        if kind == "rpc" and arg.isdigit():
            out += [("rpc", f"127.0.0.1:{RPC_BASE_PORT + i}") for i in range(int(arg))]
        elif kind == "rpc" and not arg:
            out.append(("rpc", f"127.0.0.1:{RPC_BASE_PORT}"))
        else:
            out.append((kind, arg))
    return out


def context_breakdown(ctx: Any, *, exact: bool = False) -> tuple[Breakdown, tuple[tuple[str, int], ...]]:
    """A context's ``llama_get_memory_breakdown`` rows from its newest reserve event: the context
    column sums the event's memory groups (``llama_memory_i::memory_breakdown``: KV, KV-SWA, ...),
    compute is what the graph reserved last (pp) needs alone (``backend_buf_exp_size`` under
    ``no_alloc``) or, with ``exact``, the allocated buffers."""
    ev = ctx.events[-1]
    compute: dict[str, int] = {}
    for b in ev.buffers:
        compute[b.buft] = compute.get(b.buft, 0) + (b.allocated if exact else b.needed[ev.last_graph])
    return devices_breakdown(ctx.setup.devices, ctx.model_buffers_bytes, ev.context_memory(), compute), \
        tuple(compute.items())


def devices_breakdown(devs: DeviceSet, model: Mapping[str, int], context: Mapping[str, int],
                      compute: Mapping[str, int]) -> Breakdown:
    """:func:`breakdown` over a context's devices (a :class:`~toolkit.models.devices.DeviceSet`): a row
    per model device, the host buffer types (the CPU's, ``CPU_Mapped``, the GPUs' host bufts) summed."""
    host = {devs.cpu_buft.name, devs.cpu.buft.name, "CPU_Mapped"}
    host |= {g.host_buft.name for g in devs.gpus if g.host_buft is not None}
    host |= {a.buft.name for a in devs.accels if a.buft.is_host}
    return breakdown(model, context, compute, [g.buft.name for g in devs.gpus], sorted(host))


__all__ = ["Breakdown", "DeviceMemory", "MemoryRow", "MiB", "breakdown", "breakdown_table", "context_breakdown",
           "device_memory", "devices_breakdown", "strip_budget"]
