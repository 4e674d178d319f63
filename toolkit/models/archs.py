"""The graph builder of each supported architecture (llama.cpp's ``llama_model::build_graph`` switch)."""

from __future__ import annotations

from toolkit.models.gemma3 import Gemma3GraphBuilder
from toolkit.models.graph import GraphBuilder
from toolkit.models.hparams import SUPPORTED_ARCHS, check_arch
from toolkit.models.llama import LlamaGraphBuilder
from toolkit.models.qwen3 import Qwen3GraphBuilder

BUILDERS: dict[str, type[GraphBuilder]] = {
    "llama": LlamaGraphBuilder,
    "qwen3": Qwen3GraphBuilder,
    "gemma3": Gemma3GraphBuilder,
    "qwen3moe": Qwen3GraphBuilder,  # llm_build_qwen3moe: qwen3's layer with build_moe_ffn in the FFN slot
}
assert set(BUILDERS) == set(SUPPORTED_ARCHS)


def builder_class(arch: str) -> type[GraphBuilder]:
    """The builder for ``arch``; UnsupportedFeature (listing the supported ones) for any other."""
    return BUILDERS[check_arch(arch)]
