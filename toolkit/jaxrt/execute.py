"""Run a scheduled graph: splits in order, split inputs copied between devices
(``ggml_backend_sched_compute_splits``); :class:`GraphRunner` does it.

Each split runs as one compiled executable on its backend's JAX device. Before a split runs,
its inputs are copied onto its device: the byte range of the source (a view keeps its
source's strides, so the copy is the span ``nbytes(src)`` from the view's offset, as
``ggml_backend_sched_split_graph`` makes copies with ``ggml_dup_tensor_layout``).
Host weights that op offload sent to an accelerator are split inputs too, so they are copied
on every evaluation (``ggml_backend_sched_backend_id_from_cur``'s op-offload rule). Dispatch is
asynchronous: nothing waits between splits or between ubatches, so under pipeline parallelism
(n_copies rotating through ``cur_copy``) devices overlap.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from toolkit.ggml.tensor import Op, Tensor
from toolkit.jaxrt import layout
from toolkit.jaxrt.compile import CompileCache, CompiledSplit, SplitProgram, base_of, default_cache
from toolkit.jaxrt.kernels import as_f32
from toolkit.jaxrt.operands import CPU_NUMERICS, Numerics
from toolkit.models.moe import ExpertTransfer, expert_copy_bytes, used_expert_ranges
from toolkit.sched import Scheduler


@dataclass
class SplitSpec:
    """A split as the executor needs it: backend, nodes, and (source, copy) pairs to fill first."""

    backend_id: int
    nodes: list[Tensor]
    copies: list[tuple[Tensor, Tensor]] = field(default_factory=list)


@dataclass
class PreparedSplit:
    spec: SplitSpec
    program: SplitProgram
    compiled: CompiledSplit
    cache_hit: bool
    device: Any

    def summary(self) -> dict[str, Any]:
        c = self.compiled
        return {
            "backend_id": self.spec.backend_id, "device": str(self.device), "n_nodes": len(self.spec.nodes),
            "n_inputs": len(self.spec.copies), "signature": self.program.signature[:12],
            "status": "cache hit" if self.cache_hit else ("compiled (disk cache)" if c.from_disk else "compiled"),
            "compile_ms": round(c.compile_ms, 3),
            "temp_bytes": c.temp_bytes, "argument_bytes": c.argument_bytes, "output_bytes": c.output_bytes,
            "flops": c.flops,
        }


@dataclass
class PreparedGraph:
    """An allocated graph's compiled splits, its KV tensors and where each graph input goes."""

    graph: Any
    splits: list[PreparedSplit]
    kv: set[Tensor]
    input_devices: dict[Tensor, Any]
    outputs: list[Tensor]


@dataclass
class RunStats:
    n_splits: int = 0
    n_copies: int = 0
    copy_bytes: int = 0
    weight_copies: int = 0
    weight_copy_bytes: int = 0
    implicit_transfers: int = 0
    dispatch_ms: float = 0.0
    expert_transfers: list[ExpertTransfer] = field(default_factory=list)


def device_of(x: jax.Array) -> Any:
    return next(iter(x.devices()))


def region(flat: jax.Array, src: Tensor) -> jax.Array:
    """The storage span a copy of ``src`` holds: ``nbytes(src)`` from src's offset in its base."""
    u = layout.unit_size(src.type)
    start = (src.view_offs if src.view_src is not None else 0) // u
    n = layout.storage_units(src)
    if start == 0 and n == flat.shape[0]:
        return flat
    return flat[start:start + n]


def _expert_user(spec: SplitSpec, copy: Tensor) -> Tensor | None:
    """The split's first node when it is a MUL_MAT_ID reading ``copy`` as its experts (llama's
    sched_copy_experts looks only at ``split->graph.nodes[0]``)."""
    node = spec.nodes[0] if spec.nodes else None
    if node is not None and node.op is Op.MUL_MAT_ID and node.src[0] is copy:
        return node
    return None


def sched_copy_experts(spec: SplitSpec, k: int, src: Tensor, copy: Tensor, node: Tensor, flat: jax.Array,
                       values: dict[Tensor, jax.Array], dev: Any) -> tuple[jax.Array, ExpertTransfer]:
    """llama's copy callback for host experts (``ggml_backend_sched_set_copy_callback``): read the ids
    the router chose, and copy only those experts (consecutive ids in one transfer, plus 512 bytes of
    padding unless the run ends at the last expert) into the full-size split input. The rest of the
    copy is never read by the MUL_MAT_ID."""
    ids_t = node.src[2]
    assert ids_t is not None
    # the ids may be a later input of this split that is not copied yet: read its source then
    ids_src = next((s for s, c in spec.copies if c is ids_t), ids_t)
    ids = np.asarray(layout.read(values[base_of(ids_src)], ids_src)).reshape(-1)  # waits for the router
    n_expert = src.ne[2]
    expert_size = src.nb[2]
    runs = used_expert_ranges(ids.tolist(), n_expert)
    u = layout.unit_size(src.type)
    part = region(flat, src)
    out = jnp.zeros(part.shape, part.dtype, device=dev)
    for first, last in runs:
        lo = first * expert_size // u
        hi = min((last + 1) * expert_size + (min(expert_size, 512) if last < n_expert - 1 else 0), src.nbytes) // u
        out = out.at[lo:hi].set(jax.device_put(part[lo:hi], dev))
    nbytes = expert_copy_bytes(runs, expert_size, n_expert)
    used = tuple(sorted({int(i) for i in ids}))
    return out, ExpertTransfer(k, src.name, src.nbytes, nbytes, used, tuple(runs))


def to_host(flat: jax.Array, t: Tensor) -> np.ndarray:
    """A tensor's logical value as numpy (f32 for float types), for callers and tests."""
    if t.view_src is None and t.type.name in ("F32", "I32") and t.is_contiguous:
        # a packed f32/i32 result: no device op, one host copy
        return np.asarray(flat).reshape(t.ne[3], t.ne[2], t.ne[1], t.ne[0])
    x = layout.read(flat, t)
    return np.asarray(x if t.type.name in ("I32", "I64") else as_f32(x, t.type))


def scheduler_splits(sched: Scheduler) -> list[SplitSpec]:
    """The allocated graph's splits with their (source, copy for cur_copy) pairs
    (``ggml_backend_sched_split_graph`` pass 5)."""
    return [SplitSpec(sp.backend_id, list(sp.nodes), sched.split_input_pairs(sp)) for sp in sched.splits]


class GraphRunner:
    """Runs scheduled graphs on the backends' JAX devices (``ggml_backend_sched_graph_compute``).

    It holds the tensors that have a ``buffer`` (weights, KV cache), each on the JAX device of the
    backend that owns its buffer type (host buffer types: the CPU), and a compile cache. A scheduled
    graph's splits are compiled once per signature and device (:meth:`prepare_splits`,
    :meth:`prepare_graph`) and dispatched in order, split inputs copied first (:meth:`run_splits`,
    :meth:`run_graph`). The KV cache is carried between calls; graph inputs are copied from the host
    on each call.
    """

    def __init__(self, backends: Sequence[Any], cache: CompileCache | None = None,
                 numerics: Numerics = CPU_NUMERICS) -> None:
        self.backends = list(backends)
        self.numerics = numerics
        cpu = jax.local_devices(backend="cpu")[0]
        self.devices = [b.executor if b.executor is not None else cpu for b in self.backends]
        self.cache = cache if cache is not None else default_cache()
        self.store: dict[Tensor, jax.Array] = {}
        self.last_splits: list[PreparedSplit] = []
        self.last_stats = RunStats()

    def device_for(self, t: Tensor) -> Any:
        """The device of the backend owning t's buffer type; host buffer types live on the CPU."""
        buft = getattr(t.buffer, "buft", None)
        for b, dev in zip(self.backends, self.devices):
            if b.buft is buft:
                return dev
        if buft is None or getattr(buft, "is_host", False):
            return self.devices[-1]
        for b, dev in zip(self.backends, self.devices):
            # a buft a backend reads as its own (the CPU's repack buffer)
            if any(buft is r for r in getattr(b.profile, "readable_bufts", ())):
                return dev
        raise ValueError(f"tensor {t.name!r} lives in buffer type {buft.name!r}, which no backend owns "
                         f"(backends: {', '.join(b.name for b in self.backends)})")

    def set_tensor(self, t: Tensor, data: np.ndarray) -> None:
        """Place a weight (or a KV tensor's contents) on its device."""
        flat = layout.host_storage(t, np.asarray(data))
        if flat.shape[0] != layout.storage_units(t):
            raise ValueError(f"{t.name!r}: got {flat.shape[0]} storage units, the tensor holds "
                             f"{layout.storage_units(t)} ({t.type.name} {list(t.ne)})")
        self.store[t] = jax.device_put(flat, self.device_for(t))

    def persistent(self, t: Tensor) -> jax.Array:
        x = self.store.get(t)
        if x is None:
            if t.is_weight:
                if t.data is None:
                    raise ValueError(f"weight {t.name!r} has no data: load a GGUF file or call set_tensor")
                self.set_tensor(t, t.data)
            else:  # a KV cache starts zeroed, as llama.cpp clears its buffer
                dev = self.device_for(t)
                self.store[t] = jax.device_put(
                    np.zeros(layout.storage_units(t), np.dtype(layout.storage_dtype(t.type))), dev)  # type: ignore[call-overload]
            x = self.store[t]
        return x

    def reset_kv(self) -> None:
        for t in [t for t in self.store if not t.is_weight]:
            del self.store[t]

    def prepare_splits(self, splits: Sequence[SplitSpec], keep: set[Tensor], donate: set[Tensor] | None = None
                       ) -> list[PreparedSplit]:
        """Programs and executables for each split. ``keep``: bases needed after the graph
        (outputs, KV cache); a split also keeps whatever later splits read."""
        first = [SplitProgram.build(s.nodes, keep=set()) for s in splits]
        later: set[Tensor] = set(keep)
        keeps: list[set[Tensor]] = []
        for s, p in zip(reversed(splits), reversed(first)):
            keeps.append(set(later))
            later |= set(p.inputs) | {base_of(src) for src, _ in s.copies}
        keeps.reverse()
        out: list[PreparedSplit] = []
        here = jax.process_index()
        for s, k in zip(splits, keeps):
            prog = SplitProgram.build(s.nodes, keep=k, donate=donate, numerics=self.numerics)
            dev = self.devices[s.backend_id]
            if getattr(dev, "process_index", here) != here:
                raise ValueError(f"split on {dev} belongs to JAX process {dev.process_index}; process {here} "
                                 f"runs only its own devices (run one scheduler per process)")
            compiled, hit = self.cache.get(prog, dev)
            out.append(PreparedSplit(s, prog, compiled, hit, dev))
        return out

    def run_splits(self, prepared: Sequence[PreparedSplit], values: dict[Tensor, jax.Array],
                   stats: RunStats | None = None) -> dict[Tensor, jax.Array]:
        """Dispatch every split in order; ``values`` (base -> flat storage) is updated and returned."""
        st = stats if stats is not None else RunStats()
        t0 = time.perf_counter()
        for k, ps in enumerate(prepared):
            dev = ps.device
            for src, copy in ps.spec.copies:
                flat = values[base_of(src)]
                user = _expert_user(ps.spec, copy) if src.is_weight and src.buffer.buft.is_host else None
                if user is not None:
                    values[copy], tr = sched_copy_experts(ps.spec, k, src, copy, user, flat, values, dev)
                    st.expert_transfers.append(tr)
                    st.n_copies += 1
                    st.copy_bytes += tr.transfer_bytes
                    st.weight_copies += 1
                    st.weight_copy_bytes += tr.transfer_bytes
                    continue
                part = region(flat, src)
                if part is flat and device_of(flat) == dev:
                    # two backends on one device (simulated ones sharing it): the copy must not
                    # alias a buffer that a later split donates (the KV cache)
                    part = jnp.copy(flat)
                values[copy] = jax.device_put(part, dev)
                nbytes = src.nbytes
                st.n_copies += 1
                st.copy_bytes += nbytes
                if src.is_weight:
                    st.weight_copies += 1
                    st.weight_copy_bytes += nbytes
            args = []
            for b in ps.program.inputs:
                try:
                    x = values[b]
                except KeyError:
                    raise KeyError(f"split on {dev} reads {b.name!r}, which has no value "
                                   f"(not a weight, KV cache, graph input or earlier result)") from None
                if device_of(x) != dev:
                    # a buffer the split's backend can read without a scheduler copy (host memory)
                    x = jax.device_put(x, dev)
                    st.implicit_transfers += 1
                args.append(x)
            outs = ps.compiled.executable(*args)
            for b, y in zip(ps.program.outputs, outs):
                values[b] = y
            st.n_splits += 1
        st.dispatch_ms += (time.perf_counter() - t0) * 1e3
        return values


    def prepare_graph(self, sched: Any, graph: Any, outputs: Sequence[Tensor]) -> PreparedGraph:
        """Compile (or find in the cache) the splits of an allocated graph (``sched.alloc_graph`` done).

        The result holds no reference to the scheduler, so it can run again for the same graph
        (llama.cpp's graph reuse) until the scheduler is rebuilt."""
        kv = {leaf for leaf in graph.leafs if leaf.buffer is not None and not leaf.is_weight}
        devs = {}
        for leaf in graph.leafs:
            if leaf.is_input:
                bid = sched.tensor_backend_id(leaf)
                devs[leaf] = self.devices[bid] if bid >= 0 else self.devices[-1]
        keep = {base_of(o) for o in outputs} | kv
        splits = self.prepare_splits(scheduler_splits(sched), keep, donate=kv)
        return PreparedGraph(graph, splits, kv, devs, list(outputs))

    def run_graph(self, pg: PreparedGraph, inputs: dict[Tensor, np.ndarray]) -> dict[Tensor, jax.Array]:
        """Set the inputs and dispatch every split; returns the outputs' base storage (futures:
        nothing blocks, so consecutive ubatches overlap). The KV cache is carried in the store."""
        values: dict[Tensor, jax.Array] = {}
        for leaf in pg.graph.leafs:
            if leaf.buffer is not None:
                values[leaf] = self.persistent(leaf)
        for t, v in inputs.items():
            values[t] = jax.device_put(layout.host_storage(t, np.asarray(v)), pg.input_devices.get(t, self.devices[-1]))
        self.last_splits = pg.splits
        self.last_stats = RunStats()
        self.run_splits(pg.splits, values, self.last_stats)
        for t in pg.kv:
            self.store[t] = values[t]
        return {o: values[base_of(o)] for o in pg.outputs}

    def execute(self, sched: Any, graph: Any, inputs: dict[Tensor, np.ndarray], outputs: Sequence[Tensor]
                ) -> dict[Tensor, jax.Array]:
        """:meth:`prepare_graph` then :meth:`run_graph`."""
        return self.run_graph(self.prepare_graph(sched, graph, outputs), inputs)

    def read(self, flat: jax.Array, t: Tensor) -> np.ndarray:
        return to_host(flat, t)

    def splits_text(self) -> str:
        lines = []
        for i, ps in enumerate(self.last_splits):
            d = ps.summary()
            be = self.backends[ps.spec.backend_id].name
            na = "unavailable"
            lines.append(
                f"split #{i}: {be:<8s} nodes={d['n_nodes']:<4d} inputs={d['n_inputs']:<3d} {d['status']:<21s} "
                f"{d['compile_ms']:8.1f} ms  temp={d['temp_bytes'] if d['temp_bytes'] is not None else na} "
                f"args={d['argument_bytes'] if d['argument_bytes'] is not None else na} "
                f"out={d['output_bytes'] if d['output_bytes'] is not None else na} "
                f"flops={d['flops'] if d['flops'] is not None else na}")
        return "\n".join(lines)
