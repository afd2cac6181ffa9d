"""The daemon's components, each built from the configuration (and stopped on exit where it runs a thread,
a process or a lease): job settings, the plan book and its timer, the cluster link, the job manager, the
power pool and the energy requests. `main.daemon_core`, the one composition function, puts them together.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from perseus_client.status_messages import PoolInfo

from perseusd.cap.node_cap import NodeCap
from perseusd.cluster import start_plane
from perseusd.daemon.config import DaemonConfig
from perseusd.daemon.grid import carbon_steering
from perseusd.daemon.requests.energy import NVML_COUNTER_PERIOD_S, EnergyRequests
from perseusd.gpu.registry import GpuRegistry
from perseusd.gpu.select import simulated_counters
from perseusd.jobs.cache import JobCache
from perseusd.jobs.carbon_steering import CarbonSteering
from perseusd.jobs.cluster_link import ClusterLink
from perseusd.jobs.manager import JobManager
from perseusd.jobs.settings import JobSettings
from perseusd.jobs.solve_worker import SolveWorker
from perseusd.jobs.straggling import StragglerSettings
from perseusd.planner.policy import Policy
from perseusd.profiling.sweep import ONLINE_SWEEP, SweepSettings
from perseusd.records import project
from perseusd.switching.deadline_timer import DeadlineTimer
from perseusd.switching.early_changes import LEAD_LATENCY_QUANTILE, EarlyRaise
from perseusd.switching.energy_sampler import EnergySampler
from perseusd.switching.plans import PlanBook

if TYPE_CHECKING:  # etcd3gw (the `cluster` extra) is imported only when the daemon is configured with etcd
    from perseusd.daemon.requests.pool import PoolRequests

logger = logging.getLogger(__name__)


def job_settings(config: DaemonConfig) -> JobSettings:
    """The job manager's settings: online profiling sweep, stragglers, solver unit, default policy; those
    named alike in the config (the job limits, the solve timeout, the ramp bound) copied as they are."""
    sweep = SweepSettings(
        clock_stride=config.profile_clock_stride,
        min_clock_mhz=config.profile_min_clock_mhz,
        iteration_budget=config.profile_iteration_budget,
        deep_iteration_limit=config.profile_deep_iteration_limit,
        **ONLINE_SWEEP,
    )
    stragglers = StragglerSettings(
        threshold=config.straggler_threshold,
        clear_threshold=config.straggler_clear_threshold,
        iterations=config.straggler_iterations,
    )
    return project(
        JobSettings,
        config,
        warmup_iterations=config.profile_warmup_iterations,
        max_profiling_iterations=config.profile_max_iterations,
        unit_time_s=config.solver_unit_time_s,
        policy=Policy(config.default_policy, config.default_policy_target),
        clock_lead_s=config.clock_lead_ms / 1000.0,
        fill_clocks=config.profile_fill_clocks,
        sweep=sweep,
        stragglers=stragglers,
    )


@contextlib.contextmanager
def cluster_link(config: DaemonConfig) -> Iterator[ClusterLink | None]:
    """The cluster plane when etcd endpoints are configured (else None); stopped, lease revoked, on exit."""
    cluster = config.cluster()
    if cluster is None:
        yield None
        return
    plane = start_plane(cluster)
    logger.info("cluster plane: node %s, etcd %s", cluster.node_name, ", ".join(cluster.endpoints))
    try:
        yield ClusterLink(plane, cluster.node_name)
    finally:
        plane.stop(revoke=True)


@contextlib.contextmanager
def power_pool(
    config: DaemonConfig, registry: GpuRegistry, node_cap: NodeCap
) -> Iterator[tuple[PoolRequests | None, Callable[[], PoolInfo] | None]]:
    """With etcd: the pool admin requests; with a pool too, this node's pool agent applying its grant through
    the node cap (`power_pool_target = "frontier"`) or as uniform GPU power limits (stopped on exit: lease
    revoked, limits put back), and what `status` shows of it. Nothing without etcd."""
    cluster = config.cluster()
    if cluster is None:
        yield None, None
        return
    from perseusd.daemon.requests.pool import PoolRequests
    from perseusd.pool.agent import PoolAgent, PoolSettings
    from perseusd.pool.limits_file import pool_limits_path
    from perseusd.pool.uniform import UniformPowerTarget

    requests = PoolRequests(cluster)
    agent = None
    if config.power_pool:
        settings = PoolSettings(
            config.power_pool,
            config.power_pool_safe_cap_w,
            config.power_pool_budget_file,
            config.power_pool_budget_max_age_s,
            config.power_pool_budget_hold_s,
            config.power_pool_absent_node,
            config.power_pool_etcd_max_txn_ops,
        )
        if config.power_pool_target == "uniform":
            uniform = UniformPowerTarget(registry, originals_path=pool_limits_path(config.state_dir))
            agent = PoolAgent(cluster, settings, uniform, uniform.measure_and_hold_w)
        else:
            agent = PoolAgent(cluster, settings, node_cap, node_cap.measured_w)
        agent.start()
        logger.info("power pool %s: node %s joined", config.power_pool, cluster.node_name)
    try:
        target = config.power_pool_target
        yield requests, None if agent is None else (lambda: agent.info(target))
    finally:
        if agent is not None:
            agent.stop(revoke=True)
        requests.close()


@contextlib.contextmanager
def job_manager(
    config: DaemonConfig,
    registry: GpuRegistry,
    plans: PlanBook,
    cluster: ClusterLink | None,
    settings: JobSettings | None = None,
    carbon: CarbonSteering | None = None,
) -> Iterator[JobManager]:
    """The job manager with its energy sampler thread and solver worker; both stopped on exit.

    `settings` and `carbon` default to what `config` describes."""
    sampler = EnergySampler(registry.submit_read_energy, config.energy_sample_period_s)
    cache = JobCache(config.state_dir / "jobs") if config.job_cache else None
    with contextlib.ExitStack() as stack:
        steering = carbon if carbon is not None else stack.enter_context(carbon_steering(config))
        manager = JobManager(
            registry,
            plans,
            sampler,
            SolveWorker(memory_limit_mib=config.solver_memory_limit_mib or None),
            cache,
            settings if settings is not None else job_settings(config),
            cluster=cluster,
            carbon=steering,
        )
        sampler.start()
        try:
            yield manager
        finally:
            sampler.stop()
            manager.close()


@contextlib.contextmanager
def plan_book(config: DaemonConfig, registry: GpuRegistry) -> Iterator[PlanBook]:
    """The per-computation plans, with the timer thread that raises clocks early (stopped on exit)."""
    if config.clock_lead_ms <= 0:
        yield PlanBook(registry.submit_locked_sm_clock_mhz, set_now=registry.set_locked_sm_clock_mhz)
        return
    timer = DeadlineTimer()
    timer.start()
    try:
        latency_ns = functools.partial(registry.clock_set_latency_ns, quantile=LEAD_LATENCY_QUANTILE)
        typical_ns = functools.partial(registry.clock_set_latency_ns, quantile=0.5)
        early = EarlyRaise(timer, int(config.clock_lead_ms * 1e6), latency_ns, typical_ns)
        yield PlanBook(
            registry.submit_locked_sm_clock_mhz, early=early, set_now=registry.set_locked_sm_clock_mhz
        )
    finally:
        timer.stop()


def energy_requests(config: DaemonConfig, registry: GpuRegistry) -> EnergyRequests:
    """`energy_read` for energy windows; the counter period is the simulated one, else NVML's worst case."""
    simulated = simulated_counters(config.backend, config.mixed_real)
    period_s = config.sim_update_period_s if simulated else NVML_COUNTER_PERIOD_S
    return EnergyRequests(registry, period_s, config.gpu_call_timeout_s)
