"""Every docstring example in toolkit/ runs (``>>>`` lines are tests too)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import toolkit

# toolkit.__main__ runs the command line when imported
MODULES = ["toolkit", *sorted(m.name for m in pkgutil.walk_packages(toolkit.__path__, "toolkit.")
                              if m.name != "toolkit.__main__")]
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=FLAGS, verbose=False, report=True)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


def test_the_modules_with_examples_are_found() -> None:
    finder = doctest.DocTestFinder()
    with_examples = [n for n in MODULES if any(t.examples for t in finder.find(importlib.import_module(n)))]
    assert {"toolkit", "toolkit.context", "toolkit.reuse", "toolkit.sched.scheduler"} <= set(with_examples)
