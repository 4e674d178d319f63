"""Type and range checks for user-facing parameters: one place, one message shape.

Each check returns the value (normalised where that is lossless, e.g. a numpy integer to ``int``)
or raises :class:`toolkit.errors.ParameterError` naming the parameter, the value and what is
accepted. Booleans are real booleans: ``"no"`` is not ``False`` and ``True`` is not ``1``.
Strings such as ``"on"``/``"off"`` are parsed only where llama.cpp's command line takes them
(:mod:`toolkit.args`).

>>> integer("n_ctx", 4096, lo=0)
4096
>>> integer("max_nodes", True, lo=1)
Traceback (most recent call last):
...
toolkit.errors.ParameterError: max_nodes=True is not accepted: expected an integer >= 1
>>> boolean("op_offload", "no")
Traceback (most recent call last):
...
toolkit.errors.ParameterError: op_offload='no' is not accepted: expected True or False
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

from toolkit.errors import ParameterError

UINT32_MAX = 2**32 - 1
INT32_MAX = 2**31 - 1


def _range_text(kind: str, lo: float | None, hi: float | None) -> str:
    if lo is not None and hi is not None:
        return f"{kind} from {lo} to {hi}"
    if lo is not None:
        return f"{kind} >= {lo}"
    if hi is not None:
        return f"{kind} <= {hi}"
    return kind


def integer(param: str, value: Any, *, lo: int | None = None, hi: int | None = None) -> int:
    """An integer (not a bool, not a float, not a string) in ``[lo, hi]``."""
    accepted = _range_text("an integer", lo, hi)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ParameterError(param, value, accepted)
    v = int(value)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ParameterError(param, value, accepted)
    return v


def optional_integer(param: str, value: Any, *, lo: int | None = None, hi: int | None = None,
                     none_means: str = "automatic") -> int | None:
    """``None`` (meaning ``none_means``) or an integer in ``[lo, hi]``."""
    if value is None:
        return None
    try:
        return integer(param, value, lo=lo, hi=hi)
    except ParameterError:
        raise ParameterError(param, value, f"None ({none_means}) or {_range_text('an integer', lo, hi)}") from None


def real(param: str, value: Any, *, lo: float | None = None, hi: float | None = None) -> float:
    """A finite real number (an int or a float, not a bool or a string) in ``[lo, hi]``."""
    accepted = _range_text("a finite number", lo, hi)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ParameterError(param, value, accepted)
    v = float(value)
    if not math.isfinite(v) or (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ParameterError(param, value, accepted)
    return v


def boolean(param: str, value: Any) -> bool:
    """``True`` or ``False`` (numpy booleans too); nothing else."""
    if isinstance(value, bool):
        return value
    if type(value).__name__ == "bool_" and type(value).__module__ == "numpy":
        return bool(value)
    raise ParameterError(param, value, "True or False")


def choice(param: str, value: Any, accepted: Iterable[str]) -> str:
    """One of the strings ``accepted`` (exact match)."""
    options = tuple(accepted)
    if not isinstance(value, str) or value not in options:
        raise ParameterError(param, value, "one of " + ", ".join(repr(o) for o in options))
    return value


def text(param: str, value: Any, *, nonempty: bool = True) -> str:
    """A string (non-empty unless ``nonempty=False``)."""
    if not isinstance(value, str) or (nonempty and not value.strip()):
        raise ParameterError(param, value, "a non-empty string" if nonempty else "a string")
    return value


def strings(param: str, value: Any) -> tuple[str, ...]:
    """A sequence of non-empty strings (a single string is not a sequence here)."""
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ParameterError(param, value, "a list or tuple of strings")
    items = tuple(value)
    for i, item in enumerate(items):
        text(f"{param}[{i}]", item)
    return items


def reals(param: str, value: Any, *, lo: float | None = None) -> tuple[float, ...]:
    """A non-empty sequence of finite numbers, each >= ``lo``."""
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ParameterError(param, value, "a list or tuple of numbers")
    items = tuple(value)
    if not items:
        raise ParameterError(param, value, "a non-empty list of numbers")
    return tuple(real(f"{param}[{i}]", x, lo=lo) for i, x in enumerate(items))
