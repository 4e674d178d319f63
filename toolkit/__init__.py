"""toolkit: see and try how llama.cpp's backend scheduler splits, sizes and reuses.

``import toolkit`` is cheap: the JAX runtime (``toolkit.jaxrt``) and the dashboard
(``toolkit.ui``) load only when used.
"""

from __future__ import annotations

__version__ = "0.1.0"
