"""Strict, typed reading of parsed JSON documents for `perseusd.planner.plan`.

A `Reader` wraps one JSON value and the path that leads to it (`points[3].clocks_mhz[1]`), so that every
`PlanFormatError` names the file and the exact field. Booleans are never accepted as numbers.
"""

from __future__ import annotations

import math
from typing import Any

from perseusd.errors import PlanFormatError
from perseusd.planner.dag import Instruction

_INSTRUCTIONS = ", ".join(i.value for i in Instruction)


class Reader:
    """A JSON value at `where` inside the document read from `source`."""

    def __init__(self, source: str, value: Any, where: str = "") -> None:
        self.source = source
        self.value = value
        self.where = where

    def error(self, key: str | int | None, problem: str) -> PlanFormatError:
        """A `PlanFormatError` about `key` of this value (or the value itself when `key` is None)."""
        name = self._path(key) or "the document"
        return PlanFormatError(f"{self.source}: {name} {problem}")

    def _path(self, key: str | int | None) -> str:
        if key is None:
            return self.where
        if isinstance(key, int):
            return f"{self.where}[{key}]"
        return f"{self.where}.{key}" if self.where else key

    def child(self, key: str | int) -> Reader:
        """The value under `key` (a field of an object, or an index of a list)."""
        if isinstance(key, int):
            items = self.as_list()
            if not 0 <= key < len(items):
                raise self.error(key, "is missing")
            return Reader(self.source, items[key], self._path(key))
        fields = self.as_dict()
        if key not in fields:
            raise self.error(key, "is missing")
        return Reader(self.source, fields[key], self._path(key))

    def items(self, key: str) -> list[Reader]:
        """The elements of the list under `key`, each as a reader."""
        return self.child(key).items_of()

    def items_of(self) -> list[Reader]:
        """The elements of this value, which must be a list, each as a reader."""
        return [Reader(self.source, item, self._path(i)) for i, item in enumerate(self.as_list())]

    def as_dict(self) -> dict[str, Any]:
        """This value, which must be an object."""
        if not isinstance(self.value, dict):
            raise self.error(None, f"must be an object, not {_kind(self.value)}")
        return self.value

    def as_list(self) -> list[Any]:
        """This value, which must be a list."""
        if not isinstance(self.value, list):
            raise self.error(None, f"must be a list, not {_kind(self.value)}")
        return self.value

    def as_str(self) -> str:
        """This value, which must be a string."""
        if not isinstance(self.value, str):
            raise self.error(None, f"must be a string, not {_kind(self.value)}")
        return self.value

    def as_int(self, minimum: int | None = None) -> int:
        """This value, which must be an integer (at least `minimum`)."""
        if isinstance(self.value, bool) or not isinstance(self.value, int):
            raise self.error(None, f"must be an integer, not {_kind(self.value)}")
        if minimum is not None and self.value < minimum:
            raise self.error(None, f"must be at least {minimum} (got {self.value})")
        return self.value

    def as_float(self, minimum: float | None = None) -> float:
        """This value, which must be a finite number (at least `minimum`)."""
        if isinstance(self.value, bool) or not isinstance(self.value, int | float):
            raise self.error(None, f"must be a number, not {_kind(self.value)}")
        value = float(self.value)
        if not math.isfinite(value):
            raise self.error(None, "must be a finite number")
        if minimum is not None and value < minimum:
            raise self.error(None, f"must be at least {minimum} (got {value})")
        return value

    def as_instruction(self) -> Instruction:
        """This value, which must name an instruction."""
        text = self.as_str()
        try:
            return Instruction(text)
        except ValueError:
            raise self.error(None, f"'{text}' is not an instruction (expected {_INSTRUCTIONS})") from None

    def get_str(self, key: str) -> str:
        """The string field `key`."""
        return self.child(key).as_str()

    def get_int(self, key: str, minimum: int | None = None) -> int:
        """The integer field `key`."""
        return self.child(key).as_int(minimum)

    def get_float(self, key: str, minimum: float | None = None) -> float:
        """The number field `key` (integers are accepted)."""
        return self.child(key).as_float(minimum)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list"}.get(
        type(value), "an object"
    )
