"""Host metadata of ``ggml_backend_sched_new`` (hash set, per-node arrays, context buffer); the table and the
``ggml_graph_overhead`` values are checked on the C code."""

from __future__ import annotations

import pytest

from toolkit.backend import profiles
from toolkit.ggml import F32, Graph, ops
from toolkit.sched import GraphTooLarge, Scheduler, context_buffer_size, graph_overhead, hash_size


@pytest.mark.parametrize(("G", "H", "ctx"), [
    (1024, 1031, 20_685_264),
    (2904, 4099, 58_690_784),
    (8192, 8209, 165_480_912),
])
def test_host_metadata_table(G: int, H: int, ctx: int) -> None:
    assert hash_size(G) == H
    assert context_buffer_size(G) == ctx
    s = Scheduler([profiles.cpu()], None, G, False, True)
    assert s.hash_size == H
    assert s.host_metadata["context_buffer"] == ctx
    assert s.host_metadata_bytes > ctx


def test_graph_overhead() -> None:
    assert graph_overhead(2048) == 82_608
    assert graph_overhead(64) == 2_752


def test_hash_size_above_table() -> None:
    assert hash_size(2147483660) == 2147483660 | 1
    assert hash_size(0) == 2 and hash_size(3) == 3 and hash_size(4) == 5


def test_graph_too_large_names_counts_and_capacity() -> None:
    s = Scheduler([profiles.cpu()], None, 4, False, True)   # hash capacity 5
    x = ops.new_tensor_1d(F32, 4, "x").set_input()
    t = x
    for _ in range(5):
        t = ops.sqr(t)
    g = Graph(64)
    g.build_forward_expand(t)
    with pytest.raises(GraphTooLarge, match=r"5 \+ 1 = 6 exceeds the hash capacity 5"):
        s.reserve(g)


def test_null_key_of_pass3_needs_one_more_slot() -> None:
    """A constant leaf read by an unassigned node makes pass 3 hash the null view_src
    (``ggml_backend_sched_split_graph``'s best-inputs count looks up ``src->view_src``)."""
    s = Scheduler([profiles.cpu()], None, 2, False, True)  # hash capacity 2
    x = ops.new_tensor_1d(F32, 4, "const")
    g = Graph(8)
    g.build_forward_expand(ops.sqr(x))
    assert g.n_nodes + g.n_leafs == s.hash_size == 2
    with pytest.raises(GraphTooLarge, match="exceeds the hash capacity 2"):
        s.reserve(g)
    ok = Scheduler([profiles.cpu()], None, 3, False, True)
    g2 = Graph(8)
    g2.build_forward_expand(ops.sqr(ops.new_tensor_1d(F32, 4, "const")))
    assert ok.reserve(g2)
