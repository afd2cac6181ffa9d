"""The checks a field of a spanning job's JSON value passes when read (`span_board`, `span_codec`): an
object, a non-negative integer, a finite number, a string; ValueError naming the field otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def object_doc(doc: Any, what: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ValueError(f"{what} is not an object")
    return doc


def plain_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a non-negative integer")
    return value


def plain_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{value!r} is not a finite number")
    return float(value)


def int_field(doc: Mapping[str, Any], name: str) -> int:
    if name not in doc:
        raise ValueError(f"missing field {name!r}")
    return plain_int(doc[name])


def float_field(doc: Mapping[str, Any], name: str) -> float:
    if name not in doc:
        raise ValueError(f"missing field {name!r}")
    return plain_float(doc[name])


def optional_float_field(doc: Mapping[str, Any], name: str) -> float | None:
    value = doc.get(name)
    return None if value is None else plain_float(value)


def str_field(doc: Mapping[str, Any], name: str) -> str:
    value = doc.get(name)
    if not isinstance(value, str):
        raise ValueError(f"field {name!r} is not a string")
    return value
