"""``llama_memory_recurrent``: the per-sequence states of a hybrid's recurrent layers.

Per recurrent layer (the filter of ``llama_memory_hybrid``) a convolution state ``cache_r_l<il>``
``[n_embd_r, mem_size * (1 + n_rs_seq)]`` and an SSM state ``cache_s_l<il>``
``[n_embd_s, mem_size * (1 + n_rs_seq)]``, both F32 (``create_memory`` passes ``GGML_TYPE_F32``), with
``mem_size = max(1, n_seq_max)``: one row per sequence, whatever the context. Each layer's pair sits on
the layer's device when the KV cache is offloaded (``offload_kqv``), else on the CPU; the buffers are
made per buffer type in the order of their names (the constructor's ``std::map`` keyed by
``ggml_backend_buft_name``) and printed as ``RS buffer size`` lines, the counterpart of the KV lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from toolkit.backend import Buffer, BufferType
from toolkit.ggml.tensor import BufferUsage, Tensor
from toolkit.ggml.types import F32
from toolkit.models.loader import LoadedModel

MIB = 2**20
# the memory group of the recurrent state's buffers (events, figures, compare, breakdown, fit)
GROUP_RS = "RS"


def rs_buffer_line(name: str, nbytes: int) -> str:
    """``llama_memory_recurrent``'s buffer line (``%10s RS buffer size = %8.2f MiB``), with the exact bytes."""
    return f"llama_memory_recurrent: {name:>10s} RS buffer size = {nbytes / MIB:8.2f} MiB ({nbytes} bytes)"


@dataclass(eq=False)
class RecurrentMemory:
    """The R and S tensors of the recurrent layers (``layers``, in order), their buffers and sizes.

    ``mem_size`` rows per tensor and sequence slot (``n_rs_seq`` more slots for rollback); for a graph,
    :attr:`head`, :attr:`n_rs` and :attr:`rs_z` are those of ``llama_memory_recurrent_context``: a
    reserve (``init_full``) sees every cell from 0 and clears cell 0."""

    r: list[Tensor]
    s: list[Tensor]
    layers: tuple[int, ...]
    mem_size: int
    n_seq_max: int
    n_layer: int
    n_embd_r: int
    n_embd_s: int
    buffers_bytes: dict[str, int]
    layer_devices: list[tuple[int, str]]
    n_rs_seq: int = 0
    group: str = GROUP_RS
    head: int = 0
    n_rs: int = field(default=0)
    rs_z: int = 0

    def __post_init__(self) -> None:
        if self.n_rs == 0:
            self.n_rs = self.mem_size

    def holds(self, il: int) -> bool:
        return il in self.layers

    def r_of(self, il: int) -> Tensor:
        return self.r[self.layers.index(il)]

    def s_of(self, il: int) -> Tensor:
        return self.s[self.layers.index(il)]

    @property
    def tensors(self) -> list[Tensor]:
        return [*self.r, *self.s]

    @property
    def size_r_bytes(self) -> int:
        return sum(t.nbytes for t in self.r)

    @property
    def size_s_bytes(self) -> int:
        return sum(t.nbytes for t in self.s)

    @property
    def total_bytes(self) -> int:
        return sum(self.buffers_bytes.values())

    def log_lines(self) -> list[str]:
        """The buffer lines, then the size line of ``llama_memory_recurrent``'s constructor."""
        r, s = self.size_r_bytes, self.size_s_bytes
        return [*(rs_buffer_line(n, b) for n, b in self.buffers_bytes.items()),
                f"llama_memory_recurrent: size = {(r + s) / MIB:7.2f} MiB ({self.mem_size:6d} cells, "
                f"{self.n_layer:3d} layers, {self.n_seq_max:2d} seqs {self.n_rs_seq:2d} rs_seq), "
                f"R (f32): {r / MIB:7.2f} MiB, S (f32): {s / MIB:7.2f} MiB"]

    def info(self) -> dict[str, object]:
        """The sizes as the oracle's ``ORACLE rs`` line names them."""
        return {"size_r_bytes": self.size_r_bytes, "size_s_bytes": self.size_s_bytes, "cells": self.mem_size,
                "layers": self.n_layer, "n_seq_max": self.n_seq_max, "n_rs_seq": self.n_rs_seq,
                "type_r": "f32", "type_s": "f32", "n_embd_r": self.n_embd_r, "n_embd_s": self.n_embd_s}


def make_recurrent_memory(model: LoadedModel, n_seq_max: int, *, offload: bool, layers: list[int],
                          n_rs_seq: int = 0) -> RecurrentMemory:
    """``llama_memory_recurrent(model, F32, F32, offload, max(1, n_seq_max), n_seq_max, n_rs_seq, filter)``."""
    hp = model.hparams
    devs = model.devices
    mem_size = max(1, n_seq_max)
    n_rows = mem_size * (1 + n_rs_seq)
    rs: list[Tensor] = []
    ss: list[Tensor] = []
    sizes: dict[str, int] = {}
    bufts: dict[str, BufferType] = {}
    names: list[str] = []
    where: list[tuple[int, str]] = []
    for il in layers:
        d = model.layer_dev[il]
        buft = devs.gpus[d].buft if (offload and d >= 0) else devs.cpu_buft
        bufts[buft.name] = buft
        names.append(buft.name)
        where.append((il, model.layer_device_name(il) if offload else "CPU"))
        r = Tensor(F32, (hp.n_embd_r(), n_rows), name=f"cache_r_l{il}")
        s = Tensor(F32, (hp.n_embd_s(), n_rows), name=f"cache_s_l{il}")
        for t in (r, s):
            n = buft.alloc_size(t)
            sizes[buft.name] = sizes.get(buft.name, 0) + -(-n // buft.alignment) * buft.alignment
        rs.append(r)
        ss.append(s)
    ordered = {n: sizes[n] for n in sorted(sizes)}   # std::map by ggml_backend_buft_name
    buffers = {n: Buffer(bufts[n], b, BufferUsage.ANY, n) for n, b in ordered.items()}
    for r, s, name in zip(rs, ss, names):
        r.buffer = s.buffer = buffers[name]
    return RecurrentMemory(rs, ss, tuple(layers), mem_size, n_seq_max, hp.n_layer, hp.n_embd_r(), hp.n_embd_s(),
                           ordered, where, n_rs_seq)
