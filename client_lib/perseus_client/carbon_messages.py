"""The carbon fields of the wire protocol: the node's grid signal (status) and a job's carbon (jobs table).
`perseus_client.protocol` re-exports them. Units: the signal's, per kWh (gCO2eq/kWh, or a price)."""

from __future__ import annotations

from dataclasses import dataclass

from perseus_client.version import since


@dataclass(frozen=True)
class SignalInfo:
    """The node's grid signal: where it comes from, its state and the value carbon-aware jobs use."""

    source: str
    unit: str
    state: str
    """"ok"; "stale" (failing, the last value kept for a bounded time); "expired" or "failed" (no usable
    value: carbon-aware jobs run their default point)."""
    value: float | None
    forecast: float | None
    """The next interval's predicted value (what the carbon policy chooses by)."""
    forecaster: str
    mape_pct: dict[str, float]
    """Each forecaster's mean absolute percentage error on the recent history."""
    age_s: float | None
    """Seconds since the last successful read (None: never)."""
    error: str
    reference: float | None
    """Chase's reference intensity: the highest value of the last day."""


@dataclass(frozen=True)
class CarbonInfo:
    """A job's carbon so far on this node: grams of CO2eq when the signal is in gCO2eq/kWh, money when it is
    a price per kWh (`unit`; the `_g` names are kept for both)."""

    carbon_g: float
    """Measured energy (counters) x the signal's value while it was used."""
    all_max_carbon_g: float | None
    """The same iterations at all-max clocks (all-max energy per iteration x iterations x the same values)."""
    all_max_basis: str
    """How the all-max energy is known: "measured" (counters during profiling), "predicted" (profile),
    "mixed", or "" (not known)."""
    energy_j: float
    """The measured energy counted."""
    uncounted_energy_j: float
    """Energy used while the node had no usable signal (no carbon counted for it)."""
    basis: str
    """Why a `carbon` job runs its point: "forecast 612.3 gCO2eq/kWh" or "default (signal expired)"; "" for
    other policies."""
    unit: str = since(2, "")
    """The signal's unit (per kWh): "gCO2eq/kWh", or a price such as "EUR/kWh"; "" from a daemon older than
    minor 2 (gCO2eq/kWh)."""


def amount_unit(signal_unit: str) -> str:
    """What a job's totals are in: the signal's unit times kWh ("gCO2eq/kWh" -> "gCO2eq", "EUR/kWh" ->
    "EUR"; "" -> "gCO2eq"; a unit not per kWh gets "*kWh" appended)."""
    head, per, tail = (signal_unit or "gCO2eq/kWh").partition("/")
    return head.strip() if per and tail.strip().lower() == "kwh" else f"{signal_unit}*kWh"


def is_carbon(signal_unit: str) -> bool:
    """Whether the signal is a carbon intensity (grams of CO2 or CO2eq per kWh), not a price."""
    return amount_unit(signal_unit).lower().startswith("gco2")
