"""Memory as llama.cpp creates it (``llama_model::create_memory``) and the cell bookkeeping it does per ubatch.

- :func:`create_memory` is the switch: one ``llama_kv_cache`` over every layer, or
  ``llama_kv_cache_iswa``'s two (the non-SWA cache, then the SWA cache of
  :func:`swa_cache_size` cells) for a model with sliding-window layers. It returns a
  :class:`Memory` holding its caches, the warnings logged while creating them and the log lines.
- :class:`KVCache` (``llama_kv_cache``): per layer a K and an optional V tensor
  (``cache_k_l<il>``/``cache_v_l<il>`` of ``[n_embd_gqa, kv_size, n_stream]``, on that layer's device
  or on the CPU with ``-nkvo``), its buffers, and per stream the cells (:class:`KVCells`,
  ``llama_kv_cells``): which position of which sequences each cell holds.
- Per ubatch (:class:`UBatch`, ``llama_ubatch``): ``find_slot`` picks a cell for every token
  (a free cell, or a cell the sliding window hides from every token still to come: the SWA
  ring), ``apply_ubatch`` writes the tokens there, and the graph inputs read the result:
  ``set_input_k_idxs``/``set_input_v_idxs`` (global write indices over the streams) and
  ``set_input_kq_mask``. All of it is numpy; no device is needed to test it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from toolkit.backend import Buffer, BufferType
from toolkit.errors import ParameterError, UnsupportedFeature
from toolkit.ggml import ops
from toolkit.ggml.tensor import BufferUsage, Tensor
from toolkit.ggml.types import GGMLType
from toolkit.models.cparams import ResolvedParams
from toolkit.models.hparams import HParams
from toolkit.models.loader import LoadedModel
from toolkit.models.memory_recurrent import RecurrentMemory, make_recurrent_memory

if TYPE_CHECKING:
    import numpy as np

I64 = GGMLType.I64
MIB = 2**20

# the SWA cache is padded to a multiple of this (llama_kv_cache_iswa)
SWA_CACHE_PAD = 256
SWA_FULL_WARNING = ("llama_kv_cache_iswa: using full-size SWA cache "
                    "(ref: https://github.com/ggml-org/llama.cpp/pull/13194#issuecomment-2868343055)")
# memory kinds create_memory builds (llama_model::create_memory's default branch: attention KV; a hybrid
# architecture's llama_memory_hybrid: a KV cache over the attention layers, a recurrent memory over the others)
MEMORY_KV, MEMORY_HYBRID = "kv", "hybrid"
MEMORY_KINDS = (MEMORY_KV, MEMORY_HYBRID)
# group labels of the memory's buffers
GROUP_KV, GROUP_KV_SWA = "KV", "KV-SWA"


def _pad(x: int, a: int) -> int:
    return -(-x // a) * a


# ---- the ubatch --------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class UBatch:
    """``llama_ubatch``: per token its id, position, sequence (one per token) and whether it outputs.

    With one KV stream per sequence, the tokens of a ubatch of several sequences come grouped by
    sequence, in the order of :attr:`seq_id_unq`, the same number of tokens each (``split_equal``).
    """

    tokens: np.ndarray      # int32 [n_tokens]
    pos: np.ndarray         # int32 [n_tokens]
    seq_id: np.ndarray      # int32 [n_tokens]
    output: np.ndarray      # bool [n_tokens]

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if n == 0:
            raise ParameterError("tokens", [], "at least one token")
        for name in ("pos", "seq_id", "output"):
            if len(getattr(self, name)) != n:
                raise ParameterError(name, len(getattr(self, name)), f"one value per token ({n})")

    @classmethod
    def of_sequence(cls, tokens: Sequence[int] | np.ndarray, pos0: int, seq_id: int = 0,
                    output: Sequence[bool] | np.ndarray | None = None) -> UBatch:
        """The tokens of one sequence at positions pos0, pos0 + 1, ...; every token outputs by default."""
        import numpy as np
        t = np.asarray(tokens, np.int32)
        n = len(t)
        out = np.ones(n, bool) if output is None else np.asarray(output, bool)
        return cls(t, np.arange(pos0, pos0 + n, dtype=np.int32), np.full(n, seq_id, np.int32), out)

    @classmethod
    def concat(cls, parts: Sequence[UBatch]) -> UBatch:
        """Several ubatches' tokens in one (the caller keeps llama_batch_allocr's grouping by sequence)."""
        import numpy as np
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("tokens", "pos", "seq_id", "output")))

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def seq_id_unq(self) -> tuple[int, ...]:
        """The distinct sequences, ascending (``llama_ubatch::seq_id_unq``)."""
        import numpy as np
        return tuple(int(s) for s in np.unique(self.seq_id))


@dataclass(frozen=True)
class SlotInfo:
    """``llama_kv_cache::slot_info``: the streams the ubatch writes (s0..s1) and, per stream of the
    ubatch, its stream and the cells of its tokens (in ubatch order)."""

    s0: int
    s1: int
    strm: tuple[int, ...]
    idxs: tuple[np.ndarray, ...]

    @property
    def n_stream(self) -> int:
        return len(self.strm)

    @property
    def size(self) -> int:
        """Tokens per stream."""
        return len(self.idxs[0])


# ---- the cells -----------------------------------------------------------------------------------

class KVCells:
    """``llama_kv_cells`` of one stream: the position each cell holds (-1: empty) and its sequences."""

    def __init__(self, size: int, n_seq_max: int) -> None:
        import numpy as np
        self.pos = np.full(size, -1, np.int64)
        self.seq = np.zeros((size, n_seq_max), bool)

    @property
    def size(self) -> int:
        return len(self.pos)

    @property
    def used(self) -> int:
        return int((self.pos >= 0).sum())

    def usable(self, n_swa: int) -> np.ndarray:
        """Per cell, whether ``find_slot`` may put a token there: empty, or held by one sequence and
        outside the window of that sequence's next position (``seq_pos_max + 1``)."""
        import numpy as np
        count = self.seq.sum(axis=1)
        owner = np.argmax(self.seq, axis=1)
        pmax = np.where(self.seq, self.pos[:, None], -1).max(axis=0) if self.seq.size else np.zeros(0, np.int64)
        return (self.pos < 0) | ((count == 1) & is_masked_swa(n_swa, self.pos, pmax[owner] + 1))

    def seq_pos_max(self, seq_id: int) -> int:
        """The largest position of ``seq_id`` in these cells, -1 if none."""
        p = self.pos[self.seq[:, seq_id]]
        return int(p.max()) if len(p) else -1

    def seq_pos_min(self, seq_id: int) -> int:
        p = self.pos[self.seq[:, seq_id]]
        return int(p.min()) if len(p) else -1


def is_masked_swa(n_swa: int, p0: np.ndarray | int, p1: np.ndarray | int) -> np.ndarray:
    """``llama_hparams::is_masked_swa`` for ``LLAMA_SWA_TYPE_STANDARD``: position p0 is outside the
    window of a token at p1 when ``p1 - p0 >= n_swa`` (never, for a cache without a window)."""
    import numpy as np
    if n_swa <= 0:
        return np.zeros(np.broadcast(p0, p1).shape, bool)
    return np.asarray(np.subtract(p1, p0) >= n_swa)


# ---- log lines (the wording llama.cpp prints; exact bytes in parentheses) -------------------------

def kv_buffer_line(name: str, nbytes: int) -> str:
    """``llama_kv_cache``'s buffer line (``%10s KV buffer size = %8.2f MiB``), with the exact bytes."""
    return f"llama_kv_cache: {name:>10s} KV buffer size = {nbytes / MIB:8.2f} MiB ({nbytes} bytes)"


def kv_size_line(size_k: int, size_v: int, cells: int, layers: int, n_seq_max: int, n_stream: int,
                 type_k: str, type_v: str) -> str:
    """``llama_kv_cache``'s size line: total, cells, layers, seqs, then K and V by type."""
    return (f"llama_kv_cache: size = {(size_k + size_v) / MIB:7.2f} MiB ({cells:6d} cells, {layers:3d} layers, "
            f"{n_seq_max:2d}/{n_stream} seqs), K ({type_k}): {size_k / MIB:7.2f} MiB, "
            f"V ({type_v}): {size_v / MIB:7.2f} MiB")


def iswa_cache_line(kind: str, cells: int) -> str:
    """``llama_kv_cache_iswa``'s line before each of its caches."""
    return f"llama_kv_cache_iswa: creating {kind:>7s} KV cache, size = {cells} cells"


# ---- llama_kv_cache --------------------------------------------------------------------------------

@dataclass(eq=False)
class KVCache:
    """``llama_kv_cache``: one K and (unless ``has_v`` is False, MLA's K-only cache) one V tensor per
    layer it holds, in per-device buffers, and the cells of every stream.

    ``layers`` are the model layers of this cache in order (every layer, or those the iSWA filter
    gives it); ``k``/``v`` follow that order (:meth:`k_of` takes a model layer). ``kind`` is
    "single", or llama_kv_cache_iswa's "non-SWA" / "SWA"; ``group`` the memory group its buffers
    count in ("KV", "KV-SWA"). ``n_swa`` > 0: the cache masks and reuses cells by the sliding window.
    """

    k: list[Tensor]
    v: list[Tensor] | None
    kv_size: int
    n_stream: int
    v_trans: bool
    buffers_bytes: dict[str, int]
    k_bytes: int
    v_bytes: int
    layers: tuple[int, ...] = ()
    kind: str = "single"
    group: str = GROUP_KV
    n_seq_max: int = 1
    n_swa: int = 0
    type_k: GGMLType = GGMLType.F16
    type_v: GGMLType = GGMLType.F16
    reuse: dict[int, int] = field(default_factory=dict)   # layer -> the earlier layer whose cache it reads
    heads: list[int] = field(init=False, repr=False)
    slot: SlotInfo | None = field(default=None, init=False, repr=False)  # the last applied ubatch's
    _cells: list[KVCells] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.heads = [0] * self.n_stream

    @property
    def cells(self) -> list[KVCells]:
        """Per stream, the cells (made on first use: a plan never decodes)."""
        if self._cells is None:
            self._cells = [KVCells(self.kv_size, self.n_seq_max) for _ in range(self.n_stream)]
        return self._cells

    # ---- what it holds ----------------------------------------------------------------------
    @property
    def has_v(self) -> bool:
        return self.v is not None

    @property
    def total_bytes(self) -> int:
        return sum(self.buffers_bytes.values())

    @property
    def tensors(self) -> list[Tensor]:
        return [*self.k, *(self.v or [])]

    def holds(self, il: int) -> bool:
        return il in self.layers or il in self.reuse

    def k_of(self, il: int) -> Tensor:
        return self.k[self.layers.index(self.reuse.get(il, il))]

    def v_of(self, il: int) -> Tensor:
        if self.v is None:
            raise ValueError(f"the {self.kind} KV cache holds no V (K-only cache); layer {il} has no V tensor")
        return self.v[self.layers.index(self.reuse.get(il, il))]

    @property
    def n_embd_v_gqa(self) -> int:
        """The V row size (``n_embd_v_gqa_max``), the stride of the transposed V's write indices."""
        return self.v[0].ne[0] if self.v else 0

    def log_lines(self) -> list[str]:
        """What ``llama_kv_cache``'s constructor logs: one line per buffer, then the size line."""
        return [*(kv_buffer_line(n, b) for n, b in self.buffers_bytes.items()),
                kv_size_line(self.k_bytes, self.v_bytes, self.kv_size, len(self.layers), self.n_seq_max,
                             self.n_stream, self.type_k.lower, self.type_v.lower)]

    def seq_to_stream(self, seq_id: int) -> int:
        """``llama_kv_cache::seq_to_stream``: its own stream per sequence, or the one unified stream."""
        return seq_id if self.n_stream > 1 else 0

    def seq_pos_max(self, seq_id: int) -> int:
        return self.cells[self.seq_to_stream(seq_id)].seq_pos_max(seq_id)

    # ---- graph input tensors (llama_kv_cache::build_input_k_idxs / build_input_v_idxs) ------------
    def build_input_k_idxs(self, n_tokens: int) -> Tensor:
        return ops.new_tensor_1d(I64, n_tokens).set_input()

    def build_input_v_idxs(self, n_tokens: int) -> Tensor:
        """One index per token, or per element with the transposed V (every element its own row)."""
        return ops.new_tensor_1d(I64, n_tokens * (self.n_embd_v_gqa if self.v_trans else 1)).set_input()

    # ---- the cells (llama_kv_cache::find_slot / apply_ubatch / seq_rm / clear) --------------------
    def _streams_of(self, ub: UBatch) -> tuple[list[int], int]:
        """(the ubatch's sequence per stream slot, tokens per slot), as find_slot splits the ubatch."""
        import numpy as np
        seqs = ub.seq_id_unq
        if any(s >= self.n_seq_max for s in seqs):
            raise ParameterError("seq_id", max(seqs), f"a sequence id below n_seq_max={self.n_seq_max}")
        if self.n_stream == 1:
            return [seqs[0]], ub.n_tokens
        n = ub.n_tokens // len(seqs)
        grouped = np.repeat(np.asarray(seqs, np.int32), n)
        if n * len(seqs) != ub.n_tokens or not np.array_equal(grouped, ub.seq_id):
            raise ParameterError("ubatch", list(ub.seq_id), "tokens grouped by sequence in ascending order, the "
                                 "same number per sequence (llama_batch_allocr::split_equal)")
        return list(seqs), n

    def find_slot(self, ub: UBatch) -> SlotInfo | None:
        """``llama_kv_cache::find_slot(ubatch, cont=false)``: for every stream of the ubatch, a cell per token,
        tested one by one from the stream's head, wrapping once around. A cell can be used when it is
        empty, or when it holds one sequence and the sliding window hides it from that sequence's next
        position (the SWA ring). The cells do not change while searching, so the test is one vector.
        None: no room."""
        import numpy as np
        seqs, n_tokens = self._streams_of(ub)
        strm: list[int] = []
        idxs: list[np.ndarray] = []
        for seq_id in seqs:
            s = self.seq_to_stream(seq_id)
            cells = self.cells[s]
            if n_tokens > cells.size:
                return None
            head = self.heads[s]
            if head > cells.used + 2 * n_tokens:   # enough unused cells before the head: start over
                head = 0
            order = np.concatenate([np.arange(head, cells.size), np.arange(0, head)])
            picked = order[cells.usable(self.n_swa)[order]][:n_tokens]
            if len(picked) < n_tokens:
                return None
            strm.append(s)
            idxs.append(picked.astype(np.int64))
        return SlotInfo(min(strm), max(strm), tuple(strm), tuple(idxs))

    def apply_ubatch(self, sinfo: SlotInfo, ub: UBatch) -> None:
        """``llama_kv_cache::apply_ubatch``: the tokens move into their cells (whatever a reused cell held
        is removed, and with it the older positions of that sequence), the heads move past the slot."""
        import numpy as np
        pos_max_rm: dict[int, int] = {}
        n = sinfo.size
        for s in range(sinfo.n_stream):
            cells = self.cells[sinfo.strm[s]]
            idx = sinfo.idxs[s]
            held = idx[cells.pos[idx] >= 0]
            for owner, p in zip(np.argmax(cells.seq[held], axis=1), cells.pos[held]):
                pos_max_rm[int(owner)] = max(pos_max_rm.get(int(owner), -1), int(p))
            rows = slice(s * n, (s + 1) * n)
            cells.seq[idx] = False
            cells.pos[idx] = ub.pos[rows]
            cells.seq[idx, ub.seq_id[rows]] = True
        # keep every position between a sequence's min and max in the cache
        for seq_id, p in pos_max_rm.items():
            pmin = self.cells[self.seq_to_stream(seq_id)].seq_pos_min(seq_id)
            if pmin <= p:
                self.seq_rm(seq_id, pmin, p + 1)
        for s in range(sinfo.n_stream):
            self.heads[sinfo.strm[s]] = int(sinfo.idxs[s][-1]) + 1
        self.slot = sinfo

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> None:
        """``llama_kv_cache::seq_rm``: forget positions [p0, p1) of a sequence (-1: open ends)."""
        import numpy as np
        p1 = np.iinfo(np.int64).max if p1 < 0 else p1
        s = self.seq_to_stream(seq_id)
        cells = self.cells[s]
        hit = (cells.pos >= max(p0, 0)) & (cells.pos < p1) & cells.seq[:, seq_id]
        cells.seq[hit, seq_id] = False
        freed = hit & ~cells.seq.any(axis=1)
        cells.pos[freed] = -1
        if freed.any():
            self.heads[s] = min(self.heads[s], int(np.flatnonzero(freed)[0]))

    def clear(self) -> None:
        """``llama_kv_cache::clear``: every cell empty, every head at 0."""
        self._cells = None
        self.heads = [0] * self.n_stream
        self.slot = None

    # ---- input values (llama_kv_cache::set_input_*) --------------------------------------------
    def _slot(self) -> SlotInfo:
        if self.slot is None:
            raise ValueError(f"the {self.kind} KV cache has no ubatch applied: call apply_ubatch first")
        return self.slot

    def set_input_k_idxs(self, ub: UBatch) -> np.ndarray:
        """The global cell (stream * kv_size + cell) each token's K row is written to."""
        import numpy as np
        si = self._slot()
        assert ub.n_tokens == si.size * si.n_stream
        return np.concatenate([si.strm[s] * self.kv_size + si.idxs[s] for s in range(si.n_stream)])

    def set_input_v_idxs(self, ub: UBatch) -> np.ndarray:
        """As :meth:`set_input_k_idxs`, or with the transposed V one index per element: element j of a
        token in cell c of stream s goes to ``s * kv_size * n_embd_v_gqa + j * kv_size + c``."""
        import numpy as np
        if not self.v_trans:
            return self.set_input_k_idxs(ub)
        si = self._slot()
        e = self.n_embd_v_gqa
        j = np.arange(e, dtype=np.int64)[None, :]
        return np.concatenate([(si.strm[s] * self.kv_size * e + j * self.kv_size + si.idxs[s][:, None]).reshape(-1)
                               for s in range(si.n_stream)])

    def set_input_kq_mask(self, dst: Tensor, ub: UBatch, causal: bool = True) -> np.ndarray:
        """``llama_kv_cache::set_input_kq_mask``: 0 where token i may attend to cell j of its stream, -inf
        where the cell is empty, holds another sequence, a later position (causal) or one outside the
        window; shaped ``[n_stream, 1, n_tokens / n_stream, n_kv]`` (ggml's ne reversed), float32."""
        import numpy as np
        n_kv, n_stream = dst.ne[0], dst.ne[3]
        if ub.n_tokens % n_stream:
            raise ValueError(f"{ub.n_tokens} tokens do not split over the mask's {n_stream} streams")
        n_tps = ub.n_tokens // n_stream
        out = np.full((n_stream, 1, n_tps, n_kv), -np.inf, np.float32)
        for s in range(n_stream):
            rows = slice(s * n_tps, (s + 1) * n_tps)
            seq = ub.seq_id[rows]
            p1 = ub.pos[rows].astype(np.int64)[:, None]
            for q in np.unique(seq):
                cells = self.cells[self.seq_to_stream(int(q))]
                p0 = cells.pos[None, :n_kv]
                keep = (p0 >= 0) & cells.seq[None, :n_kv, q] & ~is_masked_swa(self.n_swa, p0, p1)
                if causal:
                    keep &= p0 <= p1
                sel = seq == q
                out[s, 0, sel] = np.where(keep[sel], 0.0, -np.inf)
        return out


def make_kv_cache(model: LoadedModel, rp: ResolvedParams, *, offload_kqv: bool, flash_attn: bool,
                  layers: list[int] | None = None, kv_size: int | None = None, kind: str = "single",
                  group: str = GROUP_KV, n_swa: int = 0, has_v: bool = True) -> KVCache:
    """One ``llama_kv_cache`` over ``layers`` (default: all) with ``kv_size`` cells per stream; a layer
    that ``layer_reuse`` maps to an earlier one gets no tensors and reads that layer's."""
    hp = model.hparams
    devs = model.devices
    kv_size = rp.kv_size if kv_size is None else kv_size
    n_stream = rp.n_stream
    # llama_kv_cache walks every block (n_layer_all): a NextN/MTP block that the graph skips still gets cells
    layers = list(range(hp.n_layer_all)) if layers is None else layers
    reuse = {il: src for il, src in layer_reuse(hp).items() if il in layers}
    layers = [il for il in layers if il not in reuse]
    ks: list[Tensor] = []
    vs: list[Tensor] = []
    sizes: dict[str, int] = {}
    bufts: dict[str, BufferType] = {}
    k_bytes = v_bytes = 0
    names: list[str] = []
    for il in layers:
        d = model.layer_dev[il]
        buft = devs.gpus[d].buft if (offload_kqv and d >= 0) else devs.cpu_buft
        bufts[buft.name] = buft
        names.append(buft.name)
        k = Tensor(rp.type_k, (hp.n_embd_k_gqa(il), kv_size, n_stream), name=f"cache_k_l{il}")
        made = [k]
        if has_v:
            # a transposed V cache is n_embd_v_gqa_max wide on every layer (llama_kv_cache, TAG_V_CACHE_VARIABLE)
            n_embd_v_gqa = hp.n_embd_v_gqa(il) if flash_attn else hp.n_embd_v_gqa_max()
            v = Tensor(rp.type_v, (n_embd_v_gqa, kv_size, n_stream), name=f"cache_v_l{il}")
            made.append(v)
            v_bytes += v.nbytes
            vs.append(v)
        for t in made:
            sizes[buft.name] = sizes.get(buft.name, 0) + _pad(buft.alloc_size(t), buft.alignment)
        k_bytes += k.nbytes
        ks.append(k)
    buffers = {n: Buffer(bufts[n], s, BufferUsage.ANY, n) for n, s in sizes.items()}
    for t, name in zip(ks, names):
        t.buffer = buffers[name]
    for t, name in zip(vs, names):
        t.buffer = buffers[name]
    return KVCache(ks, vs if has_v else None, kv_size, n_stream, not flash_attn, sizes, k_bytes, v_bytes,
                   tuple(layers), kind, group, rp.n_seq_max, n_swa, rp.type_k, rp.type_v, reuse)


def layer_reuse(hp: HParams) -> dict[int, int]:
    """``llama_model::create_memory``'s ``layer_reuse_cb`` (Gemma 3n / Gemma 4): a layer from
    ``n_layer_kv_from_start = n_layer - n_kv_shared`` on reads the cache of the last layer of its kind
    before that point (``n_layer_kv_from_start - 2`` for SWA layers, ``- 1`` for full ones). No measured
    case pins it: the oracle's tiny Gemma 4 models share nothing."""
    start = hp.n_layer - hp.n_kv_shared
    if not hp.n_kv_shared:
        return {}
    if start < 2:
        raise ParameterError("n_kv_shared", hp.n_kv_shared, f"at most n_layer - 2 = {hp.n_layer - 2} "
                             "(layer_reuse_cb asserts n_layer_kv_from_start >= 2)")
    return {il: start - (2 if hp.is_swa(il) else 1) for il in range(start, hp.n_layer)}


def swa_cache_size(hp: HParams, rp: ResolvedParams, *, swa_full: bool, unified: bool) -> int:
    """``llama_kv_cache_iswa``: ``GGML_PAD(min(size_base, n_swa*(unified ? n_seq_max : 1) + n_ubatch), 256)``
    cells per stream, or the full ``size_base`` with ``--swa-full``."""
    size_base = rp.kv_size
    if swa_full:
        return size_base
    n = min(size_base, hp.n_swa * (rp.n_seq_max if unified else 1) + rp.n_ubatch)
    return _pad(n, SWA_CACHE_PAD)


# ---- the memory ------------------------------------------------------------------------------------

@dataclass(eq=False)
class Memory:
    """``llama_memory_i``: the caches ``create_memory`` made, in creation order, and what it logged.

    ``kind`` is "kv" (one ``llama_kv_cache``), "kv-iswa" (``llama_kv_cache_iswa``: the non-SWA cache,
    then the SWA cache) or "hybrid" (``llama_memory_hybrid``: the KV cache of the attention layers and
    the :attr:`recurrent` states of the others, group "RS"). Per ubatch, :meth:`apply_ubatch` finds a
    slot in every cache and applies it; the graph inputs then read each cache's slot and cells.
    """

    caches: list[KVCache]
    kind: str = "kv"
    warnings: list[str] = field(default_factory=list)
    recurrent: RecurrentMemory | None = None

    # ---- layout --------------------------------------------------------------------------------
    def cache_of(self, il: int) -> KVCache:
        """The cache that holds layer il."""
        for c in self.caches:
            if c.holds(il):
                return c
        raise ValueError(f"no cache of this memory holds layer {il}")

    @property
    def n_stream(self) -> int:
        return self.caches[0].n_stream

    @property
    def n_seq_max(self) -> int:
        return self.caches[0].n_seq_max

    @property
    def kv_size(self) -> int:
        """Cells per stream of the first (full) cache: how many positions a sequence can hold."""
        return self.caches[0].kv_size

    @property
    def tensors(self) -> list[Tensor]:
        """Every cache tensor (what the runtime keeps on the devices between ubatches), the recurrent states last."""
        return [t for c in self.caches for t in c.tensors] + (self.recurrent.tensors if self.recurrent else [])

    # ---- bytes ---------------------------------------------------------------------------------
    @property
    def groups(self) -> dict[str, dict[str, int]]:
        """Buffer bytes by memory group ("KV"; iSWA: "KV" and "KV-SWA"; a hybrid: "KV" and "RS") and buffer name."""
        out: dict[str, dict[str, int]] = {}
        for c in self.caches:
            g = out.setdefault(c.group, {})
            for name, b in c.buffers_bytes.items():
                g[name] = g.get(name, 0) + b
        if self.recurrent is not None:
            out[self.recurrent.group] = dict(self.recurrent.buffers_bytes)
        return out

    def buffers_bytes(self) -> dict[str, int]:
        """KV buffer bytes per buffer name, summed over the caches."""
        out: dict[str, int] = {}
        for c in self.caches:
            for name, b in c.buffers_bytes.items():
                out[name] = out.get(name, 0) + b
        return out

    def buffers_by_cache(self) -> dict[str, int]:
        """KV buffer bytes as llama.cpp logs them, one line per cache and buffer: the buffer name, with
        the cache in parentheses for iSWA's two caches (``CPU (SWA)``, ``CPU (non-SWA)``)."""
        if len(self.caches) == 1:
            return dict(self.caches[0].buffers_bytes)
        return {f"{name} ({c.kind})": b for c in self.caches for name, b in c.buffers_bytes.items()}

    @property
    def total_bytes(self) -> int:
        return sum(c.total_bytes for c in self.caches)

    def log_lines(self) -> list[str]:
        """What creating this memory logs (``llama_kv_cache_iswa`` adds its warning and a line per cache;
        ``llama_memory_hybrid`` the recurrent memory's lines after the KV cache's)."""
        if len(self.caches) == 1:
            return self.caches[0].log_lines() + (self.recurrent.log_lines() if self.recurrent else [])
        out = list(self.warnings)
        for c in self.caches:
            out += [iswa_cache_line(c.kind, c.kv_size), *c.log_lines()]
        return out

    # ---- per ubatch ----------------------------------------------------------------------------
    def apply_ubatch(self, ub: UBatch) -> SlotInfo:
        """Find a slot for the ubatch in every cache, then apply them (``prepare`` + ``apply``); the
        first cache's slot (its streams s0..s1 narrow the graph's KV views). Nothing changes when a
        cache has no room."""
        slots = [c.find_slot(ub) for c in self.caches]
        for c, s in zip(self.caches, slots):
            if s is None:
                raise ParameterError("tokens", ub.n_tokens, f"a ubatch that fits the free cells of the {c.kind} "
                                     f"KV cache ({c.kv_size} cells per stream)", "llama_kv_cache::find_slot failed")
        for c, s in zip(self.caches, slots):
            assert s is not None
            c.apply_ubatch(s, ub)
        if self.recurrent is not None:   # llama_memory_recurrent_context::apply: its find_slot
            seqs = ub.seq_id_unq
            last = [int(ub.pos[ub.seq_id == q].max()) for q in seqs]
            self.recurrent.find_slot(seqs, last)
        first = slots[0]
        assert first is not None
        return first

    def end_ubatch(self) -> None:
        """The ubatch's graph has read the slots: a later graph (a reserve) sees the whole memory again."""
        if self.recurrent is not None:
            self.recurrent.end_ubatch()

    def slot_key(self) -> tuple[int, int, int] | None:
        """What a ubatch's graph depends on beyond its shape: the recurrent slot (head, n, rs_z)."""
        return self.recurrent.slot if self.recurrent is not None else None

    def seq_pos_max(self, seq_id: int) -> int:
        """The sequence's last position (-1: none), as ``llama_memory_seq_pos_max`` answers it (iSWA:
        from the SWA cache; a hybrid: the smaller of the KV cache's and the recurrent states')."""
        pos = self.caches[-1].seq_pos_max(seq_id)
        return pos if self.recurrent is None else min(pos, self.recurrent.seq_pos_max(seq_id))

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> None:
        """``llama_memory_seq_rm``: the sequence's cells with a position in [p0, p1) (-1: open). A hybrid
        asks its recurrent states first (``llama_memory_hybrid::seq_rm``), which cannot drop the last
        tokens of a state: then nothing changes and a ParameterError says so."""
        if self.recurrent is not None and not self.recurrent.seq_rm(seq_id, p0, p1):
            raise ParameterError("p0", p0, "the whole sequence (p0 <= 0 and p1 < 0), or positions after its last",
                                 f"llama_memory_recurrent::seq_rm: a recurrent state cannot lose the tokens "
                                 f"[{p0}, {p1}) of sequence {seq_id} (no rollback slots, n_rs_seq 0)")
        for c in self.caches:
            c.seq_rm(seq_id, p0, p1)

    def clear(self) -> None:
        for c in self.caches:
            c.clear()
        if self.recurrent is not None:
            self.recurrent.clear()


def v_padding_warnings(hp: HParams, flash_attn: bool) -> list[str]:
    """``llama_kv_cache`` [TAG_V_CACHE_VARIABLE]: a transposed V cache (no flash attention) over layers whose
    ``n_embd_v_gqa`` differ (``is_n_embd_v_gqa_variable``, every layer counted) is padded to the largest,
    with a warning."""
    sizes = {hp.n_embd_v_gqa(il) for il in range(hp.n_layer)}
    if flash_attn or len(sizes) < 2:
        return []
    return [f"llama_kv_cache: the V embeddings have different sizes across layers and FA is not enabled - "
            f"padding V cache to {max(sizes)}"]


def create_memory(model: LoadedModel, rp: ResolvedParams, *, offload_kqv: bool, flash_attn: bool, swa_full: bool,
                  unified: bool, kind: str = "kv") -> Memory:
    """``llama_model::create_memory``: one ``llama_kv_cache``, or ``llama_kv_cache_iswa``'s two (the
    non-SWA cache first, then the SWA cache) when the model has sliding-window layers."""
    if kind not in MEMORY_KINDS:
        raise ParameterError("kind", kind, f"a memory kind create_memory builds: {', '.join(MEMORY_KINDS)}")
    hp = model.hparams
    if kind == MEMORY_HYBRID:
        return create_hybrid_memory(model, rp, offload_kqv=offload_kqv, flash_attn=flash_attn)
    if not hp.is_swa_any:
        # has_v = !is_mla: MLA's cache holds the compressed K (kv_lora_rank + n_rot per token) and no V
        return Memory([make_kv_cache(model, rp, offload_kqv=offload_kqv, flash_attn=flash_attn,
                                     has_v=not hp.is_mla)], "kv")
    swa = [il for il in range(hp.n_layer_all) if hp.is_swa(il)]
    base = [il for il in range(hp.n_layer_all) if not hp.is_swa(il)]
    kv_base = make_kv_cache(model, rp, offload_kqv=offload_kqv, flash_attn=flash_attn, layers=base, kind="non-SWA")
    size = swa_cache_size(hp, rp, swa_full=swa_full, unified=unified)
    kv_swa = make_kv_cache(model, rp, offload_kqv=offload_kqv, flash_attn=flash_attn, layers=swa, kv_size=size,
                           kind="SWA", group=GROUP_KV_SWA, n_swa=hp.n_swa)
    return Memory([kv_base, kv_swa], "kv-iswa", [SWA_FULL_WARNING] if swa_full else [])


def create_hybrid_memory(model: LoadedModel, rp: ResolvedParams, *, offload_kqv: bool, flash_attn: bool) -> Memory:
    """``llama_memory_hybrid``: first the ``llama_kv_cache`` over the layers that are not recurrent
    (``n_ctx_seq`` cells per stream), then the ``llama_memory_recurrent`` over the recurrent ones
    (``max(1, n_seq_max)`` rows, ``n_rs_seq`` 0), both placed by the layer's device when offloaded."""
    hp = model.hparams
    if hp.is_swa_any:
        raise UnsupportedFeature("hybrid iSWA memory", "llama_memory_hybrid_iswa (a hybrid with a sliding window) "
                                 "is not built")
    attn = [il for il in range(hp.n_layer) if not hp.is_recr(il)]
    recr = [il for il in range(hp.n_layer) if hp.is_recr(il)]
    kv = make_kv_cache(model, rp, offload_kqv=offload_kqv, flash_attn=flash_attn, layers=attn)
    rs = make_recurrent_memory(model, rp.n_seq_max, offload=offload_kqv, layers=recr)
    return Memory([kv], MEMORY_HYBRID, v_padding_warnings(hp, flash_attn), rs)
