"""The honest reference for a closed-loop run: the best no-slowdown plan a GPU with the board's lock latency
can follow on the TRUE profile, beside the switch-free planner's figure.

`switch_aware_pct` builds the solve exactly as the daemon does (`perseusd.jobs.solving.solve`: the frontier,
every point followed under the switch model, the switch-aware descent) on the profile as the board runs it,
with the switch model the daemon derives from the board's mean lock latency (lead = latency + 2 ms, lowered
runs shorter than two leads merged), and picks what `no_slowdown` picks: the least switch-aware energy of a
deployable point (at most 10 % of computations begun before their clock, as the model counts them) whose
predicted time is no longer than all-max's. The saving is against all-max on the same profile, with the
board's idle power at its top clock as the blocking power (as `perseusctl compare` is given); the followed
plans wait at the board's idle power at the clock they hold (`board_waiting`), as the board draws it.
"""

from __future__ import annotations

from perseusd.gpu.sim_boards import load_board
from perseusd.jobs.lock_latency import MIN_RUN_LEADS
from perseusd.jobs.settings import JobSettings
from perseusd.jobs.shape import JobShape
from perseusd.jobs.solving import SolveInput, auto_unit_time_s, solve
from perseusd.planner.baselines import all_max
from perseusd.planner.descent_limits import deployable
from perseusd.planner.plan import Frontier, Plan
from perseusd.planner.policy import PointSummary, Policy
from perseusd.planner.profile import Profile
from perseusd.planner.profile_csv import profile_to_csv
from perseusd.planner.switching import SwitchModel
from perseusd.planner.waiting import WaitingPower


def board_switch_model(board_name: str) -> SwitchModel | None:
    """The switch model the daemon would derive on this board (None: the board states no lock latency)."""
    board = load_board(board_name)
    timing = board.clock_lock
    if timing.call_max_s <= 0:
        return None
    return switch_model_for((timing.call_min_s + timing.call_max_s) / 2)


def switch_model_for(latency_s: float) -> SwitchModel:
    """The switch model the daemon derives from a measured lock latency (lead = latency + its clock lead,
    lowered runs under `MIN_RUN_LEADS` leads merged)."""
    lead_s = latency_s + JobSettings().clock_lead_s
    return SwitchModel(latency_s, lead_s, min_run_s=MIN_RUN_LEADS * lead_s)


def board_waiting(board_name: str) -> WaitingPower:
    """The board's idle power by locked clock, as the simulated board draws it (its measured points)."""
    board = load_board(board_name)
    return WaitingPower(board.idle_power_w(board.max_clock_mhz), board.idle_points)


def reference_solve(
    profile: Profile, stages: int, microbatches: int, board_name: str
) -> tuple[Frontier, Plan] | None:
    """The daemon's solve of `profile` on the board's switch model, and all-max on it (None: no switch
    model)."""
    switch = board_switch_model(board_name)
    if switch is None:
        return None
    board = load_board(board_name)
    p_block_w = board.idle_power_w(board.max_clock_mhz)
    shape = JobShape("1f1b", stages, microbatches, 1)
    orders = shape.named_orders() or ()
    task = SolveInput(
        "reference",
        shape,
        orders,
        profile_to_csv(profile),
        profile.source,
        p_block_w,
        auto_unit_time_s(profile),
        switch,
        board_waiting(board_name).points,
    )
    return solve(task).frontier, all_max(shape.dag(orders), profile, p_block_w)


def no_slowdown_point(frontier: Frontier, all_max_time_s: float, *, deployable_only: bool = True) -> Plan:
    """What `no_slowdown` deploys: the least switch-aware energy within all-max's time among the
    deployable points (`deployable_only=False`: among every point, the cap on late begins ignored)."""
    positions = deployable(frontier.points) if deployable_only else range(len(frontier.points))
    points = [
        PointSummary(k, frontier.points[k].predicted_time_s, frontier.points[k].refined_energy_j)
        for k in positions
    ]
    return frontier.points[Policy("no_slowdown").choose(points, all_max_time_s).index]


def switch_aware_pct(profile: Profile, stages: int, microbatches: int, board_name: str) -> float | None:
    """The no-slowdown saving (%) of the best followable plan on `profile` (None: no switch model)."""
    solved = reference_solve(profile, stages, microbatches, board_name)
    if solved is None:
        return None
    frontier, base = solved
    chosen = no_slowdown_point(frontier, base.time_s)
    return round(100.0 * (1.0 - chosen.refined_energy_j / base.energy_j), 2)
