"""A job's carbon: counter energy x the intensity in use, the same iterations at all-max beside it."""

from __future__ import annotations

import pytest

from perseusd.carbon.ledger import J_PER_KWH, CarbonLedger


def test_energy_between_readings_is_counted_at_the_intensity_in_use() -> None:
    ledger = CarbonLedger()
    ledger.observe("g0", (1, 0), 0, 500.0, 600.0)  # the first reading only marks
    assert ledger.carbon_g == 0.0
    ledger.observe("g0", (2, 3_600_000), 10, 500.0, 600.0)  # 3.6 kJ = 1/1000 kWh, 10 iterations
    assert ledger.energy_j == 3600.0
    assert ledger.carbon_g == pytest.approx(3600.0 / J_PER_KWH * 600.0)
    assert ledger.all_max_carbon_g == pytest.approx(10 * 500.0 / J_PER_KWH * 600.0)
    assert ledger.last_read_ns("g0") == 2


def test_without_a_signal_energy_is_uncounted_and_no_carbon_is_made_up() -> None:
    ledger = CarbonLedger()
    ledger.observe("g0", (1, 0), 0, 500.0, None)
    ledger.observe("g0", (2, 2_000_000), 4, 500.0, None)
    assert (ledger.carbon_g, ledger.all_max_carbon_g, ledger.uncounted_energy_j) == (0.0, 0.0, 2000.0)


def test_a_counter_that_starts_over_is_not_counted_backwards() -> None:
    ledger = CarbonLedger()
    ledger.observe("g0", (1, 5_000_000), 3, None, 100.0)
    ledger.observe("g0", (2, 1_000_000), 4, None, 100.0)
    ledger.observe("g0", (3, 2_000_000), 5, None, 100.0)
    assert ledger.energy_j == 1000.0
    assert ledger.all_max_carbon_g == 0.0
