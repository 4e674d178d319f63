"""The JAX runtime: ggml ops as JAX kernels, one compiled executable per split, real execution.

Importing this package imports JAX; nothing in the pure core imports it. A
:class:`toolkit.context.Context` plans; these functions run it (any
:class:`~toolkit.context.RunnableContext`):

- :func:`decode(ctx, tokens) <toolkit.jaxrt.runtime.decode>` → logits ``[n_tokens, n_vocab]`` (``tokens``: ids, or
  a text for the GGUF file's own tokenizer)
  (``seq_id=`` a sequence of a multi-sequence context, ``last_only=`` the last row);
  :func:`generate(ctx, prompt_ids, n) <toolkit.jaxrt.runtime.generate>` → greedy token ids;
  :func:`compile_splits(ctx)` → compiled / cache hit and compile ms per split, recorded as a
  :class:`~toolkit.reuse.CompileEvent` of the context;
  :func:`load_weights(ctx, path)` → attach a GGUF file's weights to a context.
- :func:`make_backends("sim:2") <toolkit.jaxrt.devices.make_backends>` → backends bound to JAX devices.
- :func:`runtime_of(ctx) <toolkit.jaxrt.runtime.runtime_of>` → the context's
  :class:`~toolkit.jaxrt.runtime.ContextRuntime` (its weights and KV cache on the devices, ``n_past``,
  ``clear()``, the decode loop, the log of each ubatch's splits); ``runtime_of(ctx, Numerics(gelu_f16_table=False))``
  runs the ops ggml backends compute differently the GPU backends' way instead of ggml-cpu's
  (:class:`~toolkit.jaxrt.operands.Numerics`).
- :class:`~toolkit.jaxrt.execute.GraphRunner` runs any scheduled graph's splits, also graphs built
  without a context; :data:`~toolkit.jaxrt.kernels.KERNELS` is the table of the ops themselves.

``toolkit.decode``, ``toolkit.generate`` and ``toolkit.compile_splits`` are the same functions.
"""

from __future__ import annotations

from toolkit.jaxrt.compile import CompileCache, default_cache, enable_persistent_cache
from toolkit.jaxrt.devices import configure_cpu_devices, make_backends, request_cpu_devices
from toolkit.jaxrt.execute import GraphRunner, SplitSpec
from toolkit.jaxrt.operands import CPU_NUMERICS, Numerics
from toolkit.jaxrt.runtime import (
    ContextRuntime,
    bind_executors,
    compile_splits,
    decode,
    generate,
    init_random_weights,
    load_weights,
    runtime_of,
)

__all__ = [
    "CPU_NUMERICS", "CompileCache", "ContextRuntime", "GraphRunner", "Numerics", "SplitSpec", "bind_executors",
    "compile_splits",
    "configure_cpu_devices", "decode", "default_cache", "enable_persistent_cache", "generate",
    "init_random_weights", "load_weights", "make_backends", "request_cpu_devices", "runtime_of",
]
