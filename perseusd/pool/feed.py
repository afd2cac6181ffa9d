"""`BudgetFile`: a pool's budget from a file that a facility controller writes (a demand-response signal, a
DCIM), read by the pool agent of the nodes configured with it and written to etcd as the pool's requested
budget.

The file holds a JSON object, `{"budget_w": 24000, "source": "dr-event-17", "at_s": 1767225600}` (`source`
optional, shown in status; `at_s` optional, the Unix time the signal was issued, else the file's
modification time), or a bare number of watts. The controller writes it atomically (write, then rename) and
rewrites it at least every `max_age_s`: a signal older than that is stale, the pool's grants are held for
`hold_s` more and then every node holds its safe cap (the allocator enforces it; docs/power-pool.md).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from perseusd.pool.keys import Budget

MAX_BUDGET_W = 1e9
MAX_FILE_BYTES = 4096


@dataclass(frozen=True)
class FeedSettings:
    """Where the signal is and how long it stays valid (s; `max_age_s` > 0)."""

    path: Path
    max_age_s: float
    hold_s: float

    def __post_init__(self) -> None:
        if not 0 < self.max_age_s <= 86400 or not 0 <= self.hold_s <= 86400:
            raise ValueError(
                "power pool budget file: max age must be in (0, 86400] s and hold in [0, 86400] s"
            )


class BudgetFile:
    """Reads the signal when the file changed (see module); `read()` returns the budget to request."""

    def __init__(self, settings: FeedSettings) -> None:
        self.settings = settings
        self._stamp: tuple[int, int] | None = None
        self._budget: Budget | None = None

    def read(self) -> Budget | None:
        """The budget the file asks for, as a pool request (None: no file yet).

        Raises:
            ValueError: the file cannot be read or does not hold a budget (the last budget stays requested
                and ages; the message says what is wrong).
        """
        path = self.settings.path
        try:
            stat = path.stat()
        except FileNotFoundError:
            return self._budget
        except OSError as exc:
            raise ValueError(f"budget file {path}: {exc.strerror or exc}") from None
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return self._budget
        if stat.st_size > MAX_FILE_BYTES:
            raise ValueError(f"budget file {path}: larger than {MAX_FILE_BYTES} bytes")
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"budget file {path}: {exc}") from None
        budget_w, source, at_s = parse_signal(text, stat.st_mtime, str(path))
        self._stamp = stamp
        self._budget = Budget(
            budget_w, f"{source} (file {path})"[:200], at_s, self.settings.max_age_s, self.settings.hold_s
        )
        return self._budget


def parse_signal(text: str, mtime_s: float, where: str) -> tuple[float, str, float]:
    """(budget W, source, issued at Unix s) from the file's text (ValueError naming `where` if malformed)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"budget file {where}: not JSON ({exc})") from None
    if isinstance(data, dict):
        budget, source, at_s = data.get("budget_w"), data.get("source", "facility"), data.get("at_s", mtime_s)
    else:
        budget, source, at_s = data, "facility", mtime_s
    budget_w, issued_s = _finite(budget), _finite(at_s)
    if budget_w is None or not 0 <= budget_w <= MAX_BUDGET_W:
        raise ValueError(f"budget file {where}: budget_w must be a number of watts in [0, 1e9]")
    if issued_s is None or issued_s < 0:
        raise ValueError(f"budget file {where}: at_s must be a Unix time in seconds")
    if not isinstance(source, str) or not source.isprintable():
        raise ValueError(f"budget file {where}: source must be a printable string")
    return budget_w, source or "facility", issued_s


def _finite(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None
