"""Node power caps measured end to end: a real daemon on simulated H100s and `perseus-emulate`; prints JSON.

The GPT 4-stage x 8-microbatch job (the shipped H100 profile, `h100_sxm` board, power capping and 13-38 ms
power-limit latency modelled) on one daemon with 4 GPUs. Measured in the same invocation:

- `all_max`: the emulator's baseline (every computation at its top clock, default power limits);
- per budget (a fraction of all-max's worst measured 1 s window):
  - `uniform`: every GPU's power limit at budget / 4 (`admin_set_power_limit`), the job at all-max clocks;
  - `perseusd`: the job under the daemon (profile imported, so no profiling), `perseusctl cap set --node`
    sent the moment the job runs its plan; measured over the emulator's optimized window (after 8 settling
    iterations).

Node power comes from the GPUs' energy counters (read through the daemon every 50 ms); each run's worst
1 s window is taken from 2 s after the cap (or the limits) was set. The one-clock scheme is in
`bench_power_cap.py` (the board-model replay), as is the A100 case (the shipped A100 board does not model
power capping, so a power limit would change nothing there).

Wall-clock timing: on a loaded machine the iteration times are noisy; compare schemes within one run.

`limits_sum_w`: the sum of the power limits the cap holds (from `cap status` just after the cap is set): the
most the node can draw at the limits' time scale; at most the budget only with `--enforcement strict`.

    python benchmarks/bench_power_cap_daemon.py [--budgets 0.7,0.9] [--iterations 10] [--enforcement strict]
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perseus_client.client import PerseusClient
from perseus_client.protocol import AdminReset, AdminResetOk, AdminSetPowerLimit, PowerLimitOk

from perseusd.ctl.daemon_link import ask
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess

STAGES, MICROBATCHES = 4, 8
SETTLE_S = 2.0
WINDOW_S = 1.0


class Sampler(threading.Thread):
    """The node's summed energy counters every 50 ms: (monotonic s, J)."""

    def __init__(self, runtime_dir: Path) -> None:
        super().__init__(daemon=True)
        self._runtime_dir = runtime_dir
        self.samples: list[tuple[float, float]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        with PerseusClient(self._runtime_dir, job="bench-sampler", timeout_s=5.0, strict=True) as client:
            while not self._halt.is_set():
                energies = [g.energy_j for g in client.status().gpus]
                if all(e is not None for e in energies):
                    self.samples.append((time.monotonic(), sum(e for e in energies if e is not None)))
                self._halt.wait(0.05)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)

    def worst_window_w(self, from_s: float) -> float | None:
        samples = [s for s in self.samples if s[0] >= from_s]
        worst = None
        for i, (t0, e0) in enumerate(samples):
            later = [s for s in samples[i:] if s[0] - t0 >= WINDOW_S]
            if not later:
                break
            t1, e1 = later[0]
            power_w = (e1 - e0) / (t1 - t0)
            worst = power_w if worst is None else max(worst, power_w)
        return worst


def emulate(runtime_dir: Path, job: str, args: argparse.Namespace, *extra: str) -> subprocess.Popen[str]:
    command = [
        sys.executable,
        "-m",
        "perseusd.emulate.main",
        "--profile",
        "h100_sxm",
        "--stages",
        str(STAGES),
        "--microbatches",
        str(MICROBATCHES),
        "--iterations",
        str(args.iterations),
        "--runtime-dir",
        str(runtime_dir),
        "--job",
        job,
        "--json",
        *extra,
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"perseus-emulate failed: {err.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(out)
    return result


def ctl(runtime_dir: Path, *args: str) -> str:
    command = [sys.executable, "-m", "perseusd.ctl.main", "--runtime-dir", str(runtime_dir), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False).stdout


def wait_running(runtime_dir: Path, job: str, proc: subprocess.Popen[str]) -> None:
    while proc.poll() is None:
        jobs = json.loads(ctl(runtime_dir, "jobs", "--json") or '{"jobs": []}')["jobs"]
        if any(j["job"] == job and j["state"] == "running" for j in jobs):
            return
        time.sleep(0.05)


def wait_released(runtime_dir: Path) -> None:
    """Until the last run's leases are gone: their release restores the GPUs' originals, which would undo a
    power limit set in between."""
    with PerseusClient(runtime_dir, job="bench-probe", timeout_s=5.0, strict=True) as client:
        while any(g.lease is not None and g.lease.job != "bench-probe" for g in client.status().gpus):
            time.sleep(0.05)


def phase(result: dict[str, Any], name: str) -> dict[str, float]:
    data = result[name]
    return {"time_s": data["iteration_time_s"], "energy_j": data["energy_per_iteration_j"]}


def measure(runtime_dir: Path, gpus: list[str], args: argparse.Namespace) -> dict[str, Any]:
    sampler = Sampler(runtime_dir)
    sampler.start()
    try:
        started_s = time.monotonic()
        base = finish(emulate(runtime_dir, "bench-allmax", args, "--baseline-only"))
        all_max = phase(base, "baseline") | {"worst_window_w": sampler.worst_window_w(started_s + SETTLE_S)}
        reference_w = all_max["worst_window_w"] or 0.0
        rows = []
        for fraction in args.budgets:
            budget_w = fraction * reference_w
            row: dict[str, Any] = {"budget_fraction": fraction, "budget_w": round(budget_w, 1)}
            wait_released(runtime_dir)
            for gpu in gpus:
                ask(
                    runtime_dir,
                    AdminSetPowerLimit(gpu=gpu, power_limit_w=budget_w / len(gpus)),
                    PowerLimitOk,
                    admin=True,
                )
            set_s = time.monotonic()
            result = finish(emulate(runtime_dir, f"bench-uniform-{fraction}", args, "--baseline-only"))
            row["uniform"] = phase(result, "baseline") | {
                "worst_window_w": sampler.worst_window_w(set_s + SETTLE_S)
            }
            wait_released(runtime_dir)
            ask(runtime_dir, AdminReset(gpus=()), AdminResetOk, admin=True)
            job = f"bench-cap-{fraction}"
            proc = emulate(
                runtime_dir,
                job,
                args,
                "--import-profile",
                "--settle-iterations",
                "8",
                "--baseline-iterations",
                "2",
            )
            wait_running(runtime_dir, job, proc)
            ctl(runtime_dir, "cap", "set", "--node", f"{budget_w:.1f}")
            set_s = time.monotonic()
            status = json.loads(ctl(runtime_dir, "cap", "status", "--json"))
            result = finish(proc)
            limits_sum_w = sum(g["limit_w"] or 0.0 for g in status["gpus"])
            row["perseusd"] = phase(result, "optimized") | {
                "worst_window_w": sampler.worst_window_w(set_s + SETTLE_S),
                "points": [(j["point"], round(j["slowdown"], 4)) for j in status["jobs"]],
                "limits_sum_w": round(limits_sum_w, 1),
                "limits_sum_within_budget": limits_sum_w <= budget_w + 0.5,
                "strict": status["strict"],
            }
            wait_released(runtime_dir)
            ctl(runtime_dir, "cap", "clear")
            for scheme in ("uniform", "perseusd"):
                got = row[scheme]
                got["slowdown"] = round(got["time_s"] / all_max["time_s"] - 1, 4)
                got["energy_change"] = round(got["energy_j"] / all_max["energy_j"] - 1, 4)
                got["within_budget_plus_1pct"] = (got["worst_window_w"] or 0.0) <= budget_w * 1.01
            rows.append(row)
        return {"all_max": all_max, "budgets": rows}
    finally:
        sampler.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--budgets", default="0.7,0.9", help="fractions of all-max's worst window")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument(
        "--enforcement",
        default="window",
        choices=("window", "strict"),
        help="the daemon's power_cap_enforcement",
    )
    args = parser.parse_args()
    args.budgets = [float(b) for b in args.budgets.split(",")]
    dirs = DaemonDirs.create()
    env = {"PERSEUSD_POWER_CAP_ENFORCEMENT": args.enforcement}
    daemon = DaemonProcess(dirs, gpus=STAGES, extra_args=("--sim-model", "h100_sxm"), env=env)
    daemon.start()
    started_s = time.monotonic()
    try:
        with PerseusClient(dirs.runtime_dir, job="bench-probe", strict=True) as client:
            assert client.daemon_info is not None
            gpus = [g.uuid for g in client.daemon_info.gpus]
        result = measure(dirs.runtime_dir, gpus, args)
    finally:
        daemon.signal(signal.SIGTERM)
        daemon.wait()
    doc = {
        "benchmark": "power_cap_daemon",
        "case": "h100x8",
        "enforcement": args.enforcement,
        "wall_s": round(time.monotonic() - started_s, 1),
    }
    print(json.dumps(doc | result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
