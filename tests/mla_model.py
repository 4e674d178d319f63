"""The third oracle's tiny deepseek2 and glm4moe models as its generator writes them (make_gguf3.py,
presets ``tiny_deepseek2_f32`` and ``tiny_glm4moe_f32``): the tensors in ``load_arch_tensors``' order
(``output_norm`` and ``output`` right after ``token_embd``, glm4moe's NextN block included), every tensor
but the norms drawn from normal(0, 0.02) in float32 with ``numpy.random.default_rng(1234)`` one after the
other, norms 1. With the same draws the logits can be compared with llama.cpp's. The file is written by
:func:`toolkit.jaxrt.gguf_io.write_gguf` from the toolkit's presets (its keys and a placeholder tokenizer;
the weights, the hyperparameters and so the logits are the generator's)."""

from __future__ import annotations

import dataclasses

import numpy as np

from toolkit.models import archs, presets
from toolkit.models.hparams import HParams

SEED = 1234


def hparams(name: str, n_vocab: int = 32000) -> HParams:
    """``tiny_deepseek2`` or ``tiny_glm4moe`` with ``n_vocab`` tokens."""
    return dataclasses.replace(presets.get(name), n_vocab=n_vocab)


def is_norm(name: str) -> bool:
    """The generator's "norm" tensors (ones, no draw): every 1-D ``*norm.weight``."""
    return name.endswith("norm.weight")


def weights(hp: HParams, seed: int = SEED) -> dict[str, np.ndarray]:
    """Every tensor of the file, in file order, as the generator draws it (numpy order: ggml ne reversed)."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for w in archs.get(hp.arch).weights(hp):
        shape = tuple(reversed(w.ne))
        out[w.name] = np.ones(shape, np.float32) if is_norm(w.name) else \
            (rng.standard_normal(shape) * 0.02).astype(np.float32)
    return out


def write_model(path: str, name: str, n_vocab: int = 32000) -> tuple[HParams, dict[str, np.ndarray]]:
    from toolkit.jaxrt.gguf_io import write_gguf

    hp = hparams(name, n_vocab)
    vals = weights(hp)
    write_gguf(path, hp, vals)
    return hp, vals
