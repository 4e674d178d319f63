"""``python -m toolkit`` (see :mod:`toolkit.cli`)."""

from __future__ import annotations

import sys

from toolkit.cli import main

sys.exit(main())
