"""`perseusctl status [--json] [--watch SEC]`: GPUs, leases and daemon health from a running perseusd.

SM MHZ is the clock each GPU actually runs at, marked `capped` when the power cap holds it below the locked
(or top) clock (NVML's clock-event reasons; on simulated GPUs, the last computation's).

A GPU running a plan gets a PLAN column (computations, clock changes and early raises, late switches,
event -> clock p50/p99); an admin on a node in a power pool (docs/power-pool.md) gets a `power pool` line
(pool, budget, this node's grant and what it holds); when the daemon runs jobs, the job rows of
`perseusctl jobs` follow the GPU table, each with its straggler, target time and energy saved (when there
are) and one short line per pipeline.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import TYPE_CHECKING, Any

from perseus_client.carbon_messages import SignalInfo
from perseus_client.status_messages import GpuStatus, PlanStats, PoolInfo, StatusReply, StatusRequest

from perseusd.ctl.arguments import add_json_option
from perseusd.ctl.daemon_link import admin_socket_usable, ask
from perseusd.ctl.terminal import PLACEHOLDER, fmt, fmt_duration, format_table, watch

if TYPE_CHECKING:
    from perseusd.ctl.daemon_link import StrPath

HELP = "show GPUs, leases and daemon health"
EXIT_OK = 0
EXIT_FAILED = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_json_option(parser)
    parser.add_argument("--watch", type=float, metavar="SEC", help="refresh every SEC seconds until Ctrl-C")


def fetch_status(runtime_dir: StrPath) -> StatusReply:
    """Ask the daemon; admins (who can open the admin socket) get the full view."""
    return ask(runtime_dir, StatusRequest(), StatusReply, admin=admin_socket_usable(runtime_dir))


def status_json(reply: StatusReply) -> dict[str, Any]:
    """The documented JSON form: {"daemon": {...}, "gpus": [...], "jobs": [...]} (None -> null)."""
    return {
        "daemon": dataclasses.asdict(reply.daemon),
        "gpus": [dataclasses.asdict(gpu) for gpu in reply.gpus],
        "jobs": _jobs_json(reply),
        "signal": None if reply.signal is None else dataclasses.asdict(reply.signal),
        "pool": None if reply.pool is None else dataclasses.asdict(reply.pool),
        "users": users_usage(reply),
    }


def users_usage(reply: StatusReply) -> list[dict[str, Any]]:
    """Who uses what, per uid, from the leases and the jobs the reply shows (all of them to an admin):
    GPUs leased and jobs by state, the busiest first."""
    usage: dict[int, dict[str, Any]] = {}

    def of(uid: int) -> dict[str, Any]:
        return usage.setdefault(uid, {"uid": uid, "gpus_leased": 0, "jobs": {}})

    for gpu in reply.gpus:
        if gpu.lease is not None:
            of(gpu.lease.uid)["gpus_leased"] += 1
    for job in reply.jobs:
        jobs = of(job.uid)["jobs"]
        jobs[str(job.state)] = jobs.get(str(job.state), 0) + 1
    return sorted(usage.values(), key=lambda u: (-u["gpus_leased"], -sum(u["jobs"].values()), u["uid"]))


def users_line(reply: StatusReply) -> str | None:
    """`users: uid 1000 2 GPUs, jobs 1 running 1 solving; uid 1001 1 GPU` (None: nobody uses the node)."""
    parts = []
    for user in users_usage(reply):
        gpus = user["gpus_leased"]
        text = f"uid {user['uid']} {gpus} GPU{'s' if gpus != 1 else ''}"
        if user["jobs"]:
            text += ", jobs " + " ".join(f"{count} {state}" for state, count in sorted(user["jobs"].items()))
        parts.append(text)
    return "users: " + "; ".join(parts) if parts else None


def signal_line(signal: SignalInfo) -> str:
    """`grid signal: trace x.csv, ok: 612.3 gCO2eq/kWh, forecast 610.1 (persistence; MAPE ...), 12 s old`; a
    signal without a usable value says that carbon-aware jobs run their default point."""
    head = f"grid signal: {signal.source}, {signal.state}"
    if signal.value is None:
        why = f" ({signal.error})" if signal.error else ""
        return f"{head}{why}: carbon-aware jobs run their default point"
    mape = ", ".join(f"{name} {value:.2f} %" for name, value in sorted(signal.mape_pct.items()))
    parts = [f"{head}: {signal.value:.1f} {signal.unit}"]
    if signal.forecast is not None:
        parts.append(
            f"forecast {signal.forecast:.1f} ({signal.forecaster}{'; MAPE ' + mape if mape else ''})"
        )
    if signal.age_s is not None:
        parts.append(f"{fmt_duration(signal.age_s)} old")
    if signal.error:
        parts.append(f"failing: {signal.error}")
    return ", ".join(parts)


def pool_line(pool: PoolInfo) -> str:
    """`power pool row-3 (node n17, frontier): budget 24000.0 W, grant 3000.0 W, holds 3000.0 W (grant)`."""
    role = ", allocator" if pool.allocator else ""
    parts = [
        f"power pool {pool.pool} (node {pool.node}, {pool.target}{role}): budget {_watts(pool.budget_w)}",
        f"grant {_watts(pool.grant_w)}",
        f"holds {_watts(pool.applied_w)} ({pool.reason})",
    ]
    if pool.budget_by:
        age = "" if pool.budget_age_s is None else f", {fmt_duration(pool.budget_age_s)} old"
        signal = "" if pool.budget_signal in (None, "fresh") else f", {pool.budget_signal}"
        parts.append(f"budget from {pool.budget_by}{age}{signal}")
    if pool.error:
        parts.append(f"etcd failing: {pool.error}")
    return ", ".join(parts)


def _watts(value_w: float | None) -> str:
    return "none" if value_w is None else f"{value_w:.1f} W"


def _jobs_json(reply: StatusReply) -> list[dict[str, Any]]:
    if not reply.jobs:
        return []
    from perseusd.ctl.jobs_cmd import jobs_json  # only with jobs: most nodes have none

    return jobs_json(reply.jobs)


def _lease(gpu: GpuStatus) -> str:
    if gpu.lease is None:
        return PLACEHOLDER
    job = f" {gpu.lease.job}" if gpu.lease.job else ""
    slurm = "" if gpu.lease.slurm_job is None else f" (Slurm job {gpu.lease.slurm_job})"
    return f"pid {gpu.lease.pid} uid {gpu.lease.uid}{job}{slurm}"


def _sm_clock(gpu: GpuStatus) -> str:
    """The clock the GPU runs at, marked when the power cap holds it below the lock: `1710 capped`."""
    clock = fmt(gpu.sm_clock_mhz)
    return f"{clock} capped" if gpu.power_capped else clock


def plan_cell(stats: PlanStats | None) -> str:
    """A GPU's plan switching in one cell: `24 comps, 96 changes (7 early), 2 late, 0 errors, 0.31/1.20 ms`.

    Early: raised before the running computation's expected end. The latencies are event -> clock applied,
    p50/p99; skipped and unplanned counts are in `--json`.
    """
    if stats is None:
        return PLACEHOLDER
    latency_ms = f"{fmt(stats.event_to_clock_p50_ms, 2)}/{fmt(stats.event_to_clock_p99_ms, 2)} ms"
    return (
        f"{stats.computations} comps, {stats.clock_changes} changes ({stats.early_raises} early), "
        f"{stats.late} late, "
        f"{stats.errors} errors, {latency_ms}"
    )


def _row(gpu: GpuStatus, with_plan: bool) -> list[str]:
    ids = [fmt(gpu.index), gpu.uuid, gpu.pci_bus_id or PLACEHOLDER, gpu.name]
    if gpu.error and gpu.sm_clock_mhz is None:
        return [*ids, f"ERROR: {gpu.error}"]
    row = [
        *ids,
        _sm_clock(gpu),
        fmt(gpu.locked_clock_mhz),
        fmt(gpu.power_w, 1),
        fmt(gpu.power_limit_w, 0),
        fmt(gpu.energy_j, 1),
        *([plan_cell(gpu.plan)] if with_plan else []),
        _lease(gpu),
    ]
    if gpu.error:
        row.append(f"ERROR: {gpu.error}")
    return row


def _call_times(reply: StatusReply) -> str:
    worst_ms: dict[str, float] = {}
    for gpu in reply.gpus:
        for op, ms in gpu.call_ms.items():
            worst_ms[op] = max(worst_ms.get(op, 0.0), ms)
    return ", ".join(f"{op} {ms:.3f}" for op, ms in sorted(worst_ms.items())) or PLACEHOLDER


BACKENDS = {"nvml": "real GPUs (NVML)", "sim": "SIMULATED GPUs", "mixed": "real and SIMULATED GPUs"}
"""How the header names the daemon's backend: simulated figures are never a real GPU's."""


def render_table(reply: StatusReply) -> str:
    """Human-readable status: a daemon health header, one row per GPU (error rows included), the jobs.

    The PLAN column appears only when a GPU runs a plan, the jobs section only when there are jobs.
    """
    daemon = reply.daemon
    lines = [
        f"perseusd {daemon.version} (protocol {daemon.protocol}.{daemon.protocol_minor}), pid {daemon.pid}, "
        f"up {fmt_duration(daemon.uptime_s)}, {daemon.clients} client(s)"
        + (f", {BACKENDS.get(daemon.backend, daemon.backend)}" if daemon.backend else ""),
        f"events: {daemon.events_received} received, {daemon.events_dropped} dropped, "
        f"{daemon.events_lost} lost; "
        f"restores: {daemon.restores} ({daemon.restore_failures} failed); "
        f"refused connections: {daemon.auth_rejected}",
        f"GPU call mean ms (worst GPU): {_call_times(reply)}",
    ]
    if daemon.persistence_error:
        lines.append(f"PERSISTENCE FAILING: {daemon.persistence_error}")
    if daemon.monitor_only:
        lines.append("monitor-only: reads energy and status, never writes a clock or a limit")
    for gpu in reply.gpus:  # a driver feature that can fight the daemon's clocks is never silent
        lines += [f"{gpu.uuid}: {text}" for text in gpu.power_features if ": active" in text]
    if reply.signal is not None:
        lines.append(signal_line(reply.signal))
    if reply.pool is not None:
        lines.append(pool_line(reply.pool))
    users = users_line(reply)
    if users is not None:
        lines.append(users)
    lines.append("")
    with_plan = any(gpu.plan is not None for gpu in reply.gpus)
    header = ["GPU", "UUID", "PCI BUS ID", "NAME", "SM MHZ", "LOCKED", "POWER W", "LIMIT W", "ENERGY J"]
    header += ["PLAN", "LEASE"] if with_plan else ["LEASE"]
    lines += format_table([header, *(_row(gpu, with_plan) for gpu in reply.gpus)])
    if reply.jobs:
        from perseusd.ctl.jobs_cmd import render_jobs_brief  # only with jobs: most nodes have none

        lines += ["", render_jobs_brief(reply.jobs)]
    return "\n".join(lines)


def _render(runtime_dir: StrPath, as_json: bool) -> str:
    reply = fetch_status(runtime_dir)
    return json.dumps(status_json(reply), indent=2) if as_json else render_table(reply)


def run(args: argparse.Namespace) -> int:
    """Print the status once, or every `--watch` seconds."""
    runtime_dir: str = args.runtime_dir
    if args.watch is None:
        print(_render(runtime_dir, args.json))
        return EXIT_OK
    return watch(lambda: _render(runtime_dir, args.json), args.watch, clear=not args.json)
