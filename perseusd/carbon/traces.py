"""Grid signal traces: carbon intensity (gCO2eq/kWh) or electricity price per kWh over time.

Two formats are read:

- a CSV with a `timestamp` (ISO 8601) and a `value` column, one row per interval (the Chase trace:
  `location,timestamp,duration,value,hist`; any other columns are ignored);
- the Electricity Maps API v3 `carbon-intensity/history` JSON: `{"history": [{"datetime": ISO 8601,
  "carbonIntensity": number}, ...]}` (the `/latest` reply is one such entry at the top level).
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from perseusd.errors import PerseusError


class SignalError(PerseusError):
    """A signal source or trace could not be read or made no sense."""


@dataclass(frozen=True)
class SignalPoint:
    """One value of a grid signal: from `at_s` (Unix seconds) until the next point."""

    at_s: float
    value: float


def parse_time_s(text: str) -> float:
    """Unix seconds from an ISO 8601 time (`Z` or an offset; a naive time counts as UTC)."""
    try:
        parsed = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError as exc:
        raise SignalError(f"not an ISO 8601 time: {text!r}") from exc
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC).timestamp()
    return parsed.timestamp()


def _checked(at_s: float, value: float, where: str) -> SignalPoint:
    if not math.isfinite(value) or value < 0:
        raise SignalError(f"{where}: the value must be a finite number >= 0 (got {value})")
    return SignalPoint(at_s, value)


def parse_csv(text: str, where: str = "trace") -> list[SignalPoint]:
    """Points of a CSV trace with `timestamp` and `value` columns, in time order."""
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames is None or not {"timestamp", "value"} <= set(reader.fieldnames):
        raise SignalError(f"{where}: a CSV trace needs 'timestamp' and 'value' columns")
    points = []
    for number, row in enumerate(reader, start=2):
        try:
            value = float(row["value"])
        except (TypeError, ValueError) as exc:
            raise SignalError(f"{where} line {number}: value {row['value']!r} is not a number") from exc
        points.append(_checked(parse_time_s(row["timestamp"] or ""), value, f"{where} line {number}"))
    return _ordered(points, where)


def entry_point(entry: Any, where: str) -> SignalPoint:
    """One Electricity Maps entry (`datetime`, `carbonIntensity`) as a point."""
    if not isinstance(entry, dict):
        raise SignalError(f"{where}: an entry is not an object")
    value = entry.get("carbonIntensity")
    stamp = entry.get("datetime")
    if isinstance(value, bool) or not isinstance(value, int | float) or not isinstance(stamp, str):
        raise SignalError(f"{where}: an entry needs 'datetime' (text) and 'carbonIntensity' (number)")
    return _checked(parse_time_s(stamp), float(value), where)


def parse_history(document: Any, where: str = "history") -> list[SignalPoint]:
    """Points of an Electricity Maps `history` reply, in time order (entries without a value are skipped:
    the API leaves the newest ones null until they are known)."""
    if not isinstance(document, dict) or not isinstance(document.get("history"), list):
        raise SignalError(f"{where}: expected an object with a 'history' list")
    entries = [
        e for e in document["history"] if not (isinstance(e, dict) and e.get("carbonIntensity") is None)
    ]
    return _ordered([entry_point(e, where) for e in entries], where)


def _ordered(points: Sequence[SignalPoint], where: str) -> list[SignalPoint]:
    if not points:
        raise SignalError(f"{where}: no points")
    ordered = sorted(points, key=lambda p: p.at_s)
    if any(b.at_s == a.at_s for a, b in itertools.pairwise(ordered)):
        raise SignalError(f"{where}: two points share a time")
    return ordered


def load_trace(path: Path) -> list[SignalPoint]:
    """A trace file: Electricity Maps history JSON (`.json`) or a CSV trace (anything else)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SignalError(f"cannot read the signal trace {path}: {exc.strerror or exc}") from exc
    if path.suffix == ".json":
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SignalError(f"{path}: not JSON ({exc})") from exc
        return parse_history(document, str(path))
    return parse_csv(text, str(path))


def median_step_s(points: Sequence[SignalPoint]) -> float:
    """The trace's usual interval (s): the median gap between points (1 h for a single point)."""
    gaps = sorted(b.at_s - a.at_s for a, b in itertools.pairwise(points))
    return gaps[len(gaps) // 2] if gaps else 3600.0
