"""The closed loop's online profiles planned again offline, judged on the board's true costs; prints JSON.

`bench_closed_loop.py --suite family --trace-dir DIR` keeps, per run, the profile the daemon measured
(`DIR/family_CASE-seedN.profile.csv`), the plan it deployed (`.profile.plan.json`) and its log (the lock
latency it solved for, to 0.1 us: the descent can turn on less than 1 us, e.g. a `dense-uneven-rc4x32` run
replayed at 12.88 ms planned 6.39 % where 12.8799 and 12.8801 ms plan the 8.59 % it deployed).
For each run this plays on the board's true costs (the workload's costs at every clock of the board, as the
simulated GPUs run them, under the switch model the daemon solved with; waits at the board's idle power by
held clock):

- `deployed_pct`: the plan the daemon deployed (the baseline, measured in the same run);
- `replanned_pct`: this tree's solve of the same measured profile, as the daemon solves it
  (`perseusd.jobs.solving.solve`, then `no_slowdown` among the deployable points), and its planning time.

Both are savings against all-max on the board's costs; their slowdowns too. A planner change is judged here in
seconds a profile, on the noise and the clocks a real sweep left, before a closed-loop run confirms it: on 12
runs the deployed plan's figure came within 0.5 points of the saving the closed loop measured.

    python benchmarks/replan_measured.py DIR [DIR ...] [--board h100_sxm] [--only CASE]
"""

from __future__ import annotations

import argparse
import io
import json
import re
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.switch_reference import board_waiting, switch_model_for
from benchmarks.workload_family import profile_csv, workload_named
from perseusd.gpu.sim_boards import load_board
from perseusd.jobs.shape import JobShape
from perseusd.jobs.solving import SolveInput, auto_unit_time_s, solve
from perseusd.planner.baselines import all_max
from perseusd.planner.dag import ComputationDag, Instruction
from perseusd.planner.descent_limits import deployable
from perseusd.planner.following import PointFollower
from perseusd.planner.plan import Plan
from perseusd.planner.policy import PointSummary, Policy
from perseusd.planner.profile import Measurement, Profile
from perseusd.planner.profile_csv import profile_to_csv, read_profile_stream, read_profile_waiting
from perseusd.planner.switching import SwitchModel
from perseusd.workload.sim_costs import WorkloadCosts

RUN_NAME = re.compile(r"family_(?P<case>.+)-seed(?P<seed>\d+)\.profile\.csv")
LATENCY = re.compile(r"solving for a (?P<ms>[0-9.]+) ms clock-set latency")
Rows = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Run:
    """One closed-loop run's files."""

    case: str
    seed: int
    profile: Path

    @property
    def plan(self) -> Path:
        return self.profile.with_suffix(".plan.json")

    @property
    def log(self) -> Path:
        return self.profile.with_name(self.profile.name.replace(".profile.csv", ".daemon.log"))


def find_runs(dirs: Sequence[Path], only: str | None = None) -> list[Run]:
    """The family runs kept in `dirs` that have their profile, plan and log."""
    runs = []
    for folder in dirs:
        for path in sorted(folder.glob("family_*.profile.csv")):
            name = RUN_NAME.fullmatch(path.name)
            if name is None or (only is not None and name["case"] != only):
                continue
            run = Run(name["case"], int(name["seed"]), path)
            if run.plan.is_file() and run.log.is_file():
                runs.append(run)
    return runs


def board_profile(case: str, board_name: str) -> Profile:
    """The workload's costs at every clock of the board, under its default power limit (no Pareto filter: a
    plan may name any clock)."""
    workload = workload_named(case)
    board = load_board(board_name)
    costs = WorkloadCosts(read_profile_stream(io.StringIO(profile_csv(workload)), source=case), board)
    rows = []
    for stage, instruction in costs.keys:
        for clock_mhz in board.clocks_mhz:
            cost = costs.run_cost(stage, instruction, clock_mhz, board.power_limit_default_w).cost
            rows.append(Measurement(stage, Instruction(instruction), clock_mhz, cost.time_s, cost.energy_j))
    return Profile.from_measurements(rows, source=f"{case} on {board_name}")


class BoardJudge:
    """Plays plans of one workload on the board's costs (`PointFollower`: effective clocks, waits at the
    clocks held), against all-max there."""

    def __init__(self, case: str, board_name: str, model: SwitchModel) -> None:
        workload = workload_named(case)
        board = load_board(board_name)
        self.shape = JobShape("1f1b", workload.stages, workload.microbatches, 1)
        self.dag: ComputationDag = self.shape.dag(self.shape.named_orders() or ())
        profile = board_profile(case, board_name)
        p_block_w = board.idle_power_w(board.max_clock_mhz)
        self.follower = PointFollower(self.dag, profile, p_block_w, model, board_waiting(board_name))
        self.top = tuple(tuple(board.max_clock_mhz for _ in row) for row in self.dag.stage_orders)
        self._all_max: tuple[float, float] | None = None

    def figures(self, carrier: Plan, rows: Rows) -> tuple[float, float]:
        """(time s, energy J) of `rows` as the GPUs run them (`carrier`: any plan of this job)."""
        played = self.follower.follow(carrier, rows, carrier.time_s, carrier.refined_energy_j, None)
        time_s = played.refined_time_s if played.refined_time_s is not None else played.time_s
        return time_s, played.refined_energy_j

    def saving(self, carrier: Plan, rows: Rows) -> tuple[float, float]:
        """(saving %, slowdown %) of `rows` against all-max on the board (played once)."""
        if self._all_max is None:
            self._all_max = self.figures(carrier, self.top)
        base_s, base_j = self._all_max
        time_s, energy_j = self.figures(carrier, rows)
        return 100.0 * (1.0 - energy_j / base_j), 100.0 * (time_s / base_s - 1.0)


def replan(run: Run, board_name: str) -> dict[str, Any]:
    """One run: the deployed plan and this tree's plan of the same measured profile, on the board's costs."""
    latency = LATENCY.search(run.log.read_text())
    if latency is None:
        return {"case": run.case, "seed": run.seed, "error": f"{run.log}: no lock latency logged"}
    model = switch_model_for(float(latency["ms"]) / 1000.0)
    judge = BoardJudge(run.case, board_name, model)
    profile, waiting = read_profile_waiting(io.StringIO(run.profile.read_text()), str(run.profile))
    p_block_w = dict(waiting).get(max(c for c, _ in waiting)) if waiting else None
    if p_block_w is None:
        return {"case": run.case, "seed": run.seed, "error": f"{run.profile}: no waiting power"}
    orders = judge.shape.named_orders() or ()
    task = SolveInput(
        "replan",
        judge.shape,
        orders,
        profile_to_csv(profile),
        str(run.profile),
        p_block_w,
        auto_unit_time_s(profile),
        model,
        waiting,
    )
    started_s = time.perf_counter()
    frontier = solve(task).frontier
    solve_s = time.perf_counter() - started_s
    base = all_max(judge.dag, profile, p_block_w)
    positions = deployable(frontier.points)
    points = [
        PointSummary(k, frontier.points[k].predicted_time_s, frontier.points[k].refined_energy_j)
        for k in positions
    ]
    chosen = Policy("no_slowdown").choose(points, base.time_s)
    point = frontier.points[chosen.index]
    deployed = _plan_rows(run.plan)
    deployed_pct, deployed_slow = judge.saving(point, deployed)
    replanned_pct, replanned_slow = judge.saving(point, point.clocks_mhz)
    return {
        "case": run.case,
        "seed": run.seed,
        "profile": str(run.profile),
        "latency_ms": float(latency["ms"]),
        "deployed_pct": round(deployed_pct, 2),
        "deployed_slowdown_pct": round(deployed_slow, 2),
        "replanned_pct": round(replanned_pct, 2),
        "replanned_slowdown_pct": round(replanned_slow, 2),
        "replanned_predicted_pct": round(100.0 * (1.0 - chosen.energy_j / base.energy_j), 2),
        "solve_s": round(solve_s, 1),
    }


def _plan_rows(path: Path) -> Rows:
    """Per stage, in schedule order, the clocks of a plan file (`perseusctl plan --json`)."""
    document = json.loads(path.read_text())
    return tuple(tuple(int(c["freq_mhz"]) for c in stage) for stage in document["stages"])


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per case: both figures' range over its runs, and the mean change."""
    out: dict[str, Any] = {}
    for case in sorted({r["case"] for r in results if "error" not in r}):
        mine = [r for r in results if r["case"] == case and "error" not in r]
        deployed = [r["deployed_pct"] for r in mine]
        replanned = [r["replanned_pct"] for r in mine]
        change = statistics.mean(r["replanned_pct"] - r["deployed_pct"] for r in mine)
        out[case] = {
            "runs": len(mine),
            "deployed_pct": [min(deployed), max(deployed)],
            "replanned_pct": [min(replanned), max(replanned)],
            "mean_change_pts": round(change, 2),
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="closed-loop trace directories (--trace-dir)")
    parser.add_argument("--board", default="h100_sxm")
    parser.add_argument("--only", help="one family case (or drawn-SEED)")
    args = parser.parse_args(argv)
    runs = find_runs(args.dirs, args.only)
    if not runs:
        print(
            f"no family runs with profile, plan and log in {', '.join(map(str, args.dirs))}", file=sys.stderr
        )
        return 2
    results = []
    for run in runs:
        results.append(replan(run, args.board))
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print(
        json.dumps(
            {
                "benchmark": "replan_measured",
                "board": args.board,
                "runs": results,
                "summary": summary(results),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
