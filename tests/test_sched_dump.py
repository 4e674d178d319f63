"""The GGML_SCHED_DEBUG=2 text, line for line against llama.cpp's own log (oracle/sched-debug)."""

from __future__ import annotations

import re
from pathlib import Path

from sched_fixtures import graph_of, weight

from toolkit.backend import profiles
from toolkit.ggml import I32, ops
from toolkit.sched import Scheduler

# llama.cpp's GGML_SCHED_DEBUG=2 logs, copied into tests/data (cases.json sits beside the folder)
ORACLE = Path(__file__).resolve().parent / "data" / "sched-debug" / "rpc1-tiny_f32-ngl1-c256-b512-ub512-faoff-DEBUG.txt"


def _strip_index(line: str) -> str:
    return re.sub(r"^node #\s*\d+ ", "node #N ", line)


def _rpc1_tail() -> Scheduler:
    """The last layer's tail of the tiny model with ngl=1 over RPC (names and shapes as llama builds them)."""
    rpc, cpu = profiles.rpc_like(0, "127.0.0.1:50052"), profiles.cpu()
    s = Scheduler([rpc, cpu], None, 2048, False, True)
    tok = weight(cpu, "token_embd.weight", 64, 32000)
    inp = ops.new_tensor_1d(I32, 1, "inp_tokens").set_input()
    embd = ops.get_rows(tok, inp).set_name("embd")
    ffn_out = ops.mul_mat(weight(cpu, "blk.1.ffn_down.weight", 64, 64), embd).set_name("ffn_out-1")
    ffn_inp = ops.mul(embd, weight(cpu, "blk.1.ffn_norm.weight", 64)).set_name("ffn_inp-1")
    l_out = ops.add(ffn_out, ffn_inp).set_name("l_out-1")
    norm = ops.rms_norm(l_out, 1e-5).set_name("norm")
    result_norm = ops.mul(norm, weight(rpc, "output_norm.weight", 64)).set_name("result_norm")
    out = ops.mul_mat(weight(rpc, "output.weight", 64, 32000), result_norm).set_name("result_output").set_output()
    assert s.reserve(graph_of(out))
    return s


def test_dump_lines_match_llama_log() -> None:
    oracle = {_strip_index(x) for x in ORACLE.read_text().splitlines()}
    text = _rpc1_tail().dump()
    lines = text.splitlines()
    assert lines[0] == ""  # ggml prints "\n## SPLIT ..."
    wanted = [
        "## SPLIT #0: CPU # 0 inputs",
        "## SPLIT #1: RPC0[127.0.0.1:50052] # 2 inputs: [ffn_out-1 (   0K)] [ffn_inp-1 (   0K)] ",
    ]
    for w in wanted:
        assert w in lines and w in oracle
    node_lines = [_strip_index(x) for x in lines if x.startswith("node #")]
    for name in ("embd", "l_out-1", "result_norm", "result_output"):
        mine = next(x for x in node_lines if f" {name} (" in x.split(":")[1][:30])
        assert mine in oracle, mine


def test_dump_with_causes() -> None:
    text = _rpc1_tail().dump(causes=True)
    assert "[  CPU    1.wgt]" in text   # embd: weight rule
    assert "[RPC0[    2.sup]" in text   # l_out-1: expansion


def test_dump_of_llama_reserve_is_a_block_of_the_llama_log() -> None:
    """Every sched-debug log: the last reserve's listing appears verbatim in llama.cpp's log."""
    import json

    from toolkit.cases import context_from_case

    cases_path = ORACLE.parent.parent / "cases.json"
    cases = {c["id"]: c for c in json.loads(cases_path.read_text())}
    checked = 0
    for log in sorted(ORACLE.parent.glob("*-DEBUG.txt")):
        base = log.name.removesuffix("-DEBUG.txt")
        case = cases.get(base) or cases.get(base + "-DEBUG") or cases.get(
            base.replace("-FORCEPP", "") + "-FORCEPP-DEBUG" if "FORCEPP" in base else "")
        if case is None:
            continue
        text = context_from_case(case).scheduler.dump()
        assert text.count("## SPLIT #0") == 1
        assert text in log.read_text(), base
        checked += 1
    assert checked == 10
