"""Host metadata of ``ggml_backend_sched_new``: hash capacity, graph overhead, context buffer."""

from __future__ import annotations

# ggml_hash_size's table: the next primes after powers of two
HASH_PRIMES = (
    2, 3, 5, 11, 17, 37, 67, 131, 257, 521, 1031, 2053, 4099, 8209, 16411, 32771, 65537, 131101, 262147,
    524309, 1048583, 2097169, 4194319, 8388617, 16777259, 33554467, 67108879, 134217757, 268435459,
    536870923, 1073741827, 2147483659,
)
GGML_SCHED_MAX_BACKENDS = 16
GGML_SCHED_MAX_SPLIT_INPUTS = 30
GGML_SCHED_MAX_COPIES = 4
GGML_MEM_ALIGN = 16
GGML_OBJECT_SIZE = 32
SIZEOF_TENSOR = 336
SIZEOF_CGRAPH = 96
TENSOR_OVERHEAD = GGML_OBJECT_SIZE + SIZEOF_TENSOR  # ggml_tensor_overhead() = 368


def hash_size(min_sz: int) -> int:
    """``ggml_hash_size``: the smallest table prime >= min_sz, else ``min_sz | 1``."""
    lo, hi = 0, len(HASH_PRIMES)
    while lo < hi:
        mid = (lo + hi) // 2
        if HASH_PRIMES[mid] < min_sz:
            lo = mid + 1
        else:
            hi = mid
    return HASH_PRIMES[lo] if lo < len(HASH_PRIMES) else min_sz | 1


def _incr_aligned(p: int, size: int, align: int) -> int:
    return p + (-p) % align + size


def graph_nbytes(n: int) -> int:
    """``ggml_graph_nbytes(n, grads=false)``: cgraph, nodes, leafs, use counts, hash keys, bitset."""
    h = hash_size(2 * n)
    p = _incr_aligned(0, SIZEOF_CGRAPH, 1)
    p = _incr_aligned(p, 8 * n, 8)
    p = _incr_aligned(p, 8 * n, 8)
    p = _incr_aligned(p, 4 * h, 4)
    p = _incr_aligned(p, 8 * h, 8)
    p = _incr_aligned(p, 4 * ((h + 31) // 32), 4)
    return p


def graph_overhead(n: int) -> int:
    """``ggml_graph_overhead_custom(n, false)`` = 32 + pad16(graph_nbytes(n))."""
    nb = graph_nbytes(n)
    return GGML_OBJECT_SIZE + nb + (-nb) % GGML_MEM_ALIGN


def context_buffer_size(max_nodes: int) -> int:
    """The scheduler's context buffer for copies and dependency views: ``ggml_backend_sched_new``
    sizes it for ``GGML_SCHED_MAX_SPLIT_INPUTS`` copies per node, plus one graph."""
    return max_nodes * GGML_SCHED_MAX_SPLIT_INPUTS * 2 * SIZEOF_TENSOR + graph_overhead(max_nodes)


def host_metadata_breakdown(max_nodes: int, n_backends: int, n_copies: int) -> dict[str, int]:
    """The large host allocations of ``ggml_backend_sched_new``, in bytes."""
    g = max_nodes
    h = hash_size(g)
    id_len = g + g * GGML_SCHED_MAX_SPLIT_INPUTS * 2
    return {
        "hash_set": 8 * h + 4 * ((h + 31) // 32),
        "hv_tensor_backend_ids": 4 * h,
        "hv_tensor_copies": 8 * h * n_backends * n_copies,
        "backend_id_arrays": 4 * 4 * id_len,
        "context_buffer": context_buffer_size(g),
    }


def host_metadata_bytes(max_nodes: int, n_backends: int = 2, n_copies: int = 1) -> int:
    """Total host metadata a new scheduler allocates (what reusing one saves)."""
    return sum(host_metadata_breakdown(max_nodes, n_backends, n_copies).values())
