"""ggml ops in JAX against numpy references written from ggml's CPU semantics."""

from __future__ import annotations

import jax
import jax.numpy as jnp  # noqa: E402
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf import quants  # noqa: E402

from toolkit.ggml import BF16, F16, F32, I32, Q4_0, Q8_0, GGMLType, Graph, Tensor, ops  # noqa: E402
from toolkit.jaxrt import layout  # noqa: E402
from toolkit.jaxrt.kernels import eval_nodes  # noqa: E402
from toolkit.jaxrt.layout import strided_read  # noqa: E402

RNG = np.random.default_rng(1234)
I64 = GGMLType.I64


def rnd(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def run(outs: list[Tensor], feeds: dict[Tensor, np.ndarray]) -> list[np.ndarray]:
    """Evaluate the graph of outs (one jit); returns each output's logical value (numpy order, f32/i32)."""
    g = Graph(256)
    for o in outs:
        g.build_forward_expand(o)
    keys = list(feeds)

    def f(*flats: jax.Array) -> list[jax.Array]:
        env = eval_nodes(g.nodes, dict(zip(keys, flats)))
        return [x.astype(jnp.float32) if x.dtype != jnp.int32 else x for x in (env.read(o) for o in outs)]

    return [np.asarray(x) for x in jax.jit(f)(*[jnp.asarray(layout.host_storage(t, v)) for t, v in feeds.items()])]


def close(a: np.ndarray, b: np.ndarray, tol: float = 1e-5) -> None:
    np.testing.assert_allclose(np.asarray(a, np.float64).reshape(np.shape(b)), b, rtol=tol, atol=tol)


# ---- layout ---------------------------------------------------------------------------------

def test_strided_read_matches_numpy_as_strided() -> None:
    flat = np.arange(200, dtype=np.float32)
    for offset, shape, strides in [
        (0, (2, 3, 4), (12, 4, 1)),      # contiguous
        (5, (3, 4), (1, 10)),            # transposed
        (7, (2, 3, 2), (50, 8, 1)),      # rows of a wider tensor
        (3, (4, 4), (5, 7)),             # not nested: gather fallback
        (190, (2, 4), (4, 1)),           # runs to the end of the buffer
    ]:
        want = np.lib.stride_tricks.as_strided(flat[offset:], shape, tuple(4 * s for s in strides))
        got = np.asarray(strided_read(jnp.asarray(flat), offset, shape, strides))
        np.testing.assert_array_equal(got, want)


def test_views_permute_transpose_cont() -> None:
    a = ops.new_tensor_3d(F32, 6, 4, 3, "a")
    x = rnd(3, 4, 6)
    v = ops.view_2d(a, 3, 5, a.nb[1], a.nb[0] * 2)           # 5 rows of 3 from element 2
    p = ops.cont(ops.permute(a, 2, 0, 1, 3))                 # dim0 -> 2, dim1 -> 0, dim2 -> 1
    t = ops.cont(ops.transpose(ops.reshape_2d(a, 12, 6)))
    rv, rp, rt = run([ops.cont(v), p, t], {a: x})
    flat = x.reshape(-1)
    close(rv, flat[2 + np.arange(5)[:, None] * 6 + np.arange(3)[None, :]][None, None])
    close(rp, np.transpose(x, (2, 0, 1))[None])  # ggml dim i goes to position axes[i]
    close(rt, x.reshape(6, 12).T[None, None])


# ---- mul_mat for every weight type ----------------------------------------------------------

def _weight(type_: GGMLType, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(stored value, the f32 values ggml computes with) for a [rows, k] weight."""
    if type_ is F32:
        return w, w
    if type_ is F16:
        return w.astype(np.float16), w.astype(np.float16).astype(np.float32)
    if type_ is BF16:
        raw = quants.quantize(w, QT.BF16)
        return raw, quants.dequantize(raw, QT.BF16)
    qt = QT.Q8_0 if type_ is Q8_0 else QT.Q4_0
    raw = quants.quantize(w, qt)
    return raw, quants.dequantize(raw, qt)


@pytest.mark.parametrize("type_", [F32, F16, BF16, Q8_0, Q4_0])
def test_mul_mat_weight_types(type_: GGMLType) -> None:
    w = rnd(24, 64)
    x = rnd(5, 64)
    a = ops.new_tensor_2d(type_, 64, 24, "w")
    b = ops.new_tensor_2d(F32, 64, 5, "x")
    stored, deq = _weight(type_, w)
    feed = stored.view(np.uint8) if type_ is BF16 else stored
    (out,) = run([ops.mul_mat(a, b)], {a: feed, b: x})
    # ggml_compute_forward_mul_mat converts src1 to src0's vec_dot_type: F16 and BF16 for those types
    # (the quantized types' Q8_0 is not reproduced: the runtime keeps src1 in f32 there)
    xs = _weight(type_, x)[1] if type_ in (F16, BF16) else x
    close(out, (xs @ deq.T)[None, None], 1e-4)


def test_mul_mat_broadcasts_dims_2_3_like_gqa() -> None:
    k = ops.new_tensor_3d(F32, 8, 7, 2, "k")     # [d, n_kv, n_head_kv]
    q = ops.new_tensor_3d(F32, 8, 3, 6, "q")     # [d, n_tokens, n_head]
    K, Q = rnd(2, 7, 8), rnd(6, 3, 8)
    (out,) = run([ops.mul_mat(k, q)], {k: K, q: Q})
    want = np.stack([Q[h] @ K[h // 3].T for h in range(6)])  # head h reads kv head h / (6/2)
    close(out, want[None])


def test_dequant_q8_0_q4_0_match_gguf() -> None:
    from toolkit.jaxrt.quant import dequant_q4_0, dequant_q8_0

    w = rnd(4, 96)
    for qt, fn in ((QT.Q8_0, dequant_q8_0), (QT.Q4_0, dequant_q4_0)):
        raw = quants.quantize(w, qt)
        np.testing.assert_array_equal(np.asarray(fn(jnp.asarray(raw))), quants.dequantize(raw, qt))


# ---- rows ------------------------------------------------------------------------------------

@pytest.mark.parametrize("type_", [F32, F16, Q8_0, Q4_0])
def test_get_rows(type_: GGMLType) -> None:
    w = rnd(10, 32)
    a = ops.new_tensor_2d(type_, 32, 10, "emb")
    ids = ops.new_tensor_1d(I32, 4, "ids")
    stored, deq = _weight(type_, w)
    (out,) = run([ops.get_rows(a, ids)], {a: stored, ids: np.array([3, 0, 9, 3], np.int32)})
    close(out, deq[[3, 0, 9, 3]][None, None])


def test_set_rows_into_cache_then_read_view() -> None:
    cache = ops.new_tensor_2d(F16, 8, 6, "cache_k")
    rows = ops.new_tensor_2d(F32, 8, 2, "kcur")
    ids = ops.new_tensor_1d(I64, 2, "k_idxs")
    sr = ops.set_rows(cache, rows, ids)
    R = rnd(2, 8)
    g = Graph(16)
    g.build_forward_expand(sr)
    base = np.zeros((6, 8), np.float16)
    base[1] = 1.5
    env = eval_nodes(g.nodes, {cache: jnp.asarray(layout.host_storage(cache, base)),
                               rows: jnp.asarray(R.ravel()),
                               ids: jnp.asarray(layout.host_storage(ids, np.array([4, 2], np.int64)))})
    got = np.asarray(env.values[cache]).reshape(6, 8).astype(np.float32)
    want = base.astype(np.float32)
    want[4], want[2] = R[0].astype(np.float16), R[1].astype(np.float16)
    np.testing.assert_array_equal(got, want)


def test_set_rows_transposed_v_cache_element_rows() -> None:
    # llama's V cache without flash attention: [kv_size, n_embd_v] transposed, rows of 1 element
    kv, dv, nt = 5, 4, 2
    v_cache = ops.new_tensor_1d(F32, kv * dv, "cache_v")
    view = ops.reshape_2d(v_cache, 1, kv * dv)
    vcur = ops.new_tensor_2d(F32, 1, dv * nt, "vcur")
    idx = ops.new_tensor_1d(I64, dv * nt, "v_idxs")
    cells = [3, 1]
    ids = np.array([c + j * kv for t, c in enumerate(cells) for j in range(dv)], np.int64)
    V = rnd(nt, dv)
    sr = ops.set_rows(view, vcur, idx)
    vt = ops.cont(ops.view_2d(v_cache, kv, dv, kv * 4, 0))  # [kv, dv] rows of the transposed cache
    g = Graph(16)
    g.build_forward_expand(sr)
    g.build_forward_expand(vt)
    env = eval_nodes(g.nodes, {v_cache: jnp.zeros(kv * dv), vcur: jnp.asarray(V.ravel()),
                               idx: jnp.asarray(layout.host_storage(idx, ids))})
    got = np.asarray(env.read(vt)).reshape(dv, kv)
    want = np.zeros((dv, kv), np.float32)
    for t, c in enumerate(cells):
        want[:, c] = V[t]
    np.testing.assert_array_equal(got, want)


def test_cpy_casts_into_strided_destination() -> None:
    a = ops.new_tensor_2d(F32, 3, 4, "a")
    b = ops.new_tensor_2d(F16, 4, 3, "b")
    dst = ops.transpose(b)  # [3, 4] view with swapped strides
    c = ops.cpy(a, dst)
    A = rnd(4, 3)
    g = Graph(8)
    g.build_forward_expand(c)
    env = eval_nodes(g.nodes, {a: jnp.asarray(A.ravel()), b: jnp.zeros(12, jnp.float16)})
    got = np.asarray(env.values[b]).reshape(3, 4).astype(np.float32)
    np.testing.assert_array_equal(got, A.T.astype(np.float16).astype(np.float32))


# ---- element-wise and norms ------------------------------------------------------------------

def test_add_mul_tile_rule_scale_rms_norm() -> None:
    a = ops.new_tensor_3d(F32, 6, 4, 2, "a")
    b = ops.new_tensor_1d(F32, 6, "b")
    c = ops.new_tensor_3d(F32, 3, 2, 1, "c")      # tiles along dims 0 and 1 (ggml repeat is i % ne)
    A, B, C = rnd(2, 4, 6), rnd(6), rnd(1, 2, 3)
    outs = run([ops.mul(a, b), ops.add(a, c), ops.scale(a, 0.5, 1.0), ops.rms_norm(a, 1e-5)],
               {a: A, b: B, c: C})
    close(outs[0], (A * B)[None])
    close(outs[1], (A + np.tile(C, (2, 2, 2)))[None])
    close(outs[2], (A * 0.5 + 1.0)[None])
    close(outs[3], (A / np.sqrt((A * A).mean(-1, keepdims=True) + 1e-5))[None])


def test_swiglu_split_and_fused() -> None:
    g_ = ops.new_tensor_2d(F32, 8, 3, "gate")
    u = ops.new_tensor_2d(F32, 8, 3, "up")
    f = ops.new_tensor_2d(F32, 16, 3, "fused")
    G, U, F_ = rnd(3, 8), rnd(3, 8), rnd(3, 16)
    silu = lambda x: x / (1 + np.exp(-x))  # noqa: E731
    r1, r2 = run([ops.swiglu_split(g_, u), ops.swiglu(f)], {g_: G, u: U, f: F_})
    close(r1, (silu(G) * U)[None, None])
    close(r2, (silu(F_[:, :8]) * F_[:, 8:])[None, None])


# ---- rope, softmax, attention -----------------------------------------------------------------

def rope_ref(x: np.ndarray, pos: np.ndarray, n_dims: int, base: float, neox: bool) -> np.ndarray:
    """x (T, H, D): ggml_rope with ext_factor 0, freq_scale 1, attn_factor 1."""
    out = x.astype(np.float64).copy()
    for t in range(x.shape[0]):
        for i0 in range(0, n_dims, 2):
            theta = pos[t] * base ** (-i0 / n_dims)
            c, s = np.cos(theta), np.sin(theta)
            j0, j1 = (i0 // 2, i0 // 2 + n_dims // 2) if neox else (i0, i0 + 1)
            x0, x1 = x[t, :, j0], x[t, :, j1]
            out[t, :, j0] = x0 * c - x1 * s
            out[t, :, j1] = x0 * s + x1 * c
    return out


@pytest.mark.parametrize("mode", [0, 2])
def test_rope_modes(mode: int) -> None:
    a = ops.new_tensor_3d(F32, 16, 2, 5, "q")    # [head_dim, n_head, n_tokens]
    pos = ops.new_tensor_1d(I32, 5, "pos")
    X, P = rnd(5, 2, 16), np.array([0, 1, 7, 30, 100], np.int32)
    (out,) = run([ops.rope_ext(a, pos, None, 12, mode=mode, freq_base=10000.0)], {a: X, pos: P})
    close(out, rope_ref(X, P, 12, 10000.0, neox=mode == 2)[None], 1e-4)


def test_soft_max_ext_mask_scale() -> None:
    kq = ops.new_tensor_3d(F32, 6, 3, 2, "kq")      # [n_kv, n_tokens, n_head]
    mask = ops.new_tensor_2d(F32, 6, 4, "mask")     # padded rows: only the first 3 are read
    X = rnd(2, 3, 6)
    M = np.where(np.arange(6)[None, :] <= np.arange(4)[:, None] + 2, 0.0, -np.inf).astype(np.float32)
    (out,) = run([ops.soft_max_ext(kq, mask, 0.25, 0.0)], {kq: X, mask: M})
    z = X * 0.25 + M[:3][None]
    e = np.exp(z - z.max(-1, keepdims=True))
    close(out, (e / e.sum(-1, keepdims=True))[None])


def test_flash_attn_ext_gqa_mask() -> None:
    d, nt, nh, nkv, nhk = 8, 3, 4, 5, 2
    q = ops.new_tensor_3d(F32, d, nt, nh, "q")
    k = ops.new_tensor_3d(F16, d, nkv, nhk, "k")
    v = ops.new_tensor_3d(F16, d, nkv, nhk, "v")
    mask = ops.new_tensor_2d(F16, nkv, 4, "mask")
    Q, K, V = rnd(nh, nt, d), rnd(nhk, nkv, d).astype(np.float16), rnd(nhk, nkv, d).astype(np.float16)
    M = np.where(np.arange(nkv)[None, :] <= np.arange(4)[:, None] + 2, 0.0, -np.inf).astype(np.float16)
    (out,) = run([ops.flash_attn_ext(q, k, v, mask, 0.3)], {q: Q, k: K, v: V, mask: M})
    want = np.zeros((nt, nh, d))
    for h in range(nh):
        s = Q[h] @ K[h // 2].astype(np.float32).T * 0.3 + M[:nt].astype(np.float32)
        p = np.exp(s - s.max(-1, keepdims=True))
        want[:, h] = (p / p.sum(-1, keepdims=True)) @ V[h // 2].astype(np.float32)
    close(out, want[None], 1e-4)  # ggml ne [d, n_head, n_tokens]


@pytest.mark.parametrize("type_", [Q8_0, Q4_0])
def test_set_rows_into_quantized_cache_quantizes_like_ggml(type_: GGMLType) -> None:
    cache = ops.new_tensor_2d(type_, 64, 5, "cache_k")
    rows = ops.new_tensor_2d(F32, 64, 2, "kcur")
    ids = ops.new_tensor_1d(I64, 2, "k_idxs")
    R = rnd(2, 64)
    R[0, :32] = np.linspace(-1, 1, 32)  # exact halves and a block with a negative extreme
    g = Graph(8)
    g.build_forward_expand(ops.set_rows(cache, rows, ids))
    base = jnp.zeros(layout.storage_units(cache), jnp.uint8)
    env = eval_nodes(g.nodes, {cache: base, rows: jnp.asarray(R.ravel()),
                               ids: jnp.asarray(layout.host_storage(ids, np.array([3, 0], np.int64)))})
    got = np.asarray(env.values[cache]).reshape(5, -1)
    qt = QT.Q8_0 if type_ is Q8_0 else QT.Q4_0
    want = quants.quantize(R, qt)
    np.testing.assert_array_equal(got[3], want[0])
    np.testing.assert_array_equal(got[0], want[1])


def test_pad_and_scale_inplace() -> None:
    """ggml_pad: zeros after each dimension (ggml_compute_forward_pad); ggml_scale_inplace writes into the
    tensor it views (a hybrid's build_rs clears one state's row that way), ggml_scale makes a new one."""
    a = ops.new_tensor_2d(F32, 3, 2, "a")
    A = rnd(2, 3)
    close(run([ops.pad(a, 2, 1)], {a: A})[0], np.pad(A, ((0, 1), (0, 2))))
    s = ops.new_tensor_2d(F32, 4, 3, "s")
    S = rnd(3, 4)
    row = ops.view_1d(s, 4, 1 * s.nb[1])
    cleared = ops.scale_inplace(row, 0.0)
    after = ops.get_rows(s, ops.new_tensor_1d(I32, 3, "ids"))
    g = Graph(16)
    for t in (ops.scale(s, 0.0), cleared, after):
        g.build_forward_expand(t)
    ids = after.srcs[1]
    env = eval_nodes(g.nodes, {s: jnp.asarray(S.ravel()), ids: jnp.asarray(np.array([0, 1, 2], np.int32))})
    want = S.copy()
    want[1] = 0.0
    np.testing.assert_array_equal(np.asarray(env.read(after)).reshape(3, 4), want)


def test_an_op_without_a_kernel_is_refused_by_name() -> None:
    """The table holds the ops the runtime runs; any other op is an UnsupportedFeature naming it."""
    from toolkit.errors import UnsupportedFeature
    from toolkit.ggml.tensor import Op
    from toolkit.jaxrt.kernels import KERNELS

    assert Op.DIAG_MASK_ZERO not in KERNELS
    x = ops.new_tensor_2d(F32, 4, 4, "x").set_input()
    node = ops.diag_mask_inf(x, 0).set_name("masked")
    node.op = Op.DIAG_MASK_ZERO
    with pytest.raises(UnsupportedFeature, match=r"no kernel for DIAG_MASK_ZERO \(node 'masked'\)") as e:
        eval_nodes([node], {x: jnp.zeros(16, jnp.float32)})
    assert e.value.feature == "op DIAG_MASK_ZERO"


def test_every_kernel_reads_its_sources_by_slot() -> None:
    """A required source slot left empty is a ParameterError naming the node and the slot, not a crash."""
    from toolkit.errors import ParameterError

    x = ops.new_tensor_2d(F32, 4, 2, "x").set_input()
    y = ops.add(x, x).set_name("y")
    y.src = [x, None]
    with pytest.raises(ParameterError, match=r"y\.src\[1\]"):
        eval_nodes([y], {x: jnp.zeros(8, jnp.float32)})
