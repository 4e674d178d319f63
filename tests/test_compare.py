"""compare(a, b) on reserve events built by hand around the hand-built plans of test_sched_explain.

The plans' answers are worked out in test_sched_explain's docstring: turning op offload off
moves o (op offload -> weight) and r (expansion down) from CUDA0 to the CPU, the copy of the
host weight w1 to CUDA0 disappears and a copy of a to the CPU appears; x is copied in both.
Buffer sizes and counts below are arbitrary inputs; the expected deltas are their differences.
"""

from __future__ import annotations

from test_sched_explain import hand_plan

from toolkit.compare import compare, default_pair
from toolkit.reuse import BufferSize, Reason, ReserveEvent, SchedParams
from toolkit.ui.text import diff_text

MIB = 1 << 20


def event(i: int, decision: str, op_offload: bool, prev: SchedParams | None, alloc: int, need: int,
          splits: int, host: int = 0, saved: int = 0, reasons: tuple[Reason, ...] = (), plan: bool = True,
          max_nodes: int = 2048) -> ReserveEvent:
    p = SchedParams(max_nodes, False, op_offload)
    return ReserveEvent(i, decision, reasons, p, prev, f"step {i}",  # type: ignore[arg-type]
                        host_metadata_bytes=host, saved_host_metadata_bytes=saved,
                        buffers=(BufferSize("CUDA0", "CUDA0", alloc, need, need // 2),
                                 BufferSize("CPU", "CPU", MIB, MIB // 2, MIB // 4)),
                        n_nodes_pp=4, n_nodes_tg=4, n_splits_pp=splits, n_splits_tg=splits,
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
