"""Parameters as weights: pytree paths, the user's placement mapping, WEIGHTS buffers per backend.

A placement is resolved once per parameter, by its pytree path string (``"w1"``,
``"layers.0.wq"``; dict keys, sequence indices and attribute names joined by ``.``):

- ``None``: every parameter on backend 0 (the highest-priority device, like ``-ngl 999``);
- an ``int`` (a backend index; ``-1`` is the last, CPU, backend), a ``Backend`` or a JAX device
  (the backend whose executor it is): all there;
- a callable ``(path, value) -> int | Backend | None``;
- a mapping (or a sequence of pairs) from a key to an index/Backend, first match wins; a key
  is a path, a glob (``"layers.*.w?"``, ``/`` accepted for ``.``) or a predicate
  ``(path, value) -> bool``. Unmatched parameters go to backend 0.

Each backend holding weights gets one ``Buffer(backend.buft, Σ nbytes, WEIGHTS)``, as llama.cpp
allocates one model buffer per buffer type; a weight on a host buft then counts as host
memory for op offload (``ggml_backend_sched_backend_id_from_cur`` offloads only host weights).
"""

from __future__ import annotations

import fnmatch
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from toolkit.backend import Backend, Buffer
from toolkit.errors import ParameterError
from toolkit.ggml.tensor import BufferUsage, Tensor

Target = int | Backend | Any  # Any: a JAX device
Key = str | Callable[[str, Any], bool]
PlacementSpec = (
    None | int | Backend | Callable[[str, Any], Target | None] | Mapping[Key, Target] | Sequence[tuple[Key, Target]]
)


def path_str(path: Sequence[Any]) -> str:
    """``jax.tree_util`` key path → ``"layers.0.wq"``."""
    parts: list[str] = []
    for k in path:
        for attr in ("key", "idx", "name"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return ".".join(parts)


PLACEMENT_ACCEPTED = ("None, a backend index, a Backend, a callable (path, value) -> target, or a mapping "
                      "(or (pattern, target) pairs) from parameter-path patterns to targets")


def _index(target: Target, backends: Sequence[Backend], path: str) -> int:
    param = f"placement of {path!r}"
    if hasattr(target, "platform") and hasattr(target, "id"):  # a JAX device: the backend running on it
        for i, b in enumerate(backends):
            if b.executor == target:
                return i
        raise ParameterError(param, target, f"a device one of the backends runs on "
                             f"({', '.join(str(b.executor) for b in backends)})", "no backend runs on it")
    if isinstance(target, Backend):
        for i, b in enumerate(backends):
            if b is target:
                return i
        raise ParameterError(param, target.name, f"one of the backends {[b.name for b in backends]}",
                             "another backend object")
    if isinstance(target, bool) or not isinstance(target, numbers.Integral):
        raise ParameterError(param, target, "a backend index, a Backend or a JAX device")
    i = int(target)
    n = len(backends)
    if not -n <= i < n:
        raise ParameterError(param, i, f"a backend index from {-n} to {n - 1}",
                             f"backend index {i} out of range for {n} backends")
    return i % n


def _matches(key: Key, path: str, value: Any) -> bool:
    if callable(key):
        return bool(key(path, value))
    pattern = str(key).replace("/", ".")
    return path == pattern or fnmatch.fnmatchcase(path, pattern)


def resolve(spec: PlacementSpec, paths: Sequence[str], values: Sequence[Any],
            backends: Sequence[Backend]) -> list[int]:
    """The backend index of every parameter."""
    if not backends:
        raise ValueError("placing parameters needs at least one backend")
    out: list[int] = []
    for path, value in zip(paths, values, strict=True):
        target: Target | None
        if spec is None:
            target = 0
        elif isinstance(spec, (int, Backend)) and not isinstance(spec, bool):
            target = spec
        elif isinstance(spec, Mapping) or (isinstance(spec, Sequence) and not isinstance(spec, str)):
            pairs = list(spec.items()) if isinstance(spec, Mapping) else list(spec)
            if not all(isinstance(p, tuple) and len(p) == 2 for p in pairs):
                raise ParameterError("placement", spec, PLACEMENT_ACCEPTED,
                                     "a sequence must hold (pattern, target) pairs")
            target = next((t for k, t in pairs if _matches(k, path, value)), 0)
        elif callable(spec):
            target = spec(path, value)
            target = 0 if target is None else target
        else:
            raise ParameterError("placement", spec, PLACEMENT_ACCEPTED)
        out.append(_index(target, backends, path))
    return out


def place_weights(weights: Sequence[Tensor], indices: Sequence[int], backends: Sequence[Backend]) -> list[Buffer]:
    """Give every weight tensor its backend's WEIGHTS buffer (one buffer per backend used)."""
    totals: dict[int, int] = {}
    for t, i in zip(weights, indices, strict=True):
        totals[i] = totals.get(i, 0) + backends[i].buft.alloc_size(t)
    buffers = {i: Buffer(backends[i].buft, size, BufferUsage.WEIGHTS, name=f"{backends[i].name} model buffer")
               for i, size in sorted(totals.items())}
    for t, i in zip(weights, indices, strict=True):
        t.buffer = buffers[i]
    return list(buffers.values())
