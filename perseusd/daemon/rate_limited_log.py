"""Warnings that cannot flood the log: one line per key per interval, the rest counted (no transport here).

The IPC layer warns about what a client sent (a rejected request, a dropped event, a refused connection); a
client that sends the same mistake thousands of times a second must not turn each into a log line. The
lines go to the logger of the module that warns, so they name the IPC layer as before.
"""

from __future__ import annotations

import logging
import time
from collections import Counter


class RateLimitedLog:
    """One log line per key per interval; the rest are counted and summarised on the next line."""

    def __init__(self, logger: logging.Logger, interval_s: float = 5.0) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._last_s: dict[str, float] = {}
        self._suppressed: Counter[str] = Counter()

    def warning(self, key: str, message: str, *args: object) -> None:
        """Log `message % args` unless `key` was logged within the interval (formatted only when logged)."""
        now_s = time.monotonic()
        if now_s - self._last_s.get(key, -1e9) < self._interval_s:
            self._suppressed[key] += 1
            return
        self._last_s[key] = now_s
        suppressed = self._suppressed.pop(key, 0)
        extra = f" ({suppressed} similar suppressed)" if suppressed else ""
        self._logger.warning("%s%s", message % args if args else message, extra)
