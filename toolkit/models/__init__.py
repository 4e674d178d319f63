"""Model descriptions and llama.cpp-faithful graph builders (pure Python, no JAX).

- :class:`LlamaHParams` and :mod:`presets` describe a llama model;
- :class:`~toolkit.models.cparams.ContextParams` holds llama.cpp's context parameters;
- :func:`~toolkit.models.loader.load_model` places layers, weights, KV cache and output buffer;
- :class:`~toolkit.models.llama.LlamaGraphBuilder` builds the graph node for node.
"""

from __future__ import annotations

from toolkit.models import presets
from toolkit.models.cparams import ContextParams, ResolvedParams
from toolkit.models.hparams import LlamaHParams, WeightInfo

__all__ = ["ContextParams", "LlamaHParams", "ResolvedParams", "WeightInfo", "presets"]
