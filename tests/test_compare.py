"""compare(a, b) on reserve events built by hand around the hand-built plans of test_sched_explain.

The plans' answers are worked out in test_sched_explain's docstring: turning op offload off
moves o (op offload -> weight) and r (expansion down) from CUDA0 to the CPU, the copy of the
host weight w1 to CUDA0 disappears and a copy of a to the CPU appears; x is copied in both.
Buffer sizes and counts below are arbitrary inputs; the expected deltas are their differences.
"""

from __future__ import annotations

import dataclasses

from test_sched_explain import hand_plan

from toolkit.compare import compare, default_pair
from toolkit.reuse import BufferSize, GraphRecord, Reason, ReserveEvent, SchedParams
from toolkit.ui.text import diff_text

MIB = 1 << 20


def event(i: int, decision: str, op_offload: bool, prev: SchedParams | None, alloc: int, need: int,
          splits: int, host: int = 0, saved: int = 0, reasons: tuple[Reason, ...] = (), plan: bool = True,
          max_nodes: int = 2048, graphs: tuple[str, ...] = ("pp", "tg"), kv: int = MIB) -> ReserveEvent:
    p = SchedParams(max_nodes, False, op_offload)
    halves = {g: k for g, k in zip(graphs, (1, 2, 4))}
    return ReserveEvent(i, decision, reasons, p, prev, f"step {i}",  # type: ignore[arg-type]
                        host_metadata_bytes=host, saved_host_metadata_bytes=saved,
                        buffers=(BufferSize("CUDA0", "CUDA0", alloc, {g: need // k for g, k in halves.items()}),
                                 BufferSize("CPU", "CPU", MIB, {g: MIB // (2 * k) for g, k in halves.items()})),
                        graphs={g: GraphRecord(4, splits) for g in graphs}, last_graph=graphs[0],
                        memory={"model": {"CUDA0": 8 * MIB}, "KV": {"CUDA0": kv}, "compute": {"CUDA0": alloc}},
                        plan=hand_plan(op_offload) if plan else None)


def pair() -> tuple[ReserveEvent, ReserveEvent]:
    a = event(0, "rebuilt", True, None, 3 * MIB, 3 * MIB, 2, host=5000)
    b = event(1, "rebuilt", False, a.params, 3 * MIB, 2 * MIB, 3, host=5000,
              reasons=(Reason("op_offload", True, False),))
    return a, b


def test_backend_changes_with_both_causes() -> None:
    d = compare(*pair())
    assert [(c.name, c.before, c.after, c.cause_before, c.cause_after) for c in d.backend_changes] == [
        ("o", "CUDA0", "CPU", "op offload", "weight"),
        ("r", "CUDA0", "CPU", "expansion down", "expansion down"),
    ]


def test_split_inputs_appear_and_disappear_with_their_reader() -> None:
    d = compare(*pair())
    assert [(i.name, i.from_backend, i.to_backend, i.nbytes, i.is_weight, i.reader, i.reader_cause)
            for i in d.inputs_added] == [("a", "CUDA0", "CPU", 16 * 64 * 4, False, "o", "weight")]
    assert [(i.name, i.from_backend, i.to_backend, i.nbytes, i.is_weight, i.reader, i.reader_cause)
            for i in d.inputs_removed] == [("w1", "CPU", "CUDA0", 16 * 16 * 4, True, "o", "op offload")]
    assert [i.name for i in d.weights_removed] == ["w1"] and d.weights_added == ()


def test_buffers_counts_params_and_decision() -> None:
    a, b = pair()
    d = compare(a, b)
    cuda = d.buffer("CUDA0")
    assert (cuda.allocated_change, cuda.needed_change) == (0, -MIB)
    assert d.buffer("CPU").allocated_change == 0
    assert (d.count("splits pp").a, d.count("splits pp").b, d.count("splits pp").change) == (2, 3, 1)
    assert [c.name for c in d.counts] == ["nodes pp", "nodes tg", "splits pp", "splits tg", "n_copies"]
    assert d.graphs == ("pp", "tg") and d.graphs_only_a == () == d.graphs_only_b
    assert d.params == (("op_offload", True, False),)
    assert (d.decision_b, d.reasons_b, d.host_metadata_cost_b) == ("rebuilt", ("op_offload on \u2192 off",), 5000)


def test_reuse_reports_the_saving_and_the_held_metadata() -> None:
    a, b = pair()
    c = event(2, "reused", False, b.params, 3 * MIB, MIB, 3, saved=4000, max_nodes=1024,
              reasons=(Reason("max_nodes", 2048, 1024),))
    d = compare(b, c, [a, b, c])
    assert (d.host_metadata_saved_b, d.host_metadata_cost_b) == (4000, 0)
    assert (d.host_metadata_held_a, d.host_metadata_held_b) == (5000, 5000)   # reuse keeps b's scheduler
    assert d.backend_changes == () and d.inputs_added == () == d.inputs_removed
    text = diff_text(d)
    assert "#2 REUSED: max_nodes 1024 <= 2048" in text and "saved 0.00 MiB" in text


def test_text_lists_every_change() -> None:
    text = diff_text(compare(*pair()))
    assert "params: op_offload on -> off" in text
    assert "o (MUL_MAT): CUDA0 (op offload) -> CPU (weight)" in text
    assert "w1 (weight) CPU -> CUDA0 1,024 B, read by o (op offload)" in text
    assert "splits pp 2 -> 3" in text and "CUDA0 allocated 3.00 MiB -> 3.00 MiB (unchanged)" in text


def test_missing_plan_and_default_pair() -> None:
    a, _ = pair()
    err = ReserveEvent(1, "error", (), a.params, a.params, "max_nodes=1", error="too small")
    b = event(2, "reused", True, a.params, 3 * MIB, 3 * MIB, 2, plan=False)
    d = compare(a, b)
    assert not d.has_plans and d.backend_changes == () and "unavailable" in diff_text(d)
    assert default_pair([a, err, b]) == (0, 2) and default_pair([a]) is None


def test_memory_groups_and_graph_labels_on_one_side_only() -> None:
    """A group or a graph label one reserve lacks: its bytes compare against 0, and the labels only
    one side planned are named, not compared (a traced graph against a llama pp/tg pair)."""
    a = event(0, "rebuilt", True, None, 3 * MIB, 3 * MIB, 2, kv=MIB)
    b = event(1, "rebuilt", False, a.params, 3 * MIB, 2 * MIB, 3, graphs=("graph",), kv=2 * MIB)
    b = dataclasses.replace(b, memory={**b.memory, "KV-SWA": {"CPU": 5 * MIB}})
    d = compare(a, b)
    assert [(m.group, m.buffer, m.a, m.b, m.change) for m in d.memory] == [
        ("model", "CUDA0", 8 * MIB, 8 * MIB, 0), ("KV", "CUDA0", MIB, 2 * MIB, MIB),
        ("KV-SWA", "CPU", 0, 5 * MIB, 5 * MIB)]
    assert d.graphs == () and (d.graphs_only_a, d.graphs_only_b) == (("pp", "tg"), ("graph",))
    assert [c.name for c in d.counts] == ["n_copies"]
    # the most any one graph needs: a's pp (3 MiB), b's one graph (2 MiB)
    assert (d.buffer("CUDA0").needed_a, d.buffer("CUDA0").needed_b) == (3 * MIB, 2 * MIB)
    text = diff_text(d)
    assert "KV-SWA          CPU 0.00 MiB -> 5.00 MiB (+5.00 MiB)" in text
    assert "only #0 planned graph(s): pp, tg" in text and "only #1 planned graph(s): graph" in text
