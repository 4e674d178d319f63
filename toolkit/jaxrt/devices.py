"""Scheduler backends from JAX devices: accelerators first, CPU last (llama.cpp's order; ggml_backend_sched_new
requires the CPU backend last).

- a JAX GPU becomes a CUDA-like backend (``CUDA<i>``), a TPU core a ``TPU<i>`` backend;
- ``sim:N`` adds N *simulated* accelerators: extra JAX CPU devices with the simulated
  accelerator profile (``SIM<i>``, CUDA-like rules, optional memory budget), so splits, copies
  and op offload run for real on a laptop or in CI without anyone mistaking them for GPUs;
- the CPU backend is always last and runs on the local CPU device.

Devices come from ``jax.devices()``, which under a multi-process JAX runtime lists every
process's devices: they are just more backends (keyed by platform, id and process index).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import jax

from toolkit.backend import Backend, profiles
from toolkit.errors import ParameterError
from toolkit.models.devices import parse_picker

GPU_PLATFORMS = ("gpu", "cuda", "rocm")
RUNTIME_KINDS = ("cpu", "sim", "auto")


def _backends_initialized() -> bool:
    try:
        from jax._src import xla_bridge  # lazy: jax's internal module, only asked here

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):  # another jax layout: assume started (the safe answer)
        return True


def request_cpu_devices(n: int) -> bool:
    """Ask JAX for at least ``n`` CPU devices without starting its backends (call before first use).

    Returns False when JAX has already started (the count can no longer change)."""
    if _backends_initialized():
        return False
    current = int(os.environ.get("JAX_NUM_CPU_DEVICES", "0") or 0)
    try:
        current = max(current, int(jax.config.jax_num_cpu_devices))  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001
        pass
    if current < n:
        jax.config.update("jax_num_cpu_devices", n)
    return True


def configure_cpu_devices(n: int) -> int:
    """:func:`request_cpu_devices`, then check: returns the number of CPU devices available,
    or raises ValueError naming the count when JAX already started with fewer."""
    request_cpu_devices(n)
    have = len(jax.local_devices(backend="cpu"))
    if have < n:
        raise ValueError(
            f"{n} CPU devices are needed (simulated accelerators + CPU) but JAX started with {have}; "
            f"set JAX_NUM_CPU_DEVICES={n} (or call request_cpu_devices({n})) before JAX is first used"
        )
    return have


def extra_cpu_device(i: int) -> Any:
    """CPU device 1 + i for a simulated accelerator; when JAX started with too few CPU devices,
    share one (with a warning): splits and copies stay the same, only the memory is shared."""
    cpus = jax.local_devices(backend="cpu")
    if 1 + i < len(cpus):
        return cpus[1 + i]
    warnings.warn(f"JAX has {len(cpus)} CPU device(s): simulated accelerator {i} shares one; set "
                  f"JAX_NUM_CPU_DEVICES={i + 2} before JAX starts for separate devices", stacklevel=3)
    return cpus[1 + i % (len(cpus) - 1)] if len(cpus) > 1 else cpus[0]


def parse_devices(spec: str) -> tuple[str, int]:
    """``cpu`` | ``sim:N`` | ``auto`` -> (kind, n_sim), in the picker grammar of ``toolkit.models.devices``."""
    d = parse_picker(spec, allow_auto=True)
    if d.kind not in RUNTIME_KINDS:
        raise ParameterError("devices", spec, "cpu, sim:N or auto", "the runtime makes these itself")
    return d.kind, d.count


def make_backends(spec: str = "auto", *, budget: int | None = None, min_batch: int | None = None) -> list[Backend]:
    """Backends for a device spec, accelerators first and CPU last, each bound to its JAX device.

    ``auto``: every JAX GPU/TPU device, then CPU. ``cpu``: CPU only. ``sim:N``: N simulated
    accelerators (budget = compute-buffer bytes each may hold) on CPU devices 1..N, then CPU."""
    kind, n_sim = parse_devices(spec)
    out: list[Backend] = []
    if kind == "sim":
        request_cpu_devices(n_sim + 1)
    cpu_devs = jax.local_devices(backend="cpu")
    if kind == "auto":
        gpus = [d for d in jax.devices() if d.platform in GPU_PLATFORMS]
        tpus = [d for d in jax.devices() if d.platform == "tpu"]
        out += [profiles.cuda_like(i, executor=d, min_batch=min_batch) for i, d in enumerate(gpus)]
        out += [profiles.tpu(i, executor=d, min_batch=min_batch) for i, d in enumerate(tpus)]
    elif kind == "sim":
        out += [profiles.simulated(i, budget, executor=extra_cpu_device(i), min_batch=min_batch)
                for i in range(n_sim)]
    host = out[0].host_buft if out and out[0].host_buft is not None else None
    # llama.cpp puts the CPU compute buffer in the first GPU's pinned host buft when there is one
    out.append(profiles.cpu(host, executor=cpu_devs[0]))
    return out


def describe(backends: list[Backend]) -> str:
    lines = []
    for i, b in enumerate(backends):
        dev: Any = b.executor
        where = f"{dev.platform}:{dev.id} (process {getattr(dev, 'process_index', 0)})" if dev is not None else "-"
        lines.append(f"{i}: {b.name:<10s} {b.kind:<5s} buft={b.buft.name:<10s} device={where}")
    return "\n".join(lines)
