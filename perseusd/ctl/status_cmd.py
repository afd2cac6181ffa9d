"""`perseusctl status [--json] [--watch SEC]`: GPUs, leases and daemon health from a running perseusd."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from perseus_client.protocol import GpuStatus, StatusReply, StatusRequest

from perseusd.ctl.daemon_link import admin_socket_usable, ask

PLACEHOLDER = "-"
EXIT_OK = 0
EXIT_FAILED = 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("status", help="show GPUs, leases and daemon health")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--watch", type=float, metavar="SEC", help="refresh every SEC seconds until Ctrl-C")
    parser.set_defaults(func=run)


def fetch_status(runtime_dir: Path) -> StatusReply:
    """Ask the daemon; admins (who can open the admin socket) get the full view."""
    return ask(runtime_dir, StatusRequest(), StatusReply, admin=admin_socket_usable(runtime_dir))


def status_json(reply: StatusReply) -> dict[str, Any]:
    """The documented JSON form: {"daemon": {...}, "gpus": [...]} (None -> null)."""
    return {
        "daemon": dataclasses.asdict(reply.daemon),
        "gpus": [dataclasses.asdict(gpu) for gpu in reply.gpus],
    }


def _value(value: float | int | None, digits: int = 0) -> str:
    if value is None:
        return PLACEHOLDER
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _lease(gpu: GpuStatus) -> str:
    if gpu.lease is None:
        return PLACEHOLDER
    job = f" {gpu.lease.job}" if gpu.lease.job else ""
    return f"pid {gpu.lease.pid} uid {gpu.lease.uid}{job}"


def _row(gpu: GpuStatus) -> list[str]:
    if gpu.error and gpu.sm_clock_mhz is None:
        return [gpu.uuid, gpu.name, f"ERROR: {gpu.error}"]
    row = [
        gpu.uuid,
        gpu.name,
        _value(gpu.sm_clock_mhz),
        _value(gpu.locked_clock_mhz),
        _value(gpu.power_w, 1),
        _value(gpu.power_limit_w, 0),
        _value(gpu.energy_j, 1),
        _lease(gpu),
    ]
    if gpu.error:
        row.append(f"ERROR: {gpu.error}")
    return row


def _uptime(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s"


def _call_times(reply: StatusReply) -> str:
    worst_ms: dict[str, float] = {}
    for gpu in reply.gpus:
        for op, ms in gpu.call_ms.items():
            worst_ms[op] = max(worst_ms.get(op, 0.0), ms)
    return ", ".join(f"{op} {ms:.3f}" for op, ms in sorted(worst_ms.items())) or PLACEHOLDER


def render_table(reply: StatusReply) -> str:
    """Human-readable status: a daemon health header and one row per GPU (error rows included)."""
    daemon = reply.daemon
    lines = [
        f"perseusd {daemon.version} (protocol {daemon.protocol}), pid {daemon.pid}, "
        f"up {_uptime(daemon.uptime_s)}, {daemon.clients} client(s)",
        f"events: {daemon.events_received} received, {daemon.events_dropped} dropped; "
        f"restores: {daemon.restores} ({daemon.restore_failures} failed); "
        f"refused connections: {daemon.auth_rejected}",
        f"GPU call mean ms (worst GPU): {_call_times(reply)}",
        "",
    ]
    header = ["UUID", "NAME", "SM MHZ", "LOCKED", "POWER W", "LIMIT W", "ENERGY J", "LEASE"]
    rows = [header, *(_row(gpu) for gpu in reply.gpus)]
    widths = [max(len(row[i]) for row in rows if len(row) > i + 1) for i in range(len(header) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  ".join(cells + row[len(cells) :]).rstrip())
    return "\n".join(lines)


def _show(reply: StatusReply, as_json: bool) -> None:
    if as_json:
        print(json.dumps(status_json(reply), indent=2))
    else:
        print(render_table(reply))


def run(args: argparse.Namespace) -> int:
    runtime_dir = Path(args.runtime_dir)
    if args.watch is None:
        _show(fetch_status(runtime_dir), args.json)
        return EXIT_OK
    try:
        while True:
            reply = fetch_status(runtime_dir)
            if not args.json:
                sys.stdout.write("\x1b[H\x1b[2J")
            _show(reply, args.json)
            sys.stdout.flush()
            time.sleep(max(args.watch, 0.1))
    except KeyboardInterrupt:
        return EXIT_OK
