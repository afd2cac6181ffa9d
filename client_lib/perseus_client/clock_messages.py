"""GPU-setting messages of the wire protocol: lock a leased GPU's SM clock, deploy or clear its
per-computation clock plan, and (admin) set its power limit. `perseus_client.message_types` registers
them, `perseus_client.protocol` re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass

from perseus_client.message import GpuMessage, Instruction


@dataclass(frozen=True)
class SetClock(GpuMessage, wire_type="set_clock"):
    """Lock the SM clock of a leased GPU (None unlocks)."""

    sm_clock_mhz: int | None


@dataclass(frozen=True)
class SetClockOk(GpuMessage, wire_type="set_clock_ok"):
    applied_mhz: int | None


@dataclass(frozen=True)
class PlanEntry:
    """One computation of a plan: its clock (MHz). A plan lists a GPU's computations in schedule order."""

    instruction: Instruction
    microbatch: int
    chunk: int
    freq_mhz: int


@dataclass(frozen=True)
class SetPlan(GpuMessage, wire_type="set_plan"):
    """Deploy a per-computation clock plan on a leased GPU (replaces any plan it had)."""

    plan: tuple[PlanEntry, ...]


@dataclass(frozen=True)
class SetPlanOk(GpuMessage, wire_type="set_plan_ok"):
    computations: int


@dataclass(frozen=True)
class ClearPlan(GpuMessage, wire_type="clear_plan"):
    """Remove a leased GPU's plan; its clock stays as it is."""


@dataclass(frozen=True)
class ClearPlanOk(GpuMessage, wire_type="clear_plan_ok"):
    cleared: bool


@dataclass(frozen=True)
class AdminSetPowerLimit(GpuMessage, wire_type="admin_set_power_limit"):
    power_limit_w: float


@dataclass(frozen=True)
class PowerLimitOk(GpuMessage, wire_type="power_limit_ok"):
    requested_w: float
    enforced_w: float
