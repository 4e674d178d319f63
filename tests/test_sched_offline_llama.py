"""planner="offline" on llama graphs: never above ggml, never below the bound, never overlapping."""

from __future__ import annotations

import pytest

from toolkit.context import Context
from toolkit.models import ContextParams, presets
from toolkit.sched.plan import Plan, TensorAlloc


def chain_roots(allocs: list[TensorAlloc]) -> list[int]:
    """Index of the tensor whose memory each alloc's in-place chain (``ggml_gallocr_allocate_node``) reuses.

    ggml names repeat (llama names the raw norm and its weighted product alike), so a parent is
    the latest earlier-allocated tensor of that name.
    """
    by_name: dict[str, list[int]] = {}
    for i, a in enumerate(allocs):
        by_name.setdefault(a.name, []).append(i)

    def parent(i: int) -> int | None:
        a = allocs[i]
        if a.inplace_of is None:
            return None
        cands = [j for j in by_name.get(a.inplace_of, []) if j != i and allocs[j].first <= a.first]
        return max(cands, key=lambda j: (allocs[j].first, j)) if cands else None

    roots = []
    for i in range(len(allocs)):
        k, seen = i, {i}
        while (p := parent(k)) is not None and p not in seen:
            seen.add(p)
            k = p
        roots.append(k)
    return roots


def assert_no_live_overlap(plan: Plan) -> None:
    for buft in {a.buft for a in plan.allocs}:
        allocs = [a for a in plan.allocs if a.buft == buft and a.size > 0]
        roots = chain_roots(allocs)
        for i, a in enumerate(allocs):
            for j in range(i + 1, len(allocs)):
                b = allocs[j]
                if roots[i] == roots[j] or a.chunk != b.chunk:
                    continue
                live_together = a.first <= b.last and b.first <= a.last
                share_bytes = a.offset < b.offset + b.size and b.offset < a.offset + a.size
                assert not (live_together and share_bytes), (buft, a, b)


CASES = [("tiny", 256, "on", ()), ("tiny", 4096, "off", ()), ("small", 1024, "off", ()),
         ("small", 512, "on", ("cuda",)), ("small", 2048, "off", ("cuda",))]


@pytest.mark.parametrize(("model", "n_ctx", "fa", "devices"), CASES)
def test_offline_is_between_the_bound_and_ggml(model: str, n_ctx: int, fa: str, devices: tuple[str, ...]) -> None:
    cp = ContextParams(n_ctx=n_ctx, n_ubatch=512, flash_attn=fa, devices=devices)  # type: ignore[arg-type]
    ggml = Context(presets.get(model), cp, planner="ggml").events[-1].plan
    offline = Context(presets.get(model), cp, planner="offline").events[-1].plan
    assert ggml is not None and offline is not None
    assert [b.buft for b in ggml.buffers] == [b.buft for b in offline.buffers]
    for g, o in zip(ggml.buffers, offline.buffers, strict=True):
        assert g.lower_bound == o.lower_bound  # same graph, same lifetimes
        assert o.lower_bound is not None and o.lower_bound <= o.needed <= g.needed
        assert o.needed <= o.lower_bound * 1.02  # issue 9's target on llama graphs
    assert_no_live_overlap(offline)
    assert_no_live_overlap(ggml)  # the checker itself accepts ggml's (valid) plan


def test_offline_plan_is_aligned() -> None:
    cp = ContextParams(n_ctx=512, n_ubatch=512, flash_attn="off", devices=("cuda",))
    ctx = Context(presets.get("small"), cp, planner="offline")
    plan = ctx.events[-1].plan
    assert plan is not None
    align = {ctx.scheduler.bufts[i].name: ctx.scheduler.bufts[i].alignment for i in range(ctx.scheduler.n_backends)}
    assert any(a > 1 for a in align.values())
    for a in plan.allocs:
        assert a.offset % align[a.buft] == 0, a
