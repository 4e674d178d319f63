"""``toolkit.explain``: a llama.cpp start-up log read back, its context rebuilt, every number compared.

The logs are llama.cpp's own full start-up output (tests/data/sched-debug, tests/data/logs); the
expected numbers are the ones those logs print, read here by a regular expression of this file (not
the parser under test), so a number the parser skipped or misread fails the test.
"""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from toolkit import cli
from toolkit.errors import LogError, ToolkitError, UnsupportedFeature
from toolkit.explain import explain, from_log, parse_log

DATA = Path(__file__).parent / "data"
LOGS = sorted(p for p in [*(DATA / "sched-debug").glob("*-DEBUG.txt"), *(DATA / "logs").glob("*-DEBUG.txt")]
              if "print_info: arch" in p.read_text())
# the numbers llama.cpp prints at start-up with their exact bytes (buffers) or counts (graph)
BUFFER = re.compile(r"^(load_tensors|llama_context|llama_kv_cache|sched_reserve):\s+(\S+)\s+"
                    r"(model|output|KV|RS|compute) buffer size =\s+[\d.]+ MiB \((\d+) bytes\)")
GRAPH = re.compile(r"^sched_reserve: graph (nodes |splits)\s*= (\d+)")
WHAT = {"model": "model", "output": "output", "KV": "KV", "RS": "RS", "compute": "compute"}


def logged_numbers(text: str) -> list[tuple[int, str, str, int]]:
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        m = BUFFER.match(line)
        if m:
            out.append((i, WHAT[m.group(3)], m.group(2), int(m.group(4))))
        m = GRAPH.match(line)
        if m:
            out.append((i, "graph " + m.group(1).strip(), "pp", int(m.group(2))))
    return out


def test_the_shared_logs_are_here() -> None:
    # every architecture the toolkit builds, with CPU-only, partial and two-device runs
    names = {p.name.split("-")[1] for p in LOGS}
    assert {"tiny_f32", "small_f32", "llama3_tiny_f32", "tiny_qwen3_f32", "tiny_gemma3_f32", "tiny_moe_f32",
            "tiny_qwen3moe_f32", "gptoss"} <= names
    assert len(LOGS) == 48


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.name.removesuffix("-DEBUG.txt"))
def test_explain_reproduces_every_logged_number(path: Path) -> None:
    exp = explain(path)
    expected = logged_numbers(path.read_text())
    assert expected, "the log prints buffers and graph sizes"
    by_line = {(c.line, c.buffer if c.what != "graph nodes" and c.what != "graph splits" else "pp"): c
               for c in exp.compared if not (c.what.startswith("graph") and c.buffer == "tg")}
    for line, what, buffer, value in expected:
        c = by_line[(line, buffer)]
        assert c.what.split()[0] == what.split()[0] and c.logged == value, (line, what, buffer)
        assert c.ours == value, f"line {line}: {what} {buffer}: llama.cpp {value}, toolkit {c.ours}"
    assert exp.all_equal, [c for c in exp.compared if not c.equal]


def test_the_sched_reserve_summary_matches_too() -> None:
    # tg counts and copies: the pipeline-parallel run keeps 4 copies (GGML_SCHED_MAX_COPIES)
    path = DATA / "sched-debug" / "rpc2-small_f32-ngl99-sm_layer-ts1_1-c1024-b2048-ub512-faon-FORCEPP-DEBUG.txt"
    exp = explain(path)
    got = {(c.what, c.buffer): (c.logged, c.ours) for c in exp.compared}
    assert got[("sched copies", "")] == (4, 4)
    assert got[("graph nodes", "tg")] == (130, 130)
    assert exp.run.cparams.force_pipeline_parallel and exp.run.cparams.tensor_split == (3.0, 2.0)


def test_from_log_reads_the_model_and_the_context() -> None:
    run = from_log(DATA / "logs" / "rpc1-tiny_moe_f32-ngl99-ncmoe1-oo1-c256-b512-ub512-faon-DEBUG.txt")
    hp, cp = run.hparams, run.cparams
    assert (hp.arch, hp.n_layer, hp.n_embd) == ("llama", 2, 64)
    assert hp.moe is not None and hp.moe.n_expert == 4
    assert (cp.n_ctx, cp.n_ubatch, cp.flash_attn, cp.n_gpu_layers) == (256, 256, "on", 3)
    assert cp.devices == ("rpc:127.0.0.1:50052",)
    # --n-cpu-moe 1 as the log shows it: three expert tensors of layer 0 moved to the CPU
    assert len(cp.override_tensor) == 3 and all(o.endswith("=CPU") for o in cp.override_tensor)
    assert run.log.devices[0][3] == 24105


def test_a_gemma3_log_keeps_its_two_caches() -> None:
    exp = explain(DATA / "sched-debug" / "cpu-tiny_gemma3_f32-c1024-b512-ub512-faon-DEBUG.txt")
    cells = [(c.buffer, c.logged) for c in exp.compared if c.what == "KV cells"]
    assert cells == [("non-SWA", 1024), ("SWA", 768)] or [x[1] for x in cells] == [1024, 768]


def test_llama3_rope_freqs_are_found_by_the_tensor_count() -> None:
    run = from_log(DATA / "sched-debug" / "cpu-llama3_tiny_f32-c256-b512-ub512-faon-DEBUG.txt")
    assert run.hparams.rope_freqs is not None and len(run.hparams.rope_freqs) == 8
    assert any("rope_freqs.weight values" in m for m in run.missing)


def _text(name: str) -> str:
    return (DATA / "sched-debug" / name).read_text()


TINY = "rpc1-tiny_f32-ngl1-c256-b512-ub512-faoff-DEBUG.txt"


def test_a_log_without_print_info_names_it() -> None:
    text = "\n".join(x for x in _text(TINY).splitlines() if not x.startswith("print_info:"))
    with pytest.raises(LogError, match="print_info: arch") as e:
        from_log(text)
    assert e.value.missing.startswith("print_info")


def test_a_log_cut_in_the_middle_names_the_first_missing_line() -> None:
    lines = _text(TINY).splitlines()
    cut = next(i for i, x in enumerate(lines) if x.startswith("llama_context: constructing"))
    with pytest.raises(LogError, match="llama_context: n_ctx"):
        from_log("\n".join(lines[:cut]))
    cut = next(i for i, x in enumerate(lines) if "compute buffer size" in x)
    with pytest.raises(LogError, match="compute buffer size"):
        from_log("\n".join(lines[:cut]))


def test_another_programs_text_is_refused() -> None:
    with pytest.raises(LogError, match="not a llama.cpp start-up log") as e:
        from_log("Collecting numpy\n  Downloading numpy-2.0.tar.gz\nSuccessfully installed numpy\n")
    # it names the lines a start-up log would have had
    assert e.value.missing == "llama_model_loader:, print_info:, llama_context:, sched_reserve: lines"


def test_cli_names_what_a_bad_log_lacks(tmp_path: Path) -> None:
    # python -m toolkit explain on a log without its print_info block: exit 2, the missing line on stderr
    text = "\n".join(x for x in _text(TINY).splitlines() if not x.startswith("print_info:"))
    (tmp_path / "x.log").write_text(text)
    err = io.StringIO()
    with redirect_stderr(err):
        rc = cli.main(["explain", str(tmp_path / "x.log")])
    assert rc == 2 and "missing: print_info: arch" in err.getvalue()


def test_an_unknown_architecture_names_the_key() -> None:
    text = _text(TINY).replace("general.architecture str              = llama",
                               "general.architecture str              = mamba9")
    with pytest.raises(UnsupportedFeature, match=r"general.architecture = 'mamba9'") as e:
        from_log(text)
    assert e.value.feature == "general.architecture" and isinstance(e.value, ToolkitError)


def test_mixed_weight_types_need_the_file() -> None:
    text = _text(TINY).replace("llama_model_loader: - type  f32:   21 tensors",
                               "llama_model_loader: - type  f32:    5 tensors\n"
                               "llama_model_loader: - type q4_K:   14 tensors\n"
                               "llama_model_loader: - type q6_K:    2 tensors")
    with pytest.raises(LogError, match="the GGUF file"):
        from_log(text)


def test_quantized_matrices_with_f32_norms_are_read_from_the_counts() -> None:
    # 5 one-dimensional weights (2 x 2 norms + output_norm) in F32, every matrix Q8_0
    text = _text(TINY).replace("llama_model_loader: - type  f32:   21 tensors",
                               "llama_model_loader: - type  f32:    5 tensors\n"
                               "llama_model_loader: - type q8_0:   16 tensors")
    assert from_log(text).hparams.dtype.name == "Q8_0"


def test_a_bad_kv_value_names_its_key_and_line() -> None:
    text = _text(TINY).replace("llama.block_count u32              = 2", "llama.block_count u32              = two")
    with pytest.raises(LogError, match="llama.block_count") as e:
        parse_log(text) and from_log(text)
    assert e.value.line == 9


def test_cli_json_lists_each_number_with_its_line(tmp_path: Path) -> None:
    path = DATA / "sched-debug" / TINY
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = cli.main(["explain", str(path), "--json", "--html", str(tmp_path / "r.html")])
    assert rc == 0
    d = json.loads(buf.getvalue())
    lines = path.read_text().splitlines()
    assert d["compared"] and {"line", "what", "buffer", "logged", "ours"} <= set(d["compared"][0])
    for c in d["compared"]:
        assert lines[c["line"] - 1].strip() == c["text"] and c["logged"] == c["ours"]
    assert any("build" in m for m in d["missing"])
    html = (tmp_path / "r.html").read_text()
    assert "toolkit-explain-table" in html and html.count("toolkit-explain-row") == len(d["compared"])


def test_cli_text_reports_a_difference(tmp_path: Path) -> None:
    # a log whose compute buffer was edited: explain prints both numbers and the difference, exits 1
    text = _text(TINY).replace("(32833536 bytes)\nsched_reserve: ORACLE compute_buffer",
                               "(32833600 bytes)\nsched_reserve: ORACLE compute_buffer")
    (tmp_path / "x.log").write_text(text)
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = cli.main(["explain", str(tmp_path / "x.log")])
    assert rc == 1 and "logged     32833600 ≠ ours     32833536  (-64)" in buf.getvalue()
    assert "could explain a difference: a different llama.cpp version" in buf.getvalue()


def test_an_mtp_log_says_the_block_is_skipped() -> None:
    """qwen35moe with one NextN/MTP block (block_count 9): the text names block 8 as skipped, and every
    logged number agrees (the model buffers hold none of its tensors)."""
    exp = explain(DATA / "sched-debug" / "rpc1-qwen35moe_mtp-ngl2-c256-b512-ub512-faon-DEBUG.txt")
    assert "  layers: 8 + 1 NextN/MTP (blk.8: skipped, not loaded, no KV or state; counted in -ngl) + output" \
        in exp.lines()
    assert exp.all_equal
    plain = explain(DATA / "sched-debug" / "rpc1-qwen35moe-ngl4-c256-b512-ub512-faoff-DEBUG.txt")
    assert not [line for line in plain.lines() if "NextN" in line]


def test_the_logged_buffers_are_every_buffer_line() -> None:
    # ParsedLog.buffers: the plain data the dashboard marks, one per "... buffer size" line of the log
    path = DATA / "sched-debug" / "rpc1-small_f32-ngl3-c1024-b2048-ub512-faon-DEBUG.txt"
    expected = [(line, what, buft, value) for line, what, buft, value in logged_numbers(path.read_text())
                if not what.startswith("graph")]
    got = [(b.line, b.group, b.buft, b.nbytes) for b in parse_log(path).buffers()]
    assert got == expected and len(got) == 7
