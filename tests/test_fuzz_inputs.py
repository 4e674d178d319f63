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
from fuzzcount import TRIED, outcome
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.args import FLAG_NAMES, parse_args
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

# what text boxes get typed into them: more strings for the dashboard's text controls
TYPED = st.one_of(VALUES, st.sampled_from(["auto", " auto ", "1024", "0", "-5", "1e3", "sim:2", "sim:0", "sim:17",
                                           "rpc:1", "rpc:2", "cuda:2", "cpu", "CPU", "tpu:1", "x.gguf", "/nope.gguf",
                                           "0", "-1", "1", "w1:0, w2:1", "w*:1", "w1:", ":0", "w1:9", "a:b"]),
                  st.text(max_size=12))

CONTEXT_PARAMS = sorted(ContextParams.__dataclass_fields__) + ["max_nodes", "parallel", "no_such_param"]


def snapshot(ctx: Any) -> tuple[Any, ...]:
    """The scheduler object, its buffer sizes, the current params (the context's own and the
    scheduler's) and the events."""
    sched = ctx.scheduler
    own = ctx.cparams if isinstance(ctx, Context) else (ctx.max_nodes_override, ctx.parallel, ctx.op_offload,
                                                        tuple(ctx.backends))
    return (sched, None if sched is None else tuple(sched.buffer_sizes()), own, ctx.sched_params_cur,
            tuple(ctx.events))


def check_call(ctx: Any, name: str, value: Any, target: str) -> None:
    before = snapshot(ctx)
    try:
        ctx.update(**{name: value})
        outcome(target, "applied")
    except ToolkitError as e:
        outcome(target, f"refused: {type(e).__name__}")
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
    check_call(tiny, name, value, "Context.update")
    if tiny.events and tiny.events[-1].decision != "error":
        # keep the next example cheap: go back to a small context when an input was accepted
        tiny.update(**{k: getattr(ContextParams(n_ctx=512, n_batch=512, n_ubatch=128), k)
                       for k in ContextParams.__dataclass_fields__}, max_nodes=None, parallel=None)


TRACED_FIELDS = ["max_nodes", "parallel", "op_offload", "devices", "budget_mib", "placement", "n_ctx"]


@pytest.fixture(scope="module")
def traced() -> Any:
    import jax
    import jax.numpy as jnp

    from toolkit.trace import trace
    from toolkit.trace.session import TracedContext

    def mlp(p: Any, x: Any) -> Any:
        return jax.nn.relu(x @ p["w1"]) @ p["w2"]

    params = {"w1": jnp.ones((16, 32)), "w2": jnp.ones((32, 8))}
    return TracedContext(trace(mlp, jnp.ones((4, 16)), params=params, placement={"w1": 0, "w2": 1}), "sim:2")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(TRACED_FIELDS), value=VALUES)
def test_traced_context_update_fuzz(traced: Any, name: str, value: Any) -> None:
    TRIED["TracedContext.update"] += 1
    check_call(traced, name, value, "TracedContext.update")


FLAG_VALUES = st.one_of(
    st.sampled_from(["0", "1", "-1", "-2", "2147483647", "2147483648", "4294967296", "99999999999999999999", "1e3",
                     "0x10", "on", "off", "auto", "all", "maybe", "", " ", "f16", "q8_0", "q3_x", "layer", "row",
                     "3,1", "1,-1", "nan", "inf", "sim:24G", "sim:lots", "cuda:1G,cuda:1G", "gpu9", "blk.*=CPU",
                     "blk.(=CPU", "exps=SIM9", "é", "🚀", "tiny", "no-such-model"]),
    st.text(max_size=6),
)


@settings(max_examples=400, deadline=None)
@given(argv=st.lists(st.one_of(st.sampled_from([*FLAG_NAMES, "--bogus", "-x"]), FLAG_VALUES), max_size=6))
def test_cli_argument_parsing_fuzz(argv: list[str]) -> None:
    """llama.cpp's flag grammar: any argument vector parses (and gives ContextParams) or raises a
    ToolkitError naming the flag (or the stray argument) it could not take."""
    TRIED["llama.cpp flags (toolkit.args)"] += 1
    try:
        parse_args(["-m", "tiny", *argv]).context_params()
        outcome("llama.cpp flags (toolkit.args)", "parsed")
    except ToolkitError as e:
        outcome("llama.cpp flags (toolkit.args)", f"refused: {type(e).__name__}")
        named = [a for a in argv if a and a.split("=")[0] in str(e)]
        assert named or "argument" in str(e), f"{argv}: the message names no flag: {e}"


# the dashboard's controls, headless: a widget either refuses a value itself (traitlets' TraitError,
# the dashboard never sees it) or the dashboard applies it, or shows a ToolkitError naming the control
# and puts the control back; the context is then as it was
CONTROL_PARAM = {"gguf": "model"}


def dash_state(dash: Any) -> tuple[Any, ...]:
    return (dash.ctx, *snapshot(dash.ctx), {k: w.value for k, w in dash.controls.items()})


def check_control(dash: Any, key: str, value: Any, target: str) -> bool:
    """Set one control; True when the dashboard took the value."""
    import traitlets

    before = dash_state(dash)
    n_events = len(dash.ctx.events)
    previous = dash.exception      # an earlier refusal; a value equal to the current one changes nothing
    try:
        dash.controls[key].value = value
    except traitlets.TraitError:
        outcome(target, "refused by the widget")
        assert dash_state(dash) == before, f"{key}={value!r}: a refused widget value changed the state"
        return False
    e = dash.exception
    if e is None or e is previous:
        changed = dash_state(dash) != before
        outcome(target, "applied" if changed else "no change")
        return changed
    outcome(target, f"refused: {type(e).__name__}")
    assert isinstance(e, ToolkitError), f"{key}={value!r}: {type(e).__name__} escaped: {e}"
    assert CONTROL_PARAM.get(key, key) in str(e), f"{key}={value!r}: the error does not name the control: {e}"
    after = dash_state(dash)
    assert after[0] is before[0] and after[1] is before[1], f"{key}={value!r}: context or scheduler replaced"
    assert after[2:4] == before[2:4] and after[4] == before[4], f"{key}={value!r}: state changed after an error"
    assert after[6] == before[6], f"{key}={value!r}: the controls were not put back"
    new_events = after[5][n_events:]
    assert after[5][:n_events] == before[5] and all(ev.decision == "error" for ev in new_events)
    assert len(new_events) <= 1, f"{key}={value!r}: more than one error record"
    return False


@pytest.fixture(scope="module")
def dash() -> Any:
    from toolkit.ui import Dashboard
    from toolkit.ui.choices import make_context

    return Dashboard(make_context("tiny", n_ctx=512, n_batch=512, n_ubatch=128), debounce_s=0)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(["gguf", "devices", "budget_mib", "max_nodes", "parallel", "op_offload", "n_ctx",
                            "n_batch", "n_ubatch", "flash_attn", "n_gpu_layers", "model"]),
       value=TYPED)
def test_dashboard_controls_fuzz(dash: Any, key: str, value: Any) -> None:
    TRIED["dashboard controls"] += 1
    baseline = {k: w.value for k, w in dash.controls.items()}
    if check_control(dash, key, value, "dashboard controls"):
        dash.apply(**{k: v for k, v in baseline.items() if dash.controls[k].value != v})   # back to cheap
        assert dash.exception is None, dash.error


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(["devices", "budget_mib", "max_nodes", "parallel", "op_offload", "placement"]),
       value=TYPED)
def test_traced_dashboard_controls_fuzz(traced: Any, key: str, value: Any) -> None:
    from toolkit.ui import Dashboard

    TRIED["dashboard controls (traced)"] += 1
    check_control(Dashboard(traced, debounce_s=0), key, value, "dashboard controls (traced)")
