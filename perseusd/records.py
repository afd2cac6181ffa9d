"""Copying a record into another that names some of the same facts (a wire message from a daemon record)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

R = TypeVar("R")


def project(cls: type[R], source: object, **given: Any) -> R:
    """A `cls` (a dataclass) whose fields are `given`, or else `source`'s attributes of the same names."""
    copied = {f.name: getattr(source, f.name) for f in fields(cls) if f.name not in given}  # type: ignore[arg-type]
    return cls(**copied, **given)
