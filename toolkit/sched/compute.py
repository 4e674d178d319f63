"""``ggml_backend_sched_compute_splits``: the order of waits, copies, computes and events (spec §5.3, §5.4).

The scheduler does not run kernels; the caller passes two primitives:

- ``copy(src, dst, split)``: a whole copy of ``src`` into its split-backend copy ``dst``;
- ``compute(backend_id, nodes)``: run a run of consecutive nodes of a split.

Every step is also appended to ``trace`` as a :class:`Step`, so the timeline can be shown or tested.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from toolkit.ggml.tensor import Tensor, TensorFlag

if TYPE_CHECKING:
    from toolkit.sched.scheduler import Scheduler
    from toolkit.sched.split import Split

CopyFn = Callable[[Tensor, Tensor, "Split"], None]
ComputeFn = Callable[[int, list[Tensor]], None]


@dataclass(frozen=True)
class Step:
    kind: str            # "wait", "sync", "copy", "copy_cb", "compute", "record", "cancel"
    split: int
    backend: int
    names: tuple[str, ...] = ()


def _is_host_weight(t: Tensor) -> bool:
    return t.is_weight and bool(t.buffer.buft.is_host)


def compute_splits(s: Scheduler, copy: CopyFn, compute: ComputeFn) -> list[Step]:
    trace: list[Step] = []
    cc = s.cur_copy
    prev_backend = -1
    for k, split in enumerate(s.splits):
        b = split.backend_id
        event = s.events[b][cc] if s.events else None
        # PR #26040: a split without inputs after one on another backend waits for it
        if not split.inputs and prev_backend not in (-1, b):
            pe = s.events[prev_backend][cc] if s.events else None
            trace.append(Step("wait" if pe is not None else "sync", k, prev_backend))
        # inputs that are not host weights first, host weights last, so a copy callback can
        # read the ids the earlier inputs brought (PR #29943)
        ordered = [t for t in split.inputs if not _is_host_weight(t)] + [t for t in split.inputs if _is_host_weight(t)]
        for src in ordered:
            dst = s._snap_copies[(id(src), b)][cc]
            trace.append(Step("wait" if event is not None else "sync", k, b))
            if src.flags & TensorFlag.INPUT:
                copy(src, dst, split)  # user inputs are copied at once, synchronously
                trace.append(Step("copy", k, b, (src.name, dst.name)))
                continue
            cb = s.copy_callback
            if _is_host_weight(src) and cb is not None and cb(s.backends[b], src, dst, split):
                trace.append(Step("copy_cb", k, b, (src.name, dst.name)))
                continue
            copy(src, dst, split)
            trace.append(Step("copy", k, b, (src.name, dst.name)))
        nodes = split.nodes
        ev = s.eval_callback
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
