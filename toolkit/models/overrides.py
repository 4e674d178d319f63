"""Tensor buffer-type overrides: ``-ot/--override-tensor``, ``--cpu-moe``, ``--n-cpu-moe`` (common/arg.cpp).

- ``-ot "REGEX=BUFT,…"``: each item names a regex and a device's default buffer type (``CPU``,
  ``CUDA0``, ``RPC0[host:port]``; ``parse_tensor_buffer_overrides``); a weight whose name the regex
  *searches* (``std::regex_search``) goes to that buft, the first matching item wins.
- ``--cpu-moe`` adds ``LLM_FFN_EXPS_REGEX`` = ``\\.ffn_(up|down|gate|gate_up)_(ch|)exps`` → CPU;
  ``--n-cpu-moe N`` adds ``blk\\.<i>`` + that regex for i = 0 … N-1 (``llm_ffn_exps_block_regex``).
- An override to ``CPU`` does not use the CPU buft directly (``llama_model::load_tensors``): it runs
  ``select_weight_buft`` over llama's CPU buffer-type list — ACCEL bufts, the first GPU's host buft
  (``CUDA_Host``), the CPU's extra (repack) buft, the CPU buft — and with mmap a device's host buft is
  replaced by the CPU buft (``CPU_Mapped``).
- Any override sets ``has_tensor_overrides``, which turns pipeline parallelism off (llama_context),
  and an override to CPU with mmap warns (llama_model_loader).

>>> rules = parse(("ffn_.*_exps=CPU",), False, 1, ["RPC0[127.0.0.1:50052]", "CPU"])
>>> [(r.pattern, r.buft) for r in rules]
[('ffn_.*_exps', 'CPU'), ('blk\\\\.0\\\\.ffn_(up|down|gate|gate_up)_(ch|)exps', 'CPU')]
>>> match(rules, "blk.1.ffn_up_exps.weight").pattern
'ffn_.*_exps'
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from toolkit.errors import ParameterError

# common/common.h: LLM_FFN_EXPS_REGEX
FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
CPU_BUFT = "CPU"
MMAP_WARNING = ("llama_model_loader: tensor overrides to CPU are used with mmap enabled - consider using "
                "--load-mode none for better performance")


def exps_block_regex(il: int) -> str:
    """``llm_ffn_exps_block_regex(il)``: the experts of layer il."""
    return rf"blk\.{il}{FFN_EXPS_REGEX}"


@dataclass(frozen=True)
class OverrideRule:
    """One ``llama_model_tensor_buft_override``: a regex and the buft name it sends matches to."""

    pattern: str
    buft: str
    regex: re.Pattern[str]


@dataclass(frozen=True)
class TensorOverride:
    """A weight moved by an override, as llama_model_loader logs it (``buffer type overridden to``)."""

    tensor: str
    type: str
    buft: str          # the buft select_weight_buft chose (before the mmap rule replaces a host buft)
    bytes: int
    pattern: str

    def to_dict(self) -> dict[str, object]:
        return {"tensor": self.tensor, "type": self.type, "buft": self.buft, "bytes": self.bytes}


def _compile(param: str, pattern: str, raw: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as e:
        raise ParameterError(param, raw, "REGEX=BUFT with a valid regular expression", str(e)) from None


def _items(override_tensor: Sequence[str]) -> list[tuple[str, str, str]]:
    out = []
    for raw in override_tensor:
        for item in str(raw).split(","):
            pattern, eq, buft = item.partition("=")
            if not eq or not pattern or not buft:
                raise ParameterError("override_tensor", item, "REGEX=BUFT items separated by ','")
            out.append((item, pattern, buft))
    return out


def check_items(override_tensor: Sequence[str]) -> None:
    """The syntax and the regexes of ``-ot`` items (what can be checked before the devices exist)."""
    for item, pattern, _ in _items(override_tensor):
        _compile("override_tensor", pattern, item)


def parse(override_tensor: Sequence[str], cpu_moe: bool, n_cpu_moe: int, known_bufts: Sequence[str],
          n_layer: int | None = None) -> list[OverrideRule]:
    """The override list in llama.cpp's order: ``-ot`` items, then ``--cpu-moe``, then ``--n-cpu-moe``.

    ``known_bufts`` are the default buft names of the devices (and ``CPU``); anything else is refused.
    With ``n_layer``, ``--n-cpu-moe`` patterns stop at the model's last layer (common's loop writes
    one ``blk.i`` pattern per i < N; those beyond the model match no tensor).
    """
    rules: list[OverrideRule] = []
    for item, pattern, buft in _items(override_tensor):
        if buft not in known_bufts:
            raise ParameterError("override_tensor", item, f"a buffer type among {', '.join(known_bufts)}",
                                 f"unknown buffer type {buft!r}")
        rules.append(OverrideRule(pattern, buft, _compile("override_tensor", pattern, item)))
    if not isinstance(cpu_moe, bool):
        raise ParameterError("cpu_moe", cpu_moe, "True or False")
    if cpu_moe:
        rules.append(OverrideRule(FFN_EXPS_REGEX, CPU_BUFT, re.compile(FFN_EXPS_REGEX)))
    if not isinstance(n_cpu_moe, int) or isinstance(n_cpu_moe, bool) or n_cpu_moe < 0:
        raise ParameterError("n_cpu_moe", n_cpu_moe, "an integer >= 0")
    for il in range(n_cpu_moe if n_layer is None else min(n_cpu_moe, n_layer)):
        p = exps_block_regex(il)
        rules.append(OverrideRule(p, CPU_BUFT, re.compile(p)))
    return rules


def match(rules: Sequence[OverrideRule], name: str) -> OverrideRule | None:
    """The first rule whose regex is found in the tensor name (``std::regex_search``)."""
    for r in rules:
        if r.regex.search(name):
            return r
    return None


def warnings(rules: Sequence[OverrideRule], overridden: Sequence[TensorOverride], use_mmap: bool) -> list[str]:
    """llama_model_loader's warning, once, when a weight matched an override to CPU while the model is
    memory-mapped (a rule that matches no tensor, as ``--n-cpu-moe`` over a dense leading layer, warns not)."""
    to_cpu = any((r := match(rules, o.tensor)) is not None and r.buft == CPU_BUFT for o in overridden)
    return [MMAP_WARNING] if use_mmap and to_cpu else []
