"""Backends from device specs, ordered as llama_context's constructor orders them (model devices, ACCEL, CPU).

A spec names one model device: ``rpc:HOST:PORT`` (an RPC server), ``rpc:N`` (N servers on
127.0.0.1:50052, 50053, …), ``cuda``, ``sim``, ``metal``, ``tpu`` (each optionally
``:BUDGET``, a compute-buffer memory budget such as ``512M``), or ``blas`` (an ACCEL
device). The CPU is always the last backend.

>>> ds = make_devices(("rpc:2",))
>>> [b.name for b in ds.backends], ds.llama_names
(['RPC0[127.0.0.1:50052]', 'RPC0[127.0.0.1:50053]', 'CPU'], ['RPC0', 'RPC1', 'CPU'])
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from toolkit.backend import Backend, BufferType, profiles

RPC_BASE_PORT = 50052
KNOWN_KINDS = ("rpc", "cuda", "sim", "metal", "tpu", "blas", "cpu")


def parse_bytes(text: str) -> int:
    """``"512M"`` → 536870912; plain digits are bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", text.lower())
    if not m:
        raise ValueError(f"memory budget {text!r} is not a byte count such as 4096, 64M or 2G")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2)]
    return int(float(m.group(1)) * scale)


@dataclass
class DeviceSet:
    """The model devices (GPU-like, in order), the ACCEL backends and the CPU backend."""

    gpus: list[Backend]
    accels: list[Backend]
    cpu: Backend
    cpu_buft: BufferType          # the CPU device's own buft (weights, BLAS, CPU-only compute)
    repack_buft: BufferType       # CPU_REPACK: repacked quantized weights (not host, so never op-offloaded)
    gpu_names: list[str]          # llama's device names: RPC0, RPC1, CUDA0, …

    @property
    def backends(self) -> list[Backend]:
        return [*self.gpus, *self.accels, self.cpu]

    @property
    def llama_names(self) -> list[str]:
        return [*self.gpu_names, *[a.name for a in self.accels], "CPU"]


def _expand(specs: Sequence[str]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for raw in specs:
        spec = str(raw).strip()
        kind, _, arg = spec.partition(":")
        kind = kind.lower()
        if kind not in KNOWN_KINDS:
            raise ValueError(f"unknown device {spec!r}; known kinds: {', '.join(KNOWN_KINDS)}")
        if kind == "rpc" and arg.isdigit():
            n = int(arg)
            if n < 1:
                raise ValueError(f"device {spec!r}: the number of RPC servers must be >= 1")
            out += [("rpc", f"127.0.0.1:{RPC_BASE_PORT + i}") for i in range(n)]
        elif kind == "rpc" and not arg:
            out.append(("rpc", f"127.0.0.1:{RPC_BASE_PORT}"))
        else:
            out.append((kind, arg))
    return out


def make_devices(specs: Sequence[str], *, split_mode: str = "layer", main_gpu: int = 0) -> DeviceSet:
    """Create the backends for ``specs``; with split mode ``none`` only ``main_gpu`` is a model device."""
    cpu_buft = profiles.cpu_buft()
    repack = BufferType("CPU_REPACK", 32, None, False)
    gpus: list[Backend] = []
    names: list[str] = []
    accels: list[Backend] = []
    counts: dict[str, int] = {}
    for kind, arg in _expand(specs):
        if kind == "cpu":
            continue
        if kind == "blas":
            accels.append(profiles.blas_like(cpu_buft))
            continue
        i = counts.get(kind, 0)
        counts[kind] = i + 1
        if kind == "rpc":
            if not re.fullmatch(r"[\w.\-]+:\d+", arg):
                raise ValueError(f"RPC endpoint {arg!r} is not HOST:PORT")
            # the remote device index is 0 on every server, so every RPC buft is RPC0[host:port]
            gpus.append(profiles.rpc_like(0, arg))
            names.append(f"RPC{i}")
            continue
        budget = parse_bytes(arg) if arg else None
        if kind == "cuda":
            b = profiles.cuda_like(i, alloc_limit=budget)
        elif kind == "sim":
            b = profiles.simulated(i, budget)
        elif kind == "metal":
            b = profiles.metal_like(i, alloc_limit=budget)
        else:
            b = profiles.tpu(i, alloc_limit=budget)
        gpus.append(b)
        names.append(b.name)
    if split_mode == "none" and gpus:
        if not 0 <= main_gpu < len(gpus):
            raise ValueError(f"main_gpu={main_gpu} is out of range for {len(gpus)} device(s)")
        gpus, names = [gpus[main_gpu]], [names[main_gpu]]
    # llama_context's constructor: with a model device, the CPU backend computes in devices[0]'s host buft
    # (e.g. pinned memory)
    host = gpus[0].host_buft if gpus else None
    cpu = profiles.cpu(host if host is not None else cpu_buft)
    # the CPU device reads its own buft and its extra (repack) buft, as ggml-cpu's supports_buft does
    cpu.profile.readable_bufts = (*cpu.profile.readable_bufts, cpu_buft, repack)
    return DeviceSet(gpus, accels, cpu, cpu_buft, repack, names)
