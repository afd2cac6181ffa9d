"""Metrics that sit beside dcgm-exporter's: its names, units and labels for what it also measures, and the
project's own names, with the same labels, for what only perseusd knows.

dcgm-exporter (NVIDIA's) exports `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` (a counter of mJ since the driver
loaded; typed gauge here, its value the same counter), `DCGM_FI_DEV_POWER_USAGE` (W), `DCGM_FI_DEV_SM_CLOCK`
(MHz) and `DCGM_FI_DEV_POWER_MGMT_LIMIT` (W), each labelled `gpu` (the index), `UUID`, `device` (nvidia<N>),
`modelName`, `pci_bus_id` and `Hostname`. On a node without dcgm-exporter perseusd exports these itself
(`metrics_dcgm_families = true`, the default); beside dcgm-exporter, turn them off and join on the labels:
every family here carries `gpu`, `UUID` and `Hostname`.

What dcgm cannot know, per GPU, in perseusd's own names: the job that leases the GPU
(`perseus_gpu_job_info`, with its Slurm job id where it has one; join the job families on `job_name`), its
plan's computations and wrong-clock starts (their ratio is the wrong-clock share), the measured clock-lock
latency, and `perseus_gpu_info`, which maps perseusd's lowercase `uuid` label onto dcgm's `UUID`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric

from perseusd.gpu.backend import GpuInfo, gpu_minor
from perseusd.gpu.reading import GpuReading
from perseusd.metrics.daemon_view import DaemonView
from perseusd.metrics.families import add_known, counter, gauge

DCGM = ("gpu", "UUID", "device", "modelName", "pci_bus_id", "Hostname")
JOIN = ("gpu", "UUID", "Hostname")


def _dcgm_gauge(name: str, doc: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(DCGM))


@dataclass(frozen=True)
class GpuRow:
    """One GPU's labels and reading at a scrape."""

    info: GpuInfo
    reading: GpuReading

    def dcgm_labels(self, hostname: str) -> dict[str, str]:
        info = self.info
        return {
            "gpu": str(info.index),
            "UUID": info.uuid,
            "device": f"nvidia{gpu_minor(info)}",
            "modelName": info.name,
            "pci_bus_id": info.pci_bus_id,
            "Hostname": hostname,
        }


def dcgm_families(rows: list[GpuRow], hostname: str) -> Iterator[Metric]:
    """dcgm-exporter's families for the values perseusd reads anyway (same names, units and labels)."""
    # Typed gauge: prometheus_client names a counter's samples `<name>_total`, and the name is the point;
    # the value is dcgm's counter all the same (mJ since the driver loaded; rate() and increase() apply).
    energy = _dcgm_gauge(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ), a counter."
    )
    power = _dcgm_gauge("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).")
    clock = _dcgm_gauge("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).")
    limit = _dcgm_gauge("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power management limit (in W).")
    for row in rows:
        labels = row.dcgm_labels(hostname)
        values = list(labels.values())
        reading = row.reading
        if reading.energy_mj is not None:
            energy.add_metric(values, float(reading.energy_mj))
        add_known(power, values, reading.power_w)
        if reading.sm_clock_mhz is not None:
            clock.add_metric(values, float(reading.sm_clock_mhz))
        add_known(limit, values, reading.power_limit_w)
    yield from (energy, power, clock, limit)


def named_job(name: str, uid: int) -> tuple[str, str]:
    return name, str(uid)


def joinable_families(
    core: DaemonView,
    rows: list[GpuRow],
    hostname: str,
    job_label: Callable[[str, int], tuple[str, str]] = named_job,
) -> Iterator[Metric]:
    """perseusd's own per-GPU families with dcgm's join labels (`gpu`, `UUID`, `Hostname`); `job_label`
    gives a lease's (job_name, uid) labels (the collector's pseudonyms when names are hidden)."""
    info = gauge(
        "gpu_info", "perseusd's GPU (always 1): maps its uuid label onto dcgm's UUID", (*JOIN, "uuid")
    )
    job = gauge(
        "gpu_job_info",
        "The job that leases the GPU (always 1), with its Slurm job id where it runs in one",
        (*JOIN, "job_name", "uid", "slurm_job"),
    )
    computations = counter("gpu_plan_computations_begun", "Computations begun under the GPU's plan", JOIN)
    wrong = counter(
        "gpu_plan_wrong_clock_computations", "Computations begun before their planned clock", JOIN
    )
    latency = gauge("gpu_clock_lock_latency_seconds", "Measured clock-lock latency (recent median)", JOIN)
    feature = gauge(
        "gpu_driver_power_feature_active",
        "1 when a driver power feature that can fight the locked clocks is on (state: as read at start)",
        (*JOIN, "feature", "state"),
    )
    leases = core.leases.leases()
    for row in rows:
        uuid = row.info.uuid
        key = [str(row.info.index), uuid, hostname]
        info.add_metric([*key, uuid], 1.0)
        lease = leases.get(uuid)
        if lease is not None:
            session = core.leases.session(lease.pid)
            slurm = "" if session is None or session.slurm_job is None else str(session.slurm_job)
            job.add_metric([*key, *job_label(lease.job, lease.uid), slurm], 1.0)
        plan = core.plans.get(uuid)
        if plan is not None:
            computations.add_metric(key, plan.begins)
            wrong.add_metric(key, plan.late)
        for power_feature in core.registry.power_features.get(uuid, ()):
            state = [power_feature.name, power_feature.state]
            feature.add_metric([*key, *state], 1.0 if power_feature.active else 0.0)
        latency_ns = core.registry.clock_set_latency_ns(uuid)
        if latency_ns is not None:
            latency.add_metric(key, latency_ns / 1e9)
    yield from (info, job, computations, wrong, latency, feature)
