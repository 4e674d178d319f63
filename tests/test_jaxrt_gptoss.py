"""gpt-oss on JAX: the new kernels (ADD_ID, SWIGLU_OAI, the sinks of both attention paths, MXFP4),
logits against llama.cpp's (the third oracle's tiny models, tests/data/logits-gptoss.json) and
against an independent numpy forward (tests/gptoss_model.py), on one CPU and over two simulated
devices, flash attention on and off."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from toolkit.jaxrt.devices import request_cpu_devices  # noqa: E402

request_cpu_devices(4)

import jax.numpy as jnp  # noqa: E402
from gptoss_model import recipe_of, reference, write_model  # noqa: E402

from toolkit.context import Context  # noqa: E402
from toolkit.ggml.types import GGMLType  # noqa: E402
from toolkit.jaxrt import kernels_gptoss, quant  # noqa: E402
from toolkit.jaxrt.compile import enable_persistent_cache  # noqa: E402
from toolkit.jaxrt.kernels import flash_attn_ext, soft_max_ext  # noqa: E402
from toolkit.jaxrt.runtime import ContextRuntime, runtime_of  # noqa: E402
from toolkit.models import ContextParams  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
# llama.cpp's logits for gpt-oss (oracle3 logits.json, flash attention off, CPU): first 2048 values
ENTRIES = {e["id"]: e for e in json.loads((DATA / "logits-gptoss.json").read_text())}
TOL_REF = 1e-4          # against the numpy forward: max |diff| / max |ref|
# against llama.cpp, max |diff| / std: F32 weights, and MXFP4 experts, which ggml-cpu multiplies by
# activations quantized to Q8_0 (the MXFP4 vec_dot_type), where the runtime keeps them in f32
TOL_LLAMA_CPP = {"f32": 2e-3, "mxfp4": 2e-2}


@pytest.fixture(scope="module", autouse=True)
def _jax_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    enable_persistent_cache(str(tmp_path_factory.mktemp("jaxcache")))


def _runtime(path: str, *, n_ctx: int = 256, n_ubatch: int = 256, fa: str = "off",
             devices: tuple[str, ...] = ()) -> ContextRuntime:
    cp = ContextParams(n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ubatch, flash_attn=fa,  # type: ignore[arg-type]
                       devices=devices, n_gpu_layers=999 if devices else 0)
    return runtime_of(Context(path, cp))


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


# ---- kernels ------------------------------------------------------------------------------------

def test_mxfp4_dequantization_is_ggmls() -> None:
    """quant.dequant_mxfp4 equals gguf.quants.dequantize on blocks of every nibble and of every exponent
    from 2 up (255: 2^127 times the largest values overflows to inf as in ggml). The scales of e = 0, 1
    are denormal (2^-128, 2^-127), which XLA's CPU flushes to zero: values below 2e-37."""
    import gguf

    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (6, 17 * 64), dtype=np.uint8)
    raw[:, ::17] = rng.integers(2, 256, (6, 64))
    raw[0, ::17][:3] = (2, 254, 255)
    with np.errstate(over="ignore"):
        want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.MXFP4)
    got = np.asarray(quant.dequantize(jnp.asarray(raw), GGMLType.MXFP4))
    assert np.array_equal(got, want)
    raw[:, ::17] = rng.integers(0, 2, (6, 64))
    assert np.abs(np.asarray(quant.dequantize(jnp.asarray(raw), GGMLType.MXFP4))).max() < 2e-37


def test_add_id_adds_each_selected_experts_bias() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((1, 3, 2, 5)).astype(np.float32)     # (1, T, n_used, n)
    b = rng.standard_normal((1, 1, 4, 5)).astype(np.float32)     # (1, 1, n_expert, n)
    ids = np.array([[[[3, 0], [1, 1], [2, 3]]]], np.int32)        # (1, 1, T, n_used)
    got = np.asarray(kernels_gptoss.add_id(jnp.asarray(a), jnp.asarray(b), jnp.asarray(ids)))
    want = np.stack([np.stack([a[0, t, j] + b[0, 0, ids[0, 0, t, j]] for j in range(2)]) for t in range(3)])[None]
    assert np.allclose(got, want, atol=1e-6)


def test_swiglu_oai_clamps_gate_and_up() -> None:
    """x = min(gate, 7), y = clamp(up, -7, 7): x * sigmoid(1.702 x) * (y + 1)."""
    g = np.array([-9.0, -1.0, 0.0, 0.5, 8.0], np.float32)
    u = np.array([-8.0, 2.0, 1.0, -0.5, 9.0], np.float32)
    x, y = np.minimum(g, 7.0), np.clip(u, -7.0, 7.0)
    want = x / (1.0 + np.exp(-1.702 * x)) * (y + 1.0)
    got = np.asarray(kernels_gptoss.swiglu_oai(jnp.asarray(g), jnp.asarray(u), 1.702, 7.0))
    assert np.allclose(got, want, rtol=1e-6, atol=1e-7)


def test_sinks_join_the_denominator_in_both_attention_paths() -> None:
    """SOFT_MAX (src[2]) and FLASH_ATTN_EXT (src[4]): softmax over [scores, sink] without the sink column."""
    rng = np.random.default_rng(2)
    H, T, nkv, d = 2, 3, 4, 8
    q = rng.standard_normal((1, H, T, d)).astype(np.float32)
    k = rng.standard_normal((1, H, nkv, d)).astype(np.float32)
    v = rng.standard_normal((1, H, nkv, d)).astype(np.float32)
    sinks = np.array([0.7, -3.0], np.float32)
    s = np.einsum("bhtd,bhsd->bhts", q, k) * 0.3
    full = np.concatenate([s, np.broadcast_to(sinks[None, :, None, None], (1, H, T, 1))], -1)
    p = np.exp(full - full.max(-1, keepdims=True))
    p = (p / p.sum(-1, keepdims=True))[..., :nkv]
    got_sm = np.asarray(soft_max_ext(jnp.asarray(s / 0.3), None, 0.3, 0.0, jnp.asarray(sinks)))
    assert np.allclose(got_sm, p, atol=1e-6)
    got_fa = np.asarray(flash_attn_ext(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), None, 0.3, 0.0, 0.0,
                                       jnp.asarray(sinks)))           # (1, T, H, d)
    assert np.allclose(got_fa, np.einsum("bhts,bhsd->bthd", p, v), atol=1e-5)


# ---- the model ----------------------------------------------------------------------------------

LLAMA_CPP_RUNS = [
    *((i, "off", ()) for i in ENTRIES),                                  # the oracle's setting
    ("logits-tiny_gptoss_mxfp4-promptB-faoff", "on", ()),
    ("logits-tiny_gptoss_f32-promptB-faoff", "on", ("sim", "sim")),
]


RUN_IDS = [f"{i[len('logits-tiny_'):-len('-faoff')]}-fa{f}-{'2sim' if d else 'cpu'}" for i, f, d in LLAMA_CPP_RUNS]


@pytest.mark.parametrize(("entry_id", "fa", "devices"), LLAMA_CPP_RUNS, ids=RUN_IDS)
def test_logits_match_llama_cpp(entry_id: str, fa: str, devices: tuple[str, ...], tmp_path: Path) -> None:
    """The oracle's model, prompt and two single steps: every read position within the tolerance of the
    std, the same argmax. Prompt B (152 tokens) is longer than the window of 128. llama.cpp measured
    with flash attention off; its FA-on logits differ from those by less than the tolerance (oracle3)."""
    entry = ENTRIES[entry_id]
    r = recipe_of(entry)
    path = str(tmp_path / "m.gguf")
    write_model(path, r)
    rt = _runtime(path, fa=fa, devices=devices)
    rows = [rt.decode(entry["prompt"])[-1]] + [rt.decode([s])[-1] for s in entry["steps"]]
    assert len(rows) == len(entry["logits_first_2048"]) == len(entry["argmax"])
    for got, want, am in zip(rows, entry["logits_first_2048"], entry["argmax"]):
        want = np.asarray(want, np.float32)
        assert np.abs(got[:2048] - want).max() / want.std() <= TOL_LLAMA_CPP[r["expert_dtype"]]
        assert int(np.argmax(got)) == am
    if devices:
        assert len(rt.log[0].splits) > 1


def _small(entry_id: str, **changes: Any) -> dict[str, Any]:
    return recipe_of(ENTRIES[entry_id], n_vocab=512, **changes)


@pytest.mark.parametrize(("fa", "devices"), [("on", ()), ("off", ("sim", "sim"))], ids=["faon-cpu", "faoff-2sim"])
def test_matches_reference_past_the_window(fa: str, devices: tuple[str, ...], tmp_path: Path) -> None:
    """200 tokens in ubatches of 64 (the SWA cache, pad(128 + 64, 256) = 256 cells, reuses its cells),
    then two single tokens, MXFP4 experts: the numpy forward within 1e-4 (without flash attention with Q
    and the attention weights rounded to F16, as the products with the F16 cache round them); without the window or
    without the sinks it is not."""
    r = _small("logits-tiny_gptoss_mxfp4-promptA-faoff")
    path = str(tmp_path / "m.gguf")
    w = write_model(path, r)
    tokens = [int(x) for x in np.random.default_rng(3).integers(0, r["n_vocab"], 202)]
    rt = _runtime(path, n_ctx=512, n_ubatch=64, fa=fa, devices=devices)
    assert [(c.kind, c.kv_size, c.n_swa) for c in rt.memory.caches] == [("non-SWA", 512, 0), ("SWA", 256, 128)]
    got = np.concatenate([rt.decode(tokens[:200]), rt.decode(tokens[200:201]), rt.decode(tokens[201:])])
    kq = fa == "off"
    assert _rel(got, reference(w, r, tokens, kq_f16=kq)) < TOL_REF
    assert _rel(got, reference(w, r, tokens, kq_f16=kq, window=False)) > TOL_REF
    assert _rel(got, reference(w, r, tokens, kq_f16=kq, sinks=False)) > TOL_REF
