"""Model hyperparameters from a GGUF file's metadata and tensor infos (no tensor data is read).

One reader (:mod:`toolkit.models.gguf_file`) serves planning (``Context("x.gguf")``) and the
runtime (``toolkit.jaxrt.gguf_io.read_gguf``), so both get the same hyperparameters.

``ARCHITECTURES`` maps ``general.architecture`` to the function that reads that architecture's
hyperparameters, as ``llm_load_hparams`` switches on ``LLM_ARCH_*``; adding an architecture is
adding an entry. Such a function reads its keys through the file's accessors
(``f.get_int(f.arch_key("attention.sliding_window"))`` and so on), which raise a typed error
for a key of the wrong type.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.errors import GGUFError, UnsupportedFeature
from toolkit.ggml.types import GGMLType
from toolkit.models import moe
from toolkit.models.gguf_file import GGUFFile, open_gguf
from toolkit.models.hparams import SUPPORTED_ARCHS, LlamaHParams


def weight_types(f: GGUFFile) -> tuple[GGMLType, dict[str, GGMLType]]:
    """The type of the 2-D weights (the majority type of the ``blk.*`` matrices) and per-suffix
    overrides for every other weight whose type differs (norms are F32 in every llama.cpp model)."""
    types = {t.name: t.type for t in f.tensors.values()}
    mats = Counter(t for n, t in types.items() if n.startswith("blk.") and not n.endswith("norm.weight"))
    dtype = mats.most_common(1)[0][0] if mats else GGMLType.F32
    overrides: dict[str, GGMLType] = {}
    for name, t in types.items():
        suffix = name.split(".", 2)[-1] if name.startswith("blk.") else name
        if t is not dtype and not name.endswith("norm.weight"):
            overrides[suffix] = t
    return dtype, overrides


def n_vocab(f: GGUFFile) -> int:
    """``{arch}.vocab_size``, else the tokenizer's token count, else token_embd's ne[1] (llama_model_loader)."""
    v = f.get_int(f.arch_key("vocab_size"))
    if v is None:
        tokens = f.get_array("tokenizer.ggml.tokens")
        v = len(tokens) if tokens is not None else None
    if v is None and "token_embd.weight" in f.tensors and len(f.tensors["token_embd.weight"].ne) >= 2:
        v = f.tensors["token_embd.weight"].ne[1]
    if v is None:
        raise GGUFError(f.path, "no vocabulary size: neither this key, tokenizer.ggml.tokens nor "
                        "token_embd.weight is present", None, f.arch_key("vocab_size"))
    return v


def check_shapes(f: GGUFFile, weights: Any) -> None:
    """Every weight the graph needs is in the file with the shape it expects (llama.cpp's
    ``create_tensor`` check: "tensor has wrong shape" / "missing tensor")."""
    for w in weights:
        t = f.tensors.get(w.name)
        if t is None:
            raise GGUFError(f.path, "missing tensor", None, w.name)
        if t.ne != tuple(w.ne):
            raise GGUFError(f.path, f"tensor has wrong shape; expected {list(w.ne)}, got {list(t.ne)}",
                            t.info_offset, w.name)


def llama_hparams(f: GGUFFile) -> LlamaHParams:
    """``LLM_ARCH_LLAMA``: the keys ``llm_load_hparams`` reads, and the weight types."""

    def req(name: str) -> int:
        return f.require_int(f.arch_key(name))

    n_embd, n_head = req("embedding_length"), req("attention.head_count")
    n_layer = req("block_count")
    if n_layer > len(f.tensors):  # each block has its own weights; refuse before listing them
        key = f.arch_key("block_count")
        raise GGUFError(f.path, f"{n_layer} blocks, but the file has {len(f.tensors)} tensors",
                        f.fields[key].offset, key)
    dtype, overrides = weight_types(f)
    rot = f.get_int(f.arch_key("rope.dimension_count"))
    head = f.get_int(f.arch_key("attention.key_length"))
    head_default = n_embd // n_head if n_head else 0
    # MoE variants the toolkit does not build are refused here (UnsupportedFeature)
    moe_p = moe.from_gguf(f.get_float, f.architecture or "llama", list(f.tensors))
    try:
        hp = LlamaHParams(
            n_layer=n_layer, n_embd=n_embd, n_head=n_head,
            n_head_kv=f.get_int(f.arch_key("attention.head_count_kv"), n_head) or 0,
            n_ff=req("feed_forward_length"), n_vocab=n_vocab(f),
            n_ctx_train=f.get_int(f.arch_key("context_length"), 4096) or 0,
            n_embd_head_=None if head is None or head == head_default else head,
            n_rot_=None if rot is None or rot == (head if head is not None else head_default) else rot,
            rope_freq_base=f.get_float(f.arch_key("rope.freq_base"), 10000.0) or 0.0,
            eps=f.get_float(f.arch_key("attention.layer_norm_rms_epsilon"), 1e-5) or 0.0,
            tied="output.weight" not in f.tensors, dtype=dtype, tensor_types=overrides,
            name=f.get_str("general.name") or Path(f.path).stem,
            moe=moe_p,
            **arch_hparams(f),
        )
    except (GGUFError, UnsupportedFeature):
        raise
    except ValueError as e:
        raise GGUFError(f.path, f"inconsistent hyperparameters: {e}", None, f.arch_key("*")) from None
    check_shapes(f, hp.weights())
    return hp


def arch_hparams(f: GGUFFile) -> dict[str, Any]:
    """The keys of qwen3/gemma3 and Llama-3.x files beyond llama's (``llm_load_hparams``):
    ``rope_freqs.weight`` (llama3 rope scaling, read as values), and gemma3's sliding window
    (``attention.sliding_window``; ``attention.sliding_window_pattern``, default 6;
    ``rope.freq_base_swa``, default 10000)."""
    out: dict[str, Any] = {"arch": f.architecture}
    if "rope_freqs.weight" in f.tensors:
        out["rope_freqs"] = tuple(float(x) for x in np.asarray(f.tensor_data("rope_freqs.weight"), np.float32).ravel())
    if f.architecture == "gemma3":
        n_swa = f.get_int(f.arch_key("attention.sliding_window"))
        if n_swa:
            key = f.arch_key("attention.sliding_window_pattern")
            if f.get(key) is not None and not isinstance(f.get(key), int):
                raise UnsupportedFeature(key, f"{f.path}: {key} is a per-layer array; only a period is supported")
            out["n_swa"] = n_swa
            out["swa_pattern"] = f.get_int(key, 6)
            out["rope_freq_base_swa"] = f.get_float(f.arch_key("rope.freq_base_swa"), 10000.0)
    return out


# general.architecture -> the function reading its hyperparameters (llama's keys serve qwen3 and gemma3,
# which add theirs through arch_hparams); the supported ones are those with a graph builder
ARCHITECTURES: dict[str, Callable[[GGUFFile], Any]] = {arch: llama_hparams for arch in SUPPORTED_ARCHS}


def hparams_from_gguf(source: str | Path | GGUFFile) -> Any:
    """A GGUF file's hyperparameters and weight types, for the architectures in ``ARCHITECTURES``.

    ``source`` is a path or an already opened :class:`GGUFFile` (so a caller parses the file once).
    Raises GGUFError for a file that cannot be read and UnsupportedFeature for another architecture.
    """
    f = source if isinstance(source, GGUFFile) else open_gguf(source)
    arch = f.get_str("general.architecture")
    if arch is None:
        raise GGUFError(f.path, "required key is missing", None, "general.architecture")
    read = ARCHITECTURES.get(arch)
    if read is None:
        raise UnsupportedFeature(f"architecture {arch}", f"{f.path}: architecture {arch!r} is not supported "
                                 f"(supported: {', '.join(sorted(ARCHITECTURES))})")
    return read(f)


__all__ = ["ARCHITECTURES", "arch_hparams", "check_shapes", "hparams_from_gguf", "llama_hparams", "n_vocab",
           "weight_types"]
