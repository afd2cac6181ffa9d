"""The exact discrete optimum of small cases: a mixed-integer program solved with HiGHS (`highspy`).

For a deadline D (in unit times) choose one option per computation so that the DAG's longest path with the
options' quantised durations is at most D, minimising the sum of effective costs
(measured energy - P_block * quant_time * unit_time). The plan energy at iteration time T = D is then that sum
plus S * D * unit_time * P_block (spec section 1), so minimising the effective cost minimises the energy of an
iteration that lasts D, exactly the quantity the Perseus frontier trades against time.

Model: a binary x[i,k] per computation i and candidate option k (sum_k x[i,k] = 1), a continuous start s_i,
s_v >= s_u + dur_u on every edge and s_i + dur_i <= D on every sink, with dur_i = sum_k q[i,k] x[i,k]. Start
times are bounded by the all-fastest time windows and options that cannot fit in their window are left out.
Options dominated in (quant_time, effective cost) by another of the same computation are dropped too; neither
reduction changes the optimum.

`exact_problem` prepares what does not depend on the deadline (option spaces, dominated options, time
windows); `exact_gap` compares the Perseus frontier with this optimum. `highspy` is the optional extra
`exact` and is imported only when a model is solved.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from perseusd.errors import PlanningError
from perseusd.planner.dag import ComputationDag
from perseusd.planner.exact_problem import ExactProblem, OptionSpace, longest_path_quant, prepare_problem
from perseusd.planner.options import Option
from perseusd.planner.profile import Profile

MIP_REL_GAP = 1e-9
"""Relative gap at which HiGHS stops: small enough that `optimal` means optimal to float precision."""
_SELECTED = 0.5


@dataclass(frozen=True)
class ExactResult:
    """The minimum-energy plan that finishes within `deadline_quant` unit times."""

    deadline_quant: int
    makespan_quant: int
    """Longest path of the chosen options' quantised durations (<= deadline_quant)."""
    clocks_mhz: tuple[int, ...]
    """One clock per DAG node id."""
    durations_quant: tuple[int, ...]
    effective_cost_j: float
    """Sum over computations of measured energy - P_block * quant_time * unit_time."""
    energy_j: float
    """Plan energy at iteration time T = deadline: effective cost + S * T * unit_time * P_block."""
    compute_energy_j: float
    """Sum of the chosen options' measured energies (no blocking energy)."""
    status: str
    """`optimal`, or `time_limit` when HiGHS stopped early with a feasible plan (see `mip_gap`)."""
    mip_gap: float
    solve_s: float
    option_space: str

    @property
    def optimal(self) -> bool:
        """Whether HiGHS proved the plan optimal."""
        return self.status == "optimal"


def _load_highspy() -> Any:
    try:
        import highspy
    except ImportError:
        raise PlanningError(
            "the exact MILP solver needs highspy; install the optional extra: pip install 'perseusd[exact]'"
        ) from None
    return highspy


@dataclass(frozen=True)
class _Model:
    """The MILP for one deadline: column k of node i is `columns[i][k]`; start times follow the x columns."""

    allowed: tuple[tuple[Option, ...], ...]
    columns: tuple[tuple[int, ...], ...]
    num_x: int


def _allowed_options(problem: ExactProblem, deadline_quant: int) -> tuple[tuple[Option, ...], ...]:
    """Per node, the candidates that fit in the node's all-fastest time window."""
    allowed = []
    for node, options in enumerate(problem.candidates):
        slack = deadline_quant - problem.head_quant[node] - problem.tail_quant[node] + options[0].quant_time
        allowed.append(tuple(o for o in options if o.quant_time <= slack))
    return tuple(allowed)


def _build_lp(problem: ExactProblem, deadline_quant: int, highspy: Any) -> tuple[Any, _Model]:
    dag = problem.dag
    allowed = _allowed_options(problem, deadline_quant)
    columns, num_x = [], 0
    for options in allowed:
        columns.append(tuple(range(num_x, num_x + len(options))))
        num_x += len(options)
    sinks = dag.sinks()
    edges = [(u, v) for u in range(dag.num_computations) for v in dag.successors[u]]
    n = dag.num_computations
    edge_row0, sink_row0 = n, n + len(edges)
    num_rows = sink_row0 + len(sinks)
    col_entries: list[list[tuple[int, float]]] = [[] for _ in range(num_x + n)]
    for node, cols in enumerate(columns):
        for col in cols:
            col_entries[col].append((node, 1.0))
    for row, (u, v) in enumerate(edges, start=edge_row0):
        for col, option in zip(columns[u], allowed[u], strict=True):
            col_entries[col].append((row, -float(option.quant_time)))
        col_entries[num_x + u].append((row, -1.0))
        col_entries[num_x + v].append((row, 1.0))
    for row, node in enumerate(sinks, start=sink_row0):
        for col, option in zip(columns[node], allowed[node], strict=True):
            col_entries[col].append((row, float(option.quant_time)))
        col_entries[num_x + node].append((row, 1.0))

    inf = highspy.kHighsInf
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = num_x + n, num_rows
    lp.col_cost_ = [o.effective_cost_j for options in allowed for o in options] + [0.0] * n
    lp.col_lower_ = [0.0] * num_x + [float(h) for h in problem.head_quant]
    lp.col_upper_ = [1.0] * num_x + [float(deadline_quant - t) for t in problem.tail_quant]
    lp.row_lower_ = [1.0] * n + [0.0] * len(edges) + [-inf] * len(sinks)
    lp.row_upper_ = [1.0] * n + [inf] * len(edges) + [float(deadline_quant)] * len(sinks)
    lp.integrality_ = [highspy.HighsVarType.kInteger] * num_x + [highspy.HighsVarType.kContinuous] * n
    starts, index, value = [0], [], []
    for entries in col_entries:
        for row, coef in entries:
            index.append(row)
            value.append(coef)
        starts.append(len(index))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = num_x + n, num_rows
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = starts, index, value
    return lp, _Model(allowed, tuple(columns), num_x)


def _start_choice(problem: ExactProblem, model: _Model, start_clocks_mhz: Sequence[int] | None) -> list[int]:
    """Per node, the index into `model.allowed` of the start plan (all fastest when none is given)."""
    if start_clocks_mhz is None:
        return [0] * problem.dag.num_computations
    if len(start_clocks_mhz) != problem.dag.num_computations:
        raise PlanningError(
            f"start plan has {len(start_clocks_mhz)} clocks for {problem.dag.num_computations} nodes"
        )
    choice = []
    for node, clock in enumerate(start_clocks_mhz):
        given = next((o for o in problem.all_options[node] if o.freq_mhz == clock), None)
        if given is None:
            label = problem.dag.computations[node].label()
            raise PlanningError(f"start plan: {clock} MHz is not a {problem.option_space} option of {label}")
        # A kept option at least as fast and as cheap exists (it dominates `given`, or is `given`).
        fits = [
            (o.effective_cost_j, k)
            for k, o in enumerate(model.allowed[node])
            if o.quant_time <= given.quant_time and o.effective_cost_j <= given.effective_cost_j
        ]
        choice.append(min(fits)[1] if fits else 0)
    return choice


def _set_start(h: Any, highspy: Any, problem: ExactProblem, model: _Model, choice: Sequence[int]) -> None:
    durations = [model.allowed[i][k].quant_time for i, k in enumerate(choice)]
    dag = problem.dag
    start = [0] * dag.num_computations
    for node in dag.topological_order:
        start[node] = max((start[p] + durations[p] for p in dag.predecessors[node]), default=0)
    values = [0.0] * (model.num_x + dag.num_computations)
    for node, k in enumerate(choice):
        values[model.columns[node][k]] = 1.0
        values[model.num_x + node] = float(start[node])
    solution = highspy.HighsSolution()
    solution.col_value = values
    solution.value_valid = True
    h.setSolution(solution)


def solve_deadline(
    problem: ExactProblem,
    deadline_quant: int,
    time_limit_s: float,
    start_clocks_mhz: Sequence[int] | None,
) -> ExactResult | None:
    """The exact model of `problem` at `deadline_quant`, solved; None when no plan meets the deadline."""
    if deadline_quant < problem.t_min_quant:
        return None
    highspy = _load_highspy()
    lp, model = _build_lp(problem, deadline_quant, highspy)
    h = highspy.Highs()
    for name, value in (
        ("output_flag", False),
        ("threads", 1),
        ("time_limit", float(time_limit_s)),
        ("mip_rel_gap", MIP_REL_GAP),
        ("mip_abs_gap", 0.0),
    ):
        h.setOptionValue(name, value)
    h.passModel(lp)
    choice = _start_choice(problem, model, start_clocks_mhz)
    _set_start(h, highspy, problem, model, choice)
    began = time.perf_counter()
    h.run()
    solve_s = time.perf_counter() - began
    status = h.getModelStatus()
    statuses = highspy.HighsModelStatus
    if status == statuses.kInfeasible:
        return None
    info = h.getInfo()
    if status == statuses.kOptimal:
        name = "optimal"
    elif status == statuses.kTimeLimit and info.primal_solution_status == highspy.kSolutionStatusFeasible:
        name = "time_limit"
    else:
        raise PlanningError(f"HiGHS stopped at deadline {deadline_quant}: {h.modelStatusToString(status)}")
    values = list(h.getSolution().col_value)
    chosen = [
        _selected(model.allowed[i], values, model.columns[i]) for i in range(problem.dag.num_computations)
    ]
    return _result(problem, deadline_quant, chosen, name, float(info.mip_gap), solve_s)


def _selected(options: Sequence[Option], values: Sequence[float], columns: Sequence[int]) -> Option:
    best = max(range(len(options)), key=lambda k: values[columns[k]])
    if values[columns[best]] < _SELECTED:
        raise PlanningError("HiGHS returned a fractional option choice")
    return options[best]


def _result(
    problem: ExactProblem,
    deadline_quant: int,
    chosen: Sequence[Option],
    status: str,
    mip_gap: float,
    solve_s: float,
) -> ExactResult:
    durations = tuple(o.quant_time for o in chosen)
    makespan = longest_path_quant(problem.dag, durations)
    if makespan > deadline_quant:
        raise PlanningError(
            f"HiGHS returned a plan of {makespan} unit times for a deadline of {deadline_quant}"
        )
    effective = math.fsum(o.effective_cost_j for o in chosen)
    blocking = problem.dag.num_stages * deadline_quant * problem.unit_time_s * problem.p_block_w
    return ExactResult(
        deadline_quant=deadline_quant,
        makespan_quant=makespan,
        clocks_mhz=tuple(o.freq_mhz for o in chosen),
        durations_quant=durations,
        effective_cost_j=effective,
        energy_j=effective + blocking,
        compute_energy_j=math.fsum(o.energy_j for o in chosen),
        status=status,
        mip_gap=mip_gap,
        solve_s=solve_s,
        option_space=problem.option_space,
    )


def exact_min_energy(
    dag: ComputationDag,
    profile: Profile,
    unit_time_s: float,
    p_block_w: float,
    deadline_quant: int,
    time_limit_s: float = 30.0,
    *,
    option_space: OptionSpace = "filtered",
    start_clocks_mhz: Sequence[int] | None = None,
) -> ExactResult | None:
    """The minimum-energy plan finishing within `deadline_quant` unit times; None when no plan can.

    `start_clocks_mhz` (one clock per node id, a feasible plan) seeds HiGHS, so even a run stopped by
    `time_limit_s` is never worse than it; by default the all-fastest plan seeds it.
    """
    problem = prepare_problem(dag, profile, unit_time_s, p_block_w, option_space)
    return solve_deadline(problem, deadline_quant, time_limit_s, start_clocks_mhz)


def exact_frontier(
    dag: ComputationDag,
    profile: Profile,
    unit_time_s: float,
    p_block_w: float,
    times_quant: list[int],
    time_limit_s: float = 30.0,
    *,
    option_space: OptionSpace = "filtered",
) -> list[ExactResult]:
    """`exact_min_energy` at each deadline of `times_quant`, in order; infeasible deadlines are left out."""
    problem = prepare_problem(dag, profile, unit_time_s, p_block_w, option_space)
    results = (solve_deadline(problem, t, time_limit_s, None) for t in times_quant)
    return [r for r in results if r is not None]


__all__ = [
    "ExactResult",
    "exact_frontier",
    "exact_min_energy",
    "solve_deadline",
]
