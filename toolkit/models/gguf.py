"""LlamaHParams from a GGUF file's metadata and tensor infos (no tensor data is read).

The ``gguf`` package is imported only when a file is read.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from toolkit.errors import UnsupportedFeature
from toolkit.ggml.types import GGMLType
from toolkit.models import moe
from toolkit.models.hparams import LlamaHParams


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
    arch = _field(reader, "general.architecture", "llama")
    if arch != "llama":
        raise UnsupportedFeature(f"architecture {arch}", f"{path}: architecture {arch!r} is not implemented (llama is)")

    def k(name: str, default: Any = None) -> Any:
        return _field(reader, f"llama.{name}", default)

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
        moe=moe.from_gguf(lambda key: _field(reader, key), "llama", list(types)),
    )
