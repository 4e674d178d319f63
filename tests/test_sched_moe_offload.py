"""MUL_MAT_ID and host experts in ggml_backend_sched on CUDA-like devices, on hand-built graphs.

The rule (ggml_backend_sched_split_graph, pass 1, with CUDA's offload_op): a node whose first weight
source is on the last (CPU) backend *in a host buffer* goes, when op offload is on, to the
lowest-index backend that supports the op and whose offload_op wants it; CUDA's offload_op for
MUL_MAT_ID reads the token dimension ne[2] against GGML_OP_OFFLOAD_MIN_BATCH (32). The expert tensor
then becomes a split input: the whole tensor is copied into that backend's compute buffer, at its
alloc size (CUDA pads quantized rows to 512 elements). Every expected number below is derived by hand
from that rule.
"""

from __future__ import annotations

import pytest
from sched_fixtures import cpu, gpu, weight

from toolkit.backend import Buffer, profiles
from toolkit.ggml import F32, Graph, Tensor, ops
from toolkit.ggml.tensor import BufferUsage
from toolkit.ggml.types import Q8_0
from toolkit.models.moe import expert_copies
from toolkit.sched import Scheduler
from toolkit.sched.plan import Cause

E, F, X, K = 64, 128, 4, 2          # n_embd, n_ff_exp, n_expert, n_expert_used


def _build(g1_router: Tensor, exps: Tensor, n_tokens: int) -> tuple[Graph, Tensor, Tensor]:
    """x (input) → logits on the router's device → softmax → argsort top-k → MUL_MAT_ID with the experts."""
    x = ops.new_tensor_2d(F32, E, n_tokens, "x").set_input()
    logits = ops.mul_mat(g1_router, x)
    logits.name = "logits"
    probs = ops.soft_max(logits)
    probs.name = "probs"
    top = ops.argsort_top_k(probs, K)
    top.name = "topk"
    xr = ops.reshape_3d(x, E, 1, n_tokens)
    y = ops.mul_mat_id(exps, xr, top)
    y.name = "moe_up"
    g = Graph(256)
    g.build_forward_expand(y)
    return g, y, top


def _placed(s: Scheduler, name: str) -> tuple[str, Cause]:
    n = next(n for n in s.plan().nodes if n.name == name)
    return n.backend, n.cause


def _host_experts(buft: object, type_: object = F32) -> Tensor:
    t = ops.new_tensor(type_, (E, F, X), "blk.0.ffn_up_exps.weight")  # type: ignore[arg-type]
    t.buffer = Buffer(buft, t.nbytes, BufferUsage.WEIGHTS)  # type: ignore[arg-type]
    return t


def test_batch_32_offloads_to_the_lowest_index_gpu_and_copies_the_whole_expert_tensor() -> None:
    g0, g1 = gpu(0), gpu(1)
    c = cpu()
    router = weight(g1, "router", E, X)             # the layer's other weights sit on CUDA1
    exps = _host_experts(c.buft)                     # experts in a host buffer (llama.cpp: CPU / CUDA_Host)
    s = Scheduler([g0, g1, c], None, 256, False, True)
    g, y, top = _build(router, exps, 32)
    assert s.reserve(g)
    assert _placed(s, "moe_up") == ("CUDA0", Cause.OP_OFFLOAD)
    plan = s.plan()
    # splits: CUDA1 (logits, probs, argsort), then CUDA0 (MUL_MAT_ID) with its sources copied in, in source
    # order: the experts (CPU host buffer), x as reshaped (a graph input, on the CPU) and the ids (CUDA1)
    assert [(sp.backend, [i.name for i in sp.inputs]) for sp in plan.splits] == [
        ("CUDA1", ["x"]), ("CUDA0", ["blk.0.ffn_up_exps.weight", "x (reshaped)", "topk"])]
    assert expert_copies(plan)[0].tensor == "blk.0.ffn_up_exps.weight"
    n_exps = E * F * X * 4                          # 131072: the whole tensor, not the used experts
    n_x = E * 32 * 4                                # 8192
    n_ids = (K - 1) * 4 + (32 - 1) * X * 4 + 4      # a view of the [X, 32] argsort: 504 bytes
    n_out = F * K * 32 * 4                          # 32768
    # CUDA0's compute buffer holds the three copies and the result, each aligned to 128
    assert s.buffer_size(0) == n_exps + n_x + 512 + n_out
    assert expert_copies(plan)[0].nbytes == n_exps == expert_copies(plan)[0].alloc_bytes
    assert n_ids <= 512


def test_batch_below_32_keeps_mul_mat_id_on_the_cpu() -> None:
    g0, g1 = gpu(0), gpu(1)
    c = cpu()
    router = weight(g1, "router", E, X)
    exps = _host_experts(c.buft)
    s = Scheduler([g0, g1, c], None, 256, False, True)
    g, y, _ = _build(router, exps, 16)
    assert s.reserve(g)
    assert _placed(s, "moe_up") == ("CPU", Cause.WEIGHT)
    plan = s.plan()
    assert [sp.backend for sp in plan.splits] == ["CUDA1", "CPU"]
    assert expert_copies(plan) == []
    assert s.buffer_size(0) == 0


def test_op_offload_off_keeps_mul_mat_id_on_the_cpu() -> None:
    g0, g1 = gpu(0), gpu(1)
    c = cpu()
    exps = _host_experts(c.buft)
    s = Scheduler([g0, g1, c], None, 256, False, False)
    g, y, _ = _build(weight(g1, "router", E, X), exps, 64)
    assert s.reserve(g)
    assert _placed(s, "moe_up")[0] == "CPU"
    assert expert_copies(s.plan()) == []


def test_experts_in_a_device_buffer_are_not_offloaded() -> None:
    """Only a host buffer on the last backend triggers op offload; experts on CUDA1 stay there."""
    g0, g1 = gpu(0), gpu(1)
    c = cpu()
    exps = ops.new_tensor(F32, (E, F, X), "blk.0.ffn_up_exps.weight")
    exps.buffer = Buffer(g1.buft, exps.nbytes, BufferUsage.WEIGHTS)
    s = Scheduler([g0, g1, c], None, 256, False, True)
    g, y, _ = _build(weight(g1, "router", E, X), exps, 64)
    assert s.reserve(g)
    assert _placed(s, "moe_up") == ("CUDA1", Cause.WEIGHT)
    assert len(s.plan().splits) == 1 and expert_copies(s.plan()) == []


def test_quantized_experts_copy_with_cuda_row_padding() -> None:
    """Q8_0 rows of 64 elements: CUDA pads each to 512 elements, +448/32*34 = 476 bytes once (ne[0] padding
    of the last row, ggml_backend_cuda_buffer_type_get_alloc_size)."""
    g0 = gpu(0)
    c = cpu()
    exps = _host_experts(c.buft, Q8_0)
    s = Scheduler([g0, c], None, 256, False, True)
    g, y, _ = _build(weight(g0, "router", E, X), exps, 48)
    assert s.reserve(g)
    assert _placed(s, "moe_up")[0] == "CUDA0"
    (cp,) = expert_copies(s.plan())
    assert cp.nbytes == (E // 32) * 34 * F * X == 34816
    assert cp.alloc_bytes == 35328            # 34816 + 476 = 35292, aligned up to CUDA's 128


@pytest.mark.parametrize("min_batch", [16, 64])
def test_offload_threshold_follows_min_batch(min_batch: int) -> None:
    g0 = profiles.cuda_like(0, min_batch=min_batch)
    c = cpu()
    exps = _host_experts(c.buft)
    s = Scheduler([g0, c], None, 256, False, True)
    g, y, _ = _build(weight(g0, "router", E, X), exps, 32)
    assert s.reserve(g)
    assert _placed(s, "moe_up")[0] == ("CUDA0" if 32 >= min_batch else "CPU")


@pytest.mark.parametrize("n_cpu_moe", [1, 2])
def test_llama_moe_context_on_a_cuda_like_gpu(n_cpu_moe: int) -> None:
    """The whole model on CUDA0 but the experts of the first n layers: in a pp graph (512 tokens) each of
    those 3n expert MUL_MAT_IDs is offloaded back to CUDA0 and starts a split of its own (its expert tensor
    is the split's input); in the tg graph (1 token) each such layer's MUL_MAT_IDs stay on the CPU, which
    adds two splits per layer (CUDA0 -> CPU -> CUDA0). The base is 2 splits (token_embd's GET_ROWS on the
    CPU, then CUDA0)."""
    from toolkit.context import Context
    from toolkit.models import ContextParams, HParams
    from toolkit.models.moe import MoEParams

    hp = HParams(n_layer=3, n_embd=64, n_head=4, n_head_kv=2, n_ff=128,
                      moe=MoEParams(n_expert=4, n_expert_used=2), name="m")
    ctx = Context(hp, ContextParams(n_ctx=1024, n_ubatch=512, flash_attn="on", devices=("cuda",),
                                    n_cpu_moe=n_cpu_moe))
    ev = ctx.events[-1]
    assert (ev.graphs["pp"].n_splits, ev.graphs["tg"].n_splits) == (2 + 3 * n_cpu_moe, 2 + 2 * n_cpu_moe)
    copies = expert_copies(ctx.scheduler.plan())  # the last reserve is the pp graph
    assert [c.tensor for c in copies] == [f"blk.{il}.ffn_{n}_exps.weight" for il in range(n_cpu_moe)
                                          for n in ("gate", "up", "down")]
    assert {c.backend for c in copies} == {"CUDA0"} and {c.nbytes for c in copies} == {64 * 128 * 4 * 4}
    ctx.graph_reserve(1, 1, 1, split_only=True)
    assert expert_copies(ctx.scheduler.plan()) == []
