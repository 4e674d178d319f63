"""What every architecture provides: the record llama.cpp's ``llama_model_<arch>`` subclasses fill in.

An :class:`Architecture` is abstract; each architecture module (``toolkit.models.archs.llama`` and
its siblings) defines one final, frozen subclass and its instances, the way ``src/models/<arch>.cpp``
defines ``load_arch_hparams``, ``load_arch_tensors`` and ``build_arch_graph`` for one ``LLM_ARCH_*``:

- ``name``: ``general.architecture`` (the GGUF key prefix);
- ``builder``: the graph builder class (``build_arch_graph``);
- ``rope_type``: ``llama_model_rope_type`` (:data:`ROPE_TYPE_NORM` or :data:`ROPE_TYPE_NEOX`);
- ``qk_norm``: whether attention RMS-normalises Q and K per head (``attn_q_norm``/``attn_k_norm``);
- ``memory``: the kind of memory ``llama_model::create_memory`` makes (:data:`MEMORY_KV`; the
  hyperparameters' sliding window turns a KV cache into iSWA's pair);
- :meth:`Architecture.layer_tensors`: layer il's weights in GGUF write order, with shapes and the
  op that consumes each (``load_arch_tensors``);
- :meth:`Architecture.read_hparams`: the GGUF keys it reads beyond the common ones
  (``load_arch_hparams``), as constructor arguments of the hyperparameters;
- :meth:`Architecture.gguf_keys`: those keys again, for a GGUF writer;
- :meth:`Architecture.graph_max_nodes`: ``llama_context::graph_max_nodes`` for it;
- :meth:`Architecture.check`: what ``load_arch_tensors`` refuses (a missing feature, an invalid mix).

The pieces the architectures share (Q/K/V/O projections, the dense gated FFN, the experts, and the
DeepSeek-style MoE layer of deepseek2 and glm4moe: its tensors, keys, NextN block and routed experts) are
the functions below, as llama.cpp's ``create_tensor_qkv`` is shared.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from toolkit.errors import GGUFError, ToolkitError, UnsupportedFeature
from toolkit.ggml.tensor import Tensor
from toolkit.ggml.types import F32, to_f32
from toolkit.models import moe as moe_ffn
from toolkit.models.graph import GraphBuilder, GraphResult
from toolkit.models.hparams import (
    ROPE_FREQS_LAYER,
    SCALED_EXPERT_WEIGHTS,
    SCALED_LAYER_WEIGHTS,
    HParams,
    RopeScaling,
    WeightInfo,
)
from toolkit.models.loader import LoadedModel
from toolkit.models.memory import Memory

if TYPE_CHECKING:
    from toolkit.models.gguf_file import GGUFFile

# llama_rope_type: LLAMA_ROPE_TYPE_NORM (adjacent pairs) and LLAMA_ROPE_TYPE_NEOX (= GGML_ROPE_TYPE_NEOX, halves)
ROPE_TYPE_NORM = 0
ROPE_TYPE_NEOX = 2
# the MoE keys deepseek2's and glm4moe's load_arch_hparams read that the common reader refuses elsewhere
MOE_KEYS = ("expert_shared_count", "leading_dense_block_count")
# Architecture.memory: a llama_kv_cache (llama_kv_cache_iswa when the hyperparameters have a sliding window)
MEMORY_KV = "kv"


@dataclass(frozen=True)
class TensorSpec:
    """One per-layer weight: its name inside the block (``attn_q`` for ``blk.<il>.attn_q.weight``),
    ggml shape ``ne``, the op that consumes it (which decides its buffer type on CPU,
    ``weight_buft_supported``), whether it stays F32 whatever the file's type (the MoE router and
    the biases, which llama-quantize skips), and the name's last part (``tn(..., "weight" | "bias", il)``)."""

    suffix: str
    ne: tuple[int, ...]
    op: str = ""          # "": MUL for a 1-D norm, MUL_MAT for a matrix
    keep_f32: bool = False
    kind: str = "weight"  # "bias": blk.<il>.<suffix>.bias; "": blk.<il>.<suffix> (qwen35's ssm_a)

    def __post_init__(self) -> None:
        if not self.op:
            object.__setattr__(self, "op", "MUL" if len(self.ne) == 1 else "MUL_MAT")


@dataclass(frozen=True)
class Architecture(abc.ABC):
    """An architecture the toolkit builds; register an instance with :func:`toolkit.models.archs.register`."""

    name: str
    builder: type[GraphBuilder]
    rope_type: int
    qk_norm: bool = False
    memory: str = MEMORY_KV
    # load_arch_tensors creates the tied output (TENSOR_DUPLICATED) before token_embd: always its own tensor
    tied_output_first: bool = False
    # MoE tensors build_moe_ffn's plain path lacks that this architecture builds (gemma4: the merged
    # ffn_gate_up_exps); toolkit.models.moe.from_gguf refuses them in any other architecture's file
    moe_tensors: tuple[str, ...] = ()
    # MoE keys its load_arch_hparams reads that the common reader refuses for every other architecture
    # (deepseek2's expert_shared_count, leading_dense_block_count)
    moe_keys: tuple[str, ...] = ()
    # the graph multiplies each projection by its weight's ``.scale`` when the file has one (build_lora_mm's w_s)
    scaled_mm: bool = False

    @abc.abstractmethod
    def layer_tensors(self, hp: HParams, il: int) -> list[TensorSpec]:
        """Layer il's weights in GGUF write order (``load_arch_tensors``' loop body)."""

    def read_hparams(self, f: GGUFFile) -> dict[str, Any]:
        """The keys ``load_arch_hparams`` reads beyond the common ones, as hyperparameter arguments."""
        del f
        return {}

    def gguf_keys(self, hp: HParams) -> dict[str, Any]:
        """The keys a GGUF writer adds for this architecture (``<name>.`` prefix left off): int, float,
        bool or a list of them."""
        del hp
        return {}

    def graph_max_nodes(self, n_tensors: int, n_tokens: int) -> int:
        """``llama_context::graph_max_nodes`` (llama.cpp 3f545be, src/llama-context.cpp): every
        architecture but the recurrent hybrids (Qwen3-Next, Qwen3.5, Kimi-Linear, ...) gets
        ``max(1024, 8 * n_tensors)``; no LoRA adapters, no backend samplers."""
        del n_tokens  # only the hybrids' rule, max(40 * n_tokens, 32 * n_tensors), reads it
        return max(1024, 8 * n_tensors)

    def check(self, hp: HParams) -> None:
        """Raise a typed error for hyperparameters this architecture cannot have (default: none)."""
        del hp

    # ---- what the record gives every architecture -------------------------------------------------
    def weights(self, hp: HParams) -> list[WeightInfo]:
        """The GGUF's tensors in file order (``llama_model::load_tensors``): ``rope_freqs`` when the
        file has it, token_embd, each block's :meth:`layer_tensors`, output_norm, output (unless tied).
        ToolkitError for a weight whose row is not a whole number of its type's blocks.

        The order matters for the memory-mapped CPU buffer, which spans the file range of the tensors
        it holds (``llama_model_loader::get_mapping_range``)."""
        E = hp.n_embd
        out = []
        if hp.rope_freqs is not None:
            # convert_hf_to_gguf writes it first; llama.cpp duplicates it per repeating layer's buffer type
            out.append(WeightInfo("rope_freqs.weight", (hp.n_rot // 2,), F32, ROPE_FREQS_LAYER, "ROPE"))
        out.append(hp.weight("token_embd.weight", (E, hp.n_vocab), -1, "GET_ROWS"))
        for il in range(hp.n_layer_all):    # the NextN/MTP blocks' tensors are skip (TENSOR_SKIP)
            for t in self.layer_tensors(hp, il):
                name = f"blk.{il}.{t.suffix}.{t.kind}" if t.kind else f"blk.{il}.{t.suffix}"
                if t.keep_f32 and not any(name.endswith(s) for s in hp.tensor_types):
                    # llama-quantize leaves it F32
                    out.append(WeightInfo(name, t.ne, F32, il, t.op, skip=hp.is_nextn(il)))
                else:
                    out.append(hp.weight(name, t.ne, il, t.op))
            # llama_model::load_tensors' generic pass after load_arch_tensors: the optional per-tensor scales
            for suffix in SCALED_LAYER_WEIGHTS:
                if f"blk.{il}.{suffix}.weight" in hp.weight_scales:
                    out.append(WeightInfo(f"blk.{il}.{suffix}.scale", (1,), F32, il, "MUL", skip=hp.is_nextn(il)))
            for suffix in SCALED_EXPERT_WEIGHTS:   # per expert, {n_expert} (build_lora_mm_id's w_s)
                if f"blk.{il}.{suffix}.weight" in hp.weight_scales and hp.moe is not None:
                    out.append(WeightInfo(f"blk.{il}.{suffix}.scale", (hp.moe.n_expert,), F32, il, "MUL",
                                          skip=hp.is_nextn(il)))
        # the output layer is n_layer_all (llama_model::load_tensors: dev_output = get_layer_buft_list(n_layer_all))
        out.append(hp.weight("output_norm.weight", (E,), hp.n_layer_all, "MUL"))
        if not hp.tied:
            out.append(hp.weight("output.weight", (E, hp.n_vocab), hp.n_layer_all))
            if "output.weight" in hp.weight_scales:   # output_s, created for an NVFP4 output only
                out.append(WeightInfo("output.scale", (1,), F32, hp.n_layer_all, "MUL"))
        for w in out:
            if w.ne[0] % w.type.blck_size:
                raise ToolkitError(f"{w.name}: row of {w.ne[0]} elements is not a multiple of {w.type.name}'s "
                                   f"block size {w.type.blck_size}")
        return out

    def make_builder(self, model: LoadedModel, memory: Memory, *, flash_attn: bool,
                     graph_size: int) -> GraphBuilder:
        """This architecture's graph builder over a loaded model and its memory (``build_arch_graph``)."""
        return self.builder(model, memory, flash_attn=flash_attn, graph_size=graph_size, rope_type=self.rope_type)


# ---- per-layer pieces the architectures share (create_tensor_qkv & co.) -------------------------------

def attn_tensors(hp: HParams, il: int) -> list[TensorSpec]:
    """``attn_norm``, ``attn_q/k/v`` (``create_tensor_qkv``) and ``attn_output``."""
    E, Hk = hp.n_embd, hp.n_embd_head_k
    return [TensorSpec("attn_norm", (E,)), TensorSpec("attn_q", (E, Hk * hp.n_head(il))),
            TensorSpec("attn_k", (E, hp.n_embd_k_gqa(il))), TensorSpec("attn_v", (E, hp.n_embd_v_gqa(il))),
            TensorSpec("attn_output", (Hk * hp.n_head(il), E))]


def qk_norm_tensors(hp: HParams) -> list[TensorSpec]:
    """``attn_q_norm`` and ``attn_k_norm``: one RMS-norm weight per head dimension."""
    return [TensorSpec("attn_q_norm", (hp.n_embd_head_k,)), TensorSpec("attn_k_norm", (hp.n_embd_head_k,))]


def ffn_tensors(hp: HParams, il: int, order: tuple[str, ...]) -> list[TensorSpec]:
    """The dense gated FFN's ``ffn_gate``/``ffn_up``/``ffn_down`` in the writer's ``order``."""
    E, F = hp.n_embd, hp.n_ff(il)
    ne = {"ffn_gate": (E, F), "ffn_up": (E, F), "ffn_down": (F, E)}
    return [TensorSpec(s, ne[s]) for s in order]


def moe_tensors(hp: HParams, il: int) -> list[TensorSpec]:
    """The router and the 3-D expert tensors of ``build_moe_ffn`` (:func:`toolkit.models.moe.layer_tensors`)."""
    assert hp.moe is not None
    return [TensorSpec(s, ne, op, keep_f32=router)
            for s, ne, op, router in moe_ffn.layer_tensors(hp.moe, hp.n_embd, hp.n_ff(il))]


# ---- DeepSeek-style MoE layers (deepseek2, glm4moe): routed experts, a shared one, a dense lead ---------

def routed_experts(b: GraphBuilder, res: GraphResult, il: int, cur: Tensor) -> Tensor:
    """``build_moe_ffn`` with ``exp_probs_b`` (when the file has it), the hyperparameters' gating,
    ``expert_weights_norm``, scale and groups: ``ffn_moe_out`` (deepseek2's and glm4moe's routed experts)."""
    hp, m = b.hp, b.model
    assert hp.moe is not None
    p = f"blk.{il}."
    out = moe_ffn.build_moe_ffn(
        res.graph, lambda t, name, i: b.cb(res, t, name, i), cur, m.w(p + "ffn_gate_inp.weight"),
        m.w(p + "ffn_up_exps.weight"), m.w(p + "ffn_gate_exps.weight"), m.w(p + "ffn_down_exps.weight"), hp.moe, il,
        norm_w=hp.moe.weights_norm, exp_probs_b=m.tensors.get(p + "exp_probs_b.bias"))
    return b.cb(res, out, "ffn_moe_out", il)


def moe_layer_tensors(hp: HParams, il: int, order: tuple[str, ...]) -> list[TensorSpec]:
    """A MoE layer's router, ``exp_probs_b`` (when the model has it), the experts in ``order`` and the shared expert
    (gate, down, up; ``n_ff_exp * n_expert_shared`` wide)."""
    assert hp.moe is not None
    E, X = hp.n_embd, hp.moe.n_expert
    F = hp.moe.ff(hp.n_ff(il))
    FS = F * hp.moe.n_expert_shared
    exps = {"ffn_gate_exps": (E, F, X), "ffn_down_exps": (F, E, X), "ffn_up_exps": (E, F, X)}
    out = [TensorSpec("ffn_gate_inp", (E, X), "MUL_MAT", True)]
    if hp.moe.exp_probs_b:
        out.append(TensorSpec("exp_probs_b", (X,), "ADD", True, "bias"))
    out += [TensorSpec(s, exps[s], "MUL_MAT_ID") for s in order]
    if FS:
        out += [TensorSpec("ffn_gate_shexp", (E, FS)), TensorSpec("ffn_down_shexp", (FS, E)),
                TensorSpec("ffn_up_shexp", (E, FS))]
    return out


def nextn_tensors(hp: HParams) -> list[TensorSpec]:
    """A NextN/MTP block's own tensors (``embed_tokens`` and ``shared_head_head`` are TENSOR_NOT_REQUIRED:
    the converters write neither)."""
    E = hp.n_embd
    return [TensorSpec("nextn.eh_proj", (2 * E, E)), TensorSpec("nextn.enorm", (E,)),
            TensorSpec("nextn.hnorm", (E,)), TensorSpec("nextn.shared_head_norm", (E,))]


def head_after_token_embd(out: list[WeightInfo]) -> list[WeightInfo]:
    """``load_arch_tensors`` creates ``output_norm`` and ``output`` right after ``token_embd``."""
    head = [w for w in out if w.name in ("output_norm.weight", "output.weight")]
    rest = [w for w in out if w not in head]
    i = next(j for j, w in enumerate(rest) if w.name == "token_embd.weight") + 1
    return [*rest[:i], *head, *rest[i:]]


def read_moe(f: GGUFFile, gating_default: str, exp_probs_b: bool) -> dict[str, Any]:
    """The MoE keys deepseek2 and glm4moe read alike: the experts, the shared experts, the dense lead,
    the weights scale and norm, the gating function (``gating_default`` when the key is absent) and the
    expert groups (common keys); ``exp_probs_b``: the layers have the selection bias."""
    def key(k: str) -> str:
        return f.arch_key(k)

    n_expert = f.get_int(key("expert_count")) or 0
    if n_expert <= 0:
        raise GGUFError(f.path, "n_expert must be > 0", None, key("expert_count"))
    ff_key = key("expert_feed_forward_length")
    if f.get_int(ff_key) is None:
        raise GGUFError(f.path, "required key is missing", None, ff_key)
    gating_id = f.get_int(key("expert_gating_func")) or 0
    if gating_id and gating_id not in moe_ffn.GATING_FUNC_IDS:
        raise UnsupportedFeature(f"expert gating {gating_id}", f"{f.path}: {key('expert_gating_func')}="
                                 f"{gating_id} is not implemented (1 softmax, 2 sigmoid, 3 softmax_weight)")
    norm = f.get(key("expert_weights_norm"))
    return {"moe": moe_ffn.MoEParams(
        n_expert, f.get_int(key("expert_used_count")) or 0, f.get_int(ff_key) or 0,
        weights_scale=f.get_float(key("expert_weights_scale"), 0.0) or 0.0,
        gating=moe_ffn.GATING_FUNC_IDS[gating_id] if gating_id else gating_default,
        n_expert_shared=f.get_int(key("expert_shared_count")) or 0, weights_norm=bool(norm),
        n_expert_groups=f.get_int(key("expert_group_count")) or 0,
        n_group_used=f.get_int(key("expert_group_used_count")) or 0,
        n_layer_dense_lead=f.get_int(key("leading_dense_block_count")) or 0, exp_probs_b=exp_probs_b)}


def moe_keys(hp: HParams) -> dict[str, Any]:
    """The MoE keys :func:`read_moe` reads, for a GGUF writer (the expert groups only when set)."""
    assert hp.moe is not None
    mp = hp.moe
    ids = {v: k for k, v in moe_ffn.GATING_FUNC_IDS.items()}
    out: dict[str, Any] = {"leading_dense_block_count": mp.n_layer_dense_lead,
                           "expert_shared_count": mp.n_expert_shared, "expert_weights_scale": float(mp.weights_scale),
                           "expert_weights_norm": mp.weights_norm, "expert_gating_func": ids[mp.gating]}
    if mp.n_expert_groups:
        out.update({"expert_group_count": mp.n_expert_groups, "expert_group_used_count": mp.n_group_used})
    return out


def read_nextn(f: GGUFFile) -> dict[str, Any]:
    """``nextn_predict_layers``: the NextN/MTP blocks after the trunk (``n_layer = block_count - nextn``)."""
    n_all = f.require_int(f.arch_key("block_count"))
    n_nextn = f.get_int(f.arch_key("nextn_predict_layers")) or 0
    if n_nextn >= n_all:
        raise GGUFError(f.path, f"n_layer_nextn must be < n_layer_all ({n_all})", None,
                        f.arch_key("nextn_predict_layers"))
    return {"n_layer": n_all - n_nextn, "n_layer_nextn": n_nextn} if n_nextn else {}


def read_yarn(f: GGUFFile, log_mul_divisor: float = 1.0, *, mscale_is_log_mul: bool = False) -> dict[str, Any]:
    """``rope.scaling.*`` as YaRN (:class:`~toolkit.models.hparams.RopeScaling`). deepseek2 divides the log
    multiplier by the converter's 0.1 (``log_mul_divisor``) and takes ``mscale = mscale_all_dims``, the log
    multiplier (``mscale_is_log_mul``; ``llama_context``)."""
    kind = f.get_str(f.arch_key("rope.scaling.type"))
    if kind is None or kind == "none":
        return {}
    log_mul = (f.get_float(f.arch_key("rope.scaling.yarn_log_multiplier"), 0.0) or 0.0) / log_mul_divisor
    log_mul = to_f32(log_mul)
    return {"rope_scaling": RopeScaling(
        kind, f.get_float(f.arch_key("rope.scaling.factor"), 0.0) or 0.0,
        f.get_int(f.arch_key("rope.scaling.original_context_length"), 0) or 0, log_mul,
        log_mul if mscale_is_log_mul and log_mul else 1.0)}


def yarn_keys(hp: HParams, log_mul_factor: float = 1.0) -> dict[str, Any]:
    """The ``rope.scaling.*`` keys :func:`read_yarn` reads, the log multiplier times ``log_mul_factor`` (0.1
    for deepseek2, as its converter writes it)."""
    ys = hp.rope_scaling
    if ys is None:
        return {}
    out: dict[str, Any] = {"rope.scaling.type": ys.type, "rope.scaling.factor": ys.factor,
                           "rope.scaling.original_context_length": ys.orig_ctx}
    if ys.yarn_log_mul:
        out["rope.scaling.yarn_log_multiplier"] = ys.yarn_log_mul * log_mul_factor
    return out
