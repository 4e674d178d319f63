"""Model descriptions and llama.cpp-faithful graph builders (pure Python, no JAX).

- :class:`HParams` and :mod:`presets` describe a model of a registered architecture;
- :class:`~toolkit.models.cparams.ContextParams` holds llama.cpp's context parameters;
- :func:`~toolkit.models.loader.load_model` places layers, weights, KV cache and output buffer;
- :mod:`~toolkit.models.archs` holds each architecture (its tensors, keys and graph builder) in one module.
"""

from __future__ import annotations

from toolkit.models import presets
from toolkit.models.cparams import ContextParams, ResolvedParams
from toolkit.models.hparams import HParams, SWAParams, WeightInfo

__all__ = ["ContextParams", "HParams", "ResolvedParams", "SWAParams", "WeightInfo", "presets"]
