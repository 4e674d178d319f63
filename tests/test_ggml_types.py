"""ggml types: block and type sizes against the gguf package's copy of ggml's table."""

from __future__ import annotations

import gguf
import pytest

from toolkit.ggml import GGMLType

ALL_TYPES = list(GGMLType)


@pytest.mark.parametrize("t", ALL_TYPES, ids=[t.name for t in ALL_TYPES])
def test_block_and_type_size_match_ggml(t: GGMLType) -> None:
    q = gguf.GGMLQuantizationType(t.ggml_id)
    assert q.name == t.name
    assert (t.blck_size, t.type_size) == gguf.GGML_QUANT_SIZES[q]


@pytest.mark.parametrize("t", ALL_TYPES, ids=[t.name for t in ALL_TYPES])
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
