"""Will it fit? llama.cpp's memory fitting (``common/fit.cpp``) over the exact predictor.

:func:`fit_params` re-implements ``common_fit_params`` → ``common_params_fit_impl`` step by step.
Each probe is :func:`probe` (``common_get_device_memory_data_impl``): a :class:`~toolkit.context.Context`
created with the probe's parameters, no memory-mapped weights (``LLAMA_LOAD_MODE_NONE``), read as
``llama_get_memory_breakdown`` with the compute buffers of the first pp reserve only (what
``ggml_backend_sched_reserve_size`` reports under ``no_alloc``).

1. If every device keeps its margin (``--fit-target``), nothing changes.
2. An unset context (``-c 0``) is shrunk by linear interpolation between ``--fit-ctx`` and the
   training context, rounded down to a multiple of 256 · n_streams.
3. A user ``-ngl``, ``-ts`` (several devices), ``-sm row`` or ``-ot`` stops here (the context
   reduction stays, because llama.cpp edits the parameters in place).
4. Layers are filled onto the devices from the last one backwards, with a false-position search
   on the layer count per device.
5. Mixture-of-experts models: experts go to the CPU first, then full layers come back front to
   back, with partial-layer overflow patterns (``ATTN``/``UP``/``GATE``/``MOE``).

The result (:class:`FitResult`) is plain frozen data: every probe with its parameters and memory
per device, the chosen ``-c/-ngl/-ts/-ot``, llama.cpp's log lines, the printed command line of
``llama-fit-params`` and, beyond llama.cpp, :func:`real_run`: the fitted parameters planned with
the full reserve sequence (pp → tg → pp, with the pipeline-parallel fallback) next to the
estimate, per device. ``exact=True`` runs the same search on those full-reserve sizes.
"""

from __future__ import annotations

from toolkit.fit.impl import (
    LAYER_FRACTION_ATTN,
    LAYER_FRACTION_GATE,
    LAYER_FRACTION_MOE,
    LAYER_FRACTION_UP,
    LayerCount,
    fit_params,
    fit_print,
    overflow_pattern,
    set_ngl_tensor_split_tbo,
)
from toolkit.fit.probe import Probe, ProbeParams, default_split, probe
from toolkit.fit.real import DeviceCheck, RealRun, real_run, run_params
from toolkit.fit.result import FitImpossible, FitPrint, FitResult, Fitted

__all__ = ["LAYER_FRACTION_ATTN", "LAYER_FRACTION_GATE", "LAYER_FRACTION_MOE", "LAYER_FRACTION_UP", "DeviceCheck",
           "FitImpossible", "FitPrint", "FitResult", "Fitted", "LayerCount", "Probe", "ProbeParams", "RealRun",
           "default_split", "fit_params", "fit_print", "overflow_pattern", "probe", "real_run", "run_params",
           "set_ngl_tensor_split_tbo"]
