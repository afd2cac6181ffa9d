"""Read and write profile CSV files (the format shared with Zeus), with strict validation.

Format: a header line naming at least the columns `stage,instruction,frequency,time,energy` (any order,
extra columns ignored), then one row per (stage, instruction, frequency): stage an integer 0..S-1,
instruction `forward` or `backward`, frequency the SM clock in MHz (a positive integer), time the duration
of one execution in seconds and energy its energy in joules (both finite and positive). An optional column
`waiting_power` gives the GPU's power (W, finite, >= 0) while it waits (pipeline bubbles) with the row's
clock held (`perseusd.planner.waiting`): rows of one clock give one value (or leave the cell empty); a file
without the column has no waiting power by clock, as before.

Every problem is a `ProfileError` naming the file, the 1-based line (the header is line 1) and the column.
Nothing is silently dropped: only blank lines are skipped. Stages are at most `MAX_STAGE` and clocks at most
`MAX_FREQ_MHZ`, so that checking a file takes time and memory linear in its size whatever its numbers say; at
most `MAX_ERRORS` problems are kept (the rest are counted in the last one's message).
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from perseusd.errors import ProfileError
from perseusd.planner.dag import Instruction
from perseusd.planner.profile import Measurement, Profile

COLUMNS: tuple[str, ...] = ("stage", "instruction", "frequency", "time", "energy")
"""The required columns, in the order `write_profile` writes them."""
WAITING_COLUMN = "waiting_power"
"""The optional column: the waiting power (W) with the row's clock held."""
MAX_WAITING_W = 10_000.0
"""The most a GPU can draw while waiting (W): far above any board's idle power."""
WaitingPoints = tuple[tuple[int, float], ...]
"""A waiting power by held clock: (MHz, W), clocks ascending (`WaitingPower.points`)."""

_INSTRUCTIONS = ", ".join(i.value for i in Instruction)
_NEEDED = "forward and backward, or forward, backward_input and backward_weight"
MAX_STAGE = 65_535
"""The largest stage number (1,024 stages of 64 chunks each: more than any job the daemon accepts)."""
MAX_FREQ_MHZ = 100_000
MAX_ERRORS = 100
MAX_TIME_S = 60.0
"""The longest one computation (a microbatch's forward or backward on one stage) may take: far above any
real one (tens to hundreds of ms), and below what a profile in milliseconds instead of seconds gives."""


@dataclass(frozen=True)
class _Row:
    """One parsed data row and the line it came from."""

    line: int
    measurement: Measurement
    waiting_w: float | None = None


def read_profile(path: str | os.PathLike[str]) -> Profile:
    """Read and validate a profile CSV file; raises `ProfileError` on the first problem found.

    The message of the raised error says how many more problems the file has; `check_profile` lists them all.
    """
    with open(path, encoding="utf-8-sig", newline="") as stream:
        return read_profile_stream(stream, source=os.fspath(path))


def read_profile_stream(stream: IO[str], source: str) -> Profile:
    """Read and validate a profile from a text stream; `source` names it in errors and in the profile."""
    return read_profile_waiting(stream, source)[0]


def read_profile_waiting(stream: IO[str], source: str) -> tuple[Profile, WaitingPoints]:
    """`read_profile_stream`, with the waiting power by clock its `waiting_power` column gives (empty
    without one)."""
    rows, errors = _parse(stream, source)
    if errors:
        first = errors[0]
        if len(errors) > 1:
            more = len(errors) - 1
            problem = f"{first.problem} (and {more} more problem{'s' if more > 1 else ''} in this file)"
            raise ProfileError(first.path, first.line, first.column, problem)
        raise first
    profile = Profile.from_measurements((r.measurement for r in rows), source=source)
    waiting = {r.measurement.freq_mhz: r.waiting_w for r in rows if r.waiting_w is not None}
    return profile, tuple(sorted(waiting.items()))


def check_profile(path: str | os.PathLike[str]) -> list[ProfileError]:
    """Every problem of a profile CSV file, in file order (empty when the file is valid)."""
    with open(path, encoding="utf-8-sig", newline="") as stream:
        return _parse(stream, os.fspath(path))[1]


def write_profile(profile: Profile, path_or_stream: str | os.PathLike[str] | IO[str]) -> None:
    """Write `profile` as CSV: the header, then one row per measurement (input order, exact floats)."""
    if isinstance(path_or_stream, str | os.PathLike):
        target = Path(path_or_stream)
        tmp = target.with_name(f".{target.name}.tmp")
        with open(tmp, "w", encoding="utf-8", newline="") as stream:
            _write_rows(profile.measurements, stream)
        os.replace(tmp, target)
    else:
        _write_rows(profile.measurements, path_or_stream)


def profile_to_csv(profile: Profile, waiting_w: WaitingPoints = ()) -> str:
    """The CSV text of `profile`; with a waiting power by clock, its `waiting_power` column too (each row
    the power at its clock, empty where none was given for that clock: a clock of `waiting_w` no row has is
    not written)."""
    buffer = io.StringIO()
    _write_rows(profile.measurements, buffer, dict(waiting_w))
    return buffer.getvalue()


def _write_rows(
    measurements: Iterable[Measurement], stream: IO[str], waiting_w: dict[int, float] | None = None
) -> None:
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow((*COLUMNS, WAITING_COLUMN) if waiting_w else COLUMNS)
    for m in measurements:
        row = [m.stage, m.instruction.value, m.freq_mhz, repr(m.time_s), repr(m.energy_j)]
        if waiting_w:
            watts = waiting_w.get(m.freq_mhz)
            row.append("" if watts is None else repr(watts))
        writer.writerow(row)


def _parse(stream: IO[str], source: str) -> tuple[list[_Row], list[ProfileError]]:
    reader = csv.reader(stream)
    header = next(reader, None)
    if header is None:
        return [], [ProfileError(source, 1, None, f"empty file; expected a header with {','.join(COLUMNS)}")]
    positions, errors = _check_header(header, source)
    if errors:
        return [], errors
    rows: list[_Row] = []
    found = 0
    for fields in reader:
        if not any(f.strip() for f in fields):
            continue
        row = _parse_row(fields, len(header), positions, source, reader.line_num)
        if isinstance(row, ProfileError):
            found += 1
            if len(errors) < MAX_ERRORS:
                errors.append(row)
        else:
            rows.append(row)
    if not rows and not errors:
        errors.append(ProfileError(source, 1, None, "no data rows after the header"))
    for error in (*_check_duplicates(rows, source), *_check_waiting(rows, source)):
        found += 1
        if len(errors) < MAX_ERRORS:
            errors.append(error)
    if not errors:  # coverage problems would only echo the rows already reported
        for error in _check_coverage(rows, source):
            found += 1
            if len(errors) < MAX_ERRORS:
                errors.append(error)
    errors.sort(key=lambda e: e.line)
    if found > len(errors) and errors:
        last = errors[-1]
        more = f" (and {found - len(errors)} more problems not listed)"
        errors[-1] = ProfileError(last.path, last.line, last.column, last.problem + more)
    return rows, errors


def _check_header(header: list[str], source: str) -> tuple[dict[str, int], list[ProfileError]]:
    names = [name.strip().lower() for name in header]
    errors: list[ProfileError] = []
    positions: dict[str, int] = {}
    for column in COLUMNS:
        count = names.count(column)
        if count == 0:
            problem = f"missing column (the header must name {','.join(COLUMNS)}; got {','.join(header)})"
            errors.append(ProfileError(source, 1, column, problem))
        elif count > 1:
            errors.append(ProfileError(source, 1, column, f"the column appears {count} times in the header"))
        else:
            positions[column] = names.index(column)
    count = names.count(WAITING_COLUMN)
    if count > 1:
        problem = f"the column appears {count} times in the header"
        errors.append(ProfileError(source, 1, WAITING_COLUMN, problem))
    elif count == 1:
        positions[WAITING_COLUMN] = names.index(WAITING_COLUMN)
    return positions, errors


def _parse_row(
    fields: list[str], width: int, positions: dict[str, int], source: str, line: int
) -> _Row | ProfileError:
    if len(fields) != width:
        return ProfileError(source, line, None, f"{len(fields)} fields, but the header has {width}")
    try:
        field = {column: fields[index] for column, index in positions.items()}
        stage = _parse_int(
            field["stage"], "stage", 0, MAX_STAGE, f"a non-negative integer (at most {MAX_STAGE})"
        )
        instruction = _parse_instruction(field["instruction"])
        freq_mhz = _parse_int(
            field["frequency"],
            "frequency",
            1,
            MAX_FREQ_MHZ,
            f"a positive integer (MHz, at most {MAX_FREQ_MHZ})",
        )
        time_s = _parse_positive_float(field["time"], "time", "seconds")
        if time_s > MAX_TIME_S:
            raise _FieldError(
                "time",
                f"{time_s:g} s for one computation is more than {MAX_TIME_S:g} s: times are in seconds "
                "(is this profile in milliseconds?)",
            )
        energy_j = _parse_positive_float(field["energy"], "energy", "joules")
        waiting_w = _parse_waiting(field.get(WAITING_COLUMN, ""))
    except _FieldError as exc:
        return ProfileError(source, line, exc.column, exc.problem)
    return _Row(line, Measurement(stage, instruction, freq_mhz, time_s, energy_j), waiting_w)


def _parse_waiting(text: str) -> float | None:
    """A `waiting_power` cell: None when empty, else watts in 0..`MAX_WAITING_W`."""
    if not text.strip():
        return None
    what = f"a waiting power in watts (0..{MAX_WAITING_W:g})"
    try:
        value = float(text.strip())
    except ValueError:
        raise _FieldError(WAITING_COLUMN, f"'{_clip(text)}' is not {what}") from None
    if not (math.isfinite(value) and 0.0 <= value <= MAX_WAITING_W):
        raise _FieldError(WAITING_COLUMN, f"'{_clip(text)}' is not {what}")
    return value


class _FieldError(Exception):
    """A bad field value; turned into a `ProfileError` with the line by the caller."""

    def __init__(self, column: str, problem: str) -> None:
        super().__init__(problem)
        self.column = column
        self.problem = problem


def _parse_int(text: str, column: str, minimum: int, maximum: int, what: str) -> int:
    stripped = text.strip()
    try:
        value = float(stripped)
    except ValueError:
        raise _FieldError(column, f"'{_clip(text)}' is not {what}") from None
    if not math.isfinite(value) or not minimum <= value <= maximum or value != int(value):
        raise _FieldError(column, f"'{_clip(text)}' is not {what}")
    return int(value)


def _clip(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else f"{text[:limit]}..."


def _parse_instruction(text: str) -> Instruction:
    try:
        return Instruction(text.strip())
    except ValueError:
        problem = f"unknown instruction '{text}' (expected one of {_INSTRUCTIONS})"
        raise _FieldError("instruction", problem) from None


def _parse_positive_float(text: str, column: str, unit: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise _FieldError(column, f"'{text}' is not a number ({unit})") from None
    if not math.isfinite(value):
        raise _FieldError(column, f"'{text}' is not a finite number ({unit})")
    if value <= 0.0:
        raise _FieldError(column, f"{column} must be positive (got {text.strip()} {unit})")
    return value


def _needed(present: set[Instruction]) -> list[Instruction]:
    """Forward, and backward or (when either half is there) both halves of the backward."""
    halves = [Instruction.BACKWARD_INPUT, Instruction.BACKWARD_WEIGHT]
    split = any(i in present for i in halves)
    whole = Instruction.BACKWARD in present or not split
    return [Instruction.FORWARD, *([Instruction.BACKWARD] if whole else []), *(halves if split else [])]


def _check_duplicates(rows: list[_Row], source: str) -> Iterator[ProfileError]:
    first_line: dict[tuple[int, Instruction, int], int] = {}
    for row in rows:
        m = row.measurement
        key = (m.stage, m.instruction, m.freq_mhz)
        if key in first_line:
            problem = (
                f"duplicate row for stage {m.stage} {m.instruction.value} at {m.freq_mhz} MHz "
                f"(first given on line {first_line[key]})"
            )
            yield ProfileError(source, row.line, "frequency", problem)
        else:
            first_line[key] = row.line


def _check_waiting(rows: list[_Row], source: str) -> Iterator[ProfileError]:
    """Rows of one clock give one waiting power (the GPU's, whatever it computes between its waits)."""
    first: dict[int, _Row] = {}
    for row in rows:
        if row.waiting_w is None:
            continue
        clock_mhz = row.measurement.freq_mhz
        seen = first.setdefault(clock_mhz, row)
        if seen.waiting_w != row.waiting_w:
            problem = (
                f"waiting power {row.waiting_w:g} W at {clock_mhz} MHz, but line {seen.line} gives "
                f"{seen.waiting_w:g} W for that clock (one value per clock)"
            )
            yield ProfileError(source, row.line, WAITING_COLUMN, problem)


def _check_coverage(rows: list[_Row], source: str) -> Iterator[ProfileError]:
    """Stages must be exactly 0..S-1 and every stage needs forward and backward rows (or the backward's two
    halves, for schedules that split it)."""
    first_line: dict[int, int] = {}
    instructions: dict[int, set[Instruction]] = {}
    for row in rows:
        stage = row.measurement.stage
        first_line.setdefault(stage, row.line)
        instructions.setdefault(stage, set()).add(row.measurement.instruction)
    if not first_line:
        return
    last = max(first_line)
    for stage in range(last + 1):
        if stage not in first_line:
            problem = f"stage {stage} has no rows (stages must be 0..{last} without gaps)"
            yield ProfileError(source, first_line[last], "stage", problem)
            continue
        for instruction in _needed(instructions[stage]):
            if instruction not in instructions[stage]:
                problem = f"stage {stage} has no {instruction.value} rows (each stage needs {_NEEDED})"
                yield ProfileError(source, first_line[stage], "instruction", problem)
