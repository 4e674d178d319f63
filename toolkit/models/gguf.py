"""LlamaHParams from a GGUF file's metadata and tensor infos (no tensor data is read).

The ``gguf`` package is imported only when a file is read.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from toolkit.errors import UnsupportedFeature
from toolkit.ggml.types import GGMLType
from toolkit.models.hparams import LlamaHParams, check_arch


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return default
    if len(f.data) == 1:
        v = f.parts[f.data[0]]
        return v.tobytes().decode() if v.dtype.kind == "u" and v.dtype.itemsize == 1 else v.tolist()[0]
    return len(f.data)  # an array (the vocabulary): its length


def hparams_from_gguf(path: str | Path) -> LlamaHParams:
    """Read a llama GGUF's hyperparameters and weight types (2-D majority type, per-suffix overrides)."""
    import gguf  # noqa: PLC0415 - optional at import time

    reader = gguf.GGUFReader(str(path))
    arch = check_arch(str(_field(reader, "general.architecture", "llama")))

    def k(name: str, default: Any = None) -> Any:
        return _field(reader, f"{arch}.{name}", default)

    types = {t.name: GGMLType.parse(t.tensor_type.name) for t in reader.tensors}
    mats = Counter(t for n, t in types.items() if n.startswith("blk.") and not n.endswith("norm.weight"))
    dtype = mats.most_common(1)[0][0] if mats else GGMLType.F32
    overrides: dict[str, GGMLType] = {}
    for name, t in types.items():
        suffix = name.split(".", 2)[-1] if name.startswith("blk.") else name
        if t is not dtype and not name.endswith("norm.weight"):
            overrides[suffix] = t
    n_embd, n_head = int(k("embedding_length")), int(k("attention.head_count"))
    vocab = k("vocab_size") or _field(reader, "tokenizer.ggml.tokens", 32000)
    rot = k("rope.dimension_count")
    return LlamaHParams(
        n_layer=int(k("block_count")), n_embd=n_embd, n_head=n_head,
        n_head_kv=int(k("attention.head_count_kv", n_head)), n_ff=int(k("feed_forward_length")),
        n_vocab=int(vocab), n_ctx_train=int(k("context_length", 4096)),
        n_rot_=None if rot is None or int(rot) == n_embd // n_head else int(rot),
        rope_freq_base=float(k("rope.freq_base", 10000.0)),
        eps=float(f'{k("attention.layer_norm_rms_epsilon", 1e-5):.6g}'),
        tied="output.weight" not in types, dtype=dtype, tensor_types=overrides,
        name=str(_field(reader, "general.name", Path(path).stem)),
        **arch_hparams(reader, arch),
    )


def arch_hparams(reader: Any, arch: str) -> dict[str, Any]:
    """The architecture keys of a GGUF (``llama_model::load_hparams``): the head size
    (``attention.key_length``), Llama-3.x's ``rope_freqs.weight`` factors, and gemma3's sliding
    window (``attention.sliding_window``, ``attention.sliding_window_pattern`` default 6,
    ``rope.freq_base_swa`` default 10000)."""
    import numpy as np

    def k(name: str, default: Any = None) -> Any:
        return _field(reader, f"{arch}.{name}", default)

    out: dict[str, Any] = {"arch": arch}
    head, n_embd, n_head = k("attention.key_length"), int(k("embedding_length")), int(k("attention.head_count"))
    if head is not None and int(head) != n_embd // n_head:
        out["n_embd_head_"] = int(head)
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            out["rope_freqs"] = tuple(float(x) for x in np.asarray(t.data, dtype=np.float32).ravel())
    if arch == "gemma3":
        n_swa = k("attention.sliding_window")
        if n_swa:
            pattern = reader.fields.get(f"{arch}.attention.sliding_window_pattern")
            if pattern is not None and len(pattern.data) != 1:
                raise UnsupportedFeature("sliding_window_pattern",
                                         f"{arch}.attention.sliding_window_pattern is a per-layer array; only a period "
                                         "is supported")
            out["n_swa"] = int(n_swa)
            out["swa_pattern"] = int(k("attention.sliding_window_pattern", 6))
            out["rope_freq_base_swa"] = float(k("rope.freq_base_swa", 10000.0))
    return out
