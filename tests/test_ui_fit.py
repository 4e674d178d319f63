"""The fit-to-budget panel (toolkit.ui.fitpanel) and its probe figure, headless."""

from __future__ import annotations

import html
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.args import load_model_arg
from toolkit.errors import ParameterError
from toolkit.fit import FitImpossible
from toolkit.models import presets
from toolkit.ui import figures, text
from toolkit.ui.fitpanel import FitPanel, fit_args

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
# the small preset on two devices of 1200 MiB keeping 1100 MiB free: 100 MiB each, a layer fit
BUDGETS, MARGIN = "1200M,1200M", 1100


def cli_fit(*argv: str) -> str:
    """``python -m toolkit fit ...`` in a fresh interpreter: the printed line (stdout)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "toolkit", "fit", *argv, "--no-real"], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=120)
    return out.stdout.strip()


@pytest.fixture(scope="module")
def fitted() -> FitPanel:
    panel = FitPanel("small", budgets=BUDGETS, fit_target=MARGIN, fit_ctx=4096, flags="")
    assert panel.fit() is not None, panel.error
    return panel


def test_panel_line_is_the_cli_line(fitted: FitPanel) -> None:
    line = cli_fit("-m", "small", "--device", "sim:1200M,sim:1200M", "--fit-target", "1100", "--fit-ctx", "4096")
    assert line and fitted.printed == line
    assert "-ngl -1" not in line and "-ts" in line           # layers were fitted, not left as given
    assert html.escape(line) in fitted.line.value
    assert line in fitted.text()


def test_plain_numbers_are_mib() -> None:
    a, b = fit_args("1200,1200"), fit_args(BUDGETS)
    assert a.devices == b.devices == (f"sim:{1200 * MiB}", f"sim:{1200 * MiB}")


def test_panel_with_flags_matches_cli() -> None:
    # one device with 86 MiB above the margin: the unset context shrinks between --fit-ctx and n_ctx_train
    panel = FitPanel("small", budgets="1110", fit_target=1024, fit_ctx=1024, flags="-fa on -c 0 -ub 256")
    assert panel.fit() is not None, panel.error
    line = cli_fit("-m", "small", "-fa", "on", "-c", "0", "-ub", "256", "--device", "sim:1110M",
                   "--fit-target", "1024", "--fit-ctx", "1024")
    assert panel.printed == line
    assert "-ngl -1" in line and "-c 4096" not in line and "-c 1024" not in line


def test_figure_traces_carry_each_probe(fitted: FitPanel) -> None:
    r = fitted.result
    assert r is not None and len(r.probes) > 2
    fig = figures.fit_probes(r)
    traces = {t.name: t for t in fig.data}
    for d, m in enumerate(r.memory):
        used = traces[f"{m.name} used"]
        assert [c[0] for c in used.customdata] == [p.breakdown.devices[d].total for p in r.probes]
        assert list(used.y) == [p.used(d) / MiB for p in r.probes]
        assert list(used.x) == list(range(1, len(r.probes) + 1))
    # both devices have 1200 MiB free and keep 1100 MiB: one shared target line, not two on top of each other
    targets = [t for t in fig.data if t.meta["kind"] == "target"]
    assert [(t.name, t.meta["devices"], list(t.y)) for t in targets] == [
        ("SIM0, SIM1 target (free − margin)", ["SIM0", "SIM1"], [1200 - MARGIN] * 2)]
    assert fig.layout.meta["printed"] == r.printed
    chosen = fig.layout.meta["chosen"]                          # the star: the probe of the printed parameters
    star = r.probes[chosen - 1]
    assert [star.used(d) for d in range(len(r.memory))] == list(r.used)
    assert text.fit_probe_label(star.params).startswith(f"-c {r.fitted.c} -ngl {r.fitted.ngl}")
    assert [s for s in traces["SIM0 used"].marker.symbol].count("star") == 1
    # the widget shows the same figure
    shown = {t.name: t for t in fitted.figure.data}
    assert list(shown["SIM1 used"].y) == list(traces["SIM1 used"].y)
    # the text form lists every probe
    rows = text.fit_probes_text(r).splitlines()
    assert len(rows) == len(r.probes) + 2


def test_unequal_targets_get_a_line_each() -> None:
    panel = FitPanel("small", budgets="1200,1300", fit_target=MARGIN, fit_ctx=4096, flags="")
    r = panel.fit()
    assert r is not None, panel.error
    targets = [t for t in figures.fit_probes(r).data if t.meta["kind"] == "target"]
    assert [(t.name, list(t.y)) for t in targets] == [
        ("SIM0 target (free − margin)", [1200 - MARGIN] * 2), ("SIM1 target (free − margin)", [1300 - MARGIN] * 2)]
    used = {t.meta["device"]: t.line.color for t in figures.fit_probes(r).data if t.meta["kind"] == "used"}
    assert [t.line.color for t in targets] == [used["SIM0"], used["SIM1"]]   # each in its device's colour


def test_command_names_the_weight_type() -> None:
    # a preset with another weight type than its own: the command line says so, and gives the same answer
    panel = FitPanel(presets.small("f16"), budgets="1200M", fit_target=MARGIN, fit_ctx=4096, flags="")
    assert "-m small:f16 " in panel.command and "--device sim:1200M " in panel.command
    assert panel.fit() is not None, panel.error
    assert cli_fit(*shlex.split(panel.command)[4:]) == panel.printed != ""
    assert "-m small " in FitPanel(presets.small(), budgets="1200M").command


def test_preset_with_a_type() -> None:
    assert presets.get("small:f16").dtype is presets.small("f16").dtype is not presets.small().dtype
    assert load_model_arg("qwen3_30b_a3b:q8_0").name == "qwen3-30b-a3b_q8_0"
    for bad in ("small:", "small:q9_9", "smal:f16"):
        with pytest.raises(ParameterError) as e:
            load_model_arg(bad)
        assert e.value.param == "-m" and e.value.value == bad


def test_real_run_table(fitted: FitPanel) -> None:
    r, real = fitted.result, fitted.real
    assert r is not None and real is not None
    for d, check in enumerate(real.devices):
        assert check.estimate.total == r.used[d]                # the probe of the fitted parameters
        assert f"data-estimate='{check.estimate.total}'" in fitted.table.value
        assert f"data-real='{check.real.total}'" in fitted.table.value
        assert check.keeps_margin


def test_impossible_fit_shows_what_is_missing_and_keeps_the_result() -> None:
    panel = FitPanel("small", budgets=BUDGETS, fit_target=MARGIN, flags="")
    first = panel.fit()
    assert first is not None
    line, figure, table = panel.line.value, panel.figure.to_plotly_json(), panel.table.value
    assert panel.fit(fit_target="1120") is None               # 80 MiB per device: the first one stays short
    e = panel.exception
    assert isinstance(e, FitImpossible) and e.missing_mib.get("SIM0", 0) > 0
    assert f"missing SIM0: {e.missing_mib['SIM0']} MiB" in html.unescape(panel.errors.value)
    assert "Traceback" not in panel.errors.value
    assert panel.refused is not None and panel.refused.missing_mib() == e.missing_mib
    assert panel.result is first and panel.line.value == line and panel.table.value == table
    assert panel.figure.to_plotly_json() == figure
    assert panel.controls["fit_target"].value == str(MARGIN)   # the controls show the shown result's inputs
    assert panel.fit() is not None                              # and it fits again
    assert panel.error is None and panel.errors.value == ""


@pytest.mark.parametrize(("control", "value"), [
    ("budgets", "24Q"), ("budgets", ""), ("budgets", "24G,,24G"), ("budgets", "0"), ("budgets", "-3G"),
    ("fit_target", "x"), ("fit_target", "-5"), ("fit_target", "1024,1024,1024"), ("fit_ctx", -1), ("fit_ctx", "many"),
    ("flags", "-fa maybe"), ("flags", "--device sim:1G"), ("flags", "-m tiny"), ("flags", "'unclosed"),
    ("kind", "rpc"),
])
def test_bad_input_names_the_control(control: str, value: object) -> None:
    panel = FitPanel("small", budgets=BUDGETS, fit_target=MARGIN, flags="")
    first = panel.fit()
    assert first is not None
    before = {k: w.value for k, w in panel.controls.items()}
    if control == "kind":   # the dropdown only offers sim and cuda: the grammar refuses the rest
        with pytest.raises(ParameterError) as info:
            fit_args(BUDGETS, kind=str(value))
    else:
        assert panel.fit(**{control: value}) is None
        assert isinstance(panel.exception, ParameterError)
        assert panel.exception.param == control
        assert panel.error is not None and control in panel.error
        assert panel.result is first and {k: w.value for k, w in panel.controls.items()} == before
        with pytest.raises(ParameterError) as info:
            fit_args(**{"budgets": BUDGETS, "fit_target": MARGIN, "fit_ctx": 4096, "flags": "",
                        control: value})   # type: ignore[arg-type]
    assert info.value.param == control
    assert panel.button.description == "fit" and not panel.button.disabled


def test_unknown_control() -> None:
    panel = FitPanel("small", budgets=BUDGETS)
    assert panel.fit(budget="1G") is None
    assert isinstance(panel.exception, ParameterError) and panel.exception.param == "control"


def test_dashboard_fits_its_current_model() -> None:
    import toolkit

    dash = toolkit.dashboard(model="small", devices="sim:2")
    assert dash.fit_panel is None and dash.fit_box.layout.display == "none"
    dash.fit_toggle.value = True
    panel = dash.fit_panel
    assert panel is not None and dash.fit_box.layout.display == "flex"
    assert panel.controls["budgets"].value == "24G,24G"
    assert panel.widget in dash.fit_box.children and dash.fit_box in dash.widget.children
    assert panel.fit(budgets=BUDGETS, fit_target=MARGIN, flags="") is not None
    assert panel.printed == cli_fit("-m", "small", "--device", BUDGETS.replace("1200M", "sim:1200M"),
                                    "--fit-target", str(MARGIN), "--fit-ctx", "4096")
    dash.apply(model="tiny")
    assert panel.fit() is not None and "-m tiny " in panel.command
    assert dash.open_fit() is panel


def test_traced_dashboard_hides_the_fit_toggle() -> None:
    import jax.numpy as jnp

    import toolkit
    from toolkit.trace import trace

    params = {"w": jnp.ones((4, 4), jnp.float32)}
    traced = trace(lambda p, x: jnp.tanh(x @ p["w"]), jnp.ones((2, 4), jnp.float32), params=params)
    dash = toolkit.dashboard(traced, devices="sim:2", debounce_s=0)
    assert dash.fit_toggle.layout.display == "none"
