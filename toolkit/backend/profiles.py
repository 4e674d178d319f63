"""Factories for the device kinds ggml schedules (CPU, CUDA, Metal, BLAS, RPC, ...); each returns a :class:`Backend`.

Every call makes fresh :class:`BufferType` objects (identity matters: ``ggml_gallocr_new_n`` shares an
allocator only between identical buft objects): place a backend's weights with ``Buffer(backend.buft, ...)``
of *that* backend. Pass an existing buft (``buft=``/``host_buft=``) to share one.
"""

from __future__ import annotations

from collections.abc import Iterable

from toolkit.backend.buft import BufferType
from toolkit.backend.device import Backend, DeviceProfile
from toolkit.ggml.tensor import VIEW_OPS, Op

TENSOR_ALIGNMENT = 32  # CPU and pinned-host buft alignment (ggml's TENSOR_ALIGNMENT)
CUDA_ALIGNMENT = 128   # CUDA device buft alignment (ggml_backend_cuda_buffer_type_get_alignment)


def cpu_buft(name: str = "CPU", alloc_limit: int | None = None) -> BufferType:
    """The CPU buffer type: alignment 32, host memory."""
    return BufferType(name, TENSOR_ALIGNMENT, None, True, alloc_limit)


def cpu(buft: BufferType | None = None, *, excluded_ops: Iterable[Op | str] = (), name: str = "CPU",
        executor: object | None = None) -> Backend:
    """The CPU backend (must be last in a scheduler). ``buft`` may be a GPU's pinned host buft
    (``gpu.host_buft``), as llama.cpp uses for the CPU compute buffer when a GPU is present."""
    own = cpu_buft() if buft is None else buft
    prof = DeviceProfile(name, "cpu", own, excluded_ops=excluded_ops, reads_host=True,
                         description="CPU: runs every op, reads any host buffer")
    return Backend(name, prof, own, executor)


def _gpu(
    name: str, *, alignment: int, host_name: str | None, host_buft: BufferType | None,
    max_size: int | None, alloc_limit: int | None, min_batch: int | None,
    excluded_ops: Iterable[Op | str], offload_rule: str, pad: bool, index: int,
    executor: object | None, description: str, async_events: bool = True,
) -> Backend:
    buft = BufferType(name, alignment, max_size, False, alloc_limit, pad_quantized_rows=pad)
    if host_buft is None and host_name is not None:
        host_buft = BufferType(host_name, TENSOR_ALIGNMENT, None, True)
    prof = DeviceProfile(
        name, "gpu", buft, host_buft=host_buft, excluded_ops=excluded_ops,
        offload_rule=offload_rule,  # type: ignore[arg-type]
        min_batch=min_batch, caps_async=async_events, caps_events=async_events, description=description,
    )
    return Backend(name, prof, buft, executor, index)


def cuda_like(
    i: int = 0, *, alignment: int = CUDA_ALIGNMENT, max_size: int | None = None, alloc_limit: int | None = None,
    min_batch: int | None = None, excluded_ops: Iterable[Op | str] = (), host_buft: BufferType | None = None,
    pad_quantized_rows: bool = True, executor: object | None = None,
) -> Backend:
    """``CUDA<i>``: align 128, pinned host buft ``CUDA_Host`` (align 32), offload_op by batch size
    (min batch 32 or ``GGML_OP_OFFLOAD_MIN_BATCH``), async + events, quantized-row padding
    (``ggml_backend_cuda_buffer_type_get_alloc_size``)."""
    return _gpu(f"CUDA{i}", alignment=alignment, host_name="CUDA_Host", host_buft=host_buft, max_size=max_size,
                alloc_limit=alloc_limit, min_batch=min_batch, excluded_ops=excluded_ops, offload_rule="cuda",
                pad=pad_quantized_rows, index=i, executor=executor, description="CUDA-like GPU")


def metal_like(
    i: int = 0, *, alignment: int = TENSOR_ALIGNMENT, max_size: int | None = None, alloc_limit: int | None = None,
    min_batch: int | None = None, excluded_ops: Iterable[Op | str] = (), executor: object | None = None,
) -> Backend:
    """``MTL<i>``: offloads only MUL_MAT (by ne[1]) and MUL_MAT_ID (by ne[2]); no host buft."""
    return _gpu(f"MTL{i}", alignment=alignment, host_name=None, host_buft=None, max_size=max_size,
                alloc_limit=alloc_limit, min_batch=min_batch, excluded_ops=excluded_ops, offload_rule="metal",
                pad=False, index=i, executor=executor, description="Metal-like GPU")


def rpc_like(
    i: int = 0, endpoint: str = "127.0.0.1:50052", *, alignment: int = TENSOR_ALIGNMENT,
    max_size: int | None = None, alloc_limit: int | None = None, excluded_ops: Iterable[Op | str] = (),
    executor: object | None = None,
) -> Backend:
    """``RPC<i>[host:port]``: a remote CPU seen as a GPU device (oracle logs): buft of the same name,
    no offload_op, no async, no events, no host buft. ``i`` is the device index on the server."""
    return _gpu(f"RPC{i}[{endpoint}]", alignment=alignment, host_name=None, host_buft=None, max_size=max_size,
                alloc_limit=alloc_limit, min_batch=None, excluded_ops=excluded_ops, offload_rule="none",
                pad=False, index=i, executor=executor, description=f"RPC server at {endpoint}",
                async_events=False)


def blas_like(cpu_backend: Backend | BufferType | None = None, *, name: str = "BLAS",
              executor: object | None = None) -> Backend:
    """``BLAS``: an accelerator that runs only MUL_MAT (plus NONE and the view ops, which ggml-blas
    also accepts) and shares the CPU's buft (``ggml_backend_sched_split_graph`` pass 3 upgrades CPU nodes to
    it). Reads any host buffer."""
    if isinstance(cpu_backend, Backend):
        buft = cpu_backend.buft
    elif isinstance(cpu_backend, BufferType):
        buft = cpu_backend
    else:
        buft = cpu_buft()
    ops = {Op.MUL_MAT, Op.NONE, *VIEW_OPS}
    prof = DeviceProfile(name, "accel", buft, supported_ops=ops, reads_host=True,
                         description="BLAS-like accelerator (MUL_MAT only)")
    return Backend(name, prof, buft, executor)


def tpu(
    i: int = 0, *, alignment: int = CUDA_ALIGNMENT, max_size: int | None = None, alloc_limit: int | None = None,
    min_batch: int | None = None, excluded_ops: Iterable[Op | str] = (), executor: object | None = None,
) -> Backend:
    """``TPU<i>``: a JAX TPU core planned like a CUDA-like device (align 128, offload by batch),
    without a pinned host buft (not a ggml backend: llama.cpp has none for TPUs)."""
    return _gpu(f"TPU{i}", alignment=alignment, host_name=None, host_buft=None, max_size=max_size,
                alloc_limit=alloc_limit, min_batch=min_batch, excluded_ops=excluded_ops, offload_rule="cuda",
                pad=False, index=i, executor=executor, description="TPU core")


def simulated(
    i: int = 0, budget: int | None = None, *, alignment: int = CUDA_ALIGNMENT, max_size: int | None = None,
    min_batch: int | None = None, excluded_ops: Iterable[Op | str] = (), with_host_buft: bool = True,
    executor: object | None = None,
) -> Backend:
    """``SIM<i>``: a simulated accelerator behaving like CUDA (align 128, offload by batch, async +
    events, pinned host buft ``SIM_Host``); ``budget`` caps its compute buffers (alloc_limit)."""
    return _gpu(f"SIM{i}", alignment=alignment, host_name="SIM_Host" if with_host_buft else None, host_buft=None,
                max_size=max_size, alloc_limit=budget, min_batch=min_batch, excluded_ops=excluded_ops,
                offload_rule="cuda", pad=False, index=i, executor=executor, description="simulated accelerator")
