"""Mixture-of-experts FFN: llama.cpp's ``llm_graph_context::build_moe_ffn``, node for node, and its parameters.

A Mixtral-style ``llama`` model (``expert_count > 0``) and ``qwen3moe`` replace the dense FFN of
every layer by a router and ``n_expert`` expert FFNs stored as 3-D tensors:

- ``ffn_gate_inp`` ``[n_embd, n_expert]`` (the router, always F32: llama-quantize skips it);
- ``ffn_gate_exps`` / ``ffn_up_exps`` ``[n_embd, n_ff_exp, n_expert]``, ``ffn_down_exps``
  ``[n_ff_exp, n_embd, n_expert]``, consumed by MUL_MAT_ID (so their buffer type is chosen for
  MUL_MAT_ID, ``llm_tensor_info_mapping``).

The graph (softmax gating, weights normalised, no biases, separate gate and up)::

    ffn_moe_logits (MUL_MAT) → ffn_moe_probs (SOFT_MAX) → ffn_moe_argsort (ARGSORT) → ffn_moe_topk (VIEW)
    ffn_moe_weights (GET_ROWS of probs as [1, n_expert, T]) → RESHAPE → ffn_moe_weights_sum (SUM_ROWS)
      → ffn_moe_weights_sum_clamped (CLAMP) → ffn_moe_weights_norm (DIV) → RESHAPE [1, k, T]
    ffn_moe_up, ffn_moe_gate (MUL_MAT_ID) → ffn_moe_swiglu → ffn_moe_down (MUL_MAT_ID) → ffn_moe_weighted (MUL)
    k VIEWs [n_embd, T], then k-1 ADDs, the last named ffn_moe_out (k = 1: a CONT)

That is 16 + 2k graph nodes where the dense FFN has 4 (:attr:`MoEParams.nodes_per_layer`, for this path).

gpt-oss's variant (``LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT``, ``norm_w = false``, biases,
``LLM_FFN_SWIGLU_OAI_MOE``)::

    ffn_moe_logits (MUL_MAT) → ffn_moe_probs (ADD of the router bias) → ffn_moe_argsort → ffn_moe_topk
    ffn_moe_weights (GET_ROWS of the logits) → SOFT_MAX over the k → ffn_moe_weights_softmax
    ffn_moe_gate → ffn_moe_gate_biased (ADD_ID), ffn_moe_up → ffn_moe_up_biased → ffn_moe_swiglu_oai
      → ffn_moe_down → ffn_moe_down_biased → ffn_moe_weighted, then the k views and k-1 ADDs

>>> p = MoEParams(n_expert=8, n_expert_used=2)
>>> p.nodes_per_layer, [s for s, *_ in layer_tensors(p, n_embd=64, n_ff=128)]
(20, ['ffn_gate_inp', 'ffn_gate_exps', 'ffn_down_exps', 'ffn_up_exps'])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from toolkit.errors import UnsupportedFeature
from toolkit.ggml import ops
from toolkit.ggml.graph import Graph
from toolkit.ggml.tensor import Tensor

if TYPE_CHECKING:
    from toolkit.sched.plan import Plan

# build_moe_ffn clamps the sum of the selected weights from below before dividing by it
WEIGHTS_SUM_MIN = 6.103515625e-5
# llama.cpp's LLAMA_MAX_EXPERTS
MAX_EXPERTS = 512
# llama_expert_gating_func_type: LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX (softmax over every expert, then top-k)
# and LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT (top-k on the logits, softmax over the k chosen: gpt-oss)
GATING_SOFTMAX = "softmax"
GATING_SOFTMAX_WEIGHT = "softmax_weight"
# LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID (DeepSeek V3, GLM-4.5: a sigmoid per expert, then top-k)
GATING_SIGMOID = "sigmoid"
GATING_FUNCS = (GATING_SOFTMAX, GATING_SOFTMAX_WEIGHT, GATING_SIGMOID)
# the expert_gating_func key's values (llama_expert_gating_func_type): 1 softmax, 2 sigmoid, 3 softmax_weight
GATING_FUNC_IDS = {1: GATING_SOFTMAX, 2: GATING_SIGMOID, 3: GATING_SOFTMAX_WEIGHT}
# llm_ffn_op_type of the experts: LLM_FFN_SILU (SWIGLU of gate and up) and LLM_FFN_SWIGLU_OAI_MOE
FFN_SILU = "silu"
FFN_SWIGLU_OAI = "swiglu_oai"
FFN_GELU = "gelu"         # LLM_FFN_GELU: GEGLU of gate and up (Gemma 4)
# build_moe_ffn's constants for LLM_FFN_SWIGLU_OAI_MOE ("TODO: move to hparams?")
SWIGLU_OAI_ALPHA = 1.702
SWIGLU_OAI_LIMIT = 7.0

Callback = Callable[[Tensor, str, int], Tensor]


@dataclass(frozen=True)
class MoEParams:
    """The MoE hyperparameters llama.cpp reads (``llama_hparams``): ``n_expert``, ``n_expert_used``,
    ``n_ff_exp`` (``expert_feed_forward_length``; 0 means ``n_ff``, as Mixtral GGUFs omit it),
    ``expert_weights_scale`` (0 or 1: no scale node; a model dict may set it, llama and qwen3moe files
    leave it 0) and the gating function."""

    n_expert: int
    n_expert_used: int
    n_ff_exp: int = 0
    weights_scale: float = 0.0
    gating: str = "softmax"
    n_ff_shexp: int = 0     # expert_shared_feed_forward_length: a shared expert built beside (qwen35moe)
    # expert_shared_count (llama_hparams::n_expert_shared): shared experts of width n_ff_exp each, built as one
    # FFN of width n_ff_exp * n_expert_shared beside the routed ones (deepseek2, glm4moe)
    n_expert_shared: int = 0
    # expert_weights_norm: divide the selected weights by their sum (read by deepseek2 and glm4moe; llama and
    # qwen3moe always normalise, gpt-oss never: their graphs pass norm_w themselves)
    weights_norm: bool = False
    # expert_group_count / expert_group_used_count (llama_hparams::n_expert_groups, n_group_used; read for
    # every architecture): pick the n_group_used best groups of experts first (DeepSeek V3's group-limited routing)
    n_expert_groups: int = 0
    n_group_used: int = 0
    # leading_dense_block_count (llama_hparams::n_layer_dense_lead): the first layers keep a dense FFN
    n_layer_dense_lead: int = 0
    # exp_probs_b.bias: every MoE layer has DeepSeek V3's expert selection bias (deepseek2, glm4moe)
    exp_probs_b: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.n_expert, int) or not 0 < self.n_expert <= MAX_EXPERTS:
            raise ValueError(f"n_expert={self.n_expert!r} must be in 1..{MAX_EXPERTS}")
        if not isinstance(self.n_expert_used, int) or not 0 < self.n_expert_used <= self.n_expert:
            raise ValueError(f"n_expert_used={self.n_expert_used!r} must be in 1..n_expert={self.n_expert}")
        if not isinstance(self.n_ff_shexp, int) or self.n_ff_shexp < 0:
            raise ValueError(f"n_ff_shexp={self.n_ff_shexp!r} must be an integer >= 0")
        if not isinstance(self.n_ff_exp, int) or self.n_ff_exp < 0:
            raise ValueError(f"n_ff_exp={self.n_ff_exp!r} must be an integer >= 0")
        for f in ("n_expert_shared", "n_expert_groups", "n_group_used", "n_layer_dense_lead"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{f}={v!r} must be an integer >= 0")
        if self.n_expert_groups > 1:
            # llama_model::load_hparams' asserts
            if self.n_expert_groups >= self.n_expert or self.n_expert % self.n_expert_groups:
                raise ValueError(f"n_expert_groups={self.n_expert_groups} must divide n_expert={self.n_expert} "
                                 "and be smaller")
            if not 0 < self.n_group_used < self.n_expert_groups:
                raise ValueError(f"n_group_used={self.n_group_used} must be in 1..n_expert_groups-1="
                                 f"{self.n_expert_groups - 1}")
        if self.gating not in GATING_FUNCS:
            raise UnsupportedFeature(f"expert gating {self.gating}",
                                     f"expert gating function {self.gating!r} is not implemented "
                                     f"(implemented: {', '.join(GATING_FUNCS)})")

    @property
    def nodes_per_layer(self) -> int:
        """Graph nodes of one MoE FFN: 16 + 2k (k = 1: a CONT instead of the ADDs, 19), +1 with a scale node."""
        k = self.n_expert_used
        return 16 + 2 * k + (1 if k == 1 else 0) + (1 if self.scales_weights else 0)

    @property
    def scales_weights(self) -> bool:
        """build_moe_ffn adds ``ffn_moe_weights_scaled`` only for a scale other than 0 and 1."""
        return self.weights_scale not in (0.0, 1.0)

    def ff(self, n_ff: int) -> int:
        return self.n_ff_exp or n_ff

    def is_moe_layer(self, il: int) -> bool:
        """Layer il routes through experts (``il >= n_layer_dense_lead``)."""
        return il >= self.n_layer_dense_lead

    @property
    def groups_routed(self) -> bool:
        """build_moe_ffn selects expert groups first (``n_expert_groups > 1``)."""
        return self.n_expert_groups > 1

    def to_dict(self) -> dict[str, Any]:
        return {"n_expert": self.n_expert, "n_expert_used": self.n_expert_used, "n_ff_exp": self.n_ff_exp,
                "expert_weights_scale": self.weights_scale, "expert_gating": self.gating,
                **({"n_ff_shexp": self.n_ff_shexp} if self.n_ff_shexp else {}),
                **{k: v for k, v in (("n_expert_shared", self.n_expert_shared),
                                     ("expert_weights_norm", self.weights_norm),
                                     ("n_expert_groups", self.n_expert_groups), ("n_group_used", self.n_group_used),
                                     ("n_layer_dense_lead", self.n_layer_dense_lead),
                                     ("exp_probs_b", self.exp_probs_b)) if v}}


def layer_tensors(p: MoEParams, n_embd: int, n_ff: int) -> list[tuple[str, tuple[int, ...], str, bool]]:
    """Per layer, in GGUF write order: (suffix, ne, consuming op, is the F32 router)."""
    f = p.ff(n_ff)
    x = p.n_expert
    return [
        ("ffn_gate_inp", (n_embd, x), "MUL_MAT", True),
        ("ffn_gate_exps", (n_embd, f, x), "MUL_MAT_ID", False),
        ("ffn_down_exps", (f, n_embd, x), "MUL_MAT_ID", False),
        ("ffn_up_exps", (n_embd, f, x), "MUL_MAT_ID", False),
    ]


def from_dict(d: Mapping[str, Any]) -> MoEParams | None:
    """From a model description (the oracle's ``model`` dict): None for a dense model."""
    n = int(d.get("n_expert", 0) or 0)
    if n <= 0:
        return None
    return MoEParams(n_expert=n, n_expert_used=int(d.get("n_expert_used", 0) or 0),
                     n_ff_exp=int(d.get("n_ff_exp", 0) or 0),
                     weights_scale=float(d.get("expert_weights_scale", 0.0) or 0.0),
                     gating=str(d.get("expert_gating", "softmax")), n_ff_shexp=int(d.get("n_ff_shexp", 0) or 0),
                     n_expert_shared=int(d.get("n_expert_shared", 0) or 0),
                     weights_norm=bool(d.get("expert_weights_norm", False)),
                     n_expert_groups=int(d.get("n_expert_groups", 0) or 0),
                     n_group_used=int(d.get("n_group_used", 0) or 0),
                     n_layer_dense_lead=int(d.get("n_layer_dense_lead", 0) or 0),
                     exp_probs_b=bool(d.get("exp_probs_b", False)))


# GGUF keys of MoE variants only some architectures build (Architecture.moe_keys lists those it reads)
_UNSUPPORTED_KEYS = {
    "expert_shared_count": "shared experts",
    "leading_dense_block_count": "leading dense blocks",
}
_UNSUPPORTED_TENSORS = {
    "_shexp": "shared experts", "ffn_gate_up_exps": "merged gate/up experts", "exp_probs_b": "expert selection bias",
    "_chexps": "chunked experts",
}


def from_gguf(get: Callable[[str], Any], arch: str, tensor_names: list[str],
              built: tuple[str, ...] = (), built_keys: tuple[str, ...] = ()) -> MoEParams | None:
    """The MoE keys of a GGUF (``<arch>.expert_count`` & co.) through ``get(key) -> value | None``.

    Variants the architecture does not build (shared experts, dense leading layers, merged gate/up, the
    selection bias) are refused
    with :class:`UnsupportedFeature` naming the feature, except the tensors in ``built``
    (``Architecture.moe_tensors``: the architecture builds them) and the keys in ``built_keys`` (the
    architecture reads them in its ``load_arch_hparams``). The expert groups
    (``expert_group_count``, ``expert_group_used_count``) are read for every architecture, as
    ``llama_model::load_hparams`` does. The router and expert biases are built (an
    architecture that lists them, gpt-oss); a file of another architecture that carries them has more
    tensors than its architecture creates, which :func:`toolkit.models.gguf.check_shapes` refuses.
    """
    n = int(get(f"{arch}.expert_count") or 0)
    if n <= 0:
        return None
    for key, feature in _UNSUPPORTED_KEYS.items():
        v = get(f"{arch}.{key}")
        if v and key not in built_keys:
            raise UnsupportedFeature(feature, f"GGUF key {arch}.{key}={v}: {feature} are not implemented")
    # expert_shared_feed_forward_length (llama_hparams::n_ff_shexp): the architecture builds a shared expert
    # beside the routed ones (qwen35moe); its architecture's tensor list decides whether the file fits
    n_ff_shexp = int(get(f"{arch}.expert_shared_feed_forward_length") or 0)
    for name in tensor_names:
        for frag, feature in _UNSUPPORTED_TENSORS.items():
            if frag in name and frag not in built and not (frag == "_shexp" and n_ff_shexp):
                raise UnsupportedFeature(feature, f"tensor {name}: {feature} are not implemented")
    # expert_weights_scale is read only by the load_arch_hparams of architectures that scale the weights
    # (deepseek2 and glm4moe read their own MoE keys); llama and qwen3moe keep hparams.expert_weights_scale = 0
    return MoEParams(n_expert=n, n_expert_used=int(get(f"{arch}.expert_used_count") or 0),
                     n_ff_exp=int(get(f"{arch}.expert_feed_forward_length") or 0), n_ff_shexp=n_ff_shexp,
                     n_expert_groups=int(get(f"{arch}.expert_group_count") or 0),
                     n_group_used=int(get(f"{arch}.expert_group_used_count") or 0))


def build_moe_ffn(gf: Graph, cb: Callback, cur: Tensor, gate_inp: Tensor | None, up_exps: Tensor | None,
                  gate_exps: Tensor | None, down_exps: Tensor, p: MoEParams, il: int, *,
                  gate_inp_b: Tensor | None = None, up_exps_b: Tensor | None = None,
                  gate_exps_b: Tensor | None = None, down_exps_b: Tensor | None = None, type_op: str = FFN_SILU,
                  norm_w: bool = True, probs_in: Tensor | None = None, gate_up_exps: Tensor | None = None,
                  up_exps_s: Tensor | None = None, gate_exps_s: Tensor | None = None,
                  down_exps_s: Tensor | None = None, exp_probs_b: Tensor | None = None) -> Tensor:
    """``build_moe_ffn(cur, gate_inp, gate_inp_b, up_exps, up_exps_b, gate_exps, gate_exps_b, down_exps,
    down_exps_b, …, type_op, norm_w, expert_weights_scale, gating_op, il)`` for ``cur`` ``[n_embd, n_tokens]``;
    returns ``ffn_moe_out``.

    In llama.cpp's order: the router (``ffn_moe_logits``, plus its bias ``gate_inp_b``:
    ``ffn_moe_logits_biased``), the gating (``p.gating``: SOFT_MAX, or none before the top-k for
    SOFTMAX_WEIGHT), the top-k, the selected weights (SOFTMAX_WEIGHT: a SOFT_MAX over the k,
    ``ffn_moe_weights_softmax``; ``norm_w``: divided by their clamped sum), the scale, then the experts:
    up (+ ``up_exps_b`` through ADD_ID), gate (+ ``gate_exps_b``), the activation (``type_op``:
    ``silu`` SWIGLU or ``swiglu_oai`` with alpha 1.702 and limit 7), down (+ ``down_exps_b``), weighted,
    and the sum over the k views. Shared experts are the architecture's (a dense FFN beside it).

    DeepSeek V3's routing: ``p.gating`` ``sigmoid`` (SIGMOID instead of SOFT_MAX), ``exp_probs_b`` (the
    selection bias, ``ffn_moe_probs_biased``: the top-k reads the biased scores, the weights the unbiased
    ones) and expert groups (``p.n_expert_groups`` > 1: :func:`_select_groups` masks every group but the
    ``n_group_used`` best before the top-k).

    Gemma 4's branches: ``probs_in`` (router logits the architecture computed, used instead of
    ``ffn_moe_logits``), ``gate_up_exps`` (one merged ``[n_embd, 2 n_ff_exp, n_expert]`` tensor whose
    product is viewed as gate, then up), the per-expert scales ``up_exps_s`` / ``gate_exps_s`` /
    ``down_exps_s`` (``build_lora_mm_id``: ``[n_expert]`` reshaped, repeated over the tokens, picked by
    the selected experts and multiplied in) and ``type_op`` ``gelu`` (GEGLU of gate and up).
    """
    if type_op not in (FFN_SILU, FFN_SWIGLU_OAI, FFN_GELU):
        raise UnsupportedFeature(f"expert activation {type_op}", f"build_moe_ffn's type_op {type_op!r} is not "
                                 f"implemented (implemented: {FFN_SILU}, {FFN_SWIGLU_OAI}, {FFN_GELU})")
    n_embd, n_tokens = cur.ne[0], cur.ne[1]
    n_expert, k = p.n_expert, p.n_expert_used
    if probs_in is None:
        if gate_inp is None:
            raise ValueError(f"build_moe_ffn needs gate_inp or probs_in (layer {il})")
        logits = cb(ops.mul_mat(gate_inp, cur), "ffn_moe_logits", il)      # [n_expert, n_tokens]
    else:
        logits = probs_in
    if gate_inp_b is not None:
        logits = cb(ops.add(logits, gate_inp_b), "ffn_moe_logits_biased", il)
    if p.gating == GATING_SOFTMAX:
        probs = ops.soft_max(logits)
    elif p.gating == GATING_SIGMOID:
        probs = ops.sigmoid(logits)
    else:
        probs = logits                                                       # SOFTMAX_WEIGHT: probs = logits
    cb(probs, "ffn_moe_probs", il)
    # the selection bias (DeepSeek V3's exp_probs_b) moves the choice only: the weights stay unbiased
    selection = probs
    if exp_probs_b is not None:
        selection = cb(ops.add(probs, exp_probs_b), "ffn_moe_probs_biased", il)
    if p.groups_routed and n_tokens > 0:
        selection = _select_groups(cb, selection, p, n_tokens, il)
    selected = ops.argsort_top_k(selection, k)                               # [k, n_tokens] view of the ARGSORT
    src = selected.src[0]
    assert src is not None
    cb(src, "ffn_moe_argsort", il)
    cb(selected, "ffn_moe_topk", il)
    weights = ops.get_rows(ops.reshape_3d(probs, 1, n_expert, n_tokens), selected)  # [1, k, n_tokens]
    cb(weights, "ffn_moe_weights", il)
    if p.gating == GATING_SOFTMAX_WEIGHT:
        weights = ops.soft_max(ops.reshape_2d(weights, k, n_tokens))         # [k, n_tokens]
        weights = cb(ops.reshape_3d(weights, 1, k, n_tokens), "ffn_moe_weights_softmax", il)
    if norm_w:  # divide by the (clamped) sum of the selected probabilities
        weights = ops.reshape_2d(weights, k, n_tokens)
        wsum = cb(ops.sum_rows(weights), "ffn_moe_weights_sum", il)
        wsum = cb(ops.clamp(wsum, WEIGHTS_SUM_MIN, math.inf), "ffn_moe_weights_sum_clamped", il)
        weights = cb(ops.div(weights, wsum), "ffn_moe_weights_norm", il)
        weights = ops.reshape_3d(weights, 1, k, n_tokens)
    if p.scales_weights:
        weights = cb(ops.scale(weights, p.weights_scale), "ffn_moe_weights_scaled", il)
    gf.build_forward_expand(weights)
    cur = ops.reshape_3d(cur, n_embd, 1, n_tokens)
    if gate_up_exps is not None:
        gate_up = cb(_mm_id(gate_up_exps, cur, selected, up_exps_s), "ffn_moe_gate_up", il)  # [2 n_ff, k, T]
        if up_exps_s is not None:
            cb(gate_up, "ffn_moe_gate_up_scaled", il)
        n_ff = gate_up.ne[0] // 2
        gate = cb(ops.view_3d(gate_up, n_ff, gate_up.ne[1], gate_up.ne[2], gate_up.nb[1], gate_up.nb[2], 0),
                  "ffn_moe_gate", il)
        up = cb(ops.view_3d(gate_up, n_ff, gate_up.ne[1], gate_up.ne[2], gate_up.nb[1], gate_up.nb[2],
                            n_ff * gate_up.nb[0]), "ffn_moe_up", il)
    else:
        if up_exps is None or gate_exps is None:
            raise ValueError(f"build_moe_ffn needs up_exps and gate_exps, or gate_up_exps (layer {il})")
        up = cb(_mm_id(up_exps, cur, selected, up_exps_s), "ffn_moe_up", il)  # [n_ff_exp, k, n_tokens]
        if up_exps_s is not None:
            cb(up, "ffn_moe_up_scaled", il)
        if up_exps_b is not None:
            up = cb(ops.add_id(up, up_exps_b, selected), "ffn_moe_up_biased", il)
        gate = cb(_mm_id(gate_exps, cur, selected, gate_exps_s), "ffn_moe_gate", il)
        if gate_exps_s is not None:
            cb(gate, "ffn_moe_gate_scaled", il)
        if gate_exps_b is not None:
            gate = cb(ops.add_id(gate, gate_exps_b, selected), "ffn_moe_gate_biased", il)
    if type_op == FFN_SWIGLU_OAI:
        act = cb(ops.swiglu_oai(gate, up, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT), "ffn_moe_swiglu_oai", il)
    elif type_op == FFN_GELU:
        act = cb(ops.geglu_split(gate, up), "ffn_moe_geglu", il)
    else:
        act = cb(ops.swiglu_split(gate, up), "ffn_moe_swiglu", il)
    experts = cb(_mm_id(down_exps, act, selected, down_exps_s), "ffn_moe_down", il)  # [n_embd, k, n_tokens]
    if down_exps_s is not None:
        cb(experts, "ffn_moe_down_scaled", il)
    if down_exps_b is not None:
        experts = cb(ops.add_id(experts, down_exps_b, selected), "ffn_moe_down_biased", il)
    experts = cb(ops.mul(experts, weights), "ffn_moe_weighted", il)
    gf.build_forward_expand(experts)
    # order the views before the adds
    views = [ops.view_2d(experts, n_embd, n_tokens, experts.nb[2], i * experts.nb[1]) for i in range(k)]
    for v in views:
        gf.build_forward_expand(v)
    out = views[0]
    for v in views[1:]:
        out = ops.add(out, v)
        gf.build_forward_expand(out)
    if k == 1:
        out = ops.cont(out)  # avoid returning a non-contiguous tensor
    return cb(out, "ffn_moe_out", il)


def _select_groups(cb: Callback, selection: Tensor, p: MoEParams, n_tokens: int, il: int) -> Tensor:
    """build_moe_ffn's group-limited routing: each group scores the sum of its two best experts (ARGSORT
    top 2, GET_ROWS, SUM_ROWS), the ``n_group_used`` best groups are kept (``ffn_moe_group_topk``) and the
    others' experts set to -inf (GET_ROWS of the kept groups, SET_ROWS into a FILL of -inf):
    ``ffn_moe_probs_masked`` ``[n_expert, n_tokens]``."""
    n_groups = p.n_expert_groups
    per_group = p.n_expert // n_groups
    groups = ops.reshape_3d(selection, per_group, n_groups, n_tokens)           # [per_group, n_groups, T]
    top2 = ops.argsort_top_k(groups, 2)                                         # [2, n_groups, T]
    scores = ops.get_rows(ops.reshape_4d(groups, 1, groups.ne[0], groups.ne[1], groups.ne[2]), top2)
    scores = ops.sum_rows(ops.reshape_3d(scores, scores.ne[1], scores.ne[2], scores.ne[3]))  # [1, n_groups, T]
    scores = ops.reshape_2d(scores, scores.ne[1], scores.ne[2])                 # [n_groups, T]
    kept = cb(ops.argsort_top_k(scores, p.n_group_used), "ffn_moe_group_topk", il)  # [n_group_used, T]
    rows = ops.get_rows(groups, kept)                                           # [per_group, n_group_used, T]
    masked = ops.set_rows(ops.fill(groups, -math.inf), rows, kept)              # [per_group, n_groups, T]
    return cb(ops.reshape_2d(masked, p.n_expert, n_tokens), "ffn_moe_probs_masked", il)


def _mm_id(w: Tensor, cur: Tensor, ids: Tensor, w_s: Tensor | None) -> Tensor:
    """``build_lora_mm_id``: MUL_MAT_ID, times the per-expert scale ``w_s`` ``[n_expert]`` when given
    (reshaped to ``[1, n_expert, 1]``, repeated over the tokens, the selected rows picked)."""
    res = ops.mul_mat_id(w, cur, ids)
    if w_s is not None:
        s = ops.reshape_3d(w_s, 1, w_s.ne[0], 1)
        s = ops.repeat_4d(s, 1, w_s.ne[0], cur.ne[2], 1)
        res = ops.mul(res, ops.get_rows(s, ids))
    return res


@dataclass(frozen=True)
class ExpertCopy:
    """An expert tensor that a split copies whole into its backend's compute buffer (a split input).

    ``nbytes`` is the tensor's size, ``alloc_bytes`` what the copy takes in the compute buffer
    (``ggml_backend_buft_get_alloc_size``: CUDA pads quantized rows), 0 when the plan holds no allocation.
    """

    split: int
    backend: str
    tensor: str
    nbytes: int
    alloc_bytes: int


def expert_copies(plan: Plan) -> list[ExpertCopy]:
    """Per split, the weights copied in as inputs for a MUL_MAT_ID (expert tensors moved by op offload
    or left on another device) — the bytes a CPU-experts setup adds to an accelerator's compute buffer."""
    sizes = {a.name: a.size for a in plan.allocs}
    out: list[ExpertCopy] = []
    for sp in plan.splits:
        users = {n.srcs[0] for n in plan.nodes if n.split == sp.index and n.op == "MUL_MAT_ID" and n.srcs}
        for inp in sp.inputs:
            if not inp.is_weight:
                continue
            copy = next((u for u in users if u.startswith(f"{sp.backend}#{inp.name}#")), None)
            if copy is not None:
                out.append(ExpertCopy(sp.index, sp.backend, inp.name, inp.nbytes, sizes.get(copy, 0)))
    return out


def expert_copies_text(copies: list[ExpertCopy]) -> str:
    """One line per copied expert tensor, with the split and both sizes."""
    if not copies:
        return "no expert tensor is copied"
    return "\n".join(f"split #{c.split:<3d} {c.backend:<24s} {c.tensor:<28s} {c.nbytes:>12d} bytes "
                     f"(buffer {c.alloc_bytes})" for c in copies)


# ---- sched_copy_experts: what a copy of host experts really transfers --------------------------------

def used_expert_ranges(ids: Iterable[int], n_expert: int) -> list[tuple[int, int]]:
    """The experts a MUL_MAT_ID's ids select, as ``[first, last]`` runs of consecutive ids (llama's
    ``sched_copy_experts`` groups consecutive experts and copies each run at once).

    >>> used_expert_ranges([5, 1, 2, 1, 7], 8)
    [(1, 2), (5, 5), (7, 7)]
    """
    used = sorted({int(i) for i in ids})
    if used and (used[0] < 0 or used[-1] >= n_expert):
        raise ValueError(f"expert id out of range 0..{n_expert - 1}: {used}")
    runs: list[tuple[int, int]] = []
    for i in used:
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def expert_copy_bytes(runs: Sequence[tuple[int, int]], expert_size: int, n_expert: int) -> int:
    """Bytes ``sched_copy_experts`` moves for these runs: each run's experts, plus
    ``min(expert_size, 512)`` bytes past a run that does not end at the last expert (so CUDA's MMQ
    reads no NaNs from the padding of the last expert copied).

    >>> expert_copy_bytes([(1, 2), (7, 7)], 1000, 8)
    3512
    """
    pad = min(expert_size, 512)
    return sum((last - first + 1) * expert_size + (pad if last < n_expert - 1 else 0) for first, last in runs)


@dataclass(frozen=True)
class ExpertTransfer:
    """One host expert tensor copied for a split: the buffer holds all of it, the copy moves only the
    experts the router chose."""

    split: int
    tensor: str
    buffer_bytes: int        # the split input's size: the whole expert tensor
    transfer_bytes: int      # what sched_copy_experts moved
    experts: tuple[int, ...]
    runs: tuple[tuple[int, int], ...]

    def to_text(self) -> str:
        return (f"split #{self.split:<3d} {self.tensor:<28s} buffer {self.buffer_bytes:>10d} B  "
                f"transfer {self.transfer_bytes:>10d} B  experts {list(self.experts)}")
