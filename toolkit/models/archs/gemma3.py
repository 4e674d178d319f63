"""``gemma3`` with iSWA (``src/models/gemma3.cpp``).

- keys (``llama_model_gemma3::load_arch_hparams``): ``attention.sliding_window``; with a window,
  ``attention.sliding_window_pattern`` (default 6, ``set_swa_pattern``) and ``rope.freq_base_swa``
  (default 10000); a per-layer pattern array is refused;
- ``f_attention_scale`` (:func:`f_attention_scale`);
- per layer: ``attn_norm``, Q/K/V/O, ``attn_q_norm``, ``attn_k_norm``, ``post_attention_norm``,
  ``ffn_norm``, ``ffn_gate``, ``ffn_down``, ``ffn_up``, ``post_ffw_norm``; no experts;
- RoPE type NEOX; Q/K norms; a KV cache (iSWA's two when the file has a window); llama's
  ``graph_max_nodes``.

The graph, node for node:

- ``inp_scaled``: the token embeddings times sqrt(n_embd);
- ``build_attn_inp_kv_iswa``: indices and a mask for the full cache and for the SWA cache;
  each layer attends through the cache its ``is_swa`` picks, with the SWA RoPE base there;
- per layer: QK-norm, NEOX RoPE, a SCALE of Q by ``f_attention_scale`` (the attention itself
  uses scale 1), ``attn_post_norm`` and ``sa_out``, ``ffn_norm``, the GELU-gated FFN
  (GEGLU), ``ffn_post_norm`` (its RMS norm named plain ``norm``) and ``l_out``;
- the output is the tied ``token_embd`` (the loader's duplicate on the output device).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, final

from toolkit.errors import UnsupportedFeature
from toolkit.ggml import ops
from toolkit.ggml.tensor import Tensor
from toolkit.models.archs.base import (
    ROPE_TYPE_NEOX,
    Architecture,
    TensorSpec,
    attn_tensors,
    ffn_tensors,
    qk_norm_tensors,
)
from toolkit.models.graph import GraphBuilder, GraphResult
from toolkit.models.hparams import SWAParams

if TYPE_CHECKING:
    from toolkit.models.gguf_file import GGUFFile
    from toolkit.models.hparams import HParams

# load_arch_hparams' defaults: swa_period = 6, rope_freq_base_train_swa as the file leaves it (10000)
SWA_PATTERN_DEFAULT = 6
ROPE_FREQ_BASE_SWA_DEFAULT = 10000.0
# load_arch_hparams: switch (n_layer) { ... case 62: type = LLM_TYPE_27B; }
N_LAYER_27B = 62


def f_attention_scale(hp: HParams) -> float:
    """``hparams.f_attention_scale``: ``1/sqrt(n_embd / n_head)`` for LLM_TYPE_27B, which
    ``llama_model_gemma3::load_arch_hparams`` sets from ``n_layer == 62``, else ``1/sqrt(n_embd_head_k)``."""
    d = hp.n_embd // hp.n_head(0) if hp.n_layer == N_LAYER_27B else hp.n_embd_head_k
    return 1.0 / float(d) ** 0.5


class Gemma3GraphBuilder(GraphBuilder):
    """``llm_build_gemma3<iswa=true>``."""

    def ffn(self, res: GraphResult, il: int, cur: Tensor) -> Tensor:
        return self.build_ffn(res, il, cur, "gelu")

    def build_layers(self, res: GraphResult) -> Tensor:
        hp, m, cb = self.hp, self.model, self.cb
        inpL = self.build_inp_embd(res)
        inpL = cb(res, ops.scale(inpL, math.sqrt(float(hp.n_embd))), "inp_scaled", -1)
        inp_pos = self.build_inp_pos(res)
        inp_attn = self.build_inp_attn(res)   # iSWA; without a sliding window in the file, one cache
        out_ids = self.build_inp_out_ids(res)
        q_scale = f_attention_scale(hp)
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            cur = self.build_norm(res, inpL, m.w(p + "attn_norm.weight"), il)
            cb(res, cur, "attn_norm", il)
            q, k, v = self.qkv(res, il, cur)
            q = cb(res, self.build_norm(res, q, m.w(p + "attn_q_norm.weight"), il), "Qcur_normed", il)
            q = self.rope(q, inp_pos, il)
            k = cb(res, self.build_norm(res, k, m.w(p + "attn_k_norm.weight"), il), "Kcur_normed", il)
            k = self.rope(k, inp_pos, il)
            cb(res, q, "Qcur", il)
            cb(res, k, "Kcur", il)
            cb(res, v, "Vcur", il)
            q = ops.scale(q, q_scale)
            cur = self.build_attn(res, inp_attn, m.w(p + "attn_output.weight"), None, q, k, v, None, None, None,
                                  1.0, il)
            if il == hp.n_layer - 1:
                cur = ops.get_rows(cur, out_ids)
                inpL = ops.get_rows(inpL, out_ids)
            cur = self.build_norm(res, cur, m.w(p + "post_attention_norm.weight"), il)
            cb(res, cur, "attn_post_norm", il)
            sa_out = cb(res, ops.add(cur, inpL), "sa_out", il)
            cur = self.build_norm(res, sa_out, m.w(p + "ffn_norm.weight"), il)
            cb(res, cur, "ffn_norm", il)
            cur = self.ffn(res, il, cur)
            cb(res, cur, "ffn_out", il)
            cur = self.build_norm(res, cur, m.w(p + "post_ffw_norm.weight"), -1)
            cb(res, cur, "ffn_post_norm", il)
            cur = cb(res, ops.add(cur, sa_out), "l_out", il)
            inpL = cur
        return inpL


@final
@dataclass(frozen=True)
class Gemma3(Architecture):
    """``LLM_ARCH_GEMMA3``."""

    def layer_tensors(self, hp: HParams, il: int) -> list[TensorSpec]:
        E = hp.n_embd
        return [*attn_tensors(hp, il), *qk_norm_tensors(hp), TensorSpec("post_attention_norm", (E,)),
                TensorSpec("ffn_norm", (E,)), *ffn_tensors(hp, il, ("ffn_gate", "ffn_down", "ffn_up")),
                TensorSpec("post_ffw_norm", (E,))]

    def read_hparams(self, f: GGUFFile) -> dict[str, Any]:
        """``llama_model_gemma3::load_arch_hparams``: the sliding window, if the file has one."""
        n_swa = f.get_int(f.arch_key("attention.sliding_window"))
        if not n_swa:
            return {}
        key = f.arch_key("attention.sliding_window_pattern")
        if f.get(key) is not None and not isinstance(f.get(key), int):
            raise UnsupportedFeature(key, f"{f.path}: {key} is a per-layer array; only a period is supported")
        return {"swa": SWAParams(window=n_swa, pattern=f.get_int(key, SWA_PATTERN_DEFAULT) or 0,
                                 rope_freq_base=f.get_float(f.arch_key("rope.freq_base_swa"),
                                                            ROPE_FREQ_BASE_SWA_DEFAULT))}

    def gguf_keys(self, hp: HParams) -> dict[str, Any]:
        swa = hp.swa
        if swa is None:
            return {}
        out: dict[str, Any] = {"attention.sliding_window": swa.window, "attention.sliding_window_pattern": swa.pattern}
        if swa.rope_freq_base is not None:
            out["rope.freq_base_swa"] = swa.rope_freq_base
        return out

    def check(self, hp: HParams) -> None:
        if hp.moe is not None:
            raise UnsupportedFeature("experts", f"{self.name} has no experts (llm_build_gemma3's FFN is dense)")
        if hp.swa is not None and hp.swa.layers is not None:
            raise UnsupportedFeature("swa", f"{self.name}'s sliding window is a period (set_swa_pattern), "
                                     "not per-layer flags")


GEMMA3 = Gemma3("gemma3", Gemma3GraphBuilder, ROPE_TYPE_NEOX, qk_norm=True)
ARCHITECTURES = (GEMMA3,)

__all__ = ["ARCHITECTURES", "GEMMA3", "Gemma3", "Gemma3GraphBuilder", "f_attention_scale"]
