"""Every user-facing parameter, fuzzed: a call succeeds or raises a ToolkitError naming the parameter,
and after an error the context is exactly as it was (scheduler object, buffer sizes, params, events
apart from the one error record).

The values cover what users and widgets send by mistake: 0, negative and huge integers (2**63),
floats, NaN, booleans, None, numeric and junk strings, empty and unicode strings, and lists. How
many inputs each target tried is printed in the terminal summary (``fuzz:`` lines).
"""

from __future__ import annotations

from typing import Any

import pytest
from fuzzcount import TRIED
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.context import Context
from toolkit.errors import ToolkitError
from toolkit.models import ContextParams

VALUES = st.one_of(
    st.sampled_from([0, -1, 1, 2, 7, 255, 256, 257, 512, 4096, 10**6, 10**9, 10**12, 2**31, 2**32, 2**63, -(2**63)]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([float("nan"), 0.5, 512.0, -0.0]),
    st.booleans(),
    st.none(),
    st.sampled_from(["", " ", "0", "1", "512", "-1", "1e3", "nan", "on", "off", "auto", "yes", "no", "true",
                     "f16", "q8_0", "layer", "row", "cuda", "sim:2", "cpu", "rpc:2", "sim:1G", "é", "ß∂ƒ", "\x00",
                     "🚀", "999999999999999999999"]),
    st.text(max_size=8),
    st.lists(st.sampled_from([0, 1, 1.5, "a", None, -1]), max_size=3),
)

CONTEXT_PARAMS = sorted(ContextParams.__dataclass_fields__) + ["max_nodes", "parallel", "no_such_param"]


def snapshot(ctx: Any) -> tuple[Any, ...]:
    sched = ctx.scheduler
    return (sched, None if sched is None else tuple(sched.buffer_sizes()), ctx.cparams, ctx.sched_params_cur,
            tuple(ctx.events))


def check_call(ctx: Any, name: str, value: Any) -> None:
    before = snapshot(ctx)
    try:
        ctx.update(**{name: value})
    except ToolkitError as e:
        assert name in str(e), f"{name}={value!r}: the message does not name the parameter: {e}"
        after = snapshot(ctx)
        assert after[0] is before[0], f"{name}={value!r}: the scheduler object changed"
        assert after[1:4] == before[1:4], f"{name}={value!r}: state changed after an error"
        assert after[4][:-1] == before[4] and after[4][-1].decision == "error", f"{name}={value!r}: events"
    # any other exception escapes and fails the test


@pytest.fixture(scope="module")
def tiny() -> Context:
    return Context("tiny", ContextParams(n_ctx=512, n_batch=512, n_ubatch=128))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(CONTEXT_PARAMS), value=VALUES)
def test_context_update_fuzz(tiny: Context, name: str, value: Any) -> None:
    TRIED["Context.update"] += 1
    check_call(tiny, name, value)
    if tiny.events and tiny.events[-1].decision != "error":
        # keep the next example cheap: go back to a small context when an input was accepted
        tiny.update(**{k: getattr(ContextParams(n_ctx=512, n_batch=512, n_ubatch=128), k)
                       for k in ContextParams.__dataclass_fields__}, max_nodes=None, parallel=None)
