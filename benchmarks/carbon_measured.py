"""bench_carbon's measured mode: the real daemon on simulated GPUs, the emulated job, a compressed trace.

Every arm is one run of `perseus-emulate` against a fresh `perseusd --backend sim --sim-model BOARD` whose
grid signal is the Electricity Maps source pointed at a loopback HTTP server run here (`SignalServer`): the
server replays a segment of the trace, one interval every `interval_s` wall seconds (a few all-max
iterations), handing out, during interval i, the history up to interval i - 1 (the daemon forecasts i, as
the model mode does), or up to i itself for a perfect forecast (`*_perfect`, forecaster `persistence`).
The same clock drives the accounting: the work is a fixed number of iterations counted from the first
measured iteration (the interval clock starts there), and each iteration's energy (the emulator's
per-iteration counter readings) is multiplied by the actual intensity of the interval its midpoint falls in.

Arms (all at the same work):
- `all_max`: the emulator's baseline (every computation at its top clock, default power limits);
- `chase`: the baseline under one power limit per interval, set on every GPU through the daemon
  (`AdminSetPowerLimit`) at each interval's start, the limit of the model's sweep (bench_carbon's
  `power_limit_choices`) of least Chase cost for the forecast; the simulated board caps every computation
  whose power at its clock exceeds the limit (`perseusd/workload/sim_costs.py`; both boards model capping);
- `perseus_fastest`: the job under the daemon, profile imported, policy `fastest`;
- `carbon_policy`: policy `carbon`, allowed slowdown: the model's slowdown of Chase's method on the
  segment (known before the run), the daemon re-choosing every `interval_s / 8`;
- `all_max_repeat`: all-max again, at the other end of each round: the run's noise floor
  (benchmarks/carbon_stats.py).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from perseus_client.client import PerseusClient, PerseusClientError
from perseus_client.protocol import AdminSetPowerLimit, PowerLimitOk

from benchmarks.processes import terminate
from perseusd.carbon.traces import SignalPoint
from perseusd.ctl.daemon_link import ask
from tests.support.fake_emaps import JsonHandler, LoopbackHttp
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess

J_PER_KWH = 3.6e6
HISTORY_POINTS = 48
"""Intervals of history the server hands out (a day of the Chase trace: what the forecaster trains on)."""
ROW = re.compile(r"^\s*(\d+)\s+(\S+)\s+(-?[\d.]+)\s+(-?[\d.]+)\s*$")
RECHOOSE_PER_INTERVAL = 8
SETTLE_ROWS = 2
"""Iterations skipped after the job first runs its plan (the policy is set and the first switch lands)."""


class SignalServer:
    """Electricity Maps v3 (`carbon-intensity/history` and `/latest`) on loopback, replaying `trace` from
    interval `start`, one interval per `interval_s` from `begin()` (interval `start` before it)."""

    def __init__(self, trace: Sequence[SignalPoint], start: int, interval_s: float, perfect: bool) -> None:
        self._trace, self._start, self.interval_s, self._perfect = list(trace), start, interval_s, perfect
        self._t0_s: float | None = None
        server = self

        class Handler(JsonHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server calls it by this name)
                self.reply_json(200, server.document(self.path))

        self._http = LoopbackHttp(Handler)

    @property
    def url(self) -> str:
        return self._http.api_url

    def begin(self, t0_s: float) -> None:
        self._t0_s = t0_s

    def index_at(self, t_s: float) -> int:
        """The trace interval at monotonic time `t_s`."""
        if self._t0_s is None or t_s < self._t0_s:
            return self._start
        return self._start + int((t_s - self._t0_s) // self.interval_s)

    def value(self, index: int) -> float:
        return self._trace[index % len(self._trace)].value

    def document(self, path: str) -> dict[str, Any]:
        index = self.index_at(time.monotonic())
        last = index if self._perfect else index - 1  # what is known during interval `index`
        entries = [
            {
                "carbonIntensity": self.value(i),
                "datetime": datetime.fromtimestamp(self._trace[0].at_s + 1800.0 * i, UTC).isoformat(),
            }
            for i in range(max(0, last - HISTORY_POINTS + 1), last + 1)
        ]
        return entries[-1] if "/latest" in path else {"zone": "BENCH", "history": entries}

    def close(self) -> None:
        self._http.close()


@dataclass(frozen=True)
class Arm:
    name: str
    policy: str | None = None
    """None: the emulator's baseline (all-max clocks), measured without registering."""
    target: float = 0.0
    eta: float = 0.24
    limits_w: Sequence[float] = ()
    """Per trace interval (indexed from 0): the power limit to set on every GPU (empty: none)."""
    perfect: bool = False


@dataclass(frozen=True)
class Workload:
    board: str
    stages: int
    microbatches: int
    time_scale: float
    reference_intensity: float
    interval_s: float
    start: int
    iterations: int
    """The work: iterations from the first measured one."""


@dataclass
class Rows:
    """The emulator's per-iteration rows as they arrive: (arrival monotonic s, phase, time s, energy J)."""

    rows: list[tuple[float, str, float, float]] = field(default_factory=list)
    first_row: threading.Event = field(default_factory=threading.Event)
    tail: list[str] = field(default_factory=list)


def run_arm(arm: Arm, work: Workload, trace: Sequence[SignalPoint], forecaster: str) -> dict[str, Any]:
    server = SignalServer(trace, work.start, work.interval_s, arm.perfect)
    dirs = DaemonDirs.create()
    token = Path(tempfile.mkdtemp()) / "token"
    token.write_text("bench\n")
    token.chmod(0o600)
    env = {
        "PERSEUSD_SIM_UPDATE_PERIOD_S": str(0.1 * work.time_scale),
        "PERSEUSD_SIGNAL_SOURCE": "electricitymaps",
        "PERSEUSD_SIGNAL_ZONE": "BENCH",
        "PERSEUSD_SIGNAL_TOKEN_FILE": str(token),
        "PERSEUSD_SIGNAL_API_URL": server.url,
        "PERSEUSD_SIGNAL_POLL_S": str(max(0.05, work.interval_s / 20)),
        "PERSEUSD_CARBON_FORECASTER": "persistence" if arm.perfect else forecaster,
        "PERSEUSD_CARBON_INTERVAL_S": str(work.interval_s / RECHOOSE_PER_INTERVAL),
        "PERSEUSD_CARBON_ETA": str(arm.eta),
        "PERSEUSD_CARBON_REFERENCE_INTENSITY": str(work.reference_intensity),
    }
    daemon = DaemonProcess(dirs, gpus=work.stages, extra_args=("--sim-model", work.board), env=env)
    daemon.start(wait=False)
    try:
        _wait_ready(daemon)
        return _measure(arm, work, server, daemon)
    finally:
        _stop(daemon)
        server.close()
        token.unlink()
        token.parent.rmdir()


def _wait_ready(daemon: DaemonProcess, tries: int = 6) -> None:
    """Ready within `tries` x 15 s (a loaded machine starts a daemon slowly)."""
    for attempt in range(tries):
        try:
            daemon.wait_ready()
            return
        except AssertionError:
            assert daemon.proc is not None
            if daemon.proc.poll() is not None or attempt == tries - 1:
                raise


def _stop(daemon: DaemonProcess) -> None:
    assert daemon.proc is not None
    if daemon.proc.poll() is None:
        daemon.signal(signal.SIGTERM)
        try:
            daemon.wait(timeout_s=60.0)
        except subprocess.TimeoutExpired:
            daemon.kill()


def _emulate(arm: Arm, work: Workload, runtime_dir: Path) -> list[str]:
    total = str(work.iterations + SETTLE_ROWS + 8)
    command = [
        sys.executable,
        "-m",
        "perseusd.emulate.main",
        *("--profile", work.board, "--stages", str(work.stages), "--microbatches", str(work.microbatches)),
        *("--time-scale", str(work.time_scale), "--runtime-dir", str(runtime_dir), "--job", "bench"),
        *("--timeout-s", "3000", "--json"),
    ]
    if arm.policy is None:
        return [*command, "--baseline-only", "--baseline-iterations", total]
    return [
        *command,
        *("--import-profile", "--baseline-iterations", "1", "--settle-iterations", "1"),
        *("--iterations", total, "--policy", arm.policy, "--target", f"{arm.target:.6f}"),
    ]


def _read_rows(stream: Any, rows: Rows) -> None:
    for line in stream:
        rows.tail = [*rows.tail[-20:], line.rstrip()]
        match = ROW.match(line)
        if match:
            rows.rows.append((time.monotonic(), match[2], float(match[3]), float(match[4])))
            rows.first_row.set()


def _measure(arm: Arm, work: Workload, server: SignalServer, daemon: DaemonProcess) -> dict[str, Any]:
    runtime_dir = daemon.dirs.runtime_dir
    with PerseusClient(runtime_dir, job="bench-probe", timeout_s=5.0, strict=True) as probe:
        gpus = [g.uuid for g in probe.hello().gpus]
    proc = subprocess.Popen(
        _emulate(arm, work, runtime_dir),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    rows = Rows()
    assert proc.stderr is not None
    reader = threading.Thread(target=_read_rows, args=(proc.stderr, rows), daemon=True)
    reader.start()
    measured_phase = "baseline" if arm.policy is None else "running"
    started: float | None = None
    applied: int | None = None
    points: list[int] = []
    looked_s = 0.0
    deadline_s = time.monotonic() + 3000
    watcher = PerseusClient(runtime_dir, job="bench-watch", timeout_s=5.0, strict=True)
    switching: dict[str, Any] = {}
    try:
        while proc.poll() is None and time.monotonic() < deadline_s:
            if arm.policy is not None and started is not None and time.monotonic() - looked_s > 0.25:
                looked_s = time.monotonic()
                points.extend(_plan_index(watcher))
            phased = [r for r in rows.rows if r[1] == measured_phase]
            if started is None and len(phased) > (SETTLE_ROWS if arm.policy else 1):
                started = phased[SETTLE_ROWS if arm.policy else 1][0]
                server.begin(started)
            if arm.limits_w and rows.first_row.is_set():
                index = server.index_at(time.monotonic())
                if index != applied:
                    _set_limits(runtime_dir, gpus, arm.limits_w[index % len(arm.limits_w)])
                    applied = index
            if started is not None and len([r for r in rows.rows if r[0] > started]) >= work.iterations:
                switching = _switching(watcher) if arm.policy is not None else {}
                break
            time.sleep(0.01)
    finally:
        watcher.close()
        terminate(proc, grace_s=120)
        reader.join(timeout=10)
    measured = [r for r in rows.rows if started is not None and r[0] > started][: work.iterations]
    if len(measured) < work.iterations:
        raise RuntimeError(f"{arm.name}: the emulated job stopped early: {' | '.join(rows.tail[-6:])}")
    result = _account(measured, server)
    if arm.policy is not None:
        result["points_seen"] = sorted(set(points))
        result["point_changes"] = sum(1 for a, b in itertools.pairwise(points) if a != b)
        result["switching"] = switching
    return result


def _switching(client: PerseusClient) -> dict[str, Any]:
    """The daemon's per-computation switching over the job's GPUs so far (`perseusctl jobs`' statistics):
    late clock changes say the plan's clocks did not land in time (a daemon short of CPU)."""
    try:
        stats = [g.plan for g in client.status().gpus if g.plan is not None]
    except PerseusClientError:
        return {}
    totals = {
        key: sum(getattr(s, key) for s in stats)
        for key in ("computations", "clock_changes", "late", "skipped", "unplanned", "errors")
    }
    p99 = [s.event_to_clock_p99_ms for s in stats if s.event_to_clock_p99_ms is not None]
    return {**totals, "event_to_clock_p99_ms_max": max(p99, default=None)}


def _plan_index(client: PerseusClient) -> list[int]:
    """The job's point now (none when the daemon does not say)."""
    try:
        jobs = client.jobs().jobs
    except PerseusClientError:
        return []
    return [j.plan_index for j in jobs if j.job == "bench" and j.plan_index is not None]


def _set_limits(runtime_dir: Path, gpus: Sequence[str], limit_w: float) -> None:
    for gpu in gpus:
        ask(runtime_dir, AdminSetPowerLimit(gpu=gpu, power_limit_w=limit_w), PowerLimitOk, admin=True)


def _account(measured: list[tuple[float, str, float, float]], server: SignalServer) -> dict[str, Any]:
    carbon_g = energy_j = time_s = 0.0
    seen: set[int] = set()
    for arrived_s, _phase, iteration_s, iteration_j in measured:
        index = server.index_at(arrived_s - iteration_s / 2)
        seen.add(index)
        carbon_g += iteration_j / J_PER_KWH * server.value(index)
        energy_j += iteration_j
        time_s += iteration_s
    return {
        "carbon_g": carbon_g,
        "time_s": time_s,
        "energy_j": energy_j,
        "intervals": len(seen),
        "iterations": len(measured),
        "iteration_s": [r[2] for r in measured],
        "iteration_j": [r[3] for r in measured],
    }


def measured_arms(
    arms: Sequence[Arm],
    work: Workload,
    trace: Sequence[SignalPoint],
    forecaster: str,
    progress: Callable[[str], None],
    rounds: int = 1,
) -> dict[str, list[dict[str, Any]]]:
    """Each arm measured once per round (a fresh daemon each), the arms interleaved: round r runs them in
    the given order when r is even and in reverse when it is odd (A B C, C B A, A B C, ...), so that a drift
    of the machine's load within the run weighs on every arm alike."""
    results: dict[str, list[dict[str, Any]]] = {arm.name: [] for arm in arms}
    for number in range(rounds):
        for arm in arms if number % 2 == 0 else list(reversed(arms)):
            began_s = time.monotonic()
            result = run_arm(arm, work, trace, forecaster)
            result["wall_s"] = round(time.monotonic() - began_s, 1)
            result["round"] = number
            result["load_1min"] = round(os.getloadavg()[0], 2)
            results[arm.name].append(result)
            shown = {k: v for k, v in result.items() if k not in ("iteration_s", "iteration_j")}
            progress(f"{arm.name}: {json.dumps(shown)}")
    return results


def intervals_for(iterations: int, per_interval: int) -> int:
    return math.ceil(iterations / per_interval)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--measured-intervals", type=int, default=24, help="trace intervals of work (measured)"
    )
    parser.add_argument(
        "--measured-start", type=int, default=-1, help="first interval (-1: the widest swing)"
    )
    parser.add_argument("--time-scale-a100", type=float, default=0.25)
    parser.add_argument("--switch-eta", type=float, default=0.75, help="the measured switching case's eta")
    parser.add_argument(
        "--rounds", type=int, default=3, help="measured: rounds of the interleaved arms (>= 1)"
    )
    parser.add_argument(
        "--raw-json", type=Path, default=None, help="measured: also write every run's per-iteration rows here"
    )
