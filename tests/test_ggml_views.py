"""Views (``ggml_view_*``, ``ggml_reshape_*``, ``ggml_permute``, ``ggml_transpose``):
flattening onto the base tensor, permute/transpose strides, contiguity, names."""

from __future__ import annotations

import numpy as np
import pytest
from ggml_oracle import np_strides

from toolkit.ggml import F16, F32, Q8_0, GGMLType, Op, Tensor, ops
from toolkit.ggml.tensor import MAX_NAME


def _np_offset(base_nbytes: int, offsets: list[int]) -> int:
    """Byte offset of a chain of numpy slices, measured from the data pointers."""
    buf = np.zeros(base_nbytes, dtype=np.uint8)
    v = buf
    for off in offsets:
        v = v[off:]
    return int(v.__array_interface__["data"][0] - buf.__array_interface__["data"][0])


def test_view_of_view_points_at_base_with_accumulated_offset() -> None:
    base = ops.new_tensor_2d(F32, 16, 8, "kv")
    v1 = ops.view_2d(base, 16, 4, base.nb[1], 2 * base.nb[1])
    v2 = ops.view_1d(v1, 8, 4 * 4)
    v3 = ops.view_1d(v2, 2, 3 * 4)
    for v in (v1, v2, v3):
        assert v.view_src is base
        assert v.is_view and v.base is base
    assert v3.view_offs == _np_offset(base.nbytes, [2 * base.nb[1], 4 * 4, 3 * 4])


@pytest.mark.parametrize(
    "make",
    [
        lambda v: ops.reshape_2d(v, 4, 4),
        lambda v: ops.permute(v, 1, 0, 2, 3),
        lambda v: ops.transpose(v),
        lambda v: ops.view_1d(v, 4, 8),
        lambda v: ops.cpy(ops.new_tensor_1d(F32, 16, "src"), v),
        lambda v: ops.set_rows(ops.reshape_2d(v, 4, 4), ops.new_tensor_2d(F32, 4, 1), ops.new_tensor_1d(
            GGMLType.I32, 1)),
    ],
    ids=["reshape", "permute", "transpose", "view", "cpy", "set_rows"],
)
def test_every_view_op_flattens(make: object) -> None:
    base = ops.new_tensor_1d(F32, 32, "base")
    v = ops.view_1d(base, 16, 16 * 4)
    out = make(v)  # type: ignore[operator]
    assert out.view_src is base
    assert out.view_offs >= v.view_offs


def test_view_past_the_base_names_bytes_and_limit() -> None:
    base = ops.new_tensor_1d(F32, 8, "small")
    with pytest.raises(ValueError, match=r"'small'.*offset 16.*needs 32 bytes.*holds 32"):
        ops.view_1d(base, 8, 16)


@pytest.mark.parametrize("t", [F32, F16], ids=lambda t: t.name)
@pytest.mark.parametrize(
    "axes", [(0, 1, 2, 3), (1, 0, 2, 3), (0, 2, 1, 3), (2, 0, 1, 3), (3, 2, 1, 0), (1, 2, 3, 0)], ids=str
)
def test_permute_matches_numpy_transpose(t: GGMLType, axes: tuple[int, int, int, int]) -> None:
    ne = (2, 3, 4, 5)
    a = ops.new_tensor_4d(t, *ne, name="a")
    p = ops.permute(a, *axes)
    # ggml: source dim i moves to position axes[i]; numpy dims run the other way (d -> 3 - d)
    perm = [0] * 4
    for i, ax in enumerate(axes):
        perm[3 - ax] = 3 - i
    arr = np.empty(tuple(reversed(ne)), dtype=np.dtype(f"V{t.type_size}"))
    r = np.transpose(arr, perm)
    assert p.ne == tuple(reversed(r.shape))
    assert p.nb == tuple(reversed(r.strides))
    assert p.is_contiguous == bool(r.flags.c_contiguous)
    assert p.op is Op.PERMUTE and p.op_params["axes"] == axes


def test_transpose_matches_numpy_swapaxes() -> None:
    a = ops.new_tensor_3d(F32, 5, 3, 2, "a")
    t = ops.transpose(a)
    r = np.swapaxes(np.empty((2, 3, 5), dtype=np.float32), -1, -2)
    assert t.ne[:3] == tuple(reversed(r.shape)) and t.nb[:3] == tuple(reversed(r.strides))
    assert not t.is_contiguous


def test_cont_makes_contiguous_copy_of_permuted() -> None:
    a = ops.new_tensor_3d(F32, 4, 3, 2, "a")
    p = ops.permute(a, 0, 2, 1, 3)
    c = ops.cont(p)
    assert c.op is Op.CONT and c.view_src is None
    assert c.ne == p.ne and c.nb == np_strides(F32, c.ne) and c.is_contiguous
    assert c.nbytes == a.nbytes


def test_contiguous_strides_match_numpy_for_quantized_rows() -> None:
    w = ops.new_tensor_3d(Q8_0, 64, 3, 2, "w")
    assert w.nb == np_strides(Q8_0, w.ne)
    assert w.is_contiguous


def test_reshape_needs_contiguous_and_same_count() -> None:
    a = ops.new_tensor_2d(F32, 4, 3, "a")
    with pytest.raises(ValueError, match=r"12 elements of a into \[5, 2\]"):
        ops.reshape_2d(a, 5, 2)
    with pytest.raises(ValueError, match="not contiguous"):
        ops.reshape_1d(ops.transpose(a), 12)


def test_view_names_follow_ggml() -> None:
    a = ops.new_tensor_2d(F32, 4, 4, "kq")
    assert ops.view_1d(a, 4, 0).name == "kq (view)"
    assert ops.reshape_1d(a, 16).name == "kq (reshaped)"
    assert ops.permute(a, 1, 0, 2, 3).name == "kq (permuted)"
    assert ops.transpose(a).name == "kq (transposed)"
    assert ops.cont(ops.transpose(a)).name == "kq (transposed) (cont)"
    b = ops.new_tensor_2d(F32, 4, 4, "k_cache")
    assert ops.cpy(a, b).name == "k_cache (copy of kq)"


def test_names_truncate_to_ggml_max_name() -> None:
    t = Tensor(F32, (1,), name="x" * 100)
    assert len(t.name) == MAX_NAME - 1
    t.set_name("y" * 70)
    assert t.name == "y" * (MAX_NAME - 1)


def test_flags() -> None:
    x = ops.new_tensor_1d(F32, 4, "x").set_input()
    y = ops.sqr(x).set_output()
    assert x.is_input and not x.is_output
    assert y.is_output and not y.is_input
