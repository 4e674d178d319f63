"""llama.cpp's logged numbers beside the rebuilt context's (:func:`explain`).

One :class:`Compared` per number the log printed: the model, output, KV and recurrent-state buffers
and the tensor overrides (``load_tensors`` / ``llama_context`` / ``llama_kv_cache``), the compute
buffers, graph nodes and splits (pp and tg) and the scheduler copies (``sched_reserve``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.explain.parse import Logged
from toolkit.explain.rebuild import LoggedRun, from_log
from toolkit.version import LLAMA_CPP_COMMIT

MIB = 2**20


@dataclass(frozen=True)
class Compared:
    """One logged number beside the toolkit's: ``what`` (model, output, KV, RS, override, compute,
    graph nodes, …), ``buffer`` (its buffer type or stage), ``logged`` and ``ours`` (bytes or counts)."""

    line: int
    text: str
    what: str
    buffer: str
    logged: int
    ours: int | None
    exact: bool = True   # False: the log printed MiB only; equal means equal to two decimals

    @property
    def equal(self) -> bool:
        if self.ours is None:
            return False
        if self.exact:
            return self.logged == self.ours
        return f"{self.logged / MIB:.2f}" == f"{self.ours / MIB:.2f}"

    @property
    def diff(self) -> int | None:
        return None if self.ours is None else self.ours - self.logged

    def to_dict(self) -> dict[str, Any]:
        return {"line": self.line, "text": self.text, "what": self.what, "buffer": self.buffer,
                "logged": self.logged, "ours": self.ours, "exact": self.exact, "equal": self.equal}


@dataclass
class Explanation:
    """What :func:`explain` found: every compared number, what the rebuild assumed, the context."""

    run: LoggedRun
    context: Any
    compared: list[Compared] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)

    @property
    def missing(self) -> list[str]:
        return self.run.missing

    @property
    def all_equal(self) -> bool:
        return all(c.equal for c in self.compared)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.run.log.source, "build": self.run.log.build, "toolkit_matches": LLAMA_CPP_COMMIT,
                "compared": [c.to_dict() for c in self.compared], "missing": list(self.missing),
                "causes": list(self.causes), "all_equal": self.all_equal}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def lines(self) -> list[str]:
        """The comparison as text: one line per number, then what the rebuild assumed."""
        out = [f"{self.run.log.source}: llama.cpp {self.run.log.build or '(build not printed)'}; "
               f"the toolkit follows llama.cpp {LLAMA_CPP_COMMIT}"]
        hp = self.run.hparams
        if hp.n_layer_nextn:
            # load_arch_tensors without load_mtp: the NextN/MTP blocks' tensors are TENSOR_SKIP
            blocks = ", ".join(f"blk.{il}" for il in range(hp.n_layer, hp.n_layer_all))
            out.append(f"  layers: {hp.n_layer} + {hp.n_layer_nextn} NextN/MTP ({blocks}: skipped, not loaded, "
                       "no KV or state; counted in -ngl) + output")
        for c in self.compared:
            mark = "=" if c.equal else "≠"
            d = "" if c.equal or c.diff is None else f"  ({c.diff:+d})"
            out.append(f"  line {c.line:5d}  {c.what:12s} {c.buffer:28s} logged {c.logged:>12d} {mark} "
                       f"ours {c.ours if c.ours is not None else '-':>12}{d}")
        out += [f"  assumed: {m}" for m in self.missing]
        out += [f"  could explain a difference: {c}" for c in self.causes]
        return out


def _pairs(what: str, logged: dict[str, Logged], ours: dict[str, int]) -> list[Compared]:
    return [Compared(lg.line, lg.text, what, name, lg.value, ours.get(name), lg.exact) for name, lg in logged.items()]


def compare(run: LoggedRun, ctx: Any) -> list[Compared]:
    """Every logged number beside the context's (see the module docstring)."""
    p = run.log
    out = [Compared(lg.line, lg.text, "override", t, lg.value, o.bytes, lg.exact)
           for (t, _, lg), o in zip(p.overrides, ctx.setup.model.tensor_overrides, strict=False)]
    out += _pairs("model", p.model_buffers, ctx.model_buffers_bytes)
    out += _pairs("output", p.output_buffers, ctx.output_buffer_bytes)
    caches = ctx.setup.memory.caches
    if len(p.kv_buffers) == len(caches) > 1:
        for c, logged in zip(caches, p.kv_buffers, strict=True):
            out += _pairs(f"KV {c.kind}", logged, dict(c.buffers_bytes))
    else:
        merged = {k: v for d in p.kv_buffers for k, v in d.items()}
        out += _pairs("KV", merged, ctx.kv_buffers_bytes)
    for (_cells, layers, _seqs, _k, _v, lg), c in zip(p.kv_sizes, caches, strict=False):
        out.append(Compared(lg.line, lg.text, "KV cells", c.kind, lg.value, c.kv_size))
        out.append(Compared(lg.line, lg.text, "KV layers", c.kind, layers, len(c.layers)))
    out += _pairs("compute", p.compute_buffers, ctx.compute_buffers_bytes())
    ev = ctx.events[-1]
    pp, tg = ev.graphs["pp"], ev.graphs["tg"]
    if p.graph_nodes:
        out.append(Compared(p.graph_nodes[0].line, p.graph_nodes[0].text, "graph nodes", "pp", p.graph_nodes[0].value,
                            pp.n_nodes))
        out.append(Compared(p.graph_nodes[1].line, p.graph_nodes[1].text, "graph nodes", "tg", p.graph_nodes[1].value,
                            tg.n_nodes))
    if p.graph_splits:
        out.append(Compared(p.graph_splits[0].line, p.graph_splits[0].text, "graph splits", "pp",
                            p.graph_splits[0].value, pp.n_splits))
        out.append(Compared(p.graph_splits[1].line, p.graph_splits[1].text, "graph splits", "tg",
                            p.graph_splits[1].value, tg.n_splits))
    if p.n_copies:
        out.append(Compared(p.n_copies.line, p.n_copies.text, "sched copies", "", p.n_copies.value, ev.n_copies))
    if p.max_nodes:
        out.append(Compared(p.max_nodes.line, p.max_nodes.text, "max_nodes", "", p.max_nodes.value,
                            ev.params.max_nodes))
    return out


def _causes(run: LoggedRun, compared: list[Compared]) -> list[str]:
    bad = [c for c in compared if not c.equal]
    if not bad:
        return []
    out = []
    built = f"the log is {run.log.build}" if run.log.build else "the log does not print its build number"
    out.append(f"a different llama.cpp version: {built}; the toolkit follows {LLAMA_CPP_COMMIT}")
    if run.gguf_path is None and any(c.what in ("model", "override") for c in bad):
        out.append("a weight type unknown without the file: pass the GGUF (-m / model=)")
    out += [f"a flag the log implies but does not show: {m}" for m in run.missing if "read as" in m]
    return out


def explain(text_or_path: str | Path | LoggedRun, model: str | Path | None = None) -> Explanation:
    """Rebuild the context a log describes, reserve it, and compare every logged number
    (:class:`Explanation`: ``compared``, ``missing``, ``lines()``, ``to_json()``)."""
    run = text_or_path if isinstance(text_or_path, LoggedRun) else from_log(text_or_path, model)
    ctx = run.context()
    compared = compare(run, ctx)
    return Explanation(run, ctx, compared, _causes(run, compared))


__all__ = ["Compared", "Explanation", "compare", "explain"]
