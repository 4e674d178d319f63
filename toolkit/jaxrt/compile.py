"""One split = one XLA executable, compiled ahead of time for its backend's device.

A :class:`SplitProgram` is a split's nodes plus the base tensors it reads (inputs) and the
ones later splits, the caller or the KV cache need (outputs). Its *signature* describes the
computation by position only (ops, types, shapes, strides, offsets, op params, wiring), so
a rebuilt scheduler that produces an identical split hits the cache; the cache key is
(signature, device). The cache is an LRU of bounded size: executables of dropped schedulers
are released once evicted. The persistent XLA cache (on by default) makes a recompile of a
known signature in a new process cheap.
"""

from __future__ import annotations

import enum
import hashlib
import os
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import jax

from toolkit.ggml.tensor import Op, Tensor, is_view_op
from toolkit.jaxrt import layout
from toolkit.jaxrt.kernels import Env, writes_into_view
from toolkit.jaxrt.operands import CPU_NUMERICS, Numerics

DEFAULT_CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "toolkit", "jax")
_persistent_dir: str | None = None
_persistent_hits = 0


def _on_event(event: str, **_: Any) -> None:
    global _persistent_hits
    if event == "/jax/compilation_cache/cache_hits":
        _persistent_hits += 1


jax.monitoring.register_event_listener(_on_event)


def enable_persistent_cache(path: str | None = None) -> str | None:
    """Turn on JAX's persistent compilation cache (default ``~/.cache/toolkit/jax``).

    ``TOOLKIT_JAX_CACHE`` overrides the directory; ``TOOLKIT_JAX_CACHE=off`` disables it.
    Returns the directory in use (None when off)."""
    global _persistent_dir
    if path is None and _persistent_dir is not None:
        return _persistent_dir  # keep a directory chosen earlier (tests use a temporary one)
    env = os.environ.get("TOOLKIT_JAX_CACHE")
    if path is None and env is not None and env.lower() in ("off", "0", "none", ""):
        return None
    path = path or env or DEFAULT_CACHE_DIR
    if path == _persistent_dir:
        return path
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    # the cache skips quick compiles by default; split executables are all quick
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if _persistent_dir is not None:
        try:  # JAX opens its cache once; switching directories needs a reset
            from jax._src import compilation_cache

            compilation_cache.reset_cache()
        except Exception:  # noqa: BLE001 - the new directory then applies from the next process
            pass
    _persistent_dir = path
    return path


def base_of(t: Tensor) -> Tensor:
    return t.view_src if t.view_src is not None else t


def _param(v: object) -> str:
    if isinstance(v, enum.Enum):
        return str(v.value)
    if isinstance(v, float):
        return repr(float(v))
    return repr(v)


@dataclass
class SplitProgram:
    """The computation of one split over flat base storage."""

    nodes: list[Tensor]
    inputs: list[Tensor]          # bases read, in first-use order
    outputs: list[Tensor]         # bases written and needed afterwards
    signature: str = ""
    donate: tuple[int, ...] = ()  # inputs updated in place (KV cache): their buffers are donated
    numerics: Numerics = CPU_NUMERICS  # which way ops that ggml backends compute differently go

    @classmethod
    def build(cls, nodes: Iterable[Tensor], keep: set[Tensor] | None = None, donate: set[Tensor] | None = None,
              numerics: Numerics = CPU_NUMERICS) -> SplitProgram:
        """``keep``: bases that must be returned when this split writes them (None: all written)."""
        nodes = list(nodes)
        produced: set[Tensor] = set()
        inputs: list[Tensor] = []
        seen: set[Tensor] = set()
        written: list[Tensor] = []

        def need(t: Tensor) -> None:
            b = base_of(t)
            if b not in produced and b not in seen:
                seen.add(b)
                inputs.append(b)

        for n in nodes:
            if is_view_op(n.op) or n.op is Op.NONE:
                continue
            for s in n.srcs:
                need(s)
            if writes_into_view(n):
                b = base_of(n)
                need(b)
                if b not in written:
                    written.append(b)
            else:
                produced.add(n)
                written.append(n)
        outputs = [b for b in written if keep is None or b in keep]
        don = donate or set()
        donated = tuple(i for i, b in enumerate(inputs) if b in don and b in outputs)
        prog = cls(nodes, inputs, outputs, donate=donated, numerics=numerics)
        prog.signature = prog._signature()
        return prog

    def _signature(self) -> str:
        ref: dict[Tensor, str] = {b: f"i{k}" for k, b in enumerate(self.inputs)}
        lines = [";".join(f"i{k}:{b.type.name}:{layout.storage_units(b)}" for k, b in enumerate(self.inputs))]

        def r(t: Tensor) -> str:
            if t in ref:
                return ref[t]
            b = base_of(t)
            return f"v({ref.get(b, '?')},{t.type.name},{t.ne},{t.nb},{t.view_offs})"

        for j, n in enumerate(self.nodes):
            params = ",".join(f"{k}={_param(v)}" for k, v in sorted(n.op_params.items()))
            srcs = ",".join(r(s) if s is not None else "-" for s in n.src[:4])
            lines.append(f"{n.op.value}|{n.type.name}|{n.ne}|{n.nb}|{n.view_offs if n.view_src is not None else 0}"
                         f"|{r(n.view_src) if n.view_src is not None else ''}|{params}|{srcs}")
            ref[n] = f"n{j}"
        lines.append("out:" + ",".join(r(o) for o in self.outputs) + f"|donate:{self.donate}|{self.numerics.key()}")
        return hashlib.sha1("\n".join(lines).encode()).hexdigest()

    def function(self) -> Any:
        nodes, inputs, outputs, numerics = self.nodes, self.inputs, self.outputs, self.numerics

        def run_split(*flats: jax.Array) -> tuple[jax.Array, ...]:
            env = Env(dict(zip(inputs, flats)), numerics)
            for n in nodes:
                env.eval(n)
            return tuple(env.values[o] for o in outputs)

        return run_split

    def arg_specs(self, device: Any) -> list[jax.ShapeDtypeStruct]:
        sharding = jax.sharding.SingleDeviceSharding(device)
        return [jax.ShapeDtypeStruct((layout.storage_units(b),), layout.storage_dtype(b.type), sharding=sharding)
                for b in self.inputs]


@dataclass
class CompiledSplit:
    """An executable and what XLA says about it (None where the platform cannot answer)."""

    signature: str
    device: str
    executable: Any
    compile_ms: float
    from_disk: bool = False       # XLA loaded it from the persistent cache instead of compiling
    temp_bytes: int | None = None
    argument_bytes: int | None = None
    output_bytes: int | None = None
    flops: float | None = None
    uses: int = 0

    @staticmethod
    def analyse(compiled: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        try:
            ma = compiled.memory_analysis()
        except Exception:  # noqa: BLE001 - a platform without the analysis answers "unavailable"
            ma = None
        if ma is not None:
            out["temp_bytes"] = int(ma.temp_size_in_bytes)
            out["argument_bytes"] = int(ma.argument_size_in_bytes)
            out["output_bytes"] = int(ma.output_size_in_bytes)
        try:
            ca = compiled.cost_analysis()
        except Exception:  # noqa: BLE001
            ca = None
        if isinstance(ca, list):
            ca = ca[0] if ca else None
        if ca and "flops" in ca:
            out["flops"] = float(ca["flops"])
        return out


def device_key(device: Any) -> str:
    return f"{device.platform}:{device.id}:p{getattr(device, 'process_index', 0)}"


@dataclass
class CompileCache:
    """LRU of compiled splits keyed by (signature, device); ``max_entries`` bounds memory."""

    max_entries: int = 64
    entries: OrderedDict[tuple[str, str], CompiledSplit] = field(default_factory=OrderedDict)
    hits: int = 0
    misses: int = 0
    evictions: int = 0

    def get(self, prog: SplitProgram, device: Any) -> tuple[CompiledSplit, bool]:
        """(compiled split, hit) — compiles on a miss."""
        key = (prog.signature, device_key(device))
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
            self.hits += 1
            entry.uses += 1
            return entry, True
        self.misses += 1
        t0 = time.perf_counter()
        hits0 = _persistent_hits
        jitted = jax.jit(prog.function(), donate_argnums=prog.donate)
        compiled = jitted.lower(*prog.arg_specs(device)).compile()
        ms = (time.perf_counter() - t0) * 1e3
        entry = CompiledSplit(prog.signature, key[1], compiled, ms, _persistent_hits > hits0,
                              **CompiledSplit.analyse(compiled))
        entry.uses = 1
        self.entries[key] = entry
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)
            self.evictions += 1
        return entry, False

    def clear(self) -> None:
        self.entries.clear()


_default_cache: CompileCache | None = None


def default_cache() -> CompileCache:
    global _default_cache
    if _default_cache is None:
        _default_cache = CompileCache()
    return _default_cache
