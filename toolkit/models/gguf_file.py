"""GGUF files read with ``mmap`` and ``struct``: header, key/value table, tensor infos, tensor data views.

The layout is the one ``gguf_init_from_file`` (ggml/src/gguf.cpp) reads: magic ``GGUF``, version,
tensor count, key/value count, the key/value pairs, the tensor infos (name, n_dims, ne, type,
offset), padding to ``general.alignment`` and the data section. Nothing is decoded that is not
asked for: a string array (the tokenizer's tokens and merges) is walked length by length to find
its end, counted, and kept as a lazy :class:`GGUFArray`; tensor data are views of the mapped file.

Every malformed file raises :class:`~toolkit.errors.GGUFError` naming the file, the byte offset
and the field being read; counts and lengths are checked against the file size before they are
used, so a corrupt count can neither hang the reader nor make it allocate.

A ``FLOAT32`` value is returned as the shortest decimal that reads back as the same float32
(``1e-05``, not ``9.999999747378752e-06``): planning and the runtime see the same Python float,
and converting it to float32, as llama.cpp's ``gguf_get_val_f32`` and the kernels do, gives the
stored bits back exactly.

>>> import tempfile, pathlib
>>> from toolkit.errors import GGUFError
>>> p = pathlib.Path(tempfile.mkdtemp()) / "empty.gguf"
>>> _ = p.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(16))
>>> f = open_gguf(p)
>>> f.version, len(f.fields), len(f.tensors), f.get("general.architecture", "none")
(3, 0, 0, 'none')
>>> _ = p.write_bytes(b"GGML" + bytes(20))
>>> try:
...     open_gguf(p)
... except GGUFError as e:
...     print(e.offset, e.field)
0 magic
"""

from __future__ import annotations

import enum
import math
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolkit.errors import GGUFError
from toolkit.ggml.types import GGMLType, to_f32

if TYPE_CHECKING:
    import numpy as np

GGUF_MAGIC = b"GGUF"
# gguf_init_from_file refuses GGUFv1 and anything newer than GGUF_VERSION (3)
GGUF_SUPPORTED_VERSIONS = (2, 3)
GGUF_DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4


class GGUFValueType(enum.IntEnum):
    """``enum gguf_type``: the type tag of a key/value pair or of an array's elements."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


_T = GGUFValueType
# scalar type -> (struct format, little-endian numpy dtype); numpy is imported only to view arrays and tensor
# data, never to read the metadata (planning reads only that)
_SCALARS: dict[GGUFValueType, tuple[struct.Struct, str]] = {
    _T.UINT8: (struct.Struct("<B"), "<u1"), _T.INT8: (struct.Struct("<b"), "<i1"),
    _T.UINT16: (struct.Struct("<H"), "<u2"), _T.INT16: (struct.Struct("<h"), "<i2"),
    _T.UINT32: (struct.Struct("<I"), "<u4"), _T.INT32: (struct.Struct("<i"), "<i4"),
    _T.FLOAT32: (struct.Struct("<f"), "<f4"), _T.BOOL: (struct.Struct("<?"), "?"),
    _T.UINT64: (struct.Struct("<Q"), "<u8"), _T.INT64: (struct.Struct("<q"), "<i8"),
    _T.FLOAT64: (struct.Struct("<d"), "<f8"),
}
INT_TYPES = frozenset({_T.UINT8, _T.INT8, _T.UINT16, _T.INT16, _T.UINT32, _T.INT32, _T.UINT64, _T.INT64})
FLOAT_TYPES = frozenset({_T.FLOAT32, _T.FLOAT64})
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_TYPES_BY_ID = {t.ggml_id: t for t in GGMLType}
# ggml types whose data numpy holds as values; every other type is kept as raw bytes (blocks)
_VALUE_DTYPES: dict[GGMLType, str] = {
    GGMLType.F32: "<f4", GGMLType.F16: "<f2", GGMLType.F64: "<f8", GGMLType.I8: "<i1", GGMLType.I16: "<i2",
    GGMLType.I32: "<i4", GGMLType.I64: "<i8",
}


def f32_value(x: float) -> float:
    """The shortest decimal that reads back as the same float32 (the rule for every FLOAT32 value): the
    digits ``str(numpy.float32(x))`` prints (Dragon4's shortest unique form, ties to even), found without
    numpy by rounding to 1, 2, … significant digits, with the neighbours of each rounding for the
    uneven rounding interval at a power of two. :meth:`GGUFArray.tolist` gets whole arrays from numpy;
    ``tests/test_gguf_reader.py`` checks that both agree."""
    f = to_f32(x)
    if f == 0.0 or f != f or math.isinf(f):
        return f
    for p in range(9):
        s = f"{f:.{p}e}"
        v = float(s)
        if to_f32(v) == f:
            return v
        digits, exp = s.split("e")
        m, e = int(digits.replace(".", "")), int(exp) - p
        for c in (m - 1, m + 1) if m > 0 else (m + 1, m - 1):
            v = float(f"{c}e{e}")
            if to_f32(v) == f:
                return v
    return float(f)


@dataclass(frozen=True, eq=False)
class GGUFArray:
    """An array value, located but not decoded: element type, count and the byte offset of its
    first element. ``numpy()`` gives a view of numeric elements; ``strings()`` decodes strings."""

    file: GGUFFile
    type: GGUFValueType
    count: int
    offset: int
    nbytes: int

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"GGUFArray({self.type.name}, count={self.count}, offset={self.offset})"

    def numpy(self) -> np.ndarray:
        """The elements as a read-only view of the mapped file (numeric arrays only)."""
        import numpy as np
        if self.type is GGUFValueType.STRING:
            raise TypeError("a string array has no numpy view; use strings()")
        return np.frombuffer(self.file.buffer, np.dtype(_SCALARS[self.type][1]), self.count, self.offset)

    def strings(self) -> list[str]:
        """The elements of a string array, decoded (this materialises every string)."""
        if self.type is not GGUFValueType.STRING:
            raise TypeError(f"a {self.type.name} array has no strings; use numpy()")
        buf, pos, out = self.file.buffer, self.offset, []
        for _ in range(self.count):
            n = _U64.unpack_from(buf, pos)[0]
            out.append(bytes(buf[pos + 8: pos + 8 + n]).decode("utf-8", errors="replace"))
            pos += 8 + n
        return out

    def tolist(self) -> list[Any]:
        """The elements as Python values (FLOAT32 ones as :func:`f32_value` reads them, by numpy's
        ``str`` of each: a vocabulary's scores are many)."""
        if self.type is GGUFValueType.STRING:
            return self.strings()
        if self.type is GGUFValueType.FLOAT32:
            return [float(str(v)) for v in self.numpy()]
        st = _SCALARS[self.type][0]
        return list(struct.unpack_from(f"<{self.count}{st.format[-1]}", self.file.buffer, self.offset))


@dataclass(frozen=True)
class GGUFField:
    """One key/value pair: its key, type tag, value (a Python scalar or a :class:`GGUFArray`) and
    the byte offset of the pair in the file."""

    key: str
    type: GGUFValueType
    value: Any
    offset: int


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor info (``gguf_tensor_info``): name, ggml shape ``ne``, type, the offset relative to
    the data section as stored, the absolute offset of its data and its size in bytes."""

    name: str
    ne: tuple[int, ...]
    type: GGMLType
    offset: int
    data_offset: int
    nbytes: int
    info_offset: int
    file_index: int = 0   # the shard holding the data (llama_tensor_weight::idx); 0 for a single file

    @property
    def n_elements(self) -> int:
        n = 1
        for x in self.ne:
            n *= x
        return n


class _Cursor:
    """Bounds-checked little-endian reads from the mapped file; every failure is a GGUFError."""

    def __init__(self, path: str, buf: Any, size: int) -> None:
        self.path, self.buf, self.size, self.pos = path, buf, size, 0

    def fail(self, message: str, field: str, offset: int | None = None) -> GGUFError:
        return GGUFError(self.path, message, self.pos if offset is None else offset, field)

    def need(self, n: int, field: str) -> None:
        if self.pos + n > self.size:
            raise self.fail(f"file is truncated: {n} byte(s) needed, {max(self.size - self.pos, 0)} left "
                            f"of {self.size}", field)

    def u32(self, field: str) -> int:
        self.need(4, field)
        v: int = _U32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return v

    def u64(self, field: str) -> int:
        self.need(8, field)
        v: int = _U64.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return v

    def count(self, field: str, min_size: int) -> int:
        """A u64 count of items of at least ``min_size`` bytes each, checked against what is left."""
        at = self.pos
        n = self.u64(field)
        if n * min_size > self.size - self.pos:
            raise self.fail(f"count {n} cannot fit in the {self.size - self.pos} byte(s) left of {self.size} "
                            "(the file is truncated or the count is corrupt)", field, at)
        return n

    def raw_string(self, field: str) -> bytes:
        at = self.pos
        n = self.u64(field)
        if n > self.size - self.pos:
            raise self.fail(f"string length {n} runs past the end of the file ({self.size} bytes)", field, at)
        b = bytes(self.buf[self.pos: self.pos + n])
        self.pos += n
        return b

    def string(self, field: str, *, strict: bool = False) -> str:
        at = self.pos
        b = self.raw_string(field)
        try:
            return b.decode("utf-8", errors="strict" if strict else "replace")
        except UnicodeDecodeError as e:
            raise self.fail(f"not valid UTF-8 ({e.reason} at byte {e.start} of the string)", field, at) from None

    def skip_strings(self, n: int, field: str) -> None:
        """Walk n strings by their lengths without building them (the vocabulary's fast path)."""
        buf, pos, size, unpack = self.buf, self.pos, self.size, _U64.unpack_from
        for i in range(n):
            if pos + 8 > size:
                raise self.fail(f"file is truncated in string {i} of {n}", field, pos)
            start = pos
            pos += 8 + unpack(buf, pos)[0]
            if pos > size:
                raise self.fail(f"string {i} of {n} runs past the end of the file ({size} bytes)", field, start)
        self.pos = pos


class GGUFFile:
    """A parsed GGUF file: ``fields`` (key -> :class:`GGUFField`, file order), ``tensors``
    (name -> :class:`GGUFTensorInfo`, file order), ``version``, ``alignment``, ``data_offset``.

    The file stays mapped while this object or a view of its data lives.
    """

    def __init__(self, path: str, buffer: Any, size: int) -> None:
        self.path = path
        self.buffer = buffer
        self.size = size
        self.version = 0
        self.alignment = GGUF_DEFAULT_ALIGNMENT
        self.data_offset = 0
        self.fields: dict[str, GGUFField] = {}
        self.tensors: dict[str, GGUFTensorInfo] = {}
        # the files of a split model (this one first); every tensor's file_index points into it
        self.shards: list[GGUFFile] = [self]

    def __repr__(self) -> str:
        return (f"GGUFFile({self.path!r}, v{self.version}, {len(self.fields)} keys, "
                f"{len(self.tensors)} tensors)")

    def __contains__(self, key: object) -> bool:
        return key in self.fields

    def __iter__(self) -> Iterator[str]:
        return iter(self.fields)

    # ---- metadata ---------------------------------------------------------------------------
    @property
    def architecture(self) -> str | None:
        """``general.architecture`` (None when the file has none)."""
        v = self.get("general.architecture")
        return v if isinstance(v, str) else None

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key``: a Python scalar, or a lazy :class:`GGUFArray`; ``default`` if absent."""
        f = self.fields.get(key)
        return default if f is None else f.value

    def arch_key(self, name: str) -> str:
        """``{general.architecture}.{name}`` (e.g. ``llama.block_count``)."""
        return f"{self.architecture}.{name}"

    def _typed(self, key: str, default: Any, kinds: frozenset[GGUFValueType], what: str) -> Any:
        f = self.fields.get(key)
        if f is None:
            return default
        if f.type not in kinds:
            raise GGUFError(self.path, f"expected {what}, found {f.type.name}", f.offset, key)
        return f.value

    def get_int(self, key: str, default: int | None = None) -> int | None:
        """An integer value (any GGUF integer type); GGUFError if the key holds something else."""
        return self._typed(key, default, INT_TYPES, "an integer")  # type: ignore[no-any-return]

    def get_float(self, key: str, default: float | None = None) -> float | None:
        """A float value (FLOAT32 by the shortest-decimal rule, FLOAT64, or an integer)."""
        v = self._typed(key, default, FLOAT_TYPES | INT_TYPES, "a number")
        return None if v is None else float(v)

    def get_str(self, key: str, default: str | None = None) -> str | None:
        return self._typed(key, default, frozenset({GGUFValueType.STRING}), "a string")  # type: ignore[no-any-return]

    def get_array(self, key: str) -> GGUFArray | None:
        return self._typed(key, None, frozenset({GGUFValueType.ARRAY}), "an array")  # type: ignore[no-any-return]

    def require_int(self, key: str) -> int:
        v = self.get_int(key)
        if v is None:
            raise GGUFError(self.path, "required key is missing", None, key)
        return v

    # ---- tensors ----------------------------------------------------------------------------
    def tensor_path(self, name: str) -> str:
        """The path of the file (shard) holding tensor ``name``'s data."""
        return self.shards[self.tensors[name].file_index].path

    def tensor_data(self, name: str) -> np.ndarray:
        """A read-only view of a tensor's data in ``gguf.GGUFReader``'s layout: values, shaped
        ``reversed(ne)``, for float and integer types; raw bytes, shaped ``(*reversed(ne)[:-1],
        row bytes)``, for bf16 and block-quantized types."""
        import numpy as np
        t = self.tensors[name]
        buf = self.shards[t.file_index].buffer
        shape = tuple(reversed(t.ne))
        dt = _VALUE_DTYPES.get(t.type)
        if dt is not None:
            return np.frombuffer(buf, np.dtype(dt), t.n_elements, t.data_offset).reshape(shape)
        arr = np.frombuffer(buf, np.uint8, t.nbytes, t.data_offset)
        if not shape:
            return arr
        return arr.reshape((*shape[:-1], shape[-1] // t.type.blck_size * t.type.type_size))


def _value(cur: _Cursor, f: GGUFFile, vtype: int, field: str, at: int) -> tuple[GGUFValueType, Any]:
    try:
        t = GGUFValueType(vtype)
    except ValueError:
        raise cur.fail(f"unknown value type {vtype} (known: 0..12)", field, at) from None
    if t is GGUFValueType.STRING:
        return t, cur.string(field)
    if t is GGUFValueType.ARRAY:
        etype_at = cur.pos
        etype = cur.u32(field)
        try:
            et = GGUFValueType(etype)
        except ValueError:
            raise cur.fail(f"unknown array element type {etype} (known: 0..12)", field, etype_at) from None
        if et is GGUFValueType.ARRAY:
            raise cur.fail("arrays of arrays are not supported (gguf_init_from_file refuses them)", field, etype_at)
        if et is GGUFValueType.STRING:
            n = cur.count(field, 8)
            start = cur.pos
            cur.skip_strings(n, field)
        else:
            n = cur.count(field, _SCALARS[et][0].size)
            start = cur.pos
            cur.pos += n * _SCALARS[et][0].size
        return t, GGUFArray(f, et, n, start, cur.pos - start)
    st = _SCALARS[t][0]
    cur.need(st.size, field)
    v = st.unpack_from(cur.buf, cur.pos)[0]
    cur.pos += st.size
    return t, f32_value(v) if t is GGUFValueType.FLOAT32 else v


def _open(path: str) -> tuple[Any, int]:
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                return b"", 0
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ), size
    except FileNotFoundError:
        raise GGUFError(path, "no such file", None, "file") from None
    except OSError as e:
        raise GGUFError(path, f"cannot be read ({e.strerror or e})", None, "file") from None


def open_gguf(path: str | Path) -> GGUFFile:
    """Parse a GGUF file's header, key/value pairs and tensor infos (tensor data stay mapped, unread);
    for the first file of a split model, every shard's tensor infos too (:func:`load_splits`)."""
    return load_splits(open_gguf_file(path))


def open_gguf_file(path: str | Path) -> GGUFFile:
    """Parse one GGUF file (a shard of a split model stays one shard)."""
    p = os.fspath(path)
    buf, size = _open(p)
    f = GGUFFile(p, buf, size)
    cur = _Cursor(p, buf, size)
    cur.need(4, "magic")
    magic = bytes(buf[0:4])
    if magic != GGUF_MAGIC:
        raise cur.fail(f"not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})", "magic")
    cur.pos = 4
    version = cur.u32("version")
    if version & 0xFFFF == 0 and version:
        raise cur.fail(f"big-endian GGUF (version read as {version:#x}) is not supported", "version", 4)
    if version not in GGUF_SUPPORTED_VERSIONS:
        raise cur.fail(f"version {version} is not supported (supported: "
                       f"{', '.join(map(str, GGUF_SUPPORTED_VERSIONS))})", "version", 4)
    f.version = version
    # smallest tensor info: empty name (8), n_dims (4), type (4), offset (8)
    n_tensors = cur.count("tensor_count", 24)
    # smallest key/value pair: empty key (8), type (4), one byte of value
    n_kv = cur.count("kv_count", 13)
    for i in range(n_kv):
        at = cur.pos
        key = cur.string(f"key of key/value pair {i}", strict=True)
        field = key or f"key/value pair {i} (empty key)"  # an error must name what it was reading
        vtype = cur.u32(field)
        t, v = _value(cur, f, vtype, field, at)
        if key in f.fields:
            raise cur.fail(f"duplicate key (first at byte {f.fields[key].offset})", field, at)
        f.fields[key] = GGUFField(key, t, v, at)
    align = f.fields.get("general.alignment")
    if align is not None:
        if align.type is not GGUFValueType.UINT32:
            raise GGUFError(p, f"expected UINT32, found {align.type.name}", align.offset, "general.alignment")
        a = int(align.value)
        if a == 0 or a & (a - 1):
            raise GGUFError(p, f"alignment {a} is not a non-zero power of two", align.offset, "general.alignment")
        f.alignment = a
    infos: list[tuple[str, tuple[int, ...], GGMLType, int, int]] = []
    for i in range(n_tensors):
        at = cur.pos
        name = cur.string(f"name of tensor info {i}", strict=True)
        n_dims_at = cur.pos
        n_dims = cur.u32(f"{name}: n_dims")
        if n_dims > GGML_MAX_DIMS:
            raise cur.fail(f"n_dims {n_dims} exceeds GGML_MAX_DIMS ({GGML_MAX_DIMS})", f"{name}: n_dims", n_dims_at)
        ne = tuple(cur.u64(f"{name}: ne[{d}]") for d in range(n_dims))
        type_at = cur.pos
        tid = cur.u32(f"{name}: type")
        gt = _TYPES_BY_ID.get(tid)
        if gt is None:
            known = ", ".join(f"{t.name} ({t.ggml_id})" for t in GGMLType)
            raise cur.fail(f"tensor type {tid} is not one the toolkit knows ({known})", f"{name}: type", type_at)
        off = cur.u64(f"{name}: offset")
        if name in f.tensors or any(x[0] == name for x in infos):
            raise GGUFError(p, "duplicate tensor name", at, name or f"name of tensor info {i}")
        infos.append((name, ne, gt, off, at))
    f.data_offset = -(-cur.pos // f.alignment) * f.alignment
    for name, ne, gt, off, at in infos:
        n = 1
        for x in ne:
            n *= x
        if ne and ne[0] % gt.blck_size:
            raise GGUFError(p, f"ne[0]={ne[0]} is not a multiple of {gt.name}'s block size {gt.blck_size}",
                            at, name)
        nbytes = n * gt.type_size // gt.blck_size
        start = f.data_offset + off
        if start + nbytes > size:
            raise GGUFError(p, f"data ({nbytes} bytes at byte {start}) runs past the end of the file "
                            f"({size} bytes): the file is truncated", at, name)
        f.tensors[name] = GGUFTensorInfo(name, ne, gt, off, start, nbytes, at)
    return f


# llama_model_loader: LLM_KV_SPLIT_NO, LLM_KV_SPLIT_COUNT, LLM_KV_SPLIT_TENSORS_COUNT
SPLIT_NO = "split.no"
SPLIT_COUNT = "split.count"
SPLIT_TENSORS_COUNT = "split.tensors.count"


def split_path(prefix: str, split_no: int, split_count: int) -> str:
    """``llama_split_path``: the path of shard ``split_no`` (0-based) of ``split_count``."""
    return f"{prefix}-{split_no + 1:05d}-of-{split_count:05d}.gguf"


def split_prefix(path: str, split_no: int, split_count: int) -> str | None:
    """``llama_split_prefix``: the path without its ``-NNNNN-of-NNNNN.gguf`` postfix, or None when the
    path does not end with the postfix of shard ``split_no`` of ``split_count`` (or is nothing but it)."""
    postfix = f"-{split_no + 1:05d}-of-{split_count:05d}.gguf"
    if len(path) <= len(postfix) or not path.endswith(postfix):
        return None
    return path[: -len(postfix)]


def _split_int(f: GGUFFile, key: str) -> int | None:
    """A split key (``uint16`` in every file ``llama-gguf-split`` writes; any integer type is taken)."""
    return f.get_int(key)


def load_splits(first: GGUFFile) -> GGUFFile:
    """``llama_model_loader``'s split loading: when the file's ``split.count`` is above 1 it must be
    the first shard (``split.no`` 0: "model must be loaded with the first split"); the other shards'
    paths come from ``llama_split_prefix`` / ``llama_split_path`` (``NAME-00002-of-00003.gguf``).
    Each shard must exist and parse, and hold ``split.no`` equal to its index; no tensor name may be
    in two shards; the tensors of all shards together must number ``split.tensors.count`` (a key
    the first file must have). Every failure is a GGUFError naming the shard's path.

    The metadata are the first file's (llama.cpp reads no other shard's keys); the tensor infos of
    all shards are merged into ``first.tensors`` in shard order, each with its ``file_index``, and
    ``first.shards`` lists the files. As in llama.cpp, a later shard's ``split.count`` is not
    checked, and a user-given list of shard paths (``llama_model_load_from_splits``) is not offered.
    """
    n_split = _split_int(first, SPLIT_COUNT) or 0
    if n_split <= 1:
        return first
    no = _split_int(first, SPLIT_NO) or 0
    if no != 0:
        pre = split_prefix(first.path, no, n_split)
        name = split_path(pre if pre is not None else "NAME", 0, n_split)
        raise GGUFError(first.path, f"illegal split file idx: {no}, model must be loaded with the first split "
                        f"({name})", first.fields[SPLIT_NO].offset, SPLIT_NO)
    prefix = split_prefix(first.path, 0, n_split)
    if prefix is None:
        raise GGUFError(first.path, f"invalid split file name: {SPLIT_COUNT} is {n_split}, so the first shard's "
                        f"name must end with {split_path('', 0, n_split)!r}", first.fields[SPLIT_COUNT].offset,
                        SPLIT_COUNT)
    tensors = dict(first.tensors)
    shards = [first]
    for idx in range(1, n_split):
        p = split_path(prefix, idx, n_split)
        try:
            shard = open_gguf_file(p)
        except GGUFError as e:
            raise GGUFError(e.path, f"failed to load GGUF split {idx + 1} of {n_split} of {first.path}: "
                            f"{str(e)[len(e.path) + 2:]}", e.offset, e.field) from None
        got = _split_int(shard, SPLIT_NO)
        if got is None:
            raise GGUFError(p, f"missing key {SPLIT_NO} in GGUF split", None, SPLIT_NO)
        if got != idx:
            raise GGUFError(p, f"invalid split file idx: {got}, expected {idx}", shard.fields[SPLIT_NO].offset,
                            SPLIT_NO)
        for name, t in shard.tensors.items():
            if name in tensors:
                raise GGUFError(p, f"invalid model: tensor '{name}' is duplicated (also in "
                                f"{shards[tensors[name].file_index].path})", t.info_offset, name)
            tensors[name] = GGUFTensorInfo(t.name, t.ne, t.type, t.offset, t.data_offset, t.nbytes,
                                           t.info_offset, idx)
        shards.append(shard)
    expected = _split_int(first, SPLIT_TENSORS_COUNT)
    if expected is None:
        raise GGUFError(first.path, "required key is missing (a split model's total tensor count)", None,
                        SPLIT_TENSORS_COUNT)
    if expected != len(tensors):
        raise GGUFError(first.path, f"corrupted model: {expected} tensors expected but {len(tensors)} found in "
                        f"its {n_split} splits", first.fields[SPLIT_TENSORS_COUNT].offset, SPLIT_TENSORS_COUNT)
    first.tensors = tensors
    first.shards = shards
    return first


__all__ = ["GGUFArray", "GGUFField", "GGUFFile", "GGUFTensorInfo", "GGUFValueType", "SPLIT_COUNT", "SPLIT_NO",
           "SPLIT_TENSORS_COUNT", "f32_value", "load_splits", "open_gguf", "open_gguf_file", "split_path",
           "split_prefix"]


def get_key_or_arr(f: GGUFFile, name: str, n_layer: int, default: int | None = None) -> int | tuple[int, ...] | None:
    """``llama_model_loader::get_key_or_arr``: ``{arch}.{name}`` as one integer (every layer) or an
    array, which must have exactly ``n_layer`` entries; ``default`` if the key is absent."""
    key = f.arch_key(name)
    arr = f.get(key)
    if not isinstance(arr, GGUFArray):
        return f.get_int(key, default)
    if len(arr) != n_layer:
        raise GGUFError(f.path, f"key has wrong array length; expected {n_layer}, got {len(arr)}",
                        f.fields[key].offset, key)
    if arr.type not in INT_TYPES:
        raise GGUFError(f.path, f"expected an array of integers, found {arr.type.name} elements",
                        f.fields[key].offset, key)
    return tuple(int(v) for v in arr.tolist())
