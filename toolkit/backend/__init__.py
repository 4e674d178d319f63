"""Buffer types, device profiles and backends (no JAX needed to describe one).

``BufferType`` and ``Buffer`` (:mod:`toolkit.backend.buft`)::

    BufferType(name, alignment=32, max_size=None, is_host=False, alloc_limit=None, *, pad_quantized_rows=False)
        .alloc_size(t) -> int        # nbytes; + CUDA's quantized-row padding when pad_quantized_rows
        .get_max_size() -> int       # SIZE_MAX when max_size is None
        .alloc_buffer(size, usage=COMPUTE, name="") -> Buffer | None   # None past alloc_limit
        .in_use / .available         # compute bytes handed out / left under alloc_limit
    Buffer(buft, size, usage=BufferUsage.ANY, name="")   # t.buffer = Buffer(...) places a tensor
        .free()                                           # returns a compute buffer's bytes to the budget

``DeviceProfile`` and ``Backend`` (:mod:`toolkit.backend.device`)::

    DeviceProfile(name, kind, buft, *, host_buft=None, supported_ops=None, excluded_ops=(), reads_host=False,
                  readable_bufts=(), offload_rule="none"|"cuda"|"metal", min_batch=None, caps_async=False,
                  caps_events=False, op_filter=None, description="")
        .supports_op(t) / .supports_buft(buft) / .offload_op(t) / .without_ops(*ops) / .default_buft
    Backend(name, profile, buft=None, executor=None, index=None)
        .supports_op(t) / .supports_buft(buft) / .offload_op(t) / .without_ops(*ops)
        .kind ('cpu'|'gpu'|'accel'), .is_cpu, .caps_async, .caps_events, .host_buft, .buft, .executor

Factories (:mod:`toolkit.backend.profiles`), each returning a fresh ``Backend``::

    profiles.cpu(buft=None, *, excluded_ops=(), name="CPU", executor=None)            # align 32, host
    profiles.cuda_like(i=0, *, alignment=128, max_size=None, alloc_limit=None, min_batch=None,
                       excluded_ops=(), host_buft=None, pad_quantized_rows=True, executor=None)  # "CUDA<i>"
    profiles.metal_like(i=0, *, alignment=32, max_size=None, alloc_limit=None, min_batch=None,
                        excluded_ops=(), executor=None)                                # "MTL<i>"
    profiles.rpc_like(i=0, endpoint="127.0.0.1:50052", *, alignment=32, max_size=None, alloc_limit=None,
                      excluded_ops=(), executor=None)                                  # "RPC<i>[host:port]"
    profiles.blas_like(cpu_backend=None, *, name="BLAS", executor=None)               # shares the CPU buft
    profiles.tpu(i=0, *, alignment=128, max_size=None, alloc_limit=None, min_batch=None, excluded_ops=(),
                 executor=None)                                                        # "TPU<i>"
    profiles.simulated(i=0, budget=None, *, alignment=128, max_size=None, min_batch=None, excluded_ops=(),
                       with_host_buft=True, executor=None)                             # "SIM<i>", "SIM_Host"
    profiles.cpu_buft(name="CPU", alloc_limit=None) -> BufferType

``min_batch=None`` reads ``GGML_OP_OFFLOAD_MIN_BATCH`` (default 32) when the backend is made, as
ggml reads it at registration (PR #18535). ``excluded_ops`` takes ``Op`` members or op_desc names
("SQR", "SILU"); it is how a GPU that lacks SQR is built (the scheduler then
splits GPU / CPU / GPU around the SQR):

>>> from toolkit.backend import profiles
>>> gpu = profiles.cuda_like(0, excluded_ops=["SQR"]); cpu = profiles.cpu(gpu.host_buft)
>>> gpu.name, gpu.buft.alignment, cpu.buft.name, gpu.host_buft is cpu.buft
('CUDA0', 128, 'CUDA_Host', True)
"""

from __future__ import annotations

from toolkit.backend import profiles
from toolkit.backend.buft import SIZE_MAX, Buffer, BufferType
from toolkit.backend.device import Backend, DeviceProfile, cuda_batch_size, op_offload_min_batch

__all__ = [
    "SIZE_MAX", "Backend", "Buffer", "BufferType", "DeviceProfile", "cuda_batch_size", "op_offload_min_batch",
    "profiles",
]
