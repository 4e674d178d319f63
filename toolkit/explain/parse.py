"""The lines of a llama.cpp start-up log, read into plain records (no model, no context yet).

Each number keeps the 1-based line it came from (:class:`Logged`), so a comparison can cite it.
Lines the reader does not know are kept in ``ParsedLog.unknown`` (reported, not guessed from).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.errors import LogError

# llama.cpp's log prefix (--log-prefix / --log-timestamps): "0.00.123.456 I "
_PREFIX = re.compile(r"^(?:\d+\.\d+\.\d+\.\d+ )?(?:[IWEDT] )?")
_MIB = r"\s*([\d.]+) MiB(?: \((\d+) bytes\))?"
_RE = {
    "loaded": re.compile(r"^llama_model_loader: loaded meta data with (\d+) key-value pairs and (\d+) tensors "
                         r"from (.+?) \(version"),
    "kv": re.compile(r"^llama_model_loader: - kv\s+(\d+):\s+(\S+)\s+(\S+)\s+= ?(.*)$"),
    "type": re.compile(r"^llama_model_loader: - type\s+(\S+):\s+(\d+) tensors"),
    "print_info": re.compile(r"^print_info: ([^=]+?)\s*= ?(.*)$"),
    "device": re.compile(r"using device (\w+?)(\d+) \(([^)]*)\).*?- (\d+) MiB free"),
    "assigned": re.compile(r"^load_tensors: layer\s+(\d+) assigned to device (\S+), is_swa = (\d)"),
    "offloaded": re.compile(r"^load_tensors: offloaded (\d+)/(\d+) layers to GPU"),
    "load_mode": re.compile(r"^load_tensors: loading model tensors.*\(load_mode = (\w+)\)"),
    "override": re.compile(r"^tensor (\S+) \((\d+) MiB (\S+)\) buffer type overridden to (\S+)(?: \((\d+) bytes\))?"),
    "model_buf": re.compile(r"^load_tensors:\s+(\S+) model buffer size =" + _MIB),
    "output_buf": re.compile(r"^llama_context:\s+(\S+)\s+output buffer size =" + _MIB),
    "kv_buf": re.compile(r"^llama_kv_cache:\s+(\S+) KV buffer size =" + _MIB),
    "rs_buf": re.compile(r"^llama_memory_recurrent:\s+(\S+) RS buffer size =" + _MIB),
    "kv_size": re.compile(r"^llama_kv_cache: size =\s*[\d.]+ MiB \(\s*(\d+) cells,\s*(\d+) layers,\s*(\d+)/(\d+) "
                          r"seqs\), K \((\w+)\):.*V \((\w+)\)"),
    "kv_layer": re.compile(r"^llama_kv_cache: layer\s+(\d+): dev = (\S+)"),
    "cparam": re.compile(r"^llama_context: (\w+)\s+= (\S+)$"),
    "compute_buf": re.compile(r"^sched_reserve:\s+(\S+) compute buffer size =" + _MIB),
    "nodes": re.compile(r"^sched_reserve: graph nodes\s+= (\d+)(?: \(with bs=\d+\), (\d+) \(with bs=1\))?"),
    "splits": re.compile(r"^sched_reserve: graph splits = (\d+)(?: \(with bs=\d+\), (\d+) \(with bs=1\))?"),
    "copies": re.compile(r"^sched_reserve: .*sched copies = (\d+)"),
    "max_nodes": re.compile(r"^sched_reserve: max_nodes = (\d+)"),
    "build": re.compile(r"^(?:main: )?build(?::| =) (\d+) \((\w+)\)"),
    "breakdown": re.compile(r"^common_memory_breakdown_print: (\|.*\|)\s*$"),
    "fit": re.compile(r"^(?:common_)?(?:llama_)?(?:params_)?fit\w*: (.*)$"),
}
# the lines llama.cpp prints that say something this reader uses; their absence is an error
_REQUIRED = (
    ("loaded", "llama_model_loader: loaded meta data with … tensors"),
    ("kv", "llama_model_loader: - kv … general.architecture"),
    ("print_info", "print_info: arch = …"),
    ("model_buf", "load_tensors: … model buffer size = …"),
    ("cparam", "llama_context: n_ctx = …"),
    ("compute_buf", "sched_reserve: … compute buffer size = …"),
    ("nodes", "sched_reserve: graph nodes = …"),
    ("splits", "sched_reserve: graph splits = …"),
)


@dataclass(frozen=True)
class Logged:
    """One number of the log: its value (bytes or a count), the text of its line and the line number.
    ``exact`` is False for a size the log printed only in MiB (two decimals)."""

    value: int
    line: int
    text: str
    exact: bool = True


@dataclass(frozen=True)
class LoggedBuffer:
    """One buffer size the log printed, as plain data for a reference mark: ``group`` (model, output,
    KV, RS or compute, the memory groups of a ReserveEvent), ``buft`` (the buffer type's name as
    llama.cpp printed it), ``nbytes`` and the 1-based ``line``; ``exact`` as in :class:`Logged`."""

    group: str
    buft: str
    nbytes: int
    line: int
    exact: bool = True


@dataclass
class ParsedLog:
    """What a start-up log says, line by line (see the module docstring)."""

    source: str
    n_lines: int = 0
    build: str | None = None
    n_kv: int = 0
    n_tensors: int = 0
    model_path: str = ""
    kv: dict[str, tuple[str, str, int]] = field(default_factory=dict)   # key -> (type, value text, line)
    type_counts: dict[str, int] = field(default_factory=dict)
    print_info: dict[str, tuple[str, int]] = field(default_factory=dict)
    devices: list[tuple[str, int, str, int]] = field(default_factory=list)  # (kind, index, description, MiB free)
    layer_devices: dict[int, str] = field(default_factory=dict)
    offloaded: tuple[int, int] | None = None
    load_mode: str | None = None
    overrides: list[tuple[str, str, Logged]] = field(default_factory=list)  # (tensor, buft, bytes)
    model_buffers: dict[str, Logged] = field(default_factory=dict)
    output_buffers: dict[str, Logged] = field(default_factory=dict)
    kv_buffers: list[dict[str, Logged]] = field(default_factory=list)       # one dict per cache, log order
    rs_buffers: dict[str, Logged] = field(default_factory=dict)
    kv_sizes: list[tuple[int, int, int, str, str, Logged]] = field(default_factory=list)  # cells, layers, seqs, K, V
    kv_layer_devices: dict[int, str] = field(default_factory=dict)
    cparams: dict[str, tuple[str, int]] = field(default_factory=dict)
    compute_buffers: dict[str, Logged] = field(default_factory=dict)
    graph_nodes: tuple[Logged, Logged] | None = None     # (pp, tg)
    graph_splits: tuple[Logged, Logged] | None = None
    n_copies: Logged | None = None
    max_nodes: Logged | None = None
    pipeline_parallel: bool = False
    # create_tensor: token_embd.weight loaded a second time (the output falls back to it); None: no such lines
    tied_output: bool | None = None
    op_offload: bool | None = None   # only instrumented builds print it
    breakdown: list[str] = field(default_factory=list)
    fit_lines: list[str] = field(default_factory=list)
    unknown: list[int] = field(default_factory=list)

    def buffers(self) -> list[LoggedBuffer]:
        """Every buffer size the log printed (``load_tensors``, ``llama_context``, ``llama_kv_cache``,
        ``llama_memory_recurrent``, ``sched_reserve``), in that order."""
        groups: list[tuple[str, dict[str, Logged]]] = [("model", self.model_buffers),
                                                       ("output", self.output_buffers)]
        groups += [("KV", kv) for kv in self.kv_buffers]
        groups += [("RS", self.rs_buffers), ("compute", self.compute_buffers)]
        return [LoggedBuffer(g, buft, lg.value, lg.line, lg.exact) for g, bufs in groups for buft, lg in bufs.items()]

    def first_line(self, kind: str) -> bool:
        return bool({
            "loaded": self.n_tensors, "kv": "general.architecture" in self.kv,
            "print_info": "arch" in self.print_info, "model_buf": self.model_buffers,
            "cparam": "n_ctx" in self.cparams, "compute_buf": self.compute_buffers,
            "nodes": self.graph_nodes, "splits": self.graph_splits}[kind])


def _mib(m: re.Match[str], g: int, line: int, text: str) -> Logged:
    exact = m.group(g + 1)
    if exact is not None:
        return Logged(int(exact), line, text)
    return Logged(round(float(m.group(g)) * 2**20), line, text, exact=False)


def read_text(text_or_path: str | Path) -> tuple[str, str]:
    """``(source name, text)``: a path that exists is read, any other string is the log itself."""
    if isinstance(text_or_path, Path) or ("\n" not in text_or_path and len(text_or_path) < 4096
                                          and Path(text_or_path).is_file()):
        p = Path(text_or_path)
        return str(p), p.read_text(encoding="utf-8", errors="replace")
    return "<log>", text_or_path


def parse_log(text_or_path: str | Path) -> ParsedLog:
    """Read a start-up log (its text or a path). Raises :class:`~toolkit.errors.LogError` naming the
    first line llama.cpp prints at start-up that the log lacks (another program's text, a log cut in
    the middle, a log without its ``print_info`` block)."""
    source, text = read_text(text_or_path)
    p = ParsedLog(source)
    token_embd_loads = 0
    lines = text.splitlines()
    p.n_lines = len(lines)
    for i, raw in enumerate(lines, 1):
        s = _PREFIX.sub("", raw.rstrip())
        if not s:
            continue
        if s.startswith("create_tensor: loading tensor token_embd.weight"):
            token_embd_loads += 1
            continue
        if "pipeline parallelism enabled" in s:
            p.pipeline_parallel = True
            continue
        m = re.search(r"ORACLE summary .*op_offload=(\d)", s)
        if m:
            p.op_offload = m.group(1) == "1"
        matched = False
        for kind, rx in _RE.items():
            m = rx.search(s) if kind == "device" else rx.match(s)
            if m is None:
                continue
            matched = True
            _take(p, kind, m, i, s)
            break
        if not matched:
            p.unknown.append(i)
    p.tied_output = token_embd_loads >= 2 if token_embd_loads else None
    if not any(p.first_line(k) for k, _ in _REQUIRED):
        raise LogError(source, "llama_model_loader:, print_info:, llama_context:, sched_reserve: lines",
                       "not a llama.cpp start-up log: none of the lines llama.cpp prints at start-up is in it")
    for kind, what in _REQUIRED:
        if not p.first_line(kind):
            raise LogError(source, what, "the log lacks a line llama.cpp prints at start-up "
                           "(a log cut in the middle, or a block removed)")
    return p


def _take(p: ParsedLog, kind: str, m: re.Match[str], i: int, s: str) -> None:  # noqa: C901 (one branch a line kind)
    if kind == "loaded":
        p.n_kv, p.n_tensors, p.model_path = int(m.group(1)), int(m.group(2)), m.group(3)
    elif kind == "kv":
        p.kv[m.group(2)] = (m.group(3), m.group(4), i)
    elif kind == "type":
        p.type_counts[m.group(1)] = int(m.group(2))
    elif kind == "print_info":
        p.print_info.setdefault(m.group(1).strip(), (m.group(2).strip(), i))
    elif kind == "device":
        p.devices.append((m.group(1), int(m.group(2)), m.group(3), int(m.group(4))))
    elif kind == "assigned":
        p.layer_devices[int(m.group(1))] = m.group(2)
    elif kind == "offloaded":
        p.offloaded = (int(m.group(1)), int(m.group(2)))
    elif kind == "load_mode":
        p.load_mode = m.group(1)
    elif kind == "override":
        b = m.group(5)
        size = Logged(int(b) if b else int(m.group(2)) * 2**20, i, s, b is not None)
        p.overrides.append((m.group(1), m.group(4), size))
    elif kind == "model_buf":
        # a split model logs one CPU_Mapped line per file (create_backend_buffers): summed per buffer
        # type, as memory_breakdown sums them
        got, prev = _mib(m, 2, i, s), p.model_buffers.get(m.group(1))
        p.model_buffers[m.group(1)] = got if prev is None else Logged(
            prev.value + got.value, got.line, got.text, prev.exact and got.exact)
    elif kind == "output_buf":
        p.output_buffers[m.group(1)] = _mib(m, 2, i, s)
    elif kind == "kv_buf":
        if not p.kv_buffers or len(p.kv_buffers) <= len(p.kv_sizes) or m.group(1) in p.kv_buffers[-1]:
            p.kv_buffers.append({})
        p.kv_buffers[-1][m.group(1)] = _mib(m, 2, i, s)
    elif kind == "rs_buf":
        p.rs_buffers[m.group(1)] = _mib(m, 2, i, s)
    elif kind == "kv_size":
        p.kv_sizes.append((int(m.group(1)), int(m.group(2)), int(m.group(4)), m.group(5), m.group(6),
                           Logged(int(m.group(1)), i, s)))
    elif kind == "kv_layer":
        p.kv_layer_devices.setdefault(int(m.group(1)), m.group(2))
    elif kind == "cparam":
        p.cparams.setdefault(m.group(1), (m.group(2), i))
    elif kind == "compute_buf":
        p.compute_buffers[m.group(1)] = _mib(m, 2, i, s)
    elif kind in ("nodes", "splits"):
        pp = Logged(int(m.group(1)), i, s)
        tg = Logged(int(m.group(2)), i, s) if m.group(2) else pp
        if kind == "nodes":
            p.graph_nodes = (pp, tg)
        else:
            p.graph_splits = (pp, tg)
    elif kind == "copies":
        p.n_copies = Logged(int(m.group(1)), i, s)
    elif kind == "max_nodes":
        p.max_nodes = Logged(int(m.group(1)), i, s)
    elif kind == "build":
        p.build = f"b{m.group(1)} ({m.group(2)})"
    elif kind == "breakdown":
        p.breakdown.append(m.group(1))
    elif kind == "fit":
        p.fit_lines.append(s)


__all__ = ["Logged", "LoggedBuffer", "ParsedLog", "parse_log", "read_text"]
