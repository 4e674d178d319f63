"""Bad input raises a ToolkitError naming the value and the limit; the context and its scheduler stay usable."""

from __future__ import annotations

import pytest

from toolkit.context import Context
from toolkit.errors import AllocationError, ParameterError, ToolkitError
from toolkit.models import ContextParams, presets


def _ctx() -> Context:
    return Context(presets.tiny(), ContextParams(n_ctx=256, n_ubatch=256, flash_attn="off", n_gpu_layers=0))


@pytest.mark.parametrize(("changes", "words"), [
    ({"max_nodes": 0}, ("max_nodes=0", "from 1")),
    ({"max_nodes": -4}, ("max_nodes=-4", "from 1")),
    # wrong types are refused, not coerced: a string is truthy, True is 1
    ({"max_nodes": True}, ("max_nodes=True", "an integer")),
    ({"parallel": "yes"}, ("parallel='yes'", "True or False")),
    ({"op_offload": "no"}, ("op_offload='no'", "True or False")),
    ({"max_nodes": 60}, ("max_nodes=60", "too small", "capacity 60")),
    ({"max_nodes": 77, "op_offload": False}, ("max_nodes=77", "too small", "capacity 77")),
    ({"devices": ("gpu",)}, ("unknown device 'gpu'", "known kinds")),
    ({"n_ubatch": 1024, "n_batch": 512}, ("n_ubatch=1024", "n_batch=512")),
    ({"n_gpu_layers": -2}, ("n_gpu_layers=-2", "from 0")),
    ({"type_k": "q8_0", "type_v": "q8_0"}, ("type_k='q8_0'", "block size 32", "n_embd_head_k=16")),
    ({"type_v": "q4_0"}, ("type_v='q4_0'", "n_embd_head_v=16")),
    ({"n_ctxx": 5}, ("n_ctxx",)),
])
def test_bad_input_keeps_the_context(changes: dict, words: tuple[str, ...]) -> None:
    ctx = _ctx()
    s0, sizes0, params0, cp0 = ctx.scheduler, ctx.compute_buffers_bytes(), ctx.sched_params_cur, ctx.cparams
    n_events = len(ctx.events)
    with pytest.raises(ToolkitError) as e:
        ctx.update(**changes)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    assert ctx.scheduler is s0 and ctx.sched_params_cur == params0 and ctx.cparams == cp0
    assert ctx.compute_buffers_bytes() == sizes0 == {"CPU": 32965632}   # oracle: cpu-tiny c256 FA off
    assert len(ctx.events) == n_events + 1 and ctx.events[-1].decision == "error"
    assert ctx.events[-1].error == str(e.value)
    # still usable: the next reserve reuses the same scheduler
    ev = ctx.update(max_nodes=1024)
    assert ev.decision == "reused" and ctx.scheduler is s0
    assert ctx.compute_buffers_bytes() == sizes0


def test_too_small_max_nodes_at_creation() -> None:
    with pytest.raises(ParameterError, match="max_nodes=50 is not accepted.*too small"):
        Context(presets.tiny(), ContextParams(n_ctx=256, n_gpu_layers=0), max_nodes=50)


def test_a_reused_scheduler_still_needs_graph_capacity() -> None:
    """llama's graph container has max_nodes slots even when a larger scheduler is kept (78 nodes here)."""
    ctx = _ctx()
    with pytest.raises(ValueError, match="capacity 70"):
        ctx.update(max_nodes=70)
    ev = ctx.update(max_nodes=78)
    assert ev.decision == "reused" and ev.hash_size == 1031 and ev.params.max_nodes == 78


def test_quantized_v_cache_needs_flash_attention() -> None:
    with pytest.raises(ParameterError, match="type_v=.q8_0.*V cache quantization requires flash_attn"):
        Context(presets.small(), ContextParams(n_ctx=256, flash_attn="off", type_v="q8_0", n_gpu_layers=0))


def test_a_bug_propagates_unchanged_and_the_state_is_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only expected errors (ToolkitError) become error events; anything else escapes as it is,
    after the transactional update has put the previous scheduler and params back."""
    ctx = _ctx()
    s0, params0, cp0, n_events = ctx.scheduler, ctx.sched_params_cur, ctx.cparams, len(ctx.events)

    def broken(*_a: object, **_k: object) -> None:
        raise KeyError("a bug in a reserve")

    monkeypatch.setattr(ctx, "sched_reserve", broken)
    with pytest.raises(KeyError, match="a bug in a reserve"):
        ctx.update(n_ctx=512)
    assert ctx.scheduler is s0 and ctx.sched_params_cur == params0 and ctx.cparams == cp0
    assert len(ctx.events) == n_events            # no error event for a bug
    monkeypatch.undo()
    assert ctx.update(n_ctx=512).decision == "reused"


def test_absurd_max_nodes_is_refused_with_the_host_bytes() -> None:
    """max_nodes=2**32-1 would need a hash set and graph copies of about a terabyte on the host:
    llama.cpp could not allocate them, so the toolkit refuses instead of planning as if real."""
    ctx = _ctx()
    before = (ctx.scheduler, ctx.compute_buffers_bytes(), ctx.sched_params_cur)
    with pytest.raises(AllocationError, match=r"max_nodes=4294967295 need \d+ bytes") as e:
        ctx.update(max_nodes=2**32 - 1)
    assert "host memory limit" in str(e.value)
    assert (ctx.scheduler, ctx.compute_buffers_bytes(), ctx.sched_params_cur) == before
    with pytest.raises(ParameterError, match="max_nodes=9223372036854775808"):
        ctx.update(max_nodes=2**63)


def test_huge_n_ctx_on_the_cpu_is_refused_and_a_smaller_limit_applies() -> None:
    ctx = _ctx()
    with pytest.raises(AllocationError, match=r"n_ctx=1000000000.*need \d+ bytes"):
        ctx.update(n_ctx=10**9)
    assert ctx.cparams.n_ctx != 10**9 and ctx.events[-1].decision == "error"
    # the limit can be set: the tiny context's CPU buffers do not fit in 1 MiB
    with pytest.raises(AllocationError, match="host memory limit of 1048576 bytes"):
        Context("tiny", ContextParams(n_ctx=512), host_memory=2**20)


def test_n_ctx_beyond_n_ctx_train_warns_as_llama_cpp() -> None:
    ev = Context("tiny", ContextParams(n_ctx=8192, n_batch=512, n_ubatch=512)).events[-1]
    assert "llama_context: n_ctx_seq (8192) > n_ctx_train (4096) -- possible training context overflow" in ev.warnings


def test_a_refused_update_keeps_buffers_that_earlier_reserves_grew() -> None:
    """Reuse keeps the larger buffer (ggml_gallocr only grows): after n_ubatch 512 and back to 128 the
    CPU compute buffer stays at its 512-token size. A refused change must leave it there, not at what
    a reserve from scratch with the current params would give."""
    base = ContextParams(n_ctx=512, n_batch=512, n_ubatch=128)
    ctx = Context("tiny", base)
    fresh = ctx.compute_buffers_bytes()
    ctx.update(n_ubatch=512)
    ctx.update(n_ubatch=128)
    grown = ctx.scheduler.buffer_sizes()
    assert ctx.events[-1].decision == "reused" and sum(grown) > sum(fresh.values())
    with pytest.raises(AllocationError, match="host memory limit"):
        ctx.update(n_ctx=2**31)
    assert ctx.scheduler.buffer_sizes() == grown

