"""Mixtral-style MoE llama graphs, scheduled and run on JAX, against an independent plain-JAX MoE forward
and against llama.cpp's logits for the oracle's random-weight model (tests/data/logits-moe.json)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from toolkit.jaxrt.devices import request_cpu_devices  # noqa: E402
from toolkit.models import archs  # noqa: E402

request_cpu_devices(4)

import jax.numpy as jnp  # noqa: E402

from toolkit.context import Context  # noqa: E402
from toolkit.ggml import ops  # noqa: E402
from toolkit.ggml.tensor import Tensor  # noqa: E402
from toolkit.ggml.types import F32, I32, Q8_0  # noqa: E402
from toolkit.jaxrt.gguf_io import read_gguf, write_gguf  # noqa: E402
from toolkit.jaxrt.kernels import eval_nodes  # noqa: E402
from toolkit.jaxrt.runtime import ContextRuntime, load_weights, runtime_of  # noqa: E402
from toolkit.models import ContextParams, HParams  # noqa: E402
from toolkit.models.moe import MoEParams  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
PROMPT = [1, 17, 42, 9, 200, 3, 77, 5]


def moe_hp(dtype: str = "f32", n_vocab: int = 256, k: int = 2) -> HParams:
    return HParams(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_vocab=n_vocab, dtype=dtype,
                        moe=MoEParams(n_expert=4, n_expert_used=k), name=f"moe_{dtype}")


def moe_reference(w: dict[str, np.ndarray], hp: HParams, tokens: list[int], kv_f16: bool = False,
                  choices: list[np.ndarray] | None = None) -> np.ndarray:
    """Plain JAX Mixtral forward (no ggml, no cache, top-k by jax.lax.top_k): logits [T, n_vocab].
    ``choices`` receives each layer's chosen experts [T, k]."""
    assert hp.moe is not None
    W = {k: jnp.asarray(v) for k, v in w.items()}
    T, H, hd, nkv = len(tokens), hp.n_head(), hp.n_embd_head_k, hp.n_head_kv()
    pos = jnp.arange(T, dtype=jnp.float32)

    def rms(x: jax.Array, g: jax.Array) -> jax.Array:
        return x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + hp.eps) * g

    def rope(x: jax.Array) -> jax.Array:
        inv = hp.rope_freq_base ** (-jnp.arange(0, hd, 2, dtype=jnp.float32) / hd)
        ang = pos[:, None] * inv[None, :]
        c, s = jnp.cos(ang)[:, None, :], jnp.sin(ang)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return jnp.stack([x0 * c - x1 * s, x0 * s + x1 * c], -1).reshape(x.shape)

    def mm(x: jax.Array, m: jax.Array) -> jax.Array:
        return jnp.matmul(x, m.T, precision="highest")

    def experts(h: jax.Array, p: str) -> jax.Array:
        probs = jax.nn.softmax(mm(h, W[p + "ffn_gate_inp.weight"]), -1)
        top_w, top_i = jax.lax.top_k(probs, hp.moe.n_expert_used)  # type: ignore[union-attr]
        top_w = top_w / jnp.maximum(top_w.sum(-1, keepdims=True), 6.103515625e-5)
        if choices is not None:
            choices.append(np.asarray(top_i))
        out = jnp.zeros_like(h)
        for e in range(hp.moe.n_expert):  # type: ignore[union-attr]
            y = mm(jax.nn.silu(mm(h, W[p + "ffn_gate_exps.weight"][e])) * mm(h, W[p + "ffn_up_exps.weight"][e]),
                   W[p + "ffn_down_exps.weight"][e])
            out = out + (top_w * (top_i == e)).sum(-1, keepdims=True) * y
        return out

    x = W["token_embd.weight"][jnp.asarray(tokens)]
    causal = jnp.tril(jnp.ones((T, T), bool))
    for il in range(hp.n_layer):
        p = f"blk.{il}."
        h = rms(x, W[p + "attn_norm.weight"])
        q = rope(mm(h, W[p + "attn_q.weight"]).reshape(T, H, hd))
        k = rope(mm(h, W[p + "attn_k.weight"]).reshape(T, nkv, hd))
        v = mm(h, W[p + "attn_v.weight"]).reshape(T, nkv, hd)
        if kv_f16:
            k, v = k.astype(jnp.float16).astype(jnp.float32), v.astype(jnp.float16).astype(jnp.float32)
        k, v = jnp.repeat(k, H // nkv, axis=1), jnp.repeat(v, H // nkv, axis=1)
        s = jnp.einsum("thd,shd->hts", q, k, precision="highest") / np.sqrt(hd)
        a = jax.nn.softmax(jnp.where(causal[None], s, -jnp.inf), -1)
        x = x + mm(jnp.einsum("hts,shd->thd", a, v, precision="highest").reshape(T, H * hd),
                   W[p + "attn_output.weight"])
        x = x + experts(rms(x, W[p + "ffn_norm.weight"]), p)
    return np.asarray(mm(rms(x, W["output_norm.weight"]), W["output.weight"]))


def make_runtime(path: str, *, devices: tuple[str, ...] = (), n_ubatch: int = 64, kv: str = "f32",
                 **cp: object) -> tuple[Context, ContextRuntime]:
    hp = read_gguf(path, with_tensors=False).hparams
    ctx = Context(hp, ContextParams(n_ctx=256, n_batch=256, n_ubatch=n_ubatch, flash_attn="off", type_k=kv,
                                    type_v=kv, devices=devices, **cp))  # type: ignore[arg-type]
    load_weights(ctx, path)
    return ctx, runtime_of(ctx)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, dict[str, np.ndarray]]]:
    out = {}
    for dt in ("f32", "q8_0"):
        path = tmp_path_factory.mktemp("gguf") / f"moe_{dt}.gguf"
        out[dt] = (str(path), write_gguf(path, moe_hp(dt), seed=5))
    return out


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_kernels_on_a_hand_built_graph() -> None:
    """MUL_MAT_ID, ARGSORT top-k, SUM_ROWS, CLAMP and DIV on values checked by hand."""
    rng = np.random.default_rng(0)
    as_ = Tensor(F32, (8, 3, 4), name="exps")
    b = Tensor(F32, (8, 1, 5), name="b")
    probs = Tensor(F32, (4, 5), name="probs")
    top = ops.argsort_top_k(probs, 2)
    y = ops.mul_mat_id(as_, b, top)
    w = ops.get_rows(ops.reshape_3d(probs, 1, 4, 5), top)
    w2 = ops.reshape_2d(w, 2, 5)
    norm = ops.div(w2, ops.clamp(ops.sum_rows(w2), 6.103515625e-5, float("inf")))
    A = rng.standard_normal((4, 3, 8)).astype(np.float32)
    B = rng.standard_normal((5, 1, 8)).astype(np.float32)
    P = rng.random((5, 4)).astype(np.float32)
    vals = {as_: jnp.asarray(A.reshape(-1)), b: jnp.asarray(B.reshape(-1)), probs: jnp.asarray(P.reshape(-1))}
    nodes = [n for n in (top.src[0], top, y, w.src[0], w, w2, norm.src[1].src[0], norm.src[1], norm)
             if n is not None]
    env = eval_nodes(nodes, vals)
    ids = np.argsort(-P, axis=1, kind="stable")[:, :2]
    assert top.type is I32
    np.testing.assert_array_equal(np.asarray(env.read(top)).reshape(5, 2), ids)
    want_y = np.stack([np.stack([A[ids[t, j]] @ B[t, 0] for j in range(2)]) for t in range(5)])
    np.testing.assert_allclose(np.asarray(env.read(y)).reshape(5, 2, 3), want_y, rtol=1e-5, atol=1e-6)
    pw = np.take_along_axis(P, ids, 1)
    np.testing.assert_allclose(np.asarray(env.read(norm)).reshape(5, 2), pw / pw.sum(1, keepdims=True), rtol=1e-6)


def test_one_cpu_prompt_then_single_tokens(files) -> None:  # type: ignore[no-untyped-def]
    path, w = files["f32"]
    _, rt = make_runtime(path)
    got = np.concatenate([rt.decode(s) for s in (PROMPT, [4], [8])])
    assert _rel(got, moe_reference(w, moe_hp(), [*PROMPT, 4, 8])) < 1e-4


@pytest.mark.parametrize("mode", [{"cpu_moe": True}, {"n_cpu_moe": 1}, {"override_tensor": ("ffn_up_exps=CPU",)}])
def test_two_simulated_devices_experts_on_cpu(files, mode: dict[str, object]) -> None:  # type: ignore[no-untyped-def]
    """Experts in host memory on 2 simulated accelerators: pp (40 tokens) offloads MUL_MAT_ID to SIM0 and
    copies whole expert tensors; tg (1 token) keeps MUL_MAT_ID on the CPU."""
    path, w = files["f32"]
    ctx, rt = make_runtime(path, devices=("sim", "sim"), **mode)
    assert ctx.setup.model.tensor_overrides and not ctx.pipeline_parallel
    prompt = list(range(2, 42))
    got = np.concatenate([rt.decode(prompt), rt.decode([4])])
    assert _rel(got, moe_reference(w, moe_hp(), [*prompt, 4])) < 1e-4
    moved = {o.tensor for o in ctx.setup.model.tensor_overrides}
    assert rt.log[0].weight_copies == len(moved)   # each host expert tensor copied once, to SIM0
    assert rt.log[1].weight_copies == 0


def test_sched_copy_experts_moves_only_the_chosen_experts(tmp_path: Path) -> None:
    """16 experts, 32 tokens offloaded to SIM0 with the experts on the CPU: each expert tensor's split input
    holds the whole tensor, the copy moves the runs of experts the router chose (measured in decode)."""
    hp = HParams(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=64, n_vocab=256,
                      moe=MoEParams(n_expert=16, n_expert_used=1), name="moe16")
    path = str(tmp_path / "moe16.gguf")
    w = write_gguf(path, hp, seed=9)
    ctx, rt = make_runtime(path, devices=("sim",), cpu_moe=True)
    prompt = list(range(5, 37))
    choices: list[np.ndarray] = []
    got = rt.decode(prompt)
    assert _rel(got, moe_reference(w, hp, prompt, choices=choices)) < 1e-4
    transfers = rt.log[0].expert_transfers
    assert [t.tensor for t in transfers] == [f"blk.{il}.ffn_{n}_exps.weight" for il in range(2)
                                            for n in ("gate", "up", "down")]
    for t in transfers:
        il = int(t.tensor.split(".")[1])
        used = sorted(set(choices[il].reshape(-1).tolist()))
        assert list(t.experts) == used
        size = 64 * 64 * 4                       # one expert of a [64, 64, 16] F32 tensor
        assert t.buffer_bytes == 16 * size
        # by hand: each run of consecutive ids, plus 512 bytes unless the run ends at expert 15
        want, i = 0, 0
        while i < len(used):
            j = i
            while j + 1 < len(used) and used[j + 1] == used[j] + 1:
                j += 1
            want += (j - i + 1) * size + (512 if used[j] < 15 else 0)
            i = j + 1
        assert t.transfer_bytes == want
    assert any(t.transfer_bytes < t.buffer_bytes for t in transfers)
    assert rt.decode([4]).shape == (1, 256) and rt.log[-1].expert_transfers == []


def test_q8_0_experts(files) -> None:  # type: ignore[no-untyped-def]
    path, w = files["q8_0"]
    _, rt = make_runtime(path, devices=("sim",), n_cpu_moe=1)
    got = np.concatenate([rt.decode(PROMPT), rt.decode([4])])
    assert _rel(got, moe_reference(w, moe_hp("q8_0"), [*PROMPT, 4])) < 1e-4


def test_top1_routing_uses_a_cont(tmp_path: Path) -> None:
    hp = moe_hp(k=1)
    path = str(tmp_path / "k1.gguf")
    w = write_gguf(path, hp, seed=3)
    _, rt = make_runtime(path)
    assert _rel(rt.decode(PROMPT), moe_reference(w, hp, PROMPT)) < 1e-4


# ---- llama.cpp's logits for the oracle's tiny_moe_f32 ------------------------------------------------

def oracle_weights(hp: HParams, seed: int = 1234) -> dict[str, np.ndarray]:
    """The oracle generator's values: normal(0, 0.02) float32 from default_rng(seed), tensor by tensor in
    GGUF write order (norms are ones and draw nothing)."""
    rng = np.random.default_rng(seed)
    out = {}
    for info in archs.get(hp.arch).weights(hp):
        shape = tuple(reversed(info.ne))
        out[info.name] = (np.ones(shape, np.float32) if len(info.ne) == 1
                          else (rng.standard_normal(shape) * 0.02).astype(np.float32))
    return out


def _oracle_rows(tmp_path: Path, dtype: str, fa: str | None = None) -> tuple[dict, list[np.ndarray]]:  # type: ignore[type-arg]
    """llama.cpp's logits entry for tiny_moe_f32, and ours for the same model written with ``dtype``
    matrices (the oracle generator's values; Q8_0 through gguf.quants, as the generator does)."""
    entry = next(e for e in json.loads((DATA / "logits-moe.json").read_text()) if e["model"] == "tiny_moe_f32")
    r = entry["gguf_recipe"]["recipe"]
    hp = HParams(n_layer=r["n_layer"], n_embd=r["n_embd"], n_head=r["n_head"], n_head_kv=r["n_head_kv"],
                      n_ff=r["n_ff"], n_vocab=entry["n_vocab"], eps=r["eps"], rope_freq_base=r["rope_freq_base"],
                      dtype=dtype, moe=MoEParams(n_expert=r["n_expert"], n_expert_used=r["n_expert_used"]),
                      name=f"tiny_moe_{dtype}")
    path = str(tmp_path / f"tiny_moe_{dtype}.gguf")
    write_gguf(path, hp, oracle_weights(hp, r["seed"]))
    c = entry["context"]
    ctx = Context(read_gguf(path, with_tensors=False).hparams,
                  ContextParams(n_ctx=c["n_ctx"], n_batch=c["n_batch"], n_ubatch=c["n_ubatch"],
                                flash_attn=fa or entry["flash_attn"]))
    load_weights(ctx, path)
    rt = runtime_of(ctx)
    rows = [rt.decode(entry["prompt"])[-1]] + [rt.decode([s])[-1] for s in entry["steps"]]
    return entry, rows


@pytest.mark.parametrize("fa", ["off", "on"])
def test_logits_match_llama_cpp(tmp_path: Path, fa: str) -> None:
    """llama.cpp's FA-off logits; with flash attention on the values move by float noise only (llama.cpp's
    own argmax agrees between FA on and off)."""
    entry, rows = _oracle_rows(tmp_path, "f32", fa)
    for i, (got, want) in enumerate(zip(rows, entry["logits_first_2048"])):
        want = np.asarray(want, np.float32)
        err = np.abs(got[: len(want)] - want).max() / want.std()
        assert err <= 2e-2, (i, err)
        assert int(np.argmax(got)) == entry["argmax"][i]
        # the top 10: llama.cpp's tokens carry our values for them, and the ranked values agree (two
        # logits closer than the float noise may swap places, as 11931 and 17178 do after the prompt)
        tol = 2e-2 * want.std()
        top_t = [t for t, _ in entry["top10"][i]]
        top_v = np.asarray([v for _, v in entry["top10"][i]], np.float32)
        np.testing.assert_allclose(got[top_t], top_v, atol=tol, rtol=0)
        np.testing.assert_allclose(np.sort(got)[::-1][:10], top_v, atol=tol, rtol=0)
        assert len(set(np.argsort(-got)[:9].tolist()) & set(top_t)) >= 9


def test_q8_0_logits_near_llama_cpps_f32(tmp_path: Path) -> None:
    """The same values stored as Q8_0 (llama.cpp's argmax agrees between its F32 and Q8_0 runs)."""
    entry, rows = _oracle_rows(tmp_path, "q8_0")
    for i, (got, want) in enumerate(zip(rows, entry["logits_first_2048"])):
        want = np.asarray(want, np.float32)
        assert np.abs(got[: len(want)] - want).max() / want.std() <= 0.15, i
        assert int(np.argmax(got)) == entry["argmax"][i]


def test_q8_0_file_sizes_and_router_type(tmp_path: Path) -> None:
    path = str(tmp_path / "q.gguf")
    write_gguf(path, moe_hp("q8_0"), seed=1)
    g = read_gguf(path)
    assert g.hparams.moe == MoEParams(n_expert=4, n_expert_used=2)
    assert g.tensors["blk.0.ffn_gate_inp.weight"].type is F32
    assert g.tensors["blk.0.ffn_up_exps.weight"].type is Q8_0
    assert g.tensors["blk.0.ffn_up_exps.weight"].ne == (64, 128, 4)


def write_oracle_qwen3moe(path: str, entry: dict) -> None:  # type: ignore[type-arg]
    """The oracle generator's qwen3moe file: qwen3 keys (key_length, NEOX RoPE base, eps), the expert keys,
    normal(0, 0.02) float32 values from default_rng(seed) in write order, norms 1, the router F32."""
    import gguf

    r, arch = entry["gguf_recipe"]["recipe"], "qwen3moe"
    E, H, HKV, hd, X, FE = r["n_embd"], r["n_head"], r["n_head_kv"], r["head_dim"], r["n_expert"], r["n_ff_exp"]
    V = entry["n_vocab"]
    w = gguf.GGUFWriter(path, arch)
    for key, v in (("vocab_size", V), ("context_length", r["n_ctx_train"]), ("embedding_length", E),
                   ("block_count", r["n_layer"]), ("feed_forward_length", r["n_ff"]), ("attention.head_count", H),
                   ("attention.head_count_kv", HKV), ("attention.key_length", hd), ("attention.value_length", hd),
                   ("rope.dimension_count", hd), ("expert_count", X), ("expert_used_count", r["n_expert_used"]),
                   ("expert_feed_forward_length", FE)):
        w.add_uint32(f"{arch}.{key}", v)
    w.add_float32(f"{arch}.rope.freq_base", r["rope_freq_base"])
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", r["eps"])
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<t{i}>" for i in range(V)])
    names: list[tuple[str, tuple[int, ...], bool]] = [("token_embd.weight", (V, E), False)]
    for il in range(r["n_layer"]):
        p = f"blk.{il}."
        names += [(p + "attn_norm.weight", (E,), True), (p + "attn_q.weight", (H * hd, E), False),
                  (p + "attn_k.weight", (HKV * hd, E), False), (p + "attn_v.weight", (HKV * hd, E), False),
                  (p + "attn_output.weight", (E, H * hd), False), (p + "attn_q_norm.weight", (hd,), True),
                  (p + "attn_k_norm.weight", (hd,), True), (p + "ffn_norm.weight", (E,), True),
                  (p + "ffn_gate_inp.weight", (X, E), False), (p + "ffn_gate_exps.weight", (X, FE, E), False),
                  (p + "ffn_down_exps.weight", (X, E, FE), False), (p + "ffn_up_exps.weight", (X, FE, E), False)]
    names += [("output_norm.weight", (E,), True), ("output.weight", (V, E), False)]
    rng = np.random.default_rng(r["seed"])
    for name, shape, norm in names:
        w.add_tensor(name, np.ones(shape, np.float32) if norm
                     else (rng.standard_normal(shape) * 0.02).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_qwen3moe_logits_match_llama_cpp(tmp_path: Path) -> None:
    """qwen3moe (QK-norm, NEOX RoPE, head size 64, 8 experts of 64, 4 used) read from its GGUF file."""
    entry = next(e for e in json.loads((DATA / "logits-moe.json").read_text()) if e["model"] == "tiny_qwen3moe_f32")
    path = str(tmp_path / "tiny_qwen3moe_f32.gguf")
    write_oracle_qwen3moe(path, entry)
    hp = read_gguf(path, with_tensors=False).hparams
    assert (hp.arch, hp.moe) == ("qwen3moe", MoEParams(n_expert=8, n_expert_used=4, n_ff_exp=64))
    c = entry["context"]
    ctx = Context(hp, ContextParams(n_ctx=c["n_ctx"], n_batch=c["n_batch"], n_ubatch=c["n_ubatch"],
                                    flash_attn=entry["flash_attn"]))
    load_weights(ctx, path)
    rt = runtime_of(ctx)
    rows = [rt.decode(entry["prompt"])[-1]] + [rt.decode([s])[-1] for s in entry["steps"]]
    for i, (got, want) in enumerate(zip(rows, entry["logits_first_2048"])):
        want = np.asarray(want, np.float32)
        assert np.abs(got[: len(want)] - want).max() / want.std() <= 2e-2, i
        assert int(np.argmax(got)) == entry["argmax"][i]
        top_v = np.asarray([v for _, v in entry["top10"][i]], np.float32)
        np.testing.assert_allclose(np.sort(got)[::-1][:10], top_v, atol=2e-2 * want.std(), rtol=0)


def test_per_expert_scales_multiply_the_chosen_experts(tmp_path: Path) -> None:
    """``ffn_{gate,up,down}_exps.scale`` (F32 ``[n_expert]``, NVFP4's second-level scales): llama_model's
    generic pass loads them and ``build_lora_mm_id`` adds four nodes each (RESHAPE, REPEAT, GET_ROWS of the
    chosen experts, MUL). The logits equal the plain-JAX forward whose expert matrices carry their scales,
    and differ from the forward without them. No measured llama.cpp case has such a file."""
    import dataclasses

    from toolkit.cases import summary

    hp = moe_hp()
    plain, scaled = tmp_path / "plain.gguf", tmp_path / "scaled.gguf"
    vals = write_gguf(plain, hp, seed=5)
    names = [f"blk.{il}.ffn_{r}_exps.weight" for il in range(hp.n_layer) for r in ("gate", "down", "up")][:5]
    rng = np.random.default_rng(3)
    factors = {n.removesuffix(".weight") + ".scale": rng.uniform(0.3, 2.0, hp.moe.n_expert).astype(np.float32)  # type: ignore[union-attr]
               for n in names}
    hps = dataclasses.replace(hp, weight_scales=frozenset(names))
    write_gguf(scaled, hps, {**vals, **factors})
    assert read_gguf(scaled, with_tensors=False).hparams.weight_scales == frozenset(names)
    cp = ContextParams(n_ctx=256, n_batch=256, n_ubatch=64, flash_attn="off")
    a, b = summary(Context(str(plain), cp)), summary(Context(str(scaled), cp))
    assert b["graph_nodes"] == a["graph_nodes"] + 4 * len(names)
    assert b["graph_nodes_tg"] == a["graph_nodes_tg"] + 4 * len(names)
    assert sum(b["model_buffers_bytes"].values()) == sum(a["model_buffers_bytes"].values()) + 32 * len(names)
    w = dict(vals)
    for n in names:   # [n_expert, rows, cols] in numpy order: expert e's matrix times its scale
        w[n] = vals[n] * factors[n.removesuffix(".weight") + ".scale"][:, None, None]
    _, rt = make_runtime(str(scaled))
    got = rt.decode(PROMPT)
    assert _rel(got, moe_reference(w, hp, PROMPT)) < 1e-4
    assert _rel(got, moe_reference(vals, hp, PROMPT)) > 1e-2
