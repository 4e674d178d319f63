"""qwen3, gemma3 (iSWA) and real Llama-3.x files against llama.cpp, every buffer compared.

The cases (tests/data/cases-qwen3-gemma3.json, tests/data/cases-llama3.json) were printed by
llama.cpp; each goes through the same general rules as the first oracle's (tests/test_oracle.py).
The debug dumps of these cases are compared node by node in tests/test_oracle.py.
"""

from __future__ import annotations

from collections import Counter
from functools import cache
from typing import Any

import pytest
from oracle_cases import arch_cases, assert_planned_matches, case

from toolkit.cases import plan_case
from toolkit.errors import UnsupportedFeature
from toolkit.models import HParams, archs

IDS = [c["id"] for c in arch_cases()]


@cache
def _planned(case_id: str) -> dict[str, Any]:
    return plan_case(case(case_id))


def test_cases_present() -> None:
    by = Counter((c["model"]["arch"], "llama3" if "llama3" in c["id"] else "") for c in arch_cases())
    assert by == {("qwen3", ""): 25, ("gemma3", ""): 21, ("llama", "llama3"): 46}
    assert len(set(IDS)) == len(IDS)


@pytest.mark.parametrize("case_id", IDS)
def test_case(case_id: str) -> None:
    assert_planned_matches(_planned(case_id), case(case_id)["observed"])


def test_swa_cache_is_smaller_than_the_full_one() -> None:
    """gemma3 at c 1024, ub 512: the non-SWA cache has 1024 cells, the SWA cache pad(128 + 512, 256) = 768."""
    got = _planned("cpu-tiny_gemma3_f32-c1024-b2048-ub512-faon")
    assert [(c["cache"], c["cells"], c["layers"]) for c in got["kv_caches"]] == [("non-SWA", 1024, 1), ("SWA", 768, 3)]
    full = _planned("cpu-tiny_gemma3_f32-c4096-b2048-ub512-faon-swafull")
    assert [(c["cache"], c["cells"]) for c in full["kv_caches"]] == [("non-SWA", 4096), ("SWA", 4096)]


def test_rope_freqs_on_every_device_with_a_repeating_layer() -> None:
    """Layers split over CPU and RPC: one rope_freqs copy per buffer type, so n_tensors grows by one."""
    split = _planned("rpc1-llama3_tiny_f32-ngl2-c1024-b2048-ub512-faon")
    whole = _planned("rpc1-llama3_tiny_f32-ngl99-c1024-b2048-ub512-faon")
    assert (split["n_tensors"], whole["n_tensors"]) == (23, 22)


def test_unsupported_architecture_is_refused() -> None:
    """The hyperparameters only name their architecture; a context over an unregistered one is refused."""
    from toolkit.context import Context

    with pytest.raises(UnsupportedFeature) as e:
        Context(HParams(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, arch="mamba"))
    assert "mamba" in str(e.value) and f"supported: {', '.join(archs.names())}" in str(e.value)
    with pytest.raises(UnsupportedFeature):
        Context({"arch": "qwen2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_ff": 128})


@pytest.mark.parametrize(("preset", "devices", "ngl", "n_tensors", "max_nodes"), [
    ("llama3_1_8b", (), 0, 292, 2336),
    ("llama3_1_8b", ("rpc:2",), 99, 293, 2344),    # rope_freqs on both devices
    ("llama3_2_1b", ("rpc:1",), 0, 147, 1176),
    ("llama3_2_1b", ("rpc:1",), 1, 148, 1184),     # the tied output duplicated onto the output device
])
def test_real_model_n_tensors_and_max_nodes(preset: str, devices: tuple[str, ...], ngl: int, n_tensors: int,
                                            max_nodes: int) -> None:
    """The oracle README's arithmetic for real Llama-3.x files: max_nodes = max(1024, 8 * n_tensors)."""
    from toolkit.context import Context
    from toolkit.models import ContextParams, presets

    ctx = Context(presets.get(preset), ContextParams(n_ctx=4096, devices=devices, n_gpu_layers=ngl))
    assert ctx.setup.model.n_tensors == n_tensors
    assert ctx.events[-1].params.max_nodes == max_nodes


def test_reserve_event_lists_both_kv_caches() -> None:
    """gemma3 with -ngl 2: the global layer's cache on RPC, the SWA cache on the CPU, each in its own
    memory group (llama.cpp logs one KV buffer line per cache); the totals are the oracle's per-buffer bytes."""
    from toolkit.cases import context_from_case

    c = case("rpc1-tiny_gemma3_f32-ngl2-oo1-c1024-b2048-ub512-faon")
    ev = context_from_case(c).events[-1]
    rpc = "RPC0[127.0.0.1:50052]"
    assert list(ev.memory) == ["model", "KV", "KV-SWA", "output", "compute"]
    assert (ev.memory["KV"], ev.memory["KV-SWA"]) == ({rpc: 262144}, {"CPU": 589824})
    assert ev.context_memory() == {rpc: 262144, "CPU": 589824}
    assert c["observed"]["kv_buffers_bytes"] == {rpc: 262144, "CPU": 589824}


def test_unsupported_architecture_in_a_gguf_is_refused(tmp_path: Any) -> None:
    import gguf

    from toolkit.models.gguf import hparams_from_gguf

    path = str(tmp_path / "phi3.gguf")
    w = gguf.GGUFWriter(path, "phi3")
    w.add_uint32("phi3.block_count", 2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedFeature) as e:
        hparams_from_gguf(path)
    assert "'phi3'" in str(e.value) and all(a in str(e.value) for a in ("llama", "qwen3", "gemma3"))


@pytest.mark.parametrize(("preset", "fa", "per_layer", "extra"), [
    ("qwen3_8b", "on", 35, 6), ("qwen3_8b", "off", 40, 6),
    ("gemma3_12b", "on", 40, 7), ("gemma3_27b", "off", 45, 7),
])
def test_node_count_rule_at_real_sizes(preset: str, fa: str, per_layer: int, extra: int) -> None:
    """The oracle README's per-layer counts (qwen3 35/40 + 6, gemma3 40/45 + 7) hold at any depth."""
    from toolkit.context import Context
    from toolkit.models import ContextParams, presets

    hp = presets.get(preset)
    ev = Context(hp, ContextParams(n_ctx=4096, n_ubatch=512, flash_attn=fa, n_gpu_layers=0)).events[-1]  # type: ignore[arg-type]
    assert ev.graphs["pp"].n_nodes == ev.graphs["tg"].n_nodes == per_layer * hp.n_layer + extra
