"""Model descriptions and llama.cpp-faithful graph builders (pure Python, no JAX).

- :class:`HParams` and :mod:`presets` describe a model of a registered architecture;
- :class:`~toolkit.models.cparams.ContextParams` holds llama.cpp's context parameters;
- :func:`~toolkit.models.loader.load_model` places layers, weights, KV cache and output buffer;
- :mod:`~toolkit.models.archs` holds each architecture (its tensors, keys and graph builder) in one module.
"""

from __future__ import annotations

from typing import Any

from toolkit.models.cparams import ContextParams, ResolvedParams
from toolkit.models.hparams import HParams, SWAParams, WeightInfo


def __getattr__(name: str) -> Any:
    # the presets module is imported when first used: planning a GGUF file (``toolkit fit -m FILE``)
    # never reads it
    if name == "presets":
        import importlib
        return importlib.import_module("toolkit.models.presets")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ContextParams", "HParams", "ResolvedParams", "SWAParams", "WeightInfo", "presets"]
