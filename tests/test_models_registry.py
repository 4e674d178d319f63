"""The registry of architectures (toolkit.models.archs): typed errors, the built-in records, per-layer
sizes read from a GGUF, and a toy architecture that this file alone adds, plans and runs on JAX."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, final

import gguf
import numpy as np
import pytest

from toolkit.jaxrt.devices import request_cpu_devices  # noqa: E402

request_cpu_devices(4)

import arch_models  # noqa: E402
from arch_models import Reference, llama_layer, reference, write_model  # noqa: E402

from toolkit.context import Context  # noqa: E402
from toolkit.errors import GGUFError, ParameterError, ToolkitError, UnsupportedFeature  # noqa: E402
from toolkit.ggml import ops  # noqa: E402
from toolkit.ggml.tensor import Tensor  # noqa: E402
from toolkit.models import ContextParams, HParams, archs, presets  # noqa: E402
from toolkit.models.archs import ROPE_TYPE_NEOX, ROPE_TYPE_NORM, Architecture, TensorSpec  # noqa: E402
from toolkit.models.archs import llama as llama_arch  # noqa: E402
from toolkit.models.gguf import hparams_from_gguf  # noqa: E402
from toolkit.models.graph import GraphBuilder, GraphResult  # noqa: E402
from toolkit.models.hparams import SWAParams  # noqa: E402

TOL_REF = 1e-4   # against the plain-JAX forward: max |diff| / max |ref|


# ---- the registry -----------------------------------------------------------------------------------

def test_unknown_architecture_is_a_typed_error_listing_the_known_ones() -> None:
    with pytest.raises(UnsupportedFeature) as e:
        archs.get("falcon")
    assert e.value.feature == "arch"
    assert str(e.value) == ("architecture 'falcon' is not supported; supported: llama, qwen3, qwen3moe, gemma3, "
                            "gpt-oss, gemma4, qwen35, qwen35moe, lfm2, deepseek2, glm4moe")
    with pytest.raises(UnsupportedFeature, match="'falcon' is not supported"):
        archs.checked(HParams(n_layer=1, n_embd=64, n_head=4, n_ff=128, arch="falcon"))


def test_register_refuses_a_taken_name_and_what_is_not_a_record() -> None:
    with pytest.raises(ParameterError) as e:
        archs.register(llama_arch.Llama("llama", llama_arch.LlamaGraphBuilder, ROPE_TYPE_NORM))
    assert e.value.param == "arch" and e.value.value == "llama"
    with pytest.raises(ParameterError):
        archs.register("llama")  # type: ignore[arg-type]
    with pytest.raises(UnsupportedFeature):
        archs.unregister("falcon")
    assert archs.names() == ("llama", "qwen3", "qwen3moe", "gemma3", "gpt-oss", "gemma4", "qwen35", "qwen35moe",
                             "lfm2", "deepseek2", "glm4moe")


def test_the_record_is_abstract() -> None:
    @dataclass(frozen=True)
    class NoTensors(Architecture):
        pass

    with pytest.raises(TypeError, match="layer_tensors"):
        NoTensors("none", GraphBuilder, ROPE_TYPE_NORM)  # type: ignore[abstract]


def test_builtin_records() -> None:
    """llama_model_rope_type: NORM for llama, NEOX for qwen3, qwen3moe, gemma3, gpt-oss and gemma4, IMROPE (40)
    for qwen35 and qwen35moe, NEOX for lfm2; Q/K norms on qwen3, qwen3moe, gemma3, gemma4, the qwen35s and lfm2;
    NORM for deepseek2 and NEOX for glm4moe (whose optional Q/K norms are the file's: ``HParams.qk_norm``); a KV cache
(deepseek2's K only), the qwen35s and lfm2 a hybrid memory; qwen3moe refuses a model without experts and gemma3 one
    with."""
    got = {n: (archs.get(n).rope_type, archs.get(n).qk_norm, archs.get(n).memory) for n in archs.names()}
    assert got == {"llama": (ROPE_TYPE_NORM, False, "kv"), "qwen3": (ROPE_TYPE_NEOX, True, "kv"),
                   "qwen3moe": (ROPE_TYPE_NEOX, True, "kv"), "gemma3": (ROPE_TYPE_NEOX, True, "kv"),
                   "gpt-oss": (ROPE_TYPE_NEOX, False, "kv"), "gemma4": (ROPE_TYPE_NEOX, True, "kv"),
                   "qwen35": (40, True, "hybrid"), "qwen35moe": (40, True, "hybrid"),
                   "lfm2": (ROPE_TYPE_NEOX, True, "hybrid"), "deepseek2": (ROPE_TYPE_NORM, False, "kv"),
                   "glm4moe": (ROPE_TYPE_NEOX, False, "kv")}
    assert archs.get("qwen3").builder is archs.get("qwen3moe").builder
    with pytest.raises(ToolkitError, match="n_expert must be > 0"):
        archs.checked(HParams(n_layer=1, n_embd=64, n_head=4, n_ff=128, arch="qwen3moe"))
    moe = presets.mixtral_8x7b().moe
    with pytest.raises(UnsupportedFeature):
        archs.checked(HParams(n_layer=1, n_embd=64, n_head=4, n_ff=128, arch="gemma3", moe=moe))


def test_graph_max_nodes_is_what_llama_cpp_recorded() -> None:
    """The oracle README's numbers for real files (292 tensors: 2336; 147: 1176); small models get 1024."""
    arch = archs.get("llama")
    assert (arch.graph_max_nodes(292, 512), arch.graph_max_nodes(147, 1), arch.graph_max_nodes(21, 4096)) == (
        2336, 1176, 1024)


def test_swa_params_check_themselves() -> None:
    with pytest.raises(ToolkitError, match="window"):
        SWAParams(0)
    with pytest.raises(ToolkitError, match="not both"):
        SWAParams(128, 4, layers=(True, False))
    s = SWAParams(128, 4, 1e4)
    assert [s.is_swa(il) for il in range(5)] == [True, True, True, False, True]
    assert SWAParams.from_dict(s.to_dict()) == s
    flags = SWAParams(64, layers=(False, True))
    assert [flags.is_swa(il) for il in range(2)] == [False, True]
    with pytest.raises(ToolkitError, match="per-layer flags"):
        HParams(n_layer=3, n_embd=64, n_head=4, n_ff=128, swa=flags)


# ---- per-layer sizes -----------------------------------------------------------------------------

def test_per_layer_sizes_in_the_constructor_and_the_model_dict() -> None:
    hp = HParams(n_layer=2, n_embd=64, n_head=4, n_head_kv=(2, 4), n_ff=(128, 96))
    assert [(hp.n_head_kv(il), hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il), hp.n_ff(il)) for il in range(2)] == [
        (2, 32, 32, 128), (4, 64, 64, 96)]
    ne = {w.name: w.ne for w in archs.get(hp.arch).weights(hp)}
    assert ne["blk.0.attn_k.weight"] == (64, 32) and ne["blk.1.attn_v.weight"] == (64, 64)
    assert ne["blk.1.ffn_down.weight"] == (96, 64)
    d = hp.to_dict()
    assert (d["n_head"], d["n_head_kv"], d["n_ff"]) == (4, [2, 4], [128, 96])
    assert HParams.from_dict(d) == hp
    # every layer alike: stored (and printed) as one value
    assert HParams(n_layer=2, n_embd=64, n_head=4, n_head_kv=[2, 2], n_ff=128, name="tiny_f32") == presets.tiny()
    with pytest.raises(ToolkitError, match="3 per-layer values; n_layer=2"):
        HParams(n_layer=2, n_embd=64, n_head=4, n_head_kv=(2, 2, 2), n_ff=128)
    with pytest.raises(ToolkitError, match="not a multiple"):
        HParams(n_layer=2, n_embd=64, n_head=4, n_head_kv=(2, 3), n_ff=128)


def test_k_and_v_head_sizes_are_separate() -> None:
    """attention.key_length / value_length: V heads of 32 beside K heads of 16 give V rows twice as wide."""
    hp = HParams(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_embd_head_v_=32)
    assert (hp.n_embd_head_k, hp.n_embd_head_v, hp.n_embd_k_gqa(0), hp.n_embd_v_gqa(0)) == (16, 32, 32, 64)
    assert hp.to_dict()["n_embd_head_v"] == 32 and HParams.from_dict(hp.to_dict()) == hp


def _recipe(arch: str, **changes: Any) -> dict[str, Any]:
    """A small f32 model recipe as tests/arch_models.py writes it (the generators' fields)."""
    r: dict[str, Any] = {"arch": arch, "head_dim": None, "sliding_window": 0, "swa_pattern": 0,
                         "rope_freq_base_swa": None, "tied": False, "n_vocab": 256, "n_layer": 2, "n_embd": 64,
                         "n_head": 4, "n_head_kv": 2, "n_ff": 128, "n_ctx_train": 4096, "rope_freq_base": 10000.0,
                         "eps": 1e-5, "seed": 5}
    r.update(changes)
    return r


def _context(path: str, **kw: Any) -> Context:
    return Context(path, ContextParams(n_ctx=256, n_batch=256, n_ubatch=64, n_gpu_layers=0, type_k="f32",
                                       type_v="f32", **kw))


def test_per_layer_head_count_kv_from_a_gguf(tmp_path: Path) -> None:
    """A head_count_kv array (llama_model_loader::get_key_or_arr): each layer's K/V projections and
    cache rows have its own width, and the model runs on JAX like the reference."""
    r = _recipe("llama", n_head_kv=[1, 4])
    path = str(tmp_path / "kv.gguf")
    w = write_model(path, r)
    hp = hparams_from_gguf(path)
    assert hp.n_head_kv_arr == (1, 4) and [hp.n_embd_k_gqa(il) for il in range(2)] == [16, 64]
    ctx = _context(path)
    kv = ctx.setup.memory.caches[0]
    assert [(t.name, t.ne) for t in kv.k] == [("cache_k_l0", (16, 256, 1, 1)), ("cache_k_l1", (64, 256, 1, 1))]
    assert ctx.kv_bytes == (16 + 64) * 256 * 4 * 2
    tokens = [int(x) for x in np.random.default_rng(3).integers(0, r["n_vocab"], 20)]
    from toolkit.jaxrt.runtime import runtime_of

    got = runtime_of(ctx).decode(tokens)
    assert float(np.abs(got - reference(w, r, tokens, kv_f16=False)).max()) < TOL_REF * float(np.abs(got).max())


@pytest.mark.parametrize(("kv", "message"), [([2, 2, 2], "wrong array length; expected 2, got 3"),
                                             ([2.0, 2.0], "expected an array of integers, found FLOAT32")])
def test_a_per_layer_array_of_the_wrong_length_or_type_is_refused(kv: list[Any], message: str,
                                                                   tmp_path: Path) -> None:
    path = tmp_path / "bad.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_array("llama.attention.head_count_kv", kv)
    w.add_vocab_size(32)
    w.add_tensor("token_embd.weight", np.zeros((32, 64), np.float32))
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError) as e:
        hparams_from_gguf(path)
    assert e.value.field == "llama.attention.head_count_kv" and message in str(e.value)


# ---- a toy architecture, defined here only ------------------------------------------------------------

class ToyGraphBuilder(GraphBuilder):
    """llama's layer with a GELU-gated FFN (GEGLU) and an RMS norm of the FFN output (``post_ffw_norm``)
    before the residual."""

    def ffn(self, res: GraphResult, il: int, cur: Tensor) -> Tensor:
        return self.build_ffn(res, il, cur, "gelu")

    def build_layers(self, res: GraphResult) -> Tensor:
        hp, m, cb = self.hp, self.model, self.cb
        inpL = self.build_inp_embd(res)
        inp_pos = self.build_inp_pos(res)
        inp_attn = self.build_attn_inp_kv(res)
        out_ids = self.build_inp_out_ids(res)
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            inpSA = inpL
            cur = self.build_norm(res, inpL, m.w(p + "attn_norm.weight"), il)
            q, k, v = self.qkv(res, il, cur)
            q, k = self.rope(q, inp_pos, il), self.rope(k, inp_pos, il)
            cur = self.build_attn(res, inp_attn, m.w(p + "attn_output.weight"), None, q, k, v, None, None, None,
                                  self.kq_scale(), il)
            if il == hp.n_layer - 1:
                cur = ops.get_rows(cur, out_ids)
                inpSA = ops.get_rows(inpSA, out_ids)
            ffn_inp = cb(res, ops.add(cur, inpSA), "ffn_inp", il)
            cur = self.build_norm(res, ffn_inp, m.w(p + "ffn_norm.weight"), il)
            cur = self.ffn(res, il, cur)
            cur = cb(res, self.build_norm(res, cur, m.w(p + "post_ffw_norm.weight"), il), "ffn_post_norm", il)
            inpL = cb(res, ops.add(cur, ffn_inp), "l_out", il)
        return inpL


@final
@dataclass(frozen=True)
class Toy(Architecture):
    def layer_tensors(self, hp: HParams, il: int) -> list[TensorSpec]:
        return [*llama_arch.layer_tensors(hp, il), TensorSpec("post_ffw_norm", (hp.n_embd,))]


def toy_layer(p: str, E: int, H: int, HKV: int, hd: int, F: int) -> arch_models.Tensors:
    return llama_layer(p, E, H, HKV, hd, F) + [(p + "post_ffw_norm.weight", (E,), "norm")]


@pytest.fixture
def toy() -> Iterator[Architecture]:
    arch = archs.register(Toy("toyllama", ToyGraphBuilder, ROPE_TYPE_NORM))
    arch_models.REFERENCES["toyllama"] = Reference(toy_layer, act="gelu", post_ffn_norm=True)
    yield arch
    archs.unregister("toyllama")
    del arch_models.REFERENCES["toyllama"]


def _kinds(g: Any) -> collections.Counter[str]:
    """Nodes by op, with the GLU variant named by the callback (ffn_swiglu / ffn_geglu)."""
    return collections.Counter(n.name.split("-")[0] if n.name.startswith("ffn_") and "glu" in n.name else n.op.name
                               for n in g.nodes)


def test_a_toy_architecture_is_planned_and_run_through_the_registry_alone(toy: Architecture,
                                                                           tmp_path: Path) -> None:
    r = _recipe("toyllama")
    path = str(tmp_path / "toy.gguf")
    w = write_model(path, r)
    hp = hparams_from_gguf(path)
    # token_embd, 10 per layer, output_norm, output
    assert archs.get(hp.arch) is toy and len(toy.weights(hp)) == 1 + 10 * 2 + 2
    ctx = _context(path)
    # the same model as llama: the toy's graph has the post-FFN RMS_NORM and MUL more per layer, GEGLU
    # instead of SWIGLU, and one split on the CPU
    base_path = str(tmp_path / "llama.gguf")
    write_model(base_path, _recipe("llama"))
    base = _context(base_path)
    ev, ev_base = ctx.events[-1], base.events[-1]
    pp, pp_base = ev.graphs["pp"], ev_base.graphs["pp"]
    assert pp.n_nodes == pp_base.n_nodes + 2 * hp.n_layer and pp.n_splits == pp_base.n_splits == 1
    assert ctx.max_nodes() == 1024
    got, want_ops = _kinds(ctx.build_graph(64)), _kinds(base.build_graph(64))
    assert (got["ffn_geglu"], got["ffn_swiglu"], want_ops["ffn_swiglu"]) == (hp.n_layer, 0, hp.n_layer)
    assert got["RMS_NORM"] == want_ops["RMS_NORM"] + hp.n_layer
    tokens = [int(x) for x in np.random.default_rng(11).integers(0, r["n_vocab"], 24)]
    from toolkit.jaxrt.runtime import runtime_of

    eng = runtime_of(ctx)
    logits = np.concatenate([eng.decode(tokens[:23]), eng.decode(tokens[23:])])
    want = reference(w, r, tokens, kv_f16=False)
    assert float(np.abs(logits - want).max()) < TOL_REF * float(np.abs(want).max())
    # the reference without the toy's pieces (llama's SILU FFN, no post-FFN norm) does not match
    arch_models.REFERENCES["toyllama"] = Reference(toy_layer)
    assert float(np.abs(logits - reference(w, r, tokens, kv_f16=False)).max()) > TOL_REF * float(np.abs(want).max())


def test_the_gguf_writer_uses_the_records_name_and_keys(tmp_path: Path) -> None:
    """toolkit.jaxrt.gguf_io.write_gguf writes gemma3's sliding-window keys under ``gemma3.`` and reads back equal."""
    from toolkit.jaxrt.gguf_io import write_gguf

    hp = HParams(n_layer=2, n_embd=64, n_head=4, n_head_kv=1, n_ff=128, n_vocab=64, arch="gemma3",
                      n_embd_head_k_=32, n_embd_head_v_=32, tied=True, swa=SWAParams(32, 2, 1e4), name="g")
    path = tmp_path / "g.gguf"
    write_gguf(path, hp)
    assert hparams_from_gguf(path) == hp
    r = gguf.GGUFReader(str(path))
    keys = set(r.fields)
    assert {"gemma3.attention.sliding_window", "gemma3.attention.sliding_window_pattern",
            "gemma3.rope.freq_base_swa", "gemma3.attention.key_length"} <= keys
    assert not any(k.startswith("llama.") for k in keys)
