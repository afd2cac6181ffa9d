"""What `perseusctl status` and `jobs` say about the grid signal and a job's carbon, and `--policy carbon`."""

from __future__ import annotations

import dataclasses

import pytest
from perseus_client.carbon_messages import amount_unit, is_carbon
from perseus_client.protocol import CarbonInfo, DaemonHealth, SignalInfo, StatusReply

from perseusd.ctl.jobs_cmd import carbon_part, policy_label
from perseusd.ctl.plan_cmd import UsageError, parse_target
from perseusd.ctl.status_cmd import render_table, signal_line, status_json

OK = SignalInfo(
    source="trace chase_carbon_hist.csv (167 points, x60)",
    unit="gCO2eq/kWh",
    state="ok",
    value=612.34,
    forecast=610.1,
    forecaster="persistence",
    mape_pct={"persistence": 1.21, "svr": 1.346},
    age_s=12.0,
    error="",
    reference=726.9,
)


def test_a_usable_signal_line() -> None:
    assert signal_line(OK) == (
        "grid signal: trace chase_carbon_hist.csv (167 points, x60), ok: 612.3 gCO2eq/kWh, "
        "forecast 610.1 (persistence; MAPE persistence 1.21 %, svr 1.35 %), 0h00m12s old"
    )


def test_a_stale_and_an_expired_signal_say_so() -> None:
    stale = dataclasses.replace(OK, state="stale", error="HTTP 503")
    assert signal_line(stale).endswith("0h00m12s old, failing: HTTP 503")
    expired = dataclasses.replace(OK, state="expired", value=None, forecast=None, error="HTTP 503")
    assert signal_line(expired) == (
        "grid signal: trace chase_carbon_hist.csv (167 points, x60), expired (HTTP 503): "
        "carbon-aware jobs run their default point"
    )


def test_status_shows_the_signal_under_the_header_and_in_json() -> None:
    reply = StatusReply(
        daemon=DaemonHealth("0.1.0", 1, 42, 3725.0, 1, 100, 2, {}, 3, 0, 0.0004, 0), gpus=(), signal=OK
    )
    lines = render_table(reply).splitlines()
    assert lines[3] == signal_line(OK)
    body = status_json(reply)
    assert body["signal"]["value"] == 612.34
    assert body["signal"]["mape_pct"] == {"persistence": 1.21, "svr": 1.346}
    assert status_json(dataclasses.replace(reply, signal=None))["signal"] is None


def test_a_jobs_carbon_part() -> None:
    carbon = CarbonInfo(0.02373, 0.02811, "measured", 170.9, 0.0, "forecast 612.3 gCO2eq/kWh")
    assert carbon_part(carbon) == (
        "carbon 0.0237 g (measured) vs 0.0281 g at all-max (measured), point by forecast 612.3 gCO2eq/kWh"
    )
    mixed = CarbonInfo(0.144, 4.58, "predicted", 170.9, 0.0, "")  # each figure its own basis
    assert carbon_part(mixed) == "carbon 0.144 g (measured) vs 4.58 g at all-max (predicted)"
    unknown = CarbonInfo(12.5, None, "", 9000.0, 2500.0, "")
    assert carbon_part(unknown) == "carbon 12.5 g (measured), 2.5 kJ without a signal"


def test_a_price_signal_is_named_a_cost_in_its_currency() -> None:
    price = CarbonInfo(0.0123, 0.0141, "measured", 170.9, 0.0, "forecast 0.3 EUR/kWh", unit="EUR/kWh")
    assert carbon_part(price) == (
        "cost 0.0123 EUR (measured) vs 0.0141 EUR at all-max (measured), point by forecast 0.3 EUR/kWh"
    )
    assert amount_unit("gCO2eq/kWh") == amount_unit("") == "gCO2eq"
    assert amount_unit("USD / kWh") == "USD"
    assert amount_unit("gCO2eq/MWh") == "gCO2eq/MWh*kWh"
    assert is_carbon("gCO2/kWh")
    assert not is_carbon("EUR/kWh")
    explicit = CarbonInfo(1.0, None, "", 1.0, 0.0, "", unit="gCO2eq/kWh")
    assert carbon_part(explicit) == "carbon 1 g (measured)"


def test_the_carbon_policy_label_and_target() -> None:
    assert policy_label("carbon", 0.05) == "carbon 5 %"
    assert parse_target("carbon", "5%") == pytest.approx(0.05)
    assert parse_target("carbon", "0.1") == pytest.approx(0.1)
    assert parse_target("carbon", None) == 0.0
    with pytest.raises(UsageError, match="out of range"):
        parse_target("carbon", "-1%")
