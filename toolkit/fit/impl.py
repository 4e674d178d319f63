"""``common_fit_params`` → ``common_params_fit_impl``, step by step (see :mod:`toolkit.fit`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from toolkit.args import N_GPU_LAYERS_AUTO, LlamaArgs, fit_targets_bytes
from toolkit.errors import ToolkitError
from toolkit.fit.probe import Probe, ProbeParams, probe
from toolkit.fit.result import FitPrint, FitResult, Fitted
from toolkit.memory import DeviceMemory, MiB, device_memory, strip_budget
from toolkit.models.cparams import DEFAULT_N_GPU_LAYERS
from toolkit.models.devices import make_devices
from toolkit.models.hparams import HParams

# common_layer_fraction_t: which part of the first partial layer of a device overflows
LAYER_FRACTION_NONE, LAYER_FRACTION_ATTN, LAYER_FRACTION_UP, LAYER_FRACTION_GATE, LAYER_FRACTION_MOE = range(5)
# common_params_fit_impl: the override that sends every expert tensor to system memory
PATTERN_MOE_ALL = "blk\\.\\d+\\.ffn_(up|down|gate_up|gate)_(ch|)exps"
MAX_OVERFLOW_LAYERS = 1000       # get_overflow_pattern keeps at most this many patterns per kind
MAX_TENSOR_BUFT_OVERRIDES = 4096  # llama_max_tensor_buft_overrides()
FIT_PREFIX = "common_params_fit_impl: "


def overflow_pattern(il: int, fraction: int) -> str:
    """``get_overflow_pattern``: the tensors of layer ``il`` that leave the device for ``fraction``.

    ATTN also matches the router ``ffn_gate_inp``, and ``il`` may be ``n_layer`` (matches nothing).
    """
    if il >= MAX_OVERFLOW_LAYERS:
        raise ToolkitError(f"at most {MAX_OVERFLOW_LAYERS} model layers are supported")
    if fraction == LAYER_FRACTION_ATTN:
        return f"blk\\.{il}\\.ffn_(gate|up|gate_up|down).*"
    if fraction == LAYER_FRACTION_UP:
        return f"blk\\.{il}\\.ffn_(gate|gate_up|down).*"
    if fraction == LAYER_FRACTION_GATE:
        return f"blk\\.{il}\\.ffn_down.*"
    if fraction == LAYER_FRACTION_MOE:
        return f"blk\\.{il}\\.ffn_(up|down|gate_up|gate)_(ch|)exps"
    raise ValueError(f"layer fraction {fraction} has no overflow pattern")


class _FitAbort(Exception):
    """common_params_fit_exception: fitting stops, the parameters stay as far as they got."""


@dataclass
class LayerCount:
    """``ngl_t``: layers on one device, how many of them partial, and the first one's overflow."""

    n_layer: int = 0
    n_part: int = 0
    overflow_type: int = LAYER_FRACTION_MOE

    @property
    def n_full(self) -> int:
        return self.n_layer - self.n_part

    def copy(self) -> LayerCount:
        return LayerCount(self.n_layer, self.n_part, self.overflow_type)


def n_expert(hp: HParams) -> int:
    """``llama_model_n_expert``: 0 for a dense model (``HParams.moe`` describes the experts)."""
    moe = getattr(hp, "moe", None)   # the MoE hyperparameters, where HParams has them
    return int(moe.n_expert) if moe is not None else 0


def override_items(args: LlamaArgs, ot: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """The user's ``-ot`` items followed by fit's, as ``REGEX=BUFT`` strings."""
    return args.override_tensor + tuple(f"{p}={b}" for p, b in ot)


def set_ngl_tensor_split_tbo(per_dev: Sequence[LayerCount], overflow_bufts: Sequence[str], n_layer: int
                             ) -> tuple[int, tuple[float, ...] | None, tuple[tuple[str, str], ...]]:
    """``set_ngl_tensor_split_tbo``: layers per device → ``-ngl``, ``-ts`` (several devices) and ``-ot``.

    The GPU layers are the last ``ngl`` of ``n_layer + 1`` (the output layer counts), contiguous per
    device in device order; each device's partial layers come after its full ones: the first uses
    the device's overflow type and buffer type, the others send their experts to the CPU (MOE).
    """
    ngl = sum(n.n_layer for n in per_dev)
    ts = tuple(float(n.n_layer) for n in per_dev) if len(per_dev) > 1 else None
    il0 = n_layer + 1 - ngl
    ot: list[tuple[str, str]] = []
    for d, n in enumerate(per_dev):
        il0 += n.n_full
        for il in range(il0, il0 + n.n_part):
            if len(ot) + 1 >= MAX_TENSOR_BUFT_OVERRIDES:
                raise _FitAbort(f"llama_max_tensor_buft_overrides() == {MAX_TENSOR_BUFT_OVERRIDES} is insufficient "
                                "for model")
            first = il == il0
            ot.append((overflow_pattern(il, n.overflow_type if first else LAYER_FRACTION_MOE),
                       overflow_bufts[d] if first else "CPU"))
        il0 += n.n_part
    return ngl, ts, tuple(ot)


@dataclass
class _Fit:
    hp: HParams
    args: LlamaArgs
    memory: list[DeviceMemory]
    margins: list[int]
    n_ctx_min: int
    exact: bool
    host: DeviceMemory | None = None
    log: list[str] = field(default_factory=list)
    probes: list[Probe] = field(default_factory=list)
    # the parameters as common_params_fit_impl edits them in place
    n_ctx: int = 0
    ngl: int = N_GPU_LAYERS_AUTO
    ts: tuple[float, ...] | None = None
    ot: tuple[tuple[str, str], ...] = ()
    used_final: list[int] = field(default_factory=list)

    def trc(self, text: str) -> None:
        self.log.append(FIT_PREFIX + text)

    @property
    def nd(self) -> int:
        return len(self.memory)

    @property
    def dev_names(self) -> list[str]:
        names = [f"{m.name} ({m.description})" for m in self.memory]
        w = max((len(n) for n in names), default=0)
        return [n.ljust(w) for n in names]

    def measure(self, *, n_ctx: int | None = None, ngl: int | None = None, ts: tuple[float, ...] | None | str = "cur",
                ot: tuple[tuple[str, str], ...] | None = None) -> Probe:
        n_ctx = self.n_ctx if n_ctx is None else n_ctx
        ngl = self.ngl if ngl is None else ngl
        tsv = self.ts if isinstance(ts, str) else ts
        otv = self.ot if ot is None else ot
        cp = self.args.context_params(n_ctx=n_ctx, n_gpu_layers=DEFAULT_N_GPU_LAYERS if ngl < 0 else ngl,
                                      tensor_split=tsv, override_tensor=override_items(self.args, otv))
        p = probe(self.hp, cp, self.memory, exact=self.exact)
        p = Probe(ProbeParams(n_ctx, ngl, tsv, otv), p.breakdown, p.compute_bytes, p.context_bytes, p.n_copies, p.table)
        self.probes.append(p)
        self.log += ["common_memory_breakdown_print: " + line for line in p.table]
        return p

    # set_ngl_tensor_split_tbo
    def placement(self, per_dev: list[LayerCount], overflow_bufts: list[str]
                  ) -> tuple[int, tuple[float, ...] | None, tuple[tuple[str, str], ...]]:
        ngl, ts, ot = set_ngl_tensor_split_tbo(per_dev, overflow_bufts, self.hp.n_layer)
        return ngl, ts if ts is not None else self.ts, ot

    # get_memory_for_layers
    def memory_for_layers(self, per_dev: list[LayerCount], overflow_bufts: list[str]) -> list[int]:
        ngl, ts, ot = self.placement(per_dev, overflow_bufts)
        p = self.measure(ngl=ngl, ts=ts, ot=ot)
        self.trc("memory for test allocation by device:")
        for d, n in enumerate(per_dev):
            # PRIu32: ngl_t's counts are uint32_t, so an n_part taken below 0 prints wrapped (4294967295)
            self.trc(f"id={d}, n_layer={n.n_layer % 2**32:2d}, n_part={n.n_part % 2**32:2d}, "
                     f"overflow_type={n.overflow_type}, "
                     f"mem={p.used(d) // MiB:6d} MiB")
        return [p.used(d) for d in range(self.nd)]

    def run(self) -> None:
        args, nd = self.args, self.nd
        if args.split_mode == "tensor":
            raise _FitAbort("llama_params_fit is not implemented for SPLIT_MODE_TENSOR, abort")
        self.ngl, self.ts, self.ot = args.n_gpu_layers, args.tensor_split, ()
        self.n_ctx = args.n_ctx
        n_streams = 1 if args.kv_unified else max(1, args.n_parallel)
        n_ctx_auto = args.n_ctx == 0
        # common_get_device_memory_data: hp_ngl = llama_model_n_layer (n_layer(), the trunk; the NextN/MTP
        # blocks are added only with load_mtp), while the model places -ngl over n_layer_all + 1
        hp_nct, hp_ngl = self.hp.n_ctx_train, self.hp.n_layer
        hp_nex = n_expert(self.hp)

        # step 1: the initial parameters
        self.trc("getting device memory data for initial parameters:")
        full = self.measure()
        n_ctx_max = min(hp_nct * n_streams, 2**32 - 1)
        n_ctx_min_total = min(self.n_ctx_min * n_streams, 2**32 - 1)
        if n_ctx_auto:
            self.n_ctx = n_ctx_max
            if n_streams > 1:
                self.trc(f"context size unset and KV cache not unified -> using {n_ctx_max} for {n_streams} sequences:")
                full = self.measure()
        margins = self.margins
        sum_free = sum_used = sum_proj_free = sum_model = 0
        proj_free: list[int] = []
        if nd == 0:
            # CPU only: the host's total (not free) memory against the first margin
            if self.host is None:
                raise _FitAbort("no model devices and no host memory given (--device cpu:SIZE), abort")
            sum_used = full.breakdown.host.total
            sum_free = self.host.total
            sum_proj_free = sum_free - sum_used
            self.trc(f"projected to use {sum_used // MiB} MiB of host memory vs. {sum_free // MiB} MiB of total host "
                     "memory")
            if sum_proj_free >= margins[0]:
                self.trc(f"will leave {_cdiv(sum_proj_free, MiB)} >= {margins[0] // MiB} MiB of system memory, "
                         "no changes needed")
                return
        if nd > 1:
            self.trc("projected memory use with initial parameters [MiB]:")
        names = self.dev_names
        for d in range(nd):
            used = full.used(d)
            free = self.memory[d].free - used
            proj_free.append(free)
            sum_free += self.memory[d].free
            sum_used += used
            sum_proj_free += free
            sum_model += full.breakdown.devices[d].model
            if nd > 1:
                self.trc(f"  - {names[d]}: {self.memory[d].total // MiB:6d} total, {used // MiB:6d} used, "
                         f"{_cdiv(free, MiB):6d} free vs. target of {margins[d] // MiB:6d}")
        if nd > 0:
            self.trc(f"projected to use {sum_used // MiB} MiB of device memory vs. {sum_free // MiB} MiB of free "
                     "device memory")
        if nd == 0:
            pass
        elif nd == 1:
            if proj_free[0] >= margins[0]:
                self.trc(f"will leave {_cdiv(proj_free[0], MiB)} >= {margins[0] // MiB} MiB of free device memory, "
                         "no changes needed")
                self.used_final = [full.used(0)]
                return
        elif all(proj_free[d] >= margins[d] for d in range(nd)):
            self.trc("targets for free memory can be met on all devices, no changes needed")
            self.used_final = [full.used(d) for d in range(nd)]
            return

        # step 2: a smaller context
        global_surplus = sum_proj_free - sum(margins)
        if global_surplus < 0:
            if nd <= 1:
                self.trc(f"cannot meet free memory target of {margins[0] // MiB} MiB, need to reduce device memory by "
                         f"{_cdiv(-global_surplus, MiB)} MiB")
            else:
                self.trc(f"cannot meet free memory targets on all devices, need to use {_cdiv(-global_surplus, MiB)} "
                         "MiB less in total")
            if n_ctx_auto:
                if n_ctx_max > n_ctx_min_total:
                    target = sum_free - sum(margins)
                    if nd > 1:
                        # whole layers (dense) or tensors (MoE) per device waste about half a layer each
                        ngl_cap = min(DEFAULT_N_GPU_LAYERS if self.ngl < 0 else self.ngl, hp_ngl)
                        model_per_layer = _cdiv(sum_model, max(1, ngl_cap))
                        target -= (nd + 1) * model_per_layer // (2 if hp_nex == 0 else 6)
                    self.n_ctx = n_ctx_min_total
                    mn = self.measure()
                    used_min = sum(mn.used(d) for d in range(nd)) if nd else mn.breakdown.host.total
                    if target > used_min:
                        self.n_ctx += _cdiv((n_ctx_max - n_ctx_min_total) * (target - used_min), sum_used - used_min)
                        self.n_ctx &= 0xFFFFFFFF
                        align = 256 * n_streams
                        self.n_ctx = max(self.n_ctx - self.n_ctx % align, n_ctx_min_total)
                        bytes_per_ctx = _cdiv(sum_used - used_min, n_ctx_max - n_ctx_min_total)
                        reduction = (n_ctx_max - self.n_ctx) * bytes_per_ctx
                        self.trc(f"context size reduced from {n_ctx_max} to {self.n_ctx} -> need "
                                 f"{_cdiv(reduction, MiB)} MiB less memory in total")
                        if nd <= 1 and (not self.exact or self.exact_context(n_ctx_min_total, align)):
                            self.trc("entire model can be fit by reducing context")
                            self.used_final = []
                            return
                        self.trc("entire model should be fit across devices by reducing context")
                    else:
                        self.trc(f"context size reduced from {n_ctx_max} to {self.n_ctx} -> need "
                                 f"{_cdiv(sum_used - used_min, MiB)} MiB less memory in total")
                else:
                    self.trc(f"default model context size is {n_ctx_max} which is <= the min. context size of "
                             f"{n_ctx_min_total} -> no change")
            else:
                self.trc(f"context size set by user to {self.n_ctx} -> no change")

        if nd == 0:
            raise _FitAbort("was unable to fit model into system memory by reducing context, abort")

        # step 3: what the user fixed stops layer fitting
        if self.ngl != N_GPU_LAYERS_AUTO:
            raise _FitAbort(f"n_gpu_layers already set by user to {self.ngl}, abort")
        if nd > 1:
            if self.ts is not None and any(x != 0 for x in self.ts[:nd]):
                raise _FitAbort("model_params::tensor_split already set by user, abort")
            if args.split_mode == "row":
                raise _FitAbort("changing weight allocation for LLAMA_SPLIT_MODE_ROW not implemented, abort")
        if args.has_tensor_overrides:
            raise _FitAbort("model_params::tensor_buft_overrides already set by user, abort")
        self.fill_layers(hp_ngl, hp_nex, full)

    def fill_layers(self, hp_ngl: int, hp_nex: int, full: Probe) -> None:
        nd, margins = self.nd, self.margins
        surplus_cpu_moe = 0
        if hp_nex > 0:
            self.trc("getting device memory data with all MoE tensors moved to system memory:")
            cm = self.measure(ot=((PATTERN_MOE_ALL, "CPU"),))
            for d in range(nd):
                surplus_cpu_moe += self.memory[d].free - cm.used(d) - margins[d]
            if surplus_cpu_moe > 0:
                self.trc(f"with only dense weights in device memory there is a total surplus of "
                         f"{surplus_cpu_moe // MiB} MiB")
            else:
                self.trc(f"with only dense weights in device memory there is still a total deficit of "
                         f"{_cdiv(-surplus_cpu_moe, MiB)} MiB")
        targets = [self.memory[d].free - margins[d] for d in range(nd)]
        for d in range(nd):
            self.trc(f"id={d}, target={_cdiv(targets[d], MiB)} MiB")
        overflow_bufts = ["CPU"] * nd
        per_dev = [LayerCount() for _ in range(nd)]
        mem = self.memory_for_layers(per_dev, overflow_bufts)
        self.trc("filling dense layers back-to-front:" if hp_nex == 0 else "filling dense-only layers back-to-front:")
        names = self.dev_names
        for d in range(nd - 1, -1, -1):
            n_unassigned = hp_ngl + 1 - sum(per_dev[j].n_layer for j in range(d + 1, nd))
            high = [n.copy() for n in per_dev]
            high[d].n_layer = n_unassigned
            if hp_nex > 0:
                high[d].n_part = high[d].n_layer if d < nd - 1 else high[d].n_layer - 1
            if high[d].n_layer > 0:
                mem_high = self.memory_for_layers(high, overflow_bufts)
                if mem_high[d] > targets[d]:
                    delta = high[d].n_layer - per_dev[d].n_layer
                    self.trc(f"start filling device {d}, delta={delta}")
                    while delta > 1:
                        step = _false_position_step(delta, targets[d], mem[d], mem_high[d])
                        test = [n.copy() for n in per_dev]
                        test[d].n_layer += step
                        if hp_nex:
                            test[d].n_part += step - 1 if (d == nd - 1 and test[d].n_part == 0) else step
                        mem_test = self.memory_for_layers(test, overflow_bufts)
                        if mem_test[d] <= targets[d]:
                            per_dev, mem = test, mem_test
                            self.trc(f"set ngl_per_device[{d}].n_layer={per_dev[d].n_layer}")
                        else:
                            high, mem_high = test, mem_test
                            self.trc(f"set ngl_per_device_high[{d}].n_layer={high[d].n_layer}")
                        delta = high[d].n_layer - per_dev[d].n_layer
                else:
                    per_dev, mem = high, mem_high
                    self.trc(f"set ngl_per_device[{d}].n_layer={per_dev[d].n_layer}")
            margin = self.memory[d].free - mem[d]
            self.trc(f"  - {names[d]}: {per_dev[d].n_layer:2d} layers, {mem[d] // MiB:6d} MiB used, "
                     f"{_cdiv(margin, MiB):6d} MiB free")
        if hp_nex == 0 or surplus_cpu_moe <= 0:
            self.commit(per_dev, overflow_bufts, mem)
            return
        self.fill_moe(per_dev, overflow_bufts, mem, targets)

    def fill_moe(self, per_dev: list[LayerCount], overflow_bufts: list[str], mem: list[int],
                 targets: list[int]) -> None:
        """Step 4 of common_params_fit_impl: dense-only layers become full layers, front to back."""
        nd = self.nd
        names = self.dev_names
        dev_bufts = self.device_bufts()
        id_dense_start = nd
        for d in range(nd - 1, -1, -1):
            if per_dev[d].n_layer > 0:
                id_dense_start = d
                continue
            break
        self.trc("converting dense-only layers to full layers and filling them front-to-back with overflow to next "
                 "device/system memory:")
        d = 0
        while d <= id_dense_start < nd:
            high = [n.copy() for n in per_dev]
            for j in range(id_dense_start, nd):
                n_move = high[j].n_layer if j < nd - 1 else high[j].n_layer - 1
                high[d].n_layer += n_move
                high[j].n_layer -= n_move
                high[j].n_part = 0
            id_dense_start_high = nd - 1
            mem_high = self.memory_for_layers(high, overflow_bufts)
            if mem_high[d] > targets[d]:
                delta = high[d].n_full - per_dev[d].n_full
                while delta > 1:
                    step = _false_position_step(delta, targets[d], mem[d], mem_high[d])
                    test = [n.copy() for n in per_dev]
                    ids_test = id_dense_start
                    converted = 0
                    while ids_test < nd:
                        n_conv = min(step - converted, test[ids_test].n_part)
                        test[ids_test].n_layer -= n_conv
                        test[ids_test].n_part -= n_conv
                        test[d].n_layer += n_conv
                        converted += n_conv
                        if test[ids_test].n_part > 0:
                            break
                        ids_test += 1
                    mem_test = self.memory_for_layers(test, overflow_bufts)
                    if mem_test[d] <= targets[d]:
                        per_dev, mem, id_dense_start = test, mem_test, ids_test
                        self.trc(f"set ngl_per_device[{d}].(n_layer, n_part)=({per_dev[d].n_layer}, "
                                 f"{per_dev[d].n_part}), id_dense_start={id_dense_start}")
                    else:
                        high, mem_high, id_dense_start_high = test, mem_test, ids_test
                        self.trc(f"set ngl_per_device_high[{d}].(n_layer, n_part)=({high[d].n_layer}, "
                                 f"{high[d].n_part}), id_dense_start_high={id_dense_start_high}")
                    delta = high[d].n_full - per_dev[d].n_full
            else:
                per_dev, mem, id_dense_start = high, mem_high, id_dense_start_high
                self.trc(f"set ngl_per_device[{d}].(n_layer, n_part)=({per_dev[d].n_layer}, {per_dev[d].n_part}), "
                         f"id_dense_start={id_dense_start}")
            # try to fit at least part of one more layer
            if per_dev[id_dense_start].n_layer > (0 if d < nd - 1 else 1):
                test = [n.copy() for n in per_dev]
                ids_test = id_dense_start
                test[ids_test].n_layer -= 1
                test[ids_test].n_part -= 1
                test[d].n_layer += 1
                test[d].n_part += 1
                if test[ids_test].n_part == 0:
                    ids_test += 1
                test[d].overflow_type = LAYER_FRACTION_UP
                ob_test = list(overflow_bufts)
                if d < nd - 1:
                    ob_test[d] = dev_bufts[d + 1]
                self.trc("trying to fit one extra layer with overflow_type=LAYER_FRACTION_UP")
                mem_test = self.memory_for_layers(test, ob_test)

                def ok(m: list[int], d: int = d) -> bool:
                    return m[d] < targets[d] and (d + 1 == nd or m[d + 1] < targets[d + 1])

                if ok(mem_test):
                    per_dev, overflow_bufts, mem, id_dense_start = test, ob_test, mem_test, ids_test
                    self.trc(f"set ngl_per_device[{d}].(n_layer, n_part, overflow_type)=({per_dev[d].n_layer}, "
                             f"{per_dev[d].n_part}, UP), id_dense_start={id_dense_start}")
                    test = [n.copy() for n in test]
                    test[d].overflow_type = LAYER_FRACTION_GATE
                    self.trc("trying to fit one extra layer with overflow_type=LAYER_FRACTION_GATE")
                    mem_test = self.memory_for_layers(test, ob_test)
                    if ok(mem_test):
                        per_dev, overflow_bufts, mem, id_dense_start = test, ob_test, mem_test, ids_test
                        self.trc(f"set ngl_per_device[{d}].(n_layer, n_part, overflow_type)=({per_dev[d].n_layer}, "
                                 f"{per_dev[d].n_part}, GATE), id_dense_start={id_dense_start}")
                else:
                    test = [n.copy() for n in test]
                    test[d].overflow_type = LAYER_FRACTION_ATTN
                    self.trc("trying to fit one extra layer with overflow_type=LAYER_FRACTION_ATTN")
                    mem_test = self.memory_for_layers(test, ob_test)
                    if ok(mem_test):
                        per_dev, overflow_bufts, mem, id_dense_start = test, ob_test, mem_test, ids_test
                        self.trc(f"set ngl_per_device[{d}].(n_layer, n_part, overflow_type)=({per_dev[d].n_layer}, "
                                 f"{per_dev[d].n_part}, ATTN), id_dense_start={id_dense_start}")
            margin = self.memory[d].free - mem[d]
            self.trc(f"  - {names[d]}: {per_dev[d].n_layer:2d} layers ({per_dev[d].n_part:2d} overflowing), "
                     f"{mem[d] // MiB:6d} MiB used, {_cdiv(margin, MiB):6d} MiB free")
            d += 1
        for d in range(id_dense_start + 1, nd):
            margin = self.memory[d].free - mem[d]
            self.trc(f"  - {names[d]}: {per_dev[d].n_layer:2d} layers ({per_dev[d].n_part:2d} overflowing), "
                     f"{mem[d] // MiB:6d} MiB used, {_cdiv(margin, MiB):6d} MiB free")
        self.commit(per_dev, overflow_bufts, mem)

    def device_bufts(self) -> list[str]:
        cp = self.args.context_params()
        ds = make_devices(tuple(strip_budget(s) for s in cp.devices), split_mode=cp.split_mode, main_gpu=cp.main_gpu)
        return [g.buft.name for g in ds.gpus]

    def commit(self, per_dev: list[LayerCount], overflow_bufts: list[str], mem: list[int]) -> None:
        if self.exact:
            per_dev, mem = self.exact_layers(per_dev, overflow_bufts, mem)
        self.ngl, self.ts, self.ot = self.placement(per_dev, overflow_bufts)
        self.used_final = list(mem)

    # ---- beyond llama.cpp: the exact fit checks every device on the full reserve -------------------
    def exact_context(self, n_ctx_min: int, align: int) -> bool:
        """The interpolated context, checked on the real buffers and lowered by ``align`` until it keeps
        the margin (the minimum-context probe clamps n_ubatch, so the interpolation can overshoot)."""
        target = self.memory[0].free - self.margins[0]
        while True:
            used = self.measure().used(0)
            if used <= target:
                return True
            if self.n_ctx <= n_ctx_min:
                self.trc(f"exact: {used // MiB} MiB at the min. context size {self.n_ctx} exceed the target "
                         f"of {_cdiv(target, MiB)} MiB -> fitting layers")
                return False
            self.trc(f"exact: context size {self.n_ctx} uses {used // MiB} MiB > target {_cdiv(target, MiB)} MiB "
                     f"-> {max(self.n_ctx - align, n_ctx_min)}")
            self.n_ctx = max(self.n_ctx - align, n_ctx_min)

    def exact_layers(self, per_dev: list[LayerCount], overflow_bufts: list[str], mem: list[int]
                     ) -> tuple[list[LayerCount], list[int]]:
        """Every device against its target, not only the one being filled: a layer placed on an
        earlier device can turn on pipeline parallelism and grow a later device's compute buffer."""
        names = self.dev_names
        per_dev = [n.copy() for n in per_dev]
        targets = [m.free - t for m, t in zip(self.memory, self.margins)]
        while True:
            over = [d for d in range(self.nd) if mem[d] > targets[d]]
            if not over:
                return per_dev, mem
            d = over[-1]
            has = [j for j in range(self.nd) if per_dev[j].n_layer > 0]
            if not has:
                return per_dev, mem
            j = d if per_dev[d].n_layer > 0 else has[-1]
            per_dev[j].n_layer -= 1
            per_dev[j].n_part = min(per_dev[j].n_part, per_dev[j].n_layer)
            self.trc(f"exact: {names[d].rstrip()} uses {mem[d] // MiB} MiB > target {_cdiv(targets[d], MiB)} MiB "
                     f"-> one layer less on device {j}")
            mem = self.memory_for_layers(per_dev, overflow_bufts)


def _cdiv(a: int, b: int) -> int:
    """C++ integer division (toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _false_position_step(delta: int, target: int, mem_lo: int, mem_hi: int) -> int:
    """``step_size = delta * (target - mem_lo) / (mem_hi - mem_lo)`` clamped to [1, delta - 1]
    (uint32_t arithmetic: a negative quotient wraps to a huge value and is clamped to delta - 1)."""
    if mem_hi == mem_lo:
        return delta - 1
    step = _cdiv(delta * (target - mem_lo), mem_hi - mem_lo) & 0xFFFFFFFF
    return min(max(step, 1), delta - 1)


def fit_params(model: HParams, args: LlamaArgs, memory: Sequence[DeviceMemory] | None = None, *,
               exact: bool = False) -> FitResult:
    """``common_fit_params``: fit ``args`` to the devices' free memory (see the module docstring).

    ``memory`` gives each model device's free/total bytes (default: the budgets of the device
    strings). ``exact`` searches on the full reserve's buffers instead of llama.cpp's pp-only estimate.
    """
    mem = list(memory) if memory is not None else device_memory(args)
    nd = len(mem)
    host = DeviceMemory("Host", "CPU", args.host_memory, args.host_memory) if args.host_memory else None
    f = _Fit(model, args, mem, fit_targets_bytes(args, nd), args.fit_ctx, exact, host)
    t0 = time.perf_counter()
    status, error = "success", ""
    try:
        f.run()
        f.log.append("common_fit_params: successfully fit params to free device memory")
    except _FitAbort as e:
        status, error = "failure", str(e)
        f.log.append(f"common_fit_params: failed to fit params to free device memory: {e}")
    secs = time.perf_counter() - t0
    f.log.append(f"common_fit_params: fitting params to free memory took {secs:.2f} seconds")
    if status == "success":
        f.log.append("llama_fit_params: printing fitted CLI arguments to stdout...")
    else:
        f.log.append("llama_fit_params: failed to fit CLI arguments to free memory, exiting...")
    n_ctx = f.n_ctx if f.n_ctx else model.n_ctx_train
    # llama.cpp keeps tensor_split as floats and llama-fit-params prints them as uint32_t
    ts = tuple(int(x) for x in f.ts) if f.ts else None
    fitted = Fitted(n_ctx, f.ngl, ts, f.ot)
    used = f.used_final
    host_used = 0
    if len(used) != nd or nd == 0:
        # the answer came from a context reduction: measure what the chosen parameters use
        cp = args.context_params(n_ctx=n_ctx, n_gpu_layers=DEFAULT_N_GPU_LAYERS if f.ngl < 0 else f.ngl,
                                 tensor_split=f.ts, override_tensor=override_items(args, f.ot))
        try:
            p = probe(model, cp, mem, exact=exact)
            used, host_used = [p.used(d) for d in range(nd)], p.breakdown.host.total
        except ValueError:
            used = []
    return FitResult(status, fitted, tuple(f.probes), tuple(f.log), tuple(mem), tuple(f.margins), error, secs,
                     exact, tuple(used), host, host_used)


def fit_print(model: HParams, args: LlamaArgs, memory: Sequence[DeviceMemory] | None = None) -> FitPrint:
    """``common_fit_print``: per device ``NAME model context compute`` in MiB, then ``Host …``;
    each row ends with a space, as llama-fit-params prints it."""
    mem = list(memory) if memory is not None else device_memory(args)
    p = probe(model, args.context_params(), mem)
    rows = [f"{m.name} {r.model // MiB} {r.context // MiB} {r.compute // MiB} "
            for m, r in zip(mem, p.breakdown.devices)]
    h = p.breakdown.host
    rows.append(f"Host {h.model // MiB} {h.context // MiB} {h.compute // MiB} ")
    log = ["llama_fit_params: printing estimated memory in MiB to stdout (device, model, context, compute) ...",
           *("common_memory_breakdown_print: " + line for line in p.table)]
    return FitPrint(tuple(rows), p, tuple(log))


__all__ = ["LAYER_FRACTION_ATTN", "LAYER_FRACTION_GATE", "LAYER_FRACTION_MOE", "LAYER_FRACTION_UP", "LayerCount",
           "fit_params", "fit_print", "overflow_pattern", "set_ngl_tensor_split_tbo"]
