"""The JAX runtime: ggml ops as JAX kernels, one compiled executable per split, real execution.

Importing this package imports JAX; nothing in the pure core imports it. A
:class:`toolkit.context.Context` plans; these functions run it (any
:class:`~toolkit.context.RunnableContext`):

- :func:`decode(ctx, tokens) <toolkit.jaxrt.runtime.decode>` → logits ``[n_tokens, n_vocab]``
  (``seq_id=`` a sequence of a multi-sequence context, ``last_only=`` the last row);
  :func:`generate(ctx, prompt_ids, n) <toolkit.jaxrt.runtime.generate>` → greedy token ids;
  :func:`compile_splits(ctx)` → compiled / cache hit and compile ms per split, recorded as a
  :class:`~toolkit.reuse.CompileEvent` of the context;
  :func:`load_weights(ctx, path)` → attach a GGUF file's weights to a context;
  :func:`engine(ctx) <toolkit.jaxrt.runtime.engine>` → the context's :class:`~toolkit.jaxrt.runtime.Engine`
  (its KV cache, ``n_past``, ``clear()``, and a log of each ubatch's splits).
- :func:`make_backends("sim:2") <toolkit.jaxrt.devices.make_backends>` → backends bound to JAX devices.
- :class:`~toolkit.jaxrt.runtime.Engine` and :class:`~toolkit.jaxrt.execute.Runtime` for graphs built
  without a context; :mod:`~toolkit.jaxrt.kernels` for the ops themselves.

``toolkit.decode``, ``toolkit.generate`` and ``toolkit.compile_splits`` are the same functions.
"""

from __future__ import annotations

from toolkit.jaxrt.compile import CompileCache, default_cache, enable_persistent_cache
from toolkit.jaxrt.devices import configure_cpu_devices, make_backends, request_cpu_devices
from toolkit.jaxrt.execute import GraphRunner, Runtime, SplitSpec
from toolkit.jaxrt.runtime import (
    Engine,
    bind_executors,
    compile_splits,
    decode,
    engine,
    generate,
    init_random_weights,
    load_weights,
)

__all__ = [
    "CompileCache", "Engine", "GraphRunner", "Runtime", "SplitSpec", "bind_executors", "compile_splits",
    "configure_cpu_devices", "decode", "default_cache", "enable_persistent_cache", "engine", "generate",
    "init_random_weights", "load_weights", "make_backends", "request_cpu_devices",
]
