"""toolkit.jaxrt.quant's dequantization kernels against gguf-py's (gguf.quants, an independent numpy
implementation of ggml-quants.c's dequantize_row_*), and tiny llama GGUFs of each type through the runtime."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from toolkit.jaxrt.devices import request_cpu_devices

request_cpu_devices(4)  # as test_jaxrt_llama, whose helpers run the model tests below

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf import quants  # noqa: E402
from llama_ref64 import llama_forward64  # noqa: E402
from test_jaxrt_llama import PROMPT, make_runtime  # noqa: E402

from toolkit.ggml.types import GGMLType  # noqa: E402
from toolkit.jaxrt.compile import enable_persistent_cache  # noqa: E402
from toolkit.jaxrt.gguf_io import SUPPORTED, random_weights, read_gguf, write_gguf  # noqa: E402
from toolkit.jaxrt.quant import DEQUANT, dequantize  # noqa: E402
from toolkit.models import HParams, archs  # noqa: E402

# byte offsets of the ggml_half fields of each block struct (ggml-common.h): d, and m / dmin where the
# block has one. Random bytes are valid blocks once these hold finite f16 values.
F16_FIELDS = {
    GGMLType.Q4_1: (0, 2),      # block_q4_1: d, m, qs[16]
    GGMLType.Q5_0: (0,),        # block_q5_0: d, qh[4], qs[16]
    GGMLType.Q5_1: (0, 2),      # block_q5_1: d, m, qh[4], qs[16]
    GGMLType.Q2_K: (80, 82),    # block_q2_K: scales[16], qs[64], d, dmin
    GGMLType.Q3_K: (108,),      # block_q3_K: hmask[32], qs[64], scales[12], d
    GGMLType.Q4_K: (0, 2),      # block_q4_K: d, dmin, scales[12], qs[128]
    GGMLType.Q5_K: (0, 2),      # block_q5_K: d, dmin, scales[12], qh[32], qs[128]
    GGMLType.Q6_K: (208,),      # block_q6_K: ql[128], qh[64], scales[16], d
    GGMLType.IQ4_NL: (0,),      # block_iq4_nl: d, qs[16]
    GGMLType.IQ4_XS: (0,),      # block_iq4_xs: d, scales_h, scales_l[4], qs[128]
}
NEW_TYPES = list(F16_FIELDS)
QUANTIZABLE = [t for t in NEW_TYPES if t in (GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1)]  # gguf.quants.quantize


def random_blocks(type_: GGMLType, shape: tuple[int, ...], rng: np.random.Generator,
                  scale: float | None = None) -> np.ndarray:
    """Random uint8 blocks, ``shape[:-1]`` rows of ``shape[-1]`` blocks, whose f16 fields are finite: any
    finite f16 bit pattern (normals, subnormals, signed zeros) when ``scale`` is None, else uniform values
    in +-[scale/2, scale]."""
    raw = rng.integers(0, 256, (*shape, type_.type_size), dtype=np.uint8)
    for off in F16_FIELDS[type_]:
        if scale is None:
            bits = rng.integers(0, 1 << 16, shape, dtype=np.uint16)
            bits = np.where((bits & 0x7C00) == 0x7C00, bits ^ 0x4000, bits).astype(np.uint16)  # no inf / nan
        else:
            mag = rng.uniform(scale / 2, scale, shape) * rng.choice([-1.0, 1.0], shape)
            bits = mag.astype(np.float16).view(np.uint16)
        raw[..., off:off + 2] = bits[..., None].view(np.uint8)
    return raw.reshape(*shape[:-1], shape[-1] * type_.type_size)


def jit_dequantize(raw: np.ndarray, type_: GGMLType) -> np.ndarray:
    """The kernel compiled, as the runtime runs it (XLA may fuse the scale products)."""
    return np.asarray(jax.jit(partial(dequantize, type_=type_))(jnp.asarray(raw)))


def assert_bits_equal(got: np.ndarray, want: np.ndarray) -> None:
    """Equal to the bit, signed zeros included (assert_array_equal alone takes -0.0 == 0.0)."""
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("type_", NEW_TYPES, ids=lambda t: t.name)
def test_random_blocks_equal_gguf_dequantize_bit_for_bit(type_: GGMLType) -> None:
    # Exact, not within an ulp: every product in dequantize_row_* is an f16 times small integers, exact
    # in f32, except the last, which rounds once whatever the order or fusion (d*sc*q in Q6_K/IQ4_XS
    # has up to 25 significant bits); Q4_1/Q5_1/Q2_K/Q4_K/Q5_K's one add rounds once too.
    rng = np.random.default_rng(type_.ggml_id)
    raw = random_blocks(type_, (7, 5), rng)
    want = quants.dequantize(raw, QT(type_.ggml_id))
    got = jit_dequantize(raw, type_)
    assert got.shape == (7, 5 * type_.blck_size) and got.dtype == np.float32
    assert np.isfinite(want).all() and np.count_nonzero(want) > want.size // 2
    assert_bits_equal(got, want)


@pytest.mark.parametrize("type_", NEW_TYPES, ids=lambda t: t.name)
def test_leading_dims_and_eager_call(type_: GGMLType) -> None:
    """A 3-D weight's rows (a stack of experts, a GET_ROWS batch) dequantize row by row; eager = jitted."""
    raw = random_blocks(type_, (2, 3, 2), np.random.default_rng(5))
    want = quants.dequantize(raw, QT(type_.ggml_id))
    assert_bits_equal(np.asarray(dequantize(jnp.asarray(raw), type_)), want)
    assert_bits_equal(jit_dequantize(raw, type_), want)


@pytest.mark.parametrize("type_", QUANTIZABLE, ids=lambda t: t.name)
def test_round_trip_of_quantized_values(type_: GGMLType) -> None:
    w = np.random.default_rng(3).standard_normal((6, 256)).astype(np.float32)
    raw = quants.quantize(w, QT(type_.ggml_id))
    want = quants.dequantize(raw, QT(type_.ggml_id))
    assert_bits_equal(jit_dequantize(raw, type_), want)
    assert np.abs(want - w).max() < 0.2 * np.abs(w).max()  # a real quantization of w, not noise


def test_the_runtime_runs_every_type_it_dequantizes() -> None:
    assert set(NEW_TYPES) <= set(DEQUANT)
    assert set(SUPPORTED) == {GGMLType.F32, GGMLType.F16, GGMLType.BF16, *DEQUANT}


# ---- tiny llama GGUFs of each type through toolkit.jaxrt.runtime ----------------------------------

def tiny_of(type_: GGMLType) -> HParams:
    """Every matrix of this llama has rows of 256 or 512 (whole QK_K super-blocks): all are ``type_``."""
    return HParams(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_vocab=256, dtype=type_,
                   name=f"tiny256_{type_.lower}")


def block_weights(hp: HParams, seed: int = 7, std: float = 0.05, dequant: Callable[..., Any] | None = None,
                  probe_rows: int = 64, blocks: Callable[..., np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """hp's weights: random valid blocks (``blocks``, :func:`random_blocks` by default) for the quantized
    matrices, their scale fields set so that the values have about ``std`` (measured on ``probe_rows``
    blocks through ``dequant(raw, type)``, gguf-py's dequantization by default); random_weights' f32
    values for the norms."""
    rng = np.random.default_rng(seed)
    t = hp.dtype
    make = random_blocks if blocks is None else blocks
    raw = make(t, (probe_rows, 1), rng, scale=1.0)
    probe = quants.dequantize(raw, QT(t.ggml_id)) if dequant is None else dequant(raw, t)
    scale = std / float(probe.std())
    vals = random_weights(hp, seed)
    for info in archs.get(hp.arch).weights(hp):
        if info.type is t:
            vals[info.name] = make(t, (info.ne[1], info.ne[0] // t.blck_size), rng, scale)
    return vals


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    enable_persistent_cache(str(tmp_path_factory.mktemp("jaxcache")))


@pytest.mark.parametrize("type_", NEW_TYPES, ids=lambda t: t.name)
def test_tiny_llama_logits_over_gguf_dequantization(type_: GGMLType, tmp_path: Path, jax_cache: None) -> None:
    hp = tiny_of(type_)
    path = tmp_path / f"{hp.name}.gguf"
    w = write_gguf(path, hp, block_weights(hp))  # the f32 values gguf.quants dequantizes from the file
    g = read_gguf(path)
    mats = [n for n, x in g.tensors.items() if len(x.ne) == 2]
    assert len(mats) == 2 * 7 + 2 and all(g.tensors[n].type is type_ for n in mats)
    rt = make_runtime(str(path), devices=("sim",), ngl=2)   # token_embd through GET_ROWS, the rest MUL_MAT
    got = np.concatenate([rt.decode(PROMPT), rt.decode([4])])
    want = llama_forward64(w, hp, [*PROMPT, 4])  # float64, over gguf-py's dequantization
    err = np.abs(got - want).max() / want.std()
    assert want.std() > 0.1 and err < 1e-3, err
