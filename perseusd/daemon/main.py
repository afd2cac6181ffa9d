"""`perseusd`: the composition root. Builds every component from one frozen `DaemonConfig` and runs it
(`daemon_core` assembles the core from the builders of `components.py`; the command line and the
configuration it loads are `command_line.py`'s).

    perseusd [--config FILE] [--backend auto|nvml|sim] [--sim-gpus N] [--sim-model a100_sxm|a40|h100_sxm]
             [--runtime-dir DIR] [--state-dir DIR] [--log-level L] [--check-config] [reset]

`perseusd reset` restores every GPU recorded in the state file and unlocks clocks on all GPUs (the service's
`ExecStopPost=`). Exit codes: 0 ok, 1 failed (a GPU could not be restored, another daemon runs, ...),
2 bad configuration or usage.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from perseusd import __version__
from perseusd.cap.cap_file import cap_path
from perseusd.cap.declared_cap import DeclaredCap
from perseusd.cap.node_cap import CapSettings, NodeCap
from perseusd.daemon.access import AccessPolicy
from perseusd.daemon.command_line import build_parser, config_loader, flag_overrides
from perseusd.daemon.components import cluster_link, energy_requests, job_manager, plan_book, power_pool
from perseusd.daemon.config import DaemonConfig
from perseusd.daemon.config_loading import load_restore_config
from perseusd.daemon.core import DaemonCore
from perseusd.daemon.events import EventTracker
from perseusd.daemon.ipc import IpcServer, IpcSettings
from perseusd.daemon.limits import ConnectionLimits, raise_descriptor_limit
from perseusd.daemon.logging_setup import configure_logging
from perseusd.daemon.past_jobs import PAST_JOBS_FILE, PastJobs
from perseusd.daemon.runtime_dir import DaemonRunningError, locked_runtime_dir
from perseusd.daemon.service import Service
from perseusd.errors import ConfigError, PerseusError
from perseusd.gpu.backend import GpuDevice
from perseusd.gpu.owner import GpuOwner
from perseusd.gpu.power_features import PowerFeature
from perseusd.gpu.readonly import ReadOnlyDevice
from perseusd.gpu.registry import GpuRegistry
from perseusd.gpu.select import backend_kind, open_backend
from perseusd.jobs.carbon_steering import CarbonSteering
from perseusd.jobs.manager import MAX_ENDED_JOBS
from perseusd.jobs.settings import JobSettings
from perseusd.leasing.gpu_access import GpuAccess
from perseusd.leasing.identity import Caller, process_start_time
from perseusd.leasing.leases import LeaseBook
from perseusd.leasing.recovery import read_or_recover, reset_node, restore_recorded
from perseusd.leasing.restore import RestoreKeeper
from perseusd.leasing.slurm_jobs import SlurmLedger
from perseusd.leasing.state_file import ensure_state_dir, state_path
from perseusd.metrics.gpu_calls import GpuCallRecorder, TimedDevice
from perseusd.pool.limits_file import restore_pool_limits

logger = logging.getLogger("perseusd")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


@contextlib.contextmanager
def gpu_registry(config: DaemonConfig, calls: GpuCallRecorder | None = None) -> Iterator[GpuRegistry]:
    """Open the backend and one owner thread per GPU (device calls timed into `calls`); stop them on exit."""
    backend = open_backend(
        config.backend,
        sim_gpus=config.sim_gpus,
        sim_model=config.sim_model,
        sim_dir=config.runtime_dir / "sim",
        sim_update_period_s=config.sim_update_period_s,
        seed=config.sim_seed,
        mixed_real=config.mixed_real,
    )
    owners: list[GpuOwner] = []
    features = {device.info.uuid: read_power_features(device) for device in backend.devices()}
    try:
        for raw in backend.devices():
            device = ReadOnlyDevice(raw) if config.monitor_only else raw
            timed = TimedDevice(device, calls) if calls is not None else device
            owner = GpuOwner(timed, call_timeout_s=config.gpu_call_timeout_s)
            owner.start()
            owners.append(owner)
        registry = GpuRegistry(owners, config.gpu_call_timeout_s)
        registry.power_features = features
        yield registry
    finally:
        for owner in owners:
            owner.stop()
        backend.close()


def read_power_features(device: GpuDevice) -> tuple[PowerFeature, ...]:
    """The driver power features of a GPU (read before its owner thread starts), each active one logged:
    the daemon never loses to them silently (docs/gpu-backends.md)."""
    features = device.power_features()
    for feature in features:
        if feature.active:
            logger.warning(
                "GPU %s: %s; it can hold clocks or power away from what perseusd sets",
                device.info.uuid,
                feature.text(),
            )
    return features


def run_daemon(config: DaemonConfig, reload_config: Callable[[], DaemonConfig]) -> int:
    """Startup -> main loop -> shutdown."""
    policy = AccessPolicy(config.socket_group, config.admin_group)
    calls = GpuCallRecorder() if config.metrics_enabled else None
    with (
        locked_runtime_dir(config.runtime_dir, policy.socket_gid),
        gpu_registry(config, calls) as registry,
        restored_unless_served(config, registry),
        daemon_core(config, registry, policy.is_admin) as core,
        metrics_exposure(config, core, calls),
    ):
        return serve(config, reload_config, policy, core)


@contextlib.contextmanager
def restored_unless_served(config: DaemonConfig, registry: GpuRegistry) -> Iterator[None]:
    """Start-up restores first: a state file that cannot be read gives every GPU its defaults (and is moved
    aside) before anything else starts; a start that fails later (a port taken, etcd, the cluster, ...)
    restores every GPU the last run touched before the daemon exits. A monitor-only daemon writes nothing."""
    if config.monitor_only:
        yield
        return
    ensure_state_dir(config.state_dir)
    read_or_recover(registry, state_path(config.state_dir))
    try:
        yield
    except BaseException:
        logger.error("start-up failed: restoring every GPU the last run touched before exiting")
        outcome = restore_recorded(registry, state_path(config.state_dir))
        if outcome.failed:
            logger.error("restore FAILED on %s (perseusd reset retries)", ", ".join(outcome.failed))
        raise


@contextlib.contextmanager
def daemon_core(
    config: DaemonConfig,
    registry: GpuRegistry,
    is_admin: Callable[[Caller], bool],
    *,
    settings: JobSettings | None = None,
    carbon: CarbonSteering | None = None,
) -> Iterator[DaemonCore]:
    """The transport-free core over `registry`, assembled from `config`: restore keeper, leases, plans,
    cluster link, job manager, node power cap and power pool. Everything it started is stopped on exit.

    The daemon and the tests assemble their cores here (tests bring GPUs of their own, and may bring job
    settings or a carbon steering instead of the ones `config` describes).
    """
    ensure_state_dir(config.state_dir)
    if not config.monitor_only:  # a crashed uniform pool's limits (a monitor-only daemon writes nothing)
        restore_pool_limits(registry, set(registry.uuids), config.state_dir)
    pid = os.getpid()
    keeper = RestoreKeeper(registry, state_path(config.state_dir), pid, process_start_time(pid) or 0)
    leases = LeaseBook()
    with (
        plan_book(config, registry) as plans,
        cluster_link(config) as cluster,
        job_manager(config, registry, plans, cluster, settings, carbon) as jobs,
    ):
        cap_settings = CapSettings(config.power_cap_window_s, config.power_cap_enforcement)
        node_cap = NodeCap(
            registry, keeper, leases, jobs, cap_settings, saved_path=cap_path(config.state_dir)
        )
        with power_pool(config, registry, node_cap) as (pool_requests, pool_info):
            core = DaemonCore(
                registry,
                leases,
                keeper,
                EventTracker(),
                version=__version__,
                is_admin=is_admin,
                plans=plans,
                jobs=jobs,
                energy=energy_requests(config, registry),
                pool=pool_requests,
                power_cap=node_cap,
                protocol_minor=config.speaks_minor,
                pool_info=pool_info,
                gpu_access=GpuAccess(config.gpu_access, registry.infos()),
                monitor_only=config.monitor_only,
                slurm=SlurmLedger(registry),
                declared_cap=declared_cap(config, node_cap),
                past_jobs=past_jobs(config),
                backend=backend_kind(config.backend),
            )
            yield core


def past_jobs(config: DaemonConfig) -> PastJobs:
    """The ended and failed jobs of this run and the previous ones (`<state_dir>/jobs-ended`)."""
    past = PastJobs(config.state_dir / PAST_JOBS_FILE, MAX_ENDED_JOBS)
    past.load()
    return past


def declared_cap(config: DaemonConfig, node_cap: NodeCap) -> DeclaredCap | None:
    """The node budget declared in `power_cap_dir` (a Kubernetes ConfigMap volume), when configured."""
    if not config.power_cap_dir:
        return None
    node = config.node_name(os.environ)
    logger.info("power cap: following %s/%s (else default)", config.power_cap_dir, node)
    return DeclaredCap(Path(config.power_cap_dir), node, node_cap, config.power_cap_dir_interval_s)


@contextlib.contextmanager
def metrics_exposure(config: DaemonConfig, core: DaemonCore, calls: GpuCallRecorder | None) -> Iterator[None]:
    """The Prometheus exposures the configuration turns on (none by default); stopped on exit."""
    if not config.metrics_enabled:
        yield
        return
    # Imported here: prometheus-client is needed only when metrics are on.
    from perseusd.metrics.collector import PerseusCollector
    from perseusd.metrics.exposure import HttpExposure, TextfileExposure, metrics_registry

    collector = PerseusCollector(
        core,
        calls,
        hostname=config.metrics_host(os.environ),
        dcgm_families=config.metrics_dcgm_families,
        backend=backend_kind(config.backend),
        job_names=config.metrics_job_names,
    )
    registry = metrics_registry(collector)
    exposures: list[HttpExposure | TextfileExposure] = []
    try:
        if config.metrics_http_port:
            exposures.append(HttpExposure(registry, config.metrics_http_address, config.metrics_http_port))
        if config.metrics_textfile_dir:
            directory = Path(config.metrics_textfile_dir)
            exposures.append(TextfileExposure(registry, directory, config.metrics_textfile_interval_s))
    except OSError as exc:
        for exposure in exposures:
            exposure.stop()
        raise ConfigError(f"metrics: {exc}") from exc
    try:
        yield
    finally:
        for exposure in exposures:
            exposure.stop()


def serve(
    config: DaemonConfig, reload_config: Callable[[], DaemonConfig], policy: AccessPolicy, core: DaemonCore
) -> int:
    """Reconcile the state file, bind the sockets and run the service until it stops."""
    registry, keeper, leases = core.registry, core.keeper, core.leases
    if config.monitor_only:
        logger.info("monitor-only: reading energy and status, never writing a clock or a limit")
    else:
        outcome = keeper.reconcile(leases)
        if outcome.restored or outcome.failed:
            logger.warning("reconciled: restored %s; failed %s", list(outcome.restored), list(outcome.failed))
        if core.power_cap is not None:
            core.power_cap.resume()  # the node budget a previous daemon held, before any job registers again
    limits = ConnectionLimits.for_descriptors(raise_descriptor_limit())
    ipc = IpcServer(
        core,
        policy,
        IpcSettings(
            config.runtime_dir,
            config.max_frame_bytes,
            limits,
            config.speaks_minor,
            config.seqpacket_events,
            config.carry_events,
        ),
    )
    try:
        ipc.bind()

        def apply_config(new: DaemonConfig) -> None:
            logging.getLogger().setLevel(new.log_level)
            ipc.set_max_frame_bytes(new.max_frame_bytes)
            registry.set_call_timeout_s(new.gpu_call_timeout_s)
            policy.clear_cache()
            if (new.backend, new.runtime_dir, new.state_dir) != (
                config.backend,
                config.runtime_dir,
                config.state_dir,
            ):
                logger.warning("backend, runtime_dir and state_dir changes need a restart")
            if new.metrics_settings() != config.metrics_settings():
                logger.warning("metrics_* changes need a restart")
            if (new.seqpacket_events, new.carry_events) != (config.seqpacket_events, config.carry_events):
                logger.warning("seqpacket_events and carry_events changes need a restart")

        return Service(config, core, ipc, reload_config, apply_config).run()
    finally:
        leases.close()
        ipc.close()


def run_reset(config: DaemonConfig) -> int:
    """`perseusd reset`: restore every GPU in the state file, unlock clocks everywhere."""
    policy = AccessPolicy(config.socket_group, config.admin_group)
    try:
        with locked_runtime_dir(config.runtime_dir, policy.socket_gid), gpu_registry(config) as registry:
            restore_pool_limits(registry, set(registry.uuids), config.state_dir)
            outcome = reset_node(registry, state_path(config.state_dir))
    except DaemonRunningError as exc:
        logger.error("%s (use `perseusctl reset` while the daemon runs)", exc)
        return EXIT_FAILED
    if outcome.failed:
        logger.error("reset: FAILED on %s", ", ".join(outcome.failed))
        return EXIT_FAILED
    logger.info("reset: restored %d GPU(s) and unlocked all clocks", len(outcome.restored))
    return EXIT_OK


def restore_despite_config(args: argparse.Namespace) -> None:
    """A configuration that fails to load must not leave a GPU locked: with the settings a restore needs
    (salvaged from the file, the environment and the flags), restore what the state file records; `reset`
    also unlocks every clock. Nothing is opened when there is no state file and no reset was asked for."""
    config = load_restore_config(args.config, os.environ, flag_overrides(args))
    if config.monitor_only:
        return
    if args.command != "reset" and not os.path.lexists(state_path(config.state_dir)):
        return
    configure_logging("INFO")
    logger.error("bad configuration: restoring the GPUs of the last run before exiting")
    try:
        run_reset(config) if args.command == "reset" else restore_last_run(config)
    except PerseusError as exc:
        logger.error("restore failed: %s", exc)


def restore_last_run(config: DaemonConfig) -> None:
    policy = AccessPolicy(config.socket_group, config.admin_group)
    try:
        with locked_runtime_dir(config.runtime_dir, policy.socket_gid), gpu_registry(config) as registry:
            outcome = restore_recorded(registry, state_path(config.state_dir))
    except DaemonRunningError:
        return  # a running daemon owns the GPUs
    if outcome.failed:
        logger.error("restore FAILED on %s (perseusd reset retries)", ", ".join(outcome.failed))


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser("reset" if "reset" in argv else None).parse_args(argv)
    load = config_loader(args)
    try:
        config = load()
    except ConfigError as exc:
        print(f"perseusd: {exc}", file=sys.stderr)
        if not args.check_config:
            restore_despite_config(args)
        return EXIT_USAGE
    if args.check_config:
        sys.stdout.write(config.to_toml())
        return EXIT_OK
    configure_logging(config.log_level)
    try:
        if args.command == "reset":
            return run_reset(config)
        return run_daemon(config, load)
    except PerseusError as exc:
        logger.error("%s", exc)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
