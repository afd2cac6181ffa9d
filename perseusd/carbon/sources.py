"""Where a node's grid signal comes from: a replayed trace, or the Electricity Maps API (v3).

A source's `fetch()` returns the recent history of the signal, oldest first, the current value last (the
forecaster trains on it). It may block (network) and raise `SignalError`; the `SignalPoller` calls it from its
own thread and decides what a failure means.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from perseusd.carbon.traces import SignalError, SignalPoint, entry_point, parse_history

HISTORY_S = 2 * 86400.0
"""How much history a replayed trace hands out (the forecaster trains on the last day of it)."""


class SignalSource(Protocol):
    """A grid signal: `describe()` for status and logs, `fetch()` for the recent history, newest last."""

    def describe(self) -> str: ...
    def fetch(self) -> list[SignalPoint]: ...


class TraceReplay:
    """A trace replayed against the wall clock, `speed` trace seconds per wall second, looping at its end.

    Trace time starts at the trace's first point when the replay is made (`started_s`, wall Unix seconds).
    Each fetch hands out the points of the last two trace days up to the current position (after a loop,
    only those since the loop began)."""

    def __init__(
        self,
        points: Sequence[SignalPoint],
        speed: float = 1.0,
        started_s: float | None = None,
        clock_s: Callable[[], float] = time.time,
        name: str = "trace",
    ) -> None:
        if not points:
            raise SignalError("a replayed trace needs at least one point")
        if not speed > 0:
            raise SignalError(f"the replay speed must be > 0 (got {speed})")
        self._points = list(points)
        self._speed = speed
        self._clock_s = clock_s
        self._started_s = clock_s() if started_s is None else started_s
        self._name = name
        step_s = self._points[1].at_s - self._points[0].at_s if len(self._points) > 1 else 3600.0
        self._span_s = self._points[-1].at_s - self._points[0].at_s + step_s

    def describe(self) -> str:
        return f"trace {self._name} ({len(self._points)} points, x{self._speed:g})"

    def position_s(self) -> float:
        """The trace time (Unix seconds of the trace) the replay is at now."""
        elapsed_s = max(0.0, self._clock_s() - self._started_s) * self._speed
        return self._points[0].at_s + elapsed_s % self._span_s

    def fetch(self) -> list[SignalPoint]:
        now_s = self.position_s()
        return [p for p in self._points if now_s - HISTORY_S < p.at_s <= now_s]


@dataclass(frozen=True)
class ElectricityMapsSettings:
    """The Electricity Maps API v3: the zone, where the API is, and the file holding the token."""

    zone: str
    token_file: Path
    base_url: str = "https://api.electricitymap.org/v3"
    timeout_s: float = 10.0


MAX_TOKEN_BYTES = 4096


def read_token(path: Path) -> str:
    """The API token from a regular file only its owner (the daemon's user) may read: a symlink (never
    followed), a FIFO or device, a file of another user or readable by others is refused. The checks are made
    on the opened file itself, so the file cannot be swapped between them and the read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SignalError(f"the token file {path} is a symlink: give the file itself") from None
        raise SignalError(
            f"cannot read the Electricity Maps token file {path}: {exc.strerror or exc}"
        ) from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SignalError(f"the token file {path} is not a regular file")
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise SignalError(f"the token file {path} is readable by others: chmod 600 {path}")
        if info.st_uid != os.geteuid():
            raise SignalError(f"the token file {path} belongs to another user: it must be the daemon's own")
        text = os.read(fd, MAX_TOKEN_BYTES).decode(errors="replace").strip()
    finally:
        os.close(fd)
    if not text:
        raise SignalError(f"the token file {path} is empty")
    return text


class ElectricityMaps:
    """The Electricity Maps API v3: `carbon-intensity/history` (the last 24 h) and `carbon-intensity/latest`.
    The token is read from its file at every fetch (a rotated token is picked up)."""

    def __init__(self, settings: ElectricityMapsSettings) -> None:
        if not settings.zone:
            raise SignalError("the Electricity Maps source needs a zone (for example US-MIDW-MISO)")
        self._settings = settings

    def describe(self) -> str:
        return f"electricitymaps zone {self._settings.zone}"

    def _get(self, endpoint: str, token: str) -> Any:
        query = urllib.parse.urlencode({"zone": self._settings.zone})
        url = f"{self._settings.base_url.rstrip('/')}/carbon-intensity/{endpoint}?{query}"
        request = urllib.request.Request(url, headers={"auth-token": token, "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self._settings.timeout_s) as reply:
                return json.loads(reply.read(1 << 22))
        except urllib.error.HTTPError as exc:
            raise SignalError(f"electricitymaps {endpoint}: HTTP {exc.code} {exc.reason}") from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SignalError(f"electricitymaps {endpoint}: {reason}") from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SignalError(f"electricitymaps {endpoint}: the reply is not JSON") from exc

    def fetch(self) -> list[SignalPoint]:
        token = read_token(self._settings.token_file)
        points = {p.at_s: p for p in parse_history(self._get("history", token), "electricitymaps history")}
        latest = entry_point(self._get("latest", token), "electricitymaps latest")
        points[latest.at_s] = latest
        return [points[at_s] for at_s in sorted(points)]
