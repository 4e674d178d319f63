"""Device profiles and buffer types: predicates, op-offload batch rule, CUDA's alloc_size padding, the
scheduler tests' fake GPU and CPU."""

from __future__ import annotations

import pytest

from toolkit.backend import Buffer, BufferType, cuda_batch_size, profiles
from toolkit.ggml import F32, I32, Q4_0, ops
from toolkit.ggml.tensor import BufferUsage, Op


def _mm(n_tokens: int):  # type: ignore[no-untyped-def]
    w = ops.new_tensor_2d(F32, 16, 16, "w")
    return ops.mul_mat(w, ops.new_tensor_2d(F32, 16, n_tokens, "x"))


def test_cpu_profile() -> None:
    c = profiles.cpu()
    assert (c.name, c.kind, c.buft.name, c.buft.alignment, c.buft.is_host) == ("CPU", "cpu", "CPU", 32, True)
    assert c.is_cpu and not c.offload_op(_mm(1024))
    # the CPU reads any host buffer (a GPU's pinned host buft included), no device buffer
    g = profiles.cuda_like(0)
    assert c.supports_buft(g.host_buft) and not c.supports_buft(g.buft)


def test_cuda_like_profile() -> None:
    g = profiles.cuda_like(1, min_batch=32)
    assert (g.name, g.kind, g.buft.alignment, g.buft.is_host) == ("CUDA1", "gpu", 128, False)
    assert g.host_buft is not None and (g.host_buft.name, g.host_buft.alignment, g.host_buft.is_host) == (
        "CUDA_Host", 32, True)
    assert g.caps_async and g.caps_events
    assert g.supports_buft(g.buft) and not g.supports_buft(g.host_buft)
    assert not g.offload_op(_mm(31)) and g.offload_op(_mm(32))
    # shared CUDA_Host for the CPU backend's compute buffer
    c = profiles.cpu(g.host_buft)
    assert c.buft is g.host_buft


def test_cuda_batch_rule() -> None:
    tok = ops.new_tensor_2d(F32, 8, 100, "tok")
    ids = ops.new_tensor_1d(I32, 64, "ids")
    assert cuda_batch_size(ops.get_rows(tok, ids)) == 0          # never offloaded
    assert cuda_batch_size(_mm(40)) == 40                         # MUL_MAT: ne[1]
    a = ops.new_tensor_3d(F32, 16, 4, 48, "a")
    pos = ops.new_tensor_1d(I32, 48, "pos")
    assert cuda_batch_size(ops.rope_ext(a, pos, None, 16)) == 48  # ROPE: ne[2]
    assert cuda_batch_size(ops.silu(a)) == 4 * 48                 # nrows


def test_min_batch_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GGML_OP_OFFLOAD_MIN_BATCH", "8")
    g = profiles.cuda_like(0)
    assert g.profile.min_batch == 8 and g.offload_op(_mm(8))
    monkeypatch.setenv("GGML_OP_OFFLOAD_MIN_BATCH", "many")
    with pytest.raises(ValueError, match="GGML_OP_OFFLOAD_MIN_BATCH='many'"):
        profiles.cuda_like(0)


def test_metal_offloads_only_matmuls() -> None:
    m = profiles.metal_like(0, min_batch=32)
    a = ops.new_tensor_2d(F32, 16, 64, "a")
    assert m.offload_op(_mm(64)) and not m.offload_op(ops.silu(a))


def test_rpc_like_is_a_remote_cpu() -> None:
    r = profiles.rpc_like(0, "127.0.0.1:50053")
    assert r.name == "RPC0[127.0.0.1:50053]" and r.buft.name == r.name
    assert r.kind == "gpu" and not r.caps_async and not r.caps_events and r.host_buft is None
    assert not r.offload_op(_mm(4096))
    assert r.buft.alignment == 32 and not r.buft.is_host


def test_blas_like_shares_cpu_buft_and_runs_only_matmul() -> None:
    c = profiles.cpu()
    b = profiles.blas_like(c)
    assert b.buft is c.buft and b.kind == "accel"
    a = ops.new_tensor_2d(F32, 16, 4, "a")
    assert b.supports_op(_mm(4)) and b.supports_op(a) and not b.supports_op(ops.silu(a))


def test_tpu_and_simulated() -> None:
    t = profiles.tpu(0)
    assert t.name == "TPU0" and t.kind == "gpu" and t.buft.alignment == 128 and t.host_buft is None
    s = profiles.simulated(2, budget=1000)
    assert s.name == "SIM2" and s.buft.alloc_limit == 1000 and s.host_buft is not None
    assert s.host_buft.name == "SIM_Host"


def test_excluded_ops() -> None:
    g = profiles.cuda_like(0, excluded_ops=[Op.SQR, "SILU"])
    a = ops.new_tensor_1d(F32, 4, "a")
    assert not g.supports_op(ops.sqr(a)) and not g.supports_op(ops.silu(a))
    assert g.supports_op(ops.exp(a))
    g.without_ops("EXP")
    assert not g.supports_op(ops.exp(a))


def test_cuda_pads_quantized_rows() -> None:
    g = profiles.cuda_like(0)
    w = ops.new_tensor_2d(Q4_0, 96, 2, "w")
    # ggml_backend_cuda_buffer_type_get_alloc_size: + row_size(type, 512 - ne0 % 512) for quantized rows
    # that are not a multiple of 512
    assert g.buft.alloc_size(w) == w.nbytes + Q4_0.row_size(512 - 96)
    assert profiles.cpu().buft.alloc_size(w) == w.nbytes


def test_alloc_limit_budget() -> None:
    buft = BufferType("dev", 128, alloc_limit=1000)
    b1 = buft.alloc_buffer(600)
    assert b1 is not None and buft.in_use == 600 and buft.available == 400
    assert buft.alloc_buffer(600) is None
    b1.free()
    assert buft.in_use == 0 and buft.alloc_buffer(1000) is not None
    # weights placed directly do not count against the compute budget
    Buffer(buft, 10_000, BufferUsage.WEIGHTS)
    assert buft.in_use <= 1000


def test_buffer_type_validation() -> None:
    with pytest.raises(ValueError, match="alignment 48 is not a power of two"):
        BufferType("bad", 48)
