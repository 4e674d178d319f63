"""Run a scheduled traced graph split by split, binding each node's primitive on its backend's device
(:class:`TracedGraphRunner`).

The order and the placement come from the scheduler (``ggml_backend_sched_split_graph`` pass 5): splits
in order, nodes of a split in graph order, every non-view node on its split's backend. A value needed on another
device is copied there with ``jax.device_put``, once per (tensor, backend) — ggml's one copy
per (source, destination backend) pair. View nodes (RESHAPE, PERMUTE, VIEW) alias their base
in ggml; here they are computed where their base lives, and never copied for themselves.

``mode="eager"`` binds primitive by primitive (one small XLA program per distinct primitive
and shape); ``mode="jit"`` compiles each split once as one program over its split inputs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from toolkit.ggml.tensor import Tensor, is_view_op
from toolkit.trace.nodes import Step


@dataclass(frozen=True)
class SplitRun:
    """What one split did: where, which values it copied in, how long it took."""

    index: int
    backend: str
    device: str
    i_start: int
    i_end: int
    copied: tuple[str, ...]
    copy_bytes: int
    seconds: float


@dataclass(frozen=True)
class RunReport:
    splits: tuple[SplitRun, ...]
    mode: str

    @property
    def n_copies(self) -> int:
        return sum(len(s.copied) for s in self.splits)

    @property
    def copy_bytes(self) -> int:
        return sum(s.copy_bytes for s in self.splits)

    def to_text(self) -> str:
        lines = [f"ran {len(self.splits)} splits ({self.mode}): {self.n_copies} copies, {self.copy_bytes} bytes"]
        for s in self.splits:
            inputs = ", ".join(s.copied) if s.copied else "-"
            lines.append(
                f"split {s.index:2d} {s.backend:>8s} on {s.device:<8s} nodes [{s.i_start}, {s.i_end}) "
                f"{s.seconds * 1e3:7.1f} ms  copied in: {inputs}"
            )
        return "\n".join(lines)

    __str__ = to_text


def _nbytes(x: Any) -> int:
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(v) for v in x)
    return int(getattr(x, "nbytes", 0))


class TracedGraphRunner:
    """Runs a scheduled traced graph: its nodes in graph order under a node → backend assignment and split
    ranges (the traced counterpart of :class:`toolkit.jaxrt.execute.GraphRunner`)."""

    def __init__(self, nodes: Sequence[Tensor], node_backend: Sequence[int],
                 splits: Sequence[tuple[int, int, int]], devices: Sequence[Any], names: Sequence[str],
                 mode: str = "eager") -> None:
        if mode not in ("eager", "jit"):
            raise ValueError(f"mode must be 'eager' or 'jit', got {mode!r}")
        if len(node_backend) != len(nodes):
            raise ValueError(f"{len(node_backend)} backend ids for {len(nodes)} nodes")
        self.nodes = list(nodes)
        self.node_backend = list(node_backend)
        self.splits = list(splits)
        self.devices = list(devices)
        self.names = list(names)
        self.mode = mode
        self._jitted: dict[int, Callable[..., Any]] = {}
        self._plans: dict[int, tuple[list[Tensor], list[Tensor]]] = {}
        later: dict[int, int] = {}  # tensor id -> last split index that reads it
        for k, (_, i0, i1) in enumerate(self.splits):
            for t in self.nodes[i0:i1]:
                for x in _step(t).inputs:
                    later[id(x)] = k
        self._last_reader = later

    # ---- values and copies -----------------------------------------------------------------
    def _get(self, t: Tensor, b: int, split: int, copied: list[tuple[str, int]]) -> Any:
        import jax

        key = id(t)
        home = self._home.get(key)
        if home is not None and self.devices[home] == self.devices[b]:
            return self._vals[key]
        memo = (key, b)
        if memo not in self._copies:
            value = jax.device_put(self._vals[key], self.devices[b])
            self._copies[memo] = value
            # constants and literals live wherever they are used (split_graph pass 4 gives a src leaf its
            # node's backend)
            if home is not None:
                copied.append((t.name, _nbytes(value)))
        return self._copies[memo]

    def run(self, leaf_values: dict[int, Any], leaf_homes: dict[int, int | None],
            outputs: Sequence[Tensor]) -> tuple[list[Any], RunReport]:
        self._vals: dict[int, Any] = dict(leaf_values)
        self._home: dict[int, int | None] = dict(leaf_homes)
        self._copies: dict[tuple[int, int], Any] = {}
        self._output_ids = {id(t) for t in outputs}
        runs: list[SplitRun] = []
        for k, (b, i0, i1) in enumerate(self.splits):
            t0 = time.perf_counter()
            copied: list[tuple[str, int]] = []
            if self.mode == "jit":
                self._run_split_jit(k, b, i0, i1, copied)
            else:
                for t in self.nodes[i0:i1]:
                    self._run_node(t, b, k, copied)
            runs.append(SplitRun(k, self.names[b], str(self.devices[b]), i0, i1, tuple(n for n, _ in copied),
                                 sum(s for _, s in copied), time.perf_counter() - t0))
        outs = [self._vals.get(id(t)) for t in outputs]  # constants returned as is are not in the graph
        return outs, RunReport(tuple(runs), self.mode)

    def _run_node(self, t: Tensor, b: int, k: int, copied: list[tuple[str, int]]) -> None:
        import jax

        step = _step(t)
        if is_view_op(t.op):
            # a view aliases its base (ggml_view_tensor's view_src): computed where the base lives, never copied
            base = step.inputs[0]
            self._vals[id(t)] = step.fn(self._vals[id(base)])
            self._home[id(t)] = self._home.get(id(base))
            return
        args = [self._get(x, b, k, copied) for x in step.inputs]
        with jax.default_device(self.devices[b]):
            self._vals[id(t)] = step.fn(*args)
        self._home[id(t)] = b

    # ---- one program per split -------------------------------------------------------------
    def _split_io(self, k: int, i0: int, i1: int, outputs: set[int]) -> tuple[list[Tensor], list[Tensor]]:
        if k not in self._plans:
            inside = {id(t) for t in self.nodes[i0:i1]}
            ext: list[Tensor] = []
            seen: set[int] = set()
            for t in self.nodes[i0:i1]:
                for x in _step(t).inputs:
                    if id(x) not in inside and id(x) not in seen:
                        seen.add(id(x))
                        ext.append(x)
            exports = [t for t in self.nodes[i0:i1]
                       if self._last_reader.get(id(t), -1) > k or id(t) in outputs]
            self._plans[k] = (ext, exports)
        return self._plans[k]

    def _run_split_jit(self, k: int, b: int, i0: int, i1: int, copied: list[tuple[str, int]]) -> None:
        import jax

        ext, exports = self._split_io(k, i0, i1, self._output_ids)
        args = [self._get(x, b, k, copied) for x in ext]
        if k not in self._jitted:
            nodes = self.nodes[i0:i1]

            def program(*vals: Any) -> list[Any]:
                env = {id(x): v for x, v in zip(ext, vals, strict=True)}
                for t in nodes:
                    step = _step(t)
                    env[id(t)] = step.fn(*[env[id(x)] for x in step.inputs])
                return [env[id(t)] for t in exports]

            self._jitted[k] = jax.jit(program)
        with jax.default_device(self.devices[b]):
            results = self._jitted[k](*args)
        for t, v in zip(exports, results, strict=True):
            self._vals[id(t)] = v
            self._home[id(t)] = b


def _step(t: Tensor) -> Step:
    step = t.extra
    if not isinstance(step, Step):
        raise ValueError(f"node {t.name!r} ({t.op_desc()}) was not traced from a JAX primitive")
    return step
