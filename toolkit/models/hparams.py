"""Model hyperparameters and the model's weight tensors (``llama_hparams`` + ``llm_tensor`` names).

A :class:`HParams` describes a model of one of the registered architectures
(:mod:`toolkit.models.archs`) well enough to build llama.cpp's graph and to size its weights, with
``llama_hparams``' names and per-layer accessors:

- sizes per layer: ``n_head(il)``, ``n_head_kv(il)``, ``n_ff(il)`` (a GGUF may carry a per-layer
  array for each, ``llama_model_loader::get_key_or_arr``), ``n_embd_k_gqa(il)``, ``n_embd_v_gqa(il)``;
- head sizes per role: ``n_embd_head_k`` and ``n_embd_head_v`` (``attention.key_length`` /
  ``attention.value_length``, default ``n_embd / n_head``);
- features as small records that check themselves: the sliding window (:class:`SWAParams`,
  ``is_swa(il)``), the experts (:class:`~toolkit.models.moe.MoEParams`), the recurrent layers of a
  hybrid (:class:`~toolkit.models.ssm.RecurrentParams`, ``is_recr(il)``), the M-RoPE sections;
- the weights: their shapes come from the architecture's record
  (:meth:`toolkit.models.archs.Architecture.weights`, which the hyperparameters do not look up:
  ``arch`` is a name the registry resolves, above this module); here the type of each (``dtype`` for 2-D
  matrices, F32 for 1-D norms, per-suffix overrides in ``tensor_types``), whether the output head
  is tied to the token embedding, and the ``rope_freqs`` factors of Llama-3.x files.

The constructor takes ``n_head``, ``n_head_kv`` and ``n_ff`` as one value for every layer or a
sequence of ``n_layer`` values (stored as ``n_head_arr`` & co.: an int when every layer agrees).

>>> from toolkit.models import archs, presets
>>> hp = presets.tiny()
>>> hp.n_embd_head_k, hp.n_embd_k_gqa(0), len(archs.get(hp.arch).weights(hp))
(16, 32, 21)
>>> [w.name for w in archs.get(hp.arch).weights(hp)][:3]
['token_embd.weight', 'blk.0.attn_norm.weight', 'blk.0.attn_q.weight']
>>> HParams(n_layer=2, n_embd=64, n_head=4, n_head_kv=(2, 4), n_ff=128).n_embd_k_gqa(1)
64
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from toolkit.errors import ToolkitError, UnsupportedFeature
from toolkit.ggml.types import F16, F32, GGMLType
from toolkit.models import moe as moe_ffn
from toolkit.models.moe import MoEParams
from toolkit.models.ssm import RecurrentParams

if TYPE_CHECKING:
    import numpy as np

# GGUF data alignment (general.alignment default): every tensor's data starts at a multiple of it
GGUF_DEFAULT_ALIGNMENT = 32
# WeightInfo.layer of rope_freqs.weight: one copy per buffer type of the repeating layers
ROPE_FREQS_LAYER = -2

PerLayer = int | tuple[int, ...]


@dataclass(frozen=True)
class SWAParams:
    """A sliding window (``LLAMA_SWA_TYPE_STANDARD``): ``window`` cells (``n_swa``); which layers use it,
    either ``pattern`` (``llama_hparams::set_swa_pattern(n)``: layer il if ``il % n < n - 1``; 0: every
    layer) or per-layer ``layers`` flags; the RoPE base of those layers (``rope_freq_base_train_swa``;
    None: the model's base)."""

    window: int
    pattern: int = 0
    rope_freq_base: float | None = None
    layers: tuple[bool, ...] | None = None
    # the SWA layers' own head geometry (``attention.key_length_swa``, ``attention.value_length_swa``,
    # ``rope.dimension_count_swa``: ``n_embd_head_k_swa`` & co.); None: the model's
    n_embd_head_k: int | None = None
    n_embd_head_v: int | None = None
    n_rot: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.window, int) or self.window <= 0:
            raise ToolkitError(f"sliding window {self.window!r} must be an integer > 0")
        if not isinstance(self.pattern, int) or self.pattern < 0:
            raise ToolkitError(f"sliding window pattern {self.pattern!r} must be an integer >= 0")
        if self.layers is not None:
            if self.pattern:
                raise ToolkitError("a sliding window takes a pattern or per-layer flags, not both")
            object.__setattr__(self, "layers", tuple(bool(x) for x in self.layers))
        if self.rope_freq_base is not None:
            object.__setattr__(self, "rope_freq_base", float(self.rope_freq_base))
        for f, v in self.heads().items():
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise ToolkitError(f"sliding-window layers' {f} {v!r} must be a positive integer")

    def is_swa(self, il: int) -> bool:
        if self.layers is not None:
            return self.layers[il]
        n = self.pattern
        return n == 0 or il % n < n - 1

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"window": self.window, "pattern": self.pattern,
                               "rope_freq_base_swa": self.rope_freq_base}
        if self.layers is not None:
            out["layers"] = list(self.layers)
        out.update({f: v for f, v in self.heads().items() if v is not None})
        return out

    def heads(self) -> dict[str, int | None]:
        """The SWA layers' head geometry as set (None: the model's)."""
        return {"n_embd_head_k": self.n_embd_head_k, "n_embd_head_v": self.n_embd_head_v, "n_rot": self.n_rot}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SWAParams:
        """From a model dict's ``swa`` entry (``window``, ``pattern``, ``rope_freq_base_swa``, ``layers``)."""
        base = d.get("rope_freq_base_swa")
        layers = d.get("layers")
        def opt(k: str) -> int | None:
            return None if d.get(k) is None else int(d[k])

        return cls(int(d["window"]), int(d.get("pattern", 0)), None if base is None else float(base),
                   None if layers is None else tuple(bool(x) for x in layers), opt("n_embd_head_k"),
                   opt("n_embd_head_v"), opt("n_rot"))


@dataclass(frozen=True)
class MLAParams:
    """Multi-head latent attention (DeepSeek V2/V3, ``llama_hparams::is_mla``): ``q_lora_rank``
    (``attention.q_lora_rank``, ``n_lora_q``; 0: the lite variants' plain ``attn_q``), ``kv_lora_rank``
    (``attention.kv_lora_rank``, ``n_lora_kv``) and the decompressed head sizes ``n_embd_head_k_mla`` /
    ``n_embd_head_v_mla`` (``attention.key_length_mla`` / ``value_length_mla``). The cache then holds
    ``key_length = kv_lora_rank + n_rot`` values per token for one KV head, and no V."""

    q_lora_rank: int
    kv_lora_rank: int
    n_embd_head_k_mla: int
    n_embd_head_v_mla: int

    def __post_init__(self) -> None:
        for f in ("kv_lora_rank", "n_embd_head_k_mla", "n_embd_head_v_mla"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ToolkitError(f"MLA's {f} {v!r} must be a positive integer")
        if not isinstance(self.q_lora_rank, int) or isinstance(self.q_lora_rank, bool) or self.q_lora_rank < 0:
            raise ToolkitError(f"MLA's q_lora_rank {self.q_lora_rank!r} must be an integer >= 0")

    def to_dict(self) -> dict[str, Any]:
        return {"q_lora_rank": self.q_lora_rank, "kv_lora_rank": self.kv_lora_rank,
                "n_embd_head_k_mla": self.n_embd_head_k_mla, "n_embd_head_v_mla": self.n_embd_head_v_mla}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MLAParams:
        return cls(int(d.get("q_lora_rank", 0) or 0), int(d["kv_lora_rank"]), int(d["n_embd_head_k_mla"]),
                   int(d["n_embd_head_v_mla"]))


@dataclass(frozen=True)
class RopeScaling:
    """``rope.scaling.*``: the type (only ``yarn``, ``LLAMA_ROPE_SCALING_TYPE_YARN``), ``factor``
    (``rope_freq_scale_train = 1/factor``), ``orig_ctx`` (``original_context_length``, llama.cpp's
    ``n_ctx_orig_yarn``; 0: ``n_ctx_train``) and ``yarn_log_mul`` (``rope.scaling.yarn_log_multiplier``).

    The context's YaRN values follow ``llama_context``'s constructor with no ``--yarn-*`` flags:
    ``ext_factor`` 1, ``attn_factor`` ``get_mscale(factor, 1)`` cancelled by ``1/(1 + 0.1 ln factor)``
    (ggml's rope multiplies that back), ``beta_fast`` 32 and ``beta_slow`` 1 (``llama_hparams``' defaults).
    With ``yarn_log_mul`` the attention factor is ``get_mscale(factor, 1) / get_mscale(factor, yarn_log_mul)``
    (``mscale == 1``; DeepSeek-2's exception, ``mscale = yarn_log_mul``, is ``mscale``: its architecture
    sets it). With ``yarn_log_mul`` the constructor logs the factor it set (:meth:`warning`).

    >>> RopeScaling("yarn", 32.0, 4096).freq_scale, RopeScaling("yarn", 32.0, 4096).attn_factor
    (0.03125, 1.0)
    """

    type: str
    factor: float
    orig_ctx: int = 0
    yarn_log_mul: float = 0.0
    mscale: float = 1.0   # llama_context's mscale (1, or DeepSeek-2's mscale_all_dims)

    def __post_init__(self) -> None:
        if self.type != "yarn":
            raise UnsupportedFeature("rope_scaling", f"RoPE scaling type {self.type!r} is not implemented (yarn is)")
        if not float(self.factor) > 0.0:
            raise ToolkitError(f"rope scaling factor {self.factor!r} must be > 0")
        if not isinstance(self.orig_ctx, int) or self.orig_ctx < 0:
            raise ToolkitError(f"rope scaling original context {self.orig_ctx!r} must be an integer >= 0")
        object.__setattr__(self, "factor", float(self.factor))
        object.__setattr__(self, "yarn_log_mul", float(self.yarn_log_mul))
        object.__setattr__(self, "mscale", float(self.mscale))

    @property
    def freq_scale(self) -> float:
        return 1.0 / self.factor

    ext_factor = 1.0     # cparams.yarn_ext_factor for LLAMA_ROPE_SCALING_TYPE_YARN
    beta_fast = 32.0     # llama_hparams::yarn_beta_fast
    beta_slow = 1.0      # llama_hparams::yarn_beta_slow

    @property
    def attn_factor(self) -> float:
        """``cparams.yarn_attn_factor`` (float32 arithmetic as llama.cpp's)."""
        import numpy as np
        f = np.float32(self.factor)
        return float(np.float32(self._attn_factor_set()) *
                     (np.float32(1.0) / (np.float32(1.0) + np.float32(0.1) * np.log(f))))

    def _attn_factor_set(self) -> np.float32:
        """The factor before the cancelling ``1/(1 + 0.1 ln factor)``: ``get_mscale(factor, mscale) /
        get_mscale(factor, yarn_log_mul)`` with ``yarn_log_mul``, else ``get_mscale(factor, 1)``."""
        import numpy as np  # where it runs: the planning path imports no numpy
        f = np.float32(self.factor)

        def mscale(m: float) -> np.float32:
            return np.float32(1.0) if f <= 1 else np.float32(0.1) * np.float32(m) * np.log(f) + np.float32(1.0)

        if self.yarn_log_mul != 0.0:
            return np.float32(mscale(self.mscale) / mscale(self.yarn_log_mul))
        return mscale(1.0)

    def warning(self) -> str | None:
        """The line ``llama_context``'s constructor logs when ``yarn_log_mul`` is set (None otherwise)."""
        if self.yarn_log_mul == 0.0:
            return None
        return (f"llama_context: setting new yarn_attn_factor = {float(self._attn_factor_set()):.4f} "
                f"(mscale == {self.mscale:.1f}, mscale_all_dim = {self.yarn_log_mul:.1f})")

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "factor": self.factor, "orig_ctx": self.orig_ctx,
                **({"yarn_log_mul": self.yarn_log_mul} if self.yarn_log_mul else {}),
                **({"mscale": self.mscale} if self.mscale != 1.0 else {})}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RopeScaling:
        return cls(str(d["type"]), float(d["factor"]), int(d.get("orig_ctx", 0) or 0),
                   float(d.get("yarn_log_mul", 0.0) or 0.0), float(d.get("mscale", 1.0)))


def _per_layer(what: str, value: int | Sequence[int], n_layer: int, min_value: int = 1) -> PerLayer:
    """``get_key_or_arr``: one value for every layer, or exactly n_layer values; an int when they agree."""
    if isinstance(value, int) and not isinstance(value, bool):
        vals: tuple[Any, ...] = (value,)
    elif isinstance(value, Sequence) and not isinstance(value, str):
        vals = tuple(value)
        if len(vals) != n_layer:
            raise ToolkitError(f"{what} has {len(vals)} per-layer values; n_layer={n_layer} needs {n_layer}")
    else:
        raise ToolkitError(f"{what} must be a positive integer or one per layer, got {value!r}")
    for v in vals:
        if not isinstance(v, int) or isinstance(v, bool) or v < min_value:
            raise ToolkitError(f"{what} must be an integer >= {min_value}, got {v!r}")
    return vals[0] if len(set(vals)) == 1 else vals


def _at(v: PerLayer, il: int) -> int:
    return v if isinstance(v, int) else v[il]


def _as_list(v: PerLayer) -> int | list[int]:
    return v if isinstance(v, int) else list(v)


@dataclass(frozen=True)
class WeightInfo:
    """One model tensor: GGUF name, ggml shape (ne), type, layer (-1 input, n_layer output)."""

    name: str
    ne: tuple[int, ...]
    type: GGMLType
    layer: int
    # the op that consumes the weight, which decides its buffer type on CPU (llama's weight_buft_supported)
    op: str = "MUL_MAT"
    # rope_freqs.weight: the layers that read it, each creating it in its buffer type (None: every layer)
    layers: tuple[int, ...] | None = None
    # TENSOR_SKIP: in the file but never created (a NextN/MTP block's tensor when MTP is not loaded);
    # llama_model_loader::create_tensor warns "model has unused tensor ... -- ignoring"
    skip: bool = False

    @property
    def nbytes(self) -> int:
        n = self.type.row_size(self.ne[0])
        for x in self.ne[1:]:
            n *= x
        return n


# the dense weights whose "<weight>.scale" llama_model::load_tensors' generic pass creates, in its order
# (layer.wq_s, wk_s, wv_s, wo_s, ffn_gate_s, ffn_down_s, ffn_up_s); build_lora_mm multiplies by them
SCALED_LAYER_WEIGHTS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_down", "ffn_up")
# the experts' per-expert scales ({n_expert} F32), created by the same pass after the shared experts'
# (ffn_gate_exps_s, ffn_down_exps_s, ffn_up_exps_s); build_lora_mm_id multiplies the selected experts' rows
SCALED_EXPERT_WEIGHTS = ("ffn_gate_exps", "ffn_down_exps", "ffn_up_exps")


@dataclass(frozen=True, init=False)
class HParams:
    """The hyperparameters llama.cpp reads from a GGUF (``llama_hparams``, ``print_info``)."""

    n_layer: int
    n_embd: int
    n_head_arr: PerLayer                # attention.head_count: one value, or one per layer
    n_head_kv_arr: PerLayer             # attention.head_count_kv (default: n_head)
    n_ff_arr: PerLayer                  # feed_forward_length
    n_vocab: int = 32000
    n_ctx_train: int = 4096
    n_embd_head_k_: int | None = None   # attention.key_length; None: n_embd / n_head
    n_embd_head_v_: int | None = None   # attention.value_length; None: n_embd / n_head
    n_rot_: int | None = None           # rope.dimension_count; None: n_embd_head_k
    rope_freq_base: float = 10000.0
    eps: float = 1e-5
    tied: bool = False
    dtype: GGMLType = F32               # type of the 2-D weight matrices
    tensor_types: Mapping[str, GGMLType] = field(default_factory=dict)  # suffix → type overrides
    name: str = "llama"
    arch: str = "llama"                 # general.architecture: a name in toolkit.models.archs
    rope_freqs: tuple[float, ...] | None = None  # rope_freqs.weight (Llama-3.x rope scaling), n_rot/2 factors
    swa: SWAParams | None = None        # the sliding window of iSWA models
    moe: MoEParams | None = None        # experts (build_moe_ffn) instead of the dense FFN
    rope_scaling: RopeScaling | None = None  # rope.scaling.* (YaRN)
    n_kv_shared: int = 0                # attention.shared_kv_layers: the last layers read an earlier cache
    n_embd_per_layer: int = 0           # embedding_length_per_layer_input (Gemma 4's per-layer embeddings)
    final_logit_softcapping: float = 0.0  # final_logit_softcapping; 0: none
    attn_v_full: bool = True            # the full-attention layers have attn_v (False: V = K, Gemma 4)
    recurrent: RecurrentParams | None = None  # the recurrent layers of a hybrid (is_recr) and their state sizes
    rope_sections: tuple[int, ...] | None = None  # rope.dimension_sections (ggml_rope_multi), 4 values
    # nextn_predict_layers: NextN/MTP blocks after the n_layer trunk blocks (llama_hparams::n_layer_nextn);
    # n_layer is llama_hparams::n_layer() (= n_layer_all - n_layer_nextn), the blocks the graph runs
    n_layer_nextn: int = 0
    # the shard (file index) of each tensor of a split GGUF (llama_tensor_weight::idx); empty: one file
    tensor_files: Mapping[str, int] = field(default_factory=dict)
    # the weights whose per-tensor "<name>.scale" (F32 [1], NVFP4's second-level scale) the file has: the
    # optional tensors llama_model::load_tensors' generic pass creates (TENSOR_NOT_REQUIRED), by weight name
    weight_scales: frozenset[str] = frozenset()
    # multi-head latent attention (deepseek2): the K-only cache and the absorbed attention
    mla: MLAParams | None = None
    # the file has the optional Q/K norms (glm4moe's TENSOR_NOT_REQUIRED attn_q_norm / attn_k_norm); an
    # architecture whose norms are required says so in its record (Architecture.qk_norm)
    qk_norm: bool = False

    def __init__(self, n_layer: int, n_embd: int, n_head: int | Sequence[int] | None = None,
                 n_head_kv: int | Sequence[int] | None = None, n_ff: int | Sequence[int] | None = None, *,
                 n_vocab: int = 32000, n_ctx_train: int = 4096, n_embd_head_k_: int | None = None,
                 n_embd_head_v_: int | None = None, n_rot_: int | None = None, rope_freq_base: float = 10000.0,
                 eps: float = 1e-5, tied: bool = False, dtype: GGMLType | str = F32,
                 tensor_types: Mapping[str, GGMLType | str] | None = None, name: str = "llama", arch: str = "llama",
                 rope_freqs: Sequence[float] | None = None, swa: SWAParams | None = None,
                 moe: MoEParams | None = None, rope_scaling: RopeScaling | None = None,
                 n_kv_shared: int = 0, n_embd_per_layer: int = 0, final_logit_softcapping: float = 0.0,
                 attn_v_full: bool = True,
                 recurrent: RecurrentParams | None = None, rope_sections: Sequence[int] | None = None,
                 n_layer_nextn: int = 0, n_head_arr: PerLayer | None = None,
                 n_head_kv_arr: PerLayer | None = None, n_ff_arr: PerLayer | None = None,
                 tensor_files: Mapping[str, int] | None = None, weight_scales: Iterable[str] = (),
                 mla: MLAParams | None = None, qk_norm: bool = False) -> None:
        """``n_head``/``n_head_kv``/``n_ff``: one value or one per layer (``n_*_arr``, the stored
        fields, are what ``dataclasses.replace`` passes back)."""
        for f, v in (("n_layer", n_layer), ("n_embd", n_embd), ("n_vocab", n_vocab), ("n_ctx_train", n_ctx_train)):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ToolkitError(f"{f} must be a positive integer, got {v!r}")
        heads = n_head if n_head is not None else n_head_arr
        ff = n_ff if n_ff is not None else n_ff_arr
        if heads is None or ff is None:
            raise ToolkitError("n_head and n_ff are required")
        heads = _per_layer("n_head", heads, n_layer)
        kv = n_head_kv if n_head_kv is not None else n_head_kv_arr
        # a recurrent layer of a hybrid may have no KV heads (LFM2's head_count_kv array)
        kv = heads if kv is None else _per_layer("n_head_kv", kv, n_layer, 0 if recurrent is not None else 1)
        ff = _per_layer("n_ff", ff, n_layer)
        s = object.__setattr__
        for k, val in (("n_layer", n_layer), ("n_embd", n_embd), ("n_head_arr", heads), ("n_head_kv_arr", kv),
                       ("n_ff_arr", ff), ("n_vocab", n_vocab), ("n_ctx_train", n_ctx_train),
                       ("n_embd_head_k_", n_embd_head_k_), ("n_embd_head_v_", n_embd_head_v_), ("n_rot_", n_rot_),
                       ("rope_freq_base", rope_freq_base), ("eps", eps), ("tied", tied),
                       ("dtype", GGMLType.parse(dtype)),
                       ("tensor_types", {k2: GGMLType.parse(v2) for k2, v2 in dict(tensor_types or {}).items()}),
                       ("name", name), ("arch", arch), ("rope_freqs", rope_freqs), ("swa", swa), ("moe", moe),
                       ("rope_scaling", rope_scaling), ("n_kv_shared", n_kv_shared),
                       ("n_embd_per_layer", n_embd_per_layer),
                       ("final_logit_softcapping", float(final_logit_softcapping)), ("attn_v_full", attn_v_full),
                       ("recurrent", recurrent),
                       ("rope_sections", None if rope_sections is None else tuple(int(x) for x in rope_sections)),
                       ("n_layer_nextn", n_layer_nextn), ("tensor_files", dict(tensor_files or {})),
                       ("weight_scales", frozenset(weight_scales)), ("mla", mla),
                       ("qk_norm", bool(qk_norm))):
            s(self, k, val)
        self._check()

    def _check(self) -> None:
        for il in range(self.n_layer):
            if self.n_head_kv(il) == 0:
                continue
            if self.n_head(il) % self.n_head_kv(il):
                raise ToolkitError(f"n_head={self.n_head(il)} is not a multiple of n_head_kv={self.n_head_kv(il)}"
                                   + (f" (layer {il})" if not isinstance(self.n_head_arr, int) else ""))
        if (self.n_embd_head_k_ is None or self.n_embd_head_v_ is None) and self.n_embd % self.n_head(0):
            raise ToolkitError(f"n_embd={self.n_embd} is not a multiple of n_head={self.n_head(0)}")
        if self.rope_freqs is not None:
            import numpy as np
            rf = tuple(float(x) for x in np.asarray(self.rope_freqs, np.float32))  # rope_freqs.weight is F32
            if len(rf) != self.n_rot // 2:
                raise ToolkitError(f"rope_freqs has {len(rf)} factors; n_rot={self.n_rot} needs {self.n_rot // 2}")
            object.__setattr__(self, "rope_freqs", rf)
        for f, v in (("n_kv_shared", self.n_kv_shared), ("n_embd_per_layer", self.n_embd_per_layer),
                     ("n_layer_nextn", self.n_layer_nextn)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ToolkitError(f"{f} must be an integer >= 0, got {v!r}")
        if self.n_kv_shared >= self.n_layer:
            raise ToolkitError(f"n_kv_shared={self.n_kv_shared} must be below n_layer={self.n_layer} "
                               "(the first layers keep their own cache)")
        if self.recurrent is not None and len(self.recurrent.layers) != self.n_layer:
            raise ToolkitError(f"the recurrent layers have {len(self.recurrent.layers)} per-layer flags; "
                               f"n_layer={self.n_layer} needs {self.n_layer}")
        if self.rope_sections is not None and len(self.rope_sections) != 4:
            raise ToolkitError(f"rope_sections has {len(self.rope_sections)} values; ggml_rope_multi takes 4")
        if self.swa is not None and self.swa.layers is not None and len(self.swa.layers) != self.n_layer:
            raise ToolkitError(f"the sliding window has {len(self.swa.layers)} per-layer flags; "
                               f"n_layer={self.n_layer} needs {self.n_layer}")

    # ---- sizes per layer (llama_hparams) ----------------------------------------------------
    @property
    def n_layer_all(self) -> int:
        """``llama_hparams::n_layer_all`` (``block_count``): the trunk and the NextN/MTP blocks. Layer
        placement counts these (``-ngl``, the output layer is ``n_layer_all``); the graph and the memory
        run the ``n_layer`` trunk blocks only (``llama_hparams::n_layer()``)."""
        return self.n_layer + self.n_layer_nextn

    def is_nextn(self, il: int) -> bool:
        """Block il is a NextN/MTP block (``il >= n_layer()``): ``load_arch_tensors`` creates its tensors
        ``TENSOR_SKIP`` unless MTP is loaded, so without ``load_mtp`` they are never loaded."""
        return self.n_layer <= il < self.n_layer_all

    def n_head(self, il: int = 0) -> int:
        return _at(self.n_head_arr, il)

    def n_head_kv(self, il: int = 0) -> int:
        return _at(self.n_head_kv_arr, il)

    def n_ff(self, il: int = 0) -> int:
        return _at(self.n_ff_arr, il)

    def n_gqa(self, il: int = 0) -> int:
        kv = self.n_head_kv(il)
        return self.n_head(il) // kv if kv else 0

    @property
    def n_embd_head_k(self) -> int:
        return self.n_embd_head_k_ if self.n_embd_head_k_ is not None else self.n_embd // self.n_head(0)

    @property
    def n_embd_head_v(self) -> int:
        return self.n_embd_head_v_ if self.n_embd_head_v_ is not None else self.n_embd // self.n_head(0)

    @property
    def n_rot(self) -> int:
        return self.n_rot_ if self.n_rot_ is not None else self.n_embd_head_k

    def _swa_head(self, il: int, v: int | None, full: int) -> int:
        return v if v is not None and self.is_swa(il) else full

    def n_embd_head_k_at(self, il: int) -> int:
        """``llama_hparams::n_embd_head_k(il)``: ``n_embd_head_k_swa`` on SWA layers when the model sets it."""
        return self._swa_head(il, self.swa.n_embd_head_k if self.swa else None, self.n_embd_head_k)

    def n_embd_head_v_at(self, il: int) -> int:
        """``llama_hparams::n_embd_head_v(il)``."""
        return self._swa_head(il, self.swa.n_embd_head_v if self.swa else None, self.n_embd_head_v)

    def n_rot_at(self, il: int) -> int:
        """``llama_hparams::n_rot(il)``: ``n_rot_swa`` on SWA layers when the model sets it."""
        return self._swa_head(il, self.swa.n_rot if self.swa else None, self.n_rot)

    def n_embd_k_gqa(self, il: int = 0) -> int:
        return self.n_embd_head_k_at(il) * self.n_head_kv(il)

    def n_embd_v_gqa(self, il: int = 0) -> int:
        return self.n_embd_head_v_at(il) * self.n_head_kv(il)

    def has_kv(self, il: int) -> bool:
        """``llama_hparams::has_kv``: layer il writes its own K/V (``il < n_layer_kv_from_start``; without
        shared layers every block, the NextN/MTP ones too)."""
        return not self.n_kv_shared or il < self.n_layer - self.n_kv_shared

    @property
    def is_mla(self) -> bool:
        """``llama_hparams::is_mla``: the MLA head sizes are set; the KV cache then holds K only (``has_v``
        false in ``llama_kv_cache``)."""
        return self.mla is not None

    def n_embd_k_gqa_max(self) -> int:
        return max(self.n_embd_k_gqa(il) for il in range(self.n_layer))

    def n_embd_v_gqa_max(self) -> int:
        return max(self.n_embd_v_gqa(il) for il in range(self.n_layer))

    # ---- features ---------------------------------------------------------------------------
    @property
    def n_swa(self) -> int:
        """``llama_hparams::n_swa``: the sliding window in cells, 0 without one."""
        return self.swa.window if self.swa is not None else 0

    @property
    def is_swa_any(self) -> bool:
        """A sliding window is set (llama.cpp's ``swa_type != LLAMA_SWA_TYPE_NONE``, which
        ``llama_model::create_memory`` reads to make iSWA's two caches)."""
        return self.swa is not None

    def is_swa(self, il: int) -> bool:
        """``llama_hparams::is_swa``: layer il attends through the sliding window (``set_swa_pattern``:
        never a NextN/MTP block)."""
        return self.swa is not None and il < self.n_layer and self.swa.is_swa(il)

    def is_recr(self, il: int) -> bool:
        """``llama_hparams::is_recr``: layer il keeps a recurrent state (a hybrid's recurrent layers)."""
        # set_recr_pattern / load_arch_hparams: the NextN/MTP blocks are never recurrent
        return self.recurrent is not None and il < self.n_layer and self.recurrent.is_recr(il)

    def n_embd_r(self) -> int:
        """``llama_hparams::n_embd_r``: the convolution state's values per sequence (0 without recurrent layers)."""
        return self.recurrent.n_embd_r(self.n_embd) if self.recurrent is not None else 0

    def n_embd_s(self) -> int:
        """``llama_hparams::n_embd_s``: the SSM state's values per sequence."""
        return self.recurrent.n_embd_s() if self.recurrent is not None else 0

    def rope_base(self, il: int) -> float:
        """``llama_model::get_rope_freq_base``: the SWA base on SWA layers."""
        if self.swa is not None and self.swa.rope_freq_base is not None and self.is_swa(il):
            return self.swa.rope_freq_base
        return self.rope_freq_base

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

    def weight(self, name: str, ne: tuple[int, ...], layer: int, op: str = "MUL_MAT") -> WeightInfo:
        """One weight of this model with its type (:meth:`tensor_type`); the architecture's record lists
        them (:meth:`toolkit.models.archs.Architecture.weights`). A NextN/MTP block's weight is
        ``skip`` (``TENSOR_SKIP``)."""
        return WeightInfo(name, ne, self.tensor_type(name, ne), layer, op, skip=self.is_nextn(layer))

    # ---- constructors ---------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HParams:
        """From the oracle's ``model`` dict (cases.json schema); ``n_head``, ``n_head_kv`` and ``n_ff``
        may be lists (one value per layer)."""
        try:
            n_embd = int(d["n_embd"])
            n_head = _ints(d["n_head"])
            head0 = n_embd // (n_head if isinstance(n_head, int) else n_head[0])
            head = d.get("n_embd_head")
            head_v = d.get("n_embd_head_v", head)
            rot = d.get("n_rot", d.get("rope_dims"))
            swa = d.get("swa") or {}
            hp = cls(
                n_layer=int(d["n_layer"]), n_embd=n_embd, n_head=n_head,
                n_head_kv=_ints(d.get("n_head_kv", n_head)), n_ff=_ints(d["n_ff"]),
                n_vocab=int(d.get("n_vocab", 32000)), n_ctx_train=int(d.get("n_ctx_train", 4096)),
                n_embd_head_k_=None if head is None or int(head) == head0 else int(head),
                n_embd_head_v_=None if head_v is None or int(head_v) == head0 else int(head_v),
                n_rot_=None if rot is None or head is None or int(rot) == int(head) else int(rot),
                rope_freq_base=float(d.get("rope_freq_base", 10000.0)), eps=float(d.get("eps", 1e-5)),
                tied=bool(d.get("tied", False)), dtype=GGMLType.parse(d.get("dtype", "f32")),
                tensor_types=dict(d.get("tensor_types") or {}), name=str(d.get("name", "llama")),
                arch=str(d.get("arch", "llama")),
                rope_freqs=tuple(float(x) for x in d["rope_freqs"])
                if d.get("has_rope_freqs") and d.get("rope_freqs") else None,
                swa=SWAParams.from_dict(swa) if swa else None,
                moe=moe_ffn.from_dict(d),
                # YaRN is a RoPE op parameter; Llama-3.x's "llama3" scaling is the rope_freqs tensor above
                rope_scaling=RopeScaling.from_dict(d["rope_scaling"])
                if (d.get("rope_scaling") or {}).get("type") == "yarn" else None,
                n_kv_shared=int(d.get("n_kv_shared", 0) or 0), n_embd_per_layer=int(d.get("n_embd_per_layer", 0) or 0),
                final_logit_softcapping=float(d.get("final_logit_softcapping", 0.0) or 0.0),
                attn_v_full=bool(d.get("attn_v_full", True)),
                recurrent=RecurrentParams.from_dict(d) if d.get("recurrent_layers") else None,
                rope_sections=tuple(int(x) for x in d["rope_sections"]) if d.get("rope_sections") else None,
                # print_info's n_layer_all (absent: no NextN/MTP blocks)
                n_layer_nextn=int(d.get("n_layer_all", d["n_layer"])) - int(d["n_layer"]),
                tensor_files={str(k): int(v) for k, v in (d.get("tensor_files") or {}).items()},
                weight_scales=[str(x) for x in d.get("weight_scales") or ()],
                mla=MLAParams.from_dict(d["mla"]) if d.get("mla") else None,
                qk_norm=bool(d.get("qk_norm", False)),
            )
        except KeyError as e:
            raise ToolkitError(f"model description lacks {e.args[0]!r}") from None
        return hp

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "arch": self.arch, "n_layer": self.n_layer, "n_embd": self.n_embd,
            "n_head": _as_list(self.n_head_arr), "n_head_kv": _as_list(self.n_head_kv_arr),
            "n_ff": _as_list(self.n_ff_arr), "n_vocab": self.n_vocab,
            "n_ctx_train": self.n_ctx_train, "n_embd_head": self.n_embd_head_k,
            **({"n_embd_head_v": self.n_embd_head_v} if self.n_embd_head_v != self.n_embd_head_k else {}),
            "n_rot": self.n_rot,
            "rope_freq_base": self.rope_freq_base, "eps": self.eps, "tied": self.tied,
            "dtype": self.dtype.lower, "tensor_types": {k: v.lower for k, v in self.tensor_types.items()},
            "has_rope_freqs": self.rope_freqs is not None, "rope_freqs": list(self.rope_freqs or ()),
            **({"swa": self.swa.to_dict()} if self.swa is not None else {}),
            **(self.moe.to_dict() if self.moe is not None else {}),
            **({"rope_scaling": self.rope_scaling.to_dict()} if self.rope_scaling is not None else {}),
            **({"n_kv_shared": self.n_kv_shared} if self.n_kv_shared else {}),
            **({"n_embd_per_layer": self.n_embd_per_layer} if self.n_embd_per_layer else {}),
            **({"final_logit_softcapping": self.final_logit_softcapping} if self.final_logit_softcapping else {}),
            **({} if self.attn_v_full else {"attn_v_full": False}),
            **(self.recurrent.to_dict() if self.recurrent is not None else {}),
            **({"rope_sections": list(self.rope_sections)} if self.rope_sections is not None else {}),
            **({"n_layer_all": self.n_layer_all} if self.n_layer_nextn else {}),
            **({"tensor_files": dict(self.tensor_files)} if self.tensor_files else {}),
            **({"weight_scales": sorted(self.weight_scales)} if self.weight_scales else {}),
            **({"mla": self.mla.to_dict()} if self.mla is not None else {}),
            **({"qk_norm": True} if self.qk_norm else {}),
        }


def _ints(v: Any) -> int | tuple[int, ...]:
    """A model dict's size: one integer, or a list of them (one per layer)."""
    return tuple(int(x) for x in v) if isinstance(v, list | tuple) else int(v)
