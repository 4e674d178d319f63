"""The toolkit's version (pyproject.toml's ``version``), importable without the package's lazy API."""

from __future__ import annotations

__version__ = "0.1.0"
# the llama.cpp commit whose rules the toolkit follows (the one its measurements were made with)
LLAMA_CPP_COMMIT = "3f545be"
