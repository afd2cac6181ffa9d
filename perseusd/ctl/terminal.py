"""Plain-text output shared by perseusctl commands: values with a placeholder, aligned tables, redrawing.

Collection is kept apart from rendering (commands fetch a reply, then render it with these helpers), so
every table can be tested on constructed replies without a daemon.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

PLACEHOLDER = "-"
"""What an unavailable value prints as."""

CLEAR_SCREEN = "\x1b[H\x1b[2J"
MIN_WATCH_INTERVAL_S = 0.1
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
"""What never reaches a terminal as it is: C0/C1 controls (escape sequences begin with one) but newline and
tab, Unicode line separators and bidi overrides, lone surrogates (which cannot even be encoded)."""


def printable(text: str) -> str:
    """`text` with every unsafe character written as its visible escape (`\\x1b`, `\\ud800`)."""
    return _UNSAFE.sub(lambda match: ascii(match.group())[1:-1], text)


class SafeText:
    """A text stream whose `write` passes only `printable` text: a job name from a daemon's reply (another
    user's, or a hostile process owning the socket) never sends escape sequences to the reader's terminal,
    and never crashes the command. `write_raw` is for perseusctl's own control sequences."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(printable(text))

    def write_raw(self, text: str) -> int:
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def safe_output() -> Iterator[None]:
    """stdout and stderr as `SafeText` for the duration."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = SafeText(saved[0]), SafeText(saved[1])
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def fmt(value: float | None, digits: int = 0) -> str:
    """A number for a table cell: floats with `digits` decimals, ints as they are, None as the placeholder."""
    if value is None:
        return PLACEHOLDER
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def fmt_unit(value: float | None, digits: int, unit: str) -> str:
    """A quantity with its unit (`2.8300 s`, `12.3 kJ`), None as the placeholder (never `- s`)."""
    return PLACEHOLDER if value is None else f"{value:.{digits}f} {unit}"


def fmt_duration(seconds: float) -> str:
    """A duration as `1h02m05s` (whole seconds)."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s"


def fmt_pct(fraction: float | None, digits: int = 1, *, sign: bool = False) -> str:
    """A fraction (0.05) as a percentage (`5.0 %`, or `+5.0 %` with `sign`)."""
    if fraction is None:
        return PLACEHOLDER
    return f"{100.0 * fraction:{'+' if sign else ''}.{digits}f} %"


def format_table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns two spaces apart; the first row is the header.

    The header's last column is not padded, and a row's last cell never widens a column: a short row (an
    error row: a few cells, then the message) lets its last cell run on, and cells past the header's
    (a trailing error) are appended as they are.
    """
    columns = len(rows[0]) - 1
    widths = [max((len(row[i]) for row in rows if len(row) > i + 1), default=0) for i in range(columns)]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  ".join(cells + list(row[len(cells) :])).rstrip())
    return lines


def watch(render: Callable[[], str], interval_s: float, *, clear: bool) -> int:
    """Print `render()` every `interval_s` until Ctrl-C (exit code 0).

    The next screen is rendered before the old one is cleared, so a slow daemon never leaves a blank
    terminal; with `clear` False (JSON), or stdout not a terminal (a pipe, a file), every snapshot is
    printed after the previous one, with no control codes.
    """
    clear = clear and sys.stdout.isatty()
    write_raw = getattr(sys.stdout, "write_raw", sys.stdout.write)
    try:
        while True:
            text = render()
            if clear:
                write_raw(CLEAR_SCREEN)
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
            time.sleep(max(interval_s, MIN_WATCH_INTERVAL_S))
    except KeyboardInterrupt:
        return 0


def add_watch_option(parser: argparse.ArgumentParser, default_s: float) -> None:
    """`--watch [SEC]`: refresh every SEC seconds (`default_s` when SEC is left out) until Ctrl-C."""
    parser.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=default_s,
        metavar="SEC",
        help=f"refresh every SEC seconds (default {default_s:g}) until Ctrl-C",
    )
