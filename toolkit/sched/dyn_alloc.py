"""The dynamic tensor allocator (``ggml_dyn_tallocr``): a pure offset planner with chunks.

Each chunk keeps a free-block list sorted by offset and a high-water mark. The
visit order and tie-breaks below decide every byte of a compute buffer.
"""

from __future__ import annotations

SIZE_MAX = (1 << 64) - 1
GGML_VBUFFER_MAX_CHUNKS = 16
MAX_FREE_BLOCKS = 256
_INT64_MIN = -(1 << 63)


class AllocatorAbort(RuntimeError):
    """ggml aborts here (a 257th free block, or no chunk left); the message names the limit."""


def align_up(size: int, alignment: int) -> int:
    """``aligned_offset(NULL, size, alignment)``: round up to a multiple of alignment."""
    return size + (-size) % alignment


class Chunk:
    __slots__ = ("offsets", "sizes", "max_size")

    def __init__(self, size: int) -> None:
        # two parallel lists keep the hot loops cheap; sorted by offset, as ggml keeps free_blocks
        self.offsets: list[int] = [0]
        self.sizes: list[int] = [size]
        self.max_size = 0

    def blocks(self) -> list[tuple[int, int]]:
        return list(zip(self.offsets, self.sizes, strict=True))


class DynAllocator:
    """``ggml_dyn_tallocr``: ``alloc(size) -> (chunk, offset)``, ``free((chunk, offset), size)``.

    >>> a = DynAllocator(32)
    >>> a.alloc(100), a.alloc(64), a.max_size()
    ((0, 0), (0, 128), 192)
    """

    def __init__(self, alignment: int, max_size: int = SIZE_MAX) -> None:
        self.alignment = alignment
        # ggml_dyn_tallocr_new: max_chunk_size = min(buft max size, SIZE_MAX/2)
        self.max_chunk_size = min(max_size, SIZE_MAX // 2)
        self.chunks: list[Chunk] = []

    def reset(self) -> None:
        self.chunks = []

    @property
    def n_chunks(self) -> int:
        return len(self.chunks)

    def _new_chunk(self, min_size: int) -> int:
        if len(self.chunks) >= GGML_VBUFFER_MAX_CHUNKS:
            return -1
        size = max(min_size, self.max_chunk_size)
        # the 16th chunk is effectively unbounded so that the plan always succeeds
        if len(self.chunks) == GGML_VBUFFER_MAX_CHUNKS - 1:
            size = SIZE_MAX // 2
        self.chunks.append(Chunk(size))
        return len(self.chunks) - 1

    def alloc(self, size: int) -> tuple[int, int]:
        size = size + (-size) % self.alignment
        best_chunk = -1
        best_block = -1
        # 1. best fit over every chunk's blocks except the last one; best_size resets per
        #    chunk, so a later chunk's fitting block overrides an earlier chunk's better one (as
        #    ggml_dyn_tallocr_alloc does), ties go to the later block
        for c, chunk in enumerate(self.chunks):
            best_size = SIZE_MAX
            sizes = chunk.sizes
            for i in range(len(sizes) - 1):
                bs = sizes[i]
                if bs >= size and bs <= best_size:
                    best_chunk = c
                    best_block = i
                    best_size = bs
        # 2. the last blocks, by signed reuse score (prefer no growth, then least growth)
        if best_block == -1:
            best_reuse = _INT64_MIN
            for c, chunk in enumerate(self.chunks):
                n = len(chunk.sizes)
                if n == 0:
                    continue
                boff = chunk.offsets[n - 1]
                reuse = chunk.max_size - boff - size
                better_reuse = best_reuse < 0 and reuse > best_reuse
                better_fit = reuse >= 0 and reuse < best_reuse
                if chunk.sizes[n - 1] >= size and (better_reuse or better_fit):
                    best_chunk = c
                    best_block = n - 1
                    best_reuse = reuse
        # 3. a new chunk
        if best_block == -1:
            best_chunk = self._new_chunk(size)
            best_block = 0
            if best_chunk == -1:
                raise AllocatorAbort(
                    f"graph allocation: failed to reserve {size} bytes: all {GGML_VBUFFER_MAX_CHUNKS} chunks are in use"
                )
        chunk = self.chunks[best_chunk]
        offset = chunk.offsets[best_block]
        chunk.offsets[best_block] = offset + size
        chunk.sizes[best_block] -= size
        if chunk.sizes[best_block] == 0:
            del chunk.offsets[best_block]
            del chunk.sizes[best_block]
        if offset + size > chunk.max_size:
            chunk.max_size = offset + size
        return best_chunk, offset

    def free(self, addr: tuple[int, int], size: int) -> None:
        size = size + (-size) % self.alignment
        c, offset = addr
        chunk = self.chunks[c]
        offs = chunk.offsets
        sizes = chunk.sizes
        n = len(offs)
        for i in range(n):
            # the freed range follows block i: extend it, then merge with the next block
            if offs[i] + sizes[i] == offset:
                sizes[i] += size
                if i < n - 1 and offs[i] + sizes[i] == offs[i + 1]:
                    sizes[i] += sizes[i + 1]
                    del offs[i + 1]
                    del sizes[i + 1]
                return
            # the freed range precedes block i: move its start back (the merge-with-previous
            # check in ggml cannot fire, the case above catches it first)
            if offset + size == offs[i]:
                offs[i] = offset
                sizes[i] += size
                return
        if n >= MAX_FREE_BLOCKS:
            raise AllocatorAbort(f"ggml_dyn_tallocr: too many free blocks (limit MAX_FREE_BLOCKS={MAX_FREE_BLOCKS})")
        # insert at the sorted position
        pos = n
        for i in range(n):
            if offs[i] > offset:
                pos = i
                break
        offs.insert(pos, offset)
        sizes.insert(pos, size)

    def chunk_max_size(self, c: int) -> int:
        return self.chunks[c].max_size if c < len(self.chunks) else 0

    def max_size(self) -> int:
        """Sum over chunks of each chunk's high-water mark (the compute buffer size)."""
        return sum(ch.max_size for ch in self.chunks)

    def chunk_sizes(self) -> tuple[int, ...]:
        return tuple(ch.max_size for ch in self.chunks)
