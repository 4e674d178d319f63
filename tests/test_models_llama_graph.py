"""The llama graph against llama.cpp's GGML_SCHED_DEBUG=2 dumps, node for node (index, op, name, size, sources)."""

from __future__ import annotations

import pytest
from oracle_cases import DUMPS, case, debug_case_ids, fmt_size, parse_dump

from toolkit.cases import cparams_from_case
from toolkit.ggml.tensor import is_view_op
from toolkit.models import ContextParams, HParams, archs, presets
from toolkit.models.archs import ROPE_TYPE_NORM
from toolkit.models.archs.llama import LlamaGraphBuilder
from toolkit.models.devices import make_devices
from toolkit.models.graph import GraphBuilder
from toolkit.models.inputs import InputOutIds
from toolkit.models.loader import load_model
from toolkit.models.memory import Memory, create_memory, make_kv_cache


def _builder(case_id: str) -> GraphBuilder:
    c = case(case_id)
    hp = HParams.from_dict(c["model"])
    cp = cparams_from_case(c["cparams"])
    rp = cp.resolve(hp.n_ctx_train)
    fa = bool(c["observed"]["flash_attn_effective"])
    ds = make_devices(cp.devices, split_mode=cp.split_mode)
    arch = archs.get(hp.arch)
    # gemma4 creates its tied output before token_embd: the head's weight is its own leaf (numbered
    # where the DFS first reaches result_output), as in the model setup
    m = load_model(hp, cp, ds, arch.weights(hp), tied_output_first=arch.tied_output_first)
    memory = create_memory(m, rp, offload_kqv=cp.offload_kqv, flash_attn=fa, swa_full=cp.swa_full,
                           unified=cp.kv_unified, kind=arch.memory)
    return arch.make_builder(m, memory, flash_attn=fa, graph_size=1024)


def _src_name_matches(ours: str, dumped: str) -> bool:
    """The scheduler redirects sources to copies named ``<backend>#<src>#<copy>`` (truncated to 20); the dump
    right-aligns names in 20 columns, so a view of an unnamed tensor (`` (view)``) reads without its space."""
    if dumped.startswith(("RPC", "CPU#")) and "#" in dumped or dumped.startswith("RPC0[") and ours[:20] != dumped:
        parts = dumped.split("#")
        return len(parts) < 2 or ours.startswith(parts[1]) or parts[1].startswith(ours[:len(parts[1])])
    return ours[:20] == dumped or ours[:20].lstrip() == dumped


@pytest.mark.parametrize("case_id", debug_case_ids())
def test_graph_matches_dump_node_by_node(case_id: str) -> None:
    b = _builder(case_id)
    reserves = parse_dump(DUMPS / f"{case_id}.txt")
    assert len(reserves) == 9  # 6 fused-op probes, pp, tg, pp
    for r in reserves:
        g = b.build(r.n_tokens, r.n_seqs, r.n_outputs).graph
        ours = [(i, t) for i, t in enumerate(g.nodes) if not is_view_op(t.op)]
        theirs = r.nodes
        assert len(ours) == len(theirs), (r.n_tokens, len(ours), len(theirs))
        for (i, t), d in zip(ours, theirs):
            assert i == d.index, (t.name, i, d.index)
            assert t.op_desc()[:10] == d.op, (i, t.op_desc(), d.op)
            assert t.name[:20].strip() == d.name, (i, t.name, d.name)   # the dump strips the padding
            assert fmt_size(t.nbytes) == d.size, (i, t.name, t.nbytes, d.size)
            assert len(t.srcs) == len(d.srcs), (i, t.name)
            for s, (n, sz, _) in zip(t.srcs, d.srcs):
                assert fmt_size(s.nbytes) == sz, (i, t.name, s.name)
                assert _src_name_matches(s.name, n), (i, t.name, s.name, n)


@pytest.mark.parametrize(("fa", "per_layer"), [(True, 31), (False, 36)])
@pytest.mark.parametrize("model", ["tiny", "small", "med"])
def test_node_count_rule(model: str, fa: bool, per_layer: int) -> None:
    """README of the oracle: 31 (FA on) / 36 (FA off) nodes per layer + 6; no dependence on n_ctx or ubatch."""
    hp = presets.get(model)
    for n_ctx, ub in ((256, 128), (4096, 512)):
        cp = ContextParams(n_ctx=n_ctx, n_ubatch=ub, flash_attn="on" if fa else "off", n_gpu_layers=0)
        rp = cp.resolve(hp.n_ctx_train)
        m = load_model(hp, cp, make_devices(()), archs.get(hp.arch).weights(hp),
                       tied_output_first=archs.get(hp.arch).tied_output_first)
        kv = make_kv_cache(m, rp, offload_kqv=True, flash_attn=fa)
        b = LlamaGraphBuilder(m, Memory([kv]), flash_attn=fa, graph_size=2048, rope_type=ROPE_TYPE_NORM)
        g = b.build(rp.n_ubatch, 1, rp.n_ubatch)
        assert g.graph.n_nodes == per_layer * hp.n_layer + 6


def test_out_ids_leaf_number_small() -> None:
    """The output-row ids are leaf_50 in the small model's dump (leaf numbering follows ggml's visit order)."""
    b = _builder("rpc1-small_f32-ngl3-c1024-b2048-ub512-faon-DEBUG")
    g = b.build(512, 1, 512)
    assert g.input(InputOutIds).out_ids.name == "leaf_50"


def test_streams_add_cache_reshapes() -> None:
    """-np 4 without a unified cache: one reshape per cache write (2 per layer with FA, 1 without)."""
    hp = presets.tiny()
    counts = {}
    for fa in (True, False):
        for unified in (True, False):
            cp = ContextParams(n_ctx=4096, n_ubatch=512, n_seq_max=4, kv_unified=unified,
                               flash_attn="on" if fa else "off", n_gpu_layers=0)
            rp = cp.resolve(hp.n_ctx_train)
            m = load_model(hp, cp, make_devices(()), archs.get(hp.arch).weights(hp),
                           tied_output_first=archs.get(hp.arch).tied_output_first)
            kv = make_kv_cache(m, rp, offload_kqv=True, flash_attn=fa)
            g = LlamaGraphBuilder(m, Memory([kv]), flash_attn=fa, graph_size=1024,
                                  rope_type=ROPE_TYPE_NORM).build(512, 4, 512)
            counts[fa, unified] = g.graph.n_nodes
    # measured: cpu-tiny ...-np4 (72 / 80) and the bb-*-kvu1 cases (68 / 78)
    assert counts == {(True, True): 68, (True, False): 72, (False, True): 78, (False, False): 80}
