"""What a fit decided, as plain frozen data: the parameters, the probes, the log, the printed line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolkit.errors import ToolkitError
from toolkit.fit.probe import Probe
from toolkit.memory import DeviceMemory, MiB


class FitImpossible(ToolkitError):
    """The model does not fit even with the smallest context and every layer on the CPU.

    ``missing_mib`` maps each device (and ``Host`` when the host was compared) to the MiB missing.
    """

    def __init__(self, missing_mib: dict[str, int], detail: str = "") -> None:
        self.missing_mib = dict(missing_mib)
        parts = ", ".join(f"{k}: {v} MiB" for k, v in self.missing_mib.items())
        extra = f" ({detail})" if detail else ""
        super().__init__(f"the model does not fit the free memory; missing {parts}{extra}")


@dataclass(frozen=True)
class Fitted:
    """The parameters fit chose (``-c``, ``-ngl`` with -1 = unchanged, ``-ts`` per device, ``-ot``)."""

    c: int
    ngl: int
    ts: tuple[int, ...] | None
    ot: tuple[tuple[str, str], ...]

    def printed(self) -> str:
        """The line ``llama-fit-params`` prints: trailing zero split entries dropped, ``-ts`` only
        with more than one entry left, ``-ot`` quoted."""
        s = f"-c {self.c} -ngl {self.ngl}"
        ts = list(self.ts or ())
        while len(ts) > 1 and ts[-1] == 0:
            ts.pop()
        if len(ts) > 1:
            s += " -ts " + ",".join(str(int(x)) for x in ts)
        if self.ot:
            s += ' -ot "' + ",".join(f"{p}={b}" for p, b in self.ot) + '"'
        return s

    def as_printed(self) -> Fitted:
        """What a program given the printed line runs with (the dropped split entries are gone)."""
        ts = list(self.ts or ())
        while len(ts) > 1 and ts[-1] == 0:
            ts.pop()
        return Fitted(self.c, self.ngl, tuple(ts) if len(ts) > 1 else None, self.ot)

    def to_dict(self) -> dict[str, Any]:
        return {"c": self.c, "ngl": self.ngl, "ts": list(self.ts) if self.ts else None,
                "ot": ",".join(f"{p}={b}" for p, b in self.ot) if self.ot else None}


@dataclass(frozen=True)
class FitResult:
    """Everything one ``common_fit_params`` call did and decided."""

    status: str                                  # "success", "failure" (fit refused or gave up)
    fitted: Fitted                               # the parameters as fit left them in process
    probes: tuple[Probe, ...]
    log_lines: tuple[str, ...]
    memory: tuple[DeviceMemory, ...]
    targets: tuple[int, ...]                     # margin per device, bytes
    error: str = ""
    seconds: float = 0.0
    exact: bool = False
    used: tuple[int, ...] = ()                   # projected bytes per device for the fitted params
    host: DeviceMemory | None = None             # CPU only: the host memory compared (total)
    host_used: int = 0

    @property
    def printed(self) -> str:
        """``llama-fit-params``'s stdout line (empty when it exits with 1)."""
        return self.fitted.printed() if self.status == "success" else ""

    @property
    def printed_differs(self) -> bool:
        """True when the printed line runs with another split than fit decided in process."""
        ts = self.fitted.ts
        # an all-zero split is the default split by free memory, with or without -ts
        return self.status == "success" and ts is not None and any(ts) and self.fitted.as_printed().ts != ts

    @property
    def limits(self) -> list[int]:
        """Bytes each device may use and keep its margin (``--fit-target``): free − margin
        (CPU only: the host's total − margin)."""
        if self.memory:
            return [m.free - t for m, t in zip(self.memory, self.targets)]
        if self.host is not None and self.targets:
            return [self.host.total - self.targets[0]]
        return []

    @property
    def chosen_probe(self) -> int | None:
        """Index of the probe fit settled on: the last one using what the fitted parameters use
        (None when fit did not succeed)."""
        if self.status != "success" or not self.memory:
            return None
        n = len(self.memory)
        return next((i for i in range(len(self.probes) - 1, -1, -1)
                     if tuple(self.probes[i].used(d) for d in range(n)) == tuple(self.used)), None)

    def missing_mib(self) -> dict[str, int]:
        """MiB each device lacks to keep its margin with the fitted parameters (only short devices)."""
        names = [m.name for m in self.memory] or ["Host"]
        used = self.used if self.memory else (self.host_used,)
        return {name: -(-(u - limit) // MiB) for name, u, limit in zip(names, used, self.limits) if u > limit}

    def check(self) -> FitResult:
        """Raise :class:`FitImpossible` when a device stays short of its margin; else return self."""
        missing = self.missing_mib()
        if missing or self.status != "success":
            raise FitImpossible(missing, self.error)
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status, "printed": self.printed, "fitted": self.fitted.to_dict(),
            "printed_differs": self.printed_differs, "probes": [p.to_dict() for p in self.probes],
            "log_lines": list(self.log_lines), **({"error": self.error} if self.error else {}), "exact": self.exact,
            "devices": [{"name": m.name, "description": m.description, "free": m.free, "total": m.total,
                         "target": t, "used": u} for m, t, u in zip(self.memory, self.targets, self.used)],
            "missing_mib": self.missing_mib(),
        }


@dataclass(frozen=True)
class FitPrint:
    """``llama-fit-params --fit-print on``: one probe, printed as rows instead of fitting."""

    rows: tuple[str, ...]
    probe: Probe
    log_lines: tuple[str, ...]

    @property
    def printed(self) -> str:
        """The stdout text without its final newline and trailing blank."""
        return "\n".join(self.rows).rstrip()


__all__ = ["FitImpossible", "FitPrint", "FitResult", "Fitted"]
