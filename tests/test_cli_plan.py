"""python -m toolkit plan with llama.cpp's own flags, walked over every oracle case.

Each case's recorded command line (``cparams.cli_args``) goes to ``plan`` unchanged except ``-m``,
which points to the case's model description (the GGUF files are not part of the repository).
The device memory the RPC servers reported is taken from the case's own breakdown table and given
with ``--device-memory``, so the breakdown table ``plan`` prints can be compared line for line.
Cases of models the toolkit cannot plan yet must be refused with a clear message, not skipped.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from oracle_cases import DATA
from oracle_cases import cases as oracle_cases

from toolkit import cli
from toolkit.args import model_from_dict
from toolkit.errors import UnsupportedFeature

ROW = re.compile(r"\|\s+- (\S+) \(.*?\)\s*\|\s*(\d+) = (\d+) \+")
FIELDS = ("graph_nodes", "graph_nodes_tg", "graph_splits", "graph_splits_tg", "compute_buffers_bytes", "kv_bytes",
          "kv_buffers_bytes", "model_buffers_bytes", "output_buffer_bytes", "n_copies", "pipeline_parallel",
          "max_nodes")


@cache
def all_cases() -> list[dict[str, Any]]:
    more = json.loads((DATA / "cases-oracle2.json").read_text())
    return [*oracle_cases(), *more]


def _plannable(c: dict[str, Any]) -> bool:
    try:
        model_from_dict(c["model"])
    except UnsupportedFeature:
        return False
    return True


IDS = [c["id"] for c in all_cases()]
BY_ID = {c["id"]: c for c in all_cases()}


def _argv(c: dict[str, Any], tmp: Path) -> list[str]:
    args = list(c["cparams"]["cli_args"])
    mp = tmp / f"{c['model']['name']}.json"
    mp.write_text(json.dumps(c["model"]))
    args[args.index("-m") + 1] = str(mp)
    mem = [int(m.group(2)) << 20 for line in c["observed"].get("memory_breakdown") or () if (m := ROW.search(line))]
    if mem:
        args += ["--device-memory", ",".join(map(str, mem))]
    return args


def test_the_walk_covers_both_oracles() -> None:
    assert len(IDS) == len(set(IDS)) == 170 + 243
    assert sum(_plannable(c) for c in all_cases()) >= 170


@pytest.mark.parametrize("cid", IDS)
def test_plan_with_the_cases_command_line(cid: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    c = BY_ID[cid]
    # the oracle's patched build reads ORACLE_FORCE_PP from the environment, and so does plan
    if c["cparams"].get("env", {}).get("ORACLE_FORCE_PP"):
        monkeypatch.setenv("ORACLE_FORCE_PP", "1")
    else:
        monkeypatch.delenv("ORACLE_FORCE_PP", raising=False)
    rc = cli.main(["plan", *_argv(c, tmp_path), "--json"])
    out = capsys.readouterr()
    if not _plannable(c):
        assert rc == 2
        assert "not implemented" in out.err or "not supported" in out.err
        assert f"'{c['model']['arch']}'" in out.err or "mixture-of-experts" in out.err or "rope_freqs" in out.err
        return
    obs = c["observed"]
    r = json.loads(out.out)
    if obs["rc"] != 0:
        assert rc == 1 and f"llama_init_from_model: {r['error']}" == obs["errors"][0]
        return
    assert rc == 0
    for f in FIELDS:
        assert r[f] == obs[f], (f, r[f], obs[f])
    if obs.get("memory_breakdown"):
        assert r["memory_breakdown"] == obs["memory_breakdown"]


def test_plan_prints_llama_cpp_lines(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", "-m", "tiny", "-c", "8192", "-ngl", "99", "-fa", "on", "--device", "sim:24G"]) == 0
    text = capsys.readouterr().out
    assert "sched_reserve:       SIM0 compute buffer size =" in text
    assert "sched_reserve: graph nodes  = 68" in text
    assert "llama_kv_cache: size =    2.00 MiB (  8192 cells,   2 layers,  1/1 seqs), K (f16):    1.00 MiB" in text
    assert "common_memory_breakdown_print: |   - SIM0 (simulated accelerator) | 24576 = 24576 + (" in text
    assert cli.main(["plan", "-m", "tiny", "-fa", "sometimes"]) == 2
    assert "-fa='sometimes' is not accepted: expected on|off|auto" in capsys.readouterr().err


def test_plan_and_fit_read_a_gguf_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """-m takes a real GGUF file (written by the gguf package); only its metadata is read."""
    import dataclasses

    from toolkit.jaxrt.gguf_io import write_gguf
    from toolkit.models import presets
    hp = dataclasses.replace(presets.small(), n_vocab=512, name="g")
    path = tmp_path / "g.gguf"
    write_gguf(path, hp, seed=3)
    (tmp_path / "g.json").write_text(json.dumps(hp.to_dict()))
    argv = ["-c", "1024", "-ngl", "3", "-fa", "on", "--device", "sim:1G"]
    assert cli.main(["plan", "-m", str(path), *argv, "--json"]) == 0
    from_file = json.loads(capsys.readouterr().out)
    assert cli.main(["plan", "-m", str(tmp_path / "g.json"), *argv, "--json"]) == 0
    from_dict = json.loads(capsys.readouterr().out)
    for f in FIELDS:
        assert from_file[f] == from_dict[f]
    assert cli.main(["fit", "-m", str(path), "--device", "sim:1100M"]) == 0
    assert capsys.readouterr().out.startswith("-c 4096 -ngl ")
