"""``llama_memory_recurrent``: the per-sequence states of a hybrid's recurrent layers.

Per recurrent layer (the filter of ``llama_memory_hybrid``) a convolution state ``cache_r_l<il>``
``[n_embd_r, mem_size * (1 + n_rs_seq)]`` and an SSM state ``cache_s_l<il>``
``[n_embd_s, mem_size * (1 + n_rs_seq)]``, both F32 (``create_memory`` passes ``GGML_TYPE_F32``), with
``mem_size = max(1, n_seq_max)``: one row per sequence, whatever the context. Each layer's pair sits on
the layer's device when the KV cache is offloaded (``offload_kqv``), else on the CPU; the buffers are
made per buffer type in the order of their names (the constructor's ``std::map`` keyed by
``ggml_backend_buft_name``) and printed as ``RS buffer size`` lines, the counterpart of the KV lines.

Per ubatch, :meth:`RecurrentMemory.find_slot` is ``llama_memory_recurrent::find_slot``: each sequence owns
one cell (its ``tail``), a new sequence gets the next empty cell from ``head``, the ubatch's cells are made
contiguous (swapped to ``min..``), and ``rs_z`` names the one cell the graph clears (``build_rs``'
``ggml_scale_inplace`` by 0) for every sequence that starts from an empty state. Without rollback slots
(``n_rs_seq`` 0) a sequence's state cannot lose its last tokens: :meth:`RecurrentMemory.seq_rm` of a part
of a sequence refuses, as llama.cpp's returns false.

>>> m = RecurrentMemory([], [], (), mem_size=2, n_seq_max=2, n_layer=1, n_embd_r=1, n_embd_s=1,
...                     buffers_bytes={}, layer_devices=[])
>>> m.find_slot([1], [4]), m.s_copy()       # (head, n, rs_z): sequence 1 starts in cell 0, cleared
((0, 1, 0), [0])
>>> m.end_ubatch(); m.find_slot([1], [5]), m.s_copy()   # it goes on from its own state
((0, 1, -1), [0])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from toolkit.backend import Buffer, BufferType
from toolkit.errors import ParameterError
from toolkit.ggml.tensor import BufferUsage, Tensor
from toolkit.ggml.types import F32
from toolkit.models.loader import LoadedModel

MIB = 2**20
_POS_MAX = 2**31 - 1   # std::numeric_limits<llama_pos>::max()
# the memory group of the recurrent state's buffers (events, figures, compare, breakdown, fit)
GROUP_RS = "RS"


def rs_buffer_line(name: str, nbytes: int) -> str:
    """``llama_memory_recurrent``'s buffer line (``%10s RS buffer size = %8.2f MiB``), with the exact bytes."""
    return f"llama_memory_recurrent: {name:>10s} RS buffer size = {nbytes / MIB:8.2f} MiB ({nbytes} bytes)"


@dataclass
class RSCell:
    """``llama_memory_recurrent::mem_cell``: the last position, where the state is copied from (``src``,
    ``src0`` for the inputs), the cell of the sequence with this index (``tail``), the sequences here."""

    pos: int = -1
    src: int = -1
    src0: int = -1
    tail: int = -1
    seq_id: set[int] = field(default_factory=set)

    def is_empty(self) -> bool:
        return not self.seq_id


@dataclass(eq=False)
class RecurrentMemory:
    """The R and S tensors of the recurrent layers (``layers``, in order), their buffers and sizes.

    ``mem_size`` rows per tensor and sequence slot (``n_rs_seq`` more slots for rollback); for a graph,
    :attr:`head`, :attr:`n_rs` and :attr:`rs_z` are those of ``llama_memory_recurrent_context``: a
    reserve (``init_full``, no :attr:`slot`) sees every cell from 0 and clears cell 0; a ubatch sees the
    slot :meth:`find_slot` found, until :meth:`end_ubatch`."""

    r: list[Tensor]
    s: list[Tensor]
    layers: tuple[int, ...]
    mem_size: int
    n_seq_max: int
    n_layer: int
    n_embd_r: int
    n_embd_s: int
    buffers_bytes: dict[str, int]
    layer_devices: list[tuple[int, str]]
    n_rs_seq: int = 0
    group: str = GROUP_RS
    cells: list[RSCell] = field(default_factory=list)
    # (head, n, rs_z) of the ubatch being run; None: the reserve's view (init_full)
    slot: tuple[int, int, int] | None = None
    # llama_memory_recurrent::head (where the search for an empty cell starts) and used
    _head: int = field(default=0, init=False, repr=False)
    _used: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.cells:
            self.cells = [RSCell() for _ in range(self.mem_size)]

    # ---- what a graph sees (llama_memory_recurrent_context) ------------------------------------
    @property
    def head(self) -> int:
        return 0 if self.slot is None else self.slot[0]

    @property
    def n_rs(self) -> int:
        return self.mem_size if self.slot is None else self.slot[1]

    @property
    def rs_z(self) -> int:
        return 0 if self.slot is None else self.slot[2]

    def s_copy(self) -> list[int]:
        """``llama_memory_recurrent_context::s_copy(i)`` for i in 0..n_rs (``n_rs_seq`` 0): the cell each
        state is read from; in a reserve's view each cell's own."""
        if self.slot is None:
            return list(range(self.mem_size))
        return [self.cells[self.head + i].src0 for i in range(self.n_rs)]

    # ---- cells (llama_memory_recurrent) --------------------------------------------------------
    def find_slot(self, seqs: Sequence[int], last_pos: Sequence[int]) -> tuple[int, int, int]:
        """``llama_memory_recurrent::find_slot`` for a ubatch of ``len(seqs)`` sequence sets, one sequence
        each (``seqs[s]``, its last position ``last_pos[s]``): each gets its own cell, contiguous from the
        returned head. Returns and holds the slot ``(head, n, rs_z)``."""
        cells, size = self.cells, self.mem_size
        n_seqs = len(seqs)
        for seq_id in seqs:
            if not 0 <= seq_id < size:
                raise ParameterError("seq_id", seq_id, f"0 <= seq_id < n_seq_max ({self.n_seq_max})",
                                     "llama_memory_recurrent::find_slot: try a bigger --parallel")
        if self._head > self._used + 2 * n_seqs:
            self._head = 0
        nxt = self._head
        for _ in range(size):
            if nxt >= size:
                nxt -= size
            if cells[nxt].is_empty():
                break
            nxt += 1
        lo, hi = size - 1, 0
        for s, seq_id in enumerate(seqs):
            meta = cells[seq_id]
            has_cell = meta.tail >= 0 and len(cells[meta.tail].seq_id) == 1
            if not has_cell:
                empty = cells[nxt]
                if meta.tail >= 0:   # copy the old tail, shared with another sequence, into the empty cell
                    orig = cells[meta.tail]
                    empty.pos, empty.src = orig.pos, orig.src
                    orig.seq_id.discard(seq_id)
                    empty.seq_id.add(seq_id)
                meta.tail = nxt
                if s + 1 < n_seqs:
                    for _ in range(size):
                        nxt += 1
                        if nxt >= size:
                            nxt -= size
                        if cells[nxt].is_empty():
                            break
            lo, hi = min(lo, meta.tail), max(hi, meta.tail)
        for s, seq_id in enumerate(seqs):   # gather and re-order
            dst, src = s + lo, cells[seq_id].tail
            if dst != src:
                a, b = cells[dst], cells[src]
                a.pos, b.pos = b.pos, a.pos
                a.src, b.src = b.src, a.src
                a.seq_id, b.seq_id = b.seq_id, a.seq_id
                for c in cells:
                    if c.tail == src:
                        c.tail = dst
                    elif c.tail == dst:
                        c.tail = src
        for s, seq_id in enumerate(seqs):
            cell = cells[s + lo]
            cell.pos = int(last_pos[s])
            cell.seq_id = {seq_id}
            cells[seq_id].tail = s + lo
        refs = [0] * size
        for c in cells:
            if c.src >= 0:
                refs[c.src] += 1
        rs_z = next((i for i in range(lo, hi + 1) if refs[i] == 0), -1)
        for i in range(lo, hi + 1):
            c = cells[i]
            if c.src < 0:
                assert rs_z >= 0
                c.src0 = rs_z
            else:
                c.src0 = c.src
            c.src = i
        self._head = lo
        self._used = sum(not c.is_empty() for c in cells)
        self.slot = (lo, hi - lo + 1, rs_z)
        return self.slot

    def end_ubatch(self) -> None:
        """The ubatch's graph ran: later graphs (a reserve) see every cell again."""
        self.slot = None

    def seq_pos_max(self, seq_id: int) -> int:
        """``llama_memory_recurrent::seq_pos_max``: the largest position of the cells that hold seq_id."""
        return max((c.pos for c in self.cells if seq_id in c.seq_id), default=-1)

    def can_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Whether :meth:`seq_rm` would succeed: a part at a sequence's end cannot be removed without
        rollback slots (``n_rs_seq`` 0), nor a negative seq_id's range other than all or nothing."""
        p0 = max(p0, 0)
        p1 = p1 if p1 >= 0 else _POS_MAX
        if seq_id >= self.mem_size:
            return False
        if seq_id >= 0:
            tail = self.cells[seq_id].tail
            if tail >= 0:
                pos = self.cells[tail].pos
                if 0 < p0 <= pos < p1:
                    rollback = pos - (p0 - 1)
                    return 1 <= rollback <= self.n_rs_seq
            return True
        return p0 == p1 or (p0 == 0 and p1 == _POS_MAX)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """``llama_memory_recurrent::seq_rm`` (``n_rs_seq`` 0): False, and nothing changed, when
        :meth:`can_rm` says no; else the cells of seq_id (every sequence: -1) with a position in [p0, p1)
        are freed."""
        if not self.can_rm(seq_id, p0, p1):
            return False
        p0 = max(p0, 0)
        p1 = p1 if p1 >= 0 else _POS_MAX
        new_head = self.mem_size
        if seq_id >= 0:
            tail = self.cells[seq_id].tail
            if tail >= 0 and p0 <= self.cells[tail].pos < p1:
                self.cells[seq_id].tail = -1
        for i, c in enumerate(self.cells):
            if not p0 <= c.pos < p1:
                continue
            if seq_id < 0:
                c.seq_id.clear()
            elif seq_id in c.seq_id:
                c.seq_id.discard(seq_id)
            else:
                continue
            if c.is_empty():
                if c.pos >= 0:
                    self._used -= 1
                c.pos, c.src = -1, -1
                if new_head == self.mem_size:
                    new_head = i
        if new_head != self.mem_size and new_head < self._head:
            self._head = new_head
        return True

    def clear(self) -> None:
        """``llama_memory_recurrent::clear``: every cell free (the states' bytes stay; a new sequence's
        state is cleared by its graph)."""
        self.cells = [RSCell() for _ in range(self.mem_size)]
        self._head = self._used = 0
        self.slot = None

    def holds(self, il: int) -> bool:
        return il in self.layers

    def r_of(self, il: int) -> Tensor:
        return self.r[self.layers.index(il)]

    def s_of(self, il: int) -> Tensor:
        return self.s[self.layers.index(il)]

    @property
    def tensors(self) -> list[Tensor]:
        return [*self.r, *self.s]

    @property
    def size_r_bytes(self) -> int:
        return sum(t.nbytes for t in self.r)

    @property
    def size_s_bytes(self) -> int:
        return sum(t.nbytes for t in self.s)

    @property
    def total_bytes(self) -> int:
        return sum(self.buffers_bytes.values())

    def log_lines(self) -> list[str]:
        """The buffer lines, then the size line of ``llama_memory_recurrent``'s constructor."""
        r, s = self.size_r_bytes, self.size_s_bytes
        return [*(rs_buffer_line(n, b) for n, b in self.buffers_bytes.items()),
                f"llama_memory_recurrent: size = {(r + s) / MIB:7.2f} MiB ({self.mem_size:6d} cells, "
                f"{self.n_layer:3d} layers, {self.n_seq_max:2d} seqs {self.n_rs_seq:2d} rs_seq), "
                f"R (f32): {r / MIB:7.2f} MiB, S (f32): {s / MIB:7.2f} MiB"]

    def info(self) -> dict[str, object]:
        """The sizes as the oracle's ``ORACLE rs`` line names them."""
        return {"size_r_bytes": self.size_r_bytes, "size_s_bytes": self.size_s_bytes, "cells": self.mem_size,
                "layers": self.n_layer, "n_seq_max": self.n_seq_max, "n_rs_seq": self.n_rs_seq,
                "type_r": "f32", "type_s": "f32", "n_embd_r": self.n_embd_r, "n_embd_s": self.n_embd_s}


def make_recurrent_memory(model: LoadedModel, n_seq_max: int, *, offload: bool, layers: list[int],
                          n_rs_seq: int = 0) -> RecurrentMemory:
    """``llama_memory_recurrent(model, F32, F32, offload, max(1, n_seq_max), n_seq_max, n_rs_seq, filter)``."""
    hp = model.hparams
    devs = model.devices
    mem_size = max(1, n_seq_max)
    n_rows = mem_size * (1 + n_rs_seq)
    rs: list[Tensor] = []
    ss: list[Tensor] = []
    sizes: dict[str, int] = {}
    bufts: dict[str, BufferType] = {}
    names: list[str] = []
    where: list[tuple[int, str]] = []
    for il in layers:
        d = model.layer_dev[il]
        buft = devs.gpus[d].buft if (offload and d >= 0) else devs.cpu_buft
        bufts[buft.name] = buft
        names.append(buft.name)
        where.append((il, model.layer_device_name(il) if offload else "CPU"))
        r = Tensor(F32, (hp.n_embd_r(), n_rows), name=f"cache_r_l{il}")
        s = Tensor(F32, (hp.n_embd_s(), n_rows), name=f"cache_s_l{il}")
        for t in (r, s):
            n = buft.alloc_size(t)
            sizes[buft.name] = sizes.get(buft.name, 0) + -(-n // buft.alignment) * buft.alignment
        rs.append(r)
        ss.append(s)
    ordered = {n: sizes[n] for n in sorted(sizes)}   # std::map by ggml_backend_buft_name
    buffers = {n: Buffer(bufts[n], b, BufferUsage.ANY, n) for n, b in ordered.items()}
    for r, s, name in zip(rs, ss, names):
        r.buffer = s.buffer = buffers[name]
    return RecurrentMemory(rs, ss, tuple(layers), mem_size, n_seq_max, hp.n_layer, hp.n_embd_r(), hp.n_embd_s(),
                           ordered, where, n_rs_seq)
