"""Tensor buffer-type overrides (-ot, --cpu-moe, --n-cpu-moe) and the refusal of unimplemented MoE variants."""

from __future__ import annotations

import numpy as np
import pytest

from toolkit.context import Context
from toolkit.errors import ParameterError, UnsupportedFeature
from toolkit.models import ContextParams, HParams
from toolkit.models.moe import MoEParams
from toolkit.models.overrides import FFN_EXPS_REGEX, exps_block_regex, match, parse


def moe(dtype: str = "f32", n_layer: int = 2) -> HParams:
    return HParams(n_layer=n_layer, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, dtype=dtype,
                        moe=MoEParams(n_expert=4, n_expert_used=2), name="m")


def test_patterns_are_llama_cpps() -> None:
    assert FFN_EXPS_REGEX == r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
    assert exps_block_regex(1) == r"blk\.1\.ffn_(up|down|gate|gate_up)_(ch|)exps"
    rules = parse((), False, 2, ["CPU"])
    assert match(rules, "blk.1.ffn_gate_exps.weight") is rules[1]
    assert match(rules, "blk.10.ffn_gate_exps.weight") is None   # blk\.1\. does not match blk.10
    assert match(rules, "blk.0.ffn_gate_inp.weight") is None     # the router is not an expert tensor
    assert match(parse((), True, 0, ["CPU"]), "blk.7.ffn_gate_up_exps.weight") is not None


def test_first_match_wins_and_items_split_on_commas() -> None:
    rules = parse(("blk\\.0\\.=RPC0[h:1],ffn_=CPU",), True, 0, ["RPC0[h:1]", "CPU"])
    assert [(r.pattern, r.buft) for r in rules] == [("blk\\.0\\.", "RPC0[h:1]"), ("ffn_", "CPU"),
                                                    (FFN_EXPS_REGEX, "CPU")]
    assert match(rules, "blk.0.ffn_up_exps.weight").buft == "RPC0[h:1]"  # type: ignore[union-attr]
    assert match(rules, "blk.1.ffn_up_exps.weight").pattern == "ffn_"  # type: ignore[union-attr]


@pytest.mark.parametrize(("items", "fragment"), [
    (("ffn_(=CPU",), "valid regular expression"),
    (("ffn_exps",), "REGEX=BUFT"),
    (("=CPU",), "REGEX=BUFT"),
])
def test_bad_items_are_refused_at_construction(items: tuple[str, ...], fragment: str) -> None:
    with pytest.raises(ParameterError) as e:
        ContextParams(override_tensor=items)
    assert e.value.param == "override_tensor" and fragment in str(e.value)


def test_unknown_buffer_type_names_the_known_ones_and_keeps_the_context() -> None:
    ctx = Context(moe(), ContextParams(n_ctx=256, devices=("rpc:1",)))
    before = ctx.compute_buffers_bytes()
    with pytest.raises(ParameterError) as e:
        ctx.update(override_tensor=("exps=CUDA0",))
    assert e.value.param == "override_tensor" and "RPC0[127.0.0.1:50052], CPU" in str(e.value)
    assert ctx.cparams.override_tensor == () and ctx.compute_buffers_bytes() == before
    with pytest.raises(ParameterError):
        ContextParams(n_cpu_moe=-1)


def test_override_to_a_device_buft_and_pipeline_parallelism_off() -> None:
    cp = ContextParams(n_ctx=256, devices=("cuda", "cuda"), override_tensor=("blk\\.0\\.ffn_up_exps=CUDA1",))
    ctx = Context(moe(), cp)
    (o,) = ctx.setup.model.tensor_overrides
    assert (o.tensor, o.buft, o.bytes) == ("blk.0.ffn_up_exps.weight", "CUDA1", 64 * 128 * 4 * 4)
    assert ctx.setup.pp_check["has_tensor_overrides"] and not ctx.pipeline_parallel
    assert ctx.setup.warnings == []  # only an override to CPU warns about mmap
    assert Context(moe(), cp.replace(override_tensor=())).pipeline_parallel


def test_an_override_that_matches_nothing_still_counts() -> None:
    """llama_model::has_tensor_overrides is true as soon as an override is given (even on the CPU); the mmap
    warning comes only when a tensor matched an override to CPU (llama_model_loader, inside the match: the
    oracle's --n-cpu-moe 1 over deepseek2's and glm4moe's dense layer 0 logs none)."""
    ctx = Context(moe(), ContextParams(n_ctx=256, override_tensor=("nothing_matches=CPU",)))
    assert ctx.setup.model.tensor_overrides == [] and ctx.setup.pp_check["has_tensor_overrides"]
    assert not any("mmap" in w for w in ctx.setup.warnings)
    ctx = Context(moe(), ContextParams(n_ctx=256, override_tensor=("ffn_up_exps=CPU",)))
    assert ctx.setup.model.tensor_overrides and "mmap" in ctx.setup.warnings[0]


@pytest.mark.parametrize(("use_mmap", "buffer", "logged"), [(True, "CPU_Mapped", "CUDA_Host"),
                                                            (False, "CUDA_Host", "CUDA_Host")])
def test_cpu_override_with_a_gpu_goes_to_its_host_buft(use_mmap: bool, buffer: str, logged: str) -> None:
    """llama's CPU buft list puts the first GPU's host buft before the CPU's; with mmap a host buft
    becomes the CPU buft (CPU_Mapped)."""
    ctx = Context(moe(), ContextParams(n_ctx=256, devices=("cuda",), cpu_moe=True, use_mmap=use_mmap))
    ov = ctx.setup.model.tensor_overrides
    assert len(ov) == 6 and {o.buft for o in ov} == {logged}
    exps = sum(o.bytes for o in ov)
    assert buffer in ctx.model_buffers_bytes
    if not use_mmap:
        assert ctx.model_buffers_bytes["CUDA_Host"] == exps  # 32-byte aligned already
        assert ctx.setup.warnings == []


def test_cpu_override_without_a_host_buft_uses_repack_for_q4_0() -> None:
    """No GPU host buft (CPU only): the repack buft comes first when it runs MUL_MAT_ID on a 3-D Q4_0 weight."""
    ctx = Context(moe("q4_0"), ContextParams(n_ctx=256, cpu_moe=True))
    assert {o.buft for o in ctx.setup.model.tensor_overrides} == {"CPU_REPACK"}
    q8 = Context(moe("q8_0"), ContextParams(n_ctx=256, cpu_moe=True))
    assert {o.buft for o in q8.setup.model.tensor_overrides} == {"CPU"}


def test_moe_variants_not_built_are_refused_by_name(tmp_path: object) -> None:
    from gguf import GGUFWriter

    from toolkit.models.gguf import hparams_from_gguf

    path = f"{tmp_path}/shexp.gguf"
    w = GGUFWriter(path, "llama")
    for k, v in (("block_count", 1), ("embedding_length", 64), ("feed_forward_length", 128),
                 ("attention.head_count", 4), ("expert_count", 4), ("expert_used_count", 2),
                 ("expert_shared_count", 1)):
        w.add_uint32(f"llama.{k}", v)
    w.add_tensor("token_embd.weight", np.zeros((8, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedFeature) as e:
        hparams_from_gguf(path)
    assert e.value.feature == "shared experts"
    with pytest.raises(UnsupportedFeature) as e2:
        MoEParams(n_expert=4, n_expert_used=2, gating="sqrt_softplus")
    assert e2.value.feature == "expert gating sqrt_softplus"


def test_update_n_cpu_moe_on_a_live_context_gives_llama_cpps_numbers() -> None:
    """tiny_moe_f32 on one RPC server (-ngl 99 -c 1024 -ub 512 -fa on), then --n-cpu-moe 1 and 2 on the same
    context: llama.cpp printed RPC0 65667072 / CPU 1325056 and 2 splits without overrides, RPC0 65800192 /
    CPU 2242560 with 4 and 6 splits (the buffers only grow, so a reused scheduler shows the same)."""
    ctx = Context(moe(), ContextParams(n_ctx=1024, n_batch=2048, n_ubatch=512, flash_attn="on", devices=("rpc:1",)))
    rpc = "RPC0[127.0.0.1:50052]"
    got = [(ctx.compute_buffers_bytes()[rpc], ctx.compute_buffers_bytes()["CPU"], ctx.events[-1].graphs["pp"].n_splits)]
    for n in (1, 2):
        ev = ctx.update(n_cpu_moe=n)
        got.append((ctx.compute_buffers_bytes()[rpc], ctx.compute_buffers_bytes()["CPU"], ev.graphs["pp"].n_splits))
    assert got == [(65667072, 1325056, 2), (65800192, 2242560, 4), (65800192, 2242560, 6)]
    assert len(ctx.setup.model.tensor_overrides) == 6 and ctx.n_copies == 1


def test_n_cpu_moe_beyond_the_layers_matches_what_all_layers_match() -> None:
    """--n-cpu-moe N writes one blk.i pattern per i < N; past the last layer they match nothing, so
    N = 10**9 gives the placement of N = n_layer (and is planned as quickly)."""
    assert len(parse((), False, 10**9, ["CPU"], n_layer=2)) == 2

    def placed(n: int) -> tuple[object, ...]:
        ctx = Context(moe(), ContextParams(n_ctx=512, n_cpu_moe=n, devices=("rpc:1",)))
        return (ctx.model_buffers_bytes, ctx.compute_buffers_bytes(), tuple(ctx.setup.model.tensor_overrides))

    assert placed(10**9) == placed(2) != placed(1)
