"""The GGUF reader (toolkit.models.gguf_file) against gguf.GGUFReader, and one reader for planning and runtime.

Every file is written here by the ``gguf`` package's GGUFWriter (through toolkit's write_gguf or directly).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from toolkit.jaxrt.gguf_io import read_gguf, write_gguf
from toolkit.models import archs, presets
from toolkit.models.gguf import hparams_from_gguf
from toolkit.models.gguf_file import GGUFArray, GGUFValueType, open_gguf
from toolkit.models.hparams import HParams

LLAMA3_VOCAB = 128_256


def assert_same_as_gguf_reader(path: Path) -> None:
    """Every key, value type, value and tensor info (name, shape, type, offset, data) agree."""
    ref = gguf.GGUFReader(str(path))
    f = open_gguf(path)
    keys = [k for k in ref.fields if not k.startswith("GGUF.")]
    assert list(f.fields) == keys
    assert f.version == int(ref.fields["GGUF.version"].parts[0][0])
    for k in keys:
        rf, ours = ref.fields[k], f.fields[k]
        assert ours.offset == rf.offset, k
        assert int(ours.type) == int(rf.types[0]), k
        if ours.type is GGUFValueType.ARRAY:
            arr = ours.value
            assert isinstance(arr, GGUFArray)
            assert int(arr.type) == int(rf.types[1]), k
            assert len(arr) == len(rf.data), k
            if arr.type is GGUFValueType.STRING:
                assert arr.strings() == rf.contents(), k
            else:
                got = arr.numpy()
                assert np.array_equal(got, np.asarray(rf.contents(), dtype=got.dtype)), k
        elif ours.type is GGUFValueType.FLOAT32:
            # the reader's float32 rule: the same float32 bits, as the shortest decimal
            assert np.float32(ours.value).tobytes() == rf.parts[-1].tobytes(), k
        else:
            assert ours.value == rf.contents(), k
    assert f.alignment == ref.alignment and f.data_offset == ref.data_offset
    assert list(f.tensors) == [t.name for t in ref.tensors]
    for rt in ref.tensors:
        ti = f.tensors[rt.name]
        assert ti.ne == tuple(int(x) for x in rt.shape), rt.name
        assert ti.type.ggml_id == int(rt.tensor_type), rt.name
        assert ti.offset == int(rt.field.parts[-1][0]) and ti.data_offset == rt.data_offset, rt.name
        assert ti.nbytes == rt.n_bytes and ti.n_elements == rt.n_elements, rt.name
        data = f.tensor_data(rt.name)
        assert data.dtype == rt.data.dtype and data.shape == rt.data.shape, rt.name
        assert np.array_equal(data, rt.data), rt.name


@pytest.fixture(scope="module")
def typed_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for dt in ("f32", "f16", "q8_0", "q4_0"):
        hp = dataclasses.replace(presets.tiny(dt), n_vocab=512, name=f"tiny_{dt}")
        path = tmp_path_factory.mktemp("gguf") / f"tiny_{dt}.gguf"
        write_gguf(path, hp, seed=3)
        out[dt] = path
    return out


@pytest.mark.parametrize("dt", ["f32", "f16", "q8_0", "q4_0"])
def test_reader_agrees_with_gguf_reader(typed_files: dict[str, Path], dt: str) -> None:
    assert_same_as_gguf_reader(typed_files[dt])
    f = open_gguf(typed_files[dt])
    assert {t.type.name for t in f.tensors.values()} == ({"F32"} if dt == "f32" else {"F32", dt.upper()})


def write_llama3_vocab_file(path: Path, n_merges: int) -> None:
    """A one-layer llama GGUF with Llama-3's tokenizer sizes: 128,256 tokens, scores, token types, merges."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("vocab-test")
    w.add_block_count(1)
    w.add_context_length(8192)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(500000.0)
    w.add_custom_alignment(64)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list([f"\u0120tok{i}\u00e9" for i in range(LLAMA3_VOCAB)])
    w.add_token_scores([float(-i) / 7 for i in range(LLAMA3_VOCAB)])
    w.add_token_types([1 + (i % 3 == 0) * 2 for i in range(LLAMA3_VOCAB)])
    w.add_token_merges([f"t{i} k{i % 97}" for i in range(n_merges)])
    w.add_bos_token_id(128000)
    w.add_add_bos_token(True)
    hp = HParams(n_layer=1, n_embd=32, n_head=2, n_head_kv=1, n_ff=64, n_vocab=LLAMA3_VOCAB, tied=True)
    for wi in archs.get(hp.arch).weights(hp):
        w.add_tensor(wi.name, np.full(tuple(reversed(wi.ne)), 0.5, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.slow
def test_reader_agrees_with_gguf_reader_on_a_llama3_sized_vocabulary(tmp_path: Path) -> None:
    path = tmp_path / "vocab.gguf"
    write_llama3_vocab_file(path, n_merges=20_000)
    assert_same_as_gguf_reader(path)
    f = open_gguf(path)
    tokens = f.get_array("tokenizer.ggml.tokens")
    assert tokens is not None and len(tokens) == LLAMA3_VOCAB and tokens.type is GGUFValueType.STRING
    assert f.alignment == 64 and f.data_offset % 64 == 0
    assert f.get("tokenizer.ggml.bos_token_id") == 128000 and f.get("tokenizer.ggml.add_bos_token") is True
    hp = hparams_from_gguf(f)
    assert (hp.n_vocab, hp.rope_freq_base, hp.eps, hp.tied) == (LLAMA3_VOCAB, 500000.0, 1e-5, True)


@pytest.mark.parametrize("dt", ["f32", "f16", "q8_0", "q4_0"])
def test_planning_and_runtime_read_the_same_hparams(tmp_path: Path, dt: str) -> None:
    written = HParams(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_vocab=256, n_ctx_train=2048,
                           rope_freq_base=500000.0, eps=1.2345678e-6, dtype=dt, name=f"m_{dt}")
    path = tmp_path / "m.gguf"
    write_gguf(path, written, seed=1)
    planned = hparams_from_gguf(path)
    run = read_gguf(path).hparams
    assert planned == run == written
    # a FLOAT32 key comes back as the shortest decimal of its float32, in planning and runtime alike
    assert planned.eps == run.eps == 1.2345678e-06 and planned.rope_freq_base == 500000.0


def test_context_from_path_and_toolkit_run_agree(tmp_path: Path) -> None:
    from toolkit.context import Context

    path = tmp_path / "t.gguf"
    write_gguf(path, dataclasses.replace(presets.tiny(), n_vocab=300), seed=2)
    assert Context(str(path)).hparams == read_gguf(path).hparams
    assert read_gguf(path).hparams.eps == 1e-5


def test_lazy_arrays_and_metadata_accessors(typed_files: dict[str, Path]) -> None:
    f = open_gguf(typed_files["f32"])
    tokens = f.get("tokenizer.ggml.tokens")
    assert isinstance(tokens, GGUFArray) and len(tokens) == 512
    assert tokens.strings()[:2] == ["<t0>", "<t1>"]
    types = f.get_array("tokenizer.ggml.token_type")
    assert types is not None and types.numpy().tolist() == [1] * 512
    scores = f.get_array("tokenizer.ggml.scores")
    assert scores is not None and scores.tolist() == [0.0] * 512
    with pytest.raises(TypeError):
        tokens.numpy()
    assert f.architecture == "llama" and f.arch_key("attention.sliding_window") == "llama.attention.sliding_window"
    assert f.get_int(f.arch_key("attention.sliding_window")) is None
    assert f.get_int("llama.block_count") == 2 and f.get_float("llama.attention.layer_norm_rms_epsilon") == 1e-5
    data: Any = f.tensor_data("blk.0.attn_q.weight")
    assert data.shape == (64, 64) and not data.flags.writeable


def test_docstring_examples() -> None:
    import doctest

    import toolkit.models.gguf_file as mod

    res = doctest.testmod(mod)
    assert res.attempted >= 5 and res.failed == 0


def test_f32_value_prints_numpys_shortest_float32_digits() -> None:
    """f32_value (metadata scalars, no numpy) gives the value of ``str(numpy.float32(x))`` (what
    GGUFArray.tolist uses for whole arrays): every power of two and its neighbours (the uneven rounding
    interval), exact ties, 100,000 random float32 bit patterns, overflow and the special values."""
    import math
    import random
    import struct
    import warnings

    from toolkit.models.gguf_file import f32_value

    rng = random.Random(0)
    vals = [0.0, -0.0, 1e-6, 1e-5, 0.1, 1e6, 5e5, 150000.0, 3.4028235e38, 1e39, -1e39, math.inf, -math.inf]
    for k in range(-149, 128):
        vals += [2.0 ** k, -(2.0 ** k), 2.0 ** k * 1.0000001, 2.0 ** k * 0.9999999]
    vals += [rng.randint(0, 2 ** 26) / 4 for _ in range(20000)]          # many exact ties at the last digit
    for _ in range(100000):
        v = struct.unpack("<f", struct.pack("<I", rng.getrandbits(32)))[0]
        if math.isfinite(v):
            vals.append(v)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # numpy warns on the float32 overflow
        want = [float(str(np.float32(v))) for v in vals]
    got = [f32_value(v) for v in vals]
    bad = [(v, g, w) for v, g, w in zip(vals, got, want) if g != w or math.copysign(1, g) != math.copysign(1, w)]
    assert not bad, bad[:5]
    assert math.isnan(f32_value(math.nan))
