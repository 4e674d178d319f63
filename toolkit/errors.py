"""The toolkit's public exceptions: one base class, typed subclasses for each kind of user error.

Every error that bad *input* can cause derives from :class:`ToolkitError` (and from
``ValueError``, so ``except ValueError`` keeps working). Anything else that escapes the toolkit is
a bug and propagates unchanged.

This module imports nothing from the toolkit: every layer may raise these.

>>> try:
...     raise ParameterError("n_ctx", -1, "an int >= 0")
... except ToolkitError as e:
...     print(e.param, e.value, "|", e)
n_ctx -1 | n_ctx=-1 is not accepted: expected an int >= 0
"""

from __future__ import annotations

from typing import Any


class ToolkitError(ValueError):
    """Base class of every error a user's input can cause (a bad value, a file, a budget).

    ``llama_text`` is, where llama.cpp refuses the same input, the message llama.cpp prints
    (the oracle comparisons read it); otherwise None.
    """

    llama_text: str | None = None


class ParameterError(ToolkitError):
    """A user-facing parameter has the wrong type or is out of range.

    ``param`` names the parameter, ``value`` is what was given, ``accepted`` says what is accepted.
    """

    def __init__(self, param: str, value: Any, accepted: str, detail: str = "", *,
                 llama_text: str | None = None) -> None:
        self.param = param
        self.value = value
        self.accepted = accepted
        self.llama_text = llama_text
        shown = repr(value) if isinstance(value, str) else str(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        extra = f" ({detail})" if detail else ""
        super().__init__(f"{param}={shown} is not accepted: expected {accepted}{extra}")


class AllocationError(ToolkitError):
    """A buffer could not be allocated: a device budget or a host-memory limit was exceeded.

    llama.cpp throws from the ``llama_context`` constructor when ``ggml_backend_sched_reserve``
    fails; the toolkit raises this instead and leaves the previous state intact.
    """


class GGUFError(ToolkitError):
    """A GGUF file is missing, truncated, not GGUF, or describes something the toolkit cannot read.

    ``path`` is the file, ``offset`` the byte offset where reading failed (or None), ``field``
    the key or structure being read.
    """

    def __init__(self, path: str, message: str, offset: int | None = None, field: str = "") -> None:
        self.path = path
        self.offset = offset
        self.field = field
        where = f" at byte {offset}" if offset is not None else ""
        what = f" reading {field}" if field else ""
        super().__init__(f"{path}{where}{what}: {message}")


class UnsupportedFeature(ToolkitError):
    """A model (preset, dict or GGUF) uses a feature the toolkit does not implement.

    It is refused rather than planned as something else; ``feature`` names what is missing.
    """

    def __init__(self, feature: str, message: str) -> None:
        self.feature = feature
        super().__init__(message)


class LogError(ToolkitError):
    """A llama.cpp log that cannot be read back: another program's text, a truncated log, a line
    the toolkit needs that is missing. ``missing`` names the line or key; ``line`` is the 1-based
    line number where reading stopped (None: the end of the log)."""

    def __init__(self, source: str, missing: str, message: str, line: int | None = None) -> None:
        self.source = source
        self.missing = missing
        self.line = line
        where = f" line {line}" if line is not None else ""
        super().__init__(f"{source}{where}: {message} (missing: {missing})")


__all__ = ["AllocationError", "GGUFError", "LogError", "ParameterError", "ToolkitError", "UnsupportedFeature"]
