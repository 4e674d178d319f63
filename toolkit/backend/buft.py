"""Buffer types and buffers (``ggml_backend_buffer_type`` / ``ggml_backend_buffer``).

A :class:`BufferType` is compared by identity: the scheduler and the graph allocator
share a dynamic allocator (and a buffer) between backends whose buft is the *same
object* (``ggml_gallocr_new_n`` compares buft pointers), so two bufts with equal fields are still two bufts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolkit.ggml.tensor import BufferUsage

if TYPE_CHECKING:
    from toolkit.ggml.tensor import Tensor

SIZE_MAX = (1 << 64) - 1
# CUDA pads quantized rows to a multiple of MATRIX_ROW_PADDING elements
# (ggml_backend_cuda_buffer_type_get_alloc_size)
MATRIX_ROW_PADDING = 512


class BufferType:
    """An allocator kind: name, alignment, max size, host flag and a memory budget.

    ``alloc_limit`` is how many bytes of compute buffers this buft may hand out at
    once (a device memory budget); ``None`` means unlimited. Compute buffers allocated
    through :meth:`alloc_buffer` count against it until freed, so a reserve that needs
    more fails the way ``ggml_backend_buft_alloc_buffer`` does on a full device.
    ``pad_quantized_rows`` gives CUDA's ``alloc_size`` (``ggml_backend_cuda_buffer_type_get_alloc_size``).
    """

    __slots__ = ("name", "alignment", "max_size", "is_host", "alloc_limit", "pad_quantized_rows", "in_use",
                 "__weakref__")

    def __init__(
        self,
        name: str,
        alignment: int = 32,
        max_size: int | None = None,
        is_host: bool = False,
        alloc_limit: int | None = None,
        *,
        pad_quantized_rows: bool = False,
    ) -> None:
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"buffer type {name!r}: alignment {alignment} is not a power of two")
        if max_size is not None and max_size <= 0:
            raise ValueError(f"buffer type {name!r}: max_size {max_size} must be positive")
        if alloc_limit is not None and alloc_limit < 0:
            raise ValueError(f"buffer type {name!r}: alloc_limit {alloc_limit} must be >= 0")
        self.name = name
        self.alignment = alignment
        self.max_size = max_size
        self.is_host = is_host
        self.alloc_limit = alloc_limit
        self.pad_quantized_rows = pad_quantized_rows
        self.in_use = 0  # bytes of live compute buffers handed out (for alloc_limit)

    # identity semantics (see module docstring)
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other

    def get_max_size(self) -> int:
        """``ggml_backend_buft_get_max_size``: SIZE_MAX when unbounded."""
        return SIZE_MAX if self.max_size is None else self.max_size

    def alloc_size(self, t: Tensor) -> int:
        """``ggml_backend_buft_get_alloc_size``: nbytes, plus CUDA's quantized-row padding.

        CUDA's FLASH_ATTN_EXT scratch depends on the kernel it picks and is not modelled.
        """
        size = t.nbytes
        if self.pad_quantized_rows and t.type.is_quantized:
            ne0 = t.ne[0]
            if ne0 % MATRIX_ROW_PADDING:
                size += t.type.row_size(MATRIX_ROW_PADDING - ne0 % MATRIX_ROW_PADDING)
        return size

    @property
    def available(self) -> int | None:
        """Bytes still available under ``alloc_limit`` (None: unlimited)."""
        return None if self.alloc_limit is None else max(self.alloc_limit - self.in_use, 0)

    def alloc_buffer(self, size: int, usage: BufferUsage = BufferUsage.COMPUTE, name: str = "") -> Buffer | None:
        """Allocate a buffer; None when it would exceed ``alloc_limit`` (ggml returns NULL)."""
        if self.alloc_limit is not None and self.in_use + size > self.alloc_limit:
            return None
        buf = Buffer(self, size, usage, name, counted=True)
        self.in_use += size
        return buf

    def __repr__(self) -> str:
        extra = "" if self.max_size is None else f", max_size={self.max_size}"
        extra += "" if self.alloc_limit is None else f", alloc_limit={self.alloc_limit}"
        return f"BufferType({self.name!r}, alignment={self.alignment}{extra}, is_host={self.is_host})"


class Buffer:
    """A backend buffer: ``t.buffer = Buffer(buft, size, BufferUsage.WEIGHTS)`` places a tensor.

    Buffers made directly (weights, KV cache) do not count against the buft's
    ``alloc_limit``; compute buffers made by :meth:`BufferType.alloc_buffer` do, until
    :meth:`free` (or garbage collection) returns them.
    """

    __slots__ = ("buft", "size", "usage", "name", "_counted", "_freed")

    def __init__(self, buft: BufferType, size: int, usage: BufferUsage = BufferUsage.ANY, name: str = "", *,
                 counted: bool = False) -> None:
        if size < 0:
            raise ValueError(f"buffer size {size} must be >= 0")
        self.buft = buft
        self.size = size
        self.usage = usage
        self.name = name or buft.name
        self._counted = counted  # made by BufferType.alloc_buffer: counts against its alloc_limit
        self._freed = False

    @property
    def is_host(self) -> bool:
        return self.buft.is_host

    def free(self) -> None:
        if self._counted and not self._freed:
            self.buft.in_use -= self.size
        self._freed = True

    def __del__(self) -> None:  # compute buffers return their budget when dropped
        try:
            self.free()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __repr__(self) -> str:
        return f"Buffer({self.buft.name!r}, size={self.size}, usage={self.usage.value})"
