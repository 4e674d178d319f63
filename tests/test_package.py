"""The package imports cheaply: the pure core pulls in no jax, plotly or ipywidgets."""

from __future__ import annotations

import subprocess
import sys

import toolkit

HEAVY = ("jax", "plotly", "ipywidgets")


def _modules_loaded_by(statement: str) -> list[str]:
    code = f"import sys; {statement}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return eval(out.stdout.strip())  # a printed list of str


def test_import_toolkit_loads_no_heavy_module() -> None:
    assert _modules_loaded_by("import toolkit") == []


def test_pure_core_loads_no_heavy_module() -> None:
    # the layers below jaxrt/ui (ARCHITECTURE.md) must stay importable without a device stack
    assert _modules_loaded_by("import toolkit.ggml, toolkit.sched.plan, toolkit.context") == []


def test_version_matches_metadata() -> None:
    from importlib.metadata import version

    assert toolkit.__version__ == version("toolkit")


def test_public_api_lists_every_lazy_name_and_each_resolves() -> None:
    """``__all__`` is the public API: each name resolves, and the light ones load no heavy module."""
    assert sorted(toolkit.__all__) == sorted([*toolkit._LAZY, *toolkit._LAZY_MODULES])
    heavy = ("TracedContext", "compile_splits", "dashboard", "decode", "generate", "jaxrt", "trace")
    light = [n for n in toolkit.__all__ if n not in heavy]
    assert _modules_loaded_by(f"import toolkit; [getattr(toolkit, n) for n in {light!r}]") == []
    from toolkit.context import Context
    from toolkit.errors import ToolkitError
    from toolkit.reuse import SchedParams
    assert toolkit.Context is Context and toolkit.SchedParams is SchedParams and toolkit.ToolkitError is ToolkitError
    assert set(toolkit.__all__) <= set(dir(toolkit))


def test_no_import_cycle_inside_the_package() -> None:
    """No module of toolkit reaches itself through its imports: for every direct import a -> b, no chain
    of imports leads from b back to a. Function-level (lazy) and TYPE_CHECKING imports count: a cycle
    hidden in a function still means code in the wrong layer."""
    import grimp

    g = grimp.build_graph("toolkit", include_external_packages=False)
    cycles = sorted({tuple(sorted((a, b))) for a in g.modules for b in g.find_modules_directly_imported_by(a)
                     if a != b and g.chain_exists(importer=b, imported=a)})
    assert cycles == []
