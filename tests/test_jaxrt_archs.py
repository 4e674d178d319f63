"""qwen3, gemma3 (iSWA) and Llama-3.x files run on JAX: logits against llama.cpp's and against an
independent plain-JAX forward (tests/arch_models.py), on one CPU and on two simulated devices."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from toolkit.jaxrt.devices import request_cpu_devices  # noqa: E402

request_cpu_devices(4)

from arch_models import recipe_of, reference, write_model  # noqa: E402

from toolkit.context import Context  # noqa: E402
from toolkit.jaxrt.compile import enable_persistent_cache  # noqa: E402
from toolkit.jaxrt.operands import Numerics  # noqa: E402
from toolkit.jaxrt.runtime import ContextRuntime, runtime_of  # noqa: E402
from toolkit.models import ContextParams  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
# llama.cpp's logits (oracle2 logits.json qwen3 / gemma3 entries, oracle-llama3 logits.json): first 2048 values
ENTRIES = json.loads((DATA / "logits-archs.json").read_text())
CASES_LLAMA3 = json.loads((DATA / "cases-llama3.json").read_text())
TOL_REF = 1e-4          # against the plain-JAX forward: max |diff| / max |ref|
TOL_LLAMA_CPP = 2e-2    # against llama.cpp: max |diff| / std


@pytest.fixture(scope="module", autouse=True)
def _jax_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    enable_persistent_cache(str(tmp_path_factory.mktemp("jaxcache")))


def _runtime(path: str, *, n_ctx: int = 256, n_ubatch: int = 256, fa: str = "off", devices: tuple[str, ...] = (),
             ngl: int = 999, kv: str = "f16", gelu_table: bool = True) -> ContextRuntime:
    cp = ContextParams(n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ubatch, flash_attn=fa,  # type: ignore[arg-type]
                       devices=devices, n_gpu_layers=ngl if devices else 0, type_k=kv, type_v=kv)
    return runtime_of(Context(path, cp), Numerics(gelu_f16_table=gelu_table))


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def _small(entry_id: str, **changes: Any) -> dict[str, Any]:
    """The recipe of a logits entry with a small vocabulary (fast runs against the reference)."""
    r = recipe_of(next(e for e in ENTRIES if e["id"] == entry_id))
    r.update(n_vocab=512, **changes)
    return r


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["id"] for e in ENTRIES])
def test_logits_match_llama_cpp(entry: dict[str, Any], tmp_path: Path) -> None:
    """The oracle's model, prompt and steps; every read position within 2e-2 of the std, same argmax."""
    r = recipe_of(entry)
    path = str(tmp_path / "m.gguf")
    write_model(path, r)
    rt = _runtime(path, fa=entry["flash_attn"])
    rows = [rt.decode(entry["prompt"])[-1]]
    if r["arch"] == "llama":   # llama3_logits.cpp decodes both steps in one batch
        rows.append(rt.decode(entry["steps"])[-1])
    else:
        rows += [rt.decode([s])[-1] for s in entry["steps"]]
    assert len(rows) == len(entry["logits_first_2048"]) == len(entry["argmax"])
    for got, want, am in zip(rows, entry["logits_first_2048"], entry["argmax"]):
        want = np.asarray(want, np.float32)
        assert np.abs(got[:2048] - want).max() / want.std() <= TOL_LLAMA_CPP
        assert int(np.argmax(got)) == am


def test_llama3_rope_freqs_applied_over_a_long_prompt(tmp_path: Path) -> None:
    """520 tokens: the runtime equals a reference that divides the RoPE angles by rope_freqs, and a
    reference that ignores rope_freqs is outside the same tolerance."""
    freqs = CASES_LLAMA3[0]["model"]["rope_freqs"]   # llama.cpp's oracle model's values
    r = _small("logits-llama3_tiny_f32-faon", rope_freqs=freqs)
    path = str(tmp_path / "llama3.gguf")
    w = write_model(path, r)
    tokens = [int(x) for x in np.random.default_rng(5).integers(0, r["n_vocab"], 520)]
    rt = _runtime(path, n_ctx=1024, n_ubatch=256)
    got = rt.decode(tokens)
    assert _rel(got, reference(w, r, tokens, kq_f16=True)) < TOL_REF
    assert _rel(got, reference(w, r, tokens, kq_f16=True, rope_freqs=False)) > TOL_REF


@pytest.mark.parametrize("devices", [(), ("sim", "sim")], ids=["cpu", "2sim"])
@pytest.mark.parametrize("n_ubatch", [512, 64], ids=["at-once", "ubatches"])
def test_gemma3_longer_than_the_window(devices: tuple[str, ...], n_ubatch: int, tmp_path: Path) -> None:
    """300 tokens against a window of 128 (layers 0-2 SWA, layer 3 global), then two single tokens.

    With ubatches of 64 the SWA cache has pad(128 + 64, 256) = 256 cells, fewer than the positions,
    so its cells are reused; the reference without a window must not match. The cache is F32 here:
    with QK-norm the keys are O(1), and F16 rounding alone would differ by up to ~7e-5. For the same
    reason GELU runs without ggml-cpu's f16 table on both sides (Numerics(gelu_f16_table=False))."""
    r = _small("logits-tiny_gemma3_f32-faoff")
    path = str(tmp_path / "gemma3.gguf")
    w = write_model(path, r)
    tokens = [int(x) for x in np.random.default_rng(7).integers(0, r["n_vocab"], 302)]
    rt = _runtime(path, n_ctx=512, n_ubatch=n_ubatch, devices=devices, kv="f32", gelu_table=False)
    assert [(c.kind, c.kv_size, c.n_swa) for c in rt.memory.caches] == \
        [("non-SWA", 512, 0), ("SWA", 512 if n_ubatch == 512 else 256, 128)]
    got = np.concatenate([rt.decode(tokens[:300]), rt.decode(tokens[300:301]), rt.decode(tokens[301:])])
    assert _rel(got, reference(w, r, tokens, kv_f16=False, gelu_table=False)) < TOL_REF
    assert _rel(got, reference(w, {**r, "sliding_window": 0}, tokens, kv_f16=False, gelu_table=False)) > TOL_REF
    if devices:
        assert len(rt.log[0].splits) > 1


@pytest.mark.parametrize("devices", [(), ("sim", "sim")], ids=["cpu", "2sim"])
@pytest.mark.parametrize(("fa", "kv"), [("on", "f16"), ("off", "f32")])
def test_qwen3_matches_reference(devices: tuple[str, ...], fa: str, kv: str, tmp_path: Path) -> None:
    r = _small("logits-tiny_qwen3_f32-faon")
    path = str(tmp_path / "qwen3.gguf")
    w = write_model(path, r)
    tokens = [int(x) for x in np.random.default_rng(9).integers(0, r["n_vocab"], 40)]
    rt = _runtime(path, n_ubatch=16, fa=fa, devices=devices, kv=kv)
    got = np.concatenate([rt.decode(tokens[:39]), rt.decode(tokens[39:])])
    assert _rel(got, reference(w, r, tokens, kv_f16=kv == "f16")) < TOL_REF


def test_run_command_on_gemma3_gguf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m toolkit run`` on a gemma3 GGUF: its last logits equal the reference's."""
    from toolkit.jaxrt.cli import main

    r = _small("logits-tiny_gemma3_f32-faoff")
    path = str(tmp_path / "gemma3.gguf")
    w = write_model(path, r)
    assert main(["--gguf", path, "--tokens", "1,5,9,2", "--devices", "sim:2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    want = reference(w, r, [1, 5, 9, 2], kq_f16=True)[-1]
    assert _rel(np.asarray(out["logits"], np.float32), want) < TOL_REF
