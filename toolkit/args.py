"""llama.cpp's command-line flags (``common/arg.cpp``), parsed once for every user of them.

:func:`parse_args` turns an argument vector such as ``-m tiny -c 8192 -ngl 99 -fa on --device
sim:24G`` into a frozen :class:`LlamaArgs`; :meth:`LlamaArgs.context_params` gives the
:class:`~toolkit.models.cparams.ContextParams` the toolkit plans with. The ``plan`` and ``fit``
commands, the oracle's case files (their ``cli_args``) and the dashboard all use this one grammar.

Every bad flag or value raises :class:`~toolkit.errors.ParameterError` naming the flag, the value
and what is accepted. Booleans are explicit: switches take no value, and ``on``/``off`` values are
accepted only where llama.cpp accepts them (``-fa``, ``--fit``, ``--fit-print``).

Flags that only change what a llama.cpp program prints or samples (``-t``, ``-lv``, ``-p``, ``-n``,
``--temp``, ``-s``, log switches, …) are accepted and ignored, so a real command line parses.

>>> a = parse_args(["-m", "tiny", "-c", "8192", "-ngl", "99", "-fa", "on", "--device", "sim:24G"])
>>> a.model, a.n_ctx, a.n_gpu_layers, a.flash_attn, a.devices
('tiny', 8192, 99, 'on', ('sim:24G',))
>>> cp = a.context_params()
>>> cp.n_ctx, cp.n_gpu_layers, cp.devices
(8192, 99, ('sim:24G',))
>>> parse_args(["-fa", "maybe"])
Traceback (most recent call last):
...
toolkit.errors.ParameterError: -fa='maybe' is not accepted: expected on|off|auto (or enabled/disabled/true/false/1/0/-1)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from toolkit.errors import ParameterError
from toolkit.models import archs
from toolkit.models.cparams import DEFAULT_N_GPU_LAYERS, ContextParams
from toolkit.models.hparams import HParams
from toolkit.validate import INT32_MAX

# common/arg.cpp: is_truthy / is_falsey / is_autoy
_TRUE = ("on", "enabled", "true", "1")
_FALSE = ("off", "disabled", "false", "0")
_AUTO = ("auto", "-1")
# the KV cache types common/arg.cpp accepts for -ctk / -ctv (kv_cache_types)
KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
SPLIT_MODES = ("none", "layer", "row")
N_GPU_LAYERS_AUTO = -1     # -ngl auto (the default): --fit may change it
N_GPU_LAYERS_ALL = -2      # -ngl all: every layer, and it counts as set by the user
DEFAULT_FIT_TARGET_MIB = 1024
DEFAULT_FIT_CTX = 4096


@dataclass(frozen=True)
class LlamaArgs:
    """What a llama.cpp command line sets (``common_params``), before any fitting.

    ``n_gpu_layers`` keeps llama.cpp's encoding: -1 auto (unset), -2 all, else a count.
    ``override_tensor`` holds the ``-ot`` values (``REGEX=BUFT`` items), ``cpu_moe`` and ``n_cpu_moe``
    the other two override flags, as ContextParams does.
    ``devices`` are the toolkit's device strings (``--device``) followed by one ``rpc:HOST:PORT``
    per ``--rpc`` endpoint. ``set_flags`` lists the canonical flags given (``-c``, ``-ngl``, …).
    """

    model: str | None = None
    n_ctx: int = 0
    n_batch: int = 2048
    n_ubatch: int = 512
    n_parallel: int = 1
    kv_unified: bool = False
    n_gpu_layers: int = N_GPU_LAYERS_AUTO
    tensor_split: tuple[float, ...] | None = None
    split_mode: str = "layer"
    main_gpu: int = 0
    override_tensor: tuple[str, ...] = ()
    cpu_moe: bool = False
    n_cpu_moe: int = 0
    flash_attn: str = "auto"
    type_k: str = "f16"
    type_v: str = "f16"
    offload_kqv: bool = True
    op_offload: bool = True
    swa_full: bool = False
    use_mmap: bool = True
    devices: tuple[str, ...] = ()
    fit: bool = True
    fit_target_mib: tuple[int, ...] = (DEFAULT_FIT_TARGET_MIB,)
    fit_ctx: int = DEFAULT_FIT_CTX
    fit_print: bool = False
    force_pipeline_parallel: bool = False
    device_memory: tuple[int, ...] = ()   # --device-memory: free (= total) bytes per model device
    host_memory: int | None = None        # --device cpu:SIZE: the host's total memory (CPU-only fit)
    set_flags: frozenset[str] = field(default_factory=frozenset)

    @property
    def has_tensor_overrides(self) -> bool:
        """Any -ot / --cpu-moe / --n-cpu-moe (``common_fit_params`` then refuses to fit layers)."""
        return bool(self.override_tensor or self.cpu_moe or self.n_cpu_moe)

    @property
    def n_gpu_layers_set(self) -> bool:
        """-ngl given as a count or ``all`` (``common_fit_params`` then refuses to fit layers)."""
        return self.n_gpu_layers != N_GPU_LAYERS_AUTO

    def context_params(self, **changes: Any) -> ContextParams:
        """The ContextParams these flags give (auto/all -ngl offload every layer, as libllama does)."""
        ngl = DEFAULT_N_GPU_LAYERS if self.n_gpu_layers < 0 else self.n_gpu_layers
        cp = ContextParams(
            n_ctx=self.n_ctx, n_batch=self.n_batch, n_ubatch=self.n_ubatch, n_seq_max=self.n_parallel,
            flash_attn=self.flash_attn, type_k=self.type_k, type_v=self.type_v,  # type: ignore[arg-type]
            kv_unified=self.kv_unified, offload_kqv=self.offload_kqv, op_offload=self.op_offload,
            n_gpu_layers=ngl, split_mode=self.split_mode, main_gpu=self.main_gpu,  # type: ignore[arg-type]
            tensor_split=self.tensor_split, devices=self.devices, use_mmap=self.use_mmap,
            force_pipeline_parallel=self.force_pipeline_parallel, override_tensor=self.override_tensor,
            cpu_moe=self.cpu_moe, n_cpu_moe=self.n_cpu_moe, swa_full=self.swa_full,
        )
        return cp.replace(**changes) if changes else cp

    def replace(self, **changes: Any) -> LlamaArgs:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["set_flags"] = sorted(self.set_flags)
        return out


# ---- value parsers ------------------------------------------------------------------------------

def _int(flag: str, raw: str, lo: int | None = None) -> int:
    # common/arg.cpp reads numbers with std::stoi: an int32, out of range otherwise
    accepted = f"an integer from {lo if lo is not None else -INT32_MAX - 1} to {INT32_MAX}"
    try:
        v = int(raw)
    except ValueError:
        raise ParameterError(flag, raw, accepted) from None
    if (lo is not None and v < lo) or not -INT32_MAX - 1 <= v <= INT32_MAX:
        raise ParameterError(flag, raw, accepted)
    return v


def _onoff(flag: str, raw: str) -> bool:
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ParameterError(flag, raw, "on|off (also enabled/disabled/true/false/1/0)")


def _fa(flag: str, raw: str) -> str:
    v = raw.strip().lower()
    if v in _TRUE:
        return "on"
    if v in _FALSE:
        return "off"
    if v in _AUTO:
        return "auto"
    raise ParameterError(flag, raw, "on|off|auto (or enabled/disabled/true/false/1/0/-1)")


def _ngl(flag: str, raw: str) -> int:
    v = raw.strip().lower()
    if v == "auto":
        return N_GPU_LAYERS_AUTO
    if v == "all":
        return N_GPU_LAYERS_ALL
    try:
        n = int(v)
    except ValueError:
        raise ParameterError(flag, raw, "auto, all or a number of layers") from None
    # libllama reads any negative count as "all layers"; common keeps -1 as auto
    return n if n >= 0 or n in (N_GPU_LAYERS_AUTO, N_GPU_LAYERS_ALL) else N_GPU_LAYERS_ALL


def _split_list(raw: str) -> list[str]:
    # common/arg.cpp splits -ts and --fit-target on ',' or '/'
    return [x.strip() for x in raw.replace("/", ",").split(",")]


def _ts(flag: str, raw: str) -> tuple[float, ...]:
    out: list[float] = []
    for x in _split_list(raw):
        try:
            v = float(x)
        except ValueError:
            raise ParameterError(flag, raw, "a list of non-negative proportions such as 3,1 or 3/1") from None
        if v < 0:
            raise ParameterError(flag, raw, "a list of non-negative proportions such as 3,1 or 3/1")
        out.append(v)
    return tuple(out)


def _fit_target(flag: str, raw: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in _split_list(raw))
    except ValueError:
        raise ParameterError(flag, raw, "MiB per device such as 1024 or 1024,512") from None
    if not vals or any(v < 0 for v in vals):
        raise ParameterError(flag, raw, "MiB per device such as 1024 or 1024,512")
    return vals


def _choice(flag: str, raw: str, accepted: Sequence[str]) -> str:
    v = raw.strip().lower()
    if v not in accepted:
        raise ParameterError(flag, raw, "|".join(accepted))
    return v


def _overrides(flag: str, raw: str) -> tuple[str, ...]:
    """``-ot "regex=BUFT,regex=BUFT"`` (common/arg.cpp: parse_tensor_buffer_overrides): its items."""
    import re
    out: list[str] = []
    for item in raw.split(","):
        pat, eq, buft = item.partition("=")
        if not eq or not pat or not buft:
            raise ParameterError(flag, raw, "<tensor name pattern>=<buffer type>,... such as ffn_.*_exps=CPU")
        try:
            re.compile(pat)
        except re.error as e:
            raise ParameterError(flag, raw, "<tensor name pattern>=<buffer type> with a valid regular expression",
                                 str(e)) from None
        out.append(item)
    return tuple(out)


def _devices(flag: str, raw: str) -> tuple[str, ...]:
    from toolkit.models.devices import KNOWN_KINDS, parse_bytes
    specs = [x.strip() for x in raw.split(",") if x.strip()]
    if raw.strip().lower() == "none":
        return ()
    for s in specs:
        kind, _, arg = s.partition(":")
        if kind.lower() not in KNOWN_KINDS:
            raise ParameterError(flag, raw, f"device strings of the kinds {', '.join(KNOWN_KINDS)}, "
                                 "e.g. cuda:24G,cuda:24G")
        if arg and kind.lower() not in ("rpc",):
            try:
                parse_bytes(arg)
            except ValueError:
                raise ParameterError(flag, raw, "a memory size after the kind, e.g. sim:8G or cuda:24G") from None
    return tuple(s for s in specs if s.partition(":")[0].lower() != "cpu")


def _rpc(flag: str, raw: str) -> tuple[str, ...]:
    import re
    eps = [x.strip() for x in raw.split(",") if x.strip()]
    if not eps or not all(re.fullmatch(r"[\w.\-]+:\d+", e) for e in eps):
        raise ParameterError(flag, raw, "HOST:PORT[,HOST:PORT...]")
    return tuple(f"rpc:{e}" for e in eps)


def _memory(flag: str, raw: str) -> tuple[int, ...]:
    from toolkit.models.devices import parse_bytes
    try:
        return tuple(parse_bytes(x) for x in raw.split(","))
    except ValueError:
        raise ParameterError(flag, raw, "a memory size per model device such as 24G,24G or 1227882496") from None


def _load_mode(flag: str, raw: str) -> bool:
    v = _choice(flag, raw, ("none", "mmap", "read", "no_mmap"))
    return v == "mmap"


# ---- the flag table -----------------------------------------------------------------------------

Setter = Callable[[dict[str, Any], str, str], None]


def _set(key: str, conv: Callable[[str, str], Any]) -> Setter:
    def f(st: dict[str, Any], flag: str, raw: str) -> None:
        st[key] = conv(flag, raw)
    return f


def _const(key: str, value: Any) -> Setter:
    def f(st: dict[str, Any], flag: str, raw: str) -> None:
        del flag, raw
        st[key] = value
    return f


def _add_ot(st: dict[str, Any], flag: str, raw: str) -> None:
    st["override_tensor"] = st.get("override_tensor", ()) + _overrides(flag, raw)


def _add_devices(st: dict[str, Any], flag: str, raw: str) -> None:
    from toolkit.models.devices import parse_bytes
    st["devices_dev"] = _devices(flag, raw)
    for s in raw.split(","):
        kind, _, arg = s.strip().partition(":")
        if kind.lower() == "cpu" and arg:
            st["host_memory"] = parse_bytes(arg)


def _add_rpc(st: dict[str, Any], flag: str, raw: str) -> None:
    st["devices_rpc"] = st.get("devices_rpc", ()) + _rpc(flag, raw)


def _npl(st: dict[str, Any], flag: str, raw: str) -> None:
    # llama-batched-bench: -npl is its list of parallel sequences; the context gets the largest
    st["n_parallel"] = max(_int(flag, x, 1) for x in _split_list(raw))


# (names, takes a value, setter); the first name is the canonical one
_FLAGS: list[tuple[tuple[str, ...], bool, Setter]] = [
    (("-m", "--model"), True, _set("model", lambda f, v: v)),
    (("-c", "--ctx-size"), True, _set("n_ctx", lambda f, v: _int(f, v, 0))),
    (("-b", "--batch-size"), True, _set("n_batch", lambda f, v: _int(f, v, 1))),
    (("-ub", "--ubatch-size"), True, _set("n_ubatch", lambda f, v: _int(f, v, 1))),
    (("-np", "--parallel"), True, _set("n_parallel", lambda f, v: _int(f, v, 1))),
    (("-kvu", "--kv-unified"), False, _const("kv_unified", True)),
    (("-no-kvu", "--no-kv-unified"), False, _const("kv_unified", False)),
    (("-ngl", "--gpu-layers", "--n-gpu-layers"), True, _set("n_gpu_layers", _ngl)),
    (("-ts", "--tensor-split"), True, _set("tensor_split", _ts)),
    (("-sm", "--split-mode"), True, _set("split_mode", lambda f, v: _choice(f, v, SPLIT_MODES))),
    (("-mg", "--main-gpu"), True, _set("main_gpu", lambda f, v: _int(f, v, 0))),
    (("-ot", "--override-tensor"), True, _add_ot),
    (("-cmoe", "--cpu-moe"), False, _const("cpu_moe", True)),
    (("-ncmoe", "--n-cpu-moe"), True, _set("n_cpu_moe", lambda f, v: _int(f, v, 0))),
    (("-fa", "--flash-attn"), True, _set("flash_attn", _fa)),
    (("-ctk", "--cache-type-k"), True, _set("type_k", lambda f, v: _choice(f, v, KV_CACHE_TYPES))),
    (("-ctv", "--cache-type-v"), True, _set("type_v", lambda f, v: _choice(f, v, KV_CACHE_TYPES))),
    (("-nkvo", "--no-kv-offload"), False, _const("offload_kqv", False)),
    (("-kvo", "--kv-offload"), False, _const("offload_kqv", True)),
    (("-nopo", "--no-op-offload"), False, _const("op_offload", False)),
    (("--swa-full",), False, _const("swa_full", True)),
    (("--no-mmap",), False, _const("use_mmap", False)),
    (("--mmap",), False, _const("use_mmap", True)),
    (("-lm", "--load-mode"), True, _set("use_mmap", _load_mode)),
    (("-dev", "--device"), True, _add_devices),
    (("--rpc",), True, _add_rpc),
    (("-fit", "--fit"), True, _set("fit", _onoff)),
    (("-fitt", "--fit-target"), True, _set("fit_target_mib", _fit_target)),
    (("-fitc", "--fit-ctx"), True, _set("fit_ctx", lambda f, v: _int(f, v, 0))),
    (("-fitp", "--fit-print"), True, _set("fit_print", _onoff)),
    (("-npl",), True, _npl),
    # the toolkit's own: what each model device reports as free (= total) memory, e.g. for RPC servers
    (("--device-memory",), True, _set("device_memory", _memory)),
]
# accepted and ignored: they change what a llama.cpp program prints, samples or runs, not its memory
_IGNORED_WITH_VALUE = ("-t", "--threads", "-tb", "--threads-batch", "-lv", "--verbosity", "--log-verbosity",
                       "-n", "--n-predict", "-p", "--prompt", "-s", "--seed", "--temp", "-npp", "-ntg",
                       "--top-k", "--top-p", "--min-p", "-f", "--file")
_IGNORED_SWITCHES = ("-v", "--verbose", "--log-prefix", "--no-log-prefix", "--log-timestamps",
                     "--no-log-timestamps", "-no-cnv", "--no-conversation", "-cnv", "--conversation",
                     "--no-warmup", "--log-disable", "--log-colors")

_BY_NAME: dict[str, tuple[str, bool, Setter]] = {n: (names[0], v, s) for names, v, s in _FLAGS for n in names}
FLAG_NAMES: tuple[str, ...] = tuple(n for names, _, _ in _FLAGS for n in names)


def parse_args(argv: Sequence[str], env: Mapping[str, str] | None = None) -> LlamaArgs:
    """Parse llama.cpp flags (also ``--flag=value``); unknown flags raise ParameterError.

    ``env`` may hold the oracle's patched-build switch ``ORACLE_FORCE_PP=1`` (skip only the
    async/events capability check of the pipeline-parallel decision).
    """
    st: dict[str, Any] = {}
    given: set[str] = set()
    args = [str(a) for a in argv]
    i = 0
    while i < len(args):
        a = args[i]
        name, eq, inline = a.partition("=") if a.startswith("--") else (a, "", "")
        if name in _IGNORED_SWITCHES:
            i += 1
            continue
        if name in _IGNORED_WITH_VALUE:
            i += 1 if eq else 2
            continue
        if name not in _BY_NAME:
            raise ParameterError("argument", a, "a llama.cpp flag: " + " ".join(FLAG_NAMES))
        canon, takes, setter = _BY_NAME[name]
        if takes:
            if eq:
                raw = inline
                i += 1
            else:
                if i + 1 >= len(args):
                    raise ParameterError(name, None, "a value after the flag")
                raw = args[i + 1]
                i += 2
        else:
            if eq:
                raise ParameterError(name, inline, "no value (it is a switch)")
            raw = ""
            i += 1
        setter(st, name, raw)
        given.add(canon)
    devices = tuple(st.pop("devices_dev", ())) + tuple(st.pop("devices_rpc", ()))
    force = str((env or {}).get("ORACLE_FORCE_PP", "")).strip() not in ("", "0")
    return LlamaArgs(**st, devices=devices, force_pipeline_parallel=force, set_flags=frozenset(given))


def context_flags(cp: ContextParams) -> list[str]:
    """The flags of :func:`parse_args` that give a context's flash attention, batch sizes, sequences,
    KV cache types and KV offload (the context size and the devices are left out)."""
    fa = cp.flash_attn if isinstance(cp.flash_attn, str) else ("on" if cp.flash_attn else "off")
    out = ["-fa", fa, "-b", str(cp.n_batch), "-ub", str(cp.n_ubatch)]
    if cp.n_seq_max > 1:
        out += ["-np", str(cp.n_seq_max)]
    if cp.type_k != "f16":
        out += ["-ctk", cp.type_k]
    if cp.type_v != "f16":
        out += ["-ctv", cp.type_v]
    if not cp.offload_kqv:
        out.append("-nkvo")
    return out


def model_from_dict(d: Mapping[str, Any]) -> HParams:
    """A model description (the oracle's ``model`` dict), refusing what the toolkit cannot plan: an
    architecture that is not registered or that refuses these hyperparameters (``archs.checked``),
    a weight whose rows are not whole blocks of its type (``Architecture.weights``)."""
    hp = HParams.from_dict(d)
    archs.checked(hp).weights(hp)
    return hp


def load_model_arg(spec: str | None) -> HParams:
    """``-m``: a GGUF path (metadata only), a JSON model description, or a preset name."""
    if not spec:
        raise ParameterError("-m", spec, "a GGUF path, a .json model description or a preset name")
    if spec.endswith(".gguf"):
        from toolkit.models.gguf import hparams_from_gguf  # reads metadata only
        return hparams_from_gguf(spec)
    if spec.endswith(".json"):
        import json
        from pathlib import Path
        try:
            d = json.loads(Path(spec).read_text())
        except (OSError, ValueError) as e:
            raise ParameterError("-m", spec, "a readable JSON model description", str(e)) from None
        return model_from_dict(d.get("model", d) if isinstance(d, dict) else {})
    from toolkit.models import presets
    if spec.partition(":")[0] not in presets.PRESETS:
        raise ParameterError("-m", spec, "a GGUF path, a .json model description or a preset name: "
                             + ", ".join(presets.PRESETS) + " (name:type for another weight type)")
    try:
        return presets.get(spec)
    except ParameterError as e:     # a bad type after the colon: named as -m
        raise ParameterError("-m", spec, "a preset name with a ggml type, such as qwen3_30b_a3b:q8_0",
                             str(e)) from None


def fit_targets_bytes(args: LlamaArgs, n_devices: int) -> list[int]:
    """``--fit-target`` per device in bytes (common/arg.cpp): one value is broadcast; a list sets the
    first devices and the others keep the default of 1024 MiB."""
    t = args.fit_target_mib
    n = max(1, n_devices)
    if len(t) == 1:
        return [t[0] << 20] * n
    if len(t) > n:
        raise ParameterError("--fit-target", ",".join(map(str, t)), f"at most {n} values (one per device)")
    return [x << 20 for x in t] + [DEFAULT_FIT_TARGET_MIB << 20] * (n - len(t))


__all__ = ["KV_CACHE_TYPES", "LlamaArgs", "N_GPU_LAYERS_ALL", "N_GPU_LAYERS_AUTO",
           "fit_targets_bytes", "load_model_arg", "model_from_dict", "parse_args"]
