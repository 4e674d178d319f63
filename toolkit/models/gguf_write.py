"""Writing GGUF files of the registered architectures: the metadata keys, and sparse files for planning.

:func:`add_model_keys` writes what ``llama_model::load_hparams`` and the vocabulary loader read (the
common keys, per-layer sizes as arrays, the architecture's own ``Architecture.gguf_keys`` and a
tokenizer) into a ``gguf.GGUFWriter``; :func:`toolkit.jaxrt.gguf_io.write_gguf` writes weights after
them, :func:`write_sparse_gguf` none.

A sparse file has the header, the keys and every tensor info of a real-size model, and its data
section is a hole (the file is extended with ``truncate``): it reads as zeros and takes a few MB of
disk, even for a model of hundreds of GB. Planning and memory fitting read only the metadata
(``llama-fit-params`` loads the model without allocating, ``LLAMA_LOAD_MODE_NONE``), so such a file
plans as the real one does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.errors import ParameterError
from toolkit.models import archs
from toolkit.models.hparams import HParams


def add_model_keys(w: Any, hp: HParams, vocab: Mapping[str, Any] | None = None) -> None:
    """The metadata of ``hp`` into ``w`` (a ``gguf.GGUFWriter`` made for ``hp``'s architecture).

    ``vocab``: a real SPM vocabulary instead of the minimal one (``<t0>``, ``<t1>``, …),
    ``{"tokens": [...], "scores": [...], "token_types": [...]}`` with ``hp.n_vocab`` entries
    (``tokenizer.ggml.*``; BOS 1, EOS 2)."""
    arch = archs.get(hp.arch)
    w.add_name(hp.name)
    w.add_block_count(hp.n_layer_all)   # the NextN/MTP blocks included (Architecture.gguf_keys: nextn_predict_layers)
    w.add_context_length(hp.n_ctx_train)
    w.add_embedding_length(hp.n_embd)
    w.add_feed_forward_length(_per_layer(hp.n_ff_arr))
    w.add_head_count(_per_layer(hp.n_head_arr))
    w.add_head_count_kv(_per_layer(hp.n_head_kv_arr))
    if hp.n_embd_head_k_ is not None:
        w.add_key_length(hp.n_embd_head_k)
    if hp.n_embd_head_v_ is not None:
        w.add_value_length(hp.n_embd_head_v)
    w.add_rope_dimension_count(hp.n_rot)
    w.add_layer_norm_rms_eps(hp.eps)
    w.add_rope_freq_base(hp.rope_freq_base)
    w.add_vocab_size(hp.n_vocab)
    if hp.moe is not None:
        w.add_expert_count(hp.moe.n_expert)
        w.add_expert_used_count(hp.moe.n_expert_used)
        if hp.moe.n_ff_exp:
            w.add_expert_feed_forward_length(hp.moe.n_ff_exp)
    for key, value in arch.gguf_keys(hp).items():
        _add_key(w, f"{arch.name}.{key}", value)
    w.add_tokenizer_model("llama")
    if vocab is None:
        w.add_token_list([f"<t{i}>".encode() for i in range(hp.n_vocab)])
        w.add_token_scores([0.0] * hp.n_vocab)
        w.add_token_types([1] * hp.n_vocab)
    else:
        if len(vocab["tokens"]) != hp.n_vocab:
            raise ParameterError("vocab", len(vocab["tokens"]), f"{hp.n_vocab} tokens (hp.n_vocab)")
        w.add_token_list([t.encode() for t in vocab["tokens"]])
        w.add_token_scores([float(x) for x in vocab["scores"]])
        w.add_token_types([int(x) for x in vocab["token_types"]])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)


@dataclass(frozen=True)
class SparseFile:
    """What :func:`write_sparse_gguf` wrote: the path, the tensor count, where the data section starts
    (the header, keys and tensor infos end before it) and the file's apparent size."""

    path: Path
    n_tensors: int
    data_offset: int
    file_size: int


def write_sparse_gguf(path: str | Path, hp: HParams, vocab: Mapping[str, Any] | None = None) -> SparseFile:
    """A GGUF of ``hp`` with every tensor info (name, ne, type, offset) and no tensor data: the data
    section is a hole of the size the tensors take (each padded to ``general.alignment``, as
    ``gguf.GGUFWriter.write_tensors_to_file`` pads them), so the file's size is the real model's.

    >>> import tempfile
    >>> from toolkit.models import presets
    >>> from toolkit.models.gguf import hparams_from_gguf
    >>> with tempfile.TemporaryDirectory() as d:
    ...     f = write_sparse_gguf(Path(d) / "m.gguf", presets.llama3_8b("q8_0"))
    ...     hp = hparams_from_gguf(f.path)
    >>> f.n_tensors, f.file_size > 8 * 10**9, hp.n_layer, hp.dtype.lower
    (291, True, 32, 'q8_0')
    """
    from gguf import GGMLQuantizationType, GGUFWriter

    path = Path(path)
    arch = archs.get(hp.arch)
    w = GGUFWriter(str(path), arch.name)
    add_model_keys(w, hp, vocab)
    known = {q.value for q in GGMLQuantizationType}
    infos = arch.weights(hp)
    for info in infos:
        # the element shape in numpy order with the type given: GGUFWriter writes ne and the type as given
        qt: Any = GGMLQuantizationType(info.type.ggml_id) if info.type.ggml_id in known else info.type.ggml_id
        w.add_tensor_info(info.name, tuple(reversed(info.ne)), np.dtype(np.float32), info.nbytes, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    align = w.data_alignment
    w.close()
    data_offset = _pad(path.stat().st_size, align)
    size = data_offset + sum(_pad(info.nbytes, align) for info in infos)
    os.truncate(path, size)
    return SparseFile(path, len(infos), data_offset, size)


def _pad(n: int, align: int) -> int:
    return -(-n // align) * align


def _per_layer(v: int | tuple[int, ...]) -> int | list[int]:
    return v if isinstance(v, int) else list(v)


def _add_key(w: Any, key: str, value: Any) -> None:
    """One architecture key, typed as llama.cpp reads it: bool, uint32, float32, a string (``rope.scaling.type``)
    or an array of them."""
    if isinstance(value, str):
        w.add_string(key, value)
    elif isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, list | tuple):
        w.add_array(key, list(value))
    else:
        raise TypeError(f"GGUF key {key}: {value!r} is not a str, bool, int, float or list")


__all__ = ["SparseFile", "add_model_keys", "write_sparse_gguf"]
