"""``Tensor.nbytes`` (``ggml_nbytes``) for every type, strided views and quantized rows.

Expected values are measured: byte spans by numpy (tests/ggml_oracle.py), row sizes by the
gguf package, and the numbers the real C code printed (the scheduler graphs of tests/test_sched_vectors.py and
tests/test_gallocr_vectors.py, and llama.cpp's cases in tests/data/cases.json).
"""

from __future__ import annotations

import gguf
import pytest
from ggml_oracle import span_bytes
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.ggml import BF16, F16, F32, I32, Q4_0, Q8_0, GGMLType, Tensor, ops

ALL_TYPES = list(GGMLType)
GGUF_TYPES = {q.value for q in gguf.GGMLQuantizationType}
FLOAT_LIKE = [t for t in ALL_TYPES if not t.is_quantized]
QUANTIZED = [t for t in ALL_TYPES if t.is_quantized]


@pytest.mark.parametrize("t", ALL_TYPES, ids=[t.name for t in ALL_TYPES])
@pytest.mark.parametrize("ne", [(1,), (3,), (2, 5), (4, 3, 2), (2, 3, 1, 4)], ids=str)
def test_contiguous(t: GGMLType, ne: tuple[int, ...]) -> None:
    ne_blocks = (ne[0] * t.blck_size, *ne[1:])
    x = Tensor(t, ne_blocks)
    assert x.nbytes == span_bytes(t, x.ne, x.nb)
    # and the same number the gguf package gives for a contiguous tensor of that shape (where it has the type)
    if t.ggml_id not in GGUF_TYPES:
        return
    q = gguf.GGMLQuantizationType(t.ggml_id)
    byte_shape = gguf.quant_shape_to_byte_shape(tuple(reversed(ne_blocks)), q)
    n = 1
    for d in byte_shape:
        n *= d
    assert x.nbytes == n


@pytest.mark.parametrize("t", ALL_TYPES, ids=[t.name for t in ALL_TYPES])
@pytest.mark.parametrize("ne", [(0,), (4, 0), (4, 2, 0, 3)], ids=str)
def test_empty_is_zero(t: GGMLType, ne: tuple[int, ...]) -> None:
    ne_blocks = (ne[0] * t.blck_size, *ne[1:])
    x = Tensor(t, ne_blocks)
    assert x.nbytes == span_bytes(t, x.ne, x.nb)


@pytest.mark.parametrize("t", FLOAT_LIKE, ids=[t.name for t in FLOAT_LIKE])
def test_strided_views_measure_their_span(t: GGMLType) -> None:
    base = ops.new_tensor_3d(t, 8, 6, 4, "base")
    rows = ops.view_2d(base, 3, 5, base.nb[1], 2 * t.type_size)  # 3 of 8 columns, 5 rows
    assert rows.nbytes == span_bytes(t, rows.ne, rows.nb)
    every_other = ops.view_3d(base, 8, 3, 4, 2 * base.nb[1], base.nb[2], 0)  # rows 0, 2, 4
    assert every_other.nbytes == span_bytes(t, every_other.ne, every_other.nb)
    perm = ops.permute(base, 2, 0, 1, 3)
    assert perm.nbytes == span_bytes(t, perm.ne, perm.nb)
    tr = ops.transpose(ops.view_2d(base, 8, 6, base.nb[1], 0))
    assert tr.nbytes == span_bytes(t, tr.ne, tr.nb)


@pytest.mark.parametrize("t", QUANTIZED, ids=[t.name for t in QUANTIZED])
def test_quantized_rows_count_blocks(t: GGMLType) -> None:
    ne0 = 4 * t.blck_size
    w = ops.new_tensor_3d(t, ne0, 5, 3, "w")
    assert w.nbytes == span_bytes(t, w.ne, w.nb)
    # one head of a K-cache-like layout: 2 of 4 blocks per row, every row, offset one block
    head = ops.view_3d(w, 2 * t.blck_size, 5, 3, w.nb[1], w.nb[2], t.type_size)
    assert head.nbytes == span_bytes(t, head.ne, head.nb)
    # a strided set of whole rows
    rows = ops.view_2d(w, ne0, 2, 2 * w.nb[1], w.nb[1])
    assert rows.nbytes == span_bytes(t, rows.ne, rows.nb)


@st.composite
def _layouts(draw: st.DrawFn) -> tuple[GGMLType, tuple[int, ...], tuple[int, ...]]:
    t = draw(st.sampled_from(ALL_TYPES))
    ne = [draw(st.integers(1, 4)) * t.blck_size] + [draw(st.integers(1, 4)) for _ in range(3)]
    if t.is_quantized:  # ggml keeps a quantized tensor's blocks in dim 0 at nb[0] = type_size
        nb = [t.type_size] + [draw(st.integers(0, 64)) * t.type_size for _ in range(3)]
    else:
        nb = [draw(st.integers(0, 16)) * t.type_size for _ in range(4)]
    return t, tuple(ne), tuple(nb)


@settings(max_examples=200, deadline=None)
@given(_layouts())
def test_any_layout_matches_numpy_span(layout: tuple[GGMLType, tuple[int, ...], tuple[int, ...]]) -> None:
    t, ne, nb = layout
    assert Tensor(t, ne, nb=nb).nbytes == span_bytes(t, ne, nb)


# ---- numbers printed by the real C code --------------------------------------------------

def test_sched_graph_tensor_sizes() -> None:
    # single-CPU chain: x[10] f32 is 40 bytes
    assert ops.new_tensor_1d(F32, 10, "x").nbytes == 40
    # chunked buffer: x0[4] 16 bytes, x1[2] 8 bytes, concat 24 bytes, mean 4 bytes
    x0, x1 = ops.new_tensor_1d(F32, 4, "x0"), ops.new_tensor_1d(F32, 2, "x1")
    x2 = ops.concat(x0, x1, 0)
    assert (x0.nbytes, x1.nbytes, x2.nbytes, ops.mean(ops.scale(x2, 2.0)).nbytes) == (16, 8, 24, 4)
    # view graph: x[16] is 64 bytes, r = scale(view_1d(a, 8, 0)) is 32 bytes
    x = ops.new_tensor_1d(F32, 16, "x")
    r = ops.scale(ops.view_1d(ops.sqr(x), 8, 0), 1.0)
    assert (x.nbytes, r.nbytes) == (64, 32)


def test_offloaded_weight_copy_size() -> None:
    # two-backend MLP with op offload: the copy of the host weight w1[16x16] f32 is 1024 bytes
    assert ops.new_tensor_2d(F32, 16, 16, "w1").nbytes == 1024


# KV caches: llama.cpp's size_k_bytes is the sum over layers of ggml_nbytes(k_l), k_l being
# [n_embd_k_gqa, kv_size] of type_k (n_embd_k_gqa = n_embd_head * n_head_kv). Case ids and
# values from tests/data/cases.json.
@pytest.mark.parametrize(
    ("case", "type_k", "n_layer", "n_embd_k_gqa", "kv_size", "size_k_bytes"),
    [
        ("cpu-tiny_f32-c256-b512-ub512-faon", F16, 2, 16 * 2, 256, 32768),
        ("cpu-small_f16-c1024-b2048-ub512-faon", F16, 4, 32 * 8, 1024, 2097152),
        ("cpu-small_f16-c4096-b2048-ub512-faon", F16, 4, 32 * 8, 4096, 8388608),
        ("cpu-small_f32-c1024-b2048-ub512-faon-kq8_0", Q8_0, 4, 32 * 8, 1024, 1114112),
    ],
)
def test_oracle_kv_cache_bytes(
    case: str, type_k: GGMLType, n_layer: int, n_embd_k_gqa: int, kv_size: int, size_k_bytes: int
) -> None:
    layers = [ops.new_tensor_2d(type_k, n_embd_k_gqa, kv_size, f"cache_k_l{il}") for il in range(n_layer)]
    assert sum(k.nbytes for k in layers) == size_k_bytes, case


@pytest.mark.parametrize("t", [F32, F16, BF16, I32, Q4_0, Q8_0], ids=lambda t: t.name)
def test_row_size_times_rows_is_contiguous_nbytes(t: GGMLType) -> None:
    x = ops.new_tensor_3d(t, 2 * t.blck_size, 3, 5)
    q = gguf.GGMLQuantizationType(t.ggml_id)
    assert x.nbytes == 3 * 5 * gguf.quant_shape_to_byte_shape((2 * t.blck_size,), q)[0]
