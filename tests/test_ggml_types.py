"""ggml types: block and type sizes against the gguf package's copy of ggml's table."""

from __future__ import annotations

import gguf
import pytest

from toolkit.ggml import GGMLType

ALL_TYPES = list(GGMLType)
# types newer than the gguf package's table, with their block struct in ggml-common.h:
# block_q2_0 = { ggml_half d; uint8_t qs[QK2_0 / 4]; }, QK2_0 = 64
NEWER_THAN_GGUF = {"Q2_0": (42, 64, 2 + 64 // 4)}
KNOWN_TO_GGUF = [t for t in ALL_TYPES if t.name not in NEWER_THAN_GGUF]


@pytest.mark.parametrize("t", KNOWN_TO_GGUF, ids=[t.name for t in KNOWN_TO_GGUF])
def test_block_and_type_size_match_ggml(t: GGMLType) -> None:
    q = gguf.GGMLQuantizationType(t.ggml_id)
    assert q.name == t.name
    assert (t.blck_size, t.type_size) == gguf.GGML_QUANT_SIZES[q]


def test_every_type_a_gguf_may_hold_is_known() -> None:
    """gguf-py's whole table (ggml_type_traits' copy) and the newer types, nothing else."""
    assert {t.name for t in KNOWN_TO_GGUF} == {q.name for q in gguf.GGML_QUANT_SIZES}
    for name, (gid, blck, size) in NEWER_THAN_GGUF.items():
        assert (GGMLType[name].ggml_id, GGMLType[name].blck_size, GGMLType[name].type_size) == (gid, blck, size)


def test_which_types_ggml_cpu_can_write() -> None:
    """type_traits_cpu's from_float: none for the IQ1/IQ2/IQ3 types (they cannot be a KV cache type)."""
    no = {t.name for t in ALL_TYPES if t.is_quantized and not t.cpu_from_float}
    assert no == {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"}


@pytest.mark.parametrize("t", KNOWN_TO_GGUF, ids=[t.name for t in KNOWN_TO_GGUF])
@pytest.mark.parametrize("n_blocks", [1, 3, 16])
def test_row_size_matches_gguf(t: GGMLType, n_blocks: int) -> None:
    ne0 = n_blocks * t.blck_size
    q = gguf.GGMLQuantizationType(t.ggml_id)
    assert t.row_size(ne0) == gguf.quant_shape_to_byte_shape((ne0,), q)[0]


@pytest.mark.parametrize("t", [t for t in ALL_TYPES if t.is_quantized], ids=lambda t: t.name)
def test_row_size_rejects_partial_block(t: GGMLType) -> None:
    with pytest.raises(ValueError, match=rf"{t.blck_size + 1}.*{t.name}.*{t.blck_size}"):
        t.row_size(t.blck_size + 1)


def test_llama_types_present() -> None:
    for name in ("F32", "F16", "BF16", "I32", "Q4_0", "Q8_0"):
        assert GGMLType[name].name == name


@pytest.mark.parametrize("spelling", ["q8_0", "Q8_0", GGMLType.Q8_0])
def test_parse(spelling: str | GGMLType) -> None:
    assert GGMLType.parse(spelling) is GGMLType.Q8_0


def test_parse_unknown_names_the_value_and_the_known_types() -> None:
    with pytest.raises(ValueError, match=r"'q3_z'.*f32.*q8_0"):
        GGMLType.parse("q3_z")
