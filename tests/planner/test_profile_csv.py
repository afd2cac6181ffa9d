"""Profile CSV reading, writing and validation (one test per validation rule)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from perseusd.errors import ProfileError
from perseusd.planner.bundled import BUNDLED_PROFILES, bundled_profile
from perseusd.planner.dag import Instruction
from perseusd.planner.profile import Measurement, Profile
from perseusd.planner.profile_csv import (
    MAX_ERRORS,
    MAX_STAGE,
    check_profile,
    profile_to_csv,
    read_profile,
    read_profile_stream,
    write_profile,
)
from tests.planner.periphery_profiles import shaped_profile

HEADER = "stage,instruction,frequency,time,energy\n"
GOOD_ROWS = [
    "0,forward,1410,0.01,2.0",
    "0,backward,1410,0.02,4.0",
    "1,forward,1410,0.011,2.2",
    "1,backward,1410,0.021,4.1",
]


def write(tmp_path: Path, text: str, name: str = "p.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def rows_with(*replacements: tuple[int, str]) -> str:
    rows = list(GOOD_ROWS)
    for index, row in replacements:
        rows[index] = row
    return HEADER + "\n".join(rows) + "\n"


def first_error(tmp_path: Path, text: str) -> ProfileError:
    path = write(tmp_path, text)
    with pytest.raises(ProfileError) as info:
        read_profile(path)
    assert info.value.path == str(path)
    return info.value


def test_round_trip_through_a_file(tmp_path: Path) -> None:
    profile = shaped_profile([1.0, 1.3, 0.8])
    path = tmp_path / "out.csv"
    write_profile(profile, path)
    again = read_profile(path)
    assert again.measurements == profile.measurements
    assert again.digest() == profile.digest()
    assert again.source == str(path)


def test_round_trip_keeps_floats_exact_through_a_stream() -> None:
    value = 0.1 + 0.2  # 0.30000000000000004: needs repr, not str formatting, to survive
    profile = Profile.from_measurements(
        [
            Measurement(0, Instruction.FORWARD, 1410, value, value * 3),
            Measurement(0, Instruction.BACKWARD, 1410, 1e-7, 123456.789012345),
        ]
    )
    buffer = io.StringIO()
    write_profile(profile, buffer)
    assert buffer.getvalue() == profile_to_csv(profile)
    buffer.seek(0)
    assert read_profile_stream(buffer, "mem").measurements == profile.measurements


def test_real_profile_round_trips(tmp_path: Path) -> None:
    profile = bundled_profile("a100_sxm")
    path = tmp_path / "a100.csv"
    write_profile(profile, path)
    assert read_profile(path).measurements == profile.measurements


def test_bundled_profiles_equal_the_reference_data(reference_data: Path) -> None:
    for name, entry in BUNDLED_PROFILES.items():
        measured = read_profile(reference_data / entry.origin)
        bundled = bundled_profile(name)
        assert bundled.digest() == measured.digest()
        assert bundled.source == f"bundled:{name}"
        assert bundled.num_stages == entry.num_stages


def test_column_order_is_free_and_extra_columns_are_ignored(tmp_path: Path) -> None:
    text = "energy,note,time,frequency,instruction,stage\n2.0,x,0.01,1410,forward,0\n"
    text += "4.0,y,0.02,1410,backward,0\n"
    profile = read_profile(write(tmp_path, text))
    expected = Measurement(0, Instruction.FORWARD, 1410, 0.01, 2.0)
    assert profile.lookup(0, Instruction.FORWARD, 1410) == expected
    assert profile.lookup(0, Instruction.BACKWARD, 1410).energy_j == 4.0


def test_blank_lines_and_a_byte_order_mark_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.csv"
    path.write_bytes(("\ufeff" + rows_with() + "\n\n").encode())
    assert len(read_profile(path).measurements) == 4


def test_missing_column(tmp_path: Path) -> None:
    error = first_error(tmp_path, "stage,instruction,frequency,time\n0,forward,1410,0.01\n")
    assert (error.line, error.column) == (1, "energy")
    assert "missing column" in error.problem


def test_duplicate_column(tmp_path: Path) -> None:
    text = "stage,instruction,frequency,time,energy,time\n0,forward,1410,0.01,2,0.01\n"
    error = first_error(tmp_path, text)
    assert (error.line, error.column) == (1, "time")


def test_empty_file(tmp_path: Path) -> None:
    error = first_error(tmp_path, "")
    assert error.line == 1
    assert "header" in error.problem


def test_header_without_rows(tmp_path: Path) -> None:
    error = first_error(tmp_path, HEADER)
    assert error.line == 1
    assert "no data rows" in error.problem


@pytest.mark.parametrize(
    ("row", "column", "fragment"),
    [
        ("0,forward,1410,fast,2.0", "time", "not a number"),
        ("0,forward,1410,0.01,", "energy", "not a number"),
        ("0,forward,1410,nan,2.0", "time", "not a finite number"),
        ("0,forward,1410,0.01,inf", "energy", "not a finite number"),
        ("0,forward,1410,0,2.0", "time", "must be positive"),
        ("0,forward,1410,0.01,-2.0", "energy", "must be positive"),
        ("0,forward,1410.5,0.01,2.0", "frequency", "positive integer"),
        ("0,forward,0,0.01,2.0", "frequency", "positive integer"),
        ("0,forward,high,0.01,2.0", "frequency", "positive integer"),
        ("-1,forward,1410,0.01,2.0", "stage", "non-negative integer"),
        ("zero,forward,1410,0.01,2.0", "stage", "non-negative integer"),
        ("0,fwd,1410,0.01,2.0", "instruction", "unknown instruction"),
        ("0,forward,1410,71.56,2.0", "time", "is this profile in milliseconds?"),
    ],
)
def test_bad_field(tmp_path: Path, row: str, column: str, fragment: str) -> None:
    error = first_error(tmp_path, rows_with((0, row)))
    assert (error.line, error.column) == (2, column)
    assert fragment in error.problem
    assert f":2: column '{column}'" in str(error)


def test_wrong_number_of_fields(tmp_path: Path) -> None:
    error = first_error(tmp_path, rows_with((2, "1,forward,1410,0.011")))
    assert error.line == 4
    assert "4 fields" in error.problem


def test_duplicate_row(tmp_path: Path) -> None:
    error = first_error(tmp_path, rows_with((2, "0,forward,1410,0.012,2.3")))
    assert (error.line, error.column) == (4, "frequency")
    assert "duplicate" in error.problem
    assert "line 2" in error.problem


def test_stages_must_start_at_zero_without_gaps(tmp_path: Path) -> None:
    text = rows_with((2, "2,forward,1410,0.011,2.2"), (3, "2,backward,1410,0.021,4.1"))
    error = first_error(tmp_path, text)
    assert (error.line, error.column) == (4, "stage")
    assert "stage 1 has no rows" in error.problem


def test_stage_without_backward_rows(tmp_path: Path) -> None:
    text = rows_with((3, "1,forward,1320,0.012,2.1"))
    error = first_error(tmp_path, text)
    assert (error.line, error.column) == (4, "instruction")
    assert "stage 1 has no backward rows" in error.problem


def test_stage_without_forward_rows(tmp_path: Path) -> None:
    error = first_error(tmp_path, rows_with((0, "0,backward,1320,0.02,4.0")))
    assert error.column == "instruction"
    assert "stage 0 has no forward rows" in error.problem


def test_every_problem_is_reported_in_line_order(tmp_path: Path) -> None:
    text = rows_with((0, "0,forward,1410,nan,2.0"), (2, "1,forward,x,0.011,2.2"))
    path = write(tmp_path, text)
    errors = check_profile(path)
    assert [(e.line, e.column) for e in errors] == [(2, "time"), (4, "frequency")]
    with pytest.raises(ProfileError, match=r"^.*:2: column 'time': .*\(and 1 more problem in this file\)$"):
        read_profile(path)


def test_a_valid_file_has_no_problems(tmp_path: Path) -> None:
    assert check_profile(write(tmp_path, rows_with())) == []


def test_huge_stage_number_is_refused_with_line_and_column() -> None:
    text = "stage,instruction,frequency,time,energy\n3000000,forward,1410,0.01,2.0\n"
    with pytest.raises(ProfileError) as refused:
        read_profile_stream(io.StringIO(text), "huge.csv")
    assert (refused.value.line, refused.value.column) == (2, "stage")
    assert f"at most {MAX_STAGE}" in refused.value.problem


def test_gaps_up_to_the_largest_stage_and_bad_rows_are_bounded(tmp_path: Path) -> None:
    """A valid row at the largest stage leaves 65,535 gaps; 10,000 bad rows: both are cut at MAX_ERRORS
    problems, the last saying how many more there are."""
    rows = [f"{MAX_STAGE},forward,1410,0.01,2.0", f"{MAX_STAGE},backward,1410,0.01,2.0"]
    errors = check_profile(write(tmp_path, HEADER + "\n".join(rows) + "\n"))
    assert len(errors) == MAX_ERRORS
    assert "more problems not listed" in errors[-1].problem
    errors = check_profile(write(tmp_path, HEADER + "x,forward,1410,0.01,2.0\n" * 10_000, "bad.csv"))
    assert len(errors) == MAX_ERRORS
    assert "9900 more problems" in errors[-1].problem
