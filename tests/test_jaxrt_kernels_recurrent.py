"""The recurrent layers' ops in JAX (toolkit.jaxrt.kernels_recurrent) against numpy references written
loop for loop from ggml-cpu's ops.cpp (ggml_compute_forward_ssm_conv_f32, _l2_norm_f32,
_gated_delta_net_one_chunk, ggml_mrope_cache_init with rotate_pairs, op_softplus)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from toolkit.errors import ParameterError
from toolkit.ggml import F32, I32, Graph, Tensor, ops
from toolkit.jaxrt import layout
from toolkit.jaxrt.kernels import eval_nodes
from toolkit.jaxrt.kernels_recurrent import mrope_pair_positions

RNG = np.random.default_rng(4321)


def rnd(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def run(outs: list[Tensor], feeds: dict[Tensor, np.ndarray]) -> list[np.ndarray]:
    g = Graph(256)
    for o in outs:
        g.build_forward_expand(o)
    keys = list(feeds)

    def f(*flats: jax.Array) -> list[jax.Array]:
        env = eval_nodes(g.nodes, dict(zip(keys, flats)))
        return [env.read(o).astype(jnp.float32) for o in outs]

    return [np.asarray(x) for x in jax.jit(f)(*[jnp.asarray(layout.host_storage(t, v)) for t, v in feeds.items()])]


def close(a: np.ndarray, b: np.ndarray, tol: float = 1e-5) -> None:
    np.testing.assert_allclose(np.asarray(a, np.float64).reshape(np.shape(b)), b, rtol=tol, atol=tol)


def test_ssm_conv_sliding_window() -> None:
    d_conv, d_inner, n_t, n_s = 4, 6, 5, 2
    sx = ops.new_tensor_3d(F32, d_conv - 1 + n_t, d_inner, n_s, "sx")
    c = ops.new_tensor_2d(F32, d_conv, d_inner, "c")
    SX, C = rnd(n_s, d_inner, d_conv - 1 + n_t), rnd(d_inner, d_conv)
    (out,) = run([ops.ssm_conv(sx, c)], {sx: SX, c: C})
    want = np.zeros((n_s, n_t, d_inner))
    for i3 in range(n_s):
        for i2 in range(n_t):
            for i1 in range(d_inner):
                want[i3, i2, i1] = sum(SX[i3, i1, i2 + i0] * C[i1, i0] for i0 in range(d_conv))
    close(out, want[None])


def test_l2_norm_and_its_eps() -> None:
    a = ops.new_tensor_2d(F32, 8, 3, "a")
    X = rnd(3, 8)
    X[1] = 1e-9                                     # a row below eps is scaled by 1 / eps
    (out,) = run([ops.l2_norm(a, 1e-6)], {a: X})
    want = X / np.maximum(np.sqrt((X.astype(np.float64) ** 2).sum(-1, keepdims=True)), 1e-6)
    close(out, want[None, None])


def test_softplus_threshold() -> None:
    a = ops.new_tensor_1d(F32, 6, "a")
    X = np.array([-30.0, -1.0, 0.0, 3.0, 20.5, 100.0], np.float32)
    (out,) = run([ops.softplus(a)], {a: X})
    want = np.where(X > 20.0, X, np.log1p(np.exp(np.minimum(X, 20.0))))
    close(out, want[None, None, None], 1e-6)


def delta_net_ref(Q: np.ndarray, K_: np.ndarray, V: np.ndarray, G: np.ndarray, B: np.ndarray, S: np.ndarray,
                  n_snap: int) -> np.ndarray:
    """ggml_compute_forward_gated_delta_net_one_chunk, loop for loop (numpy order arrays)."""
    n_seqs, n_tokens, H, S_v = V.shape
    attn = np.zeros((n_seqs, n_tokens, H, S_v))
    snaps = np.zeros((n_snap, n_seqs, H, S_v, S_v))
    kda = G.shape[-1] == S_v
    for iv3 in range(n_seqs):
        for iv1 in range(H):
            iq1, ik1 = iv1 % Q.shape[2], iv1 % K_.shape[2]
            iq3, ik3 = iv3 // (n_seqs // Q.shape[0]), iv3 // (n_seqs // K_.shape[0])
            m = S[iv3, iv1].astype(np.float64).copy()             # m[j][i] = S[i][j]
            for t in range(n_tokens):
                q, k, v = Q[iq3, t, iq1], K_[ik3, t, ik1], V[iv3, t, iv1]
                g, b = G[iv3, t, iv1], B[iv3, t, iv1, 0]
                if kda:
                    for j in range(S_v):
                        m[j] *= np.exp(g)
                else:
                    m *= np.exp(g[0])
                delta = np.array([(v[j] - m[j] @ k) * b for j in range(S_v)])
                for j in range(S_v):
                    m[j] += delta[j] * k
                attn[iv3, t, iv1] = [m[j] @ q / np.sqrt(S_v) for j in range(S_v)]
                slot = n_tokens - 1 - t
                if slot < n_snap:
                    snaps[slot, iv3, iv1] = m
    return np.concatenate([attn.ravel(), snaps.ravel()])


@pytest.mark.parametrize(("n_tokens", "n_snap", "kda", "hq"), [(5, 1, False, 2), (3, 4, False, 4), (4, 2, True, 4)])
def test_gated_delta_net(n_tokens: int, n_snap: int, kda: bool, hq: int) -> None:
    """Outputs then the state snapshots (slot 0 the newest; a slot older than the ubatch reads 0); Q/K heads
    fewer than V's are tiled (iv1 % ne1), g one value per head or (KDA) one per state row."""
    S_v, H, n_seqs = 8, 4, 2
    q = ops.new_tensor_4d(F32, S_v, hq, n_tokens, n_seqs, "q")
    k = ops.new_tensor_4d(F32, S_v, hq, n_tokens, n_seqs, "k")
    v = ops.new_tensor_4d(F32, S_v, H, n_tokens, n_seqs, "v")
    g = ops.new_tensor_4d(F32, S_v if kda else 1, H, n_tokens, n_seqs, "g")
    beta = ops.new_tensor_4d(F32, 1, H, n_tokens, n_seqs, "beta")
    s = ops.new_tensor_4d(F32, S_v, S_v, H, n_seqs, "s")
    Q, K_, V = rnd(n_seqs, n_tokens, hq, S_v, scale=0.3), rnd(n_seqs, n_tokens, hq, S_v, scale=0.3), rnd(
        n_seqs, n_tokens, H, S_v)
    G = -np.abs(rnd(n_seqs, n_tokens, H, S_v if kda else 1, scale=0.5))
    B = 1 / (1 + np.exp(-rnd(n_seqs, n_tokens, H, 1)))
    S = rnd(n_seqs, H, S_v, S_v, scale=0.1)
    (out,) = run([ops.gated_delta_net(q, k, v, g, beta, s, n_snap)], {q: Q, k: K_, v: V, g: G, beta: B, s: S})
    close(out.ravel(), delta_net_ref(Q, K_, V, G, B.astype(np.float32), S, n_snap), 1e-4)


def mrope_ref(x: np.ndarray, pos: np.ndarray, n_dims: int, sections: tuple[int, ...], imrope: bool,
              base: float) -> np.ndarray:
    """x (T, H, D): ggml_mrope_cache_init (ext_factor 0) and rotate_pairs(n_dims, n_dims / 2)."""
    T = x.shape[0]
    out = x.astype(np.float64).copy()
    sect_dims = sum(sections)
    for t in range(T):
        pt, ph, pw, pe = pos[t], pos[t + T], pos[t + 2 * T], pos[t + 3 * T]
        for i0 in range(0, n_dims, 2):
            sector = (i0 // 2) % sect_dims
            if imrope:
                p = (ph if sector % 3 == 1 and sector < 3 * sections[1] else
                     pw if sector % 3 == 2 and sector < 3 * sections[2] else
                     pt if sector % 3 == 0 and sector < 3 * sections[0] else pe)
            else:
                p = (pt if sector < sections[0] else ph if sector < sections[0] + sections[1] else
                     pw if sector < sum(sections[:3]) else pe)
            theta = p * base ** (-i0 / n_dims)
            j0, j1 = i0 // 2, i0 // 2 + n_dims // 2
            x0, x1 = x[t, :, j0], x[t, :, j1]
            out[t, :, j0] = x0 * np.cos(theta) - x1 * np.sin(theta)
            out[t, :, j1] = x0 * np.sin(theta) + x1 * np.cos(theta)
    return out


@pytest.mark.parametrize("mode", [8, 40])
def test_rope_multi(mode: int) -> None:
    """ggml_rope_multi over 16 of 24 dimensions, sections (2, 3, 3, 0): four distinct positions per token."""
    T, H, D, n_dims, sections = 4, 2, 24, 16, (2, 3, 3, 0)
    a = ops.new_tensor_3d(F32, D, H, T, "q")
    pos = ops.new_tensor_1d(I32, 4 * T, "pos")
    X = rnd(T, H, D)
    P = np.array([0, 3, 9, 40, 1, 5, 11, 50, 2, 6, 13, 60, 7, 8, 9, 10], np.int32)
    (out,) = run([ops.rope_multi(a, pos, None, n_dims, sections, mode, freq_base=10000.0)], {a: X, pos: P})
    close(out, mrope_ref(X, P, n_dims, sections, mode == 40, 10000.0)[None], 1e-4)


def test_rope_multi_text_positions_are_plain_neox() -> None:
    """Text tokens (t = h = w, e = 0, as llm_graph_input_pos fills them) under IMROPE rotate like NEOX."""
    pos = jnp.asarray(np.array([5, 6, 5, 6, 5, 6, 0, 0], np.int32))
    got = np.asarray(mrope_pair_positions(pos, (11, 11, 10, 0), 40, 2, 16))
    np.testing.assert_array_equal(got, np.array([[5.0] * 16, [6.0] * 16]))


def test_rope_multi_refuses_vision_and_bad_sections() -> None:
    pos = jnp.zeros(8, jnp.int32)
    with pytest.raises(ParameterError, match="mode"):
        mrope_pair_positions(pos, (1, 1, 1, 1), 24, 2, 4)
    with pytest.raises(ParameterError, match="sections"):
        mrope_pair_positions(pos, (1, 1, 1), 40, 2, 4)
