"""The recurrent layers' hyperparameters (``llama_hparams``' ``ssm_*``, ``n_shortconv_l_cache`` and
``is_recr``), one frozen record on :class:`~toolkit.models.hparams.HParams`.

A hybrid model (Qwen3.5/3.6's gated delta net, LFM2's short convolution) keeps a recurrent state
per sequence in its recurrent layers instead of a KV cache: a convolution state ``r`` of
``n_embd_r`` values and an SSM state ``s`` of ``n_embd_s`` values
(``llama_hparams::n_embd_r`` / ``n_embd_s``):

>>> p = RecurrentParams(layers=(True, True, True, False), d_conv=4, d_inner=128, d_state=32, dt_rank=4, n_group=2)
>>> p.n_embd_r(128), p.n_embd_s(), p.recurrent_layers
(768, 4096, (0, 1, 2))
>>> RecurrentParams(layers=(True, False), shortconv_l_cache=3).n_embd_r(128)
256
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolkit.errors import ToolkitError


@dataclass(frozen=True)
class RecurrentParams:
    """Which layers are recurrent (``is_recr``) and the sizes of their state.

    ``d_conv`` / ``d_inner`` / ``d_state`` / ``dt_rank`` / ``n_group`` are ``ssm.conv_kernel``,
    ``ssm.inner_size``, ``ssm.state_size``, ``ssm.time_step_rank``, ``ssm.group_count`` (the gated
    delta net: ``n_group`` K heads and ``dt_rank`` V heads of ``d_state``); ``shortconv_l_cache`` is
    LFM2's ``shortconv.l_cache`` (0: none)."""

    layers: tuple[bool, ...]
    d_conv: int = 0
    d_inner: int = 0
    d_state: int = 0
    dt_rank: int = 0
    n_group: int = 0
    shortconv_l_cache: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(bool(x) for x in self.layers))
        for f in ("d_conv", "d_inner", "d_state", "dt_rank", "n_group", "shortconv_l_cache"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ToolkitError(f"recurrent {f}={v!r} must be an integer >= 0")
        if not any(self.layers):
            raise ToolkitError("a recurrent model needs at least one recurrent layer")
        if self.shortconv_l_cache == 1:
            raise ToolkitError("shortconv.l_cache must be > 1 (llama.cpp asserts n_shortconv_l_cache > 1)")
        if self.d_state and (not self.dt_rank or self.d_inner % self.dt_rank or not self.n_group
                             or self.dt_rank % self.n_group):
            raise ToolkitError(f"ssm sizes do not fit: inner {self.d_inner}, state {self.d_state}, "
                               f"time_step_rank {self.dt_rank}, group_count {self.n_group} (the V heads "
                               "must divide the inner size and be a multiple of the groups)")

    def is_recr(self, il: int) -> bool:
        return il < len(self.layers) and self.layers[il]

    @property
    def recurrent_layers(self) -> tuple[int, ...]:
        return tuple(il for il, r in enumerate(self.layers) if r)

    def n_embd_r(self, n_embd: int) -> int:
        """``llama_hparams::n_embd_r``: the short convolution's ``n_embd * (l_cache - 1)``, else the
        conv state ``(d_conv - 1) * (d_inner + 2 * n_group * d_state)``."""
        if self.shortconv_l_cache:
            return n_embd * (self.shortconv_l_cache - 1)
        return (self.d_conv - 1 if self.d_conv > 0 else 0) * (self.d_inner + 2 * self.n_group * self.d_state)

    def n_embd_s(self) -> int:
        """``llama_hparams::n_embd_s``: ``d_state * d_inner`` (0 for LFM2, whose S state is zero-sized)."""
        return self.d_state * self.d_inner

    @property
    def conv_channels(self) -> int:
        """The gated delta net's convolution channels, ``d_inner + 2 * n_group * d_state``."""
        return self.d_inner + 2 * self.n_group * self.d_state

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"recurrent_layers": list(self.layers)}
        for f in ("d_conv", "d_inner", "d_state", "dt_rank", "n_group", "shortconv_l_cache"):
            if getattr(self, f):
                out[f] = getattr(self, f)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RecurrentParams:
        layers: Sequence[Any] = d["recurrent_layers"]
        return cls(tuple(bool(x) for x in layers), *(int(d.get(f, 0) or 0) for f in (
            "d_conv", "d_inner", "d_state", "dt_rank", "n_group", "shortconv_l_cache")))


def interval_layers(n_layer: int, full_attention_interval: int) -> tuple[bool, ...]:
    """``full_attention_interval`` (default 4): layer il is recurrent unless ``(il + 1) % interval == 0``
    (``llama_model_qwen35::load_arch_hparams`` without ``attention.recurrent_layers``)."""
    if full_attention_interval <= 0:
        raise ToolkitError(f"full_attention_interval={full_attention_interval} must be > 0")
    return tuple((il + 1) % full_attention_interval != 0 for il in range(n_layer))
