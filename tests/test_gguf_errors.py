"""Broken GGUF files raise GGUFError naming the file, the byte offset and the field; a fuzzer checks it."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import struct
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import gguf
import numpy as np
import pytest
from fuzzcount import TRIED
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.errors import GGUFError, ToolkitError, UnsupportedFeature
from toolkit.jaxrt.gguf_io import read_gguf, write_gguf
from toolkit.models import archs, presets
from toolkit.models.gguf import hparams_from_gguf
from toolkit.models.gguf_file import open_gguf

SMALL = dataclasses.replace(presets.tiny("q8_0"), n_layer=1, n_vocab=40, name="fuzz")
TIME_LIMIT_S = 2.0


@pytest.fixture(scope="module")
def valid(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("valid") / "small.gguf"
    write_gguf(path, SMALL, seed=7)
    return path.read_bytes()


def field_boundaries(data: bytes, path: Path) -> list[int]:
    """Every offset where gguf.GGUFReader sees a part of a field or tensor info begin or end."""
    path.write_bytes(data)
    ref = gguf.GGUFReader(str(path))
    cuts = {0, 4, 8, 16, 24, ref.data_offset, len(data)}
    for fld in [*ref.fields.values(), *(t.field for t in ref.tensors)]:
        pos = fld.offset
        for part in fld.parts:
            cuts.add(pos)
            pos += int(part.nbytes)
        cuts.add(pos)
    for t in ref.tensors:
        cuts |= {t.data_offset, t.data_offset + t.n_bytes // 2, t.data_offset + t.n_bytes}
    return sorted(c for c in cuts if c <= len(data))


class TooSlow(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Fail (TooSlow) if the block runs longer than ``seconds`` (SIGALRM interrupts a Python loop)."""
    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise TooSlow(f"took more than {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def load(path: Path) -> str:
    """Open, read the hyperparameters and view every tensor: 'loaded', or the GGUFError's text."""
    with time_limit(TIME_LIMIT_S):
        try:
            f = open_gguf(path)
        except GGUFError as e:
            assert e.path == str(path) and e.field and str(e).startswith(str(path)), e
            return str(e)[len(str(path)):]
        for name in f.tensors:
            f.tensor_data(name).sum()
        try:
            read_gguf(f)
        except (GGUFError, UnsupportedFeature) as e:  # a flipped architecture name or tensor type
            assert str(e).startswith(str(path)), e
            return str(e)[len(str(path)):]
    return "loaded"


def test_truncated_at_every_field_boundary(valid: bytes, tmp_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    cuts = field_boundaries(valid, tmp_path / "ref.gguf")
    last_data = max(t.data_offset + t.nbytes for t in open_gguf(tmp_path / "ref.gguf").tensors.values())
    assert len(cuts) > 100
    for cut in cuts:
        for n in {cut, max(cut - 1, 0), cut + 1}:
            if n > len(valid):
                continue
            path.write_bytes(valid[:n])
            TRIED["GGUF truncated at a field boundary"] += 1
            out = load(path)
            if n < last_data:
                assert out != "loaded", (n, out)
                assert "truncated" in out or "past the end" in out, (n, out)
            else:
                assert out == "loaded", (n, out)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@settings(max_examples=500, deadline=None)
@given(flips=st.lists(st.tuples(st.integers(0, 2**20), st.integers(1, 255)), min_size=1, max_size=6),
       in_header=st.booleans())
def test_flipped_bytes_load_or_raise_gguf_error(valid: bytes, scratch: Path,
                                                flips: list[tuple[int, int]], in_header: bool) -> None:
    """Flip bytes (mostly in the header and the key/value and tensor tables, where they matter)."""
    data = bytearray(valid)
    header = open_gguf(_write(scratch, valid)).data_offset
    for pos, x in flips:
        data[pos % header if in_header else pos % len(data)] ^= x
    path = scratch / "flipped.gguf"
    path.write_bytes(bytes(data))
    TRIED["GGUF with flipped bytes"] += 1
    load(path)  # returns, or raises GGUFError / UnsupportedFeature; anything else fails the test


# ---- each error kind names the file, the offset and the field ---------------------------------

def raises_at(path: Path, offset: int | None, field: str, words: str) -> GGUFError:
    with pytest.raises(GGUFError) as ei:
        open_gguf(path)
    e = ei.value
    assert (e.path, e.offset, e.field) == (str(path), offset, field), str(e)
    assert str(path) in str(e) and words in str(e)
    if offset is not None:
        assert f"at byte {offset}" in str(e)
    return e


def test_missing_file(tmp_path: Path) -> None:
    raises_at(tmp_path / "nope.gguf", None, "file", "no such file")
    (tmp_path / "dir.gguf").mkdir()
    raises_at(tmp_path / "dir.gguf", None, "file", "cannot be read")


def test_empty_and_not_gguf(tmp_path: Path) -> None:
    p = tmp_path / "x.gguf"
    p.write_bytes(b"")
    raises_at(p, 0, "magic", "truncated")
    p.write_bytes(b"PK\x03\x04" + bytes(100))
    raises_at(p, 0, "magic", "not a GGUF file")


@pytest.mark.parametrize("version", [1, 4, 0x03000000])
def test_unsupported_version(tmp_path: Path, valid: bytes, version: int) -> None:
    p = tmp_path / "v.gguf"
    p.write_bytes(valid[:4] + struct.pack("<I", version) + valid[8:])
    raises_at(p, 4, "version", "big-endian" if version == 0x03000000 else f"version {version} is not supported")


def test_absurd_counts_and_lengths(tmp_path: Path, valid: bytes) -> None:
    p = tmp_path / "c.gguf"
    p.write_bytes(valid[:8] + struct.pack("<Q", 2**62) + valid[16:])
    raises_at(p, 8, "tensor_count", "cannot fit")
    p.write_bytes(valid[:16] + struct.pack("<Q", 2**40) + valid[24:])
    raises_at(p, 16, "kv_count", "cannot fit")
    # the first key's length
    p.write_bytes(valid[:24] + struct.pack("<Q", 2**63) + valid[32:])
    raises_at(p, 24, "key of key/value pair 0", "runs past the end")
    # the token array's count, then one token's length
    f = open_gguf(_write(tmp_path, valid))
    tok = f.fields["tokenizer.ggml.tokens"]
    count_at = tok.value.offset - 8
    p.write_bytes(valid[:count_at] + struct.pack("<Q", 2**61) + valid[count_at + 8:])
    raises_at(p, count_at, "tokenizer.ggml.tokens", "cannot fit")
    first = tok.value.offset
    p.write_bytes(valid[:first] + struct.pack("<Q", 2**50) + valid[first + 8:])
    raises_at(p, first, "tokenizer.ggml.tokens", "string 0 of 40 runs past the end")


def _write(tmp_path: Path, data: bytes) -> Path:
    p = tmp_path / "ok.gguf"
    p.write_bytes(data)
    return p


def test_truncated_names_the_field(tmp_path: Path, valid: bytes) -> None:
    f = open_gguf(_write(tmp_path, valid))
    p = tmp_path / "t.gguf"
    tokens = f.fields["tokenizer.ggml.tokens"].value
    # cut inside the 11th token: 40 strings of at least 8 bytes cannot fit in what is left
    eleventh = tokens.offset + sum(8 + len(f"<t{i}>") for i in range(10))
    p.write_bytes(valid[: eleventh + 9])
    raises_at(p, tokens.offset - 8, "tokenizer.ggml.tokens", "(the file is truncated")
    t = f.tensors["blk.0.ffn_down.weight"]
    p.write_bytes(valid[: t.data_offset + 10])
    raises_at(p, t.info_offset, "blk.0.ffn_down.weight", "runs past the end of the file")


def test_bad_tensor_info(tmp_path: Path, valid: bytes) -> None:
    f = open_gguf(_write(tmp_path, valid))
    t = f.tensors["output_norm.weight"]
    n_dims_at = t.info_offset + 8 + len(t.name)
    p = tmp_path / "b.gguf"
    p.write_bytes(valid[:n_dims_at] + struct.pack("<I", 9) + valid[n_dims_at + 4:])
    raises_at(p, n_dims_at, "output_norm.weight: n_dims", "GGML_MAX_DIMS")
    type_at = n_dims_at + 4 + 8 * len(t.ne)
    p.write_bytes(valid[:type_at] + struct.pack("<I", 99) + valid[type_at + 4:])
    raises_at(p, type_at, "output_norm.weight: type", "tensor type 99")


def write_llama(path: Path, *, arch: str = "llama", block_count: object = 1, embd: int = 64) -> None:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_string("general.name", "m")
    if isinstance(block_count, str):
        w.add_string(f"{arch}.block_count", block_count)
    else:
        w.add_uint32(f"{arch}.block_count", int(block_count))  # type: ignore[call-overload]
    w.add_embedding_length(embd)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_vocab_size(40)
    hp = dataclasses.replace(SMALL, dtype="f32")
    for wi in archs.get(hp.arch).weights(hp):
        w.add_tensor(wi.name, np.zeros(tuple(reversed(wi.ne)), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_wrong_architecture_lists_the_supported_ones(tmp_path: Path) -> None:
    p = tmp_path / "q.gguf"
    write_llama(p, arch="mamba")
    with pytest.raises(UnsupportedFeature) as ei:
        hparams_from_gguf(p)
    assert str(p) in str(ei.value) and "'mamba'" in str(ei.value)
    assert f"supported: {', '.join(archs.names())}" in str(ei.value) and "llama" in archs.names()


def test_block_count_beyond_the_tensor_table(tmp_path: Path) -> None:
    p = tmp_path / "n.gguf"
    write_llama(p, block_count=2**31)
    with pytest.raises(GGUFError) as ei:
        hparams_from_gguf(p)
    assert ei.value.field == "llama.block_count" and "has 12 tensors" in str(ei.value)


def test_wrong_key_type_and_shape(tmp_path: Path) -> None:
    p = tmp_path / "k.gguf"
    write_llama(p, block_count="one")
    f = open_gguf(p)
    with pytest.raises(GGUFError) as ei:
        hparams_from_gguf(f)
    e = ei.value
    assert (e.field, e.offset) == ("llama.block_count", f.fields["llama.block_count"].offset)
    assert "expected an integer, found STRING" in str(e)
    write_llama(p, embd=32)  # the tensors were written for n_embd 64
    with pytest.raises(GGUFError) as ei:
        hparams_from_gguf(p)
    assert ei.value.field == "token_embd.weight" and "wrong shape" in str(ei.value)
    assert ei.value.offset == open_gguf(p).tensors["token_embd.weight"].info_offset


def test_context_and_toolkit_run_report_the_gguf_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from toolkit.context import Context
    from toolkit.jaxrt import cli

    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(5))
    with pytest.raises(GGUFError, match="tensor_count"):
        Context(str(p))
    assert cli.main(["--gguf", str(p), "--tokens", "1"]) == 2
    err = capsys.readouterr().err
    assert str(p) in err and "at byte 8" in err and "tensor_count" in err
    assert isinstance(GGUFError("x", "y"), ToolkitError)


def test_a_duplicate_empty_tensor_name_is_named_by_its_position(tmp_path: Path) -> None:
    """Two tensor infos whose names are both empty (a flipped length byte makes them): the error names
    the second info by its position, as an empty key is named by its position."""
    info = struct.pack("<Q", 0) + struct.pack("<IQ", 1, 32) + struct.pack("<IQ", 0, 0)  # "", [32], F32, offset 0
    p = tmp_path / "dup.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2, 0) + info + info)
    raises_at(p, 24 + len(info), "name of tensor info 1", "duplicate tensor name")
