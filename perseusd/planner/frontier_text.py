"""The JSON text of a `perseus-frontier` document, written fast: the same bytes as `json.dumps(doc)`.

A frontier of 8 x 12 has about 640 points of 96 clocks each; encoding those 60,000 integers one by one is most
of the time `perseusctl solve` spends writing. Consecutive points change only a few clocks, so a stage's row
of clocks is encoded only where it differs from the previous point's; everything else is one `json.dumps`.
Rows of plain ints are encoded by the optional C extension `_jsontext` when it was built (the Python code
below is its reference and runs otherwise), and `points_json` writes whole solver points in C.
"""

from __future__ import annotations

import json
from typing import Any

_MARK = "\x00clocks\x00"
"""Stands for a point's clocks during the one `json.dumps` (no path or name can hold a NUL character)."""
_MARK_JSON = json.dumps(_MARK)
_INT_ONLY = {int}


def _load_c() -> Any | None:
    try:
        from perseusd.planner import _jsontext  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _jsontext


_C = _load_c()
_C_ERRORS = (TypeError, ValueError, OverflowError, IndexError)


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
    if _C is not None:
        try:
            return [_C.clock_rows(point["clocks_mhz"]) for point in points]
        except _C_ERRORS:  # not lists of plain ints: the Python encoder says what json.dumps says
            pass
    return _clock_texts_py(points)


def _clock_texts_py(points: list[dict[str, Any]]) -> list[str]:
    names: dict[int, str] = {}
    last_rows: list[Any] = []
    last_texts: list[str] = []
    out = []
    for point in points:
        rows = point["clocks_mhz"]
        if len(rows) != len(last_rows):
            last_rows, last_texts = [None] * len(rows), [""] * len(rows)
        for i, row in enumerate(rows):
            # Equal rows of plain ints have the same JSON ([1] == [True] == [1.0] otherwise): a row is kept
            # for reuse only when it holds plain ints, and reused only by one that does.
            if row != last_rows[i] or set(map(type, row)) != _INT_ONLY:
                plain = set(map(type, row)) == _INT_ONLY
                last_rows[i], last_texts[i] = row if plain else None, _row_text(row, names)
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


PointRow = tuple[int, int, float, float, float, tuple[int, ...]]
"""(index, quant_time, time_s, model_energy_j, refined_energy_j, clocks by node id): one frontier point."""


def points_json(rows: list[PointRow], orders: tuple[tuple[int, ...], ...]) -> str | None:
    """The JSON of frontier points (`{"index": ..., "clocks_mhz": [[...], ...]}, ...`, without brackets), the
    clocks per stage in `orders`; None when the C extension is not built or a value is not a plain int or
    finite float (the caller then builds the document and encodes it with `frontier_json`)."""
    width = sum(map(len, orders))
    if _C is None or any(len(row[5]) != width for row in rows):
        return None
    try:
        text: str = _C.frontier_points(rows, orders)
    except _C_ERRORS:
        return None
    return text
