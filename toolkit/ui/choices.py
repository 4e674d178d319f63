"""What the dashboard's model and device pickers mean: presets, GGUF paths, device specs.

The device picker takes short specs: ``cpu`` (the CPU backend alone), ``rpc:N`` (N RPC-like
servers), ``sim:N`` / ``cuda:N`` (N simulated / CUDA-like accelerators), each non-RPC device
optionally with a compute memory budget in MiB (what makes the pipeline-parallel fallback
reachable: ``llama_context::sched_reserve`` retries without pipeline parallelism when the
compute buffers do not fit). They become ``ContextParams.devices`` (``toolkit.models.devices``); the CPU
backend is always added last.
"""

from __future__ import annotations

import os
import re
from typing import Any

from toolkit.context import Context
from toolkit.errors import ParameterError
from toolkit.models import HParams, presets
from toolkit.models.cparams import ContextParams
from toolkit.models.devices import DeviceSpec, describe_picker, parse_picker

# label shown in the picker -> name in toolkit.models.presets (one list, kept with the presets)
MODEL_PRESETS: dict[str, str] = presets.PRESET_LABELS
# accepted spellings of a preset name (toolkit.dashboard(model="llama3_8b") works too)
_ALIASES: dict[str, str] = {**{k: v for k, v in MODEL_PRESETS.items()}, **{v: v for v in MODEL_PRESETS.values()},
                            "8b": "llama3_8b", "70b": "llama3_70b"}

# the picker grammar lives with the devices (toolkit.models.devices); the dashboard's names for it
parse_devices = parse_picker
describe_devices = describe_picker


def preset_of(hparams: HParams) -> str | None:
    """The preset name whose shape ``hparams`` has (n_layer, n_embd, n_ff, n_vocab), if any."""
    def shape(h: HParams) -> tuple[object, ...]:
        return h.n_layer, h.n_embd, h.n_ff_arr, h.n_vocab

    for name in MODEL_PRESETS.values():
        if shape(presets.get(name)) == shape(hparams):
            return name
    return None


def preset_label(model: str) -> str | None:
    """The picker label of a preset name or alias (``llama3_8b`` -> ``Llama-3-8B-shaped``)."""
    name = _ALIASES.get(model) or _ALIASES.get(model.lower())
    return next((k for k, v in MODEL_PRESETS.items() if v == name), None)


def resolve_model(model: str) -> Any:
    """A preset name (or its label) -> HParams; anything ending in .gguf is passed on as a path."""
    if model.lower().endswith(".gguf"):
        if not os.path.exists(model):
            raise ParameterError("model", model, "a preset name or an existing .gguf file", "no such file")
        return model
    name = _ALIASES.get(model) or _ALIASES.get(model.lower())
    if name is None:
        raise ParameterError("model", model, f"one of {', '.join(MODEL_PRESETS)} or a .gguf path", "unknown model")
    return presets.get(name)


def make_context(model: str = "tiny", devices: str = "cpu", budget_mib: float | None = None,
                 planner: str = "ggml", *, max_nodes: int | None = None, parallel: bool | None = None,
                 **cparams: Any) -> Context:
    """A planning-only Context for a preset / GGUF model on the given devices (first reserve included).

    ``max_nodes``/``parallel`` override graph_max_nodes and the pipeline-parallel rule (None: llama.cpp's).
    """
    hp = resolve_model(model)
    devs = parse_devices(devices, budget_mib).cparams_devices()
    ctx = Context(hp, ContextParams(devices=devs, **cparams), planner=planner, max_nodes=max_nodes,
                  parallel=parallel)
    if not ctx.events:
        ctx.sched_reserve(trigger=f"model {model} on {devices}")
    return ctx


def parse_placement(text: str) -> Any:
    """The traced-graph placement picker: ``0`` / ``-1`` (every parameter on that backend index) or
    ``fc1.*:0, fc2.*:1`` (pytree path or glob -> backend index, first match wins; unmatched on 0)."""
    v = str(text).strip()
    if re.fullmatch(r"-?\d+", v):
        return int(v)
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in v.split(","))):
        key, sep, idx = part.rpartition(":")
        if not sep or not key.strip() or not re.fullmatch(r"\s*-?\d+\s*", idx):
            raise ParameterError("placement", text, "an index such as 0 or -1, or path:index pairs such as "
                                 "'fc1.*:0, fc2.*:1'", f"not understood at {part!r}")
        out[key.strip()] = int(idx)
    if not out:
        raise ParameterError("placement", text, "an index or path:index pairs", "empty")
    return out


def describe_placement(spec: Any) -> str:
    """The placement picker's text for a placement (inverse of :func:`parse_placement`)."""
    if spec is None:
        return "0"
    if isinstance(spec, int):
        return str(spec)
    if isinstance(spec, dict) and all(isinstance(k, str) and isinstance(i, int) for k, i in spec.items()):
        return ", ".join(f"{k}:{i}" for k, i in spec.items())
    return "custom"


__all__ = ["MODEL_PRESETS", "DeviceSpec", "describe_devices", "describe_placement", "make_context", "parse_devices",
           "parse_placement", "preset_label", "preset_of", "resolve_model"]
