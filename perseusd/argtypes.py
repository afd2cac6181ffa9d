"""Number parsers for argparse `type=`, shared by every command line (`perseusctl`, `perseus-emulate`)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar

_N = TypeVar("_N", int, float)


def parse_float(text: str) -> float:
    """`text` as a float (NaN and infinities included), else the usage error "'text' is not a number"."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None


def _number(text: str) -> float:
    value = parse_float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number (got {text})")
    return value


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None


def checked(parse: Callable[[str], _N], ok: Callable[[_N], bool], error: str) -> Callable[[str], _N]:
    """`parse`, refusing values that are not `ok` with `error` (it may name `{text}` or the `{value}`)."""

    def parse_checked(text: str) -> _N:
        value = parse(text)
        if not ok(value):
            raise argparse.ArgumentTypeError(error.format(text=text, value=value))
        return value

    return parse_checked


positive_float = checked(_number, lambda v: v > 0, "must be a positive number (got {text})")
non_negative_float = checked(_number, lambda v: v >= 0, "must be a non-negative number (got {text})")
positive_int = checked(_integer, lambda v: v >= 1, "must be at least 1 (got {value})")
non_negative_int = checked(_integer, lambda v: v >= 0, "must be 0 or more (got {value})")
factor_float = checked(_number, lambda v: v >= 1.0, "must be at least 1, e.g. 1.2 (got {text})")
"""A slowdown factor: a finite number >= 1 (1.2 = 20 % slower)."""
