"""The Qwen3.6 presets at real size (``qwen35moe`` 35B-A3B, ``qwen35`` 27B). The 27B is checked against a
real llama.cpp log: a Qwen3.6-27B run with two sequences in llama.cpp's PR #23792 prints

    llama_memory_recurrent: size =  299.25 MiB (     2 cells,  64 layers,  2 seqs  0 rs_seq),
        R (f32):   11.25 MiB, S (f32):  288.00 MiB    (one line in the log)
    sched_reserve: max_nodes = 27232

Every other expected number is written by hand from the published configs' raw values (layers, heads, head
sizes, the delta net's heads), not read from the toolkit."""

from __future__ import annotations

import re
from functools import cache

import pytest

from toolkit.cases import summary
from toolkit.context import Context
from toolkit.models import ContextParams, archs, presets

MiB = 1 << 20
N_CTX = 32768


@cache
def _ctx(name: str, n_seq_max: int = 1, n_ctx: int = N_CTX) -> Context:
    return Context(presets.get(name), ContextParams(n_ctx=n_ctx, n_ubatch=512, n_seq_max=n_seq_max, n_gpu_layers=0))


def _rs(ctx: Context) -> tuple[int, int]:
    rec = ctx.setup.memory.recurrent
    assert rec is not None
    return rec.size_r_bytes, rec.size_s_bytes


def test_27b_recurrent_state_and_max_nodes_as_llama_cpp_logged() -> None:
    ctx = _ctx("qwen3_6_27b", n_seq_max=2, n_ctx=4096)
    assert ctx.events[-1].decision != "error"
    r, s = _rs(ctx)
    assert (r, s) == (int(11.25 * MiB), 288 * MiB)
    assert r + s == int(299.25 * MiB)
    # 851 tensors: 48 delta-net layers of 14, 16 attention layers of 11, token_embd, output_norm, output
    assert ctx.setup.model.n_tensors == 48 * 14 + 16 * 11 + 3 == 851
    assert summary(ctx)["max_nodes"] == max(40 * 512, 32 * 851) == 27232


@pytest.mark.parametrize(("name", "n_attn", "n_head_kv", "n_recr", "conv", "inner"), [
    # 35B-A3B: 10 of 40 layers attend (2 KV heads of 256); the delta net: 16 K heads and 32 V heads of 128
    ("qwen3_6_35b_a3b", 10, 2, 30, 32 * 128 + 2 * 16 * 128, 32 * 128),
    # 27B: 16 of 64 attend (4 KV heads of 256); 16 K heads, 48 V heads of 128
    ("qwen3_6_27b", 16, 4, 48, 48 * 128 + 2 * 16 * 128, 48 * 128),
])
def test_kv_cache_and_state_by_hand(name: str, n_attn: int, n_head_kv: int, n_recr: int, conv: int,
                                    inner: int) -> None:
    """F16 K and V on the attention layers only; per recurrent layer and sequence an F32 conv state of
    (4 - 1) x the conv channels and an F32 SSM state of 128 x the V width; four sequences (llama-server's
    default -np auto) take four times the state and the same KV cells."""
    one, four = _ctx(name), _ctx(name, n_seq_max=4)
    kv = n_attn * N_CTX * (n_head_kv * 256) * 2 * 2
    for ctx in (one, four):
        assert sum(ctx.events[-1].memory["KV"].values()) == kv
    per_seq = (n_recr * 3 * conv * 4, n_recr * 128 * inner * 4)
    assert _rs(one) == per_seq
    assert _rs(four) == (4 * per_seq[0], 4 * per_seq[1])


def test_35b_a3b_experts_and_parameters() -> None:
    """256 experts of 512 (8 used) and a shared expert of 512 with its sigmoid gate in each of the 40 layers.
    34.7 B parameters by hand: 32.21 B in the routed experts (40 x 3 x 2048 x 512 x 256), 1.02 B in the embedding
    and the output (2 x 248320 x 2048), 1.01 B in the 30 delta-net layers, 0.27 B in the 10 attention layers,
    0.13 B in the shared experts (the published 35B counts the vision encoder and the MTP block too)."""
    hp = presets.qwen3_6_35b_a3b()
    names = {w.name: w.ne for w in archs.get(hp.arch).weights(hp)}
    assert names["blk.0.ffn_gate_exps.weight"] == (2048, 512, 256)
    assert names["blk.0.ffn_up_shexp.weight"] == (2048, 512)
    assert names["blk.0.ffn_gate_inp_shexp.weight"] == (2048,)
    assert "blk.3.attn_q.weight" in names and "blk.3.ssm_out.weight" not in names
    assert "blk.0.ssm_out.weight" in names and "blk.0.attn_q.weight" not in names
    n = 0
    for ne in names.values():
        k = 1
        for x in ne:
            k *= x
        n += k
    assert round(n / 1e9, 1) == 34.7


def test_the_picker_offers_them() -> None:
    from toolkit.ui.choices import MODEL_PRESETS, preset_of

    assert {k: MODEL_PRESETS[k] for k in ("Qwen3.6-35B-A3B", "Qwen3.6-27B")} == {
        "Qwen3.6-35B-A3B": "qwen3_6_35b_a3b", "Qwen3.6-27B": "qwen3_6_27b"}
    assert [preset_of(presets.get(n)) for n in ("qwen3_6_35b_a3b", "qwen3_6_27b")] == ["qwen3_6_35b_a3b",
                                                                                      "qwen3_6_27b"]


def test_fit_35b_a3b_on_24g_and_16g(capsys: pytest.CaptureFixture[str]) -> None:
    """Q4_K weights of 18.2 GiB with a 32k context fit one 24 GiB device unchanged; on 16 GiB the context
    stays and the experts of a trailing block of layers go to the CPU (the first one partly), the last
    override naming block 40 (n_layer, which matches no tensor). No llama.cpp run measured these answers: the
    24 GiB one follows from the sizes (18.2 GiB of weights, 640 MiB of KV, 63 MiB of state and about 0.5 GiB of
    compute leave more than llama-fit-params' 1 GiB margin), the 16 GiB one is the shape of its answer."""
    from toolkit import cli

    assert cli.main(["fit", "-m", "qwen3_6_35b_a3b", "--device", "sim:24G", "-c", str(N_CTX)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"-c {N_CTX} -ngl -1"
    assert cli.main(["fit", "-m", "qwen3_6_35b_a3b", "--device", "sim:16G", "-c", str(N_CTX)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(f'-c {N_CTX} -ngl 41 -ot "')
    blocks = [int(b) for b in re.findall(r"blk\\\.(\d+)\\\.", line)]
    assert blocks == list(range(blocks[0], 41)) and 0 < blocks[0] < 40
    assert all(p.endswith("=CPU") for p in line.split('"')[1].split(","))
