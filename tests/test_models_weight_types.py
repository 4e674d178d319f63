"""Every weight type a GGUF may hold plans: a llama GGUF whose matrices are of that type (random bytes:
planning reads no weight) reads back, and without mmap its model buffers are the bytes gguf-py gives each
tensor (``ggml_nbytes``), each padded to the buffer's 32-byte alignment, on ``CPU`` or on ``CPU_REPACK``
for the matrices ``ggml_repack_get_optimal_repack_type`` takes on the measured x86 CPU (AVX2 and AVX512)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from toolkit.context import Context
from toolkit.errors import ParameterError
from toolkit.models import ContextParams

QT = gguf.GGMLQuantizationType
E, H, F, V = 256, 4, 512, 256
QUANTIZED = [q for q in QT if gguf.GGML_QUANT_SIZES[q][0] > 1 and q.name not in ("Q8_1", "Q8_K")]
# the matrices' types the repack buffer takes on an AVX2 + AVX512 CPU (rows % 8 == 0 here)
REPACKED = {"Q4_0", "Q4_K", "IQ4_NL", "MXFP4", "Q2_K"}


def _nbytes(q: QT, shape: tuple[int, ...]) -> int:
    return int(np.prod(gguf.quant_shape_to_byte_shape(shape, q)))


def _pad(n: int) -> int:
    return -(-n // 32) * 32


def write(path: str, q: QT) -> dict[str, int]:
    """One llama layer with every matrix (token_embd and output included) of type q; returns the model
    buffer bytes expected per buffer."""
    w = gguf.GGUFWriter(path, "llama")
    for k, v in (("block_count", 1), ("embedding_length", E), ("feed_forward_length", F),
                 ("attention.head_count", H), ("attention.head_count_kv", H), ("context_length", 4096),
                 ("vocab_size", V)):
        w.add_uint32(f"llama.{k}", v)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<t{i}>" for i in range(V)])
    rng = np.random.default_rng(q.value)
    want = {"CPU": 0, "CPU_REPACK": 0}
    mats = [("token_embd.weight", (V, E)), ("output.weight", (V, E)), ("blk.0.attn_q.weight", (E, E)),
            ("blk.0.attn_k.weight", (E, E)), ("blk.0.attn_v.weight", (E, E)), ("blk.0.attn_output.weight", (E, E)),
            ("blk.0.ffn_gate.weight", (F, E)), ("blk.0.ffn_up.weight", (F, E)), ("blk.0.ffn_down.weight", (E, F))]
    for name, shape in mats:
        raw = rng.integers(0, 256, gguf.quant_shape_to_byte_shape(shape, q), dtype=np.uint8)
        w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=q)
        buf = "CPU_REPACK" if q.name in REPACKED and name != "token_embd.weight" else "CPU"
        want[buf] += _pad(_nbytes(q, shape))
    for name in ("output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"):
        w.add_tensor(name, np.ones(E, np.float32))
        want["CPU"] += _pad(E * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {k: v for k, v in want.items() if v}


@pytest.mark.parametrize("q", QUANTIZED, ids=lambda q: q.name)
def test_a_file_of_each_weight_type_plans(q: QT, tmp_path: Path) -> None:
    path = str(tmp_path / f"{q.name}.gguf")
    want = write(path, q)
    ctx = Context(path, ContextParams(n_ctx=256, n_batch=256, n_ubatch=256, use_mmap=False))
    assert ctx.model_buffers_bytes == want
    assert ctx.setup.model.tensors["blk.0.attn_q.weight"].type.name == q.name


@pytest.mark.parametrize("kv", ["iq2_xxs", "iq3_s", "iq1_m"])
def test_a_cache_type_ggml_cpu_cannot_write_is_refused(kv: str) -> None:
    """No from_float in ggml-cpu for the IQ1/IQ2/IQ3 types: a typed error naming type_k, no context."""
    with pytest.raises(ParameterError) as e:
        Context("small", ContextParams(n_ctx=256, type_k=kv, flash_attn="on"))
    assert e.value.param == "type_k" and kv in str(e.value)


def test_a_q2_0_file_plans(tmp_path: Path) -> None:
    """Q2_0 (ggml id 42, block_q2_0: a ggml_half and 16 bytes per 64 elements), a type gguf-py does not know:
    written by toolkit.jaxrt.gguf_io (its id and shape as given), its buffers are 18 bytes per 64 elements of
    each matrix on CPU (ggml_repack_get_optimal_repack_type takes no Q2_0)."""
    from toolkit.ggml.types import GGMLType
    from toolkit.jaxrt.gguf_io import write_gguf
    from toolkit.models import HParams, archs

    hp = HParams(n_layer=1, n_embd=E, n_head=H, n_head_kv=H, n_ff=F, n_vocab=V, dtype=GGMLType.Q2_0, name="q2_0")
    rng = np.random.default_rng(42)
    vals: dict[str, np.ndarray] = {}
    want = 0
    for info in archs.get(hp.arch).weights(hp):
        if len(info.ne) == 2:
            assert info.type is GGMLType.Q2_0
            raw = rng.integers(0, 256, (info.ne[1], info.ne[0] // 64, 18), dtype=np.uint8)
            raw[..., 0:2] = np.full(raw.shape[:-1], 0.01, np.float16)[..., None].view(np.uint8)
            vals[info.name] = raw.reshape(info.ne[1], -1)
            want += _pad(info.ne[1] * info.ne[0] // 64 * 18)
        else:
            vals[info.name] = np.ones(tuple(reversed(info.ne)), np.float32)
            want += _pad(4 * int(np.prod(info.ne)))
    path = str(tmp_path / "q2_0.gguf")
    write_gguf(path, hp, vals)
    ctx = Context(path, ContextParams(n_ctx=256, n_batch=256, n_ubatch=256, use_mmap=False))
    assert ctx.model_buffers_bytes == {"CPU": want}
    assert ctx.setup.model.tensors["blk.0.attn_q.weight"].type is GGMLType.Q2_0
