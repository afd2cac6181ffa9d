"""The analytic mode of power caps at scale: a pool of GPUs running GPT-3 pipelines under one budget.

The pool holds `gpus / (stages x TP)` independent jobs, each one 1F1B pipeline whose stages are TP GPUs
each (every GPU of a stage draws alike). The budget is a fraction of the pool's all-max power (every job at
all-max clocks under the default power limits, averaged over its iterations: over a pool, iterations are not
in phase). Two ways to meet it, each job replayed on the board's cost model (`perseusd.power.replay`):

- (a) `uniform`: every GPU's power limit at budget / GPUs, all-max clocks;
- (c) `perseusd`: the node cap's allocation (`perseusd.power.allocate`) over every job's frontier with the
  pool's budget as the grant (average power budgeted), each job at its point under its limits.

Time lost is each job's iteration-time growth against all-max, averaged over the jobs, and what it costs the
pool in GPU-hours per day (gpus x 24 h x (1 - 1 / (1 + slowdown))).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from perseusd.power.allocate import allocate
from perseusd.power.cap_inputs import CapPoint, GpuRange, JobLoad
from perseusd.power.replay import Setting
from perseusd.power.scenario import Scenario, job_load

HOURS_PER_DAY = 24.0


@dataclass(frozen=True)
class PoolRow:
    gpus: int
    jobs: int
    budget_fraction: float
    budget_w: float
    uniform_slowdown: float
    uniform_power_w: float
    perseusd_slowdown: float
    perseusd_power_w: float
    feasible: bool

    def gpu_hours_lost_per_day(self, slowdown: float) -> float:
        return self.gpus * HOURS_PER_DAY * (1 - 1 / (1 + slowdown))

    def to_json(self) -> dict[str, object]:
        return {
            "gpus": self.gpus,
            "jobs": self.jobs,
            "budget_fraction": self.budget_fraction,
            "budget_w": round(self.budget_w, 1),
            "uniform_slowdown": round(self.uniform_slowdown, 5),
            "uniform_power_w": round(self.uniform_power_w, 1),
            "uniform_gpu_hours_lost_per_day": round(self.gpu_hours_lost_per_day(self.uniform_slowdown), 2),
            "perseusd_slowdown": round(self.perseusd_slowdown, 5),
            "perseusd_power_w": round(self.perseusd_power_w, 1),
            "perseusd_gpu_hours_lost_per_day": round(self.gpu_hours_lost_per_day(self.perseusd_slowdown), 2),
            "feasible": self.feasible,
        }


def _scaled(load: JobLoad, name: str, tensor_parallel: int) -> JobLoad:
    """A job of `load`'s pipeline with TP GPUs per stage: every GPU named by job, stage and rank."""
    points = tuple(
        CapPoint(
            p.index,
            p.time_s,
            {f"{name}/{g}/{r}": w for g, w in p.power_w.items() for r in range(tensor_parallel)},
            {f"{name}/{g}/{r}": w for g, w in p.peak_w.items() for r in range(tensor_parallel)},
        )
        for p in load.points
    )
    return replace(load, name=name, points=points)


def pool_rows(
    scenario: Scenario, pool_gpus: Sequence[int], fractions: Sequence[float], tensor_parallel: int = 8
) -> list[PoolRow]:
    """Every pool size at every budget fraction (see the module)."""
    stages = scenario.dag.num_stages
    per_job = stages * tensor_parallel
    board = scenario.board
    base = job_load(scenario)
    by_index = {p.index: p for p in scenario.points}
    replays: dict[tuple[int, tuple[float, ...]], tuple[float, float]] = {}

    def measured(index: int, limits: tuple[float, ...]) -> tuple[float, float]:
        """(iteration time, mean power of one pipeline's GPUs) of a point under per-stage limits."""
        key = (index, limits)
        if key not in replays:
            clocks = by_index[index].clocks_mhz if index >= 0 else scenario.all_max_clocks
            result = scenario.run(Setting(clocks, limits))
            replays[key] = (result.time_s, result.mean_power_w)
        return replays[key]

    all_max_s = scenario.all_max.time_s
    rows = []
    for gpus in pool_gpus:
        jobs = max(1, gpus // per_job)
        pool_max_w = jobs * tensor_parallel * scenario.all_max.mean_power_w
        loads = [_scaled(base, f"job{j}", tensor_parallel) for j in range(jobs)]
        ranges = [
            GpuRange(g, board.power_limit_min_w, board.power_limit_max_w) for x in loads for g in x.gpus
        ]
        for fraction in fractions:
            budget_w = fraction * pool_max_w
            limit_w = min(max(budget_w / (jobs * per_job), board.power_limit_min_w), board.power_limit_max_w)
            uniform_s, uniform_w = measured(-1, (round(limit_w, 3),) * stages)
            allocation = allocate(ranges, loads, budget_w)
            slowdowns, power_w = [], 0.0
            for grant in allocation.jobs:
                limits = tuple(
                    round(allocation.limits_w[f"{grant.name}/stage{s}/0"], 3) for s in range(stages)
                )
                time_s, mean_w = measured(grant.index, limits)
                slowdowns.append(time_s / all_max_s - 1)
                power_w += mean_w * tensor_parallel
            rows.append(
                PoolRow(
                    gpus=jobs * per_job,
                    jobs=jobs,
                    budget_fraction=fraction,
                    budget_w=budget_w,
                    uniform_slowdown=uniform_s / all_max_s - 1,
                    uniform_power_w=uniform_w * tensor_parallel * jobs,
                    perseusd_slowdown=sum(slowdowns) / len(slowdowns),
                    perseusd_power_w=power_w,
                    feasible=allocation.feasible and not allocation.strict,
                )
            )
    return rows


def format_rows(rows: Sequence[PoolRow], header: str) -> str:
    """Time lost per pool size and budget: (a) uniform power limit vs (c) perseusd."""
    titles = ["GPUs", "jobs", "budget", "uniform slowdown", "perseusd slowdown", "GPU-h/day lost (a)", "(c)"]
    cells = [
        [
            str(r.gpus),
            str(r.jobs),
            f"{r.budget_fraction * 100:.0f} % ({r.budget_w / 1000:.1f} kW)",
            f"{r.uniform_slowdown * 100:+.1f} %",
            f"{r.perseusd_slowdown * 100:+.1f} %" + ("" if r.feasible else " (limits)"),
            f"{r.gpu_hours_lost_per_day(r.uniform_slowdown):.0f}",
            f"{r.gpu_hours_lost_per_day(r.perseusd_slowdown):.0f}",
        ]
        for r in rows
    ]
    widths = [max(len(row[i]) for row in [titles, *cells]) for i in range(len(titles))]
    lines = [header, "  ".join(t.rjust(w) for t, w in zip(titles, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)
