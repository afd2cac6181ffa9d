"""The debug trace (`perseus-emulate --trace FILE`): JSON lines from every process of one run.

Stage processes write one record per computation (`kind` "computation": pipeline, stage, gpu, iteration,
instruction, microbatch, chunk, profile_stage, clock_mhz, start_s, end_s, energy_j, and gpu_energy_j: the
stage's GPUs' exact energy since their creation as it began, null where the executor does not know it;
times are CLOCK_MONOTONIC, energies the simulated GPU's exact ones, without the counter's noise); the
coordinator writes its counter samples and measurement windows (`kind` "window": phase, and per GPU the
start and end time and counter value). Every process appends whole batches of lines with one `write` on an
`O_APPEND` descriptor: lines never interleave.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


class TraceWriter:
    """Appends JSON records to a trace file; a writer without a path does nothing."""

    def __init__(self, path: Path | None) -> None:
        self._fd = None if path is None else os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @property
    def enabled(self) -> bool:
        return self._fd is not None

    def write(self, records: Iterable[Mapping[str, Any]]) -> None:
        if self._fd is None:
            return
        data = "".join(json.dumps(record, separators=(",", ":")) + "\n" for record in records).encode()
        if data:
            os.write(self._fd, data)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_trace(path: Path) -> list[dict[str, Any]]:
    """Every record of a trace file, in file order."""
    with path.open(encoding="utf-8") as stream:
        return [json.loads(line) for line in stream if line.strip()]
