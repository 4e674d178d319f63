"""The GGUF writer the recipe-built test models share (arch_models, gemma4_model, gptoss_model,
hybrid_model): the oracle's generator order — the name, the architecture's keys, the file type, a
minimal tokenizer, then every tensor in the model's order, norms 1 and the rest normal(0, 0.02) float32
drawn from one generator seeded by the recipe, so a file equals the one llama.cpp measured."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

# (name, numpy shape, kind): kind "norm" is ones, anything else is drawn unless ``fill`` gives its values
Tensors = Iterable[tuple[str, tuple[int, ...], str]]
Fill = Callable[[str, tuple[int, ...], str], "np.ndarray | None"]
Store = Callable[[Any, str, np.ndarray, str], np.ndarray]


def arch_keys(w: Any, arch: str) -> tuple[Callable[[str, int], None], Callable[[str, float], None]]:
    """``u32(key, v)`` and ``f32(key, v)`` writing ``{arch}.{key}``."""
    def u32(k: str, v: int) -> None:
        w.add_uint32(f"{arch}.{k}", int(v))

    def f32(k: str, v: float) -> None:
        w.add_float32(f"{arch}.{k}", float(v))

    return u32, f32


def write_recipe_model(path: str, r: dict[str, Any], tensors: Tensors, write_kv: Callable[[Any, dict[str, Any]], None],
                       *, name: str | None = None, file_type: int | None = None, fill: Fill | None = None,
                       store: Store | None = None) -> dict[str, np.ndarray]:
    """Write recipe ``r``'s GGUF and return every weight as the file holds it (float32, numpy order).

    ``fill(name, shape, kind)`` may give a tensor's values (drawing nothing from the generator);
    ``store(writer, name, arr, kind)`` may add a tensor itself (quantized) and return the values it holds."""
    import gguf

    w = gguf.GGUFWriter(path, r["arch"])
    w.add_name(name or f"test-{r['arch']}")
    write_kv(w, r)
    w.add_file_type(int(gguf.LlamaFileType.ALL_F32) if file_type is None else file_type)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<t{i}>" for i in range(r["n_vocab"])])
    rng = np.random.default_rng(r.get("seed", 1234))
    vals: dict[str, np.ndarray] = {}
    for tname, shape, kind in tensors:
        arr = fill(tname, shape, kind) if fill is not None else None
        if arr is None:
            arr = np.ones(shape, dtype=np.float32) if kind == "norm" else \
                (rng.standard_normal(shape) * 0.02).astype(np.float32)
        if store is not None:
            arr = store(w, tname, arr, kind)
        else:
            w.add_tensor(tname, arr)
        vals[tname] = arr
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return vals


def numpy_order(tensors: Iterable[tuple[str, tuple[int, ...], str]]) -> Tensors:
    """A tensor list in ggml order (ne) as numpy shapes."""
    return ((n, tuple(reversed(ne)), kind) for n, ne, kind in tensors)
