"""``python -m toolkit`` (see :mod:`toolkit.cli`)."""

from __future__ import annotations

import gc
import sys

from toolkit.cli import main

rc = main()
# the process ends here: the cyclic collector's pass at interpreter exit would only rescan what is about
# to be freed anyway (tens of milliseconds after a fit)
gc.freeze()
sys.exit(rc)
