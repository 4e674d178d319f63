"""``ggml_backend_sched_reserve_size`` (what memory fitting's no_alloc contexts call) against the
oracle's graph-size probe: llama.cpp sized the pp and the tg graph each on its own with it
(``observed.graph_only_alloc_bytes`` in tests/data/cases.json).

reserve_size resets the scheduler before splitting, so the backends ``llama_context::graph_get_cb``
pinned while the graph was built (``norm`` on its layer's device with every layer offloaded or a
small ubatch; the merged heads on the CPU with ``-nkvo``) do not hold there, while a full reserve
keeps them. The cases where the two differ are the ones that show it.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from oracle_cases import case, cases

from toolkit.cases import context_from_case
from toolkit.context import Context

SIZED = [c["id"] for c in cases() if c["observed"].get("graph_only_alloc_bytes") and c["observed"]["rc"] == 0]


def _sizes(ctx: Context, n_tokens: int, n_seqs: int, n_outputs: int) -> dict[str, int]:
    ctx.graph_reserve(n_tokens, n_seqs, n_outputs, sizes=True)
    s = ctx.scheduler
    return {be.name: n for be, n in zip(s.backends, s.graph_needed_sizes(), strict=True)}


@cache
def _graph_sizes(cid: str) -> dict[tuple[str, str], int]:
    ctx = context_from_case(case(cid))
    rp = ctx.setup.resolved
    n_tokens, n_seqs = min(rp.n_ctx, rp.n_ubatch), rp.n_seq_max
    pp = _sizes(ctx, n_tokens, n_seqs, min(n_tokens, rp.n_outputs_max))
    tg = _sizes(ctx, n_seqs, n_seqs, n_seqs)
    return {**{("pp", b): n for b, n in pp.items()}, **{("tg", b): n for b, n in tg.items()}}


def test_the_probe_covers_the_cases() -> None:
    assert len(SIZED) == 169


@pytest.mark.parametrize("cid", SIZED)
def test_reserve_size_gives_the_graph_only_sizes(cid: str) -> None:
    got = _graph_sizes(cid)
    want = {(g["graph"], g["backend"]): g["bytes"] for g in case(cid)["observed"]["graph_only_alloc_bytes"]}
    assert {k: got[k] for k in want} == want


def _pp1(cid: str) -> dict[str, Any]:
    return {s["backend"]: s["bytes"] for s in case(cid)["observed"]["reserve_stages"] if s["stage"] == "pp1"}


def test_pins_make_the_full_reserve_differ() -> None:
    """Where llama.cpp's first pp reserve (a full reserve, pins held; its buffers are new, so their
    sizes are that plan's) and its size-only pp differ, the toolkit's context gives the first and
    reserve_size the second: the second RPC server with every layer offloaded (the norm pin) and
    -nkvo (the merged heads' pin)."""
    differ = []
    for cid in SIZED:
        only = {g["backend"]: g["bytes"] for g in case(cid)["observed"]["graph_only_alloc_bytes"] if g["graph"] == "pp"}
        if _pp1(cid) != only:
            differ.append(cid)
    assert len(differ) >= 10
    assert any("nkvo" in c for c in differ) and any(c.startswith("rpc2-") for c in differ)
    for cid in differ:
        ctx = context_from_case(case(cid))
        planned = {b.backend: b.needed["pp"] for b in ctx.events[-1].buffers}
        assert planned == _pp1(cid), cid


def _full_no_alloc_pp(ctx: Context) -> dict[str, int]:
    ev = ctx.events[-1]
    out: dict[str, int] = {}
    for b in ev.buffers:
        out[b.buft] = out.get(b.buft, 0) + b.needed["pp"]
    return out


@pytest.mark.parametrize("cid", SIZED[::7])
def test_reserve_size_alone_is_the_full_no_alloc_reserve(cid: str) -> None:
    """Memory fitting's probes call Context.reserve_size on a context made without a reserve: the pp
    sizes, the copies and the flash-attention decision are those of the whole no_alloc sched_reserve
    (fused-op probes and tg split, pp sized twice), which is what llama.cpp runs."""
    full = context_from_case(case(cid), no_alloc=True)
    alone = context_from_case(case(cid), no_alloc=True, reserve=False)
    assert alone.reserve_size() == _full_no_alloc_pp(full)
    assert (alone.n_copies, alone.flash_attn) == (full.n_copies, full.flash_attn)
