"""Trace files: the shared Chase trace and Electricity Maps history JSON; bad files get clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perseusd.carbon.traces import (
    SignalError,
    load_trace,
    median_step_s,
    parse_csv,
    parse_history,
    parse_time_s,
)


def test_the_chase_trace_has_167_half_hour_points(reference_data: Path) -> None:
    points = load_trace(reference_data / "carbon" / "chase_carbon_hist.csv")
    assert len(points) == 167
    assert median_step_s(points) == 1800.0
    assert points[0].at_s == parse_time_s("2022-10-20T06:20:00+00:00")
    assert points[0].value == pytest.approx(646.8567445847223)
    assert all(500 < p.value < 800 for p in points)


def test_electricity_maps_history_json_is_read_in_time_order(reference_data: Path) -> None:
    points = load_trace(reference_data / "carbon" / "electricitymaps_history_1.json")
    assert len(points) == 24
    assert points[0].value == 501
    assert points[-1].value == 494
    assert median_step_s(points) == 3600.0
    assert [p.at_s for p in points] == sorted(p.at_s for p in points)


def test_null_values_of_the_newest_hours_are_skipped() -> None:
    document = {
        "history": [
            {"datetime": "2024-12-01T05:00:00.000Z", "carbonIntensity": 494},
            {"datetime": "2024-12-01T06:00:00.000Z", "carbonIntensity": None},
        ]
    }
    assert [p.value for p in parse_history(document)] == [494.0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("timestamp,v\n2022-10-20T06:20:00Z,1\n", "'timestamp' and 'value' columns"),
        ("timestamp,value\n2022-10-20T06:20:00Z,abc\n", "line 2: value 'abc' is not a number"),
        ("timestamp,value\nyesterday,1\n", "not an ISO 8601 time"),
        ("timestamp,value\n2022-10-20T06:20:00Z,-5\n", "finite number >= 0"),
        ("timestamp,value\n2022-10-20T06:20:00Z,nan\n", "finite number >= 0"),
        ("timestamp,value\n", "no points"),
        ("timestamp,value\n2022-10-20T06:20:00Z,1\n2022-10-20T06:20:00Z,2\n", "share a time"),
    ],
)
def test_bad_csv_traces_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(SignalError, match=message):
        parse_csv(text)


@pytest.mark.parametrize(
    "document",
    [[], {"history": "x"}, {"history": [{"datetime": 5, "carbonIntensity": 1}]}, {"history": [3]}],
)
def test_bad_history_documents_are_refused(document: object) -> None:
    with pytest.raises(SignalError):
        parse_history(document)


def test_unreadable_and_non_json_files_are_signal_errors(tmp_path: Path) -> None:
    with pytest.raises(SignalError, match="cannot read"):
        load_trace(tmp_path / "missing.csv")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SignalError, match="not JSON"):
        load_trace(bad)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"history": [{"datetime": "2024-12-01T05:00:00Z", "carbonIntensity": 7}]}))
    assert load_trace(good)[0].value == 7.0
