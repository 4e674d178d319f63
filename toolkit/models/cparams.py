"""Context parameters as llama.cpp takes them (``llama_context_params`` + common's CLI flags).

:class:`ContextParams` holds what the user asked for; :meth:`ContextParams.resolve` turns it
into what ``llama_context`` prints (n_ctx padded, n_batch clamped to n_ctx, n_ubatch clamped
to n_batch, n_ctx_seq per stream), raising :class:`toolkit.errors.ParameterError` that names the bad value and the
limit for input llama.cpp would refuse.

>>> cp = ContextParams(n_ctx=1000, n_batch=2048, n_ubatch=512).resolve(n_ctx_train=4096)
>>> cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_ctx_seq
(1024, 1024, 512, 1024)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from toolkit import validate
from toolkit.errors import ParameterError
from toolkit.ggml.types import GGMLType
from toolkit.models import overrides

FlashAttn = Literal["on", "off", "auto"]
SplitMode = Literal["none", "layer", "row"]

N_CTX_PAD = 256          # llama_context pads n_ctx up to a multiple of 256
DEFAULT_N_GPU_LAYERS = 999  # more than any n_layer: every layer, the output layer included
LLAMA_MAX_SEQ = 256        # llama-cparams.h: the most sequences a context can hold


@dataclass(frozen=True)
class ContextParams:
    """What a llama.cpp user sets (``-c -b -ub -np -fa -ctk -ctv -kvu -nkvo --no-op-offload -ngl -sm -ts``).

    ``devices`` names the model devices in order (the CPU is always added last):
    ``"rpc:HOST:PORT"`` (an RPC server), ``"rpc:N"`` (N servers on 127.0.0.1:50052…),
    ``"cuda"``/``"cuda:BUDGET"``, ``"sim"``/``"sim:BUDGET"`` (simulated accelerators,
    BUDGET a byte count such as ``64M`` capping their compute buffers), ``"metal"``,
    ``"blas"`` (an ACCEL device). ``force_pipeline_parallel`` is the oracle's
    ``ORACLE_FORCE_PP``: it skips only the async/events capability check of the ``llama_context``
    constructor's pipeline-parallelism condition.
    """

    n_ctx: int = 4096
    n_batch: int = 2048
    n_ubatch: int = 512
    n_seq_max: int = 1
    flash_attn: FlashAttn = "auto"
    type_k: str = "f16"
    type_v: str = "f16"
    kv_unified: bool = False
    offload_kqv: bool = True
    op_offload: bool = True
    n_gpu_layers: int = DEFAULT_N_GPU_LAYERS
    split_mode: SplitMode = "layer"
    main_gpu: int = 0
    tensor_split: tuple[float, ...] | None = None
    devices: tuple[str, ...] = ()
    use_mmap: bool = True
    n_outputs_max: int | None = None       # None: n_batch (llama.cpp's default)
    force_pipeline_parallel: bool = False
    override_tensor: tuple[str, ...] = ()  # -ot items, "REGEX=BUFT" (toolkit.models.overrides)
    cpu_moe: bool = False                  # --cpu-moe
    n_cpu_moe: int = 0                     # --n-cpu-moe N
    swa_full: bool = False                 # --swa-full: the SWA cache of an iSWA model gets n_ctx_seq cells

    def __post_init__(self) -> None:
        # llama_context_params holds these as uint32_t; llama_context's constructor refuses
        # n_seq_max > LLAMA_MAX_SEQ ("n_seq_max must be <= 256")
        for f in ("n_ctx", "n_batch", "n_ubatch"):
            validate.integer(f, getattr(self, f), lo=0, hi=validate.UINT32_MAX)
        validate.integer("n_seq_max", self.n_seq_max, lo=1, hi=LLAMA_MAX_SEQ)
        validate.choice("flash_attn", self.flash_attn, ("on", "off", "auto"))
        validate.choice("split_mode", self.split_mode, ("none", "layer", "row"))
        validate.integer("n_gpu_layers", self.n_gpu_layers, lo=0, hi=validate.INT32_MAX)
        validate.integer("main_gpu", self.main_gpu, lo=0, hi=validate.INT32_MAX)
        for f in ("type_k", "type_v"):
            v = getattr(self, f)
            if isinstance(v, GGMLType):
                continue
            validate.text(f, v)
            try:
                GGMLType.parse(v)
            except (KeyError, ValueError):
                raise ParameterError(f, v, "a ggml type name such as f16, bf16, f32, q8_0, q4_0") from None
        for f in ("kv_unified", "offload_kqv", "op_offload", "use_mmap", "force_pipeline_parallel", "swa_full"):
            object.__setattr__(self, f, validate.boolean(f, getattr(self, f)))
        if self.tensor_split is not None:
            object.__setattr__(self, "tensor_split", validate.reals("tensor_split", self.tensor_split, lo=0.0))
        object.__setattr__(self, "devices", validate.strings("devices", self.devices))
        validate.optional_integer("n_outputs_max", self.n_outputs_max, lo=1, hi=validate.UINT32_MAX,
                                  none_means="n_batch")
        if isinstance(self.override_tensor, str):
            object.__setattr__(self, "override_tensor", (self.override_tensor,))
        object.__setattr__(self, "override_tensor", validate.strings("override_tensor", self.override_tensor))
        overrides.check_items(self.override_tensor)  # the buffer type names are checked against the devices
        object.__setattr__(self, "cpu_moe", validate.boolean("cpu_moe", self.cpu_moe))
        validate.integer("n_cpu_moe", self.n_cpu_moe, lo=0, hi=validate.INT32_MAX)

    def replace(self, **changes: Any) -> ContextParams:
        unknown = set(changes) - set(self.__dataclass_fields__)
        if unknown:
            known = sorted(self.__dataclass_fields__)
            raise ParameterError(", ".join(sorted(unknown)), changes[sorted(unknown)[0]],
                                 f"a known context parameter name ({', '.join(known)})", "unknown parameter")
        return replace(self, **changes)

    def resolve(self, n_ctx_train: int, *, causal_attn: bool = True) -> ResolvedParams:
        """What llama_context computes from these params (the values its constructor logs)."""
        n_ctx = self.n_ctx if self.n_ctx > 0 else n_ctx_train
        n_ctx = -(-n_ctx // N_CTX_PAD) * N_CTX_PAD
        if self.n_ubatch > self.n_batch and self.n_batch > 0 and self.n_ubatch > 0:
            raise ParameterError("n_ubatch", self.n_ubatch, f"at most n_batch={self.n_batch}")
        n_batch = self.n_batch if self.n_batch > 0 else n_ctx
        n_batch = min(n_ctx, n_batch) if causal_attn else n_batch
        n_ubatch = min(n_batch, self.n_ubatch if self.n_ubatch > 0 else n_batch)
        if self.kv_unified:
            n_ctx_seq = n_ctx
        else:
            n_ctx_seq = n_ctx // self.n_seq_max
            if n_ctx_seq == 0:
                raise ParameterError("n_ctx", n_ctx, f"at least n_seq_max={self.n_seq_max}", "n_ctx_seq would be 0")
            # llama_context: n_ctx_seq = GGML_PAD(n_ctx / n_seq_max, 256), n_ctx = n_ctx_seq * n_seq_max
            # ("n_ctx is not divisible by n_seq_max - rounding down", which may round up)
            n_ctx_seq = -(-n_ctx_seq // N_CTX_PAD) * N_CTX_PAD
            n_ctx = n_ctx_seq * self.n_seq_max
        n_outputs_max = self.n_outputs_max if self.n_outputs_max is not None else n_batch
        return ResolvedParams(
            n_ctx=n_ctx, n_ctx_seq=n_ctx_seq, n_batch=n_batch, n_ubatch=n_ubatch, n_seq_max=self.n_seq_max,
            n_stream=1 if self.kv_unified else self.n_seq_max, n_outputs_max=n_outputs_max,
            type_k=GGMLType.parse(self.type_k), type_v=GGMLType.parse(self.type_v), source=self,
        )

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["tensor_split"] = list(self.tensor_split) if self.tensor_split else None
        out["devices"] = list(self.devices)
        out["override_tensor"] = list(self.override_tensor)
        return out


@dataclass(frozen=True)
class ResolvedParams:
    """The effective values ``llama_context`` prints (``effective_from_log`` in the oracle)."""

    n_ctx: int
    n_ctx_seq: int
    n_batch: int
    n_ubatch: int
    n_seq_max: int
    n_stream: int
    n_outputs_max: int
    type_k: GGMLType
    type_v: GGMLType
    source: ContextParams = field(repr=False)
    n_outputs_max_per_seq: int = 1

    @property
    def kv_size(self) -> int:
        """Cells per KV stream."""
        return self.n_ctx_seq
