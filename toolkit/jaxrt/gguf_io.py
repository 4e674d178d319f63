"""GGUF files of the registered architectures: read hyperparameters and weights, write small random ones.

Reading uses the toolkit's one GGUF reader (:func:`toolkit.models.gguf_file.open_gguf`, memory-mapped;
a split model's first shard brings every shard, and each weight is a view of its own shard)
and the hyperparameters planning reads (:func:`toolkit.models.gguf.hparams_from_gguf`). A weight's
data stays in its file layout (f32/f16 values, bf16 bits, quantized blocks as bytes), which is
ggml's memory image, so it goes to its device unchanged and quantized weights are dequantized
inside the kernels. Writing uses ``gguf.GGUFWriter``; ``gguf.quants`` is the independent reference
for the block formats the JAX kernels decode.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import jax.numpy as jnp
import numpy as np

from toolkit.errors import UnsupportedFeature
from toolkit.ggml.types import GGMLType
from toolkit.jaxrt.quant import DEQUANT, dequantize
from toolkit.models import archs
from toolkit.models.gguf import hparams_from_gguf
from toolkit.models.gguf_file import GGUFFile, open_gguf
from toolkit.models.gguf_write import add_model_keys
from toolkit.models.hparams import HParams

# the float types, and every quantized type the runtime dequantizes (toolkit.jaxrt.quant.DEQUANT)
SUPPORTED = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, *DEQUANT)


@dataclass
class GGUFTensor:
    name: str
    type: GGMLType
    ne: tuple[int, ...]
    data: np.ndarray            # file layout: values for f32/f16, raw bytes for bf16 and quantized types


@dataclass
class GGUFModel:
    path: str
    hparams: HParams
    tensors: dict[str, GGUFTensor] = field(default_factory=dict)
    file: GGUFFile | None = None    # the parsed file: metadata through file.get(key), tensor infos


def _check_type(path: str, name: str, t: GGMLType) -> GGMLType:
    if t not in SUPPORTED:
        names = ", ".join(s.name for s in SUPPORTED)
        raise UnsupportedFeature(f"tensor type {t.name}",
                                 f"{path}: {name} is {t.name}, which the runtime does not run (supported: {names})")
    return t


def read_gguf(path: str | Path | GGUFFile, *, with_tensors: bool = True) -> GGUFModel:
    """Hyperparameters (and weights, as views of the mapped file) of a GGUF, parsed once.

    Errors are typed: GGUFError for a file that cannot be read, UnsupportedFeature for an
    architecture or a weight type the runtime does not run.
    """
    f = path if isinstance(path, GGUFFile) else open_gguf(path)
    hp = hparams_from_gguf(f)
    tensors: dict[str, GGUFTensor] = {}
    if with_tensors:
        for name, info in f.tensors.items():
            tensors[name] = GGUFTensor(name, _check_type(f.path, name, info.type), info.ne, f.tensor_data(name))
    return GGUFModel(f.path, hp, tensors, f)


def random_weights(hp: HParams, seed: int = 0, scale: float = 0.1) -> dict[str, np.ndarray]:
    """Random f32 values for every weight of hp (numpy order: ne reversed); norms near 1. ``rope_freqs.weight``
    holds hp's own ``rope_freqs`` factors when hp has them (they are a hyperparameter the file carries as a
    weight, and a reader gets them back from it)."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for w in archs.get(hp.arch).weights(hp):
        shape = tuple(reversed(w.ne))
        if len(w.ne) == 1:
            out[w.name] = (1.0 + scale * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[w.name] = (scale * rng.standard_normal(shape)).astype(np.float32)
        if w.name == "rope_freqs.weight" and hp.rope_freqs is not None:
            out[w.name] = np.asarray(hp.rope_freqs, np.float32).reshape(shape)
    return out


def _gguf_knows(type_: GGMLType) -> bool:
    """Whether the ``gguf`` package has ``type_`` (its GGMLQuantizationType and block sizes); newer ggml
    types (Q2_0) it may not."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    return any(q.value == type_.ggml_id for q in GGMLQuantizationType) and \
        GGMLQuantizationType(type_.ggml_id) in GGML_QUANT_SIZES


def encode(values: np.ndarray, type_: GGMLType) -> tuple[np.ndarray, Any]:
    """f32 values -> (array to write, GGML quantization type) in the file layout. uint8 values of a
    quantized type are taken as its blocks already (rows of ``type_.row_size(ne0)`` bytes): the way to
    write a type ``gguf.quants`` can dequantize but not quantize (the K-quants, the IQ types, NVFP4), or
    one it does not know (Q1_0, Q2_0: the type is then its ggml id)."""
    from gguf import GGMLQuantizationType, quants

    if type_.is_quantized and values.dtype == np.uint8:
        return values, (GGMLQuantizationType(type_.ggml_id) if _gguf_knows(type_) else type_.ggml_id)
    qt = GGMLQuantizationType(type_.ggml_id)
    if type_ is GGMLType.F32:
        return values.astype(np.float32), qt
    if type_ is GGMLType.F16:
        return values.astype(np.float16), qt
    return quants.quantize(values.astype(np.float32), qt), qt


def decode_values(data: np.ndarray, type_: GGMLType, ne: tuple[int, ...]) -> np.ndarray:
    """File layout -> f32 values in numpy order (the dequantization ggml defines, via gguf.quants; for the
    types gguf.quants does not dequantize, Q1_0 and Q2_0, via this runtime's own kernels)."""
    from gguf import GGMLQuantizationType, quants

    if type_ in (GGMLType.F32, GGMLType.F16):
        return np.asarray(data, np.float32).reshape(tuple(reversed(ne)))
    if type_ in (GGMLType.Q1_0, GGMLType.Q2_0):
        raw = np.asarray(data).view(np.uint8).reshape(-1, type_.row_size(ne[0]))
        return np.asarray(dequantize(jnp.asarray(raw), type_), np.float32).reshape(tuple(reversed(ne)))
    deq = quants.dequantize(np.asarray(data).view(np.uint8), GGMLQuantizationType(type_.ggml_id))
    return np.asarray(deq, np.float32).reshape(tuple(reversed(ne)))


def write_gguf(path: str | Path, hp: HParams, values: Mapping[str, np.ndarray] | None = None,
               seed: int = 0, vocab: Mapping[str, Any] | None = None,
               split_max_tensors: int = 0) -> dict[str, np.ndarray]:
    """Write a GGUF of ``hp``'s architecture with hp's shapes and types (random weights unless given; a
    quantized weight may be given as its blocks, see :func:`encode`), a minimal tokenizer, and return the
    f32 values the file holds *after* quantization (what ggml computes with). The keys are
    :func:`toolkit.models.gguf_write.add_model_keys`' (the common ones, per-layer sizes as arrays, and
    the architecture's ``Architecture.gguf_keys``).

    ``vocab``: a real SPM vocabulary instead of the minimal one, ``{"tokens": [...], "scores": [...],
    "token_types": [...]}`` with ``hp.n_vocab`` entries (``tokenizer.ggml.*``; BOS 1, EOS 2).

    ``split_max_tensors`` > 0 writes a split model: shards of at most that many tensors, named
    ``STEM-00001-of-0000N.gguf`` beside ``path``, the metadata in the first and the ``split.*`` keys
    in each (``gguf.GGUFWriter``'s splitting, the layout ``llama-gguf-split --split-max-tensors`` writes)."""
    from gguf import GGUFWriter

    vals = dict(values) if values is not None else random_weights(hp, seed)
    arch = archs.get(hp.arch)
    w = GGUFWriter(str(path), arch.name, split_max_tensors=split_max_tensors)
    add_model_keys(w, hp, vocab)
    stored: dict[str, np.ndarray] = {}
    for info in arch.weights(hp):
        arr, qt = encode(vals[info.name], info.type)
        if isinstance(qt, int) and not _gguf_knows(info.type):
            # a type gguf-py has no sizes for: the bytes as int8 with the element shape (numpy order), so
            # that GGUFWriter writes the id and ne as given instead of deriving ne from the byte shape
            w.add_tensor(info.name, arr.view(np.int8), raw_shape=tuple(reversed(info.ne)),
                         raw_dtype=cast(Any, qt))
        else:
            w.add_tensor(info.name, arr, raw_dtype=qt)
        stored[info.name] = decode_values(arr, info.type, info.ne)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return stored


