"""Memory as objects (toolkit.models.memory) and graph inputs that fill themselves (toolkit.models.inputs).

Cells, slots, write indices and masks in numpy only, against values worked out by hand from
llama.cpp's rules (``llama_kv_cache::find_slot`` / ``apply_ubatch`` / ``set_input_*``): a single
cache, the SWA ring, two streams, a unified stream of two sequences, and iSWA's pair in a built graph.
"""

from __future__ import annotations

import numpy as np
import pytest

from toolkit.errors import ParameterError, UnsupportedFeature
from toolkit.ggml import F16, F32, Graph, ops
from toolkit.ggml.tensor import Op, Tensor
from toolkit.models import ContextParams, HParams, SWAParams, archs, presets
from toolkit.models.devices import make_devices
from toolkit.models.inputs import InputAttnKV, InputAttnKVISWA, InputEmbd, InputOutIds, InputPos
from toolkit.models.loader import load_model
from toolkit.models.memory import GROUP_KV, GROUP_KV_SWA, KVCache, Memory, UBatch, create_memory
from toolkit.models.memory_recurrent import RecurrentMemory
from toolkit.models.setup import setup

X = -np.inf


def _cache(size: int, *, n_stream: int = 1, n_seq_max: int = 1, n_swa: int = 0, v_trans: bool = False,
           n_embd: int = 2) -> KVCache:
    """A one-layer cache without buffers: only its cells matter here."""
    k = Tensor(F16, (n_embd, size, n_stream), name="cache_k_l0")
    v = Tensor(F16, (n_embd, size, n_stream), name="cache_v_l0")
    return KVCache([k], [v], size, n_stream, v_trans, {}, 0, 0, (0,), n_seq_max=n_seq_max, n_swa=n_swa)


def _mask(c: KVCache, ub: UBatch, n_stream: int = 1) -> np.ndarray:
    dst = Tensor(F32, (c.kv_size, ub.n_tokens // n_stream, 1, n_stream))
    return c.set_input_kq_mask(dst, ub)


def _apply(c: KVCache, ub: UBatch) -> None:
    s = c.find_slot(ub)
    assert s is not None
    c.apply_ubatch(s, ub)


def test_single_cache_fills_cells_in_order_and_masks_causally() -> None:
    c = _cache(8, v_trans=True)
    ub = UBatch.of_sequence([5, 6, 7], pos0=0)
    _apply(c, ub)
    assert c.cells[0].pos.tolist() == [0, 1, 2, -1, -1, -1, -1, -1]
    assert c.set_input_k_idxs(ub).tolist() == [0, 1, 2]
    # transposed V: element j of the token in cell c goes to j * 8 + c
    assert c.set_input_v_idxs(ub).tolist() == [0, 8, 1, 9, 2, 10]
    assert _mask(c, ub)[0, 0].tolist() == [[0, X, X, X, X, X, X, X],
                                           [0, 0, X, X, X, X, X, X],
                                           [0, 0, 0, X, X, X, X, X]]
    ub2 = UBatch.of_sequence([8, 9], pos0=3)
    _apply(c, ub2)
    assert c.set_input_k_idxs(ub2).tolist() == [3, 4]
    assert _mask(c, ub2)[0, 0].tolist() == [[0, 0, 0, 0, X, X, X, X], [0, 0, 0, 0, 0, X, X, X]]
    assert c.seq_pos_max(0) == 4 and c.heads == [5]
    c.seq_rm(0, 3)       # positions 3.. forgotten: the head goes back to the first freed cell
    assert c.cells[0].pos.tolist() == [0, 1, 2, -1, -1, -1, -1, -1] and c.heads == [3]


def test_swa_ring_reuses_cells_outside_the_window() -> None:
    """Window 4, 8 cells: after positions 0..5, tokens 6, 7, 8 take cells 6, 7 and then 0 (position 0 is
    outside the window of position 6 = seq_pos_max + 1); each token sees its last 4 positions."""
    c = _cache(8, n_swa=4)
    _apply(c, UBatch.of_sequence(range(6), pos0=0))
    ub = UBatch.of_sequence([1, 2, 3], pos0=6)
    _apply(c, ub)
    assert c.set_input_k_idxs(ub).tolist() == [6, 7, 0]
    assert c.cells[0].pos.tolist() == [8, 1, 2, 3, 4, 5, 6, 7]
    # cell order 0..7 holds positions 8, 1..7; pos 6 sees 3..6, pos 7 sees 4..7, pos 8 sees 5..8
    assert _mask(c, ub)[0, 0].tolist() == [[X, X, X, 0, 0, 0, 0, X],
                                           [X, X, X, X, 0, 0, 0, 0],
                                           [0, X, X, X, X, 0, 0, 0]]
    # 6 more tokens need 6 cells whose positions left the window of position 9: only 1..5 have
    assert c.find_slot(UBatch.of_sequence(range(6), pos0=9)) is None


def test_a_failed_slot_changes_no_cache() -> None:
    base, swa = _cache(16), _cache(8, n_swa=4)
    mem = Memory([base, swa], "kv-iswa")
    mem.apply_ubatch(UBatch.of_sequence(range(8), pos0=0))
    before = base.cells[0].pos.copy(), swa.cells[0].pos.copy()
    with pytest.raises(ParameterError) as e:
        mem.apply_ubatch(UBatch.of_sequence(range(6), pos0=8))   # the SWA cache has 4 reusable cells
    assert e.value.param == "tokens"
    assert base.cells[0].pos.tolist() == before[0].tolist() and swa.cells[0].pos.tolist() == before[1].tolist()
    assert mem.seq_pos_max(0) == 7


def test_two_streams_write_global_indices_and_mask_per_stream() -> None:
    c = _cache(4, n_stream=2, n_seq_max=2, v_trans=True)
    ub = UBatch.concat([UBatch.of_sequence([1, 2], 0, seq_id=0), UBatch.of_sequence([3, 4], 0, seq_id=1)])
    s = c.find_slot(ub)
    assert s is not None and (s.s0, s.s1, s.strm) == (0, 1, (0, 1))
    c.apply_ubatch(s, ub)
    # stream 1's cells start at 4 in the merged [n_embd, kv_size * n_stream] view
    assert c.set_input_k_idxs(ub).tolist() == [0, 1, 4, 5]
    # transposed V: stream s starts at s * 4 * 2; element j at j * 4
    assert c.set_input_v_idxs(ub).tolist() == [0, 4, 1, 5, 8, 12, 9, 13]
    m = _mask(c, ub, n_stream=2)
    assert m.shape == (2, 1, 2, 4)
    assert m[0, 0].tolist() == m[1, 0].tolist() == [[0, X, X, X], [0, 0, X, X]]
    ub1 = UBatch.of_sequence([9], 2, seq_id=1)
    s1 = c.find_slot(ub1)
    assert s1 is not None and (s1.s0, s1.s1) == (1, 1)
    c.apply_ubatch(s1, ub1)
    assert c.set_input_k_idxs(ub1).tolist() == [6]
    assert c.set_input_v_idxs(ub1).tolist() == [10, 14]
    assert _mask(c, ub1)[0, 0].tolist() == [[0, 0, 0, X]]
    c.seq_rm(1)
    assert c.cells[1].pos.tolist() == [-1] * 4 and c.cells[0].pos.tolist() == [0, 1, -1, -1]
    # a ubatch of two streams must come grouped by sequence, in ascending order
    mixed = UBatch(np.array([1, 2], np.int32), np.array([0, 0], np.int32), np.array([1, 0], np.int32),
                   np.ones(2, bool))
    with pytest.raises(ParameterError):
        c.find_slot(mixed)


def test_unified_stream_masks_other_sequences() -> None:
    c = _cache(4, n_seq_max=2)
    _apply(c, UBatch.of_sequence([1, 2], 0, seq_id=0))
    ub = UBatch.of_sequence([3], 0, seq_id=1)
    _apply(c, ub)
    assert c.set_input_k_idxs(ub).tolist() == [2]
    assert _mask(c, ub)[0, 0].tolist() == [[X, X, 0, X]]     # sequence 0's cells are hidden


def test_out_ids_pick_the_output_rows() -> None:
    inp = InputOutIds(ops.new_tensor_1d(F32, 2))
    ub = UBatch.of_sequence([1, 2, 3], 0, output=[True, False, True])
    assert inp.set_input(ub)[inp.out_ids].tolist() == [0, 2]


def _gemma3(**cp: object) -> tuple[HParams, Memory, object]:
    hp = HParams(n_layer=4, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, arch="gemma3",
                      swa=SWAParams(4, 4, 10000.0), tied=True, name="gemma3-test")
    st = setup(hp, ContextParams(n_ctx=256, n_batch=256, n_ubatch=32, flash_attn="off", **cp))  # type: ignore[arg-type]
    return hp, st.memory, st


def test_iswa_memory_caches_groups_and_log_lines() -> None:
    _, mem, _ = _gemma3(devices=("CPU",))
    assert mem.kind == "kv-iswa"
    base, swa = mem.caches
    assert (base.kind, base.layers, base.kv_size) == ("non-SWA", (3,), 256)
    # llama_kv_cache_iswa: pad(min(256, 4 + 32), 256) = 256 cells
    assert (swa.kind, swa.layers, swa.kv_size, swa.n_swa) == ("SWA", (0, 1, 2), 256, 4)
    assert mem.cache_of(3) is base and mem.cache_of(1) is swa
    # K and V f16 of [32, 256, 1] per layer: 16 KiB each; 1 layer in the base cache, 3 in the SWA one
    assert mem.groups == {GROUP_KV: {"CPU": 32768}, GROUP_KV_SWA: {"CPU": 98304}}
    assert mem.buffers_bytes() == {"CPU": 131072} and mem.total_bytes == 131072
    assert mem.buffers_by_cache() == {"CPU (non-SWA)": 32768, "CPU (SWA)": 98304}
    assert mem.log_lines() == [
        "llama_kv_cache_iswa: creating non-SWA KV cache, size = 256 cells",
        "llama_kv_cache:        CPU KV buffer size =     0.03 MiB (32768 bytes)",
        "llama_kv_cache: size =    0.03 MiB (   256 cells,   1 layers,  1/1 seqs), "
        "K (f16):    0.02 MiB, V (f16):    0.02 MiB",
        "llama_kv_cache_iswa: creating     SWA KV cache, size = 256 cells",
        "llama_kv_cache:        CPU KV buffer size =     0.09 MiB (98304 bytes)",
        "llama_kv_cache: size =    0.09 MiB (   256 cells,   3 layers,  1/1 seqs), "
        "K (f16):    0.05 MiB, V (f16):    0.05 MiB",
    ]


def test_iswa_graph_inputs_fill_both_caches() -> None:
    _, mem, st = _gemma3(devices=("CPU",))
    lg = st.build_graph(1024, 6, 1, 6)  # type: ignore[attr-defined]
    assert [type(i) for i in lg.inputs] == [InputEmbd, InputPos, InputAttnKVISWA, InputOutIds]
    ub = UBatch.of_sequence([3, 1, 4, 1, 5, 9], pos0=0)
    mem.apply_ubatch(ub)
    values = lg.set_inputs(ub)
    assert set(values) == {t for i in lg.inputs for t in i.tensors()} - {lg.input(InputEmbd).embd}
    iswa = lg.input(InputAttnKVISWA)
    assert values[lg.input(InputPos).pos].tolist() == [0, 1, 2, 3, 4, 5]
    full, win = values[iswa.base.kq_mask][0, 0], values[iswa.swa.kq_mask][0, 0]
    # the last token (position 5) sees 0..5 through the full cache, 2..5 through the window of 4
    assert full[5, :7].tolist() == [0, 0, 0, 0, 0, 0, X]
    assert win[5, :7].tolist() == [X, X, 0, 0, 0, 0, X]
    assert values[iswa.base.k_idxs].tolist() == values[iswa.swa.k_idxs].tolist() == [0, 1, 2, 3, 4, 5]
    # V is transposed without flash attention: 32 values per token, j * 256 + cell
    assert values[iswa.swa.v_idxs][:3].tolist() == [0, 256, 512]
    # build_attn takes each layer's cache: SWA layers write the SWA cache's tensors
    writes = [t for t in lg.graph.nodes if t.op is Op.SET_ROWS]
    dests = [_base(w).name for w in writes]   # SET_ROWS is a view of the cache it writes (srcs rows, ids, dst)
    assert dests[:2] == ["cache_k_l0", "cache_v_l0"] and dests[6:] == ["cache_k_l3", "cache_v_l3"]
    assert [w.src[1] for w in writes] == [iswa.swa.k_idxs, iswa.swa.v_idxs] * 3 + [iswa.base.k_idxs, iswa.base.v_idxs]
    base, swa = mem.caches
    assert [_base(w) for w in writes] == [t for il in (0, 1, 2) for t in (swa.k_of(il), swa.v_of(il))] + \
        [base.k_of(3), base.v_of(3)]


def _base(t: Tensor) -> Tensor:
    while t.view_src is not None:
        t = t.view_src
    return t


def test_create_memory_single_cache_and_kinds() -> None:
    hp = presets.tiny()
    cp = ContextParams(n_ctx=256, n_ubatch=32)
    rp = cp.resolve(hp.n_ctx_train)
    m = load_model(hp, cp, make_devices(()), archs.get(hp.arch).weights(hp),
                   tied_output_first=archs.get(hp.arch).tied_output_first)
    mem = create_memory(m, rp, offload_kqv=True, flash_attn=True, swa_full=False, unified=False)
    assert mem.kind == "kv" and len(mem.caches) == 1 and mem.caches[0].has_v and not mem.caches[0].v_trans
    # tiny: 2 layers, K and V f16 of [32, 256]: 16 KiB each
    assert mem.groups == {GROUP_KV: {"CPU": 65536}} and mem.buffers_by_cache() == {"CPU": 65536}
    assert mem.log_lines()[0] == "llama_kv_cache:        CPU KV buffer size =     0.06 MiB (65536 bytes)"
    assert mem.warnings == [] and len(mem.tensors) == 4
    with pytest.raises(ParameterError) as e:
        create_memory(m, rp, offload_kqv=True, flash_attn=True, swa_full=False, unified=False, kind="recurrent")
    assert e.value.param == "kind"


def test_swa_full_warns_and_sizes_the_swa_cache_fully() -> None:
    _, mem, _ = _gemma3(devices=("CPU",), swa_full=True)
    assert [c.kv_size for c in mem.caches] == [256, 256] and len(mem.warnings) == 1
    assert mem.warnings[0].startswith("llama_kv_cache_iswa: using full-size SWA cache")
    assert mem.log_lines()[0] == mem.warnings[0]


def test_build_attn_arguments() -> None:
    """wo_b adds after the projection; sinks (one per head) are the attention's extra source, a wrong
    size is ggml's assertion; kq_b is refused by name; v_mla decompresses the heads."""
    st = setup(presets.tiny(), ContextParams(n_ctx=256, n_ubatch=32, devices=("CPU",)))
    b = st.builder(1024)
    lg = b.build(4, 1, 4)
    inp = lg.input(InputAttnKV)
    q = ops.new_tensor_3d(F32, 16, 4, 4)
    k = ops.new_tensor_3d(F32, 16, 2, 4)
    v = ops.new_tensor_3d(F32, 16, 2, 4)
    wo = st.model.w("blk.0.attn_output.weight")
    bias = ops.new_tensor_1d(F32, 64)
    res = type(lg)(Graph(1024), 4, 1, 4, lg.flash_attn)
    out = b.build_attn(res, inp, wo, bias, q, k, v, None, None, None, 0.25, 0)
    assert out.op is Op.ADD and out.src[1] is bias and out.src[0].op is Op.MUL_MAT and out.src[0].src[0] is wo
    assert b.build_attn(res, inp, None, None, q, k, v, None, None, None, 0.25, 0).name == "kqv_out-0"
    sinks = ops.new_tensor_1d(F32, 4)
    kqv = b.build_attn(res, inp, None, None, q, k, v, None, sinks, None, 0.25, 0)
    attn = next(n for n in res.graph.nodes if n.op in (Op.FLASH_ATTN_EXT, Op.SOFT_MAX) and sinks in n.src)
    assert attn.src.index(sinks) == (4 if attn.op is Op.FLASH_ATTN_EXT else 2) and kqv.name == "kqv_out-0"
    with pytest.raises(ValueError, match="sinks f32 \\[64, 1, 1, 1\\] do not fit"):
        b.build_attn(res, inp, None, None, q, k, v, None, bias, None, 0.25, 0)
    with pytest.raises(UnsupportedFeature) as e:
        b.build_attn(res, inp, wo, None, q, k, v, bias, None, None, 0.25, 0)
    assert e.value.feature == "kq_b"
    # v_mla ([head_v, head_mla, n_head]) multiplies the attention's per-head result (build_attn_mha)
    v_mla = ops.new_tensor_3d(F32, 16, 8, 4)
    out = b.build_attn(res, inp, None, None, q, k, v, None, None, v_mla, 0.25, 0)
    mla = next(n for n in res.graph.nodes if n.op is Op.MUL_MAT and n.src[0] is v_mla)
    assert mla.name in ("fattn_mla-0", "kqv_mla-0") and out.ne == (8 * 4, 4, 1, 1)


def test_graph_copies_carry_their_inputs() -> None:
    st = setup(presets.tiny(), ContextParams(n_ctx=256, n_ubatch=32, devices=("CPU",)))
    a, b = st.build_graph(1024, 4, 1, 4), st.build_graph(1024, 4, 1, 4)
    ia, ib = a.input(InputAttnKV), b.input(InputAttnKV)
    assert ia.cache is ib.cache is st.memory.caches[0] and ia.kq_mask is not ib.kq_mask
    assert set(ib.tensors()) <= set(b.graph.leafs)


def test_recurrent_slots_follow_llama_memory_recurrent_find_slot() -> None:
    """Three cells: sequence 2 starts in cell 0 and sequence 0 in cell 1, each from its own cleared cell
    (rs_z); a ubatch of both makes their cells contiguous in ubatch order (cells 0 and 1 swapped, the
    states gathered by s_copy); seq_rm of sequence 2 frees its cell; the end of sequence 0 cannot go."""
    m = RecurrentMemory([], [], (), mem_size=3, n_seq_max=3, n_layer=1, n_embd_r=1, n_embd_s=1,
                        buffers_bytes={}, layer_devices=[])
    assert (m.head, m.n_rs, m.rs_z, m.s_copy()) == (0, 3, 0, [0, 1, 2])      # a reserve's view
    assert m.find_slot([2], [4]) == (0, 1, 0) and m.s_copy() == [0]
    m.end_ubatch()
    assert m.find_slot([0], [9]) == (1, 1, 1) and m.s_copy() == [1]
    m.end_ubatch()
    assert m.find_slot([0, 2], [10, 5]) == (0, 2, -1)
    assert m.s_copy() == [1, 0]                  # sequence 0's state was in cell 1, sequence 2's in cell 0
    assert [sorted(c.seq_id) for c in m.cells] == [[0], [2], []]
    assert (m.seq_pos_max(0), m.seq_pos_max(2)) == (10, 5)
    m.end_ubatch()
    assert m.seq_rm(2) and m.seq_pos_max(2) == -1 and m.cells[1].is_empty()
    assert not m.seq_rm(0, 3, -1) and m.seq_pos_max(0) == 10              # refused, nothing changed
    assert m.seq_rm(0, 11, -1)                                              # after its last position: nothing to do
    assert m.find_slot([2], [0]) == (1, 1, 1) and m.s_copy() == [1]        # sequence 2 starts again, cleared
