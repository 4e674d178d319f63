"""The real llama graph, scheduled and run, against an independent plain-JAX llama forward."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np
import pytest

from toolkit.jaxrt.devices import request_cpu_devices  # noqa: E402

request_cpu_devices(4)

import jax.numpy as jnp  # noqa: E402

from toolkit.context import Context  # noqa: E402
from toolkit.ggml.types import GGMLType  # noqa: E402
from toolkit.jaxrt.compile import enable_persistent_cache  # noqa: E402
from toolkit.jaxrt.gguf_io import read_gguf, write_gguf  # noqa: E402
from toolkit.jaxrt.runtime import ContextRuntime, load_weights, runtime_of  # noqa: E402
from toolkit.models import ContextParams, HParams, presets  # noqa: E402


def _kv_round(x: jax.Array, kv: str) -> jax.Array:
    """The values a KV cache of type kv holds (f16 rounding; Q8_0 blocks of each token's row)."""
    if kv == "f16":
        return x.astype(jnp.float16).astype(jnp.float32)
    if kv == "q8_0":
        from gguf import GGMLQuantizationType, quants

        rows = np.asarray(x).reshape(x.shape[0], -1)
        deq = quants.dequantize(quants.quantize(rows, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0)
        return jnp.asarray(deq.reshape(x.shape))
    return x


def _vec_dot_round(x: jax.Array, src0_type: GGMLType) -> jax.Array:
    """src1 of a product with a src0 of that type, as ggml_compute_forward_mul_mat converts it to the
    vec_dot_type (F16, BF16 for those; f32 is kept for the others, as the runtime keeps it)."""
    dt = {GGMLType.F16: jnp.float16, GGMLType.BF16: jnp.bfloat16}.get(src0_type)
    return x if dt is None else x.astype(dt).astype(jnp.float32)


def llama_reference(w: dict[str, np.ndarray], hp: HParams, tokens: list[int], kv_f16: bool = False,
                    kv: str = "f32", fa: bool = False) -> np.ndarray:
    """Plain JAX llama (no ggml, no cache): logits [T, n_vocab] of every position of ``tokens``. The
    products with the weights (of their types in ``hp``) and, without flash attention (``fa``), with the cache
    (of type ``kv``) take their activations rounded as ggml's vec_dot_type rounds them."""
    kv = "f16" if kv_f16 else kv
    kq_type = GGMLType.parse("f32" if fa or kv == "q8_0" else kv)
    W = {k: jnp.asarray(v) for k, v in w.items()}
    T, H, hd = len(tokens), hp.n_head(), hp.n_embd_head_k
    nkv, rot = hp.n_head_kv(), hp.n_rot
    pos = jnp.arange(T, dtype=jnp.float32)

    def rms(x: jax.Array, g: jax.Array) -> jax.Array:
        return x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + hp.eps) * g

    def rope(x: jax.Array) -> jax.Array:  # x (T, heads, hd): rotate pairs (2i, 2i+1) of the first rot dims
        inv = hp.rope_freq_base ** (-jnp.arange(0, rot, 2, dtype=jnp.float32) / rot)
        ang = pos[:, None] * inv[None, :]
        c, s = jnp.cos(ang)[:, None, :], jnp.sin(ang)[:, None, :]
        x0, x1 = x[..., 0:rot:2], x[..., 1:rot:2]
        r = jnp.stack([x0 * c - x1 * s, x0 * s + x1 * c], -1).reshape(T, x.shape[1], rot)
        return jnp.concatenate([r, x[..., rot:]], -1)

    def mm(x: jax.Array, name: str) -> jax.Array:
        x = _vec_dot_round(x, hp.tensor_type(name, tuple(reversed(w[name].shape))))
        return jnp.matmul(x, W[name].T, precision="highest")

    x = W["token_embd.weight"][jnp.asarray(tokens)]
    causal = jnp.tril(jnp.ones((T, T), bool))
    for il in range(hp.n_layer):
        p = f"blk.{il}."
        h = rms(x, W[p + "attn_norm.weight"])
        q = rope(mm(h, p + "attn_q.weight").reshape(T, H, hd))
        k = rope(mm(h, p + "attn_k.weight").reshape(T, nkv, hd))
        v = mm(h, p + "attn_v.weight").reshape(T, nkv, hd)
        k, v = _kv_round(k, kv), _kv_round(v, kv)
        k, v = jnp.repeat(k, H // nkv, axis=1), jnp.repeat(v, H // nkv, axis=1)
        s = jnp.einsum("thd,shd->hts", _vec_dot_round(q, kq_type), k, precision="highest") / np.sqrt(hd)
        a = jax.nn.softmax(jnp.where(causal[None], s, -jnp.inf), -1)
        o = jnp.einsum("hts,shd->thd", _vec_dot_round(a, kq_type), v, precision="highest").reshape(T, H * hd)
        x = x + mm(o, p + "attn_output.weight")
        h = rms(x, W[p + "ffn_norm.weight"])
        x = x + mm(jax.nn.silu(mm(h, p + "ffn_gate.weight")) * mm(h, p + "ffn_up.weight"), p + "ffn_down.weight")
    head = "output.weight" if "output.weight" in w else "token_embd.weight"
    return np.asarray(mm(rms(x, W["output_norm.weight"]), head))


def tiny(dtype: str = "f32") -> HParams:
    return dataclasses.replace(presets.tiny(dtype), n_vocab=256)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, dict[str, np.ndarray]]]:
    enable_persistent_cache(str(tmp_path_factory.mktemp("jaxcache")))
    out = {}
    for dt in ("f32", "f16", "bf16", "q8_0", "q4_0"):
        path = tmp_path_factory.mktemp("gguf") / f"tiny_{dt}.gguf"
        out[dt] = (str(path), write_gguf(path, tiny(dt), seed=11))
    return out


def make_runtime(path: str, *, devices: tuple[str, ...] = (), ngl: int = 999, fa: bool = False,
                 op_offload: bool = False, parallel: bool = False, n_ubatch: int = 64, kv: str = "f32"
                 ) -> ContextRuntime:
    """A Context over the GGUF file (the real llama graph, pins and scheduler) and its runtime (runtime_of)."""
    hp = read_gguf(path, with_tensors=False).hparams
    cp = ContextParams(n_ctx=256, n_batch=256, n_ubatch=n_ubatch, flash_attn="on" if fa else "off",
                       type_k=kv, type_v=kv, n_gpu_layers=ngl, devices=devices, op_offload=op_offload)
    ctx = Context(hp, cp, parallel=parallel)
    load_weights(ctx, path)
    rt = runtime_of(ctx)
    assert ctx.scheduler.n_copies == (4 if parallel else 1)
    return rt


PROMPT = [1, 17, 42, 9, 200, 3, 77, 5]


def check(rt: ContextRuntime, w: dict[str, np.ndarray], hp: HParams, steps: list[list[int]], tol: float = 1e-4,
          kv_f16: bool = False) -> None:
    got = np.concatenate([rt.decode(s) for s in steps])
    seq = [t for s in steps for t in s]
    want = llama_reference(w, hp, seq, kv_f16)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < tol, err


def test_one_cpu_device_prompt_then_single_tokens(files) -> None:  # type: ignore[no-untyped-def]
    path, w = files["f32"]
    rt = make_runtime(path)
    check(rt, w, tiny(), [PROMPT, [4], [8], [15]])
    assert {len(log.splits) for log in rt.log} == {1}


@pytest.mark.parametrize("ngl", [0, 2, 999])
def test_three_simulated_accelerators_by_ngl(files, ngl: int) -> None:  # type: ignore[no-untyped-def]
    path, w = files["f32"]
    rt = make_runtime(path, devices=("sim", "sim", "sim"), ngl=ngl)
    check(rt, w, tiny(), [PROMPT, [4]])
    if ngl:
        assert len(rt.log[0].splits) > 1 and rt.log[0].n_copies > 0


@pytest.mark.parametrize("op_offload", [True, False])
def test_op_offload_at_batch_40(files, op_offload: bool) -> None:  # type: ignore[no-untyped-def]
    path, w = files["f32"]
    rt = make_runtime(path, devices=("sim",), ngl=0, op_offload=op_offload)
    prompt = list(range(2, 42))  # 40 tokens: CPU weights' MUL_MATs offload to SIM0 when on
    check(rt, w, tiny(), [prompt, [4]])
    assert (rt.log[0].weight_copies > 0) == op_offload
    assert rt.log[1].weight_copies == 0  # one token never offloads


def test_pipeline_parallel_ubatches(files) -> None:  # type: ignore[no-untyped-def]
    path, w = files["f32"]
    rt = make_runtime(path, devices=("sim", "sim"), parallel=True, n_ubatch=16)
    prompt = list(range(3, 43))  # 40 tokens = 3 ubatches dispatched without waiting
    check(rt, w, tiny(), [prompt, [4], [9]])
    assert len(rt.log) == 5


@pytest.mark.parametrize("devices", [(), ("sim", "sim")])
def test_flash_attention_on(files, devices: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    path, w = files["f32"]
    rt = make_runtime(path, devices=devices, fa=True)
    check(rt, w, tiny(), [PROMPT, [4], [8]])


def test_f16_kv_cache(files) -> None:  # type: ignore[no-untyped-def]
    path, w = files["f32"]
    rt = make_runtime(path, devices=("sim",), kv="f16")
    check(rt, w, tiny(), [PROMPT, [4]], tol=1e-4, kv_f16=True)


@pytest.mark.parametrize("dt", ["f16", "bf16", "q8_0", "q4_0"])
def test_gguf_weight_types(files, dt: str) -> None:  # type: ignore[no-untyped-def]
    path, w = files[dt]
    rt = make_runtime(path, devices=("sim",), ngl=2)
    check(rt, w, tiny(dt), [PROMPT, [4]], tol=1e-4)


def test_generate_is_greedy_over_reference(files) -> None:  # type: ignore[no-untyped-def]
    path, w = files["f32"]
    rt = make_runtime(path, devices=("sim",))
    out = rt.generate(PROMPT, 4)
    seq = list(PROMPT)
    for _ in range(4):
        seq.append(int(np.argmax(llama_reference(w, tiny(), seq)[-1])))
    assert out == seq[len(PROMPT):]


def test_q8_0_kv_cache_with_flash_attention(tmp_path: Path) -> None:
    # head size 64: whole Q8_0 blocks per head, as llama.cpp requires of a quantized cache
    hp = HParams(n_layer=2, n_embd=128, n_head=2, n_head_kv=1, n_ff=256, n_vocab=256, name="hd64")
    path = str(tmp_path / "hd64.gguf")
    w = write_gguf(path, hp, seed=4)
    rt = make_runtime(path, devices=("sim",), fa=True, kv="q8_0")
    got = np.concatenate([rt.decode(PROMPT), rt.decode([4])])
    want = llama_reference(w, hp, [*PROMPT, 4], kv="q8_0")
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 1e-4, err
