"""The Prometheus collector: reads the daemon core's counters and snapshots at scrape time.

Nothing is counted for the metrics on the event path: the core already counts events, rejections and
restores; GPU readings go through the owner threads like `perseusctl status`; the GPU call histogram is
recorded on the owner threads (`gpu_calls.TimedDevice`). Naming follows Prometheus: base units (seconds,
joules, watts, hertz), `_total` on counters, `perseus_` prefix. Later features add their families here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import secrets
from collections.abc import Iterable, Iterator

from perseus_client.codes import ErrorCode
from perseus_client.protocol import JobInfo
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from perseusd.gpu.backend import GpuInfo, power_capped, throttled
from perseusd.gpu.reading import GpuReading
from perseusd.jobs.manager import JobManager
from perseusd.metrics.carbon_metrics import job_carbon_families, signal_families
from perseusd.metrics.daemon_view import DaemonView
from perseusd.metrics.dcgm_names import GpuRow, dcgm_families, joinable_families
from perseusd.metrics.families import PREFIX, add_known, counter, gauge, mhz_to_hz
from perseusd.metrics.gpu_calls import GpuCallRecorder
from perseusd.metrics.job_metrics import MAX_JOBS, job_families, job_snapshots
from perseusd.metrics.pool_metrics import pool_families
from perseusd.metrics.slurm_metrics import slurm_families

GPU = ("uuid", "name", "index")
MALFORMED_CODES = (
    ErrorCode.BAD_FRAME,
    ErrorCode.UNKNOWN_TYPE,
    ErrorCode.BAD_FIELD,
    ErrorCode.TOO_LARGE,
    ErrorCode.VERSION_MISMATCH,
)


class PerseusCollector(Collector):
    """Every perseusd metric, built fresh at each scrape."""

    def __init__(
        self,
        core: DaemonView,
        calls: GpuCallRecorder | None = None,
        *,
        hostname: str = "",
        dcgm_families: bool = True,
        backend: str = "",
        job_names: bool = False,
    ) -> None:
        self._core = core
        self._job_names = job_names
        """Label job series with job names and uids; False: pseudonyms (`job_pseudonym`), uid -1."""
        self._salt = secrets.token_bytes(16)
        self._backend = backend
        """The GPU backend (`nvml`, `sim`, ...): simulated GPUs' figures are not a real node's."""
        self._calls = calls
        self._hostname = hostname
        """The `Hostname` label of the dcgm-joinable families (docs/metrics.md)."""
        self._dcgm = dcgm_families
        """Export dcgm-exporter's own families too (off beside a dcgm-exporter)."""

    def collect(self) -> Iterable[Metric]:
        yield from self._daemon()
        readings = self._core.registry.read_all()
        yield from self._gpus(readings)
        rows = [GpuRow(info, readings[info.uuid]) for info in self._core.registry.infos()]
        if self._dcgm:
            yield from dcgm_families(rows, self._hostname)
        yield from joinable_families(self._core, rows, self._hostname, self._job_label)
        if self._core.slurm is not None:
            yield from slurm_families(self._core.slurm)
        pool = self._core.pool_info()
        if pool is not None:
            yield from pool_families(pool)
        if self._calls is not None:
            yield from self._gpu_calls(self._calls)
        if self._core.jobs is not None:
            snapshots, omitted = job_snapshots(self._core.jobs, self._core.plans)
            if not self._job_names:
                snapshots = [(self._hidden(info), changes, late) for info, changes, late in snapshots]
            yield from job_families(snapshots)
            yield from self._carbon(self._core.jobs)
            left_out = gauge("metrics_series_omitted", "Jobs left out of the metrics (cardinality bound)")
            left_out.add_metric([], omitted)
            yield left_out

    def _carbon(self, jobs: JobManager) -> Iterator[Metric]:
        """The grid signal and each job's carbon (nothing without a configured signal)."""
        signal = jobs.carbon.signal_info()
        if signal is None:
            return
        yield from signal_families(signal)
        rows = []
        for job in list(jobs.jobs.values())[:MAX_JOBS]:
            carbon = jobs.carbon.info(job)
            if carbon is not None:
                if self._job_names:
                    rows.append((job.name, job.uid, carbon))
                else:
                    rows.append((self.pseudonym(job.name, job.uid), -1, carbon))
        yield from job_carbon_families(rows, signal.unit)

    def pseudonym(self, name: str, uid: int) -> str:
        """A job's label when names are hidden: stable while the daemon runs, unguessable from the name (the
        metrics endpoint and textfile are readable by every local user; the control socket shows a job only
        to its owner and admins)."""
        digest = hmac.new(self._salt, f"{uid}/{name}".encode(), hashlib.sha256).hexdigest()
        return f"job-{digest[:12]}"

    def _job_label(self, name: str, uid: int) -> tuple[str, str]:
        return (name, str(uid)) if self._job_names else (self.pseudonym(name, uid), "-1")

    def _hidden(self, info: JobInfo) -> JobInfo:
        return dataclasses.replace(info, job=self.pseudonym(info.job, info.uid), uid=-1)

    def describe(self) -> Iterable[Metric]:
        return []  # built at scrape time only (registering must not read GPUs)

    # ------------------------------------------------------------------ daemon health

    def _daemon(self) -> Iterator[Metric]:
        core = self._core
        health = core.health()
        info = gauge(
            "daemon_info",
            "perseusd version, wire protocol (major.minor), GPU backend and monitor-only (always 1)",
            ("version", "protocol", "backend", "monitor_only"),
        )
        protocol = f"{health.protocol}.{health.protocol_minor}"
        monitor_only = str(bool(health.monitor_only)).lower()
        info.add_metric([health.version, protocol, self._backend, monitor_only], 1)
        uptime = gauge("daemon_uptime_seconds", "Seconds since the daemon started", value=health.uptime_s)
        clients = gauge("daemon_clients", "Client processes connected (sessions)", value=health.clients)
        received = counter(
            "events_received",
            "Events received (event socket and control socket)",
            value=health.events_received,
        )
        dropped = counter(
            "events_dropped",
            "Events dropped (malformed, out of order, sender without lease)",
            value=health.events_dropped,
        )
        lost = counter(
            "events_lost",
            "Events clients sent that never reached the daemon (their end markers)",
            value=health.events_lost,
        )
        rejected = counter("messages_rejected", "Requests and events rejected, by error code", ("code",))
        for code in ErrorCode:
            rejected.add_metric([code.value], health.errors_by_code.get(code.value, 0))
        malformed_count = sum(health.errors_by_code.get(c.value, 0) for c in MALFORMED_CODES)
        malformed = counter(
            "messages_malformed", "Frames that failed to decode or validate", value=malformed_count
        )
        auth = counter(
            "auth_rejections",
            "Connections refused by the kernel-credential check (ZAP)",
            value=health.auth_rejected,
        )
        restores = counter("gpu_restores", "GPUs restored to their saved state", value=health.restores)
        failures = counter("gpu_restore_failures", "GPU restores that failed", value=health.restore_failures)
        yield from (info, uptime, clients, received, dropped, lost, rejected, malformed, auth)
        yield from (restores, failures)
        if health.last_restore_s is not None:
            doc = "Time to restore a dead client's GPUs"
            yield gauge("last_client_restore_duration_seconds", doc, value=health.last_restore_s)

    # ------------------------------------------------------------------ GPUs

    def _gpus(self, readings: dict[str, GpuReading]) -> Iterator[Metric]:
        core = self._core
        leases = core.leases.leases()
        f = _GpuFamilies()
        for index, info in enumerate(core.registry.infos()):
            labels = [info.uuid, info.name, str(index)]
            f.add_reading(labels, info, readings[info.uuid])
            f.default.add_metric(labels, info.power_limit_default_w)
            lease = leases.get(info.uuid)
            f.leased.add_metric(labels, 0.0 if lease is None else 1.0)
            if lease is not None:
                f.holder.add_metric(labels, lease.uid)
            plan = core.plans.get(info.uuid)
            if plan is not None:
                f.changes.add_metric(labels, plan.clock_changes)
                f.late.add_metric(labels, plan.late)
        yield from f.all()

    def _gpu_calls(self, calls: GpuCallRecorder) -> Iterator[Metric]:
        hist = HistogramMetricFamily(
            PREFIX + "gpu_call_duration_seconds",
            "Duration of the device (NVML) calls made by the GPU owner threads",
            labels=["uuid", "op"],
        )
        for (gpu, op), h in sorted(calls.histograms().items()):
            cumulative, buckets = 0, []
            for bound, count in zip((*calls.buckets_s, float("inf")), h.bucket_counts, strict=True):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), float(cumulative)))
            hist.add_metric([gpu, op], buckets, h.sum_s)
        errors = counter(
            "gpu_call_errors", "Failed device calls by NVML return code (or error type)", ("uuid", "code")
        )
        for (gpu, code), count in sorted(calls.errors().items()):
            errors.add_metric([gpu, code], count)
        yield from (hist, errors)


class _GpuFamilies:
    """The per-GPU families of one scrape."""

    def __init__(self) -> None:
        self.up = gauge("gpu_up", "1 when every value was read", GPU)
        self.energy = counter("gpu_energy_joules", "GPU energy counter since the driver loaded", GPU)
        self.power = gauge("gpu_power_watts", "GPU power draw", GPU)
        self.clock = gauge("gpu_sm_clock_hertz", "Applied (current) SM clock", GPU)
        self.locked = gauge("gpu_locked_sm_clock_hertz", "Locked SM clock (absent: unlocked)", GPU)
        self.is_locked = gauge("gpu_clock_locked", "1 when the SM clock is locked", GPU)
        self.limit = gauge("gpu_power_limit_watts", "Enforced power limit", GPU)
        self.default = gauge("gpu_power_limit_default_watts", "Default power limit", GPU)
        self.capped = gauge(
            "gpu_power_capped", "1 when the power cap holds the SM clock (clock-event reasons)", GPU
        )
        self.throttled = gauge(
            "gpu_clock_throttled", "1 when power, thermal or hardware slowdown holds the SM clock", GPU
        )
        self.lowered = gauge("gpu_power_limit_lowered", "1 when the power limit is below the default", GPU)
        self.leased = gauge("gpu_leased", "1 when a client holds the GPU's lease", GPU)
        self.holder = gauge("gpu_lease_holder_uid", "User id of the lease holder", GPU)
        self.changes = counter("gpu_plan_clock_changes", "Clock changes by the GPU's plan", GPU)
        self.late = counter("gpu_plan_wrong_clock_starts", "Begun before the planned clock", GPU)

    def add_reading(self, labels: list[str], info: GpuInfo, reading: GpuReading) -> None:
        self.up.add_metric(labels, 0.0 if reading.error else 1.0)
        if reading.energy_mj is not None:
            self.energy.add_metric(labels, reading.energy_mj / 1000.0)
        add_known(self.power, labels, reading.power_w)
        if reading.sm_clock_mhz is not None:
            self.clock.add_metric(labels, mhz_to_hz(reading.sm_clock_mhz))
        if reading.locked_sm_clock_mhz is not None:
            self.locked.add_metric(labels, mhz_to_hz(reading.locked_sm_clock_mhz))
        if reading.error is None or "locked_sm_clock_mhz" not in reading.error:
            self.is_locked.add_metric(labels, 0.0 if reading.locked_sm_clock_mhz is None else 1.0)
        if reading.power_limit_w is not None:
            self.limit.add_metric(labels, reading.power_limit_w)
            self.lowered.add_metric(labels, float(reading.power_limit_w < info.power_limit_default_w))
        if reading.clock_event_reasons is not None:
            self.capped.add_metric(labels, float(power_capped(reading.clock_event_reasons)))
            self.throttled.add_metric(labels, float(throttled(reading.clock_event_reasons)))

    def all(self) -> tuple[Metric, ...]:
        """Every family, in the order they were made."""
        return tuple(vars(self).values())
