"""ggml's tensor model: types, tensors, views, op constructors and graphs (pure Python)."""

from __future__ import annotations

from toolkit.ggml import ops
from toolkit.ggml.graph import GGML_DEFAULT_GRAPH_SIZE, Graph, GraphFull, build_graph
from toolkit.ggml.tensor import (
    MAX_DIMS,
    MAX_SRC,
    BufferUsage,
    GluOp,
    Op,
    Tensor,
    TensorFlag,
    UnaryOp,
    contiguous_strides,
    is_view_op,
)
from toolkit.ggml.types import BF16, F16, F32, I32, Q4_0, Q8_0, GGMLType

__all__ = [
    "BF16", "F16", "F32", "GGML_DEFAULT_GRAPH_SIZE", "I32", "MAX_DIMS", "MAX_SRC", "Q4_0", "Q8_0",
    "BufferUsage", "GGMLType", "GluOp", "Graph", "GraphFull", "Op", "Tensor", "TensorFlag",
    "UnaryOp", "build_graph", "contiguous_strides", "is_view_op", "ops",
]
