"""The waiting power by held clock in a profile file (the optional `waiting_power` column): written only when
there is one, read back exactly, checked strictly; a file without it reads as before."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from perseusd.errors import ProfileError
from perseusd.planner.profile_csv import (
    check_profile,
    profile_to_csv,
    read_profile,
    read_profile_stream,
    read_profile_waiting,
)
from tests.support.synthetic import A100_CLOCKS_MHZ, synthetic_profile

WAITING = ((1005, 61.25), (1410, 80.0))
HEADER = "stage,instruction,frequency,time,energy,waiting_power\n"


def _read(text: str) -> tuple[object, tuple[tuple[int, float], ...]]:
    return read_profile_waiting(io.StringIO(text), "p.csv")


def test_the_waiting_power_round_trips_exactly_and_a_profile_without_one_is_written_as_before() -> None:
    profile = synthetic_profile(2, seed=3, clocks_mhz=A100_CLOCKS_MHZ)
    text = profile_to_csv(profile, WAITING)
    assert text.splitlines()[0] == HEADER.strip()
    again, waiting = read_profile_waiting(io.StringIO(text), "p.csv")
    assert waiting == WAITING
    assert again.measurements == profile.measurements
    plain = profile_to_csv(profile)
    assert plain.splitlines()[0] == "stage,instruction,frequency,time,energy"
    assert profile_to_csv(profile, ()) == plain
    assert read_profile_waiting(io.StringIO(plain), "p.csv")[1] == ()
    assert read_profile_stream(io.StringIO(text), "p.csv").measurements == profile.measurements


def test_rows_at_clocks_without_a_waiting_power_leave_the_cell_empty() -> None:
    profile = synthetic_profile(2, seed=3, clocks_mhz=A100_CLOCKS_MHZ)
    lines = profile_to_csv(profile, ((1410, 80.0), (99, 5.0))).splitlines()[1:]
    at_top = [line for line in lines if line.split(",")[2] == "1410"]
    assert at_top
    assert all(line.endswith(",80.0") for line in at_top)
    assert all(line.endswith(",") for line in lines if line.split(",")[2] != "1410")
    assert _read("\n".join([HEADER.strip(), *lines]))[1] == ((1410, 80.0),)  # a clock no row has: not kept


@pytest.mark.parametrize("cell", ["-1", "nan", "1e6", "x"])
def test_a_bad_waiting_power_is_refused_with_its_line_and_column(tmp_path: Path, cell: str) -> None:
    path = tmp_path / "p.csv"
    path.write_text(HEADER + f"0,forward,1410,0.01,2.0,{cell}\n0,backward,1410,0.02,4.0,\n")
    with pytest.raises(ProfileError) as info:
        read_profile(path)
    assert (info.value.line, info.value.column) == (2, "waiting_power")
    assert "is not a waiting power in watts" in info.value.problem


def test_rows_of_one_clock_must_agree_and_the_column_appears_once(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text(HEADER + "0,forward,1410,0.01,2.0,80\n0,backward,1410,0.02,4.0,81\n")
    (problem,) = check_profile(path)
    assert (problem.line, problem.column) == (3, "waiting_power")
    assert "line 2 gives 80 W" in problem.problem
    path.write_text(HEADER.strip() + ",waiting_power\n0,forward,1410,0.01,2.0,80,80\n")
    assert any("appears 2 times" in p.problem for p in check_profile(path))
