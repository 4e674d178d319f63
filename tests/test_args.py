"""toolkit.args: llama.cpp's flag grammar, its errors and the ContextParams it gives."""

from __future__ import annotations

import pytest
from oracle_cases import cases

from toolkit.args import (
    N_GPU_LAYERS_ALL,
    N_GPU_LAYERS_AUTO,
    context_flags,
    fit_targets_bytes,
    load_model_arg,
    model_from_dict,
    parse_args,
)
from toolkit.cases import cparams_from_case
from toolkit.errors import ParameterError, UnsupportedFeature
from toolkit.models import presets
from toolkit.models.cparams import DEFAULT_N_GPU_LAYERS, ContextParams


def test_defaults_are_llama_cpp_common_params() -> None:
    a = parse_args([])
    assert (a.n_ctx, a.n_batch, a.n_ubatch, a.n_parallel, a.flash_attn) == (0, 2048, 512, 1, "auto")
    assert a.n_gpu_layers == N_GPU_LAYERS_AUTO and not a.n_gpu_layers_set
    assert (a.fit, a.fit_target_mib, a.fit_ctx, a.fit_print) == (True, (1024,), 4096, False)
    assert a.context_params().n_gpu_layers == DEFAULT_N_GPU_LAYERS


def test_every_flag_and_its_long_form() -> None:
    a = parse_args(["--model", "small", "--ctx-size", "8192", "--batch-size", "1024", "--ubatch-size", "256",
                    "--parallel", "4", "--kv-unified", "--n-gpu-layers", "7", "--tensor-split", "3/1",
                    "--split-mode", "row", "--main-gpu", "1", "--flash-attn", "off", "--cache-type-k", "q8_0",
                    "--cache-type-v", "q4_0", "--no-kv-offload", "--no-op-offload", "--swa-full",
                    "--device", "sim:8G,sim:8G", "--fit", "off", "--fit-target", "512,256", "--fit-ctx", "1024",
                    "--fit-print", "on", "--no-mmap"])
    cp = a.context_params()
    assert (cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max, cp.kv_unified) == (8192, 1024, 256, 4, True)
    assert (cp.n_gpu_layers, cp.tensor_split, cp.split_mode, cp.main_gpu) == (7, (3.0, 1.0), "row", 1)
    assert (cp.flash_attn, cp.type_k, cp.type_v, cp.offload_kqv, cp.op_offload) == ("off", "q8_0", "q4_0", False, False)
    assert (cp.swa_full, cp.use_mmap, cp.devices) == (True, False, ("sim:8G", "sim:8G"))
    assert (a.fit, a.fit_target_mib, a.fit_ctx, a.fit_print) == (False, (512, 256), 1024, True)
    assert {"-c", "-ngl", "-ts", "-fitt"} <= a.set_flags


def test_short_forms_equals_values_and_ignored_program_flags() -> None:
    a = parse_args(["-m", "tiny", "-c", "1024", "-t", "2", "-lv", "4", "-p", "Hello world", "-n", "1", "-no-cnv",
                    "-s", "42", "--temp", "0", "--log-prefix", "--no-log-timestamps", "--ctx-size=2048"])
    assert a.n_ctx == 2048 and a.model == "tiny"


@pytest.mark.parametrize(("raw", "want"), [("on", "on"), ("enabled", "on"), ("1", "on"), ("off", "off"),
                                           ("disabled", "off"), ("0", "off"), ("auto", "auto"), ("-1", "auto")])
def test_flash_attn_values(raw: str, want: str) -> None:
    assert parse_args(["-fa", raw]).flash_attn == want


def test_ngl_auto_all_and_counts() -> None:
    assert parse_args(["-ngl", "auto"]).n_gpu_layers == N_GPU_LAYERS_AUTO
    a = parse_args(["-ngl", "all"])
    assert a.n_gpu_layers == N_GPU_LAYERS_ALL and a.n_gpu_layers_set
    assert a.context_params().n_gpu_layers == DEFAULT_N_GPU_LAYERS
    assert parse_args(["-ngl", "0"]).context_params().n_gpu_layers == 0


def test_overrides_are_parsed_into_context_params() -> None:
    a = parse_args(["-ot", "ffn_.*_exps=CPU,attn=RPC0", "-ot", "output=CPU", "--cpu-moe", "--n-cpu-moe", "2"])
    assert a.override_tensor == ("ffn_.*_exps=CPU", "attn=RPC0", "output=CPU")
    assert (a.cpu_moe, a.n_cpu_moe, a.has_tensor_overrides) == (True, 2, True)
    cp = a.context_params()
    assert (cp.override_tensor, cp.cpu_moe, cp.n_cpu_moe) == (a.override_tensor, True, 2)
    assert not parse_args([]).has_tensor_overrides


def test_user_overrides_stop_layer_fitting() -> None:
    """-ot reaches planning: refused by name while overrides are not placed, else fit stops before
    fitting layers, as common_params_fit_impl does for user tensor_buft_overrides."""
    from toolkit.fit import fit_params
    args = parse_args(["--rpc", "127.0.0.1:50062", "--device-memory", "1034M", "-ot", "ffn_down=CPU"])
    try:
        r = fit_params(presets.tiny(), args)
    except UnsupportedFeature as e:
        assert e.feature == "tensor_overrides" and "ffn_down=CPU" in str(e)
    else:
        assert r.status == "failure" and r.error == "model_params::tensor_buft_overrides already set by user, abort"


def test_devices_and_rpc_endpoints() -> None:
    a = parse_args(["--device", "cuda:24G,cpu", "--rpc", "127.0.0.1:50052,10.0.0.2:50053"])
    assert a.devices == ("cuda:24G", "rpc:127.0.0.1:50052", "rpc:10.0.0.2:50053")
    assert parse_args(["--device-memory", "1171M,1G"]).device_memory == (1171 << 20, 1 << 30)


def test_batched_bench_npl_and_oracle_force_pp_env() -> None:
    a = parse_args(["-npl", "1,4", "-kvu"], env={"ORACLE_FORCE_PP": "1"})
    assert a.n_parallel == 4 and a.kv_unified and a.force_pipeline_parallel
    assert not parse_args([], env={"ORACLE_FORCE_PP": "0"}).force_pipeline_parallel


def test_fit_targets_broadcast_and_per_device() -> None:
    assert fit_targets_bytes(parse_args([]), 2) == [1024 << 20] * 2
    assert fit_targets_bytes(parse_args(["-fitt", "512/64"]), 2) == [512 << 20, 64 << 20]
    assert fit_targets_bytes(parse_args(["-fitt", "512,64"]), 3) == [512 << 20, 64 << 20, 1024 << 20]
    with pytest.raises(ParameterError, match="at most 1 values"):
        fit_targets_bytes(parse_args(["-fitt", "512,64"]), 1)


@pytest.mark.parametrize(("argv", "flag", "accepted"), [
    (["-fa", "maybe"], "-fa", "on|off|auto"),
    (["--fit", "yes please"], "--fit", "on|off"),
    (["-c", "-5"], "-c", "integer from 0 to 2147483647"),
    (["-ub", "x"], "-ub", "integer from 1 to 2147483647"),
    (["-ngl", "many"], "-ngl", "auto, all or a number"),
    (["-ts", "3,-1"], "-ts", "non-negative proportions"),
    (["-sm", "diagonal"], "-sm", "none|layer|row"),
    (["-ctk", "q3_x"], "-ctk", "f32|f16"),
    (["-ot", "nopattern"], "-ot", "<tensor name pattern>=<buffer type>"),
    (["-ot", "blk.(=CPU"], "-ot", "valid regular expression"),
    (["-ncmoe", "-1"], "-ncmoe", "integer from 0 to 2147483647"),
    (["-c", "4294967296"], "-c", "integer from 0 to 2147483647"),
    (["--device", "gpu9:1G"], "--device", "device strings of the kinds"),
    (["--device", "sim:lots"], "--device", "memory size"),
    (["--rpc", "localhost"], "--rpc", "HOST:PORT"),
    (["-fitt", "a lot"], "-fitt", "MiB per device"),
    (["--device-memory", "big"], "--device-memory", "memory size per model device"),
    (["--frobnicate"], "argument", "a llama.cpp flag"),
    (["-c"], "-c", "a value after the flag"),
    (["--swa-full=on"], "--swa-full", "no value"),
])
def test_bad_values_name_flag_value_and_what_is_accepted(argv: list[str], flag: str, accepted: str) -> None:
    with pytest.raises(ParameterError) as e:
        parse_args(argv)
    assert e.value.param == flag
    assert accepted in e.value.accepted


def test_every_oracle_case_cli_args_give_its_cparams() -> None:
    """The grammar reads every first-oracle command line into the values the case records
    (the recorded values have no load mode: -lm is checked on its own)."""
    for c in cases():
        d = c["cparams"]
        cp = cparams_from_case(d)
        recorded = cparams_from_case({k: v for k, v in d.items() if k != "cli_args"})
        assert cp.replace(use_mmap=True) == recorded, c["id"]
    assert not parse_args(["-lm", "none"]).use_mmap and parse_args(["-lm", "mmap"]).use_mmap


def test_models_from_the_m_flag(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert load_model_arg("small") == presets.small()
    p = tmp_path / "m.json"
    p.write_text('{"model": {"name": "x", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_head_kv": 2, "n_ff": 128}}')
    assert load_model_arg(str(p)).n_layer == 2
    with pytest.raises(ParameterError, match="preset name"):
        load_model_arg("nonesuch")
    with pytest.raises(UnsupportedFeature, match="'mamba2' is not supported") as e:
        model_from_dict({"name": "q", "arch": "mamba2", "n_layer": 1, "n_embd": 8, "n_head": 1, "n_ff": 8})
    assert e.value.feature.startswith("arch")
    moe = {"name": "m", "arch": "llama", "n_expert": 4, "n_expert_used": 2, "n_ff_exp": 8, "n_layer": 1,
           "n_embd": 8, "n_head": 1, "n_ff": 8}
    assert model_from_dict(moe).n_layer == 1 and model_from_dict(moe).moe is not None   # experts are planned


@pytest.mark.parametrize("cp", [
    ContextParams(),
    ContextParams(flash_attn="on", n_batch=1024, n_ubatch=256, n_seq_max=4, type_k="q8_0", type_v="q4_0",
                  offload_kqv=False),
])
def test_context_flags_read_back_to_the_same_settings(cp: ContextParams) -> None:
    back = parse_args(context_flags(cp)).context_params()
    for f in ("flash_attn", "n_batch", "n_ubatch", "n_seq_max", "type_k", "type_v", "offload_kqv"):
        assert getattr(back, f) == getattr(cp, f), f
