"""toolkit.jaxrt.quant's kernels of the ternary, IQ1/IQ2/IQ3, NVFP4, Q1_0 and Q2_0 types: bit for bit against
gguf-py's numpy dequantization (gguf.quants) where it has one, else against scalar loops over the block
layouts of ggml-common.h written here; and tiny llama GGUFs of each type through the runtime against a
float64 numpy forward over the dequantized weights."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from toolkit.jaxrt.devices import request_cpu_devices

request_cpu_devices(4)  # as test_jaxrt_llama, whose helpers run the model tests below

import jax.numpy as jnp  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf import quants  # noqa: E402
from llama_ref64 import llama_forward64  # noqa: E402
from test_jaxrt_llama import PROMPT, make_runtime  # noqa: E402
from test_jaxrt_quant import assert_bits_equal, jit_dequantize, tiny_of  # noqa: E402
from test_jaxrt_quant import block_weights as quant_block_weights  # noqa: E402

from toolkit.ggml.types import GGMLType  # noqa: E402
from toolkit.jaxrt.compile import enable_persistent_cache  # noqa: E402
from toolkit.jaxrt.gguf_io import SUPPORTED, read_gguf, write_gguf  # noqa: E402
from toolkit.jaxrt.quant import DEQUANT, dequantize  # noqa: E402
from toolkit.models import HParams  # noqa: E402

# byte offsets of the ggml_half fields of each block struct (ggml-common.h); random bytes are valid
# blocks once these hold finite f16 values. block_iq1_m has its f16 scale in the top nibbles of its
# four uint16 scales (iq1m_scale_t); block_nvfp4 has no f16 field (UE4M3 bytes, all finite).
F16_FIELDS: dict[GGMLType, tuple[int, ...]] = {
    GGMLType.TQ1_0: (52,),      # block_tq1_0: qs[48], qh[4], d
    GGMLType.TQ2_0: (64,),      # block_tq2_0: qs[64], d
    GGMLType.IQ2_XXS: (0,),     # block_iq2_xxs: d, qs[32] (uint16)
    GGMLType.IQ2_XS: (0,),      # block_iq2_xs: d, qs[32] (uint16), scales[8]
    GGMLType.IQ2_S: (0,),       # block_iq2_s: d, qs[64], qh[8], scales[8]
    GGMLType.IQ3_XXS: (0,),     # block_iq3_xxs: d, qs[96]
    GGMLType.IQ3_S: (0,),       # block_iq3_s: d, qs[64], qh[8], signs[32], scales[4]
    GGMLType.IQ1_S: (0,),       # block_iq1_s: d, qs[32], qh[8] (uint16)
    GGMLType.IQ1_M: (),         # block_iq1_m: qs[32], qh[16], scales[8]
    GGMLType.NVFP4: (),         # block_nvfp4: d[4] (UE4M3), qs[32]
    GGMLType.Q1_0: (0,),        # block_q1_0: d, qs[16]
    GGMLType.Q2_0: (0,),        # block_q2_0: d, qs[16]
}
GGUF_TYPES = [t for t in F16_FIELDS if t not in (GGMLType.Q1_0, GGMLType.Q2_0)]  # gguf.quants dequantizes
NEW_TYPES = list(F16_FIELDS)


def _f16_bits(shape: tuple[int, ...], rng: np.random.Generator, scale: float | None) -> np.ndarray:
    if scale is None:   # any finite f16: normals, subnormals, signed zeros
        bits = rng.integers(0, 1 << 16, shape, dtype=np.uint16)
        return np.where((bits & 0x7C00) == 0x7C00, bits ^ 0x4000, bits).astype(np.uint16)
    mag = rng.uniform(scale / 2, scale, shape) * rng.choice([-1.0, 1.0], shape)
    return mag.astype(np.float16).view(np.uint16)


def random_blocks(type_: GGMLType, shape: tuple[int, ...], rng: np.random.Generator,
                  scale: float | None = None) -> np.ndarray:
    """Random uint8 blocks, ``shape[:-1]`` rows of ``shape[-1]`` blocks, with finite f16 fields (any finite
    bit pattern when ``scale`` is None, else values in +-[scale/2, scale]); NVFP4's UE4M3 scales are random
    bytes (bits 0..6 below 0x70 when ``scale`` is given, so that the values stay moderate)."""
    raw = rng.integers(0, 256, (*shape, type_.type_size), dtype=np.uint8)
    for off in F16_FIELDS[type_]:
        raw[..., off:off + 2] = _f16_bits(shape, rng, scale)[..., None].view(np.uint8)
    if type_ is GGMLType.IQ1_M:
        d = _f16_bits(shape, rng, scale)
        sc = raw[..., 48:56].copy().view(np.uint16) & 0x0FFF
        for k in range(4):
            sc[..., k] |= ((d >> (4 * k)) & 0xF) << 12
        raw[..., 48:56] = sc.view(np.uint8)
    if type_ is GGMLType.NVFP4 and scale is not None:
        e = rng.integers(0x30, 0x40, (*shape, 4), dtype=np.uint8)   # UE4M3 exponents 6, 7: scales 0.5 .. 1
        raw[..., :4] = e
    return raw.reshape(*shape[:-1], shape[-1] * type_.type_size)


def q1_q2_reference(raw: np.ndarray, type_: GGMLType) -> np.ndarray:
    """block_q1_0 / block_q2_0 (ggml-common.h: a ggml_half d, then qs) decoded element by element: Q1_0's
    element j is bit j % 8 of qs[j / 8], +d when set, else -d; Q2_0's is bits 2(j % 4).. of qs[j / 4],
    00 = -1, 01 = 0, 10 = +1, 11 = +2 times d."""
    qk = type_.blck_size
    rows = raw.reshape(-1, raw.shape[-1])
    out = np.zeros((rows.shape[0], rows.shape[1] // 18 * qk), np.float32)
    for r in range(rows.shape[0]):
        for i in range(rows.shape[1] // 18):
            blk = rows[r, 18 * i:18 * (i + 1)]
            d = np.float32(blk[:2].view(np.float16)[0])
            for j in range(qk):
                if type_ is GGMLType.Q1_0:
                    v = d if (blk[2 + j // 8] >> (j % 8)) & 1 else -d
                else:
                    v = np.float32(int((blk[2 + j // 4] >> (2 * (j % 4))) & 3) - 1) * d
                out[r, i * qk + j] = v
    return out.reshape(*raw.shape[:-1], -1)


def reference(raw: np.ndarray, type_: GGMLType) -> np.ndarray:
    if type_ in GGUF_TYPES:
        return np.asarray(quants.dequantize(raw, QT(type_.ggml_id)), np.float32)
    return q1_q2_reference(raw, type_)


@pytest.mark.parametrize("type_", NEW_TYPES, ids=lambda t: t.name)
def test_random_blocks_equal_the_reference_bit_for_bit(type_: GGMLType) -> None:
    # Exact: each product is a value of at most 11 + 5 + 6 significant bits (an f16 scale, a small odd or
    # half-integer factor, a grid value) times +-1, exact in f32, so order and fusion cannot change it.
    rng = np.random.default_rng(100 + type_.ggml_id)
    raw = random_blocks(type_, (5, 3), rng)
    want = reference(raw, type_)
    got = jit_dequantize(raw, type_)
    assert got.shape == (5, 3 * type_.blck_size) and got.dtype == np.float32
    assert np.isfinite(want).all() and np.count_nonzero(want) > want.size // 3
    assert_bits_equal(got, want)


@pytest.mark.parametrize("type_", NEW_TYPES, ids=lambda t: t.name)
def test_leading_dims_and_eager_call(type_: GGMLType) -> None:
    raw = random_blocks(type_, (2, 2, 2), np.random.default_rng(9))
    want = reference(raw, type_)
    assert_bits_equal(np.asarray(dequantize(jnp.asarray(raw), type_)), want)


def test_nvfp4_scale_bytes_all_256() -> None:
    """Every UE4M3 byte as a scale (0 and 0x7F give 0, bit 7 ignored, exponent 0 subnormal) against gguf-py."""
    raw = np.zeros((64, 36), np.uint8)
    raw[:, :4] = np.arange(256, dtype=np.uint8).reshape(64, 4)
    raw[:, 4:] = 0x77                                  # every element kvalues_mxfp4[7] = 12
    assert_bits_equal(jit_dequantize(raw.reshape(1, -1), GGMLType.NVFP4),
                      reference(raw.reshape(1, -1), GGMLType.NVFP4))


@pytest.mark.parametrize("type_", [GGMLType.TQ1_0, GGMLType.TQ2_0], ids=lambda t: t.name)
def test_ternary_round_trip(type_: GGMLType) -> None:
    w = np.random.default_rng(4).standard_normal((3, 512)).astype(np.float32)
    raw = quants.quantize(w, QT(type_.ggml_id))
    want = reference(raw, type_)
    assert_bits_equal(jit_dequantize(raw, type_), want)
    assert len(np.unique(np.round(want[0, :256] / np.abs(want[0, :256]).max(), 3))) == 3   # -d, 0, d


def test_every_weight_type_of_ggml_runs() -> None:
    skip = {GGMLType.Q8_1, GGMLType.Q8_K}   # vec_dot types, not written to files
    quantized = {t for t in GGMLType if t.is_quantized} - skip
    assert quantized <= set(DEQUANT), quantized - set(DEQUANT)
    assert set(NEW_TYPES) <= set(SUPPORTED)


# ---- tiny llama GGUFs of each type through toolkit.jaxrt.runtime ----------------------------------

def block_weights(hp: HParams) -> dict[str, np.ndarray]:
    """test_jaxrt_quant's weights with this module's :func:`random_blocks` (the types gguf-py may not know),
    their scale measured through :func:`reference`."""
    return quant_block_weights(hp, dequant=reference, probe_rows=16, blocks=random_blocks)


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    enable_persistent_cache(str(tmp_path_factory.mktemp("jaxcache")))


@pytest.mark.parametrize("type_", NEW_TYPES, ids=lambda t: t.name)
def test_tiny_llama_logits_equal_a_float64_forward(type_: GGMLType, tmp_path: Path, jax_cache: None) -> None:
    hp = tiny_of(type_)
    path = tmp_path / f"{hp.name}.gguf"
    vals = block_weights(hp)
    write_gguf(path, hp, vals)
    g = read_gguf(path)
    mats = [n for n, x in g.tensors.items() if len(x.ne) == 2]
    assert len(mats) == 2 * 7 + 2 and all(g.tensors[n].type is type_ for n in mats)
    w = {n: (reference(v, type_).reshape(v.shape[0], -1) if v.dtype == np.uint8 else v) for n, v in vals.items()}
    rt = make_runtime(str(path), devices=("sim",), ngl=2)   # token_embd through GET_ROWS, the rest MUL_MAT
    got = rt.decode(PROMPT)
    want = llama_forward64(w, hp, PROMPT)
    err = np.abs(got - want).max() / want.std()
    print(f"{type_.name}: max|diff|/std = {err:.2e}")
    # f32 kernels against float64: measured 2.3e-6 to 4.5e-6 for the twelve types; a wrong grid, sign or
    # scale field moves it by orders of magnitude
    assert want.std() > 0.1 and err < 1e-4, err


# ---- NVFP4's per-tensor scales (build_lora_mm's w_s) ----------------------------------------------

SCALED = ("blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.0.attn_output.weight", "blk.1.ffn_down.weight",
          "blk.1.ffn_gate.weight", "output.weight")


def test_nvfp4_weight_scales_add_one_mul_each_and_scale_the_logits(tmp_path: Path, jax_cache: None) -> None:
    """A ``<weight>.scale`` (F32 [1]) beside six NVFP4 weights: llama_model's generic pass loads each
    (TENSOR_NOT_REQUIRED) and build_lora_mm adds one MUL after each MUL_MAT: the graph has six nodes more than
    the same file without them, the model buffers hold them, and the logits are a float64 forward over the
    weights times their scales."""
    import dataclasses

    from toolkit.cases import summary
    from toolkit.context import Context
    from toolkit.models import ContextParams

    hp = tiny_of(GGMLType.NVFP4)
    vals = block_weights(hp)
    plain, scaled = tmp_path / "plain.gguf", tmp_path / "scaled.gguf"
    write_gguf(plain, hp, vals)
    hps = dataclasses.replace(hp, weight_scales=frozenset(SCALED))
    factors = {n.removesuffix(".weight") + ".scale": np.asarray([0.5 + 0.25 * i], np.float32)
               for i, n in enumerate(SCALED)}
    write_gguf(scaled, hps, {**vals, **factors})
    got_hp = read_gguf(scaled).hparams
    assert got_hp.weight_scales == frozenset(SCALED)
    assert HParams.from_dict(json.loads(json.dumps(got_hp.to_dict()))).weight_scales == frozenset(SCALED)
    cp = ContextParams(n_ctx=256, n_batch=256, n_ubatch=256, use_mmap=False)
    a, b = summary(Context(str(plain), cp)), summary(Context(str(scaled), cp))
    assert b["graph_nodes"] == a["graph_nodes"] + len(SCALED)
    assert b["graph_nodes_tg"] == a["graph_nodes_tg"] + len(SCALED)
    assert sum(b["model_buffers_bytes"].values()) == sum(a["model_buffers_bytes"].values()) + 32 * len(SCALED)
    w = {n: (reference(v, GGMLType.NVFP4).reshape(v.shape[0], -1) if v.dtype == np.uint8 else v)
         for n, v in vals.items()}
    for n in SCALED:
        w[n] = w[n] * factors[n.removesuffix(".weight") + ".scale"][0]
    rt = make_runtime(str(scaled), devices=("sim",), ngl=2)
    got = rt.decode(PROMPT)
    want = llama_forward64(w, hp, PROMPT)
    err = np.abs(got - want).max() / want.std()
    print(f"NVFP4 with weight scales: max|diff|/std = {err:.2e}")
    assert want.std() > 0.1 and err < 1e-4, err
    plain_logits = llama_forward64({n: v for n, v in w.items() if n not in SCALED} | {
        n: (reference(vals[n], GGMLType.NVFP4).reshape(vals[n].shape[0], -1)) for n in SCALED}, hp, PROMPT)
    assert np.abs(plain_logits - want).max() / want.std() > 0.1   # the scales change the result


def test_weight_scales_in_a_graph_that_does_not_apply_them_are_refused(tmp_path: Path) -> None:
    """An architecture not marked ``scaled_mm`` (gemma3 here: its graph with scales is not checked against
    llama.cpp's) refuses a file with weight scales with a typed error rather than risk leaving one out."""
    from toolkit.errors import UnsupportedFeature

    hp = HParams(n_layer=1, n_embd=64, n_head=2, n_head_kv=1, n_ff=128, n_vocab=64, arch="gemma3", name="g3",
                 weight_scales={"blk.0.attn_q.weight"})
    write_gguf(tmp_path / "g3.gguf", hp)
    with pytest.raises(UnsupportedFeature, match="blk.0.attn_q.weight has a .scale tensor"):
        read_gguf(tmp_path / "g3.gguf")


# ---- a Q4_K_M-style mixed file --------------------------------------------------------------------

def test_a_q4_k_m_style_file_plans_its_buffers_and_runs(tmp_path: Path, jax_cache: None) -> None:
    """Q4_K matrices with Q6_K attn_v, ffn_down and output (the tensors llama-quantize's Q4_K_M raises) and F32
    norms. Without mmap each buffer is its tensors' bytes, each padded to the CPU buffer's 32-byte alignment
    (``ggml_backend_alloc_ctx_tensors_from_buft``); the Q4_K matrices with rows % 8 == 0 go to CPU_REPACK
    (``ggml_repack_get_optimal_repack_type``: q4_K_8x8_q8_K on AVX2), the rest to CPU. The expected bytes are
    summed from gguf-py's reading of the file (not the toolkit's), by that rule; no measured llama.cpp case
    has such a file. The logits equal a float64 forward over gguf-py's dequantization."""
    import dataclasses

    from gguf import GGUFReader

    from toolkit.cases import summary
    from toolkit.context import Context
    from toolkit.models import ContextParams

    mixed = {"attn_v.weight": GGMLType.Q6_K, "ffn_down.weight": GGMLType.Q6_K, "output.weight": GGMLType.Q6_K}
    hp = dataclasses.replace(tiny_of(GGMLType.Q4_K), tensor_types=mixed)
    vals = {}
    for t in (GGMLType.Q4_K, GGMLType.Q6_K):   # each type's blocks, scaled for that type
        vals |= {n: v for n, v in quant_block_weights(dataclasses.replace(hp, dtype=t, tensor_types={})).items()
                 if v.dtype != np.uint8 or (GGMLType.Q6_K if n.endswith(tuple(mixed)) else GGMLType.Q4_K) is t}
    path = tmp_path / "q4_k_m.gguf"
    write_gguf(path, hp, vals)
    f = GGUFReader(str(path))
    types = {t.name: t.tensor_type.name for t in f.tensors}
    assert {types["blk.0.attn_v.weight"], types["output.weight"], types["blk.1.ffn_down.weight"]} == {"Q6_K"}
    assert types["blk.0.attn_q.weight"] == types["token_embd.weight"] == "Q4_K"
    assert types["blk.0.attn_norm.weight"] == "F32"
    pad = lambda n: (n + 31) // 32 * 32  # noqa: E731
    repack = sum(pad(int(t.n_bytes)) for t in f.tensors
                 if t.tensor_type.name == "Q4_K" and len(t.shape) == 2 and int(t.shape[1]) % 8 == 0
                 and t.name != "token_embd.weight")   # GET_ROWS: not a repacked op
    cpu = sum(pad(int(t.n_bytes)) for t in f.tensors) - repack
    got = summary(Context(str(path), ContextParams(n_ctx=256, n_batch=256, n_ubatch=64, use_mmap=False)))
    assert got["model_buffers_bytes"] == {"CPU": cpu, "CPU_REPACK": repack}
    w = {}
    for t in f.tensors:   # gguf-py's dequantization of what the file holds, in numpy order
        shape = tuple(int(x) for x in reversed(t.shape))
        w[t.name] = np.asarray(quants.dequantize(t.data, t.tensor_type), np.float64).reshape(shape) \
            if t.tensor_type.name != "F32" else np.asarray(t.data, np.float64).reshape(shape)
    out = make_runtime(str(path), devices=("sim",), ngl=2).decode(PROMPT)
    want = llama_forward64(w, hp, PROMPT)
    err = np.abs(out - want).max() / want.std()
    print(f"Q4_K_M-style: max|diff|/std = {err:.2e}")
    assert want.std() > 0.1 and err < 1e-4, err
