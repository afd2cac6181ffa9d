"""The estimator on what a real NVIDIA H200 did: two closed-loop profiling runs of a one-stage job.

`data/h200-gpt1stage-{a,b}.json.gz` were recorded by `benchmarks/gpu_validate.py --trace-out` (driver
580.159.04; the job: 4 transformer layers, d_model 4096, bf16, 8 microbatches of 2048 tokens, 1F1B on one
GPU): every event the client sent (ns from the first; step, forward and backward boundaries, stamped when the
GPU reached them), the energy counter (mJ from the first read) and the SM clock, both polled every ~1 ms.
`segments` lists the steps run wholly at each clock the daemon locked while profiling (first step, last step,
clock; the top clocks are power-capped, so the locked clock is a label).

The forwards and backwards of a one-stage job run back to back (1.5-3 % of the time idle), so their sum per
microbatch is what the counter can tell exactly; the truth for it is the counter's energy over the segment's
whole iterations (2-6 s), less the little idle time at 130 W (the idle power measured at the top clock was
127-131 W). Run a was profiled by the daemon before windows over back-to-back time outliers were kept and
before a segment's uncertain blocking power fell back: its profile was 16-57 % off at 1215 MHz.
"""

from __future__ import annotations

import gzip
import json
import math
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path

import pytest

from perseusd.profiling.estimator import StageEstimate, estimate_segment
from perseusd.profiling.trace import CounterSample, Interval

DATA = Path(__file__).parent / "data"
RUNS = ("h200-gpt1stage-a.json.gz", "h200-gpt1stage-b.json.gz")
IDLE_W = 130.0
DAEMON_POLL_NS = 10_000_000
"""The daemon reads the counter every 10 ms (`energy_sample_period_s`): a sample's time lags its update."""
PHASES_NS = (500_000, 3_700_000, 7_900_000)
"""Where the emulated sampler's polls fall (the worst pair error depends on it)."""
MICROBATCHES = 8


@dataclass(frozen=True)
class Step:
    begin_ns: int
    end_ns: int
    computations: list[tuple[str, int, int]]
    """(instruction, begin ns, end ns)."""


def load(name: str) -> tuple[dict[str, list[list[int]]], list[Step]]:
    trace = json.loads(gzip.decompress((DATA / name).read_bytes()))
    steps: list[Step] = []
    begun: dict[tuple[str, int], int] = {}
    step_begin_ns = 0
    computations: list[tuple[str, int, int]] = []
    for t_ns, kind, instruction, number in trace["events"]:
        if kind == "step_begin":
            step_begin_ns, computations = t_ns, []
        elif kind == "step_end":
            steps.append(Step(step_begin_ns, t_ns, computations))
        elif kind == "computation_begin":
            begun[(instruction, number)] = t_ns
        else:
            computations.append((instruction, begun.pop((instruction, number)), t_ns))
    return trace, steps


def energy_at_mj(counter: list[list[int]], t_ns: int) -> float:
    """The counter at `t_ns`, linear between the (1 ms-polled) updates around it."""
    i = bisect_right([t for t, _ in counter], t_ns)
    (t0, e0), (t1, e1) = counter[i - 1], counter[i]
    return e0 + (e1 - e0) * (t_ns - t0) / (t1 - t0)


def daemon_samples(counter: list[list[int]], phase_ns: int) -> list[CounterSample]:
    """The counter as the daemon's 10 ms sampler sees it: each update stamped at the next poll (polls at
    `phase_ns` + k x 10 ms)."""
    return [
        CounterSample(phase_ns + math.ceil((t - phase_ns) / DAEMON_POLL_NS) * DAEMON_POLL_NS, e)
        for t, e in counter
    ]


def segments(name: str, phase_ns: int) -> list[tuple[int, float, StageEstimate]]:
    """Per profiled segment: its clock, the true energy per forward+backward pair, and the daemon's
    estimate (the first segment with no fallback blocking power, later ones with the first's)."""
    trace, steps = load(name)
    samples = daemon_samples(trace["energy_mj"], phase_ns)
    fallback_w: float | None = None
    out = []
    for first, last, clock_mhz in trace["segments"]:
        run = steps[first : last + 1]
        intervals = [
            Interval((0, instruction), clock_mhz, begin_ns, end_ns)
            for step in run
            for instruction, begin_ns, end_ns in step.computations
        ]
        since_ns, now_ns = steps[first - 1].end_ns, run[-1].end_ns + 2_000_000
        estimate = estimate_segment(
            intervals,
            [s for s in samples if since_ns <= s.t_ns <= now_ns],
            fallback_p_block_w=fallback_w,
        )
        fallback_w = fallback_w if fallback_w is not None else estimate.p_block_w
        span_ns = run[-1].end_ns - run[0].begin_ns
        busy_ns = sum(i.end_ns - i.start_ns for i in intervals)
        energy_j = (
            energy_at_mj(trace["energy_mj"], run[-1].end_ns)
            - energy_at_mj(trace["energy_mj"], run[0].begin_ns)
        ) / 1000
        pair_j = (energy_j - IDLE_W * (span_ns - busy_ns) / 1e9) / (MICROBATCHES * len(run))
        out.append((clock_mhz, pair_j, estimate))
    return out


@pytest.mark.parametrize("phase_ns", PHASES_NS)
@pytest.mark.parametrize("name", RUNS)
def test_forward_plus_backward_energy_is_within_3_5_percent_at_every_clock(name: str, phase_ns: int) -> None:
    """Worst over both runs' 13 clocks: 1.7-3.1 % depending on where the sampler's polls fall (six phases
    tried; the previous estimator: 16-57 %)."""
    for clock_mhz, pair_j, estimate in segments(name, phase_ns):
        energies = {key[0][1]: option.energy_j for key, option in estimate.options.items()}
        assert set(energies) == {"forward", "backward"}, clock_mhz
        total_j = energies["forward"] + energies["backward"]
        assert total_j == pytest.approx(pair_j, rel=0.035), (clock_mhz, energies, pair_j)


@pytest.mark.parametrize("phase_ns", PHASES_NS)
@pytest.mark.parametrize("name", RUNS)
def test_the_blocking_power_is_an_idle_gpus(name: str, phase_ns: int) -> None:
    """Never the thousands of watts (or zero) that 1.5-3 % idle time regressed to."""
    for clock_mhz, _, estimate in segments(name, phase_ns):
        assert estimate.p_block_w is not None
        assert 50.0 <= estimate.p_block_w <= 250.0, (clock_mhz, estimate.p_block_w)


@pytest.mark.parametrize("phase_ns", PHASES_NS)
@pytest.mark.parametrize("name", RUNS)
def test_most_windows_are_fitted(name: str, phase_ns: int) -> None:
    """Windows over a computation that ran long but was followed at once by the next are kept: on these
    runs, dropping them left 7-11 of 20-25 windows at some clocks."""
    for clock_mhz, _, estimate in segments(name, phase_ns):
        assert estimate.windows >= 10, clock_mhz
