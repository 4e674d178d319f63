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

The pieces the architectures share (Q/K/V/O projections, the dense gated FFN, the experts) are
the functions below, as llama.cpp's ``create_tensor_qkv`` is shared.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from toolkit.errors import ToolkitError
from toolkit.ggml.types import F32
from toolkit.models import moe as moe_ffn
from toolkit.models.graph import GraphBuilder
from toolkit.models.hparams import ROPE_FREQS_LAYER, SCALED_LAYER_WEIGHTS, HParams, WeightInfo
from toolkit.models.loader import LoadedModel
from toolkit.models.memory import Memory

if TYPE_CHECKING:
    from toolkit.models.gguf_file import GGUFFile

# llama_rope_type: LLAMA_ROPE_TYPE_NORM (adjacent pairs) and LLAMA_ROPE_TYPE_NEOX (= GGML_ROPE_TYPE_NEOX, halves)
ROPE_TYPE_NORM = 0
ROPE_TYPE_NEOX = 2
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
