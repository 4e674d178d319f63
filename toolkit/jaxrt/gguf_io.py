"""Llama-architecture GGUF files: read hyperparameters and weights, write small random ones.

Reading uses ``gguf.GGUFReader`` (memory-mapped); a weight's data stays in its file layout
(f32/f16 values, bf16 bits, Q8_0/Q4_0 blocks as bytes), which is ggml's memory image, so
it goes to its device unchanged and quantized weights are dequantized inside the kernels.
The functions here use numpy and the ``gguf`` package only (``gguf.quants`` is the independent
reference for the block formats the JAX kernels decode).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.errors import UnsupportedFeature
from toolkit.ggml.types import GGMLType
from toolkit.models import moe
from toolkit.models.hparams import LlamaHParams

SUPPORTED = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q4_0)


@dataclass
class GGUFTensor:
    name: str
    type: GGMLType
    ne: tuple[int, ...]
    data: np.ndarray            # file layout: values for f32/f16, raw bytes for bf16 and quantized types


@dataclass
class GGUFModel:
    path: str
    hparams: LlamaHParams
    tensors: dict[str, GGUFTensor] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)


def _ggml_type(qt: Any) -> GGMLType:
    for t in GGMLType:
        if t.ggml_id == int(qt):
            if t not in SUPPORTED:
                break
            return t
    names = ", ".join(t.name for t in SUPPORTED)
    raise ValueError(f"GGUF tensor type {getattr(qt, 'name', qt)} is not supported (supported: {names})")


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.get_field(key)
    if f is None:
        return default
    return f.contents()


def read_gguf(path: str | Path, *, with_tensors: bool = True) -> GGUFModel:
    """Hyperparameters (and weights) of a llama GGUF; errors name the missing key or bad type."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise UnsupportedFeature(f"architecture {arch}", f"{path}: architecture {arch!r} is not implemented (llama is)")

    def req(key: str) -> Any:
        v = _field(reader, f"llama.{key}")
        if v is None:
            raise ValueError(f"{path}: GGUF key 'llama.{key}' is missing")
        return v

    n_embd, n_head = int(req("embedding_length")), int(req("attention.head_count"))
    tensors: dict[str, GGUFTensor] = {}
    for rt in reader.tensors:
        ne = tuple(int(x) for x in rt.shape)
        tensors[rt.name] = GGUFTensor(rt.name, _ggml_type(rt.tensor_type), ne, np.asarray(rt.data))
    emb = tensors.get("token_embd.weight")
    n_vocab = _field(reader, "llama.vocab_size") or (emb.ne[1] if emb else None)
    if n_vocab is None:
        tok = _field(reader, "tokenizer.ggml.tokens")
        n_vocab = len(tok) if tok is not None else 32000
    mat = [t for n, t in tensors.items() if n.endswith("attn_q.weight")]
    dtype = mat[0].type if mat else GGMLType.F32
    overrides = {}
    for n, t in tensors.items():
        if len(t.ne) >= 2 and t.type is not dtype and n != "token_embd.weight":
            overrides[n.split(".", 2)[-1] if n.startswith("blk.") else n] = t.type
    if emb is not None and emb.type is not dtype:
        overrides["token_embd.weight"] = emb.type
    rot = _field(reader, "llama.rope.dimension_count")
    hp = LlamaHParams(
        n_layer=int(req("block_count")), n_embd=n_embd, n_head=n_head,
        n_head_kv=int(_field(reader, "llama.attention.head_count_kv", n_head)),
        n_ff=int(req("feed_forward_length")), n_vocab=int(n_vocab),
        n_ctx_train=int(_field(reader, "llama.context_length", 4096)),
        n_rot_=None if rot is None or int(rot) == n_embd // n_head else int(rot),
        rope_freq_base=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        tied="output.weight" not in tensors, dtype=dtype, tensor_types=overrides,
        name=str(_field(reader, "general.name", Path(path).stem)),
        moe=moe.from_gguf(lambda key: _field(reader, key), "llama", list(tensors)),
    )
    meta = {k: None for k in reader.fields}
    return GGUFModel(str(path), hp, tensors if with_tensors else {}, meta)


def random_weights(hp: LlamaHParams, seed: int = 0, scale: float = 0.1) -> dict[str, np.ndarray]:
    """Random f32 values for every weight of hp (numpy order: ne reversed); norms near 1."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for w in hp.weights():
        shape = tuple(reversed(w.ne))
        if len(w.ne) == 1:
            out[w.name] = (1.0 + scale * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[w.name] = (scale * rng.standard_normal(shape)).astype(np.float32)
    return out


def encode(values: np.ndarray, type_: GGMLType) -> tuple[np.ndarray, Any]:
    """f32 values -> (array to write, GGML quantization type) in the file layout."""
    from gguf import GGMLQuantizationType, quants

    qt = GGMLQuantizationType(type_.ggml_id)
    if type_ is GGMLType.F32:
        return values.astype(np.float32), qt
    if type_ is GGMLType.F16:
        return values.astype(np.float16), qt
    return quants.quantize(values.astype(np.float32), qt), qt


def decode_values(data: np.ndarray, type_: GGMLType, ne: tuple[int, ...]) -> np.ndarray:
    """File layout -> f32 values in numpy order (the dequantization ggml defines, via gguf.quants)."""
    from gguf import GGMLQuantizationType, quants

    if type_ in (GGMLType.F32, GGMLType.F16):
        return np.asarray(data, np.float32).reshape(tuple(reversed(ne)))
    deq = quants.dequantize(np.asarray(data).view(np.uint8), GGMLQuantizationType(type_.ggml_id))
    return np.asarray(deq, np.float32).reshape(tuple(reversed(ne)))


def write_gguf(path: str | Path, hp: LlamaHParams, values: Mapping[str, np.ndarray] | None = None,
               seed: int = 0) -> dict[str, np.ndarray]:
    """Write a llama GGUF with hp's shapes and types (random weights unless given), a minimal
    tokenizer, and return the f32 values the file holds *after* quantization (what ggml computes with)."""
    from gguf import GGUFWriter

    vals = dict(values) if values is not None else random_weights(hp, seed)
    w = GGUFWriter(str(path), "llama")
    w.add_name(hp.name)
    w.add_block_count(hp.n_layer)
    w.add_context_length(hp.n_ctx_train)
    w.add_embedding_length(hp.n_embd)
    w.add_feed_forward_length(hp.n_ff)
    w.add_head_count(hp.n_head)
    w.add_head_count_kv(hp.n_head_kv)
    w.add_rope_dimension_count(hp.n_rot)
    w.add_layer_norm_rms_eps(hp.eps)
    w.add_rope_freq_base(hp.rope_freq_base)
    w.add_vocab_size(hp.n_vocab)
    if hp.moe is not None:
        w.add_expert_count(hp.moe.n_expert)
        w.add_expert_used_count(hp.moe.n_expert_used)
        if hp.moe.n_ff_exp:
            w.add_expert_feed_forward_length(hp.moe.n_ff_exp)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<t{i}>".encode() for i in range(hp.n_vocab)])
    w.add_token_scores([0.0] * hp.n_vocab)
    w.add_token_types([1] * hp.n_vocab)
    stored: dict[str, np.ndarray] = {}
    for info in hp.weights():
        arr, qt = encode(vals[info.name], info.type)
        w.add_tensor(info.name, arr, raw_dtype=qt)
        stored[info.name] = decode_values(arr, info.type, info.ne)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return stored
