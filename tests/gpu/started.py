"""A GPU owner whose thread runs for the length of a `with` (or of a fixture that yields in one)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from perseusd.gpu.owner import GpuOwner


@contextmanager
def started(owner: GpuOwner) -> Iterator[GpuOwner]:
    """`owner` with its thread started; stopped on exit, whatever the test did."""
    owner.start()
    try:
        yield owner
    finally:
        owner.stop()
