"""Fault injection for simulated GPUs: a lost GPU, an NVML-like error on one operation, a slow call.

Faults come from `SimBackend(faults=...)`, from `SimDevice.inject_fault(...)` at run time, or from the
environment variable `PERSEUSD_SIM_FAULTS` (read by `perseusd.gpu.select.open_backend`), a JSON list such as
`[{"gpu": 0, "op": "reset_locked_sm_clock", "kind": "error", "error": "no_permission"}]`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from perseusd.gpu.errors import ERROR_KINDS, GpuInvalidArgumentError, GpuLostError, GpuOperationError

FAULTS_ENV = "PERSEUSD_SIM_FAULTS"

DEVICE_OPS = frozenset(
    {
        "set_locked_sm_clock_mhz",
        "reset_locked_sm_clock",
        "locked_sm_clock_mhz",
        "sm_clock_mhz",
        "set_power_limit_w",
        "power_limit_w",
        "energy_mj",
        "power_w",
    }
)
"""Operations a fault can name; "*" names them all."""

FAULT_KINDS = frozenset({"lost", "error", "slow"})


@dataclass(frozen=True)
class SimFault:
    """One injected fault.

    Attributes:
        op: a `GpuDevice` method name, or "*" for every operation ("lost" always applies to every operation).
        kind: "lost" (every call raises `GpuLostError`), "error" (calls of `op` raise the typed error named by
            `error`), or "slow" (calls of `op` first sleep `delay_s`).
        delay_s: the delay of a "slow" fault (s).
        error: for "error": a key of `perseusd.gpu.errors.ERROR_KINDS` ("unknown", "no_permission", ...).
        gpu: the GPU index it applies to, or None for every GPU (used by the backend, not the device).
    """

    op: str = "*"
    kind: str = "error"
    delay_s: float = 0.0
    error: str = "unknown"
    gpu: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise GpuInvalidArgumentError(f"unknown fault kind {self.kind!r}", op="inject_fault")
        if self.op != "*" and self.op not in DEVICE_OPS:
            raise GpuInvalidArgumentError(f"unknown operation {self.op!r}", op="inject_fault")
        if self.error not in ERROR_KINDS:
            raise GpuInvalidArgumentError(f"unknown error kind {self.error!r}", op="inject_fault")
        if self.delay_s < 0:
            raise GpuInvalidArgumentError("delay_s must be >= 0", op="inject_fault")

    def applies_to(self, op: str) -> bool:
        return self.kind == "lost" or self.op in ("*", op)


def parse_faults(text: str) -> list[SimFault]:
    """Faults from the JSON of `PERSEUSD_SIM_FAULTS`; raises `GpuInvalidArgumentError` when malformed."""
    try:
        items = json.loads(text)
        if not isinstance(items, list):
            raise TypeError("expected a JSON list")
        return [SimFault(**item) for item in items]
    except GpuInvalidArgumentError as error:
        raise GpuInvalidArgumentError(f"{FAULTS_ENV}: {error.detail}", op="inject_fault") from error
    except (ValueError, TypeError) as error:
        raise GpuInvalidArgumentError(f"{FAULTS_ENV}: {error}", op="inject_fault") from error


class FaultSet:
    """The faults active on one simulated GPU."""

    def __init__(self, uuid: str, sleep: Callable[[float], None]) -> None:
        self._uuid = uuid
        self._sleep = sleep
        self._faults: list[SimFault] = []

    def add(self, fault: SimFault) -> None:
        self._faults.append(fault)

    def clear(self) -> None:
        self._faults = []

    def check(self, op: str) -> None:
        """Apply the faults matching `op`: sleep for slow calls, then raise for lost GPUs and errors."""
        matching = [fault for fault in self._faults if fault.applies_to(op)]
        for fault in matching:
            if fault.kind == "slow":
                self._sleep(fault.delay_s)
        for fault in matching:
            if fault.kind == "lost":
                raise GpuLostError("simulated GPU lost (injected fault)", uuid=self._uuid, op=op)
        for fault in matching:
            if fault.kind == "error":
                error_class: type[GpuOperationError] = ERROR_KINDS[fault.error]
                raise error_class("injected fault", uuid=self._uuid, op=op)
