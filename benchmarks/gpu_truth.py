"""The real-GPU check's ground truth and its comparisons (`benchmarks/gpu_validate.py` and its runs):
the locked-clock sweep read at a clock, the profile's error against it, the job's measured iteration, the best
single clock for a target time, and a stage process stopped when a run ends."""

from __future__ import annotations

import contextlib
import itertools
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from perseus_client.version import PROTOCOL_MINOR

from benchmarks.processes import terminate
from perseusd.emulate.hybrid import SweepRow  # the ground truth at one locked clock


@contextlib.contextmanager
def stopped_at_exit(process: subprocess.Popen[bytes], grace_s: float) -> Iterator[subprocess.Popen[bytes]]:
    """Yield `process`; on the way out SIGTERM it (a daemon restores its GPUs), SIGKILL after `grace_s`."""
    try:
        yield process
    finally:
        terminate(process, grace_s)


def sweep_at(sweep: Sequence[SweepRow], clock_mhz: int) -> SweepRow | None:
    """The sweep at `clock_mhz`, linear between swept clocks; None outside the swept range."""
    rows = sorted(sweep, key=lambda r: r.clock_mhz)
    for row in rows:
        if row.clock_mhz == clock_mhz:
            return row
    for low, high in itertools.pairwise(rows):
        if low.clock_mhz < clock_mhz < high.clock_mhz:
            w = (clock_mhz - low.clock_mhz) / (high.clock_mhz - low.clock_mhz)
            values = [
                a + w * (b - a)
                for a, b in zip(
                    (low.forward_s, low.forward_j, low.backward_s, low.backward_j),
                    (high.forward_s, high.forward_j, high.backward_s, high.backward_j),
                    strict=True,
                )
            ]
            return SweepRow(clock_mhz, *values)
    return None


def profile_error(profile_csv: str, sweep: Sequence[SweepRow]) -> dict[str, Any]:
    """Each row of the daemon's profile against the sweep: relative time and energy errors, and the worst."""
    rows: list[dict[str, Any]] = []
    for line in profile_csv.strip().splitlines()[1:]:
        stage, instruction, clock, time_s, energy_j = line.split(",")
        truth = sweep_at(sweep, int(clock))
        if truth is None:
            rows.append({"instruction": instruction, "clock_mhz": int(clock), "outside_sweep": True})
            continue
        true_s, true_j = (
            (truth.forward_s, truth.forward_j)
            if instruction == "forward"
            else (truth.backward_s, truth.backward_j)
        )
        rows.append(
            {
                "stage": int(stage),
                "instruction": instruction,
                "clock_mhz": int(clock),
                "time_err": round(float(time_s) / true_s - 1.0, 4),
                "energy_err": round(float(energy_j) / true_j - 1.0, 4),
            }
        )
    compared = [r for r in rows if "time_err" in r]
    return {
        "rows": rows,
        "worst_time_err": max((abs(r["time_err"]) for r in compared), default=None),
        "worst_energy_err": max((abs(r["energy_err"]) for r in compared), default=None),
        "within_bounds": bool(compared)
        and all(abs(r["time_err"]) <= 0.02 and abs(r["energy_err"]) <= 0.03 for r in compared),
    }


class BoundaryRecorder:
    """Stands in for the client while the job runs without the daemon (`instrument(..., register=False)`):
    keeps the computation boundaries the instrumentation reports, stamped when they arrive (on a GPU, when
    the GPU reached them), to time each computation of the job itself at a locked clock."""

    protocol_minor = PROTOCOL_MINOR
    """What a client would speak: the instrumentation reports every instruction the newest minor has."""

    def __init__(self) -> None:
        self._begun: dict[tuple[str, int], int] = {}
        self.durations_s: dict[str, list[float]] = {}

    def computation_begin(
        self, _gpu: str, _stage: int, instruction: str, microbatch: int, _chunk: int = 0
    ) -> None:
        self._begun[(instruction, microbatch)] = time.monotonic_ns()

    def computation_end(
        self, _gpu: str, _stage: int, instruction: str, microbatch: int, _chunk: int = 0
    ) -> None:
        begun_ns = self._begun.pop((instruction, microbatch), None)
        if begun_ns is not None:
            self.durations_s.setdefault(instruction, []).append((time.monotonic_ns() - begun_ns) / 1e9)

    def step_begin(self, _gpu: str, _step: int) -> None:
        """Steps are timed by the caller."""

    def step_end(self, _gpu: str, _step: int) -> None:
        """Steps are timed by the caller."""

    def mean_s(self, instruction: str) -> float:
        """Mean duration of `instruction`'s computations (the middle 90 %: a stall is not the clock's)."""
        durations = sorted(self.durations_s.get(instruction, []))
        if not durations:
            raise ValueError(f"no {instruction} computation was recorded")
        cut = len(durations) // 20
        kept = durations[cut : len(durations) - cut]
        return sum(kept) / len(kept)


def job_truth(
    standalone: SweepRow,
    forward_s: float,
    backward_s: float,
    iteration: Mapping[str, float],
    idle_w: float,
    microbatches: int,
) -> SweepRow:
    """One clock's ground truth in the job itself: its computations' mean times, and its energy per
    forward+backward pair (the iteration's, less its idle time at `idle_w`, per microbatch), split between
    forward and backward in the ratio of their powers measured alone (`standalone`, the same clock): a
    one-stage job runs them back to back, so no counter can split them in place."""
    idle_s = max(0.0, iteration["time_s"] - microbatches * (forward_s + backward_s))
    pair_j = (iteration["energy_j"] - idle_w * idle_s) / microbatches
    forward_w = standalone.forward_j / standalone.forward_s
    backward_w = standalone.backward_j / standalone.backward_s
    forward_j = pair_j * forward_w * forward_s / (forward_w * forward_s + backward_w * backward_s)
    return SweepRow(standalone.clock_mhz, forward_s, forward_j, backward_s, pair_j - forward_j)


def padded_energy_j(all_max_j: float, all_max_s: float, idle_w: float, time_s: float) -> float:
    """The all-max iteration's energy padded with idle power to `time_s` (never less than all-max's)."""
    return all_max_j + idle_w * max(0.0, time_s - all_max_s)


def best_single_clock(sweep: Sequence[SweepRow], all_max_s: float, target_s: float) -> int | None:
    """The lowest-energy swept clock whose iteration, scaled from all-max by the stage's compute time,
    fits `target_s` (None when none does)."""
    top = max(sweep, key=lambda r: r.clock_mhz)
    top_s = top.forward_s + top.backward_s
    fitting = [r for r in sweep if all_max_s * (r.forward_s + r.backward_s) / top_s <= target_s]
    if not fitting:
        return None
    return min(fitting, key=lambda r: r.forward_j + r.backward_j).clock_mhz


def saving_pct(energy_j: float, reference_j: float) -> float:
    return round(100.0 * (1.0 - energy_j / reference_j), 2)


def target_row(
    factor: float,
    measured: Mapping[str, float],
    all_max: Mapping[str, float],
    idle_w: float,
    single: Mapping[str, float] | None,
) -> dict[str, Any]:
    """One target's line: the daemon's run against all-max padded to its time, and the single clock's."""
    reference_j = padded_energy_j(all_max["energy_j"], all_max["time_s"], idle_w, measured["time_s"])
    row: dict[str, Any] = {
        "factor": factor,
        "target_s": round(factor * all_max["time_s"], 4),
        "time_s": round(measured["time_s"], 4),
        "energy_j": round(measured["energy_j"], 2),
        "all_max_padded_j": round(reference_j, 2),
        "saving_pct": saving_pct(measured["energy_j"], reference_j),
        "single_clock": None,
        "of_single_clock_saving": None,
    }
    if single is not None:
        single_ref_j = padded_energy_j(all_max["energy_j"], all_max["time_s"], idle_w, single["time_s"])
        single_saving = saving_pct(single["energy_j"], single_ref_j)
        row["single_clock"] = {**{k: round(v, 4) for k, v in single.items()}, "saving_pct": single_saving}
        if single_saving > 0:
            row["of_single_clock_saving"] = round(row["saving_pct"] / single_saving, 3)
    return row
