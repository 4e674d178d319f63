"""What a JAX kernel reads from its ggml node: sources by slot, op params by name, typed.

A kernel is ``fn(node, reader) -> jnp.ndarray``: it reads its sources' values through ``reader``
(:class:`Reader`, the evaluator of :mod:`toolkit.jaxrt.kernels`) and its op params from the node.
ggml keeps sources in ``GGML_MAX_SRC`` fixed slots, some optional (rope's freq factors in slot 2, the
soft_max mask in slot 1, flash_attn_ext's mask in slot 3): :func:`src` is a slot that must hold a
tensor, :func:`opt_src` one that may be empty. ggml keeps op params as raw ``int32`` words
(``ggml_get_op_params_f32`` / ``_i32``); here they are named, and :func:`param_f32`, :func:`param_i32`,
:func:`param_flag` and :func:`param_enum` read them with the type the kernel computes with.

This module imports no kernel, so :mod:`toolkit.jaxrt.kernels` and :mod:`toolkit.jaxrt.kernels_moe`
both build their table entries from it.
"""

from __future__ import annotations

import enum
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import jax.numpy as jnp

from toolkit.errors import ParameterError
from toolkit.ggml.tensor import MAX_SRC, Tensor

E = TypeVar("E", bound=enum.Enum)
Shape = tuple[int, int, int, int]


@dataclass(frozen=True)
class Numerics:
    """Where ggml backends compute one op differently, which way the kernels go. The default is
    ggml-cpu's, the backend of every measured llama.cpp logit.

    - ``gelu_f16_table``: ggml-cpu defines ``GGML_GELU_FP16``, so ``ggml_vec_gelu_f32`` and
      ``ggml_vec_geglu_f32`` read ``ggml_table_gelu_f16`` at x rounded to f16 (an f16 result; 0 at or
      below -10, x at or above 10). False: ``ggml_gelu_f32`` in f32, as the GPU backends compute it
      (and what a float64 reference can follow without f16 rounding ties).
    """

    gelu_f16_table: bool = True

    def key(self) -> str:
        """A short text that tells apart programs compiled with different numerics."""
        return f"gelu_f16_table={int(self.gelu_f16_table)}"


CPU_NUMERICS = Numerics()


class Reader(Protocol):
    """The values a kernel reads: a tensor's logical value in its own type or as f32, and the flat
    storage of the base a view belongs to (what an op that overwrites its view's source updates);
    ``numerics``: which way ops that ggml backends compute differently go."""

    numerics: Numerics

    def flat(self, t: Tensor) -> jnp.ndarray: ...

    def read(self, t: Tensor) -> jnp.ndarray: ...

    def read_f32(self, t: Tensor) -> jnp.ndarray: ...


@dataclass(frozen=True)
class Kernel:
    """One op's kernel. ``fn(node, reader)`` returns the node's logical value ``(ne3, ne2, ne1, ne0)``;
    with ``writes_view_src``, a node of the op that is a view of an existing tensor overwrites it
    (``ggml_set_rows``, ``ggml_cpy``, ``ggml_clamp``, ``ggml_scale_inplace``), and ``fn`` returns that
    tensor's new flat storage (:func:`toolkit.jaxrt.kernels.writes_into_view` tells such a node)."""

    fn: Callable[[Tensor, Reader], jnp.ndarray]
    writes_view_src: bool = False


def src(t: Tensor, i: int) -> Tensor:
    """Source slot ``i`` of ``t``, which the op requires."""
    s = opt_src(t, i)
    if s is None:
        raise ParameterError(f"{t.name}.src[{i}]", None, f"a tensor (a {t.op_desc()} node reads source {i})")
    return s


def opt_src(t: Tensor, i: int) -> Tensor | None:
    """Source slot ``i`` of ``t``, or None where the op leaves it empty (ggml's NULL src)."""
    if not 0 <= i < MAX_SRC:
        raise ParameterError("i", i, f"a source slot 0..{MAX_SRC - 1} (GGML_MAX_SRC)")
    return t.src[i] if i < len(t.src) else None


def shape_of(t: Tensor) -> Shape:
    """``t``'s logical shape in numpy order ``(ne3, ne2, ne1, ne0)``."""
    return (t.ne[3], t.ne[2], t.ne[1], t.ne[0])


def _param(t: Tensor, name: str, default: object) -> object:
    v = t.op_params.get(name, default)
    if v is None:
        raise ParameterError(f"{t.name}.op_params[{name!r}]", None, f"a value (the {t.op_desc()} kernel reads it)")
    return v


def param_f32(t: Tensor, name: str, default: float | None = None) -> float:
    """A float op param (``ggml_get_op_params_f32``); ``default`` where the op may omit it."""
    v = _param(t, name, default)
    if not isinstance(v, numbers.Real) or isinstance(v, bool):
        raise ParameterError(f"{t.name}.op_params[{name!r}]", v, "a float")
    return float(v)


def param_i32(t: Tensor, name: str, default: int | None = None) -> int:
    """An integer op param (``ggml_get_op_params_i32``); ``default`` where the op may omit it."""
    v = _param(t, name, default)
    if not isinstance(v, numbers.Integral) or isinstance(v, bool):
        raise ParameterError(f"{t.name}.op_params[{name!r}]", v, "an int")
    return int(v)


def param_flag(t: Tensor, name: str) -> bool:
    """A boolean op param (a GLU's ``swapped``); absent means false."""
    return bool(t.op_params.get(name, False))


def param_enum(t: Tensor, name: str, kind: type[E]) -> E:
    """An op param that is one of ``kind``'s members (a UNARY node's ``unary``, a GLU's ``glu``)."""
    v = _param(t, name, None)
    if not isinstance(v, kind):
        raise ParameterError(f"{t.name}.op_params[{name!r}]", v, f"a {kind.__name__}")
    return v
