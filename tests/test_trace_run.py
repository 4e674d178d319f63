"""toolkit.trace end to end on 3 simulated CPU devices: scheduled, allocated, run split by split.

JAX fixes its CPU device count when it starts, and other test modules may start it first in
this process, so the cases run in a subprocess (tests/trace_cases.py) with
JAX_NUM_CPU_DEVICES=3; each test reads one case's measured result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
CASES = ["mlp", "attention", "transformer", "transformer_jit", "gather", "transformer_lacking", "mlp_offload",
         "mlp_no_offload", "attention_parallel"]


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    env = dict(os.environ, JAX_NUM_CPU_DEVICES="3", JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(TESTS.parent), os.environ.get("PYTHONPATH", "")]))
    env.pop("GGML_OP_OFFLOAD_MIN_BATCH", None)
    out = subprocess.run([sys.executable, str(TESTS / "trace_cases.py")], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    data = json.loads(out.stdout)
    assert data["n_devices"] == 3
    return data["cases"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("case", CASES)
def test_outputs_equal_jax_jit(results: dict[str, Any], case: str) -> None:
    r = results[case]
    assert r["ok"]
    assert all(r["shapes_match"]) and all(r["dtypes_match"])
    assert r["allclose"], f"{case}: max |diff| {r['max_abs_diff']}"


@pytest.mark.parametrize("case", CASES)
def test_plan_is_valid(results: dict[str, Any], case: str) -> None:
    """Splits consecutive, every node on a supporting backend, no overlapping live tensors."""
    r = results[case]
    assert r["problems"] == [], "\n".join(r["problems"])
    assert r["ran_splits"] == r["n_splits"]  # the executor followed the scheduler's splits


def test_weights_spread_over_devices_run_on_those_devices(results: dict[str, Any]) -> None:
    for case in ("mlp", "attention", "transformer"):
        r = results[case]
        assert r["split_backends"] == ["SIM0", "SIM1"], case
        assert r["devices"] == ["cpu:0", "cpu:1"], case
        assert r["run_copies"] >= 1  # the activations crossed devices via device_put


def test_transformer_keeps_views_and_concat(results: dict[str, Any]) -> None:
    ops = set(results["transformer"]["ggml_ops"])
    assert {"RESHAPE", "PERMUTE", "VIEW", "CONCAT", "MUL_MAT", "JAX"} <= ops
    assert results["transformer"]["inplace"] > 0  # element-wise nodes reused their parents' memory


def test_integer_gather_is_get_rows_on_the_weights_backend(results: dict[str, Any]) -> None:
    r = results["gather"]
    assert "GET_ROWS" in r["ggml_ops"]
    gathers = [n for n in r["backend_of"] if n.startswith("gather")]
    assert gathers and all(r["backend_of"][n] == "CPU" for n in gathers)  # GET_ROWS: never offloaded


def test_lacking_primitive_moves_nodes_off_the_device(results: dict[str, Any]) -> None:
    r = results["transformer_lacking"]
    assert r["lacking_nodes"]
    assert all(r["backend_of"][n] != "SIM0" for n in r["lacking_nodes"])
    assert r["n_splits"] > results["transformer"]["n_splits"]


def test_op_offload_batch_rule(results: dict[str, Any]) -> None:
    on, off = results["mlp_offload"], results["mlp_no_offload"]
    assert "OP_OFFLOAD" in on["causes"] and "OP_OFFLOAD" not in off["causes"]
    mm_on = [n for n in on["backend_of"] if n.startswith("dot_general")]
    assert all(on["backend_of"][n] == "SIM0" for n in mm_on)
    assert set(off["backend_of"].values()) == {"CPU"} and off["split_backends"] == ["CPU"]
    # one split per offloaded host weight once the split has inputs (``ggml_backend_sched_split_graph`` pass 5)
    assert on["split_backends"] == ["SIM0", "SIM0"]


def test_pipeline_parallel_copies(results: dict[str, Any]) -> None:
    assert results["attention_parallel"]["n_copies"] == 4
    assert results["attention"]["n_copies"] == 1


def test_text_form_lists_splits_and_buffers(results: dict[str, Any]) -> None:
    text = results["transformer"]["text"]
    assert "split  0" in text and "compute buffer" in text and "model buffer" in text
