"""How many inputs each fuzz target tried in this run; printed in pytest's terminal summary."""

from __future__ import annotations

from collections import Counter

TRIED: Counter[str] = Counter()
# target -> outcome ("applied", "refused: ParameterError", ...) -> count
OUTCOMES: dict[str, Counter[str]] = {}


def outcome(target: str, what: str) -> None:
    OUTCOMES.setdefault(target, Counter())[what] += 1
