"""What ``llama_init_from_model`` sets up before the first ``sched_reserve`` (the ``llama_context`` constructor).

:func:`setup` turns a model description and context parameters into a :class:`ContextSetup`:
devices and backends, the placed weights, the memory (KV caches), the output buffer, the
pipeline-parallel decision and the architecture's graph builder. The graph callback's scheduler
pins (:func:`apply_pins`) live here too.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from toolkit.backend import Backend, profiles
from toolkit.errors import ParameterError
from toolkit.ggml.bulk import paused_gc
from toolkit.ggml.tensor import Tensor
from toolkit.models import archs, overrides
from toolkit.models.cparams import ContextParams, ResolvedParams
from toolkit.models.devices import DeviceSet, cpu_repack_buft, make_devices
from toolkit.models.graph import GraphBuilder, GraphResult
from toolkit.models.hparams import HParams
from toolkit.models.loader import LoadedModel, check_kv_types, load_model, output_buffer
from toolkit.models.memory import Memory, create_memory

if TYPE_CHECKING:
    from toolkit.sched import Scheduler

# ubatches smaller than this get the norm pin even without full offload (llama_context::graph_get_cb)
NORM_PIN_MAX_TOKENS = 32


def devices_from_backends(backends: list[Backend]) -> DeviceSet:
    """A DeviceSet over caller-made backends (GPUs first, ACCELs, the CPU last).

    The caller's backends are left as they are: the CPU backend of the set is a new one over a
    copy of the caller's CPU profile that also reads the CPU device's own buft and its repack buft
    (as ggml-cpu's supports_buft does).
    """
    if not backends or not backends[-1].is_cpu:
        raise ParameterError("devices", backends[-1].name if backends else "[]", "a backend list ending with the CPU")
    given = backends[-1]
    gpus = [b for b in backends[:-1] if b.kind == "gpu"]
    accels = [b for b in backends[:-1] if b.kind == "accel"]
    own = given.buft if not gpus else profiles.cpu_buft()
    repack = cpu_repack_buft()
    profile = copy.copy(given.profile)
    profile.readable_bufts = (*given.profile.readable_bufts, own, repack)
    cpu = Backend(given.name, profile, given.buft, given.executor, given.index)
    return DeviceSet(gpus, accels, cpu, own, repack, [b.name for b in gpus])


@dataclass
class ContextSetup:
    """A loaded model in a context: placement, memory, output buffer, builder, pipeline decision."""

    hparams: HParams
    cparams: ContextParams
    resolved: ResolvedParams
    devices: DeviceSet
    model: LoadedModel
    memory: Memory                     # llama_model::create_memory's caches (and their cells)
    output_bytes: dict[str, int]
    flash_attn: bool                   # what the graphs use (auto starts on, the probe may turn it off)
    pipeline_parallel: bool
    pp_check: dict[str, object] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # logged while loading and creating the memory
    warned: bool = False               # the warnings went into a ReserveEvent already
    # the first build of each graph shape; build_graph hands out copies of it, never the graph itself
    graphs: dict[tuple[bool, int, int, int, tuple[int, int] | None, tuple[int, int, int] | None], GraphResult] = field(
        default_factory=dict, repr=False, compare=False)

    @property
    def backends(self) -> list[Backend]:
        return self.devices.backends

    def builder(self, graph_size: int) -> GraphBuilder:
        """The architecture's graph builder (``llama_model::build_graph``) over this setup's model and memory."""
        return archs.get(self.hparams.arch).make_builder(self.model, self.memory, flash_attn=self.flash_attn,
                                                         graph_size=graph_size)

    def graph_max_nodes(self, n_tokens: int) -> int:
        """``llama_context::graph_max_nodes(n_tokens)``: the architecture's rule over the loaded model's
        tensor count (:meth:`toolkit.models.archs.Architecture.graph_max_nodes`)."""
        return archs.get(self.hparams.arch).graph_max_nodes(self.model.n_tensors, n_tokens)

    def _graph_key(self, n_tokens: int, n_seqs: int, n_outputs: int, streams: tuple[int, int] | None
                   ) -> tuple[bool, int, int, int, tuple[int, int] | None, tuple[int, int, int] | None]:
        # a hybrid's graph also depends on the recurrent slot of the ubatch being run (head, n, rs_z)
        return (self.flash_attn, n_tokens, n_seqs, n_outputs, streams, self.memory.slot_key())

    def _first_build(self, graph_size: int, n_tokens: int, n_seqs: int, n_outputs: int,
                     streams: tuple[int, int] | None = None) -> GraphResult:
        """The kept build of this shape (:meth:`_shared_build`'s, else a real one); a graph_size too small
        for it raises GraphFull from a real build, which names the node or leaf that did not fit."""
        key = self._graph_key(n_tokens, n_seqs, n_outputs, streams)
        lg = self.graphs.get(key)
        if lg is None or lg.graph.n_nodes > graph_size or lg.graph.n_leafs > graph_size:
            built = self._shared_build(graph_size, n_tokens, n_seqs, n_outputs) if lg is None and streams is None \
                else None
            if built is None:
                built = self.builder(graph_size).build(n_tokens, n_seqs, n_outputs, streams)
                if streams is None:
                    self._keep_build(graph_size, n_tokens, n_seqs, n_outputs, built)
            lg = self.graphs.setdefault(key, built)
        return lg

    def build_graph(self, graph_size: int, n_tokens: int, n_seqs: int, n_outputs: int,
                    streams: tuple[int, int] | None = None) -> GraphResult:
        """``builder(graph_size).build(...)``. A build depends only on this setup, the shape and the
        recurrent slot, so the first build of each is kept and later calls get a copy of it (new tensors,
        the same graph)."""
        with paused_gc():   # thousands of new objects that all stay alive: see toolkit.ggml.bulk
            return self._first_build(graph_size, n_tokens, n_seqs, n_outputs, streams).copy(graph_size)

    def lent_graph(self, graph_size: int, n_tokens: int, n_seqs: int, n_outputs: int) -> GraphResult:
        """The kept build of this shape itself (:meth:`GraphResult.lend`), not a copy, for
        ``llama_context::graph_reserve``: the scheduler splits it in place, and it stays split (what the
        scheduler's last assignment reads) until the next reserve of this shape lends it again. Copies
        of it (:meth:`build_graph`, another setup's :meth:`_shared_build`) copy it as built."""
        with paused_gc():
            return self._first_build(graph_size, n_tokens, n_seqs, n_outputs).lend(graph_size)

    def graph_counts(self, graph_size: int, n_tokens: int, n_seqs: int, n_outputs: int) -> tuple[int, int]:
        """(n_nodes, n_leafs) of :meth:`build_graph`'s graph, without copying it; GraphFull as there."""
        t = _BUILDS.get(self._build_key(graph_size, n_tokens, n_seqs, n_outputs))
        g = t[1].graph if t is not None and t[0] is self.hparams else \
            self._first_build(graph_size, n_tokens, n_seqs, n_outputs).graph
        return g.n_nodes, g.n_leafs

    # ---- builds shared between setups of one model (memory fitting's probes) --------------------
    def _build_key(self, graph_size: int, n_tokens: int, n_seqs: int, n_outputs: int) -> tuple[object, ...]:
        """What a build depends on besides where the weights and caches live: the model, the context
        params without the placement ones (-ngl, -ts, -ot, --cpu-moe, --n-cpu-moe, -mg, mmap), the
        resolved params, the graph size and the shape. The builders read shapes and types only, never
        a tensor's buffer or a layer's device (llama.cpp builds one graph whatever the placement)."""
        cp = self.cparams.replace(n_gpu_layers=0, tensor_split=None, override_tensor=(), cpu_moe=False,
                                  n_cpu_moe=0, main_gpu=0, use_mmap=True)
        rp = dataclasses.replace(self.resolved, source=cp)   # the resolved params keep the given ones
        return (id(self.hparams), cp, rp, graph_size, self._graph_key(n_tokens, n_seqs, n_outputs, None))

    def _allocated_by_name(self) -> dict[str, Tensor] | None:
        """This setup's weights and cache tensors by name (None when two share a name: rope_freqs'
        per-buffer-type copies), the tensors a build shares instead of creating."""
        m = self.model
        ts = [*m.tensors.values(), *([m.output] if m.output is not None else []), *m.rope_freqs.values(),
              *self.memory.tensors]
        out: dict[str, Tensor] = {}
        for t in ts:
            if out.setdefault(t.name, t) is not t:
                return None
        return out

    def _shared_build(self, graph_size: int, n_tokens: int, n_seqs: int, n_outputs: int) -> GraphResult | None:
        """The build of this shape an earlier setup of the same model and context made (:meth:`_build_key`),
        copied over this setup's weights and caches (each checked to have the name, type and shape of the
        tensor it replaces) and memory (the inputs read this setup's caches); None when there is none or
        something does not match."""
        t = _BUILDS.get(self._build_key(graph_size, n_tokens, n_seqs, n_outputs))
        if t is None or t[0] is not self.hparams:
            return None
        mine, memory = self._allocated_by_name(), _memory_map(t[2], self.memory)
        if mine is None or memory is None:
            return None
        try:
            return t[1].copy(graph_size, rebind=_rebinder(mine), memory=memory)
        except KeyError:
            return None

    def _keep_build(self, graph_size: int, n_tokens: int, n_seqs: int, n_outputs: int, lg: GraphResult) -> None:
        """Keep a real build for the next setups (never written: they and this setup copy it)."""
        if self._allocated_by_name() is None:
            return
        _BUILDS[self._build_key(graph_size, n_tokens, n_seqs, n_outputs)] = (self.hparams, lg, self.memory)
        while len(_BUILDS) > BUILDS_KEPT:
            _BUILDS.popitem(last=False)

    def sized_graph(self, graph_size: int, n_tokens: int, n_seqs: int, n_outputs: int) -> GraphResult:
        """A build of this shape for a caller that splits it once and drops it (``ggml_backend_sched_reserve_size``
        in memory fitting): the kept build itself when nothing else reads it, else a copy (of it, or
        :meth:`_shared_build`'s)."""
        with paused_gc():
            own = self.graphs.pop(self._graph_key(n_tokens, n_seqs, n_outputs, None), None)
            if own is None or own.graph.size != graph_size:
                shared = self._shared_build(graph_size, n_tokens, n_seqs, n_outputs)
                if shared is not None:
                    return shared
                own = self.builder(graph_size).build(n_tokens, n_seqs, n_outputs, None)
                self._keep_build(graph_size, n_tokens, n_seqs, n_outputs, own)
            if any(own is v[1] for v in _BUILDS.values()):
                return own.copy(graph_size)
            own.restore()   # it may have been lent to a reserve
            return own

    def layer_devices(self) -> list[tuple[int, str]]:
        return [(il, self.model.layer_device_name(il)) for il in range(self.hparams.n_layer_all + 1)]


# the builds setups share, by _build_key, with the memory their inputs read; each entry holds its HParams,
# so the id stays its own
_BUILDS: OrderedDict[tuple[object, ...], tuple[HParams, GraphResult, Memory]] = OrderedDict()
BUILDS_KEPT = 8


def _memory_map(old: Memory, new: Memory) -> dict[int, object] | None:
    """Each cache (and recurrent state) of ``old`` -> ``new``'s in the same place; None if they differ."""
    if len(old.caches) != len(new.caches) or (old.recurrent is None) != (new.recurrent is None):
        return None
    out: dict[int, object] = {id(a): b for a, b in zip(old.caches, new.caches)}
    if old.recurrent is not None:
        out[id(old.recurrent)] = new.recurrent
    return out


def _rebinder(mine: dict[str, Tensor]) -> Callable[[Tensor], Tensor]:
    def rebind(t: Tensor) -> Tensor:
        n = mine[t.name]
        if n.type is not t.type or n.ne != t.ne:
            raise KeyError(t.name)
        return n
    return rebind


def pipeline_parallel(hp: HParams, cp: ContextParams, devs: DeviceSet) -> tuple[bool, dict[str, object]]:
    """The ``llama_context`` constructor's pipeline-parallelism condition: more than one model device,
    every layer and the output offloaded, split mode layer, KV offloaded, and every non-CPU backend
    with async compute and events (the last check is the one ``force_pipeline_parallel`` skips, like
    the oracle's ORACLE_FORCE_PP)."""
    caps = all(b.caps_async and b.caps_events for b in [*devs.gpus, *devs.accels])
    # llama_model::has_tensor_overrides: any -ot / --cpu-moe / --n-cpu-moe item, matched or not
    overridden = bool(cp.override_tensor or cp.cpu_moe or cp.n_cpu_moe > 0)
    check: dict[str, object] = {
        "n_devices": len(devs.gpus), "n_gpu_layers": cp.n_gpu_layers, "n_layer_all": hp.n_layer_all,
        "split_mode": cp.split_mode, "offload_kqv": cp.offload_kqv, "has_tensor_overrides": overridden,
        "caps_async_events": caps, "force": cp.force_pipeline_parallel,
    }
    ok = (len(devs.gpus) > 1 and cp.n_gpu_layers > hp.n_layer_all and cp.split_mode == "layer" and cp.offload_kqv
          and not overridden and (caps or cp.force_pipeline_parallel))
    check["pipeline_parallel"] = ok
    return ok, check


def setup(hp: HParams, cp: ContextParams, backends: list[Backend] | None = None,
          devs: DeviceSet | None = None) -> ContextSetup:
    """Load the model onto devices and create the memory, raising ToolkitError where llama.cpp refuses.

    ``devs`` keeps the backends of an earlier setup (a scheduler can only be reused over the same backends).
    """
    arch = archs.checked(hp)   # UnsupportedFeature / ToolkitError: what load_arch_tensors refuses
    rp = cp.resolve(hp.n_ctx_train)
    if devs is None:
        devs = make_devices(cp.devices, split_mode=cp.split_mode, main_gpu=cp.main_gpu) if backends is None \
            else devices_from_backends(list(backends))
    fa = cp.flash_attn != "off"
    check_kv_types(hp, rp, fa)
    model = load_model(hp, cp, devs, arch.weights(hp), tied_output_first=arch.tied_output_first)
    memory = create_memory(model, rp, offload_kqv=cp.offload_kqv, flash_attn=fa, swa_full=cp.swa_full,
                           unified=cp.kv_unified, kind=arch.memory)
    warnings = list(memory.warnings)
    if rp.n_ctx_seq > hp.n_ctx_train:
        # llama_context's constructor warns and goes on
        warnings = [f"llama_context: n_ctx_seq ({rp.n_ctx_seq}) > n_ctx_train ({hp.n_ctx_train}) -- "
                    "possible training context overflow", *warnings]
    n_ctx_padded = -(-(cp.n_ctx if cp.n_ctx > 0 else hp.n_ctx_train) // 256) * 256
    if not cp.kv_unified and rp.n_ctx != n_ctx_padded:
        warnings = [f"llama_context: n_ctx is not divisible by n_seq_max - rounding down to {rp.n_ctx}", *warnings]
    yarn = hp.rope_scaling.warning() if hp.rope_scaling is not None else None
    if yarn is not None:   # the constructor sets the YaRN factors before it checks n_ctx
        warnings = [yarn, *warnings]
    pp, check = pipeline_parallel(hp, cp, devs)
    # llama_model_loader warns before the memory is created
    warnings = [*overrides.warnings(model.override_rules, model.tensor_overrides, cp.use_mmap), *model.warnings,
                *warnings]
    return ContextSetup(hp, cp, rp, devs, model, memory, output_buffer(model, rp), fa, pp, check, warnings)


def apply_pins(sched: Scheduler, lg: GraphResult, st: ContextSetup) -> int:
    """The graph callback's ``ggml_backend_sched_set_tensor_backend`` calls
    (``llama_context::graph_get_cb``); returns how many.

    - ``norm-<il>`` goes to layer il's device when the ubatch is small or every layer is offloaded,
      so it is not expanded from the previous layer's device (which would cost an extra cross-device split input);
    - with ``-nkvo``, the merged attention heads (``kqv_merged_cont``, the CONT of the non-FA path,
      later renamed ``kqv_out``) go to the CPU, so the whole KQ → softmax → KQV chain runs there
      (the flash-attention path names no such tensor, so its FLASH_ATTN_EXT follows the layer).
    """
    n = 0
    cpu = len(sched.backends) - 1
    full_offload = st.cparams.n_gpu_layers > st.hparams.n_layer_all   # llama_context::graph_get_cb
    if lg.n_tokens < NORM_PIN_MAX_TOKENS or full_offload:
        for t, il in lg.norms:
            dev = st.model.layer_backend(il)
            for i, be in enumerate(sched.backends):
                if be is dev and be.supports_op(t):
                    sched.set_tensor_backend(t, i)
                    n += 1
    if not st.cparams.offload_kqv:
        for t, name, _il in lg.named:
            if name == "kqv_merged_cont":
                sched.set_tensor_backend(t, cpu)
                n += 1
    return n
