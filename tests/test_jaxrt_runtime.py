"""Compile cache, XLA analyses, devices, running a Context (decode, generate, compile_splits) and the ``run`` CLI."""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np
import pytest

from toolkit.jaxrt.devices import request_cpu_devices  # noqa: E402

request_cpu_devices(4)

from toolkit.backend import profiles  # noqa: E402
from toolkit.context import Context  # noqa: E402
from toolkit.errors import ParameterError, UnsupportedFeature  # noqa: E402
from toolkit.ggml import F32, Graph, ops  # noqa: E402
from toolkit.ggml.tensor import Op  # noqa: E402
from toolkit.jaxrt import cli  # noqa: E402
from toolkit.jaxrt.compile import CompileCache, SplitProgram, enable_persistent_cache  # noqa: E402
from toolkit.jaxrt.devices import make_backends, parse_devices  # noqa: E402
from toolkit.jaxrt.gguf_io import read_gguf, write_gguf  # noqa: E402
from toolkit.jaxrt.runtime import bind_executors, compile_splits, decode, generate, load_weights, runtime_of  # noqa: E402
from toolkit.models import ContextParams, presets  # noqa: E402
from toolkit.models.inputs import InputAttnKV  # noqa: E402

HP = dataclasses.replace(presets.tiny("f32"), n_vocab=128)


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    enable_persistent_cache(str(tmp_path_factory.mktemp("jaxcache")))
    path = str(tmp_path_factory.mktemp("m") / "tiny.gguf")
    write_gguf(path, HP, seed=5)
    return path


def ctx_for(path: str, **cp: object) -> Context:
    args: dict[str, object] = dict(n_ctx=256, n_batch=256, n_ubatch=32, flash_attn="off", type_k="f32",
                                   type_v="f32", devices=("sim", "sim"))
    args.update(cp)
    ctx = Context(read_gguf(path, with_tensors=False).hparams, ContextParams(**args), parallel=False)  # type: ignore[arg-type]
    load_weights(ctx, path)
    return ctx


def _program(n: int) -> SplitProgram:
    x = ops.new_tensor_1d(F32, n, "x").set_input()
    g = Graph(8)
    g.build_forward_expand(ops.sqr(ops.scale(x, 2.0)))
    return SplitProgram.build(g.nodes)


def test_cache_key_is_the_signature_and_lru_is_bounded() -> None:
    cache = CompileCache(max_entries=2)
    dev = jax.local_devices(backend="cpu")[0]
    a, a2, b, c = _program(8), _program(8), _program(16), _program(32)
    assert a.signature == a2.signature != b.signature  # same computation from different tensors
    _, hit = cache.get(a, dev)
    _, hit2 = cache.get(a2, dev)
    assert (hit, hit2) == (False, True)
    entry, _ = cache.get(b, dev)
    cache.get(c, dev)
    assert len(cache.entries) == 2 and cache.evictions == 1
    # XLA's memory analysis on CPU: one f32[16] argument; both results (scale, sqr) are returned
    assert entry.argument_bytes == 16 * 4 and entry.output_bytes >= 2 * 16 * 4
    assert entry.flops is not None and entry.flops > 0


def test_rebuilt_scheduler_hits_the_cache_changed_splits_compile(gguf_path: str) -> None:
    ctx = ctx_for(gguf_path, op_offload=False, n_gpu_layers=2)
    decode(ctx, list(range(1, 41)))
    ev = ctx.update(max_nodes=4096)  # a rebuild with an identical graph
    assert ev.decision == "rebuilt"
    info = compile_splits(ctx)  # n_ubatch = 32 tokens, as the first ubatch of the decode
    assert info["compiled"] == 0 and info["cache_hits"] == len(info["splits"]) > 1
    ctx.update(op_offload=True)  # batch 32: the CPU layer's MUL_MATs now run on SIM0
    info = compile_splits(ctx)  # n_ubatch = 32 tokens, as the first ubatch of the decode
    assert info["compiled"] > 0 and info["compile_ms"] > 0
    for s in info["splits"]:
        assert s["temp_bytes"] is not None and s["flops"] is not None


def test_context_decode_keeps_kv_across_reuse(gguf_path: str) -> None:
    ctx = ctx_for(gguf_path)
    full = decode(ctx, [3, 1, 4, 1, 5])
    rt = runtime_of(ctx)
    ctx2 = ctx_for(gguf_path)
    part = decode(ctx2, [3, 1, 4])
    ctx2.update(max_nodes=8192)            # the scheduler is rebuilt, the KV cache stays
    rest = decode(ctx2, [1, 5])
    np.testing.assert_allclose(np.concatenate([part, rest]), full, rtol=1e-5, atol=1e-5)
    assert rt.n_past == 5 and runtime_of(ctx2).n_past == 5
    with pytest.raises(ValueError, match="do not fit the KV cache of 256 cells"):
        decode(ctx2, list(range(300)))
    assert len(generate(ctx2, [7], 3)) == 3


@pytest.mark.parametrize("fa", ["off", "on"])   # off: V stored transposed; on: V by rows
def test_sequences_decode_in_their_own_streams(gguf_path: str, fa: str) -> None:
    # n_seq_max 2 without kv_unified: n_ctx_seq = GGML_PAD(256 / 2, 256) = 256 cells per sequence,
    # and llama_context rounds n_ctx up to 2 * 256
    multi = ctx_for(gguf_path, n_seq_max=2, flash_attn=fa)
    kv = multi.setup.memory.caches[0]
    assert kv.n_stream == 2 and kv.kv_size == 256
    assert (multi.setup.resolved.n_ctx, multi.setup.resolved.n_ctx_seq) == (512, 256)
    a, b = [3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8]
    got_a = [decode(multi, a[:5], seq_id=0)]
    got_b = [decode(multi, b[:4], seq_id=1)]
    got_a.append(decode(multi, a[5:], seq_id=0))
    got_b.append(decode(multi, b[4:], seq_id=1))
    # each sequence alone, in a context of one sequence with as many cells
    alone_a = decode(ctx_for(gguf_path, n_ctx=256, flash_attn=fa), a)
    alone_b = decode(ctx_for(gguf_path, n_ctx=256, flash_attn=fa), b)
    np.testing.assert_allclose(np.concatenate(got_a), alone_a, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.concatenate(got_b), alone_b, rtol=1e-5, atol=1e-5)
    rt = runtime_of(multi)
    assert rt.seq_past == [8, 6] and rt.n_past == 8
    # the ubatch graph covers the sequence's own stream: one mask stream, the KV views at its offset
    lg = multi.build_llama_graph(4, streams=(1, 1))
    assert lg.input(InputAttnKV).kq_mask.ne[3] == 1
    k0 = kv.k[0]
    views = [t for t in lg.graph.nodes if t.view_src is k0 and t.op is Op.VIEW]
    assert [(t.ne[3], t.view_offs) for t in views] == [(1, k0.nb[2])]   # get_k: stream 1 of 2
    # forgetting one sequence leaves the other
    rt.clear(seq_id=1)
    assert rt.seq_past == [8, 0]
    np.testing.assert_allclose(decode(multi, b, seq_id=1), alone_b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(decode(multi, [5], seq_id=0)[0],
                               decode(ctx_for(gguf_path, n_ctx=256, flash_attn=fa), [*a, 5])[-1], rtol=1e-5, atol=1e-5)
    for bad in (2, -1, "0", True):
        with pytest.raises(ParameterError) as e:
            decode(multi, [1], seq_id=bad)  # type: ignore[arg-type]
        assert e.value.param == "seq_id"


def test_a_unified_cache_runs_sequence_zero_only(gguf_path: str) -> None:
    ctx = ctx_for(gguf_path, n_seq_max=2, kv_unified=True)
    assert ctx.setup.memory.n_stream == 1
    assert decode(ctx, [3, 1, 4]).shape == (3, HP.n_vocab)
    with pytest.raises(UnsupportedFeature) as e:
        decode(ctx, [3], seq_id=1)
    assert e.value.feature == "kv_unified"
    assert runtime_of(ctx).seq_past == [3, 0]


def test_devices_order_names_and_errors() -> None:
    bs = make_backends("sim:3")
    assert [b.name for b in bs] == ["SIM0", "SIM1", "SIM2", "CPU"]
    devs = [b.executor for b in bs]
    assert len(set(devs)) == 4 and bs[-1].is_cpu
    assert [b.name for b in make_backends("cpu")] == ["CPU"]
    assert parse_devices("sim:2") == ("sim", 2)
    with pytest.raises(ParameterError, match="devices=.gpu0. is not accepted: expected cpu, rpc:N, sim:N or cuda:N"):
        parse_devices("gpu0")
    if not any(d.platform == "gpu" for d in jax.devices()):
        with pytest.raises(ValueError, match="CUDA0 needs a JAX GPU"):
            bind_executors([profiles.cuda_like(0), profiles.cpu()])


def test_persistent_cache_writes_entries(tmp_path: object) -> None:
    d = enable_persistent_cache(str(tmp_path))
    assert d == str(tmp_path)
    CompileCache().get(_program(24), jax.local_devices(backend="cpu")[0])
    assert os.listdir(d)


def test_cli_json_logits_match_decode(gguf_path: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["--gguf", gguf_path, "--tokens", "5,6,7", "--devices", "sim:2", "--ngl", "2",
                   "--parallel", "off", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(out["logits"]) == HP.n_vocab
    assert [b["name"] for b in out["backends"]] == ["SIM0", "SIM1", "CPU"]
    want = decode(ctx_for(gguf_path, type_k="f16", type_v="f16", n_ubatch=512, n_ctx=512, n_batch=512,
                          n_gpu_layers=2), [5, 6, 7])[-1]
    np.testing.assert_allclose(out["logits"], want, rtol=1e-5, atol=1e-5)
    rc = cli.main(["--gguf", gguf_path, "--tokens", "1,2", "--flash-attn", "on"])
    text = capsys.readouterr().out
    assert rc == 0 and "split #0: CPU" in text and "last token logits" in text
    assert cli.main(["--gguf", gguf_path, "--tokens", "1", "--devices", "tpu9"]) == 2


def test_graph_reuse_until_the_scheduler_is_reserved_again(gguf_path: str) -> None:
    ctx = ctx_for(gguf_path)
    rt = runtime_of(ctx)
    decode(ctx, [1])
    decode(ctx, [2])
    assert [log.graph_reused for log in rt.log] == [False, True]  # same ubatch shape: llama.cpp reuses
    ctx.update(max_nodes=ctx.sched_params_cur.max_nodes)          # a reserve (reused scheduler)
    decode(ctx, [3])
    decode(ctx, [4, 5])
    assert [log.graph_reused for log in list(rt.log)[2:]] == [False, False]


def test_context_without_gguf_runs_on_seeded_random_weights() -> None:
    cp = ContextParams(n_ctx=256, n_batch=256, n_ubatch=32, flash_attn="on", devices=("sim",))
    ctx = Context(HP, cp, parallel=False)
    with pytest.warns(UserWarning, match="random weights"):
        a = decode(ctx, [1, 2, 3])
    with pytest.warns(UserWarning, match="random weights"):
        b = decode(Context(HP, cp, parallel=False), [1, 2, 3])  # the same seed: the same logits
    np.testing.assert_array_equal(a, b)
    assert a.shape == (3, HP.n_vocab) and runtime_of(ctx).notes


def test_context_from_gguf_path_runs_its_weights_and_compile_is_an_event(gguf_path: str) -> None:
    explicit = ctx_for(gguf_path)  # hparams only, weights loaded by hand
    ctx = Context(gguf_path, explicit.cparams, parallel=False)
    assert ctx.gguf_path == gguf_path
    toks = [1, 2, 3]
    np.testing.assert_array_equal(decode(ctx, toks), decode(explicit, toks))
    n_reserves = len(ctx.events)
    info = compile_splits(ctx)
    assert len(ctx.events) == n_reserves                     # compiling is not a reserve ...
    ce = ctx.compile_events[-1]                              # ... it is an event of its own
    assert ce.reserve_index == ctx.events[-1].index and ce.compiled + ce.cache_hits == ctx.scheduler.n_splits
    assert info["splits"] and len(info["splits"]) == ctx.scheduler.n_splits


def test_a_context_is_run_by_the_runtime_functions_and_keeps_no_forwarder() -> None:
    import toolkit
    from toolkit.context import RunnableContext

    assert (toolkit.decode, toolkit.generate, toolkit.compile_splits) == (decode, generate, compile_splits)
    assert toolkit.jaxrt.runtime_of is runtime_of
    assert not [n for n in ("decode", "compile", "generate") if hasattr(Context, n)]
    assert isinstance(Context(HP, ContextParams(n_ctx=256, n_gpu_layers=0)), RunnableContext)
