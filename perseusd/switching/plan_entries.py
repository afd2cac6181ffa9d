"""A plan's computations as the switching reads them: each one's key, a plan's entries checked and snapped to
the GPU's supported clocks, and the runs they form (consecutive computations at one clock, cyclic).

The plan book checks a plan with `validate_plan` before it installs it; a GPU's plan (`gpu_plan.GpuPlan`)
reads its runs (`run_ends`) to place its early raises, and the carried events (`carrying`) are read from them.
"""

from __future__ import annotations

from collections.abc import Sequence

from perseus_client.protocol import PlanEntry

from perseusd.errors import InvalidValueError
from perseusd.gpu.clocks import snap_clock_mhz

ComputationKey = tuple[str, int, int]  # (instruction, microbatch, chunk)


def computation_key(instruction: str, microbatch: int, chunk: int) -> ComputationKey:
    return (instruction, microbatch, chunk)


def validate_plan(plan: Sequence[PlanEntry], supported_clocks_mhz: Sequence[int]) -> list[int]:
    """The plan's clocks snapped to supported clocks; raises `InvalidValueError` on a bad plan (its `field`
    names the entry, as `plan[3].freq_mhz`)."""
    if not plan:
        raise InvalidValueError("empty (use clear_plan)", "plan")
    low_mhz = min(supported_clocks_mhz, default=1)
    high_mhz = max(supported_clocks_mhz, default=1 << 20)
    seen: set[ComputationKey] = set()
    clocks_mhz: list[int] = []
    for i, entry in enumerate(plan):
        where = f"plan[{i}]"
        if entry.microbatch < 0 or entry.chunk < 0:
            raise InvalidValueError("microbatch and chunk must be >= 0", where)
        if not low_mhz <= entry.freq_mhz <= high_mhz:
            raise InvalidValueError(
                f"{entry.freq_mhz} outside {low_mhz}..{high_mhz} MHz", f"{where}.freq_mhz"
            )
        key = computation_key(entry.instruction, entry.microbatch, entry.chunk)
        if key in seen:
            raise InvalidValueError(f"computation {key} listed twice", where)
        seen.add(key)
        clocks_mhz.append(
            snap_clock_mhz(supported_clocks_mhz, entry.freq_mhz) if supported_clocks_mhz else entry.freq_mhz
        )
    return clocks_mhz


def run_ends(clocks_mhz: Sequence[int], times_ns: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """For each computation: the expected time (ns) from its begin to the end of its run (the consecutive
    computations at its clock, cyclic), the clock planned after that run (its own when all are equal), and
    the expected time (ns) of the run's last computation (0 without times or when all are equal)."""
    n = len(clocks_mhz)
    left_ns = [0] * n
    after_mhz = list(clocks_mhz)
    last_ns = [0] * n
    if not times_ns or len(set(clocks_mhz)) < 2:
        return left_ns, after_mhz, last_ns
    last = next(i for i in range(n) if clocks_mhz[i] != clocks_mhz[(i + 1) % n])  # a run's last computation
    for step in range(n):  # backwards round the cycle from that run's last computation
        i = (last - step) % n
        following = (i + 1) % n
        if clocks_mhz[following] != clocks_mhz[i]:
            left_ns[i], after_mhz[i], last_ns[i] = times_ns[i], clocks_mhz[following], times_ns[i]
        else:
            left_ns[i], after_mhz[i] = times_ns[i] + left_ns[following], after_mhz[following]
            last_ns[i] = last_ns[following]
    return left_ns, after_mhz, last_ns
