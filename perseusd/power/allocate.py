"""The node cap's allocation, pure logic: which frontier point each job runs and each GPU's power limit, so
that the node stays within a grant (W) with the least iteration-time growth, lower priority tiers first.

Inputs: every GPU's power-limit range, and for each job running a plan its frontier points with each GPU's
average power over an iteration (computation energy plus blocking power, over the iteration time) and peak
power (its most power-hungry computation at that point's clocks). GPUs with no such job are *unmanaged*:
nothing is known of what they run, so they are held by their power limit alone, count in the lowest tier
and are held first.

The steps, while the planned node power (unmanaged GPUs at their allocation, each job at its point's
average power) exceeds the grant, tier by tier from the lowest: hold the tier's unmanaged GPUs down towards
their minimum limit, then move one job of the tier to a slower point, the move that costs the least relative
iteration time per watt saved (any slower point, so a non-convex frontier is no trap). What a move saved
beyond the need is then handed back, highest tier first (each job to the fastest point that fits).

Enforcement (`limits_w`):

- `window` (default): the plan holds the node's power averaged over the enforcement window within the
  grant; each managed GPU's limit is its point's peak power plus a margin (so the plan runs as planned; a
  GPU that misbehaves is still held at what its plan needs) and each unmanaged GPU's is its allocation.
  The power measured from the energy counters is the check (see `perseusd.cap.measured_check`).
- `strict`: the limits themselves sum to at most the grant (water-filled over each GPU's need): the node
  cannot exceed the grant even for a moment, at the price of throttling the peaks of every plan.

When the plan cannot fit (the grant is below what the slowest points draw) but the minimum power limits do,
the limits are strict. A grant below the sum of minimum limits is infeasible: every GPU is held at its
minimum limit (never an impossible limit) and the allocation says so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from perseusd.power.cap_inputs import CapPoint, GpuRange, JobLoad
from perseusd.power.limit_fit import FIT_POINTS, PEAK_MARGIN, fit_limits

PRIORITIES = (0, 1, 2)
"""Job priority tiers: 0 low, 1 normal (the default), 2 high. Lower tiers are slowed first."""
PRIORITY_NAMES = {"low": 0, "normal": 1, "high": 2}
DEFAULT_PRIORITY = 1
UNMANAGED_PRIORITY = 0
PLAN_HEADROOM = 0.01
"""The plan aims 1 % below the grant: profiles and energy counters are good to about 1 %."""
ENFORCEMENTS = ("window", "strict")
EPSILON_W = 1e-6


@dataclass(frozen=True)
class JobGrant:
    """What the cap lets one job run."""

    name: str
    priority: int
    index: int
    time_s: float
    base_index: int
    base_time_s: float
    power_w: float

    @property
    def slowdown(self) -> float:
        """Iteration-time growth caused by the cap (0.05 = 5 %)."""
        return self.time_s / self.base_time_s - 1.0 if self.base_time_s > 0 else 0.0


@dataclass(frozen=True)
class CapAllocation:
    grant_w: float
    feasible: bool
    strict: bool
    """The limits sum to at most the grant (asked for, or the plan alone could not fit)."""
    floor_w: float
    demand_w: float
    planned_w: float
    """The node's planned average power (W): jobs at their points, unmanaged GPUs at their limits."""
    jobs: tuple[JobGrant, ...]
    limits_w: dict[str, float] = field(default_factory=dict)
    reason: str = ""


def stage_power_w(
    costs: Sequence[tuple[float, float]], time_s: float, p_block_w: float
) -> tuple[float, float]:
    """(average, peak) power of one GPU over an iteration of `time_s` running computations that each take
    (time_s, energy_j), waiting at `p_block_w` otherwise."""
    busy_s = sum(t for t, _ in costs)
    energy_j = sum(e for _, e in costs) + p_block_w * max(0.0, time_s - busy_s)
    average_w = energy_j / time_s if time_s > 0 else 0.0
    peak_w = max((e / t for t, e in costs if t > 0), default=average_w)
    return average_w, max(peak_w, average_w)


def floor_w(gpus: Sequence[GpuRange]) -> float:
    """The least the node can be held to: every GPU at its minimum power limit."""
    return sum(g.min_w for g in gpus)


def demand_w(gpus: Sequence[GpuRange], jobs: Sequence[JobLoad]) -> float:
    """Every job at its fastest point, every other GPU at its maximum power limit."""
    managed = {uuid for job in jobs for uuid in job.gpus}
    fastest = sum(job.sorted_points()[0].total_w for job in jobs if job.points)
    return fastest + sum(g.max_w for g in gpus if g.uuid not in managed)


def priority_demand_w(gpus: Sequence[GpuRange], jobs: Sequence[JobLoad]) -> dict[int, float]:
    """Demand above the floor per tier (W): unmanaged GPUs in the lowest tier."""
    by_gpu = {g.uuid: g for g in gpus}
    managed = {uuid for job in jobs for uuid in job.gpus}
    tiers = dict.fromkeys(PRIORITIES, 0.0)
    tiers[UNMANAGED_PRIORITY] += sum(g.max_w - g.min_w for g in gpus if g.uuid not in managed)
    for job in jobs:
        if not job.points:
            continue
        fastest = job.sorted_points()[0]
        above = sum(max(0.0, w - by_gpu[u].min_w) for u, w in fastest.power_w.items() if u in by_gpu)
        tiers[job.priority] = tiers.get(job.priority, 0.0) + above
    return tiers


class _State:
    """The allocation in progress: each job's position in its sorted points, each unmanaged GPU's watts."""

    def __init__(self, gpus: Sequence[GpuRange], jobs: Sequence[JobLoad]) -> None:
        managed = {uuid for job in jobs for uuid in job.gpus}
        self.unmanaged = [g for g in gpus if g.uuid not in managed]
        self.alloc_w = {g.uuid: g.max_w for g in self.unmanaged}
        self.jobs = [job for job in jobs if job.points]
        self.points = {job.name: job.sorted_points() for job in self.jobs}
        self.totals = {name: [p.total_w for p in points] for name, points in self.points.items()}
        self.chains: dict[str, list[int]] = {}
        self.base_pos: dict[str, int] = {}
        for job in self.jobs:
            at = [i for i, p in enumerate(self.points[job.name]) if p.index == job.base_index]
            self.base_pos[job.name] = at[0] if at else 0
        self.pos = dict(self.base_pos)

    def point(self, job: JobLoad) -> CapPoint:
        return self.points[job.name][self.pos[job.name]]

    def total_w(self) -> float:
        jobs_w = sum(self.totals[job.name][self.pos[job.name]] for job in self.jobs)
        return sum(self.alloc_w.values()) + jobs_w

    def base_time_s(self, job: JobLoad) -> float:
        return self.points[job.name][self.base_pos[job.name]].time_s

    def hold_unmanaged(self, excess_w: float) -> float:
        """Lower unmanaged GPUs towards their minimum (evenly in headroom) by up to `excess_w`; the saving."""
        room = {g.uuid: self.alloc_w[g.uuid] - g.min_w for g in self.unmanaged}

        def cut(uuid: str, cut_w: float) -> None:
            self.alloc_w[uuid] -= cut_w

        return _spread_evenly(excess_w, room, cut)

    def best_move(self, tier: int) -> tuple[JobLoad, int] | None:
        """The next step, in `tier`, that costs the least relative time per watt saved: each job moves along
        its chain (the lower convex hull of its slower points, found once), so a non-convex frontier is no
        trap and a move costs O(jobs)."""
        best: tuple[float, float, JobLoad, int] | None = None
        for job in self.jobs:
            if job.priority != tier:
                continue
            step = self._next_step(job)
            if step is None:
                continue
            cost, saved_w, j = step
            if best is None or (cost, -saved_w) < (best[0], best[1]):
                best = (cost, -saved_w, job, j)
        return None if best is None else (best[2], best[3])

    def _next_step(self, job: JobLoad) -> tuple[float, float, int] | None:
        chain = self.chains.get(job.name)
        if chain is None or chain[0] != self.pos[job.name]:
            chain = self.chains[job.name] = self._chain(job, self.pos[job.name])
        if len(chain) < 2:
            return None
        here, there = chain[0], chain[1]
        totals, points = self.totals[job.name], self.points[job.name]
        saved_w = totals[here] - totals[there]
        cost = (points[there].time_s - points[here].time_s) / self.base_time_s(job) / saved_w
        return cost, saved_w, there

    def advance(self, job: JobLoad, position: int) -> None:
        self.pos[job.name] = position
        chain = self.chains.get(job.name)
        if chain and position in chain:
            self.chains[job.name] = chain[chain.index(position) :]

    def _chain(self, job: JobLoad, start: int) -> list[int]:
        totals, points = self.totals[job.name], self.points[job.name]
        chain, here = [start], start
        while True:
            best: tuple[float, float, int] | None = None
            for j in range(here + 1, len(points)):
                saved_w = totals[here] - totals[j]
                if saved_w <= EPSILON_W:
                    continue
                cost = (points[j].time_s - points[here].time_s) / saved_w
                if best is None or (cost, -saved_w) < (best[0], best[1]):
                    best = (cost, -saved_w, j)
            if best is None:
                return chain
            here = best[2]
            chain.append(here)

    def hand_back(self, grant_w: float, unmanaged_to_w: float) -> None:
        """Spend what the last moves saved beyond the need: higher tiers first, each job to the fastest
        point that fits `grant_w` (never faster than its base), then the unmanaged GPUs up to
        `unmanaged_to_w`."""
        for job in sorted(self.jobs, key=lambda j: -j.priority):
            totals, here = self.totals[job.name], self.pos[job.name]
            base = self.base_pos[job.name]
            slack_w = grant_w - self.total_w()
            for j in range(base, here):
                if totals[j] - totals[here] <= slack_w + EPSILON_W:
                    self.pos[job.name] = j
                    break
        slack_w = unmanaged_to_w - self.total_w()
        room = {g.uuid: g.max_w - self.alloc_w[g.uuid] for g in self.unmanaged}

        def give(uuid: str, give_w: float) -> None:
            self.alloc_w[uuid] += give_w

        _spread_evenly(slack_w, room, give)  # evenly, as they were held


def _spread_evenly(amount_w: float, room_w: dict[str, float], apply: Callable[[str, float], None]) -> float:
    """Spread `amount_w` evenly over the GPUs of `room_w`, none past its room (`room_w` is used up):
    `apply(uuid, part_w)` for each part, round by round. Returns how much was spread."""
    spread_w = 0.0
    while amount_w > EPSILON_W:
        open_ = [u for u, r in room_w.items() if r > EPSILON_W]
        if not open_:
            break
        share = amount_w / len(open_)
        for u in open_:
            part_w = min(share, room_w[u])
            room_w[u] -= part_w
            apply(u, part_w)
            amount_w -= part_w
            spread_w += part_w
    return spread_w


def allocate(
    gpus: Sequence[GpuRange],
    jobs: Sequence[JobLoad],
    grant_w: float,
    *,
    enforcement: str = "window",
    headroom: float = PLAN_HEADROOM,
) -> CapAllocation:
    """The points and limits that hold the node within `grant_w` (see the module); the plan aims at
    `grant_w x (1 - headroom)`."""
    if enforcement not in ENFORCEMENTS:
        raise ValueError(f"enforcement must be one of {', '.join(ENFORCEMENTS)}")
    state = _State(gpus, jobs)
    target_w = grant_w * (1.0 - headroom)
    tiers = sorted({UNMANAGED_PRIORITY, *PRIORITIES, *(job.priority for job in state.jobs)})
    for tier in tiers:
        if state.total_w() <= target_w + EPSILON_W:
            break
        if tier == UNMANAGED_PRIORITY:
            state.hold_unmanaged(state.total_w() - target_w)
        while state.total_w() > target_w + EPSILON_W:
            move = state.best_move(tier)
            if move is None:
                break
            state.advance(move[0], move[1])
    planned_fits = state.total_w() <= target_w + EPSILON_W
    if planned_fits:
        # A node of unmanaged GPUs only is held by their limits alone: no headroom needed.
        state.hand_back(target_w, target_w if state.jobs else grant_w)
    floor = floor_w(gpus)
    feasible = grant_w + EPSILON_W >= floor
    needs = _needs_w(gpus, state)
    fit = None
    if not planned_fits and enforcement == "window" and feasible and state.jobs:
        fit = fit_limits(gpus, _fit_choices(state), sum(state.alloc_w.values()), target_w)
    strict = enforcement == "strict" or (not planned_fits and fit is None)
    limits = _water_fill(gpus, needs, grant_w) if strict else {**needs, **(fit.limits_w if fit else {})}
    reason = ""
    if not feasible:
        reason = (
            f"cap {grant_w:.0f} W is below the node's floor {floor:.0f} W (every GPU at its minimum power "
            "limit): every GPU is held at its minimum limit, and the node may draw up to the floor"
        )
    elif fit is not None:
        reason = (
            f"even the slowest points draw {state.total_w():.0f} W > {grant_w:.0f} W: power limits of at "
            f"most {max(fit.limits_w.values()):.0f} W on the jobs' GPUs slow their most power-hungry "
            "computations"
        )
    elif not planned_fits:
        reason = (
            f"even the slowest points draw {state.total_w():.0f} W > {grant_w:.0f} W: the power limits "
            "alone hold the node (they throttle every computation above them)"
        )
    grants = tuple(
        JobGrant(
            job.name,
            job.priority,
            fit.points[job.name].index if fit else state.point(job).index,
            fit.time_s[job.name] if fit else state.point(job).time_s,
            job.base_index,
            state.base_time_s(job),
            fit.job_w[job.name] if fit else state.point(job).total_w,
        )
        for job in state.jobs
    )
    return CapAllocation(
        grant_w=grant_w,
        feasible=feasible,
        strict=strict,
        floor_w=floor,
        demand_w=demand_w(gpus, jobs),
        planned_w=fit.window_w if fit else min(state.total_w(), sum(limits.values())),
        jobs=grants,
        limits_w=limits,
        reason=reason,
    )


def _fit_choices(state: _State) -> list[list[tuple[JobLoad, CapPoint]]]:
    """The jobs' points to try under limits: where the moves left them; a job alone, a spread of its points
    no faster than its base."""
    choices = [[(job, state.point(job)) for job in state.jobs]]
    if len(state.jobs) == 1:
        job = state.jobs[0]
        slower = state.points[job.name][state.base_pos[job.name] :]
        step = max(1, len(slower) // FIT_POINTS)
        choices += [[(job, point)] for point in slower[::step]]
    return choices


def _needs_w(gpus: Sequence[GpuRange], state: _State) -> dict[str, float]:
    """Each GPU's limit before any water-filling: a managed GPU's peak power at its point (with the
    margin), an unmanaged GPU's allocation; within the GPU's limits."""
    needs: dict[str, float] = {}
    for job in state.jobs:
        for uuid, peak in state.point(job).peak_w.items():
            needs[uuid] = peak * PEAK_MARGIN
    needs.update(state.alloc_w)
    by_gpu = {g.uuid: g for g in gpus}
    return {u: min(max(needs.get(u, by_gpu[u].max_w), by_gpu[u].min_w), by_gpu[u].max_w) for u in by_gpu}


def _water_fill(gpus: Sequence[GpuRange], needs_w: Mapping[str, float], grant_w: float) -> dict[str, float]:
    """Limits summing to at most `grant_w`: min(need, level) for one level, never below a GPU's minimum."""
    if sum(needs_w.values()) <= grant_w + EPSILON_W:
        return dict(needs_w)
    low_w, high_w = 0.0, max(needs_w.values(), default=0.0)

    def fill(level_w: float) -> dict[str, float]:
        return {g.uuid: max(g.min_w, min(needs_w[g.uuid], level_w)) for g in gpus}

    for _ in range(60):
        mid_w = (low_w + high_w) / 2
        if sum(fill(mid_w).values()) > grant_w:
            high_w = mid_w
        else:
            low_w = mid_w
    return fill(low_w)
