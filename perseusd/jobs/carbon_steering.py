"""The `carbon` policy at work: every interval, the frontier point of least Chase cost for the forecast.

A job whose policy is `carbon` (target: its allowed slowdown, a fraction of all-max's iteration time) gets,
every `interval_s`, the point of least Chase cost (`perseusd.carbon.choice`) at the node signal's forecast
among the points no slower than all-max x (1 + target). While the node has no usable signal (none configured,
failing past its bounded age, or never read) the job runs its default point (`no_slowdown`'s) and says so.
The point chosen is the job's base point: straggler slack is applied on top of it as for any policy
(`StragglerResponse.decide`), and the switch happens at an iteration boundary like every plan switch.

The node power cap is a constraint on top, as for every policy: the carbon point is the job's base, the
one the cap's allocation starts from (`perseusd.cap.job_loads`), and when the cap allows only slower
points each pipeline runs the cap's point (`perseusd.jobs.response.capped`). Past the carbon point Chase's
cost only grows with time on a convex frontier, so the cap's point is then the least-cost point the cap
allows. (Filtering the base itself by the cap would ratchet: the allocation starts from the base, so a base
slowed by the cap would keep the cap's point at it, and the job could never speed up when the grid turns
clean.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from perseus_client.protocol import CarbonInfo, SignalInfo

from perseusd.carbon.choice import DEFAULT_ETA, ChaseWeights, allowed_points, choose_point
from perseusd.carbon.keeper import SignalKeeper, SignalStatus
from perseusd.carbon.ledger import CarbonLedger
from perseusd.jobs.job import Deployed, Job
from perseusd.planner.policy import PointSummary
from perseusd.profiling.trace import CounterSample

logger = logging.getLogger(__name__)
CARBON = "carbon"
COUNT_PERIOD_S = 1.0
"""How often a running job's carbon is counted (its counters are read once a second)."""
SamplesOf = Callable[[str, int], Sequence[CounterSample]]


@dataclass(frozen=True)
class CarbonSettings:
    interval_s: float = 1800.0
    """How often a carbon job's point is chosen again (Chase: 30 min)."""
    eta: float = DEFAULT_ETA
    reference_intensity: float = 0.0
    """Chase's reference intensity; 0: the highest value of the signal's last day."""


@dataclass
class JobSteer:
    """A carbon job's last decision and its ledger."""

    decided_s: float | None = None
    basis: str = ""
    """"forecast 612.3" or "default (signal expired)": why the job runs its point."""
    usable: bool = False
    ledger: CarbonLedger = field(default_factory=CarbonLedger)


@dataclass(eq=False)
class CarbonSteering:
    """The node's signal and every job's carbon state (no transport, no threads: the main loop calls)."""

    signal: SignalKeeper | None
    settings: CarbonSettings
    clock_s: Callable[[], float] = time.monotonic
    jobs: dict[str, JobSteer] = field(default_factory=dict, init=False)

    def status(self) -> SignalStatus | None:
        return None if self.signal is None else self.signal.status()

    def steer_of(self, job: Job) -> JobSteer:
        steer = self.jobs.get(job.name)
        if steer is None:
            steer = self.jobs[job.name] = JobSteer()
        return steer

    def forget(self, name: str) -> None:
        self.jobs.pop(name, None)

    def due(self, job: Job) -> bool:
        """Whether a running carbon job's point should be chosen again now: its interval passed, or the
        signal became usable or unusable since the last choice."""
        if job.policy.name != CARBON or job.deployed is None:
            return False
        steer = self.steer_of(job)
        status = self.status()
        usable = status is not None and status.forecast is not None
        if steer.decided_s is None or usable != steer.usable:
            return True
        return self.clock_s() - steer.decided_s >= self.settings.interval_s

    def steer(self, job: Job, deployed: Deployed, reference_power_w: float) -> Deployed:
        """`deployed` with the carbon policy's point for now (unchanged for any other policy)."""
        if job.policy.name != CARBON:
            return deployed
        steer = self.steer_of(job)
        steer.decided_s = self.clock_s()
        status = self.status()
        if status is None or status.forecast is None:
            why = "no signal configured" if status is None else f"signal {status.state}"
            steer.basis, steer.usable = f"default ({why})", False
            return deployed
        reference = self.settings.reference_intensity or status.reference or status.forecast
        weights = ChaseWeights(self.settings.eta, reference, reference_power_w)
        point = choose_point(self.allowed_for(job, deployed), status.forecast, weights)
        steer.basis, steer.usable = f"forecast {status.forecast:.1f} {status.unit}", True
        if point.index != (job.deployed.point.index if job.deployed else None):
            logger.info(
                "job %s: carbon point %d (%.4f s, %.1f J) for forecast %.1f %s",
                job.name,
                point.index,
                point.time_s,
                point.energy_j,
                status.forecast,
                status.unit,
            )
        return replace(deployed, point=point)

    def allowed_for(self, job: Job, deployed: Deployed) -> list[PointSummary]:
        """The points the job may run: no slower than all-max (or its fastest point when all-max is not
        known) x (1 + its allowed slowdown)."""
        base_s = job.all_max.time_s if job.all_max is not None else deployed.fastest.time_s
        return allowed_points(job.points, base_s * (1.0 + job.policy.target))

    def info(self, job: Job) -> CarbonInfo | None:
        """The job's carbon for the jobs table (None: the node has no signal)."""
        if self.signal is None:
            return None
        steer = self.steer_of(job)
        ledger = steer.ledger
        return CarbonInfo(
            carbon_g=round(ledger.carbon_g, 6),
            all_max_carbon_g=round(ledger.all_max_carbon_g, 6) if ledger.all_max_basis else None,
            all_max_basis=ledger.all_max_basis,
            energy_j=round(ledger.energy_j, 3),
            uncounted_energy_j=round(ledger.uncounted_energy_j, 3),
            basis=steer.basis if job.policy.name == CARBON else "",
            unit=self.signal.status().unit,
        )

    def signal_info(self) -> SignalInfo | None:
        """The node's signal for status (None: none configured)."""
        status = self.status()
        if status is None:
            return None
        return SignalInfo(
            source=status.source,
            unit=status.unit,
            state=status.state,
            value=status.value,
            forecast=None if status.forecast is None else round(status.forecast, 3),
            forecaster=status.forecaster,
            mape_pct={k: round(v, 3) for k, v in status.mape_pct.items()},
            age_s=status.age_s,
            error=status.error,
            reference=status.reference,
        )

    def intensity(self) -> float | None:
        """The signal's current value (None: none usable)."""
        status = self.status()
        return None if status is None else status.value

    def count(self, job: Job, samples_of: SamplesOf, now_ns: int) -> None:
        """Add the job's energy since the last count at the current intensity (every job, any policy, when
        the node has a signal). `samples_of(gpu, since_ns)`: the energy sampler's readings."""
        if self.signal is None:
            return
        ledger = self.steer_of(job).ledger
        intensity = self.intensity()
        predicted_j = job.all_max.energy_j / job.shape.num_stages if job.all_max is not None else None
        bases = set()
        for slot in job.slots.values():
            since_ns = ledger.last_read_ns(slot.gpu)
            if not slot.run_since_ns or now_ns - since_ns < COUNT_PERIOD_S * 1e9:
                continue
            samples = samples_of(slot.gpu, max(since_ns, slot.run_since_ns))
            if not samples:
                continue
            all_max_j = slot.all_max_energy_j if slot.all_max_energy_j is not None else predicted_j
            if slot.all_max_energy_j is not None:
                bases.add("measured")
            elif predicted_j is not None:
                bases.add("predicted")
            reading = (samples[-1].t_ns, samples[-1].energy_mj)
            ledger.observe(slot.gpu, reading, slot.running_steps, all_max_j, intensity)
        if bases:
            ledger.all_max_basis = bases.pop() if len(bases) == 1 else "mixed"
