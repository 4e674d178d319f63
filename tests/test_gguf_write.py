"""toolkit.models.gguf_write: sparse GGUFs of real-size shapes (tensor infos written, the data a hole).

The oracle's real-size cases (tests/data/realsize-fit-cases.json) were run on files llama.cpp's side
wrote the same way; their recorded tensor counts, types and data-section sizes are the check here, and
a fit from the written file prints llama-fit-params' line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from fit_checks import load_fit_cases

from toolkit.args import model_from_dict
from toolkit.errors import ParameterError
from toolkit.fit.cases import memory_from_inputs, model_description
from toolkit.models import archs
from toolkit.models.gguf import hparams_from_gguf
from toolkit.models.gguf_file import open_gguf
from toolkit.models.gguf_write import write_sparse_gguf

ROOT = Path(__file__).resolve().parents[1]
CASES = load_fit_cases("realsize-fit-cases.json")
SHAPES = {c["model"]["name"]: c["model"] for c in CASES.values()}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_sparse_file_has_the_real_files_tensors(name: str, tmp_path: Path) -> None:
    m = SHAPES[name]
    hp = model_from_dict(model_description(m))
    f = write_sparse_gguf(tmp_path / "m.gguf", hp)
    assert f.n_tensors == m["n_tensors_in_file"]
    # the tensor data (every tensor padded to the alignment) as long as in the oracle's file; the header
    # differs (its vocabulary is a real one)
    assert f.file_size - f.data_offset == m["file_size_bytes"] - m["data_offset"]
    assert os.stat(f.path).st_size == f.file_size
    assert os.stat(f.path).st_blocks * 512 < 16 << 20          # a hole, not GBs of zeros
    g = open_gguf(f.path)
    assert dict(Counter(t.type.lower for t in g.tensors.values())) == m["tensor_type_counts"]
    assert [(t.name, t.ne, t.type) for t in g.tensors.values()] == \
        [(w.name, w.ne, w.type) for w in archs.get(hp.arch).weights(hp)]
    back = hparams_from_gguf(f.path)
    assert (back.arch, back.n_layer, back.n_embd, back.n_head_kv_arr, back.n_ff_arr, back.n_vocab, back.dtype,
            back.moe) == (hp.arch, hp.n_layer, hp.n_embd, hp.n_head_kv_arr, hp.n_ff_arr, hp.n_vocab, hp.dtype, hp.moe)


def test_fit_from_the_sparse_file_prints_llama_fit_params_line(tmp_path: Path) -> None:
    """``python -m toolkit fit`` on the written Qwen3-30B-A3B-shaped file against a 33477 MiB server
    prints llama-fit-params' line for that case (the context reduced), and its planning path imports
    none of the heavy libraries (JAX, plotly, ipywidgets, not even numpy)."""
    c = CASES["fit-real_qwen3_30b_a3b-rpc1-ctx_33477-default"]
    f = write_sparse_gguf(tmp_path / "q.gguf", model_from_dict(model_description(c["model"])))
    (free, _), = memory_from_inputs(c)
    argv = ["fit", "-m", str(f.path), "--rpc", "127.0.0.1:50072", "--device-memory", str(free), "-fa", "on"]
    code = ("import runpy, sys; sys.argv = ['toolkit', *sys.argv[1:]]\n"
            "try:\n    runpy.run_module('toolkit', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in sys.modules\n"
            "               if m.split('.')[0] in ('jax', 'jaxlib', 'plotly', 'ipywidgets', 'numpy'))\n"
            "print('HEAVY', *heavy)")
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    out = r.stdout.splitlines()
    assert out[-1] == "HEAVY", r.stderr[-2000:]
    assert out[-2] == c["fit"]["printed"]
    assert "common_params_fit_impl: entire model can be fit by reducing context" in r.stderr


def test_the_writer_refuses_a_vocabulary_of_the_wrong_size(tmp_path: Path) -> None:
    hp = model_from_dict(model_description(SHAPES["real_llama31_8b"]))
    with pytest.raises(ParameterError, match="vocab"):
        write_sparse_gguf(tmp_path / "v.gguf", hp, vocab={"tokens": ["a"], "scores": [0.0], "token_types": [1]})
