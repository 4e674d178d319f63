"""ContextParams: what llama_context makes of the requested values, and the input it refuses."""

from __future__ import annotations

import pytest
from oracle_cases import cases

from toolkit.cases import cparams_from_case
from toolkit.errors import ParameterError
from toolkit.models import ContextParams, HParams, archs, presets


@pytest.mark.parametrize("c", [c for c in cases() if c["cparams"]["effective_from_log"]], ids=lambda c: c["id"])
def test_effective_values_match_llama_context_log(c: dict) -> None:
    eff = c["cparams"]["effective_from_log"]
    hp = HParams.from_dict(c["model"])
    rp = cparams_from_case(c["cparams"]).resolve(hp.n_ctx_train)
    assert (rp.n_ctx, rp.n_ctx_seq, rp.n_batch, rp.n_ubatch, rp.n_seq_max, rp.n_outputs_max,
            rp.n_outputs_max_per_seq) == (eff["n_ctx"], eff["n_ctx_seq"], eff["n_batch"], eff["n_ubatch"],
                                          eff["n_seq_max"], eff["n_outputs_max"], eff["n_outputs_max_per_seq"])
    assert rp.n_stream == c["observed"]["kv_summary"]["streams"]
    assert rp.kv_size == c["observed"]["kv_summary"]["cells"]


def test_n_ctx_is_padded_to_256_and_zero_means_train() -> None:
    assert ContextParams(n_ctx=1000).resolve(4096).n_ctx == 1024
    assert ContextParams(n_ctx=0).resolve(4096).n_ctx == 4096
    assert ContextParams(n_ctx=257, n_batch=512, n_ubatch=512).resolve(4096).n_batch == 512


@pytest.mark.parametrize(("kw", "words"), [
    ({"n_ubatch": 1024, "n_batch": 512}, ("n_ubatch=1024", "n_batch=512")),
    ({"n_gpu_layers": -1}, ("n_gpu_layers=-1", "from 0")),
    ({"flash_attn": "maybe"}, ("flash_attn='maybe'",)),
    ({"n_seq_max": 0}, ("n_seq_max=0",)),
    ({"split_mode": "rows"}, ("split_mode='rows'",)),
    ({"type_k": "q9_9"}, ("q9_9",)),
    ({"tensor_split": (1.0, -1.0)}, ("tensor_split[1]=-1.0", ">= 0.0")),
    # wrong types are refused, not coerced (a string is truthy, True is 1)
    ({"op_offload": "no"}, ("op_offload='no'", "True or False")),
    ({"kv_unified": 1}, ("kv_unified=1", "True or False")),
    ({"n_ctx": True}, ("n_ctx=True", "an integer")),
    ({"n_ctx": 4096.0}, ("n_ctx=4096.0", "an integer")),
    ({"n_ctx": "4096"}, ("n_ctx='4096'", "an integer")),
    ({"n_ctx": 2**32}, ("n_ctx=4294967296", "to 4294967295")),
    ({"n_seq_max": 257}, ("n_seq_max=257", "from 1 to 256")),
    ({"flash_attn": True}, ("flash_attn=True", "'on'")),
    ({"tensor_split": (1.0, float("nan"))}, ("tensor_split[1]=nan", "finite")),
    ({"tensor_split": "1,1"}, ("tensor_split='1,1'", "list")),
    ({"devices": "cuda"}, ("devices='cuda'", "list")),
    ({"n_outputs_max": 0}, ("n_outputs_max=0", "None")),
])
def test_bad_values_name_the_value_and_the_limit(kw: dict, words: tuple[str, ...]) -> None:
    with pytest.raises(ParameterError) as e:
        ContextParams(**kw).resolve(4096)
    for w in words:
        assert w in str(e.value)


def test_replace_rejects_unknown_fields() -> None:
    with pytest.raises(ValueError, match="n_ctxx"):
        ContextParams().replace(n_ctxx=5)


def test_cparams_from_case_reads_the_case_schema() -> None:
    c = next(c for c in cases() if c["cparams"]["tensor_split"] == "3,1")
    cp = cparams_from_case(c["cparams"])
    assert cp.tensor_split == (3.0, 1.0)
    assert cp.devices == ("rpc:127.0.0.1:50052", "rpc:127.0.0.1:50053")
    assert cp.split_mode == "layer"
    assert cparams_from_case({**c["cparams"], "cli_args": ["--no-mmap"]}).use_mmap is False


def test_hparams_from_oracle_model_dict() -> None:
    hp = HParams.from_dict(cases()[0]["model"])
    assert hp == presets.tiny()
    def n_tensors(h: HParams) -> int:
        return len(archs.get(h.arch).weights(h))

    assert n_tensors(hp) == 21 and n_tensors(presets.small()) == 39
    assert n_tensors(presets.tiny(tied=True)) == 20  # no output.weight in the file
    q = HParams.from_dict({**cases()[0]["model"], "dtype": "q4_0", "n_embd": 256, "n_head": 8,
                                "n_head_kv": 8, "n_ff": 688, "n_embd_head": 32, "n_rot": 32, "rope_dims": 32,
                                "tensor_types": {"ffn_down.weight": "f16"}})
    types = {w.name.split(".", 2)[-1]: w.type.name for w in archs.get(q.arch).weights(q) if w.layer == 0}
    assert types == {"attn_norm.weight": "F32", "attn_q.weight": "Q4_0", "attn_k.weight": "Q4_0",
                     "attn_v.weight": "Q4_0", "attn_output.weight": "Q4_0", "ffn_norm.weight": "F32",
                     "ffn_gate.weight": "Q4_0", "ffn_up.weight": "Q4_0", "ffn_down.weight": "F16"}


def test_block_quantized_rows_fall_back_to_f16() -> None:
    """Without an override, ffn_down of small (688 columns) is F16 under Q4_0, as in the oracle's small_q4_0."""
    hp = HParams.from_dict({**cases()[0]["model"], "n_embd": 256, "n_head": 8, "n_head_kv": 8, "n_ff": 688,
                                 "n_embd_head": 32, "n_rot": 32, "dtype": "q4_0"})
    assert {w.type.name for w in archs.get(hp.arch).weights(hp) if w.name.endswith("ffn_down.weight")} == {"F16"}
    assert hp == HParams.from_dict({**hp.to_dict(), "tensor_types": {}})
    bad = HParams.from_dict({**hp.to_dict(), "tensor_types": {"ffn_down.weight": "q4_0"}})
    with pytest.raises(ValueError, match="ffn_down.weight: row of 688 elements"):
        archs.get(bad.arch).weights(bad)   # what setup and the GGUF reader list


@pytest.mark.parametrize("name", ["tiny", "small", "med", "llama3_8b", "llama3_70b"])
def test_presets(name: str) -> None:
    hp = presets.get(name)
    assert hp.n_embd_head_k * hp.n_head() == hp.n_embd_head_v * hp.n_head() == hp.n_embd
    archs.get(hp.arch).weights(hp)   # every row a whole number of its type's blocks
    with pytest.raises(ValueError, match="unknown model preset"):
        presets.get("gpt5")


def test_hparams_from_gguf_metadata(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import gguf  # a hard dependency
    import numpy as np

    from toolkit.models.gguf import hparams_from_gguf

    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_context_length(4096)
    w.add_rope_dimension_count(16)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(32000)
    w.add_name("tiny_f32")
    for wi in archs.get(presets.tiny(tied=True).arch).weights(presets.tiny(tied=True)):
        w.add_tensor(wi.name, np.zeros(tuple(reversed(wi.ne)), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    import dataclasses

    assert hparams_from_gguf(path) == dataclasses.replace(presets.tiny(tied=True), name="tiny_f32")


@pytest.mark.parametrize("module", ["toolkit.models.hparams", "toolkit.models.cparams", "toolkit.models.devices",
                                    "toolkit.context"])
def test_docstring_examples(module: str) -> None:
    import doctest
    import importlib

    res = doctest.testmod(importlib.import_module(module))
    assert res.failed == 0 and res.attempted > 0
