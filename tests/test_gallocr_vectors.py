"""ggml-alloc's dynamic tensor allocator (``ggml_dyn_tallocr_alloc`` / ``ggml_dyn_tallocr_free_tensor``,
called directly) and a chunked ``ggml_gallocr`` buffer: offsets and chunks measured on the real C code."""

from __future__ import annotations

import pytest

from toolkit.backend import BufferType
from toolkit.ggml import F32, Graph, ops
from toolkit.sched import AllocatorAbort, DynAllocator, GraphAllocator
from toolkit.sched.dyn_alloc import MAX_FREE_BLOCKS, SIZE_MAX


def test_best_fit_tie_goes_to_later_block_and_merges() -> None:
    """Align 32, unlimited: two equal holes, the later one wins; freed neighbours merge."""
    a = DynAllocator(32)
    p, q, r, s, t = (a.alloc(n) for n in (100, 64, 100, 40, 100))
    assert [x[1] for x in (p, q, r, s, t)] == [0, 128, 192, 320, 384]
    assert a.max_size() == 512
    a.free(q, 64)
    a.free(s, 40)
    assert a.chunks[0].blocks()[:2] == [(128, 64), (320, 64)]
    assert a.alloc(50) == (0, 320)
    a.free(p, 100)
    assert a.chunks[0].blocks()[0] == (0, 192)
    assert a.alloc(60) == (0, 0)
    a.free(t, 100)
    assert a.chunks[0].blocks()[-1][0] == 384
    a.free(r, 100)
    assert a.chunks[0].blocks()[0] == (64, 256)


def test_later_chunk_overrides_exact_fit() -> None:
    """Align 8, chunks of 64: best fit restarts per chunk, so a later chunk's fitting block beats
    an exact fit in chunk 0; a 24-byte request that fits no hole opens chunk 2."""
    a = DynAllocator(8, 64)
    A, B, C, D = (a.alloc(n) for n in (8, 8, 8, 40))
    E, F, G, H = (a.alloc(n) for n in (32, 8, 16, 8))
    assert {x[0] for x in (A, B, C, D)} == {0} and {x[0] for x in (E, F, G, H)} == {1}
    for x, n in ((A, 8), (C, 8), (E, 32), (G, 16)):
        a.free(x, n)
    assert a.chunks[0].blocks() == [(0, 8), (16, 8)]
    assert a.chunks[1].blocks() == [(0, 32), (40, 16)]
    assert a.alloc(8) == (1, 0)
    assert a.alloc(8) == (1, 8)
    assert a.alloc(24) == (2, 0)
    assert a.chunk_sizes()[2] == 24 and a.chunks[2].blocks() == [(24, 40)]


def test_freed_hole_preferred() -> None:
    """Align 4, max 32: a freed hole is preferred to growing the chunk (max stays 28)."""
    a = DynAllocator(4, 32)
    x0 = a.alloc(24)
    assert a.alloc(4) == (0, 24)
    a.free(x0, 24)
    assert a.alloc(4) == (0, 0)
    assert a.max_size() == 28


def test_oversized_tensor_gets_its_own_chunk() -> None:
    """Align 8, max 16: a 24-byte tensor gets a chunk of its own size; later tensors open new chunks."""
    a = DynAllocator(8, 16)
    assert a.alloc(24) == (0, 0)
    assert a.chunk_sizes() == (24,)
    assert a.alloc(8) == (1, 0)
    assert a.alloc(16) == (2, 0)


def test_sixteenth_chunk_is_unbounded_and_no_seventeenth() -> None:
    a = DynAllocator(8, 8)
    for _ in range(15):
        a.alloc(8)
    assert a.alloc(8) == (15, 0)
    assert a.chunks[15].blocks()[-1][1] == SIZE_MAX // 2 - 8


def test_free_block_limit_aborts() -> None:
    a = DynAllocator(1)
    addrs = [a.alloc(1) for _ in range(2 * MAX_FREE_BLOCKS + 2)]
    with pytest.raises(AllocatorAbort, match="MAX_FREE_BLOCKS=256"):
        for addr in addrs[::2]:
            a.free(addr, 1)


def test_chunked_buffer_reuse_scores() -> None:
    """``ggml_gallocr`` on a buft of align 8, max size 32: ``x2 = concat(x0[4], x1[2])`` opens chunk 1,
    ``x3 = scale(x2)`` is in place, and ``x4 = mean(x3)`` goes back to chunk 0 by the last-block reuse
    score; total 48 (two chunks of 24)."""
    buft = BufferType("chunked", alignment=8, max_size=32, is_host=True)
    x0 = ops.new_tensor_1d(F32, 4, "x0")
    x1 = ops.new_tensor_1d(F32, 2, "x1")
    x2 = ops.concat(x0, x1, 0)
    x3 = ops.scale(x2, 2.0)
    x4 = ops.mean(x3)
    g = Graph(16)
    g.build_forward_expand(x4)
    ga = GraphAllocator([buft])
    assert ga.reserve_n(g.nodes, g.leafs)
    where = {life.tensor.name: (life.chunk, life.offset, life.inplace_of) for life in ga.lifetimes}
    assert where["x0"] == (0, 0, None) and where["x1"] == (0, 16, None)
    assert where[x2.name] == (1, 0, None)
    assert where[x3.name] == (1, 0, x2)
    assert where[x4.name] == (0, 0, None)
    assert ga.allocators[0].chunk_sizes() == (24, 24)
    assert ga.buffer_size(0) == 48
