"""benchmarks/gpu_check.py's dry run (``--cpu --quick``): the models compile and run on a simulated
accelerator and on the CPU, agree within the script's tolerance, and the table lists every split."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.py"


def _module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_cpu_dry_run_passes_and_prints_one_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gc = _module()
    out = tmp_path / "rows.json"
    assert gc.main(["--cpu", "--quick", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    rows = json.loads(out.read_text())
    quick = [n for n, m in gc.MODELS.items() if m[2]]
    assert [r["model"] for r in rows] == quick and len(quick) >= 3
    assert {r["arch"] for r in rows} >= {"llama", "gpt-oss", "qwen35moe"}
    for r in rows:
        assert r["ok"] and r["rel"] <= gc.TOL
        backends = [s["backend"] for s in r["splits"]]
        assert "SIM0" in backends and "CPU" in backends   # the device run's splits: the accelerator and the CPU
        for s in r["splits"]:
            assert s["xla_args"] is not None and s["ggml_compute"] > 0
        sim = next(s for s in r["splits"] if s["backend"] == "SIM0")
        assert sim["ggml_model"] > 0 and sim["n_nodes"] > 10
        assert text.count(f"\n{r['model']} ") == 1
    assert f"{len(rows)}/{len(rows)} within tolerance" in text


def test_without_a_gpu_the_real_run_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    import jax
    if any(d.platform in ("gpu", "cuda", "rocm") for d in jax.devices()):
        pytest.skip("this machine has a GPU: the real run is make gpu-check")
    assert _module().main(["--only", "llama"]) == 2
    assert "JAX sees no GPU" in capsys.readouterr().err
