"""Model hyperparameters and the model's weight tensors (``llama_hparams`` + ``llm_tensor`` names).

A :class:`LlamaHParams` describes a model of one of the architectures the toolkit builds
(``llama`` with or without experts, ``qwen3``, ``qwen3moe``, ``gemma3``; :data:`SUPPORTED_ARCHS`)
well enough to build llama.cpp's graph and to size its weights: the shapes, the type of every
weight (``dtype`` for 2-D matrices, F32 for 1-D norms, per-suffix overrides in ``tensor_types``),
whether the output head is tied to the token embedding, the ``rope_freqs`` factors of Llama-3.x files, and the
sliding window of iSWA models (``n_swa``, ``swa_pattern``: ``llama_hparams::set_swa_pattern``).

>>> from toolkit.models import presets
>>> hp = presets.tiny()
>>> hp.n_embd_head, hp.n_embd_k_gqa, hp.n_tensors
(16, 32, 21)
>>> [w.name for w in hp.weights()][:3]
['token_embd.weight', 'blk.0.attn_norm.weight', 'blk.0.attn_q.weight']
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from toolkit.errors import ToolkitError, UnsupportedFeature
from toolkit.ggml.types import F16, F32, GGMLType
from toolkit.models import moe as moe_ffn
from toolkit.models.moe import MoEParams

# GGUF data alignment (general.alignment default): every tensor's data starts at a multiple of it
GGUF_DEFAULT_ALIGNMENT = 32
# WeightInfo.layer of rope_freqs.weight: one copy per buffer type of the repeating layers
ROPE_FREQS_LAYER = -2

# the architectures with a graph builder (toolkit.models.archs); anything else is refused
SUPPORTED_ARCHS = ("llama", "qwen3", "gemma3", "qwen3moe")
# architectures whose attention RMS-normalises Q and K per head (attn_q_norm / attn_k_norm)
QK_NORM_ARCHS = ("qwen3", "qwen3moe", "gemma3")

# the per-layer weights of each architecture, in the order a GGUF writer stores them
_LAYER_TENSORS: dict[str, tuple[str, ...]] = {
    "llama": ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
              "ffn_down"),
    "qwen3": ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm", "ffn_norm",
              "ffn_gate", "ffn_down", "ffn_up"),
    # qwen3's attention; the expert tensors (toolkit.models.moe.layer_tensors) follow ffn_norm
    "qwen3moe": ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm", "ffn_norm"),
    "gemma3": ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
               "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_down", "ffn_up", "post_ffw_norm"),
}


def check_arch(arch: str) -> str:
    """``arch`` if the toolkit builds its graph, else UnsupportedFeature naming the supported ones."""
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedFeature(
            "arch", f"architecture {arch!r} is not supported; supported: {', '.join(SUPPORTED_ARCHS)}")
    return arch


@dataclass(frozen=True)
class WeightInfo:
    """One model tensor: GGUF name, ggml shape (ne), type, layer (-1 input, n_layer output)."""

    name: str
    ne: tuple[int, ...]
    type: GGMLType
    layer: int
    # the op that consumes the weight, which decides its buffer type on CPU (llama's weight_buft_supported)
    op: str = "MUL_MAT"

    @property
    def nbytes(self) -> int:
        n = self.type.row_size(self.ne[0])
        for x in self.ne[1:]:
            n *= x
        return n


@dataclass(frozen=True)
class LlamaHParams:
    """The hyperparameters llama.cpp reads from a llama GGUF (``print_info``)."""

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int = 32000
    n_ctx_train: int = 4096
    n_embd_head_: int | None = None     # None: n_embd / n_head
    n_rot_: int | None = None           # None: the head dimension
    rope_freq_base: float = 10000.0
    eps: float = 1e-5
    tied: bool = False
    dtype: GGMLType = F32               # type of the 2-D weight matrices
    tensor_types: Mapping[str, GGMLType] = field(default_factory=dict)  # suffix → type overrides
    name: str = "llama"
    arch: str = "llama"                 # general.architecture (SUPPORTED_ARCHS)
    rope_freqs: tuple[float, ...] | None = None  # rope_freqs.weight (Llama-3.x rope scaling), n_rot/2 factors
    n_swa: int = 0                      # sliding window (attention.sliding_window); 0: none
    swa_pattern: int = 0                # set_swa_pattern(n_pattern): layer il is SWA if il % n < n - 1
    rope_freq_base_swa: float | None = None  # rope.freq_base_swa (SWA layers); None: rope_freq_base
    moe: MoEParams | None = None        # Mixtral-style experts (build_moe_ffn) instead of the dense FFN

    def __post_init__(self) -> None:
        check_arch(self.arch)
        if self.rope_freqs is not None:
            rf = tuple(float(x) for x in self.rope_freqs)
            if len(rf) != self.n_rot // 2:
                raise ToolkitError(f"rope_freqs has {len(rf)} factors; n_rot={self.n_rot} needs {self.n_rot // 2}")
            object.__setattr__(self, "rope_freqs", rf)
        if not isinstance(self.n_swa, int) or self.n_swa < 0 or not isinstance(self.swa_pattern, int) \
                or self.swa_pattern < 0:
            raise ToolkitError(f"n_swa={self.n_swa!r} and swa_pattern={self.swa_pattern!r} must be integers >= 0")
        for f in ("n_layer", "n_embd", "n_head", "n_head_kv", "n_ff", "n_vocab", "n_ctx_train"):
            v = getattr(self, f)
            if not isinstance(v, int) or v <= 0:
                raise ToolkitError(f"{f} must be a positive integer, got {v!r}")
        if self.n_head % self.n_head_kv:
            raise ToolkitError(f"n_head={self.n_head} is not a multiple of n_head_kv={self.n_head_kv}")
        if self.n_embd_head_ is None and self.n_embd % self.n_head:
            raise ToolkitError(f"n_embd={self.n_embd} is not a multiple of n_head={self.n_head}")
        object.__setattr__(self, "dtype", GGMLType.parse(self.dtype))
        object.__setattr__(self, "tensor_types", {k: GGMLType.parse(v) for k, v in dict(self.tensor_types).items()})

    # ---- derived sizes (llama_hparams) ---------------------------------------------------
    @property
    def n_embd_head(self) -> int:
        return self.n_embd_head_ if self.n_embd_head_ is not None else self.n_embd // self.n_head

    @property
    def n_rot(self) -> int:
        return self.n_rot_ if self.n_rot_ is not None else self.n_embd_head

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv

    @property
    def n_embd_k_gqa(self) -> int:
        return self.n_embd_head * self.n_head_kv

    @property
    def n_embd_v_gqa(self) -> int:
        return self.n_embd_head * self.n_head_kv

    # ---- architecture features (llama_hparams / llm_build_*) --------------------------------
    @property
    def qk_norm(self) -> bool:
        """attn_q_norm / attn_k_norm RMS norms on Q and K before RoPE (qwen3, gemma3)."""
        return self.arch in QK_NORM_ARCHS

    @property
    def is_swa_any(self) -> bool:
        return self.n_swa > 0

    def is_swa(self, il: int) -> bool:
        """``llama_hparams::is_swa``: layer il attends through the sliding window (set_swa_pattern)."""
        if self.n_swa == 0:
            return False
        n = self.swa_pattern
        return n == 0 or il % n < n - 1

    def rope_base(self, il: int) -> float:
        """``llama_model::get_rope_freq_base``: the SWA base on SWA layers."""
        if self.is_swa(il) and self.rope_freq_base_swa is not None:
            return self.rope_freq_base_swa
        return self.rope_freq_base

    @property
    def f_attention_scale(self) -> float:
        """gemma3's Q scale: 1/sqrt(n_embd_head_k), but 1/sqrt(n_embd/n_head) for the 27B (62 layers)."""
        d = self.n_embd // self.n_head if self.n_layer == 62 else self.n_embd_head
        return 1.0 / float(d) ** 0.5

    # ---- weights --------------------------------------------------------------------------
    def tensor_type(self, name: str, ne: tuple[int, ...]) -> GGMLType:
        """The type of a weight: an override by the longest matching suffix, else F32 for 1-D, else dtype.

        A matrix whose rows are not a whole number of ``dtype`` blocks is stored F16, as the oracle's
        small_q4_0 stores ffn_down (688 columns are not a multiple of Q4_0's 32).
        """
        best = ""
        for suffix in self.tensor_types:
            if name.endswith(suffix) and len(suffix) > len(best):
                best = suffix
        if best:
            return self.tensor_types[best]
        if len(ne) == 1:
            return F32
        return self.dtype if ne[0] % self.dtype.blck_size == 0 else F16

    def _w(self, name: str, ne: tuple[int, ...], layer: int, op: str = "MUL_MAT") -> WeightInfo:
        return WeightInfo(name, ne, self.tensor_type(name, ne), layer, op)

    def weights(self) -> list[WeightInfo]:
        """The GGUF's tensors in file order: token_embd, the blocks, output_norm, output.

        The order matters for the memory-mapped CPU buffer, which spans the file range of
        the tensors it holds (llama_model_loader::get_mapping_range).
        """
        E, H = self.n_embd, self.n_embd_head
        out = []
        if self.rope_freqs is not None:
            # convert_hf_to_gguf writes it first; llama.cpp duplicates it per repeating layer's buffer type
            out.append(WeightInfo("rope_freqs.weight", (self.n_rot // 2,), F32, ROPE_FREQS_LAYER, "ROPE"))
        out.append(self._w("token_embd.weight", (E, self.n_vocab), -1, "GET_ROWS"))
        shapes = {
            "attn_norm": (E,), "attn_q": (E, H * self.n_head), "attn_k": (E, self.n_embd_k_gqa),
            "attn_v": (E, self.n_embd_v_gqa), "attn_output": (H * self.n_head, E), "ffn_norm": (E,),
            "ffn_gate": (E, self.n_ff), "ffn_up": (E, self.n_ff), "ffn_down": (self.n_ff, E),
            "attn_q_norm": (H,), "attn_k_norm": (H,), "post_attention_norm": (E,), "post_ffw_norm": (E,),
        }
        moe = self.moe
        for il in range(self.n_layer):
            for t in _LAYER_TENSORS[self.arch]:
                if moe is not None and t in ("ffn_gate", "ffn_up", "ffn_down"):
                    continue
                ne = shapes[t]
                out.append(self._w(f"blk.{il}.{t}.weight", ne, il, "MUL" if len(ne) == 1 else "MUL_MAT"))
            if moe is not None:
                out += self._moe_weights(moe, il)
        out.append(self._w("output_norm.weight", (E,), self.n_layer, "MUL"))
        if not self.tied:
            out.append(self._w("output.weight", (E, self.n_vocab), self.n_layer))
        return out

    def _moe_weights(self, moe: MoEParams, il: int) -> list[WeightInfo]:
        out = []
        for suffix, ne, op, router in moe_ffn.layer_tensors(moe, self.n_embd, self.n_ff):
            name = f"blk.{il}.{suffix}.weight"
            w = self._w(name, ne, il, op)
            if router and not any(name.endswith(s) for s in self.tensor_types):
                w = WeightInfo(name, ne, F32, il, op)  # the router stays F32 (llama-quantize skips it)
            out.append(w)
        return out

    @property
    def n_tensors(self) -> int:
        """The GGUF's tensor count (a loaded model may add a duplicate of token_embd, see LoadedModel)."""
        return len(self.weights())

    def validate_types(self) -> None:
        """Each weight's row length must be a whole number of blocks of its type."""
        for w in self.weights():
            if w.ne[0] % w.type.blck_size:
                raise ToolkitError(
                    f"{w.name}: row of {w.ne[0]} elements is not a multiple of {w.type.name}'s block size "
                    f"{w.type.blck_size}"
                )

    # ---- constructors ---------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LlamaHParams:
        """From the oracle's ``model`` dict (cases.json schema)."""
        try:
            n_embd, n_head = int(d["n_embd"]), int(d["n_head"])
            head = d.get("n_embd_head")
            rot = d.get("n_rot", d.get("rope_dims"))
            hp = cls(
                n_layer=int(d["n_layer"]), n_embd=n_embd, n_head=n_head,
                n_head_kv=int(d.get("n_head_kv", n_head)), n_ff=int(d["n_ff"]),
                n_vocab=int(d.get("n_vocab", 32000)), n_ctx_train=int(d.get("n_ctx_train", 4096)),
                n_embd_head_=None if head is None or int(head) == n_embd // n_head else int(head),
                n_rot_=None if rot is None or head is None or int(rot) == int(head) else int(rot),
                rope_freq_base=float(d.get("rope_freq_base", 10000.0)), eps=float(d.get("eps", 1e-5)),
                tied=bool(d.get("tied", False)), dtype=GGMLType.parse(d.get("dtype", "f32")),
                tensor_types=dict(d.get("tensor_types") or {}), name=str(d.get("name", "llama")),
                **_arch_fields(d),
                moe=moe_ffn.from_dict(d),
            )
        except KeyError as e:
            raise ToolkitError(f"model description lacks {e.args[0]!r}") from None
        hp.validate_types()
        return hp

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "arch": self.arch, "n_layer": self.n_layer, "n_embd": self.n_embd,
            "n_head": self.n_head, "n_head_kv": self.n_head_kv, "n_ff": self.n_ff, "n_vocab": self.n_vocab,
            "n_ctx_train": self.n_ctx_train, "n_embd_head": self.n_embd_head, "n_rot": self.n_rot,
            "rope_freq_base": self.rope_freq_base, "eps": self.eps, "tied": self.tied,
            "dtype": self.dtype.lower, "tensor_types": {k: v.lower for k, v in self.tensor_types.items()},
            "has_rope_freqs": self.rope_freqs is not None, "rope_freqs": list(self.rope_freqs or ()),
            "qk_norm": self.qk_norm,
            **({"swa": {"window": self.n_swa, "pattern": self.swa_pattern,
                        "rope_freq_base_swa": self.rope_freq_base_swa}} if self.n_swa else {}),
            **(self.moe.to_dict() if self.moe is not None else {}),
        }


def _arch_fields(d: Mapping[str, Any]) -> dict[str, Any]:
    """The architecture fields of an oracle ``model`` dict: arch, rope_freqs, the sliding window."""
    out: dict[str, Any] = {"arch": str(d.get("arch", "llama"))}
    if d.get("has_rope_freqs") and d.get("rope_freqs"):
        out["rope_freqs"] = tuple(float(x) for x in d["rope_freqs"])
    swa = d.get("swa") or {}
    if swa:
        out["n_swa"] = int(swa["window"])
        out["swa_pattern"] = int(swa.get("pattern", 0))
        if swa.get("rope_freq_base_swa") is not None:
            out["rope_freq_base_swa"] = float(swa["rope_freq_base_swa"])
    return out
