"""``ggml_backend_sched_compute_splits``: the order of waits, copies, computes and events.

The scheduler does not run kernels; the caller passes two primitives:

- ``copy(src, dst, split)``: a whole copy of ``src`` into its split-backend copy ``dst``;
- ``compute(backend_id, nodes)``: run a run of consecutive nodes of a split.

Every step is also returned as a :class:`Step`, so the timeline can be shown or tested. The
walk is a function of an :class:`~toolkit.sched.split.Assignment` (the splits and their input
copies) and the scheduler's events and callbacks, passed explicitly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from toolkit.backend.device import Backend
from toolkit.ggml.tensor import Tensor, TensorFlag
from toolkit.sched.split import Assignment, Split

CopyFn = Callable[[Tensor, Tensor, Split], None]
ComputeFn = Callable[[int, list[Tensor]], None]
CopyCallback = Callable[[Backend, Tensor, Tensor, Split], bool]   # ggml_backend_sched_copy_callback
EvalCallback = Callable[[Tensor, bool], bool]                     # ggml_backend_sched_eval_callback


@dataclass(frozen=True)
class Step:
    kind: str            # "wait", "sync", "copy", "copy_cb", "compute", "record", "cancel"
    split: int
    backend: int
    names: tuple[str, ...] = ()


def _is_host_weight(t: Tensor) -> bool:
    return t.is_weight and bool(t.buffer.buft.is_host)


def compute_splits(a: Assignment, backends: Sequence[Backend], events: Sequence[Sequence[object | None]],
                   cur_copy: int, copy: CopyFn, compute: ComputeFn, copy_callback: CopyCallback | None = None,
                   eval_callback: EvalCallback | None = None) -> list[Step]:
    """``ggml_backend_sched_compute_splits`` over the splits of ``a`` for copy ``cur_copy``;
    ``events[b][c]`` is backend b's event for copy c (empty without pipeline parallelism)."""
    trace: list[Step] = []
    cc = cur_copy
    prev_backend = -1
    for k, split in enumerate(a.splits):
        b = split.backend_id
        event = events[b][cc] if events else None
        # PR #26040: a split without inputs after one on another backend waits for it
        if not split.inputs and prev_backend not in (-1, b):
            pe = events[prev_backend][cc] if events else None
            trace.append(Step("wait" if pe is not None else "sync", k, prev_backend))
        # inputs that are not host weights first, host weights last, so a copy callback can
        # read the ids the earlier inputs brought (PR #29943)
        ordered = [t for t in split.inputs if not _is_host_weight(t)] + [t for t in split.inputs if _is_host_weight(t)]
        for src in ordered:
            dst = a.copies[(id(src), b)][cc]
            trace.append(Step("wait" if event is not None else "sync", k, b))
            if src.flags & TensorFlag.INPUT:
                copy(src, dst, split)  # user inputs are copied at once, synchronously
                trace.append(Step("copy", k, b, (src.name, dst.name)))
                continue
            cb = copy_callback
            if _is_host_weight(src) and cb is not None and cb(backends[b], src, dst, split):
                trace.append(Step("copy_cb", k, b, (src.name, dst.name)))
                continue
            copy(src, dst, split)
            trace.append(Step("copy", k, b, (src.name, dst.name)))
        nodes = split.nodes
        ev = eval_callback
        if ev is None:
            compute(b, list(nodes))
            trace.append(Step("compute", k, b, tuple(t.name for t in nodes)))
        else:
            # runs of nodes the callback does not want go together; it sees each wanted node
            j0 = 0
            while j0 < len(nodes):
                j1 = j0
                need = ev(nodes[j1], True)
                while not need and j1 < len(nodes) - 1:
                    j1 += 1
                    need = ev(nodes[j1], True)
                run = list(nodes[j0:j1 + 1])
                compute(b, run)
                trace.append(Step("compute", k, b, tuple(t.name for t in run)))
                if need and not ev(nodes[j1], False):
                    trace.append(Step("cancel", k, b, (nodes[j1].name,)))
                    break
                j0 = j1 + 1
        if event is not None:
            trace.append(Step("record", k, b))
        prev_backend = b
    return trace
