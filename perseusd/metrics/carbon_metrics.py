"""The grid signal and each job's carbon (or cost, when the signal is a price) as metrics.

Node: the signal's value in use, its forecast, the seconds since its last successful read and its state
(`ok`, `stale`: failing, the last value kept; `expired`/`failed`: no usable value, carbon-aware jobs run
their default point). Jobs: the measured energy times the signal so far and the same iterations at all-max
clocks, in the signal's unit times kWh (label `unit`: `gCO2eq` for a carbon intensity in gCO2eq/kWh, the
currency for a price per kWh), and the energy counted with and without a usable signal. Nothing is
exported without a configured signal.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from perseus_client.carbon_messages import amount_unit
from perseus_client.protocol import CarbonInfo, SignalInfo
from prometheus_client.core import Metric

from perseusd.carbon.keeper import EXPIRED, FAILED, OK, STALE
from perseusd.metrics.families import add_known, add_state_set, counter, gauge

SIGNAL_STATES = (OK, STALE, EXPIRED, FAILED)
JOB_UNIT = ("job_name", "uid", "unit")


def source_kind(description: str) -> str:
    """The signal's kind (`trace`, `electricitymaps`): a label that stays the same across traces, replay
    speeds and restarts (status keeps the whole description, e.g. "trace chase (167 points, x60)")."""
    return description.split(" ", 1)[0] or "unknown"


def signal_families(signal: SignalInfo) -> Iterator[Metric]:
    source = source_kind(signal.source)
    labels = [source, signal.unit]
    value = gauge(
        "grid_signal_value",
        "The grid signal's value in use, per kWh (carbon intensity or price: see unit); absent when unusable",
        ("source", "unit"),
    )
    forecast = gauge(
        "grid_signal_forecast", "The next interval's forecast value, per kWh", ("source", "unit")
    )
    age = gauge("grid_signal_age_seconds", "Seconds since the signal's last successful read", ("source",))
    state = gauge(
        "grid_signal_state", "1 for the signal's current state, 0 for the others", ("source", "state")
    )
    add_known(value, labels, signal.value)
    add_known(forecast, labels, signal.forecast)
    add_known(age, [source], signal.age_s)
    add_state_set(state, [source], SIGNAL_STATES, signal.state)
    yield from (value, forecast, age, state)


def job_carbon_families(rows: Sequence[tuple[str, int, CarbonInfo]], signal_unit: str) -> Iterator[Metric]:
    """`rows`: (job name, uid, its carbon) of each exported job."""
    unit = amount_unit(signal_unit)
    emitted = counter(
        "job_grid_cost",
        "The job's measured energy times the grid signal so far (gCO2eq for a carbon intensity, money for a "
        "price: see unit)",
        JOB_UNIT,
    )
    all_max = counter(
        "job_grid_cost_all_max",
        "What the same iterations would have cost at all-max clocks, at the same signal values; basis: how "
        "the all-max energy is known (measured by the counters, predicted from the profile, or mixed)",
        (*JOB_UNIT, "basis"),
    )
    energy = counter(
        "job_grid_energy_joules",
        "Energy counted by the ledger: with a usable signal (counted) or without (uncounted)",
        ("job_name", "uid", "signal"),
    )
    for job, uid, carbon in rows:
        key = [job, str(uid), unit]
        emitted.add_metric(key, carbon.carbon_g)
        add_known(all_max, [*key, carbon.all_max_basis or "predicted"], carbon.all_max_carbon_g)
        energy.add_metric([job, str(uid), "counted"], carbon.energy_j)
        energy.add_metric([job, str(uid), "uncounted"], carbon.uncounted_energy_j)
    yield from (emitted, all_max, energy)
