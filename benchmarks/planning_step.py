"""The daemon's planning step (profiling done -> frontier solved, followed and descended), this tree's code
against another tree's (today's `main`, say) in the same run; used by `bench_solver.py`.

Each run is a fresh process on the tree under test (`PYTHONPATH`): it builds the solve task exactly as the
daemon does (the job's profile as CSV text, its 1F1B orders, the blocking power, the unit time and the
switch model the daemon derives from a clock-set latency: lead = latency + 2 ms, merged runs under two
leads), starts a solver worker (`SolveWorker`, as the daemon's) and times submit -> frontier back, which is
the daemon's step less its tick and the plan's installation (~30 ms, `perseusctl jobs` shows the rest as
`transfer`). It reports the worker's peak RSS, the phases where the tree reports them, and for each time
limit the descent plans for (all-max's predicted time x 1.0 ... 1.3) the point a policy picks: the least
predicted (switch-aware) energy within it. The comparison checks those picks: identical, or no worse.

Another tree is an exported `git archive REF` with its C extensions built in place (`setup.py build_ext`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LIMIT_FACTORS = (1.0, 1.05, 1.1, 1.2, 1.3)


@dataclass(frozen=True)
class PlanningCase:
    name: str
    profile: str
    """A bundled profile's name or a CSV file."""
    stages: int
    microbatches: int
    unit_time_s: float
    """0: the daemon's automatic unit (shortest computation / 50, on a 1-2-5 step)."""
    latency_s: float
    p_block_w: float = 0.0
    """0: the bundled profile's."""

    def args(self) -> list[str]:
        numbers = (self.unit_time_s, self.latency_s, self.p_block_w)
        return [self.profile, str(self.stages), str(self.microbatches), *map(repr, numbers)]


A100_SIM_LATENCY_S = 6.0772e-05
"""The clock-set latency the daemon measured on simulated A100s in the demo (set calls take ~60 us)."""
H100_LATENCY_S = 0.012
"""A real H100's lock latency (the simulated board draws 9-15 ms calls)."""
CASES = (
    PlanningCase("demo: A100 8x12, unit 0.2 ms", "a100_sxm", 8, 12, 0.0002, A100_SIM_LATENCY_S),
    PlanningCase("H100 4x16", "h100_sxm", 4, 16, 0.0, H100_LATENCY_S),
    PlanningCase("A100 8x96, unit 1 ms", "a100_sxm", 8, 96, 0.001, A100_SIM_LATENCY_S),
)
BARS_S = {CASES[0].name: 2.0, CASES[1].name: 1.0, CASES[2].name: 15.0}
PEAK_RSS_MB_MAX = 1024


def parse_case(text: str) -> PlanningCase:
    """`PROFILE:STAGES:MICROBATCHES:UNIT_S:LATENCY_S:P_BLOCK_W` (a CSV file or a bundled name)."""
    profile, stages, microbatches, unit_s, latency_s, p_block_w = text.rsplit(":", 5)
    name = f"{Path(profile).name} {stages}x{microbatches}"
    return PlanningCase(
        name, profile, int(stages), int(microbatches), float(unit_s), float(latency_s), float(p_block_w)
    )


def worker_main(argv: list[str]) -> dict[str, Any]:
    """One timed planning step on the tree this process imports (`--planning-worker`)."""
    from perseusd.jobs.shape import JobShape
    from perseusd.jobs.solving import SolveInput, auto_unit_time_s

    try:
        from perseusd.jobs.solve_worker import SolveWorker
    except ImportError:  # a baseline tree from before solve_worker.py: the worker was in jobs.solving
        from perseusd.jobs.solving import SolveWorker  # type: ignore[attr-defined,no-redef]
    from perseusd.planner.baselines import all_max
    from perseusd.planner.bundled import BUNDLED_PROFILES, bundled_profile
    from perseusd.planner.profile_csv import profile_to_csv, read_profile
    from perseusd.planner.switching import SwitchModel

    name, stages, microbatches, unit_s, latency_s, p_block_w = argv
    profile = bundled_profile(name) if name in BUNDLED_PROFILES else read_profile(name)
    p_block = float(p_block_w) or BUNDLED_PROFILES[name].p_block_w
    unit_time_s = float(unit_s) or auto_unit_time_s(profile)
    lead_s = float(latency_s) + 0.002
    shape = JobShape("1f1b", int(stages), int(microbatches), 1)
    orders = shape.named_orders() or ()
    switch = SwitchModel(float(latency_s), lead_s, min_run_s=2 * lead_s)
    task = SolveInput(
        "bench", shape, orders, profile_to_csv(profile), profile.source, p_block, unit_time_s, switch
    )
    worker = SolveWorker()
    try:
        # Start the worker process first, as a daemon has it running when a solve arrives: the empty task
        # fails in the worker, which then runs.
        with contextlib.suppress(Exception):
            worker.submit(None).result()  # type: ignore[arg-type]
        start_s = time.perf_counter()
        result = worker.submit(task).result()
        wall_s = time.perf_counter() - start_s
        pid = next(iter(worker._pool._processes))  # type: ignore[union-attr]
        peak_kb = _peak_rss_kb(pid)
    finally:
        worker.close()
    frontier = getattr(result, "frontier", result)
    phases = getattr(result, "phases", None)
    all_max_s = all_max(shape.dag(orders), profile, p_block).time_s
    return {
        "wall_s": wall_s,
        "phases": None
        if phases is None
        else {k: getattr(phases, k) for k in ("fit_s", "frontier_s", "follow_s", "descent_s")},
        "points": len(frontier.points),
        "descended": sum(
            1 for p in frontier.points if p.followed is not None and p.followed.descended_from is not None
        ),
        "worker_peak_rss_mb": peak_kb / 1024,
        "unit_time_s": unit_time_s,
        "picks": _picks(frontier, all_max_s),
    }


def _picks(frontier: Any, all_max_s: float) -> list[dict[str, Any]]:
    """Per limit, the point a policy deploys: `no_slowdown`'s at all-max's time, `time`'s at all-max's time
    x factor (the least predicted energy within, else the fastest)."""
    from perseusd.planner.policy import PointSummary, Policy

    by_index = {p.index: p for p in frontier.points}
    summaries = [PointSummary(p.index, p.predicted_time_s, p.refined_energy_j) for p in frontier.points]
    picks = []
    for factor in LIMIT_FACTORS:
        policy = Policy("no_slowdown") if factor == 1.0 else Policy("time", all_max_s * factor)
        chosen = policy.choose(summaries, all_max_s)
        clocks = by_index[chosen.index].clocks_mhz
        picks.append(
            {
                "factor": factor,
                "time_s": chosen.time_s,
                "energy_j": chosen.energy_j,
                "clocks_digest": _digest(clocks),
            }
        )
    return picks


def _digest(rows: Any) -> str:
    return hashlib.sha256(repr(rows).encode()).hexdigest()[:16]


def _peak_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def export_tree(ref: str, into: Path) -> Path:
    """`git archive REF` of this repository into `into`, its C extensions built in place."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace"], cwd=into, check=True, capture_output=True
    )
    return into


def run_case(case: PlanningCase, tree: Path, repeat: int) -> dict[str, Any]:
    """`repeat` fresh processes of the planning step on `tree`; medians and the last run's picks."""
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{tree / 'client_lib'}")
    runs = []
    for _ in range(repeat):
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), *case.args()],
            env=env,
            cwd=tree,
            check=True,
            capture_output=True,
            text=True,
        )
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    result: dict[str, Any] = {
        "wall_s_median": round(statistics.median(r["wall_s"] for r in runs), 4),
        "wall_s_runs": [round(r["wall_s"], 4) for r in runs],
        "worker_peak_rss_mb": round(max(r["worker_peak_rss_mb"] for r in runs), 1),
        "points": runs[-1]["points"],
        "descended_points": runs[-1]["descended"],
        "unit_time_s": runs[-1]["unit_time_s"],
        "picks": runs[-1]["picks"],
    }
    if runs[-1]["phases"] is not None:
        result["phases_s_median"] = {
            k: round(statistics.median(r["phases"][k] for r in runs), 4) for k in runs[-1]["phases"]
        }
    return result


def compare_picks(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether every limit's pick is identical (same clocks) or no worse (no more energy, no slower)."""
    identical = [a["clocks_digest"] == b["clocks_digest"] for a, b in zip(ours, theirs, strict=True)]
    no_worse = [
        a["energy_j"] <= b["energy_j"] * (1 + 1e-12) and a["time_s"] <= b["time_s"] * (1 + 1e-9)
        for a, b in zip(ours, theirs, strict=True)
    ]
    return {
        "identical": all(identical),
        "no_worse": all(i or w for i, w in zip(identical, no_worse, strict=True)),
    }


def planning(
    cases: list[PlanningCase], baseline: str | None, repeat: int, baseline_repeat: int
) -> dict[str, Any]:
    """Every case's planning step on this tree and, with `baseline` (a git ref or a built tree), on that."""
    with tempfile.TemporaryDirectory() as tmp:
        other = None
        if baseline is not None:
            other = Path(baseline) if Path(baseline).is_dir() else export_tree(baseline, Path(tmp))
        results = []
        for case in cases:
            entry: dict[str, Any] = {"case": case.name, "ours": run_case(case, ROOT, repeat)}
            bar_s = BARS_S.get(case.name)
            if bar_s is not None:
                entry["bar_s"] = bar_s
                entry["met"] = entry["ours"]["wall_s_median"] <= bar_s
            entry["peak_rss_met"] = entry["ours"]["worker_peak_rss_mb"] <= PEAK_RSS_MB_MAX
            if other is not None:
                today = run_case(case, other, baseline_repeat)
                entry["baseline"] = today
                entry["speedup_x"] = round(today["wall_s_median"] / entry["ours"]["wall_s_median"], 1)
                entry["picks_vs_baseline"] = compare_picks(entry["ours"]["picks"], today["picks"])
            results.append(entry)
    return {"baseline": baseline, "baseline_commit": _commit(baseline), "cases": results}


def _commit(ref: str | None) -> str | None:
    if ref is None or Path(ref).is_dir():
        return None
    git = ["git", "-C", str(ROOT), "rev-parse", ref]
    done = subprocess.run(git, check=False, capture_output=True, text=True)
    return done.stdout.strip() or None


if __name__ == "__main__":
    print(json.dumps(worker_main(sys.argv[1:])))
