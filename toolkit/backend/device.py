"""Device profiles and backends (``ggml_backend_dev`` / ``ggml_backend``).

A :class:`DeviceProfile` answers the three device predicates the scheduler asks
(``supports_op``, ``supports_buft``, ``offload_op``) and carries the device caps.
A :class:`Backend` binds a profile to a buft and, optionally, an executor (a JAX
device); planning never touches the executor.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Literal

from toolkit.backend.buft import BufferType
from toolkit.ggml.tensor import Op, Tensor

DeviceKind = Literal["cpu", "gpu", "accel"]
OffloadRule = Literal["none", "cuda", "metal"]

DEFAULT_OP_OFFLOAD_MIN_BATCH = 32


def op_offload_min_batch(default: int = DEFAULT_OP_OFFLOAD_MIN_BATCH) -> int:
    """``GGML_OP_OFFLOAD_MIN_BATCH`` as read at backend registration (PR #18535)."""
    raw = os.environ.get("GGML_OP_OFFLOAD_MIN_BATCH")
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"GGML_OP_OFFLOAD_MIN_BATCH={raw!r} is not an integer") from None
    if value < 0:
        raise ValueError(f"GGML_OP_OFFLOAD_MIN_BATCH={value} must be >= 0")
    return value


def cuda_batch_size(t: Tensor) -> int:
    """CUDA's op "batch size" for offload_op (``get_op_batch_size`` in ggml-cuda)."""
    if t.op is Op.GET_ROWS:
        return 0
    if t.op is Op.MUL_MAT:
        return t.ne[1]
    if t.op in (Op.MUL_MAT_ID, Op.ROPE, Op.ROPE_BACK):
        return t.ne[2]
    return t.ne[1] * t.ne[2] * t.ne[3]


_DESC_OPS = frozenset({"UNARY", "GLU", "JAX"})


def _op_key(op: Op | str) -> str:
    return op.value if isinstance(op, Op) else str(op).upper()


class DeviceProfile:
    """How a device kind behaves for the scheduler.

    - ``supported_ops``: op names (``Op`` or ``op_desc`` strings such as ``"SILU"``) the
      device runs; ``None`` means every op.
    - ``excluded_ops``: op names it refuses even so (e.g. a GPU that lacks SQR).
      A tensor matches by its ``op`` name or its ``op_desc()`` (unary/GLU kind).
    - ``supports_buft``: the device reads its own buft(s) in ``readable_bufts``, and any
      host buft when ``reads_host`` (CPU and BLAS do).
    - ``offload_rule``: ``"cuda"`` (batch by op, ggml-cuda's ``get_op_batch_size``), ``"metal"`` (MUL_MAT by ne[1],
      MUL_MAT_ID by ne[2]) or ``"none"``; ``min_batch`` is the threshold.
    - ``op_filter``: an optional extra ``supports_op`` predicate.
    """

    def __init__(
        self,
        name: str,
        kind: DeviceKind,
        buft: BufferType,
        *,
        host_buft: BufferType | None = None,
        supported_ops: Iterable[Op | str] | None = None,
        excluded_ops: Iterable[Op | str] = (),
        reads_host: bool = False,
        readable_bufts: Iterable[BufferType] = (),
        offload_rule: OffloadRule = "none",
        min_batch: int | None = None,
        caps_async: bool = False,
        caps_events: bool = False,
        op_filter: Callable[[Tensor], bool] | None = None,
        description: str = "",
    ) -> None:
        if kind not in ("cpu", "gpu", "accel"):
            raise ValueError(f"device {name!r}: kind {kind!r} is not one of 'cpu', 'gpu', 'accel'")
        self.name = name
        self.kind: DeviceKind = kind
        self.buft = buft
        self.host_buft = host_buft
        self.supported_ops: frozenset[str] | None = (
            None if supported_ops is None else frozenset(_op_key(o) for o in supported_ops)
        )
        self.excluded_ops: frozenset[str] = frozenset(_op_key(o) for o in excluded_ops)
        self.reads_host = reads_host
        self.readable_bufts: tuple[BufferType, ...] = (buft, *readable_bufts)
        self.offload_rule: OffloadRule = offload_rule
        self.min_batch = op_offload_min_batch() if min_batch is None else min_batch
        self.caps_async = caps_async
        self.caps_events = caps_events
        self.op_filter = op_filter
        self.description = description

    @property
    def default_buft(self) -> BufferType:
        return self.buft

    def supports_op(self, t: Tensor) -> bool:
        op = t.op._value_  # Enum.value is a slow descriptor; _value_ is a plain attribute
        desc = t.op_desc() if op in _DESC_OPS else op
        if op in self.excluded_ops or desc in self.excluded_ops:
            return False
        if self.supported_ops is not None and op not in self.supported_ops and desc not in self.supported_ops:
            return False
        return self.op_filter is None or bool(self.op_filter(t))

    def supports_buft(self, buft: BufferType) -> bool:
        if self.reads_host and buft.is_host:
            return True
        return any(buft is b for b in self.readable_bufts)

    def offload_op(self, t: Tensor) -> bool:
        if self.offload_rule == "cuda":
            return cuda_batch_size(t) >= self.min_batch
        if self.offload_rule == "metal":
            if t.op is Op.MUL_MAT:
                return t.ne[1] >= self.min_batch
            if t.op is Op.MUL_MAT_ID:
                return t.ne[2] >= self.min_batch
        return False

    def without_ops(self, *ops: Op | str) -> DeviceProfile:
        """Exclude more ops from supports_op (returns self, for chaining)."""
        self.excluded_ops = self.excluded_ops | {_op_key(o) for o in ops}
        return self

    def __repr__(self) -> str:
        return f"DeviceProfile({self.name!r}, kind={self.kind!r}, buft={self.buft.name!r})"


class Backend:
    """A scheduler backend: a name, a device profile, the buft it allocates compute in.

    ``executor`` is whatever runs the backend's splits (a JAX device, or None when only
    planning). ``index`` is the device index (CUDA0 → 0), informative only.
    """

    def __init__(
        self,
        name: str,
        profile: DeviceProfile,
        buft: BufferType | None = None,
        executor: object | None = None,
        index: int | None = None,
    ) -> None:
        self.name = name
        self.profile = profile
        self.buft = profile.buft if buft is None else buft
        self.executor = executor
        self.index = index

    # the device predicates, as ggml_backend_supports_op & co. ask them
    def supports_op(self, t: Tensor) -> bool:
        return self.profile.supports_op(t)

    def supports_buft(self, buft: BufferType) -> bool:
        return self.profile.supports_buft(buft)

    def offload_op(self, t: Tensor) -> bool:
        return self.profile.offload_op(t)

    @property
    def kind(self) -> DeviceKind:
        return self.profile.kind

    @property
    def is_cpu(self) -> bool:
        return self.profile.kind == "cpu"

    @property
    def caps_async(self) -> bool:
        return self.profile.caps_async

    @property
    def caps_events(self) -> bool:
        return self.profile.caps_events

    @property
    def host_buft(self) -> BufferType | None:
        return self.profile.host_buft

    def without_ops(self, *ops: Op | str) -> Backend:
        """Exclude ops from supports_op (e.g. a GPU that lacks SQR); returns self."""
        self.profile.without_ops(*ops)
        return self

    def __repr__(self) -> str:
        return f"Backend({self.name!r}, kind={self.kind!r}, buft={self.buft.name!r})"
