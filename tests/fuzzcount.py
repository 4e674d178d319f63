"""How many inputs each fuzz target tried in this run; printed in pytest's terminal summary."""

from __future__ import annotations

from collections import Counter

TRIED: Counter[str] = Counter()
