"""The toolkit's version (pyproject.toml's ``version``), importable without the package's lazy API."""

from __future__ import annotations

__version__ = "0.1.0"
