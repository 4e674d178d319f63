"""The one device grammar, and backends ordered as ``llama_context`` orders them.

A device spec (``ContextParams.devices``) names one model device: ``rpc:HOST:PORT`` (an RPC
server), ``rpc:N`` (N servers on 127.0.0.1:50052, 50053, …), ``cuda``, ``sim``, ``metal``,
``tpu`` (each optionally ``:BUDGET``, a compute-buffer memory budget such as ``512M``), or
``blas`` (an ACCEL device). The CPU is always the last backend (``llama_context``'s
constructor adds it after the GPU and ACCEL devices).

A picker spec is the short form the dashboard, the traced context and ``toolkit run`` take:
``cpu``, ``rpc:N``, ``sim:N`` or ``cuda:N`` (``auto`` where the runtime may pick JAX's own
devices); :meth:`DeviceSpec.cparams_devices` turns it into device specs.

>>> ds = make_devices(("rpc:2",))
>>> [b.name for b in ds.backends], ds.llama_names
(['RPC0[127.0.0.1:50052]', 'RPC0[127.0.0.1:50053]', 'CPU'], ['RPC0', 'RPC1', 'CPU'])
>>> parse_picker("sim:2", 512).cparams_devices()
('sim:536870912', 'sim:536870912')
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from toolkit import validate
from toolkit.backend import Backend, BufferType, profiles
from toolkit.errors import ParameterError

RPC_BASE_PORT = 50052
KNOWN_KINDS = ("rpc", "cuda", "sim", "metal", "tpu", "blas", "cpu")
PICKER_KINDS = ("cpu", "rpc", "sim", "cuda")
MAX_DEVICES = 16  # GGML_SCHED_MAX_BACKENDS: the CPU included, so at most 15 model devices in practice
_PICKER = re.compile(r"^\s*(cpu|rpc|sim|cuda|auto)\s*(?::\s*(\d+))?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class DeviceSpec:
    """A parsed picker spec: ``kind`` (cpu, rpc, sim, cuda or auto), ``count`` model devices."""

    kind: str
    count: int
    budget_mib: float | None = None

    def __str__(self) -> str:
        base = self.kind if self.kind in ("cpu", "auto") else f"{self.kind}:{self.count}"
        return base + (f" ({self.budget_mib:g} MiB each)" if self.budget_mib else "")

    def cparams_devices(self) -> tuple[str, ...]:
        """``ContextParams.devices``: ``("sim:512M", "sim:512M")``, ``("rpc:2",)``, ``()`` for cpu."""
        if self.kind == "auto":
            raise ParameterError("devices", "auto", "cpu, rpc:N, sim:N or cuda:N",
                                 "auto picks JAX's devices: only the runtime resolves it")
        if self.kind == "cpu":
            return ()
        if self.kind == "rpc":
            return (f"rpc:{self.count}",)
        budget = f":{int(self.budget_mib * 1024 * 1024)}" if self.budget_mib else ""
        return tuple(f"{self.kind}{budget}" for _ in range(self.count))


def parse_picker(spec: str, budget_mib: float | None = None, *, allow_auto: bool = False) -> DeviceSpec:
    """``"sim:2"`` -> DeviceSpec("sim", 2); errors name the bad value and what is accepted."""
    m = _PICKER.match(spec or "")
    accepted = "cpu, rpc:N, sim:N or cuda:N" + (" or auto" if allow_auto else "")
    if m is None or (m.group(1).lower() == "auto" and (not allow_auto or m.group(2))):
        raise ParameterError("devices", spec, accepted, "not understood")
    kind = m.group(1).lower()
    count = 0 if kind in ("cpu", "auto") else int(m.group(2) or 1)
    if kind not in ("cpu", "auto") and not 1 <= count <= MAX_DEVICES:
        raise ParameterError("devices", spec, f"N in 1..{MAX_DEVICES}", f"N={count} must be in 1..{MAX_DEVICES}")
    if budget_mib is not None:
        # a budget is a byte count in the end (sim:BYTES): at most 2**40 MiB, one exbibyte
        budget_mib = validate.real("budget_mib", budget_mib, lo=0.0, hi=float(2**40))
        if 0 < budget_mib * 2**20 < 1:
            raise ParameterError("budget_mib", budget_mib, "0 (unlimited) or at least one byte (2**-20 MiB)")
    if budget_mib and kind in ("cpu", "rpc", "auto"):
        raise ParameterError("budget_mib", budget_mib, "a budget for sim:N or cuda:N devices",
                             f"a memory budget applies to sim:N or cuda:N devices, not {spec!r}")
    return DeviceSpec(kind, count, budget_mib or None)


def describe_picker(devices: Sequence[str]) -> tuple[str, float | None]:
    """The picker's (spec, budget MiB) for ``ContextParams.devices`` (the inverse of cparams_devices)."""
    if not devices:
        return "cpu", None
    if len(devices) == 1 and re.fullmatch(r"rpc:\d+", devices[0]):
        return devices[0], None
    kinds = {d.partition(":")[0] for d in devices}
    args = {d.partition(":")[2] for d in devices}
    if len(kinds) == 1 and len(args) == 1 and kinds <= {"sim", "cuda"}:
        arg = args.pop()
        if arg == "" or arg.isdigit():
            return f"{kinds.pop()}:{len(devices)}", (int(arg) / (1024 * 1024) if arg else None)
    return ",".join(devices), None


def parse_bytes(text: str) -> int:
    """``"512M"`` → 536870912; plain digits are bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", text.lower())
    if not m:
        raise ParameterError("budget", text, "a byte count such as 4096, 64M or 2G")
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
            raise ParameterError("devices", spec, f"a device of a known kind: {', '.join(KNOWN_KINDS)}",
                                 f"unknown device {spec!r}; known kinds: {', '.join(KNOWN_KINDS)}")
        if kind == "rpc" and arg.isdigit():
            n = int(arg)
            if n < 1:
                raise ParameterError("devices", spec, "rpc:N with N >= 1 RPC servers")
            out += [("rpc", f"127.0.0.1:{RPC_BASE_PORT + i}") for i in range(n)]
        elif kind == "rpc" and not arg:
            out.append(("rpc", f"127.0.0.1:{RPC_BASE_PORT}"))
        else:
            out.append((kind, arg))
    return out


def cpu_repack_buft() -> BufferType:
    """ggml-cpu's extra buft for repacked quantized weights (``CPU_REPACK``, not a host buft)."""
    return BufferType("CPU_REPACK", 32, None, False)


def make_devices(specs: Sequence[str], *, split_mode: str = "layer", main_gpu: int = 0) -> DeviceSet:
    """Create the backends for ``specs``; with split mode ``none`` only ``main_gpu`` is a model device."""
    cpu_buft = profiles.cpu_buft()
    repack = cpu_repack_buft()
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
                raise ParameterError("devices", f"rpc:{arg}", "an RPC endpoint HOST:PORT")
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
            raise ParameterError("main_gpu", main_gpu, f"a device index in 0..{len(gpus) - 1}")
        gpus, names = [gpus[main_gpu]], [names[main_gpu]]
    # llama_context's constructor: with a model device, the CPU backend computes in devices[0]'s host buft
    # (e.g. pinned memory)
    host = gpus[0].host_buft if gpus else None
    cpu = profiles.cpu(host if host is not None else cpu_buft)
    # the CPU device reads its own buft and its extra (repack) buft, as ggml-cpu's supports_buft does
    cpu.profile.readable_bufts = (*cpu.profile.readable_bufts, cpu_buft, repack)
    return DeviceSet(gpus, accels, cpu, cpu_buft, repack, names)
