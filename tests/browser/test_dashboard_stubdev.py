"""DEV ONLY (to be removed): the dashboard on a StubContext in the browser."""
from __future__ import annotations
from pathlib import Path
import nbformat
from test_dashboard import drive_dashboard

def test_stub_dashboard(run_notebook, jupyter_lab, artifacts_dir: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import sys; sys.path.insert(0, '/work/main/tests'); sys.path.insert(0, '/work/main')\n"
        "from test_ui_dashboard import StubContext\nfrom toolkit.ui import Dashboard\n"
        "dash = Dashboard(StubContext())\ndash")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, jupyter_lab.workdir / "stub.ipynb")
    run = run_notebook("stub.ipynb")
    run.page.locator(".toolkit-badge").first.wait_for()
    print("DBG", run.page.evaluate("""() => { const f = document.querySelectorAll('[class*=toolkit-fig]');
        return Array.from(f).map(e => e.className + ' :: ' + e.outerHTML.slice(0, 300)); }"""))
    print("DBG2", run.page.evaluate("""() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(e => e.className + ' | ' + (e.data ? e.data.length : 'nodata'))"""))
    try:
        seen = drive_dashboard(run, artifacts_dir, "dashboard-stub")
    finally:
        print("DBG3", run.page.evaluate("""() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(e => e.className + ' | ' + String(JSON.stringify(e.layout.meta)).slice(0, 200) + ' | ' + JSON.stringify(e.layout.title))"""))
    print(seen, run.console_errors)
    assert run.console_errors == []
