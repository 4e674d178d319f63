"""The model and context a parsed log describes (:func:`from_log`).

The hyperparameters are read as from a GGUF file: the ``llama_model_loader: - kv`` lines become
the fields of a :class:`~toolkit.models.gguf_file.GGUFFile`, read by
:func:`toolkit.models.gguf.common_hparams` and the registered architecture's ``read_hparams``
(``load_arch_hparams``), so every architecture in :mod:`toolkit.models.archs` is read the same way.
A log lists no tensor shapes: the tensors are the architecture's own weights
(``Architecture.weights``), and whether the output is tied (``create_tensor`` loading
``token_embd.weight`` a second time, llama.cpp's ``TENSOR_DUPLICATED`` fallback) and whether the file
has ``rope_freqs.weight`` are decided by the tensor count ``llama_model_loader`` printed.
"""

from __future__ import annotations

import itertools
import re
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.errors import GGUFError, LogError, ToolkitError, UnsupportedFeature
from toolkit.explain.parse import ParsedLog, parse_log
from toolkit.ggml.types import GGMLType
from toolkit.models import archs
from toolkit.models.cparams import ContextParams
from toolkit.models.gguf import common_hparams
from toolkit.models.gguf_file import GGUFArray, GGUFField, GGUFFile, GGUFTensorInfo, GGUFValueType
from toolkit.models.hparams import HParams

_T = GGUFValueType
_SCALAR = {"u8": (_T.UINT8, "<B"), "i8": (_T.INT8, "<b"), "u16": (_T.UINT16, "<H"), "i16": (_T.INT16, "<h"),
           "u32": (_T.UINT32, "<I"), "i32": (_T.INT32, "<i"), "u64": (_T.UINT64, "<Q"), "i64": (_T.INT64, "<q"),
           "f32": (_T.FLOAT32, "<f"), "f64": (_T.FLOAT64, "<d"), "bool": (_T.BOOL, "<?"), "str": (_T.STRING, "")}
_ARR = re.compile(r"^arr\[(\w+),(\d+)\]$")
# llama_context's flash_attn line: llama_flash_attn_type_name
_FA = {"enabled": "on", "disabled": "off", "auto": "auto"}
# ggml_backend_dev_name prefixes -> the toolkit's device grammar (toolkit.models.devices)
_DEVICE_KINDS = {"RPC": "rpc", "CUDA": "cuda", "Metal": "metal", "MTL": "metal", "BLAS": "blas"}


@dataclass
class LoggedRun:
    """What a log describes: the model (``hparams``), the context parameters, the numbers it printed
    (``log``) and ``missing``: what the log did not say that the rebuild had to assume."""

    log: ParsedLog
    hparams: HParams
    cparams: ContextParams
    gguf_path: str | None = None
    missing: list[str] = field(default_factory=list)

    def context(self) -> Any:
        """The rebuilt :class:`~toolkit.context.Context` (reserved as llama.cpp did at start-up)."""
        from toolkit.context import Context  # the context imports the scheduler; the parser does not need it

        return Context(self.gguf_path if self.gguf_path else self.hparams, self.cparams)


def _scalar(path: str, key: str, tname: str, text: str, line: int) -> tuple[GGUFValueType, Any]:
    vt = _SCALAR[tname][0]
    try:
        if vt is _T.STRING:
            return vt, text
        if vt is _T.BOOL:
            return vt, text.strip() == "true"
        if vt in (_T.FLOAT32, _T.FLOAT64):
            return vt, float(text)
        return vt, int(text)
    except ValueError:
        raise LogError(path, key, f"the value {text!r} is not a {tname}", line) from None


def gguf_from_log(p: ParsedLog, missing: list[str]) -> GGUFFile:
    """The log's ``- kv`` lines as a GGUF file's fields (no tensors yet). An array printed in full keeps
    its values; one the log cut short (``...``) keeps its length, and its values are listed in ``missing``."""
    buf = bytearray()
    f = GGUFFile(p.source, b"", 0)
    for key, (tname, text, line) in p.kv.items():
        am = _ARR.match(tname)
        if am is None:
            if tname not in _SCALAR:
                raise LogError(p.source, key, f"unknown GGUF type {tname!r}", line)
            vt, value = _scalar(p.source, key, tname, text, line)
            f.fields[key] = GGUFField(key, vt, value, line)
            continue
        et, count = am.group(1), int(am.group(2))
        if et not in _SCALAR:
            raise LogError(p.source, key, f"unknown GGUF array type {et!r}", line)
        evt, fmt = _SCALAR[et]
        body = text.strip()
        items = [x.strip() for x in body.strip("[]").split(",")] if body.endswith("]") and evt is not _T.STRING else []
        offset = len(buf)
        if len(items) == count:
            for x in items:
                buf += struct.pack(fmt, _scalar(p.source, key, et, x, line)[1])
        else:
            if not key.startswith("tokenizer."):
                missing.append(f"{key}: the log shows {count} values cut short; read as zeros")
            buf += bytes(8 * count if evt is _T.STRING else struct.calcsize(fmt or "<Q") * count)
        f.fields[key] = GGUFField(key, _T.ARRAY, GGUFArray(f, evt, count, offset, len(buf) - offset), line)
    f.buffer = bytes(buf)
    f.size = len(buf)
    return f


def _types(p: ParsedLog, weights: list[Any]) -> tuple[GGMLType, dict[str, GGMLType]] | None:
    """The weight types the ``- type X: N tensors`` lines pin, or None when the counts leave it open.

    One type for all; else one type per rank of weight (1-D norms and biases, matrices, 3-D expert
    stacks, as ``llama-quantize`` and ``convert_hf_to_gguf`` type them: gpt-oss's MXFP4 is its experts
    only) when exactly one such assignment gives the logged counts. The matrices' type is the dtype;
    another rank's type is a per-suffix override (``HParams.tensor_types``)."""
    counts = {GGMLType.parse(k): v for k, v in p.type_counts.items()}
    if len(counts) == 1:
        return next(iter(counts)), {}
    by_rank: dict[int, list[str]] = {}
    for w in weights:
        by_rank.setdefault(len(w.ne), []).append(w.name)
    ranks = sorted(by_rank)
    found = []
    for choice in itertools.product(counts, repeat=len(ranks)):
        got: Counter[GGMLType] = Counter()
        for r, t in zip(ranks, choice):
            got[t] += len(by_rank[r])
        if dict(got) == counts:
            found.append(dict(zip(ranks, choice)))
    if len(found) > 1:  # a tie of counts: norms and biases stay F32 (llama-quantize never quantizes them)
        found = [f for f in found if f.get(1) is GGMLType.F32]
    if len(found) != 1:
        return None
    per_rank = found[0]
    dtype = per_rank.get(2, next(iter(per_rank.values())))
    overrides: dict[str, GGMLType] = {}
    for r, t in per_rank.items():
        if t is dtype or (r == 1 and t is GGMLType.F32):
            continue
        for name in by_rank[r]:
            overrides[name.split(".", 2)[-1] if name.startswith("blk.") else name] = t
    return dtype, overrides


def _stub_tensors(f: GGUFFile, n_tensors: int, tied: bool, rope: bool, n_rot: int) -> None:
    names = ([] if tied else ["output.weight"]) + (["rope_freqs.weight"] if rope else [])
    f.tensors = {}
    ones = struct.pack(f"<{max(n_rot // 2, 1)}f", *([1.0] * max(n_rot // 2, 1)))
    at = len(f.buffer)
    f.buffer = bytes(f.buffer) + ones
    for k in range(max(n_tensors, len(names))):
        name = names[k] if k < len(names) else f"blk.log.{k}"
        ne = (n_rot // 2,) if name == "rope_freqs.weight" else (1,)
        f.tensors[name] = GGUFTensorInfo(name, ne, GGMLType.F32, 0, at, 4 * ne[0], 0)


def hparams_from_log(p: ParsedLog, missing: list[str]) -> HParams:
    """The model of a log through the registry (see the module docstring)."""
    name_line = p.kv["general.architecture"]
    name = name_line[1]
    try:
        arch = archs.get(name)
    except UnsupportedFeature as e:
        raise UnsupportedFeature("general.architecture", f"{p.source} line {name_line[2]}: "
                                 f"general.architecture = {name!r}: {e}") from None
    f = gguf_from_log(p, missing)
    n_rot = int(p.print_info.get("n_rot", ("0", 0))[0] or 0)
    fits: list[tuple[bool, bool, HParams, dict[str, Any]]] = []
    tied_options = (False, True) if p.tied_output is None else (p.tied_output,)
    for tied in tied_options:
        for rope in (False, True):
            _stub_tensors(f, p.n_tensors, tied, rope, n_rot)
            try:
                out = common_hparams(f, arch.moe_tensors, arch.moe_keys)
                out["tied"] = tied
                out.update(arch.read_hparams(f))
                hp = HParams(**out, arch=name)
                arch.check(hp)
            except GGUFError as e:
                raise LogError(p.source, e.field, str(e), p.kv[e.field][2] if e.field in p.kv else None) from None
            except UnsupportedFeature:
                raise
            except (ToolkitError, ValueError) as e:
                raise LogError(p.source, f"{name}.*", f"inconsistent hyperparameters: {e}") from None
            if len(arch.weights(hp)) == p.n_tensors:
                fits.append((tied, rope, hp, out))
    if not fits:
        raise LogError(p.source, "llama_model_loader: … tensors", f"the log's model has {p.n_tensors} tensors; "
                       f"the toolkit's {name} with these hyperparameters has none of that count (a variant the "
                       "toolkit does not build)")
    tied, rope, hp, out = fits[0]
    if len(fits) > 1:
        missing.append("whether the output is tied to token_embd and whether the file has rope_freqs.weight "
                       f"(both fit {p.n_tensors} tensors): read as tied={tied}, rope_freqs={rope}")
    if rope:
        missing.append("rope_freqs.weight values (they change the outputs, not the sizes): read as 1.0")
    weights = arch.weights(hp)
    types = _types(p, weights)
    if types is None:
        raise LogError(p.source, "the GGUF file (model=, -m)", "the log's tensor types "
                       f"{dict(p.type_counts)} do not say which weight has which type")
    out.update(dtype=types[0], tensor_types=types[1])
    return HParams(**out, arch=name)


def _device(p: ParsedLog, kind: str, index: int, desc: str) -> str:
    k = _DEVICE_KINDS.get(kind)
    if k is None:
        raise UnsupportedFeature("device", f"{p.source}: device {kind}{index} ({desc}): the toolkit models "
                                 f"{', '.join(sorted(_DEVICE_KINDS))} devices")
    return f"rpc:{desc}" if k == "rpc" else k


def cparams_from_log(p: ParsedLog, hp: HParams, missing: list[str]) -> ContextParams:
    """``llama_context``'s lines, the KV types, the devices, the layer placement and the overrides."""

    def cp(key: str, default: str) -> str:
        if key not in p.cparams:
            missing.append(f"llama_context: {key} (read as {default})")
            return default
        return p.cparams[key][0]

    devices = tuple(_device(p, kind, i, desc) for kind, i, desc, _ in p.devices)
    ngl = p.offloaded[0] if p.offloaded else 0
    if p.offloaded is None and devices:
        missing.append("load_tensors: offloaded N/M layers (read as 0)")
    gpu_names = [f"{kind}{i}" for kind, i, _, _ in p.devices]
    ts: tuple[float, ...] | None = None
    if len(devices) > 1:
        per = Counter(p.layer_devices.values())  # the output layer (n_layer) included, as llama.cpp splits
        ts = tuple(float(per.get(n, 0)) for n in gpu_names)
    if p.kv_sizes:
        type_k, type_v = p.kv_sizes[0][3], p.kv_sizes[0][4]
    else:
        type_k = type_v = "f16"
        missing.append("llama_kv_cache: size = … K (…), V (…) (KV types read as f16)")
    # -nkvo: a layer on a device whose KV the log puts on the CPU
    offload_kqv = not any(p.layer_devices.get(il, "CPU") != "CPU" and d == "CPU"
                          for il, d in p.kv_layer_devices.items())
    if p.op_offload is None:
        missing.append("op offload (--no-op-offload is not printed): read as on")
    fa = cp("flash_attn", "auto")
    if fa not in _FA:
        raise LogError(p.source, "llama_context: flash_attn", f"unknown value {fa!r}", p.cparams["flash_attn"][1])
    return ContextParams(
        n_ctx=int(cp("n_ctx", "4096")), n_batch=int(cp("n_batch", "2048")), n_ubatch=int(cp("n_ubatch", "512")),
        n_seq_max=int(cp("n_seq_max", "1")), flash_attn=_FA[fa],  # type: ignore[arg-type]
        kv_unified=cp("kv_unified", "false") == "true", type_k=type_k, type_v=type_v,
        offload_kqv=offload_kqv, op_offload=p.op_offload is not False, n_gpu_layers=ngl,
        tensor_split=ts, devices=devices, use_mmap=(p.load_mode or "mmap") == "mmap",
        force_pipeline_parallel=p.pipeline_parallel,
        override_tensor=tuple(f"^{re.escape(t)}$={_requested_buft(buft)}" for t, buft, _ in p.overrides))


def _requested_buft(logged: str) -> str:
    """The buffer type an override asked for, from the one ``llama_model::load_tensors`` prints: an
    override to ``CPU`` is printed as the CPU's extra type the weight took (``CPU_REPACK``,
    ``ggml_backend_dev_get_extra_bufts``), which is not a name ``-ot`` accepts."""
    return "CPU" if logged == "CPU_REPACK" else logged


def from_log(text_or_path: str | Path, model: str | Path | None = None) -> LoggedRun:
    """The model and context a llama.cpp start-up log describes (its text or a path).

    ``model`` names the GGUF file the run loaded: its tensor types then come from the file
    (:func:`toolkit.models.gguf.hparams_from_gguf`); without it, from the log's
    ``- type X: N tensors`` counts. Raises :class:`~toolkit.errors.LogError` for a line the log lacks
    and :class:`~toolkit.errors.UnsupportedFeature` for an architecture the toolkit does not know.
    """
    p = parse_log(text_or_path)
    missing: list[str] = []
    if model is not None:
        from toolkit.models.gguf import hparams_from_gguf

        hp = hparams_from_gguf(str(model))
    else:
        hp = hparams_from_log(p, missing)
    cparams = cparams_from_log(p, hp, missing)
    if p.build is None:
        missing.append("build: the log does not print llama.cpp's build number")
    return LoggedRun(p, hp, cparams, str(model) if model is not None else None, missing)


__all__ = ["LoggedRun", "cparams_from_log", "from_log", "gguf_from_log", "hparams_from_log"]
