"""explain(plan, node) on a hand-built graph whose placements are worked out by hand below.

Backends: a CUDA-like GPU (its own buffer type only, op offload from a batch of 32) and the CPU.
Graph: x (input, 16x64) -> h = mul_mat(w0 on GPU, x) -> a = silu(h) -> o = mul_mat(w1 on CPU, a)
-> r = silu(o).

By ggml_backend_sched_split_graph's rules:
- h: pass 1, weight rule: w0 lives on CUDA0 -> CUDA0; x is a CPU input, copied as CUDA0#x#0.
- a: no weight, pass 2 expansion down from h -> CUDA0; reuses h's memory in place.
- o: pass 1, w1 is a host weight; with op offload and a batch of 64 >= 32 -> CUDA0 (op offload),
  w1 copied to CUDA0; without op offload -> CPU (weight), a copied to the CPU as CPU#a#0.
- r: expansion down from o -> o's backend.
"""

from __future__ import annotations

import pytest
from sched_fixtures import cpu, gpu, graph_of, weight

from toolkit.ggml import F32, ops
from toolkit.sched import Scheduler
from toolkit.sched.explain import explain, parse_copy_name
from toolkit.sched.plan import Cause, Plan


def hand_plan(op_offload: bool) -> Plan:
    g0, c = gpu(0), cpu()
    s = Scheduler([g0, c], None, 2048, False, op_offload)
    w0, w1 = weight(g0, "w0", 16, 16), weight(c, "w1", 16, 16)
    x = ops.new_tensor_2d(F32, 16, 64, "x").set_input()
    a = ops.silu(ops.mul_mat(w0, x).set_name("h")).set_name("a")
    r = ops.silu(ops.mul_mat(w1, a).set_name("o")).set_name("r").set_output()
    assert s.reserve(graph_of(r))
    return s.plan()


def test_weight_rule_names_the_weight_and_the_input_copy() -> None:
    e = explain(hand_plan(True), "h")
    assert (e.node.op, e.node.backend, e.cause, e.pass_name) == ("MUL_MAT", "CUDA0", Cause.WEIGHT, "pass 1")
    assert e.node.ne == (16, 64, 1, 1) and e.node.nbytes == 16 * 64 * 4
    assert e.followed == ("w0",)
    assert [(s.name, s.kind, s.copy) for s in e.sources] == [("w0", "leaf", None), ("x", "leaf", "CUDA0#x#0")]
    assert e.copies_in == ("CUDA0#x#0",)
    assert e.alloc is not None and e.alloc.buft == "CUDA0"


def test_op_offload_and_its_absence() -> None:
    on = explain(hand_plan(True), "o")
    assert (on.node.backend, on.cause, on.followed) == ("CUDA0", Cause.OP_OFFLOAD, ("w1",))
    assert on.copies_in == ("CUDA0#w1#0",)
    off = explain(hand_plan(False), "o")
    assert (off.node.backend, off.cause, off.followed) == ("CPU", Cause.WEIGHT, ("w1",))
    assert off.copies_in == ("CPU#a#0",)
    assert [(s.name, s.backend) for s in off.sources] == [("w1", ""), ("a", "CUDA0")]


def test_expansion_names_its_neighbour_and_the_copy_of_its_output() -> None:
    p = hand_plan(False)
    a = explain(p, "a")
    assert (a.cause, a.pass_name) == (Cause.EXPAND_DOWN, "pass 2")
    assert a.followed == ("h (node #0, CUDA0)",)
    assert [(c.backend, c.nbytes) for c in a.copies_out] == [("CPU", 16 * 64 * 4)]
    assert a.alloc is not None and a.alloc.inplace_of == "h"     # SILU runs in place of its input
    r = explain(p, 3)
    assert (r.node.name, r.node.backend, r.followed) == ("r", "CPU", ("o (node #2, CPU)",))


def test_lifetime_and_offset_come_from_the_allocator() -> None:
    p = hand_plan(False)
    e = explain(p, "o")
    a = next(t for t in p.allocs if t.name == "o")
    assert e.alloc == a and a.first <= a.last
    text = e.to_text()
    assert f"offset {a.offset:,}" in text and "cause: weight (pass 1)" in text and "followed: w1" in text


def test_a_node_is_found_by_name_or_index_and_bad_names_are_typed() -> None:
    p = hand_plan(True)
    assert explain(p, "r") == explain(p, 3) == explain(p, next(n for n in p.nodes if n.name == "r"))
    with pytest.raises(ValueError, match="'nope'"):
        explain(p, "nope")
    with pytest.raises(ValueError, match="node=99"):
        explain(p, 99)


def test_parse_copy_name() -> None:
    c = parse_copy_name("CUDA0#inp_embd#1")
    assert c is not None and (c.backend, c.src, c.copy) == ("CUDA0", "inp_embd", 1)
    assert parse_copy_name("Qcur-0") is None
