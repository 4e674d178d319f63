"""Beyond llama.cpp: the fitted parameters planned with the full reserve sequence.

llama.cpp's estimate sizes only the pp graph (under ``no_alloc`` the tg reserve and the second pp
reserve are split-only) and never takes the pipeline-parallel fallback; a real context keeps
``max(pp, tg, pp)`` per buffer. :func:`real_run` plans the parameters a program given the printed
line would run with and reports, per device, the estimate next to the real buffers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from toolkit.args import LlamaArgs
from toolkit.fit.impl import override_items
from toolkit.fit.probe import default_split, probe, real_context
from toolkit.fit.result import FitResult, Fitted
from toolkit.memory import DeviceMemory, MemoryRow, MiB, context_breakdown
from toolkit.models.cparams import DEFAULT_N_GPU_LAYERS, ContextParams
from toolkit.models.hparams import HParams


@dataclass(frozen=True)
class DeviceCheck:
    """One device: llama.cpp's estimate (pp-only, no fallback) against the full reserve sequence."""

    name: str
    free: int
    target: int
    estimate: MemoryRow
    real: MemoryRow

    @property
    def difference(self) -> int:
        return self.real.total - self.estimate.total

    @property
    def fits(self) -> bool:
        return self.real.total <= self.free

    @property
    def keeps_margin(self) -> bool:
        return self.real.total <= self.free - self.target

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "free": self.free, "target": self.target,
                "estimate": vars(self.estimate) | {"total": self.estimate.total},
                "real": vars(self.real) | {"total": self.real.total}, "difference": self.difference,
                "fits": self.fits, "keeps_margin": self.keeps_margin}


@dataclass(frozen=True)
class RealRun:
    """The fitted parameters run as a program given the printed line would run them."""

    params: ContextParams
    devices: tuple[DeviceCheck, ...]
    host: MemoryRow
    compute_bytes: tuple[tuple[str, int], ...]
    context_bytes: tuple[tuple[str, int], ...]   # the context's memory (KV, ...) per buffer
    model_bytes: tuple[tuple[str, int], ...]
    n_copies: int
    pipeline_parallel: bool
    fallback: bool = False          # a device ran out of memory with pipeline parallelism: retried without
    error: str = ""                 # no context could be created (out of memory even without it)

    def to_dict(self) -> dict[str, Any]:
        return {"devices": [d.to_dict() for d in self.devices], "host": vars(self.host),
                "compute_buffers_bytes": dict(self.compute_bytes), "context_buffers_bytes": dict(self.context_bytes),
                "model_buffers_bytes": dict(self.model_bytes), "n_copies": self.n_copies,
                "pipeline_parallel": self.pipeline_parallel, "fallback": self.fallback, "error": self.error}

    def lines(self) -> list[str]:
        out = [f"the context cannot be created: {self.error}"] if self.error else []
        if self.fallback:
            out.append("compute buffer allocation failed with pipeline parallelism; llama.cpp retries without it")
        for d in self.devices:
            out.append(f"{d.name}: estimate {d.estimate.total / MiB:.2f} MiB, real {d.real.total / MiB:.2f} MiB "
                       f"({d.difference:+d} bytes), free {d.free // MiB} MiB, target {d.target // MiB} MiB: "
                       + ("keeps the margin" if d.keeps_margin
                          else "fits, margin missed" if d.fits else "OUT OF MEMORY"))
        return out


def run_params(args: LlamaArgs, fitted: Fitted, memory: Sequence[DeviceMemory], *,
               in_process: bool = False) -> ContextParams:
    """ContextParams of the printed line run on top of the user's flags (``-fit off``), or with
    ``in_process`` of the parameters as fit left them (``-fit on`` inside the program)."""
    p = fitted if in_process else fitted.as_printed()
    cp = args.context_params(n_ctx=p.c, n_gpu_layers=DEFAULT_N_GPU_LAYERS if p.ngl < 0 else p.ngl,
                             tensor_split=tuple(float(x) for x in p.ts) if p.ts else args.tensor_split,
                             override_tensor=override_items(args, p.ot))
    return cp.replace(tensor_split=default_split(cp, memory))


def real_run(model: HParams, args: LlamaArgs, result: FitResult, *, in_process: bool = False) -> RealRun:
    """Plan the printed parameters (or, ``in_process``, fit's own) with the full reserve sequence and
    compare per device with llama.cpp's estimate for them."""
    mem = list(result.memory)
    # after a failed fit the program continues with the parameters as fit left them
    cp = run_params(args, result.fitted, mem, in_process=in_process or result.status != "success")
    unlimited, limited, error = real_context(model, cp, mem)
    ctx = limited if limited is not None else unlimited
    real, comp = context_breakdown(ctx, exact=True)
    est = probe(model, cp, mem).breakdown
    checks = tuple(DeviceCheck(m.name, m.free, t, e, r)
                   for m, t, e, r in zip(mem, result.targets, est.devices, real.devices))
    return RealRun(cp, checks, real.host, comp, tuple(ctx.events[-1].context_memory().items()),
                   tuple(ctx.model_buffers_bytes.items()), ctx.n_copies, ctx.pipeline_parallel,
                   fallback=limited is not None and limited is not unlimited
                   and limited.n_copies != unlimited.n_copies, error=error)


__all__ = ["DeviceCheck", "RealRun", "real_run", "run_params"]
