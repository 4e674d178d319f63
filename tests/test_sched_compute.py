"""The compute loop's order (``ggml_backend_sched_compute_splits``) and its callback hooks
(``ggml_backend_sched_set_eval_callback``, ``set_copy_callback``)."""

from __future__ import annotations

from sched_fixtures import graph_of, weight
from test_sched_vectors import _two_backend_mlp

from toolkit.backend import profiles
from toolkit.ggml import F32, Tensor, ops
from toolkit.sched import Scheduler
from toolkit.sched.split import Split


def _recorder() -> tuple[list[tuple[str, ...]], object, object]:
    log: list[tuple[str, ...]] = []

    def copy(src: Tensor, dst: Tensor, split: Split) -> None:
        log.append(("copy", src.name, dst.name))

    def compute(b: int, nodes: list[Tensor]) -> None:
        log.append(("compute", str(b), *(t.name for t in nodes)))

    return log, copy, compute


def test_splits_run_in_order_with_their_copies() -> None:
    s = _two_backend_mlp(4, True)   # GPU: h0, a0 | CPU: h1, a1, o
    log, copy, compute = _recorder()
    steps = s.compute_splits(copy, compute)  # type: ignore[arg-type]
    assert log == [
        ("copy", "x", "CUDA0#x#0"), ("compute", "0", "h0", "a0"),
        ("copy", "a0", "CPU#a0#0"), ("compute", "1", "h1", "a1", "o"),
    ]
    assert [st.kind for st in steps] == ["sync", "copy", "compute", "sync", "copy", "compute"]


def test_events_recorded_with_pipeline_copies() -> None:
    s = _two_backend_mlp(4, True, parallel=True)
    _, copy, compute = _recorder()
    kinds = [(st.kind, st.backend) for st in s.compute_splits(copy, compute)]  # type: ignore[arg-type]
    assert ("wait", 0) in kinds and ("record", 0) in kinds
    assert ("record", 1) not in kinds  # the CPU has no events


def test_eval_callback_batches_unwanted_nodes_and_can_cancel() -> None:
    s = _two_backend_mlp(4, True)
    log, copy, compute = _recorder()
    asked: list[tuple[str, bool]] = []

    def cb(t: Tensor, ask: bool) -> bool:
        asked.append((t.name, ask))
        return t.name != "a1" if not ask else t.name in ("a0", "a1")

    s.set_eval_callback(cb)
    s.compute_splits(copy, compute)  # type: ignore[arg-type]
    computes = [e for e in log if e[0] == "compute"]
    assert computes == [("compute", "0", "h0", "a0"), ("compute", "1", "h1", "a1")]  # o cancelled
    assert ("a1", False) in asked


def test_copy_callback_sees_host_weights_last() -> None:
    g0, c = profiles.cuda_like(0, min_batch=32), profiles.cpu()
    s = Scheduler([g0, c], None, 256, False, True)
    w = weight(c, "w_host", 16, 16)
    x = ops.new_tensor_2d(F32, 16, 64, "x").set_input()
    y = ops.new_tensor_2d(F32, 16, 64, "y").set_input()
    o = ops.add(ops.mul_mat(w, x), y).set_output()   # offloaded: w is a split input of the GPU split
    assert s.alloc_graph(graph_of(o))
    seen: list[str] = []

    def cb(backend, src, dst, split) -> bool:  # type: ignore[no-untyped-def]
        seen.append(f"{backend.name}:{src.name}->{dst.name}")
        return True

    s.set_copy_callback(cb)
    log, copy, compute = _recorder()
    steps = s.compute_splits(copy, compute)  # type: ignore[arg-type]
    assert seen == ["CUDA0:w_host->CUDA0#w_host#0"]
    assert [st.kind for st in steps if st.kind.startswith("copy")][-1] == "copy_cb"
    assert ("copy", "w_host", "CUDA0#w_host#0") not in log


def test_graph_compute_allocates_then_runs() -> None:
    c = profiles.cpu()
    s = Scheduler([c], None, 64, False, True)
    x = ops.new_tensor_1d(F32, 4, "x").set_input()
    g = graph_of(ops.sqr(x).set_name("y").set_output(), size=64)
    log, copy, compute = _recorder()
    s.graph_compute(g, copy, compute)  # type: ignore[arg-type]
    assert log == [("compute", "0", "y")] and s.is_alloc
    fresh = Scheduler([profiles.cpu()], None, 64, False, True)
    x2 = ops.new_tensor_1d(F32, 4, "x").set_input()
    assert fresh.reserve(graph_of(ops.sqr(x2).set_output(), size=64))
    assert s.buffer_size(0) == fresh.buffer_size(0)  # alloc_graph reserved by itself (one buffer)
