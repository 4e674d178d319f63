"""python -m toolkit: plan, replay, and the lazy dispatch of run."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
from oracle_cases import case
from testenv import REPO_ROOT

from toolkit import cli

IDS = ["cpu-small_f32-c1024-b2048-ub512-faoff", "rpc2-tiny_f32-ngl99-sm_layer-ts1_1-c1024-b2048-ub512-faon-FORCEPP",
       "cpu-tiny_f32-c1024-b2048-ub512-faon-kq8_0"]


@pytest.fixture
def cases_file(tmp_path: Path) -> Path:
    p = tmp_path / "cases.json"
    p.write_text(json.dumps([case(i) for i in IDS]))
    return p


def test_plan_json_matches_the_oracle(cases_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", "--cases", str(cases_file), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in out] == IDS
    for r in out[:2]:
        obs = case(r["id"])["observed"]
        for f in ("graph_nodes", "graph_splits", "graph_splits_tg", "compute_buffers_bytes", "kv_bytes",
                  "model_buffers_bytes", "n_copies", "pipeline_parallel"):
            assert r[f] == obs[f]
    assert out[2]["error"] == "K cache type q8_0 with block size 32 does not divide n_embd_head_k=16"


def test_plan_prints_llama_cpp_log_lines(cases_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", "--cases", str(cases_file)]) == 0
    text = capsys.readouterr().out
    assert "===== CASE cpu-small_f32-c1024-b2048-ub512-faoff" in text
    # the stock lines of the oracle's case (graph_nodes_line / compute_buffers_mib_as_printed)
    assert "sched_reserve:        CPU compute buffer size =    64.00 MiB (67110912 bytes)" in text
    assert "sched_reserve: graph nodes  = 150" in text and "sched_reserve: graph splits = 1" in text
    assert "llama_context: pipeline parallelism enabled" in text
    assert "llama_init_from_model: K cache type q8_0" in text


def test_replay_event_log(cases_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    steps = "max_nodes=4096; parallel=off; op_offload=off; max_nodes=1024; max_nodes=0"
    assert cli.main(["replay", "--case", str(cases_file), "--id", IDS[1], "--steps", steps, "--json"]) == 0
    events = json.loads(capsys.readouterr().out)
    assert [e["decision"] for e in events] == ["rebuilt", "rebuilt", "rebuilt", "rebuilt", "reused", "error"]
    assert events[0]["n_copies"] == 4 and events[2]["n_copies"] == 1
    assert events[4]["hash_size"] == 4099 and events[4]["params"]["max_nodes"] == 1024
    assert "max_nodes=0" in events[5]["error"]
    assert cli.main(["replay", "--case", str(cases_file), "--id", IDS[1], "--steps", "max_nodes=512"]) == 0
    text = capsys.readouterr().out
    assert "#0 rebuilt" in text and "#1 reused" in text


def test_replay_unknown_id(cases_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["replay", "--case", str(cases_file), "--id", "nope"]) == 2
    assert "no case with id 'nope'" in capsys.readouterr().err


def test_parse_steps() -> None:
    assert cli.parse_steps("max_nodes=4096; parallel=on; op_offload=off; max_nodes=auto") == [
        {"max_nodes": 4096}, {"parallel": True}, {"op_offload": False}, {"max_nodes": None}]
    assert cli.parse_steps("devices=rpc:2,sim:1G, n_ctx=512") == [{"devices": ("rpc:2", "sim:1G"), "n_ctx": 512}]
    assert cli.parse_steps("tensor_split=3,1") == [{"tensor_split": (3.0, 1.0)}]
    with pytest.raises(ValueError, match="expected on/off"):
        cli.parse_steps("parallel=maybe")
    with pytest.raises(ValueError, match="not KEY=VALUE"):
        cli.parse_steps("parallel")


def test_run_is_dispatched_lazily(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    fake = types.ModuleType("toolkit.jaxrt.cli")
    fake.main = lambda argv: seen.append(argv) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "toolkit.jaxrt.cli", fake)
    assert cli.main(["run", "--model", "tiny"]) == 0
    assert seen == [["--model", "tiny"]]


def test_module_entry_point(cases_file: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "toolkit", "plan", "--cases", str(cases_file), "--json"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["graph_nodes"] == 150


def test_importing_the_cli_stays_light() -> None:
    code = "import sys, toolkit.cli, toolkit.context; print(any(m.startswith(('jax', 'plotly')) for m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr
