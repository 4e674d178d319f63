"""Model hyperparameters from a GGUF file's metadata and tensor infos (no tensor data is read).

One reader (:mod:`toolkit.models.gguf_file`) serves planning (``Context("x.gguf")``) and the
runtime (``toolkit.jaxrt.gguf_io.read_gguf``), so both get the same hyperparameters.

As ``llama_model::load_hparams`` does, :func:`common_hparams` reads the keys every architecture
has (sizes per layer through :func:`get_key_or_arr`), and the registered architecture
(:mod:`toolkit.models.archs`) reads its own (``Architecture.read_hparams``, its
``load_arch_hparams``) through the file's accessors (``f.get_int(f.arch_key(...))`` and so on),
which raise a typed error for a key of the wrong type.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from toolkit.errors import GGUFError, UnsupportedFeature
from toolkit.ggml.types import GGMLType
from toolkit.models import archs, moe
from toolkit.models.gguf_file import GGUFFile, get_key_or_arr, open_gguf
from toolkit.models.hparams import SCALED_EXPERT_WEIGHTS, SCALED_LAYER_WEIGHTS, HParams


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
    ``create_tensor`` check: "tensor has wrong shape" / "missing tensor"), and the file has no other
    (``done_getting_tensors``: "wrong number of tensors")."""
    names = set()
    for w in weights:
        names.add(w.name)
        t = f.tensors.get(w.name)
        if t is None:
            raise GGUFError(f.path, "missing tensor", None, w.name)
        if t.ne != tuple(w.ne):
            raise GGUFError(f.tensor_path(w.name), f"tensor has wrong shape; expected {list(w.ne)}, got {list(t.ne)}",
                            t.info_offset, w.name)
    # llama_model_loader::done_getting_tensors: every tensor of the file must have been created
    extra = [n for n in f.tensors if n not in names]
    if extra:
        raise GGUFError(f.tensor_path(extra[0]), f"wrong number of tensors; expected {len(names)}, got "
                        f"{len(f.tensors)} ({extra[0]!r} is not a tensor of {f.architecture})", None, extra[0])


def common_hparams(f: GGUFFile, moe_tensors: tuple[str, ...] = (), moe_keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """The keys ``llama_model::load_hparams`` reads for every architecture, as hyperparameter arguments:
    sizes (``feed_forward_length``, ``attention.head_count`` and ``head_count_kv`` per layer or not),
    head sizes, RoPE, the MoE keys, ``rope_freqs.weight`` (Llama-3.x rope scaling, read as values)
    and the weight types. ``moe_tensors``: the MoE tensors the architecture builds
    (``Architecture.moe_tensors``) and the MoE keys it reads itself (``Architecture.moe_keys``), which are
    not refused."""

    def req(name: str) -> int:
        return f.require_int(f.arch_key(name))

    n_embd = req("embedding_length")
    n_layer = req("block_count")
    if n_layer > len(f.tensors):  # each block has its own weights; refuse before listing them
        key = f.arch_key("block_count")
        raise GGUFError(f.path, f"{n_layer} blocks, but the file has {len(f.tensors)} tensors",
                        f.fields[key].offset, key)
    n_head = get_key_or_arr(f, "attention.head_count", n_layer)
    if n_head is None:
        raise GGUFError(f.path, "required key is missing", None, f.arch_key("attention.head_count"))
    n_ff = get_key_or_arr(f, "feed_forward_length", n_layer)   # None: the architecture's keys must give it
    n_head_kv = get_key_or_arr(f, "attention.head_count_kv", n_layer)  # default: n_head_arr
    dtype, overrides = weight_types(f)
    head0 = n_head if isinstance(n_head, int) else n_head[0]
    head_default = n_embd // head0 if head0 else 0
    head_k = f.get_int(f.arch_key("attention.key_length"))
    head_v = f.get_int(f.arch_key("attention.value_length"))
    rot = f.get_int(f.arch_key("rope.dimension_count"))
    out: dict[str, Any] = {
        "n_layer": n_layer, "n_embd": n_embd, "n_head": n_head,
        "n_head_kv": n_head if n_head_kv is None else n_head_kv, **({} if n_ff is None else {"n_ff": n_ff}),
        "n_vocab": n_vocab(f), "n_ctx_train": f.get_int(f.arch_key("context_length"), 4096) or 0,
        "n_embd_head_k_": None if head_k is None or head_k == head_default else head_k,
        "n_embd_head_v_": None if head_v is None or head_v == head_default else head_v,
        "n_rot_": None if rot is None or rot == (head_k if head_k is not None else head_default) else rot,
        "rope_freq_base": f.get_float(f.arch_key("rope.freq_base"), 10000.0) or 0.0,
        "eps": f.get_float(f.arch_key("attention.layer_norm_rms_epsilon"), 1e-5) or 0.0,
        "tied": "output.weight" not in f.tensors, "dtype": dtype, "tensor_types": overrides,
        "name": f.get_str("general.name") or Path(f.path).stem,
        # MoE variants the toolkit does not build are refused here (UnsupportedFeature)
        "moe": moe.from_gguf(f.get_float, f.architecture or "llama", list(f.tensors), moe_tensors, moe_keys),
        # a split model: the shard of every tensor (the mmap'ed CPU buffers are one per file)
        **({"tensor_files": {n: t.file_index for n, t in f.tensors.items()}} if len(f.shards) > 1 else {}),
    }
    if "rope_freqs.weight" in f.tensors:
        import numpy as np
        out["rope_freqs"] = tuple(float(x) for x in np.asarray(f.tensor_data("rope_freqs.weight"), np.float32).ravel())
    return out


_LAYER_SCALE = re.compile(r"^blk\.(\d+)\.(\w+)\.scale$")


def weight_scales(f: GGUFFile, experts: bool = False) -> frozenset[str]:
    """The weights of ``SCALED_LAYER_WEIGHTS`` (and with ``experts`` of ``SCALED_EXPERT_WEIGHTS``) whose
    ``.scale`` the file has, and ``output.weight`` when it is NVFP4 and ``output.scale`` is there (the generic
    pass creates ``output_s`` only then). Other ``.scale`` tensors stay the architecture's (gemma4's router and
    expert scales) or are refused as extra tensors (the shared experts' and ``ssm_in``'s scales, the
    ``.input_scale`` tensors: not built)."""
    names = SCALED_LAYER_WEIGHTS + (SCALED_EXPERT_WEIGHTS if experts else ())
    out = set()
    for name in f.tensors:
        m = _LAYER_SCALE.match(name)
        if m and m.group(2) in names and f"blk.{m.group(1)}.{m.group(2)}.weight" in f.tensors:
            out.add(f"blk.{m.group(1)}.{m.group(2)}.weight")
    out_w = f.tensors.get("output.weight")
    if "output.scale" in f.tensors and out_w is not None and out_w.type is GGMLType.NVFP4:
        out.add("output.weight")
    return frozenset(out)


def hparams_from_gguf(source: str | Path | GGUFFile) -> HParams:
    """A GGUF file's hyperparameters and weight types: the common keys, then the registered
    architecture's own (``Architecture.read_hparams``, its ``load_arch_hparams``), then every weight
    checked against the architecture's tensors.

    ``source`` is a path or an already opened :class:`GGUFFile` (so a caller parses the file once).
    Raises GGUFError for a file that cannot be read and UnsupportedFeature for an architecture that
    is not registered (:mod:`toolkit.models.archs`).
    """
    f = source if isinstance(source, GGUFFile) else open_gguf(source)
    name = f.get_str("general.architecture")
    if name is None:
        raise GGUFError(f.path, "required key is missing", None, "general.architecture")
    try:
        arch = archs.get(name)
    except UnsupportedFeature as e:
        raise UnsupportedFeature(e.feature, f"{f.path}: {e}") from None
    # load_arch_hparams runs after the common keys and may set what they left (gpt-oss's experts, n_ff)
    kw = {**common_hparams(f, arch.moe_tensors, arch.moe_keys), **arch.read_hparams(f), "arch": name}
    # the generic pass's scales; an architecture whose graph applies them has its experts' too (build_lora_mm_id)
    kw["weight_scales"] = weight_scales(f, experts=arch.scaled_mm)
    if "n_ff" not in kw:
        raise GGUFError(f.path, "required key is missing", None, f.arch_key("feed_forward_length"))
    try:
        hp = HParams(**kw)
    except (GGUFError, UnsupportedFeature):
        raise
    except ValueError as e:
        raise GGUFError(f.path, f"inconsistent hyperparameters: {e}", None, f.arch_key("*")) from None
    arch.check(hp)
    if hp.weight_scales and not arch.scaled_mm:
        raise UnsupportedFeature("weight scales", f"{f.path}: {sorted(hp.weight_scales)[0]} has a .scale tensor; "
                                 f"the {name} graph does not multiply by weight scales (build_lora_mm's w_s)")
    check_shapes(f, arch.weights(hp))
    return hp


__all__ = ["check_shapes", "common_hparams", "get_key_or_arr", "hparams_from_gguf", "n_vocab",
           "weight_scales", "weight_types"]
