"""Where llama.cpp puts layers, weights, KV cache and output buffer (numbers from the oracle's logs/README)."""

from __future__ import annotations

import pytest
from oracle_cases import cases

from toolkit.ggml.types import GGMLType
from toolkit.models import ContextParams, HParams, archs, presets
from toolkit.models.devices import DeviceSet, make_devices
from toolkit.models.hparams import WeightInfo
from toolkit.models.loader import LoadedModel, layer_devices, load_model, repack_supported


def _load(hp: HParams, cp: ContextParams, devs: DeviceSet) -> LoadedModel:
    """load_model over the architecture's weights (what setup passes it)."""
    return load_model(hp, cp, devs, archs.get(hp.arch).weights(hp),
                      tied_output_first=archs.get(hp.arch).tied_output_first)


def _small_q4_0() -> HParams:
    base = next(c["model"] for c in cases() if c["model"]["name"] == "small_f32")
    return HParams.from_dict({**base, "dtype": "q4_0", "tensor_types": {"ffn_down.weight": "f16"}})


def test_q4_0_on_cpu_repacks_matrices_and_maps_the_file_range() -> None:
    """Oracle README: small_q4_0 on CPU has 5,990,400 B of CPU_REPACK; CPU_Mapped spans 7,408,640 B with
    mmap, against 6,026,240 B of CPU with load mode none; CPU_REPACK never is a compute buffer."""
    hp = _small_q4_0()
    mm = _load(hp, ContextParams(n_gpu_layers=0), make_devices(()))
    assert mm.buffers_bytes == {"CPU_Mapped": 7408640, "CPU_REPACK": 5990400}
    nm = _load(hp, ContextParams(n_gpu_layers=0, use_mmap=False), make_devices(()))
    assert nm.buffers_bytes == {"CPU": 6026240, "CPU_REPACK": 5990400}
    assert nm.w("token_embd.weight").buffer.name == "CPU"          # GET_ROWS: no repack
    assert nm.w("blk.0.ffn_down.weight").buffer.name == "CPU"      # F16
    assert nm.w("output.weight").buffer.name == "CPU_REPACK"


def test_ngl_counts_the_output_layer() -> None:
    hp = presets.tiny()
    ds = make_devices(("rpc:1",))
    assert layer_devices(hp, ContextParams(n_gpu_layers=1), ds) == [-1, -1, 0]
    assert layer_devices(hp, ContextParams(n_gpu_layers=2), ds) == [-1, 0, 0]
    assert layer_devices(hp, ContextParams(n_gpu_layers=0), ds) == [-1, -1, -1]
    assert layer_devices(hp, ContextParams(n_gpu_layers=99), ds) == [0, 0, 0]


def test_tensor_split_covers_n_layer_plus_one() -> None:
    """-ts 1,1 on the 2-layer model: both repeating layers on the first server, the output on the second."""
    ds = make_devices(("rpc:2",))
    assert layer_devices(presets.tiny(), ContextParams(tensor_split=(1, 1)), ds) == [0, 0, 1]
    assert layer_devices(presets.small(), ContextParams(tensor_split=(3, 1)), ds) == [0, 0, 0, 0, 1]
    with pytest.raises(ValueError, match="tensor_split"):
        layer_devices(presets.small(), ContextParams(tensor_split=(1, 1, 1)), ds)


def test_split_mode_none_keeps_only_the_main_device() -> None:
    ds = make_devices(("rpc:2",), split_mode="none")
    assert [b.name for b in ds.backends] == ["RPC0[127.0.0.1:50052]", "CPU"]
    ds = make_devices(("rpc:2",), split_mode="none", main_gpu=1)
    assert [b.name for b in ds.backends] == ["RPC0[127.0.0.1:50053]", "CPU"]
    with pytest.raises(ValueError, match="main_gpu=2"):
        make_devices(("rpc:2",), split_mode="none", main_gpu=2)


def test_tied_output_duplicates_token_embd_on_the_output_device() -> None:
    hp = presets.tiny(tied=True)
    cpu = _load(hp, ContextParams(n_gpu_layers=0), make_devices(()))
    untied = _load(presets.tiny(), ContextParams(n_gpu_layers=0), make_devices(()))
    # the mapped range does not grow (same file bytes); the untied file has output.weight on top
    assert cpu.buffers_bytes["CPU_Mapped"] == untied.buffers_bytes["CPU_Mapped"] - 64 * 32000 * 4
    assert cpu.output is cpu.w("token_embd.weight") and cpu.n_tensors == 20   # same buffer type: one tensor
    off = _load(hp, ContextParams(n_gpu_layers=99), make_devices(("rpc:1",)))
    assert off.output is not None and off.output is not off.w("token_embd.weight") and off.n_tensors == 21
    assert off.output.name == "token_embd.weight"
    assert off.output.buffer.name == "RPC0[127.0.0.1:50052]"
    # same bytes as the untied model's output.weight there (oracle rpc1-tiny_f32-ngl99: 8,488,192 B)
    assert off.buffers_bytes == {"CPU_Mapped": 8192000, "RPC0[127.0.0.1:50052]": 8488192}


def test_devices_spec_errors() -> None:
    with pytest.raises(ValueError, match="unknown device 'gpu0'"):
        make_devices(("gpu0",))
    with pytest.raises(ValueError, match="budget='lots' is not accepted: expected a byte count"):
        make_devices(("sim:lots",))
    with pytest.raises(ValueError, match="expected an RPC endpoint HOST:PORT"):
        make_devices(("rpc:localhost",))
    ds = make_devices(("cuda:1G", "blas"))
    assert [b.name for b in ds.backends] == ["CUDA0", "BLAS", "CPU"]
    assert ds.cpu.buft.name == "CUDA_Host" and ds.accels[0].buft is ds.cpu_buft
    assert ds.gpus[0].buft.alloc_limit == 1 << 30


@pytest.mark.parametrize(("type_", "rows", "repacked"), [
    (GGMLType.IQ4_NL, 64, True), (GGMLType.IQ4_NL, 36, False),   # AVX2's iq4_nl_8x8_q8_0 needs rows % 8
    (GGMLType.Q4_0, 36, False), (GGMLType.MXFP4, 64, True), (GGMLType.Q8_0, 64, False)])
def test_repack_follows_ggml_repack_get_optimal_repack_type_on_avx2(type_: GGMLType, rows: int,
                                                                     repacked: bool) -> None:
    """ggml-cpu/repack.cpp at 3f545be on an AVX2 CPU (the oracle's): Q4_0, Q4_K, IQ4_NL, MXFP4 with
    ne[1] % 8 == 0; the rows % 4 forms are NEON's; Q8_0 repacks only on NEON/RISC-V."""
    assert repack_supported(WeightInfo("blk.0.ffn_up.weight", (256, rows), type_, 0)) is repacked
