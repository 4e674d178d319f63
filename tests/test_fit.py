"""toolkit.fit against the fit oracle (tests/data/fit-cases.json): real llama-fit-params runs
against RPC servers with memory limits, then llama-completion with the printed parameters.

Nothing is keyed on a case id or a model name: each case's inputs go through the same code, and
every number compared was printed by llama.cpp. Every case's model is planned (dense and
mixture-of-experts llama, qwen3, qwen3moe, gemma3); a model of another architecture is refused with
UnsupportedFeature naming the supported ones.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from toolkit import cli
from toolkit.args import model_from_dict, parse_args
from toolkit.errors import UnsupportedFeature
from toolkit.fit import FitImpossible, Fitted, fit_params, overflow_pattern, real_run
from toolkit.fit.cases import fit_case, memory_from_inputs
from toolkit.memory import DeviceMemory, MiB, device_memory
from toolkit.models import archs, presets

DATA = Path(__file__).resolve().parent / "data"
FIT_CASES = DATA / "fit-cases.json"
TOOK = re.compile(r"took [\d.]+ seconds")


@cache
def fit_cases() -> list[dict[str, Any]]:
    return json.loads(FIT_CASES.read_text())


CASES = [c["id"] for c in fit_cases()]

@cache
def _case(cid: str) -> dict[str, Any]:
    return next(c for c in fit_cases() if c["id"] == cid)


@cache
def _fitted(cid: str) -> dict[str, Any]:
    return fit_case(_case(cid))


def _mask(lines: list[str]) -> list[str]:
    # the one number that is a wall-clock time, not a memory size or a parameter
    return [TOOK.sub("took N seconds", line) for line in lines]


@pytest.mark.parametrize("cid", CASES)
def test_every_case_model_is_planned(cid: str) -> None:
    """No case drops out of the checks below: each model builds (UnsupportedFeature would fail here)."""
    hp = model_from_dict(_case(cid)["model"])
    assert hp.n_layer == _case(cid)["model"]["n_layer"]


def test_the_cases_cover_dense_and_moe_models() -> None:
    assert len(CASES) == 68
    archs = {_case(i)["model"]["arch"] for i in CASES}
    assert archs == {"llama", "qwen3", "qwen3moe", "gemma3"}
    assert sum(1 for i in CASES if _case(i)["model"]["n_expert"] > 0) >= 20


@pytest.mark.parametrize("cid", CASES)
def test_printed_line(cid: str) -> None:
    c, got = _case(cid), _fitted(cid)
    assert got["printed"] == c["fit"]["printed"]
    assert got["fitted"] == c["fit"]["fitted"]


# llama-fit-params ends a refused fit with LOG_ERR(EXIT_LINE) and exit(1). Its log is written by a
# worker thread, and lines still queued when exit(1) runs are lost: a run that exited with 1 but
# never printed EXIT_LINE lost the lines logged after fit's warning. Those lines are compared up to
# where the program's output stops, and what was cut must be exactly the lines logged before exit(1).
EXIT_LINE = "llama_fit_params: failed to fit CLI arguments to free memory, exiting..."
LOGGED_BEFORE_EXIT = ("common_fit_params: fitting params to free memory took N seconds", EXIT_LINE)


def _lost_at_exit(c: dict[str, Any]) -> bool:
    return c["fit"]["rc"] == 1 and EXIT_LINE not in c["fit"]["errors"]


@pytest.mark.parametrize("cid", CASES)
def test_log_lines(cid: str) -> None:
    c, got = _case(cid), _fitted(cid)
    want, have = _mask(c["fit"]["fit_log_lines"]), _mask(got["log_lines"])
    if _lost_at_exit(c):
        assert want[-1].startswith("common_fit_params: failed to fit params to free device memory: ")
        assert tuple(have[len(want):]) == LOGGED_BEFORE_EXIT
        have = have[:len(want)]
    assert have == want


def test_a_log_cut_at_exit_is_recognised() -> None:
    """The rule above applies to the one case whose output stops before exit(1) (rc 1, no EXIT_LINE),
    not to refused fits whose log is complete."""
    cut = [c["id"] for c in fit_cases() if _lost_at_exit(c)]
    assert cut == ["fit-tiny_qwen3moe_f32-rpc2-1055_1055-ts1_1"]
    full = [c["id"] for c in fit_cases() if c["fit"]["rc"] == 1 and not _lost_at_exit(c)]
    assert len(full) >= 4 and all(_case(i)["fit"]["fit_log_lines"][-1] == EXIT_LINE for i in full)


@pytest.mark.parametrize("cid", CASES)
def test_every_probe_compute_and_kv(cid: str) -> None:
    """Each no-alloc probe: the pp-only compute buffer per buft, the context's memory (the KV caches
    here) and the layer count."""
    c, got = _case(cid), _fitted(cid)
    want = c["fit"]["probes"]
    assert len(got["probes"]) == len(want)
    for g, w in zip(got["probes"], want):
        assert {x["buft"]: x["bytes"] for x in g["compute_buffer"]} == {x["buft"]: x["bytes"] for x in
                                                                        w["compute_buffer"]}
        assert sum(x["bytes"] for x in g["context"]) == sum(k["size_k_bytes"] + k["size_v_bytes"] for k in w["kv"])
        assert g["n_copies"] == w["summary"]["n_copies"]


@pytest.mark.parametrize("cid", [i for i in CASES if "run" in _case(i)])
def test_real_buffers_of_the_printed_parameters(cid: str) -> None:
    """llama-completion with the printed line (or, after a refused fit, with the user's own
    parameters): the toolkit's full reserve gives the measured buffers and device use."""
    c, got = _case(cid), _fitted(cid)
    obs = c["run"]["observed"]
    real = got["real"]
    assert real["compute_buffers_bytes"] == obs["compute_buffers_bytes"]
    assert real["context_buffers_bytes"] == obs["kv_buffers_bytes"]   # the KV caches are the context's memory
    assert real["model_buffers_bytes"] == obs["model_buffers_bytes"]
    for d, chk in zip(real["devices"], c["run"]["device_check"]):
        assert d["real"]["total"] == chk["used_bytes"]
        assert (d["fits"], d["keeps_margin"]) == (chk["fits_limit"], chk["fits_limit_minus_margin"])


@pytest.mark.parametrize("cid", [i for i in CASES if "run_fit_on" in _case(i)])
def test_in_process_fit_buffers(cid: str) -> None:
    """-fit on inside llama-completion keeps fit's own split (e.g. 7,0), which the printed line drops."""
    c, got = _case(cid), _fitted(cid)
    obs = c["run_fit_on"]["observed"]
    assert got["real_fit_on"]["compute_buffers_bytes"] == obs["compute_buffers_bytes"]
    assert got["real_fit_on"]["model_buffers_bytes"] == obs["model_buffers_bytes"]
    assert got["real_fit_on"]["context_buffers_bytes"] == obs["kv_buffers_bytes"]


def test_printed_line_differs_from_the_in_process_fit() -> None:
    """med_f32 at 1245/1097 MiB: fit decides -ts 7,0, prints no -ts, and the printed line then
    splits by free memory and puts 156 MiB on RPC1 against a 73 MiB target."""
    hits = [i for i in CASES if _fitted(i).get("printed_differs")]
    assert "fit-med_f32-rpc2-1245_1097-default" in hits
    for cid in hits:
        got = _fitted(cid)
        assert "-ts" not in got["printed"] and got["fitted_in_process"]["ts"][-1] == 0
    med = _fitted("fit-med_f32-rpc2-1245_1097-default")
    # the printed line puts the layers elsewhere than fit decided
    assert med["real"]["model_buffers_bytes"] != med["real_fit_on"]["model_buffers_bytes"]
    assert [d["keeps_margin"] for d in med["real"]["devices"]] == [True, False]
    assert all(d["keeps_margin"] for d in med["real_fit_on"]["devices"])


def _unsupported_case(cid: str, arch: str = "falcon") -> dict[str, Any]:
    """A real case whose model claims an architecture the toolkit has no graph builder for."""
    assert arch not in archs.names()
    c = _case(cid)
    return {**c, "id": f"{cid}-as-{arch}", "model": {**c["model"], "arch": arch}}


@pytest.mark.parametrize("cid", ["fit-tiny_qwen3_f32-rpc2-1077_1077-default", "fit-med_f32-rpc1-layers_1171-fitc256"])
def test_other_architectures_are_refused_clearly(cid: str) -> None:
    c = _unsupported_case(cid)
    with pytest.raises(UnsupportedFeature) as e:
        model_from_dict(c["model"])
    assert e.value.feature == "arch"
    got = fit_case(c, real=False)
    assert got["unsupported"] == "arch" and set(got) == {"id", "error", "unsupported"}
    assert "'falcon' is not supported" in got["error"]
    assert all(a in got["error"].split("supported: ")[1] for a in archs.names()), got["error"]


def test_fit_cases_json_interface(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = _unsupported_case(CASES[0])
    ids = [CASES[0], "fit-med_f32-rpc2-1171_1171-default", bad["id"]]
    p = tmp_path / "fit.json"
    p.write_text(json.dumps([_case(i) for i in ids[:2]] + [bad]))
    assert cli.main(["fit", "--cases", str(p), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in out] == ids
    for r in out[:2]:
        assert {"id", "printed", "fitted", "probes", "log_lines"} <= set(r)
        assert r["printed"] == _case(r["id"])["fit"]["printed"]
    assert out[1]["fitted"] == {"c": 4096, "ngl": 9, "ts": "7,2", "ot": None}
    assert "'falcon' is not supported" in out[2]["error"] and "printed" not in out[2]


def test_fit_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI prints llama-fit-params' line on stdout and its log plus the real-run check on stderr."""
    c = _case("fit-med_f32-rpc1-layers_1171-fitc256")
    argv = ["fit", "-m", "med", "--rpc", "127.0.0.1:50062", "--device-memory",
            c["inputs"]["server_env"][0]["ORACLE_RPC_FREE_BYTES"], "--fit-ctx", "256"]
    assert cli.main(argv) == 0
    out = capsys.readouterr()
    assert out.out.strip() == c["fit"]["printed"] == "-c 256 -ngl 5"
    assert "common_params_fit_impl:   - RPC0 (127.0.0.1:50062):  5 layers" in out.err
    assert "real run: RPC0:" in out.err
    assert cli.main(["fit", "-m", "med", "--rpc", "127.0.0.1:50062", "--device-memory", "1171M", "-ngl", "99"]) == 1
    assert "n_gpu_layers already set by user to 99, abort" in capsys.readouterr().err


def test_fit_print_rows(capsys: pytest.CaptureFixture[str]) -> None:
    c = _case("fitprint-med_f32-rpc1")
    assert cli.main(["fit", "-m", "med", "--rpc", "127.0.0.1:50062", "--device-memory", "24105M",
                     "--fit-print", "on"]) == 0
    assert capsys.readouterr().out.rstrip() == c["fit"]["printed"]


def test_memory_from_inputs_reads_exact_bytes() -> None:
    c = _case("fit-med_f32-rpc2-1245_1097-default")
    assert memory_from_inputs(c) == [(1305477120, 1305477120), (1150287872, 1150287872)]


# ---- beyond the oracle: simulated devices ---------------------------------------------------------

def test_simulated_devices_take_their_budgets() -> None:
    args = parse_args(["-m", "llama3_8b", "--device", "sim:8G", "-fa", "on"])
    mem = device_memory(args)
    assert mem == [DeviceMemory("SIM0", "simulated accelerator", 8 << 30, 8 << 30)]
    r = fit_params(presets.llama3_8b(), args)
    assert r.status == "success" and 0 < r.fitted.ngl < 33
    used = r.used[0]
    assert used <= (8 << 30) - (1 << 30)
    # one more layer would break the margin: the false-position search stopped at the largest count
    more = fit_params(presets.llama3_8b(), parse_args(["-c", str(r.fitted.c), "-ngl", str(r.fitted.ngl + 1),
                                                       "--device", "sim:8G", "-fa", "on", "--fit", "off"]))
    assert more.status == "failure"   # -ngl given by the user: fit refuses, as llama.cpp does
    from toolkit.fit import probe
    p = probe(presets.llama3_8b(), args.context_params(n_ctx=r.fitted.c, n_gpu_layers=r.fitted.ngl + 1), mem)
    assert p.used(0) > (8 << 30) - (1 << 30)


def test_impossible_fit_reports_missing_mib_per_device() -> None:
    """A margin larger than the device: even 0 layers cannot keep it; check() names what is missing.

    Without op offload nothing is left on the device at 0 layers, so exactly the 512 MiB the margin
    exceeds the device are missing; with op offload the CPU layers' large matrix products still run
    on the device (a CUDA-like offload rule), and its compute buffer is missing too."""
    args = parse_args(["-m", "tiny", "--device", "sim:512M", "--fit-target", "1024", "--no-op-offload"])
    r = fit_params(presets.tiny(), args)
    assert r.fitted.ngl == 0
    with pytest.raises(FitImpossible) as e:
        r.check()
    assert e.value.missing_mib == {"SIM0": 512}
    assert "SIM0: 512 MiB" in str(e.value)
    r = fit_params(presets.tiny(), args.replace(op_offload=True))
    assert r.fitted.ngl == 0 and r.missing_mib()["SIM0"] > 512


def test_exact_fit_fixes_the_context_overshoot() -> None:
    """tiny_f32 at 1066 MiB with --fit-ctx 256: llama.cpp interpolates to -c 512, and the real run
    (measured: 70.8 MiB on RPC0) misses the 42 MiB target; the exact fit lowers the context until
    the full reserve keeps the margin."""
    c = _case("fit-tiny_f32-rpc1-layers_1066-fitc256")
    assert c["run"]["device_check"][0]["fits_limit_minus_margin"] is False
    args = parse_args(c["inputs"]["cli_args"])
    mem = device_memory(args, memory_from_inputs(c))
    plain = fit_params(presets.tiny(), args, mem)
    assert plain.printed == c["fit"]["printed"] == "-c 512 -ngl -1"
    assert not real_run(presets.tiny(), args, plain).devices[0].keeps_margin
    exact = fit_params(presets.tiny(), args, mem, exact=True)
    assert exact.fitted.c < 512 and exact.fitted.ngl == -1
    assert real_run(presets.tiny(), args, exact).devices[0].keeps_margin
    assert any("exact: context size 512" in line for line in exact.log_lines)


def test_exact_fit_checks_every_device() -> None:
    """Two CUDA-like simulated devices: llama.cpp checks only the device it is filling, so the layer
    that completes the offload turns on pipeline parallelism (4 copies) and grows the last device's
    compute buffer past its target unseen; the exact fit checks every device."""
    args = parse_args(["-m", "llama3_8b", "--device", "sim:9100M,sim:9100M", "-fa", "on", "-c", "8192",
                       "-ub", "2048", "-fitt", "256"])
    hp = presets.llama3_8b()
    plain = fit_params(hp, args)
    real = real_run(hp, args, plain)
    assert plain.fitted.ngl == hp.n_layer + 1 and real.n_copies == 4
    assert [d.keeps_margin for d in real.devices] == [True, False]
    exact = fit_params(hp, args, exact=True)
    real = real_run(hp, args, exact)
    assert exact.fitted.ngl == hp.n_layer and real.n_copies == 1
    assert all(d.keeps_margin for d in real.devices)


def test_overflow_patterns_and_printed_form() -> None:
    from toolkit.fit import LAYER_FRACTION_ATTN, LAYER_FRACTION_GATE, LAYER_FRACTION_MOE, LAYER_FRACTION_UP
    assert overflow_pattern(3, LAYER_FRACTION_ATTN) == "blk\\.3\\.ffn_(gate|up|gate_up|down).*"
    assert overflow_pattern(3, LAYER_FRACTION_UP) == "blk\\.3\\.ffn_(gate|gate_up|down).*"
    assert overflow_pattern(3, LAYER_FRACTION_GATE) == "blk\\.3\\.ffn_down.*"
    assert overflow_pattern(4, LAYER_FRACTION_MOE) == "blk\\.4\\.ffn_(up|down|gate_up|gate)_(ch|)exps"
    # the ATTN pattern also matches the router ffn_gate_inp
    assert re.search(overflow_pattern(2, LAYER_FRACTION_ATTN), "blk.2.ffn_gate_inp.weight")
    f = Fitted(4096, 5, (5, 0), ((overflow_pattern(2, LAYER_FRACTION_UP), "CPU"),))
    assert f.printed() == '-c 4096 -ngl 5 -ot "blk\\.2\\.ffn_(gate|gate_up|down).*=CPU"'
    assert Fitted(4096, 9, (7, 2, 0), ()).printed() == "-c 4096 -ngl 9 -ts 7,2"
    assert Fitted(4096, -1, None, ()).printed() == "-c 4096 -ngl -1"
    assert MiB == 1 << 20


# ---- mixture of experts: the placement fit decided, mapped to -ngl/-ts/-ot -------------------------

_FINAL = re.compile(r"common_params_fit_impl:   - RPC(\d+) \(.*?\):\s+(\d+) layers(?: \(\s*(\d+) overflowing\))?,")
_TYPE = re.compile(r"set ngl_per_device\[(\d+)\]\.\(n_layer, n_part, overflow_type\)=\(\d+, \d+, (UP|GATE|ATTN)\)")
MOE_PLACED = [c["id"] for c in fit_cases() if c["model"].get("n_expert") and c["fit"]["printed"]
              and "fit-print" not in c["kind"] and "-ngl -1" not in c["fit"]["printed"]]


@pytest.mark.parametrize("cid", MOE_PLACED)
def test_moe_placement_gives_the_printed_overrides(cid: str) -> None:
    """set_ngl_tensor_split_tbo on the layer counts fit logged (per device: layers, partial layers,
    the overflow type of the first partial layer) gives llama-fit-params' -ngl, -ts and -ot.

    This checks the mapping step on its own; the full fit of these cases is checked above."""
    from toolkit.fit import (
        LAYER_FRACTION_ATTN,
        LAYER_FRACTION_GATE,
        LAYER_FRACTION_MOE,
        LAYER_FRACTION_UP,
        LayerCount,
        set_ngl_tensor_split_tbo,
    )
    c = _case(cid)
    lines = c["fit"]["fit_log_lines"]
    nd = len(c["inputs"]["server_free_mib"])
    per_dev = [LayerCount() for _ in range(nd)]
    for line in lines:
        if m := _FINAL.search(line):
            d, n, part = int(m.group(1)), int(m.group(2)), m.group(3)
            if part is None:
                # dense-only layers: all partial, except the output layer on the last device
                part = n if d < nd - 1 or n == 0 else n - 1
            per_dev[d] = LayerCount(n, int(part), per_dev[d].overflow_type)
        if m := _TYPE.search(line):
            kind = {"UP": LAYER_FRACTION_UP, "GATE": LAYER_FRACTION_GATE, "ATTN": LAYER_FRACTION_ATTN}[m.group(2)]
            per_dev[int(m.group(1))].overflow_type = kind
    bufts = ["CPU"] * nd
    for d in range(nd - 1):
        if per_dev[d].overflow_type != LAYER_FRACTION_MOE:
            bufts[d] = f"RPC0[127.0.0.1:{50063 + d}]"
    ngl, ts, ot = set_ngl_tensor_split_tbo(per_dev, bufts, int(c["model"]["n_layer"]))
    f = Fitted(c["fit"]["fitted"]["c"], ngl, tuple(int(x) for x in ts) if ts else None, ot)
    assert f.printed() == c["fit"]["printed"]


def test_cpu_only_fit_compares_host_total_memory() -> None:
    """Without model devices fit compares the host's total memory (--device cpu:SIZE) and can only
    shrink the context; when even --fit-ctx does not fit, it gives up and says what is missing."""
    hp = presets.small()
    ok = fit_params(hp, parse_args(["--device", "cpu:64G"]))
    assert ok.status == "success" and ok.printed == "-c 4096 -ngl -1"
    assert any("MiB of total host memory" in line for line in ok.log_lines)
    shrunk = fit_params(hp, parse_args(["--device", "cpu:140M", "--fit-ctx", "256", "--fit-target", "16"]))
    assert shrunk.status == "success" and 256 <= shrunk.fitted.c < 4096
    assert "common_params_fit_impl: entire model can be fit by reducing context" in shrunk.log_lines
    short = fit_params(hp, parse_args(["--device", "cpu:80M", "--fit-ctx", "256", "--fit-target", "16"]))
    assert short.status == "failure" and "unable to fit model into system memory" in short.error
    with pytest.raises(FitImpossible) as e:
        short.check()
    assert set(e.value.missing_mib) == {"Host"} and e.value.missing_mib["Host"] > 0


# ---- -fit on inside the program: plan fits first, as common_init_result does ----------------------

def _fit_on(run: dict[str, Any]) -> bool:
    args = run["cli_args"]
    return args[args.index("-fit") + 1] == "on"


FIT_ON_RUNS = [(cid, key) for cid in CASES for key in ("run", "run_fit_on")
               if key in _case(cid) and _fit_on(_case(cid)[key])]


@pytest.mark.parametrize(("cid", "key"), FIT_ON_RUNS)
def test_plan_with_fit_on_is_the_program_run(cid: str, key: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """llama-completion with -fit on (the default): plan given the same command line fits in process,
    keeps fit's own split, and gives the measured buffers, fit log and final breakdown table."""
    c = _case(cid)
    run = c[key]
    argv = list(run["cli_args"])
    mp = tmp_path / "model.json"
    mp.write_text(json.dumps(c["model"]))
    argv[argv.index("-m") + 1] = str(mp)
    mem = [free for free, _ in memory_from_inputs(c)]
    assert cli.main(["plan", *argv, "--device-memory", ",".join(map(str, mem)), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    obs = run["observed"]
    for f in ("compute_buffers_bytes", "kv_buffers_bytes", "model_buffers_bytes", "graph_splits", "n_copies"):
        assert got[f] == obs[f], f
    # the case keeps the probes' tables with the exit table in observed.memory_breakdown
    tables = [line for line in got["fit_log_lines"] if line.startswith("common_memory_breakdown_print: ")]
    lines = [line for line in got["fit_log_lines"] if line not in tables]
    assert _mask(lines) == _mask(run["fit_log_lines"])
    n_rows = len(mem) + 2
    assert [t.split(": ", 1)[1] for t in tables] + got["memory_breakdown"] == obs["memory_breakdown"]
    assert got["memory_breakdown"] == obs["memory_breakdown"][-n_rows:]


def test_a_refused_fit_keeps_its_context_reduction() -> None:
    """-ngl given: fit shrinks the unset context first, then refuses to fit layers; llama.cpp edited
    the parameters in place, so a program continuing after the refusal runs with the smaller context."""
    args = parse_args(["--rpc", "127.0.0.1:50062", "--device-memory", "1097M", "--fit-ctx", "256", "-ngl", "99"])
    r = fit_params(presets.small(), args)
    assert r.status == "failure" and r.printed == ""
    assert "n_gpu_layers already set by user to 99, abort" in r.error
    assert any("context size reduced from 4096 to" in line for line in r.log_lines)
    assert 256 <= r.fitted.c < 4096 and r.fitted.ngl == 99
    real = real_run(presets.small(), args, r)
    assert real.params.n_ctx == r.fitted.c and real.params.n_gpu_layers == 99


def test_qwen3_30b_a3b_f16_on_one_24g_device_puts_a_block_of_experts_on_the_cpu() -> None:
    """llama.cpp's published example, on a simulated device: Qwen3-30B-A3B f16 (about 57 GiB) on one
    24 GiB device with the default 1024 MiB margin. The context drops to --fit-ctx (4096), every
    layer is offloaded, and the experts of a trailing block of layers go to the CPU: one partial
    layer (UP/GATE/ATTN pattern), then MoE patterns for every later layer (the last one names layer
    n_layer, which matches no tensor). The structure is checked, not the layer numbers."""
    from toolkit.fit import LAYER_FRACTION_MOE
    hp = presets.qwen3_30b_a3b("f16")
    args = parse_args(["-m", "qwen3_30b_a3b", "--device", "sim:24G"])
    r = fit_params(hp, args)
    assert r.status == "success", r.error
    f = r.fitted
    assert f.c == 4096 and f.ngl == hp.n_layer + 1 and f.ts is None
    assert all(buft == "CPU" for _, buft in f.ot)
    layers = [int(re.match(r"blk\\\.(\d+)\\\.", pat).group(1)) for pat, _ in f.ot]  # type: ignore[union-attr]
    first = layers[0]
    assert 0 < first < hp.n_layer - 1 and layers == list(range(first, hp.n_layer + 1))
    assert f.ot[0][0] != overflow_pattern(first, LAYER_FRACTION_MOE)
    assert all(pat == overflow_pattern(i, LAYER_FRACTION_MOE) for (pat, _), i in zip(f.ot[1:], layers[1:]))
    assert r.printed.startswith(f'-c 4096 -ngl {hp.n_layer + 1} -ot "blk\\.{first}\\.ffn_')
    # the estimate keeps the margin on the device, and one more full layer of experts would not
    assert r.used[0] <= (24 << 30) - (1 << 30)
    assert any("context size reduced from 40960 to 4096" in line for line in r.log_lines)
