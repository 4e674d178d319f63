"""The registry of architectures: the one place that lists them (llama.cpp's ``llm_arch`` switch).

Each built-in architecture is a module of this package holding its whole description (see
:class:`~toolkit.models.archs.base.Architecture`): ``llama`` (with or without experts), ``qwen3``
and ``qwen3moe`` (one module: qwen3moe is qwen3's layer with ``build_moe_ffn`` in the FFN slot),
``gemma3``, ``gpt-oss``, ``gemma4``, ``qwen35``/``qwen35moe``, ``lfm2``, ``deepseek2`` (MLA) and
``glm4moe``. Another architecture is added with :func:`register`, from a module of this package or
from outside the toolkit (a test, a notebook):

>>> from toolkit.models import archs
>>> archs.names()
('llama', 'qwen3', 'qwen3moe', 'gemma3', 'gpt-oss', 'gemma4', 'qwen35', 'qwen35moe', 'lfm2', 'deepseek2',
 'glm4moe')
>>> archs.get("gemma3").rope_type, archs.get("qwen3").qk_norm
(2, True)

The registry sits above the hyperparameters, the loader and the graph builders: the
hyperparameters name their architecture (``arch``) and the setup looks its record up here
(:func:`get`, then :meth:`Architecture.check`), so no module below imports this one back.
"""

from __future__ import annotations

from toolkit.errors import ParameterError, UnsupportedFeature
from toolkit.models.archs import deepseek2, gemma3, gemma4, glm4moe, gpt_oss, lfm2, llama, qwen3, qwen35
from toolkit.models.archs.base import (
    MEMORY_KV,
    ROPE_TYPE_NEOX,
    ROPE_TYPE_NORM,
    Architecture,
    TensorSpec,
)
from toolkit.models.hparams import HParams

# the modules of this package that define the built-in architectures (each exports ARCHITECTURES)
BUILTIN_MODULES = (llama, qwen3, gemma3, gpt_oss, gemma4, qwen35, lfm2, deepseek2, glm4moe)

_registry: dict[str, Architecture] = {arch.name: arch for m in BUILTIN_MODULES for arch in m.ARCHITECTURES}


def register(arch: Architecture) -> Architecture:
    """Add ``arch`` under ``arch.name``; ParameterError for a name already taken. Returns ``arch``."""
    if not isinstance(arch, Architecture):
        raise ParameterError("arch", repr(arch), "an Architecture instance")
    if arch.name in _registry:
        raise ParameterError("arch", arch.name, "a name not registered yet",
                             f"registered: {', '.join(_registry)}")
    _registry[arch.name] = arch
    return arch


def unregister(name: str) -> None:
    """Remove a registered architecture (a test's own, when it is done with it)."""
    get(name)
    del _registry[name]


def get(name: str) -> Architecture:
    """The architecture registered as ``name`` (``general.architecture``); UnsupportedFeature
    (feature ``arch``) listing the known names for any other."""
    arch = _registry.get(name)
    if arch is None:
        raise UnsupportedFeature("arch", f"architecture {name!r} is not supported; supported: {', '.join(names())}")
    return arch


def checked(hp: HParams) -> Architecture:
    """The record of ``hp.arch`` after its :meth:`~Architecture.check` of ``hp`` (what ``load_arch_tensors``
    refuses); UnsupportedFeature for an architecture that is not registered."""
    arch = get(hp.arch)
    arch.check(hp)
    return arch


def names() -> tuple[str, ...]:
    """The registered architectures' names, built-ins first, in registration order."""
    return tuple(_registry)


__all__ = ["BUILTIN_MODULES", "MEMORY_KV", "ROPE_TYPE_NEOX", "ROPE_TYPE_NORM", "Architecture", "TensorSpec", "checked",
           "get", "names", "register", "unregister"]
