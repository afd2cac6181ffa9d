"""Event flood: N client processes (16) send computation events flat out for D seconds (30), each on its own
leased sim GPU, then release and close. Prints JSON:

- accounting: every event attempted is received by the daemon, dropped by the client (queue full) or lost at
  close (counted through the daemon's own count); `accounted` says whether the sums match exactly;
  `lost_by_daemon_count`: the events the daemon counts lost from the clients' end markers (protocol 6.9;
  None for an older daemon), equal to the clients' `lost_at_close` when both sides close exactly;
  `sessions_reconciled_and_agreeing`: the daemon's per-session lines (6.9) and how many match their client
  (same events sent and lost, read + lost = sent);
- rss_mb: the daemon's resident memory idle, at its peak during the flood, and after;
- status_ms: `status` round trips of a connected client (what `perseusctl status` waits for once connected)
  idle (the same-run baseline) and during the flood, p50/p99; `perseusctl_ms`: whole `perseusctl status`
  runs (interpreter start-up included) idle and during the flood;
- released_lease: how long events of a released lease still cost the daemon work. From the moment the
  daemon has handled a release, it drops that process's events unread (no decoding) once it holds no lease;
  `release_to_unread_s` is, per client, from its release call to the daemon's reply (after which every event
  of the lease is dropped unread), and `dropped_unread` checks it: the daemon's NOT_LEASED count (nothing
  else sends such events here) lies within `events_read_after_release_bounds`, the events it read from the
  clients after their release (bounded by counts asked just before and just after each release).
  `release_to_all_read_s`: until the daemon has read its last event (the close waits for it): reading the
  backlog, fair-queued with the other senders, at the unread cost;
- drain_s: from the last client's close until the daemon's event count stops moving, and the daemon's CPU
  seconds in the 2 s after that.

    python benchmarks/bench_flood.py [--clients 16] [--duration-s 30] [--rate-hz 2000] [--daemon-nice -10]

The flood senders compete with the daemon for CPU: on a small machine the daemon's share, not its code,
bounds what it reads (`daemon_cpu_s`, `events_per_daemon_cpu_s` tell them apart).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perseus_client import PerseusClient

from benchmarks.processes import process_cpu_s, rss_mb
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes

STATUS_PERIOD_S = 0.1


def _sender(runtime_dir: str, index: int, duration_s: float, rate_hz: float, go: Any, out: Any) -> None:
    client = PerseusClient(runtime_dir, job=f"flood-{index}", timeout_s=10, strict=True)
    gpu = client.daemon_info.gpus[index].uuid  # type: ignore[union-attr]
    client.claim([gpu])
    go.wait()
    started_s = time.monotonic()
    deadline_s = started_s + duration_s
    microbatch = 0
    while (now_s := time.monotonic()) < deadline_s:
        if rate_hz > 0 and 2 * microbatch >= (now_s - started_s) * rate_hz:
            time.sleep(0.001)  # paced: `rate_hz` events per second (a begin and an end per microbatch)
            continue
        for _ in range(100 if rate_hz <= 0 else 1):
            client.computation_begin(gpu, 0, "forward", microbatch)
            client.computation_end(gpu, 0, "forward", microbatch)
            microbatch += 1
    read_before = client.event_count().received
    release_s = time.monotonic()
    client.release()
    released_s = time.monotonic()
    read_after = client.event_count().received
    # The daemon handled the release between these two counts: from then on it read this client's events
    # unread (NOT_LEASED). So read - read_after <= events dropped unread <= read - read_before.
    sent = client.events_sent
    client.close()  # returns once the daemon has read every event sent (or counts them lost)
    closed_s = time.monotonic()
    read = sent - client.events_lost
    out.put(
        (
            client.events_sent,
            client.events_dropped,
            client.events_lost,
            closed_s,
            closed_s - release_s,
            released_s - release_s,
            (read - read_after, read - read_before),
            index,
        )
    )


SESSION_LINE = re.compile(
    r"events of process \d+ \(job 'flood-(\d+)'\): sent (\d+), read (\d+) .*?lost in transit (\d+)"
)


def _sessions_agreeing(log: str, results: list[Any]) -> tuple[int, int]:
    """The daemon's per-session lines (protocol 6.9) and how many agree with their client: same events sent,
    same lost, read + lost = sent."""
    by_index = {r[7]: r for r in results}
    lines = SESSION_LINE.findall(log)
    agreeing = 0
    for index, sent, read, lost in lines:
        client = by_index.get(int(index))
        sent_n, read_n, lost_n = int(sent), int(read), int(lost)
        if client is not None and client[0] == sent_n and client[2] == lost_n == sent_n - read_n:
            agreeing += 1
    return len(lines), agreeing


def _pct(values: list[float], q: float, digits: int = 2) -> float | None:
    if not values:
        return None
    return round(sorted(values)[min(len(values) - 1, int(q * len(values)))], digits)


class Watcher(threading.Thread):
    """Samples the daemon's RSS and times status round trips until stopped."""

    def __init__(self, daemon: DaemonProcess) -> None:
        super().__init__(daemon=True)
        assert daemon.proc is not None
        self.pid = daemon.proc.pid
        self.runtime_dir = daemon.dirs.runtime_dir
        self.status_ms: list[float] = []
        self.rss_mb: list[float] = []
        self.failures = 0
        self.stop = threading.Event()

    def run(self) -> None:
        with PerseusClient(self.runtime_dir, job="watcher", timeout_s=30, strict=True) as client:
            while not self.stop.is_set():
                self.rss_mb.append(rss_mb(self.pid))
                started_s = time.perf_counter()
                try:
                    client.status()
                    self.status_ms.append((time.perf_counter() - started_s) * 1e3)
                except Exception:
                    self.failures += 1
                self.stop.wait(STATUS_PERIOD_S)


def _watch(daemon: DaemonProcess, seconds: float) -> Watcher:
    watcher = Watcher(daemon)
    watcher.start()
    time.sleep(seconds)
    watcher.stop.set()
    watcher.join()
    return watcher


def _perseusctl_ms(runtime_dir: Path, runs: int) -> list[float | None]:
    """Whole `perseusctl status` runs (None: it failed, e.g. its timeout against a starved daemon)."""
    times: list[float | None] = []
    for _ in range(runs):
        started_s = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "perseusd.ctl.main", "--runtime-dir", str(runtime_dir), "status"],
            capture_output=True,
            check=False,
            timeout=60,
        )
        times.append((time.perf_counter() - started_s) * 1e3 if done.returncode == 0 else None)
    return times


def _received(daemon: DaemonProcess) -> int:
    with PerseusClient(daemon.dirs.runtime_dir, job="count", timeout_s=30, strict=True) as client:
        return client.status().daemon.events_received


def _drain_s(daemon: DaemonProcess, closed_s: float, quiet_s: float = 0.5) -> float:
    """Seconds from `closed_s` to the last change of the daemon's event count (seen `quiet_s` unchanged)."""
    last, last_change_s = _received(daemon), closed_s
    while time.monotonic() - last_change_s < quiet_s:
        time.sleep(0.05)
        now = _received(daemon)
        if now != last:
            last, last_change_s = now, time.monotonic()
    return max(0.0, last_change_s - closed_s)


def _renice(pid: int, nice: int) -> None:
    """Give every thread of `pid` the niceness `nice` (what the unit's CPU weight does under systemd)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.setpriority(os.PRIO_PROCESS, int(task.name), nice)


def run(clients: int, duration_s: float, daemon_nice: int = 0, rate_hz: float = 0.0) -> dict[str, Any]:
    with daemon_processes() as make:
        daemon = make(DaemonDirs.create(), gpus=clients).start()
        assert daemon.proc is not None
        pid = daemon.proc.pid
        if daemon_nice:
            _renice(pid, daemon_nice)
        idle = _watch(daemon, 2.0)
        ctl_idle = _perseusctl_ms(daemon.dirs.runtime_dir, 3)
        received_before = _received(daemon)
        lost_before = daemon.status()["daemon"].get("events_lost")
        not_leased_before = daemon.status()["daemon"]["errors_by_code"].get("NOT_LEASED", 0)
        ctx = multiprocessing.get_context("spawn")
        go, out = ctx.Event(), ctx.Queue()
        runtime_dir = str(daemon.dirs.runtime_dir)
        sender_args = [(runtime_dir, i, duration_s, rate_hz, go, out) for i in range(clients)]
        procs = [ctx.Process(target=_sender, args=args) for args in sender_args]
        for proc in procs:
            proc.start()
        time.sleep(1.0)
        cpu_start_s = process_cpu_s(pid)
        go.set()
        started_s = time.monotonic()
        flood = Watcher(daemon)
        flood.start()
        time.sleep(max(0.5, duration_s / 2))
        ctl_flood = _perseusctl_ms(daemon.dirs.runtime_dir, 3)
        results = [out.get(timeout=duration_s + 120) for _ in procs]
        flood.stop.set()
        flood.join()
        for proc in procs:
            proc.join(timeout=30)
        closed_s = max(r[3] for r in results)
        drain_s = _drain_s(daemon, closed_s)
        flood_cpu_s = process_cpu_s(pid) - cpu_start_s
        cpu_before_s = process_cpu_s(pid)
        after = _watch(daemon, 2.0)
        cpu_idle_s = process_cpu_s(pid) - cpu_before_s
        health = daemon.status()["daemon"]
        received = health["events_received"] - received_before
        sent = sum(r[0] for r in results)
        dropped = sum(r[1] for r in results)
        lost = sum(r[2] for r in results)
        after_release = [sum(r[6][0] for r in results), sum(r[6][1] for r in results)]
        unread = health["errors_by_code"].get("NOT_LEASED", 0) - not_leased_before
        return {
            "clients": clients,
            "duration_s": duration_s,
            "rate_hz": rate_hz,
            "daemon_nice": daemon_nice,
            "cpus": os.cpu_count(),
            "load_average_1min": round(os.getloadavg()[0], 1),
            "flood_wall_s": round(closed_s - started_s, 2),
            "accounting": {
                "attempted": sent + dropped,
                "received_by_daemon": received,
                "dropped_by_clients": dropped,
                "lost_at_close": lost,
                "rejected_by_daemon": health["events_dropped"],
                "lost_by_daemon_count": (
                    None if lost_before is None else health["events_lost"] - lost_before
                ),
                "accounted": received + dropped + lost == sent + dropped and received == sent - lost,
                "sessions_reconciled_and_agreeing": _sessions_agreeing(daemon.log(), results),
            },
            "events_per_s": round(received / max(1e-9, closed_s - started_s)),
            "daemon_cpu_s": round(flood_cpu_s, 2),
            "events_per_daemon_cpu_s": round(received / max(1e-9, flood_cpu_s)),
            "rss_mb": {
                "idle": round(max(idle.rss_mb), 1),
                "peak": round(max(flood.rss_mb + after.rss_mb), 1),
                "after": round(after.rss_mb[-1], 1),
            },
            "status_ms": {
                "idle_p50": _pct(idle.status_ms, 0.5),
                "idle_p99": _pct(idle.status_ms, 0.99),
                "flood_p50": _pct(flood.status_ms, 0.5),
                "flood_p99": _pct(flood.status_ms, 0.99),
                "flood_max": _pct(flood.status_ms, 1.0),
                "flood_samples": len(flood.status_ms),
                "flood_failures": flood.failures,
            },
            "perseusctl_ms": {
                "idle": [None if t is None else round(t) for t in ctl_idle],
                "flood": [None if t is None else round(t) for t in ctl_flood],
            },
            "released_lease": {
                "release_to_unread_s": {
                    "p50": _pct([r[5] for r in results], 0.5, 3),
                    "max": _pct([r[5] for r in results], 1.0, 3),
                },
                "events_read_after_release_bounds": after_release,
                "dropped_unread": unread,
                "all_after_release_unread": after_release[0] <= unread <= after_release[1],
                "release_to_all_read_s": {
                    "p50": _pct([r[4] for r in results], 0.5),
                    "max": _pct([r[4] for r in results], 1.0),
                },
            },
            "drain_s": round(drain_s, 3),
            "cpu_s_in_2s_after_drain": round(cpu_idle_s, 3),
            "daemon_alive": daemon.proc.poll() is None,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument(
        "--daemon-nice",
        type=int,
        default=0,
        help="renice the daemon (needs root below 0), like a unit's CPU weight",
    )
    parser.add_argument(
        "--rate-hz", type=float, default=0.0, help="events per second per client (0: flat out)"
    )
    args = parser.parse_args()
    print(json.dumps(run(args.clients, args.duration_s, args.daemon_nice, args.rate_hz), indent=2))


if __name__ == "__main__":
    main()
