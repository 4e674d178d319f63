"""The host's memory, as ggml's CPU device reports it, and the limit planning checks against.

``ggml_backend_cpu_device_get_memory`` reports the machine's physical memory (``sysconf``
pages × page size); :func:`physical_memory` does the same. A plan that needs more host memory
than the limit — scheduler metadata for a huge ``max_nodes``, or CPU buffers for a huge
``n_ctx`` — would fail to allocate in llama.cpp, so :func:`check_host_bytes` refuses it with
the byte count instead of reporting it as if it were real.

>>> check_host_bytes("scheduler host metadata", 2**20, limit=2**30)
>>> check_host_bytes("CPU buffers", 3 * 2**30, limit=2**30)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
toolkit.errors.AllocationError: CPU buffers need 3221225472 bytes (3072.00 MiB), more than ... (1024.00 MiB)
"""

from __future__ import annotations

import os

from toolkit.errors import AllocationError

_FALLBACK_BYTES = 16 * 2**30  # where sysconf cannot answer (not POSIX)


def physical_memory() -> int:
    """The machine's physical memory in bytes (``sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGE_SIZE)``)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return _FALLBACK_BYTES


def check_host_bytes(what: str, nbytes: int, *, limit: int | None = None) -> None:
    """Refuse ``nbytes`` of host memory for ``what`` when it exceeds ``limit`` (default: physical memory)."""
    cap = physical_memory() if limit is None else limit
    if nbytes > cap:
        raise AllocationError(
            f"{what} need {nbytes} bytes ({nbytes / 2**20:.2f} MiB), more than the host memory limit of "
            f"{cap} bytes ({cap / 2**20:.2f} MiB)")
