"""Where llama.cpp puts a model: layers on devices, weights in buffers, the output buffer.

- Layers (``llama_model::load_tensors``): ``-ngl`` counts the output layer; the first
  ``n_layer_all + 1 - ngl`` layers stay on the CPU; the offloaded ones are spread over the
  devices by the cumulative tensor split (``upper_bound`` on float32 split points); the
  input layer (token_embd) always stays on the CPU. ``n_layer_all`` counts the NextN/MTP
  blocks, whose tensors are skipped (``TENSOR_SKIP``, logged as unused): such a block takes
  a place in ``-ngl`` and holds nothing.
- Weights: on a CPU layer a matrix goes to ``CPU_REPACK`` when the CPU's repack buffer
  can run its MUL_MAT, otherwise to the CPU buffer, which is ``CPU_Mapped`` with mmap and
  then spans the file range of its tensors (``get_mapping_range``). For a split model
  (``HParams.tensor_files``) ``create_backend_buffers`` makes one such buffer per file (shard)
  holding any of them, and ``load_tensors`` prints one "model buffer size" line per buffer, not
  their sum (:attr:`LoadedModel.buffer_lines`); ``memory_breakdown`` sums them per buffer type
  (:attr:`LoadedModel.buffers_bytes`). Read from llama.cpp's source: no measured case pins the
  per-file rule. Without mmap one buffer holds every file's tensors.
- KV cache: :mod:`toolkit.models.memory` (``llama_model::create_memory``); the type checks
  ``llama_init_from_model`` makes before it are :func:`check_kv_types`.
- Output buffer: ``n_seq_max`` rows of logits in the output device's host buft, else CPU.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from toolkit.backend import Backend, Buffer, BufferType
from toolkit.errors import ParameterError
from toolkit.ggml.tensor import BufferUsage, Tensor
from toolkit.ggml.types import GGMLType, to_f32
from toolkit.models import overrides
from toolkit.models.cparams import ContextParams, ResolvedParams
from toolkit.models.devices import DeviceSet
from toolkit.models.hparams import GGUF_DEFAULT_ALIGNMENT, ROPE_FREQS_LAYER, HParams, WeightInfo

CPU_DEVICE = "CPU"


def _pad(x: int, a: int) -> int:
    return -(-x // a) * a


def layer_devices(hp: HParams, cp: ContextParams, devs: DeviceSet) -> list[int]:
    """Device index (into ``devs.gpus``) of layers 0..n_layer_all (n_layer_all = output); -1 = CPU."""
    n_dev = len(devs.gpus)
    ngl = cp.n_gpu_layers
    n_layer = hp.n_layer_all
    i_gpu_start = max(n_layer + 1 - ngl, 0)
    act_gpu_layers = 0 if n_dev == 0 else min(ngl, n_layer + 1)
    ts = cp.tensor_split
    if ts is not None and len(ts) > n_dev and any(ts[n_dev:]):
        raise ParameterError("tensor_split", list(ts), f"at most {n_dev} share(s), one per device")
    if ts is None or not any(ts[:n_dev]):
        # default split by free memory: the budgets when every device has one; equal shares otherwise
        # (identical devices, like the oracle's two RPC servers on one host, report equal memory)
        limits = [b.buft.alloc_limit for b in devs.gpus]
        shares = [float(x) for x in limits] if all(limits) else [1.0] * n_dev  # type: ignore[arg-type]
    else:
        shares = list(ts[:n_dev]) + [0.0] * (n_dev - len(ts))
    # llama.cpp accumulates and normalises the split points in float32 (to_f32 after each operation)
    pts: list[float] = []
    acc = 0.0
    for x in shares:
        acc = to_f32(acc + to_f32(x))
        pts.append(acc)
    if n_dev:
        last = pts[-1]
        pts = [to_f32(p / last) if last else math.nan for p in pts]   # 0/0: every point is 0
    out: list[int] = []
    for il in range(n_layer + 1):
        if il < i_gpu_start or (il - i_gpu_start) >= act_gpu_layers:
            out.append(-1)
            continue
        out.append(_upper_bound(pts, to_f32(to_f32(il - i_gpu_start) / to_f32(act_gpu_layers))))
    return out


def _upper_bound(pts: Sequence[float], x: float) -> int:
    """``std::upper_bound`` over the split points: the first point above ``x`` (NaN points ordered last, as
    numpy's searchsorted does; no split reaches one, the shares are never all 0)."""
    lo, hi = 0, len(pts)
    while lo < hi:
        mid = (lo + hi) // 2
        if x < pts[mid] or pts[mid] != pts[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


def repack_supported(w: WeightInfo) -> bool:
    """ggml-cpu's repack buffer runs MUL_MAT on 2-D and MUL_MAT_ID on 3-D Q4_0, Q4_K, IQ4_NL and MXFP4
    weights with rows % 8 on the measured x86 CPU (``ggml_repack_get_optimal_repack_type`` with AVX2:
    ``q4_0_8x8_q8_0``, ``q4_K_8x8_q8_K``, ``iq4_nl_8x8_q8_0``, ``mxfp4_8x8_q8_0``; the rows % 4 forms
    and Q5_K, Q6_K, Q8_0 are ARM NEON's), and Q2_K too, which needs AVX512 (``q2_K_8x8_q8_K``): the
    measured CPU reports ``AVX512 = 1``, but no measured case has a Q2_K weight."""
    if (w.op, len(w.ne)) not in (("MUL_MAT", 2), ("MUL_MAT_ID", 3)):
        return False
    return w.type in _REPACKED and w.ne[1] % 8 == 0


_REPACKED = frozenset({GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.IQ4_NL, GGMLType.MXFP4, GGMLType.Q2_K})


@dataclass
class LoadedModel:
    """The model's weights as ggml tensors placed in buffers, and where each layer lives."""

    hparams: HParams
    devices: DeviceSet
    layer_dev: list[int]                              # per layer 0..n_layer_all: gpu index or -1
    tensors: dict[str, Tensor] = field(default_factory=dict)
    output: Tensor | None = None                      # output.weight, or the tied duplicate of token_embd
    buffers_bytes: dict[str, int] = field(default_factory=dict)  # per buffer type (memory_breakdown)
    # one (buffer type, bytes) per backend buffer, as load_tensors prints its "model buffer size" lines:
    # a split model's CPU_Mapped buffer is one per file with mmap (no measured llama.cpp case pins this)
    buffer_lines: list[tuple[str, int]] = field(default_factory=list)
    tensor_overrides: list[overrides.TensorOverride] = field(default_factory=list)  # weights moved by -ot & co.
    override_rules: list[overrides.OverrideRule] = field(default_factory=list)
    rope_freqs: dict[int, Tensor] = field(default_factory=dict)  # per layer that reads it: its buffer type's copy
    warnings: list[str] = field(default_factory=list)  # create_tensor's "model has unused tensor" lines

    def layer_backend(self, il: int) -> Backend:
        """The backend of layer il's device (the CPU backend for CPU layers)."""
        d = self.layer_dev[il]
        return self.devices.cpu if d < 0 else self.devices.gpus[d]

    def layer_device_name(self, il: int) -> str:
        d = self.layer_dev[il]
        return CPU_DEVICE if d < 0 else self.devices.gpu_names[d]

    @property
    def n_offloaded(self) -> int:
        return sum(1 for d in self.layer_dev if d >= 0)

    def w(self, name: str) -> Tensor:
        return self.tensors[name]

    @property
    def n_tensors(self) -> int:
        """``llama_model::n_tensors()``: the distinct weight tensors (a tied output counts when duplicated)."""
        return len({id(t) for t in self.tensors.values()} | ({id(self.output)} if self.output is not None else set())
                   | {id(t) for t in self.rope_freqs.values()})


# the per-tensor / per-expert scales llama_model's generic pass creates after load_arch_tensors
# (every "<weight>.scale" of a layer but the ones an architecture creates itself, as gemma4's router scale)
_GENERIC_SCALE = re.compile(r"^blk\.\d+\.(?!ffn_gate_inp\.)\w+\.scale$")


def creation_order(infos: Sequence[WeightInfo]) -> list[WeightInfo]:
    """The order ``llama_model::load_tensors`` creates the file's tensors in (which the tensor-override log
    follows): ``load_arch_tensors``' order, then the generic pass over the layers that loads the optional
    ``.scale`` tensors (``ffn_down_exps.scale`` & co.)."""
    late = [w for w in infos if _GENERIC_SCALE.match(w.name)]
    return [w for w in infos if w not in late] + late


def load_model(hp: HParams, cp: ContextParams, devs: DeviceSet, infos: Sequence[WeightInfo], *,
               tied_output_first: bool) -> LoadedModel:
    """Place every weight (llama_model::load_tensors) and size the model buffers; ``infos`` are the file's
    tensors in file order (the architecture's :meth:`~toolkit.models.archs.Architecture.weights`).

    Two tensors are ``TENSOR_DUPLICATED`` there, and ``create_tensor`` reuses a duplicate only
    inside the same buffer type: the tied output (``token_embd`` again, in the output layer's
    buffer type) and ``rope_freqs.weight`` (once per buffer type of the repeating layers).
    Each copy counts in ``n_tensors``. ``tied_output_first`` (the architecture's
    :attr:`~toolkit.models.archs.Architecture.tied_output_first`; no default, so that no caller forgets
    it): the architecture creates the tied output before ``token_embd`` (gemma4's
    ``load_arch_tensors``), so the duplicate finds no tensor to reuse and is its own tensor even in the
    same buffer type.
    """
    model = LoadedModel(hp, devs, layer_devices(hp, cp, devs))
    n_layer = hp.n_layer_all   # the output layer's index

    def home(layer: int) -> int:
        return -1 if layer < 0 else model.layer_dev[min(layer, n_layer)]

    # GGUF file offsets (file index, start, end), for the memory-mapped CPU buffers' spans: each file
    # (shard of a split model) holds its tensors in order, each at the default alignment
    offs: dict[str, tuple[int, int, int]] = {}
    pos_of: dict[int, int] = {}
    for w in infos:
        idx = hp.tensor_files.get(w.name, 0)
        pos = _pad(pos_of.get(idx, 0), GGUF_DEFAULT_ALIGNMENT)
        offs[w.name] = (idx, pos, pos + w.nbytes)
        pos_of[idx] = pos + w.nbytes
    cpu_name = "CPU_Mapped" if cp.use_mmap else "CPU"
    bufts: dict[str, BufferType] = {cpu_name: devs.cpu_buft, "CPU_REPACK": devs.repack_buft}
    rules = overrides.parse(cp.override_tensor, cp.cpu_moe, cp.n_cpu_moe,
                            [*(b.buft.name for b in [*devs.gpus, *devs.accels]), devs.cpu_buft.name],
                            n_layer=hp.n_layer)
    model.override_rules = rules

    def buf_of(w: WeightInfo, d: int) -> str:
        rule = overrides.match(rules, w.name) if rules else None
        if rule is not None:
            name, logged = _override_buft(w, rule.buft, devs, cp.use_mmap, bufts)
            if all(o.tensor != w.name for o in model.tensor_overrides):
                model.tensor_overrides.append(overrides.TensorOverride(w.name, w.type.lower, logged, w.nbytes,
                                                                       rule.pattern))
            return name
        if d >= 0:
            b = devs.gpus[d].buft
            bufts[b.name] = b
            return b.name
        return "CPU_REPACK" if repack_supported(w) else cpu_name

    # (info, buffer name, file key, tensors key): one entry per tensor llama.cpp creates
    placed: list[tuple[WeightInfo, str, str, str]] = []
    rope_copy: dict[str, str] = {}                    # buffer name -> tensors key of its rope_freqs copy
    rope_of_layer: dict[int, str] = {}
    for w in creation_order(infos):
        if w.skip:
            # llama_model_loader::create_tensor: TENSOR_SKIP counts as created, is never allocated
            model.warnings.append(f"model has unused tensor {w.name} (size = {w.nbytes} bytes) -- ignoring")
            continue
        if w.layer == ROPE_FREQS_LAYER:
            for il in (range(hp.n_layer) if w.layers is None else w.layers):
                name = buf_of(w, home(il))
                if name not in rope_copy:
                    rope_copy[name] = w.name if not rope_copy else f"{w.name}@{name}"
                    placed.append((w, name, w.name, rope_copy[name]))
                rope_of_layer[il] = rope_copy[name]
            continue
        placed.append((w, buf_of(w, home(w.layer)), w.name, w.name))
    if hp.tied:
        tok = next(w for w in infos if w.name == "token_embd.weight")
        out_w = WeightInfo("output.weight", tok.ne, tok.type, n_layer, "MUL_MAT")
        name = buf_of(out_w, home(n_layer))
        tok_name = next(n for i, n, _, _ in placed if i.name == tok.name)
        if name != tok_name or tied_output_first:   # same buffer type: create_tensor returns token_embd
            placed.append((out_w, name, tok.name, "output.weight"))
    sizes: dict[str, int] = {}
    spans: dict[int, list[int]] = {}   # file index -> [first, last] of its CPU_Mapped tensors
    for w, name, key, _ in placed:
        buft = bufts[name]
        if name == "CPU_Mapped":
            idx, lo, hi = offs[key]
            span = spans.setdefault(idx, [lo, hi])
            span[0], span[1] = min(span[0], lo), max(span[1], hi)
        else:
            t = Tensor(w.type, w.ne)
            sizes[name] = sizes.get(name, 0) + _pad(buft.alloc_size(t), buft.alignment)
    # create_backend_buffers: with mmap one CPU_Mapped buffer per file that holds any of its tensors
    # (get_mapping_range), each printed on its own line; memory_breakdown sums them per buffer type
    mapped = [hi - lo for _, (lo, hi) in sorted(spans.items())]
    if mapped:
        sizes["CPU_Mapped"] = sum(mapped)
    buffers = {name: Buffer(bufts[name], size, BufferUsage.WEIGHTS, name) for name, size in sizes.items()}
    for w, name, key, tkey in placed:
        t = Tensor(w.type, w.ne, name=key)
        t.buffer = buffers[name]
        model.tensors[tkey] = t
    model.output = model.tensors.get("output.weight", model.tensors["token_embd.weight"])
    model.rope_freqs = {il: model.tensors[k] for il, k in rope_of_layer.items()}
    order = [b.name for b in devs.gpus]
    model.buffers_bytes = dict(sorted(sizes.items(), key=lambda kv: (kv[0] in order, kv[0])))
    model.buffer_lines = [(n, b) for n, total in model.buffers_bytes.items()
                          for b in (mapped if n == "CPU_Mapped" else [total])]
    return model


def _override_buft(w: WeightInfo, buft_name: str, devs: DeviceSet, use_mmap: bool,
                   bufts: dict[str, BufferType]) -> tuple[str, str]:
    """(buffer name, logged buft) of a weight an override sends to ``buft_name`` (llama_model::load_tensors).

    A device buft is used as is. ``CPU`` goes through llama's CPU buft list (make_cpu_buft_list):
    ACCEL bufts other than the CPU's, the first GPU's host buft, the repack buft when it runs the
    weight's op, the CPU buft; with mmap a device's host buft is replaced by the CPU buft.
    """
    cpu_name = "CPU_Mapped" if use_mmap else devs.cpu_buft.name
    if buft_name != overrides.CPU_BUFT:
        b = next(x.buft for x in [*devs.gpus, *devs.accels] if x.buft.name == buft_name)
        bufts[b.name] = b
        return b.name, b.name
    for a in devs.accels:
        if a.buft is not devs.cpu_buft and a.supports_op(Tensor(w.type, w.ne)):
            bufts[a.buft.name] = a.buft
            return a.buft.name, a.buft.name
    host = next((g.host_buft for g in devs.gpus if g.host_buft is not None), None)
    if host is not None:
        if use_mmap:
            return cpu_name, host.name
        bufts[host.name] = host
        return host.name, host.name
    if repack_supported(w):
        return "CPU_REPACK", "CPU_REPACK"
    return cpu_name, devs.cpu_buft.name


def check_kv_types(hp: HParams, rp: ResolvedParams, flash_attn: bool) -> None:
    """The checks llama_init_from_model makes before creating a context, and one it does not: a cache type
    ggml-cpu cannot write (no ``from_float``: the IQ1/IQ2/IQ3 types) is refused here, where llama.cpp's
    ``common`` refuses every type outside its list and the library would fail in the scheduler (no
    backend runs SET_ROWS into it; no measured case shows that failure)."""
    for which, t in (("K", rp.type_k), ("V", rp.type_v)):
        if not t.cpu_from_float:
            no = ", ".join(x.lower for x in GGMLType if x.is_quantized and not x.cpu_from_float)
            raise ParameterError(f"type_{which.lower()}", t.lower, f"a type ggml-cpu can quantize into (not {no})",
                                 f"ggml-cpu has no from_float for {t.lower}: it cannot be written into the cache")
    for which, t, head in (("K", rp.type_k, hp.n_embd_head_k), ("V", rp.type_v, hp.n_embd_head_v)):
        if t.is_quantized and head % t.blck_size:
            raise ParameterError(
                f"type_{which.lower()}", t.lower, f"a type whose block size divides n_embd_head_{which.lower()}={head}",
                f"block size {t.blck_size}", llama_text=f"{which} cache type {t.lower} with block size "
                f"{t.blck_size} does not divide n_embd_head_{which.lower()}={head}")
    if rp.type_v.is_quantized and not flash_attn:
        raise ParameterError("type_v", rp.type_v.lower, "a non-quantized type unless flash_attn is on",
                             "V cache quantization requires flash_attn",
                             llama_text=f"V cache quantization ({rp.type_v.lower}) requires flash_attn")


def output_buffer(model: LoadedModel, rp: ResolvedParams) -> dict[str, int]:
    """``output_reserve(n_seq_max)``: logits rows in the output device's host buft (else CPU)."""
    d = model.layer_dev[model.hparams.n_layer_all]
    host = model.devices.gpus[d].host_buft if d >= 0 else None
    name = host.name if host is not None else model.devices.cpu_buft.name
    return {name: rp.n_seq_max * model.hparams.n_vocab * 4}
