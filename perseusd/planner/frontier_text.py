"""The JSON text of a `perseus-frontier` document, written fast: the same bytes as `json.dumps(doc)`.

A frontier of 8 x 12 has about 640 points of 96 clocks each; encoding those 60,000 integers one by one is most
of the time `perseusctl solve` spends writing. Consecutive points change only a few clocks, so a stage's row
of clocks is encoded only where it differs from the previous point's; everything else is one `json.dumps`.
"""

from __future__ import annotations

import json
from typing import Any

_MARK = "\x00clocks\x00"
"""Stands for a point's clocks during the one `json.dumps` (no path or name can hold a NUL character)."""
_MARK_JSON = json.dumps(_MARK)
_INT_ONLY = {int}


def _row_text(row: list[int], names: dict[int, str]) -> str:
    """The JSON of one row of clocks; `names` caches the text of every plain int seen (there are few)."""
    if set(map(type, row)) != _INT_ONLY:
        return json.dumps(row, allow_nan=False)
    try:
        return "[" + ", ".join(map(names.__getitem__, row)) + "]"
    except KeyError:  # a clock not seen yet (only plain ints get here: True never finds 1's text)
        for clock in row:
            names.setdefault(clock, str(clock))
        return "[" + ", ".join(map(names.__getitem__, row)) + "]"


def _clock_texts(points: list[dict[str, Any]]) -> list[str]:
    """The JSON of every point's clocks (a list of per-stage rows)."""
    names: dict[int, str] = {}
    last_rows: list[Any] = []
    last_texts: list[str] = []
    out = []
    for point in points:
        rows = point["clocks_mhz"]
        if len(rows) != len(last_rows):
            last_rows, last_texts = [None] * len(rows), [""] * len(rows)
        for i, row in enumerate(rows):
            # Equal rows of plain ints have the same JSON ([1] == [True] == [1.0] otherwise).
            if row != last_rows[i] or set(map(type, row)) != _INT_ONLY:
                last_rows[i], last_texts[i] = row, _row_text(row, names)
        out.append("[" + ", ".join(last_texts) + "]")
    return out


def frontier_json(doc: dict[str, Any]) -> str:
    """`json.dumps(doc, allow_nan=False)` of a frontier document (see `plan.frontier_document`)."""
    points = doc.get("points")
    if not isinstance(points, list) or not all(
        isinstance(p, dict) and isinstance(p.get("clocks_mhz"), list) for p in points
    ):
        return json.dumps(doc, allow_nan=False)
    clock_texts = _clock_texts(points)
    marked = doc | {"points": [point | {"clocks_mhz": _MARK} for point in points]}
    pieces = json.dumps(marked, allow_nan=False).split(_MARK_JSON)
    if len(pieces) != len(points) + 1:  # the mark was found elsewhere too: encode plainly
        return json.dumps(doc, allow_nan=False)
    out = [pieces[0]]
    for clocks, piece in zip(clock_texts, pieces[1:], strict=True):
        out.append(clocks)
        out.append(piece)
    return "".join(out)
