"""How far the Perseus frontier is from the exact discrete optimum (`exact`): `frontier_gap`.

Both sides are evaluated with measured option energies and quantised durations at the same quantised
iteration time; the benchmark `benchmarks/bench_exact_gap.py` reports the gaps per case.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from perseusd.errors import PlanningError
from perseusd.planner.dag import ComputationDag
from perseusd.planner.exact import solve_deadline
from perseusd.planner.exact_problem import ExactProblem, longest_path_quant, prepare_problem
from perseusd.planner.options import Option
from perseusd.planner.profile import Profile


def _sample_indices(count: int, sample: int) -> list[int]:
    if count == 0 or sample < 1:
        return []
    if sample == 1 or count == 1:
        return [0]
    return sorted({round(k * (count - 1) / (sample - 1)) for k in range(min(sample, count))})


def _gap_pct(perseus_j: float, exact_j: float) -> float:
    return (perseus_j - exact_j) / abs(exact_j) * 100.0 if exact_j else math.nan


def frontier_gap(
    dag: ComputationDag,
    profile: Profile,
    unit_time_s: float,
    p_block_w: float,
    sample: int,
    *,
    all_clocks: bool = True,
    time_limit_s: float = 30.0,
) -> list[dict[str, float | int | str]]:
    """How far `sample` evenly spaced points of the Perseus frontier are from the exact optimum.

    Both sides are evaluated the same, model-free way at the point's quantised iteration time T
    (`quant_time`): energy = sum over computations of the chosen option's measured energy
    - P_block * quant_time * unit_time, plus S * T * unit_time * P_block. For Perseus the options are the ones
    its clocks select in the solver's filtered option sets; their quantised durations must meet T (checked,
    reported as `perseus_makespan_quant`). The exact side is the MILP at deadline T over the same filtered
    options (`exact_energy_j`, `gap_pct`; seeded with the Perseus plan, so never above it) and, with
    `all_clocks`, over every profile clock (`exact_all_energy_j`, `gap_all_pct`: the gap to the best any
    planner could do on this profile). gap_pct = (perseus - exact) / exact * 100. Neither the solver's cost
    model nor its `refined_energy_j` (measured, unquantised times) enters the comparison.
    """
    from perseusd.planner.solver import FrontierSolver, SolverParams

    solver = FrontierSolver(dag, profile, SolverParams(unit_time_s, p_block_w))
    points = list(solver.points())
    filtered = prepare_problem(dag, profile, unit_time_s, p_block_w, "filtered")
    raw = prepare_problem(dag, profile, unit_time_s, p_block_w, "all") if all_clocks else None
    rows: list[dict[str, float | int | str]] = []
    for idx in _sample_indices(len(points), sample):
        point = points[idx]
        chosen = [_option_by_clock(filtered.all_options[n], c) for n, c in enumerate(point.clocks_mhz)]
        makespan = longest_path_quant(dag, [o.quant_time for o in chosen])
        if makespan > point.quant_time:
            raise PlanningError(
                f"Perseus point {idx} takes {makespan} unit times, above its {point.quant_time}"
            )
        blocking = dag.num_stages * point.quant_time * unit_time_s * p_block_w
        perseus_j = math.fsum(o.effective_cost_j for o in chosen) + blocking
        row: dict[str, float | int | str] = {
            "index": point.index,
            "quant_time": point.quant_time,
            "time_s": point.time_s,
            "perseus_makespan_quant": makespan,
            "perseus_energy_j": perseus_j,
        }
        row.update(_exact_columns("", filtered, point.quant_time, point.clocks_mhz, perseus_j, time_limit_s))
        if raw is not None:
            row.update(
                _exact_columns("all_", raw, point.quant_time, point.clocks_mhz, perseus_j, time_limit_s)
            )
        rows.append(row)
    return rows


def _option_by_clock(options: Sequence[Option], clock_mhz: int) -> Option:
    for option in options:
        if option.freq_mhz == clock_mhz:
            return option
    raise PlanningError(f"{clock_mhz} MHz is not among the solver's options")


def _exact_columns(
    prefix: str,
    problem: ExactProblem,
    deadline_quant: int,
    start_clocks_mhz: Sequence[int],
    perseus_j: float,
    time_limit_s: float,
) -> dict[str, float | int | str]:
    result = solve_deadline(problem, deadline_quant, time_limit_s, start_clocks_mhz)
    if result is None:
        raise PlanningError(f"the exact model is infeasible at {deadline_quant}, where Perseus has a plan")
    gap_key = "gap_all_pct" if prefix else "gap_pct"
    return {
        f"exact_{prefix}energy_j": result.energy_j,
        gap_key: _gap_pct(perseus_j, result.energy_j),
        f"exact_{prefix}status": result.status,
        f"exact_{prefix}mip_gap": result.mip_gap,
        f"exact_{prefix}solve_s": result.solve_s,
    }


__all__ = ["frontier_gap"]
