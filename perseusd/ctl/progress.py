"""A minimal progress bar for long commands, drawn on stderr only when stderr is a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    """`done / expected` as a bar on one terminal line; does nothing when the stream is not a terminal."""

    def __init__(
        self, label: str, expected: int, stream: TextIO | None = None, min_interval_s: float = 0.1
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty()
        self.label = label
        self.expected = max(expected, 1)
        self.min_interval_s = min_interval_s
        self._last_draw_s = -float("inf")
        self._drawn = False

    def update(self, done: int) -> None:
        """Show `done` items finished (redrawn at most every `min_interval_s`)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last_draw_s < self.min_interval_s:
            return
        self._last_draw_s = now
        self._draw(done)

    def _draw(self, done: int) -> None:
        width = 30
        filled = min(width, width * done // self.expected)
        bar = "#" * filled + "." * (width - filled)
        self.stream.write(f"\r{self.label} [{bar}] {done}/{self.expected}")
        self.stream.flush()
        self._drawn = True

    def close(self, done: int) -> None:
        """Draw the final count and end the line."""
        if not self.enabled:
            return
        self._draw(done)
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
