"""Solver speed and memory against lowtime 0.3.0 on the same input, measured in the same run.

Ours is timed as a user sees it: the whole `perseusctl solve ... --out DIR` command, from process start to
files written (imports, fit, iteration and output included), median of `--repeat` runs after one untimed
run, with its peak RSS.
The package's bytecode is compiled first, as `pip install` does (a checkout run with PYTHONDONTWRITEBYTECODE
would otherwise compile every module from source on every run).
lowtime is timed solving alone in a fresh process with its imports done before the clock starts (median of
`--lowtime-repeat` runs); both frontiers must be identical. Wall and CPU times are both reported: on a shared
machine the CPU-time ratio is the steadier one. Cases:

- A100 SXM GPT-3, 8 stages x 12 microbatches, the bundled profile (stages 0-6 identical);
- the same with every stage different: the bundled curves with time and power scaled per stage
  (`staged_profile`), so 16 distinct cost models are fitted, as on most real profiles;
- 8 x 96 (ours; lowtime takes about 24 minutes there, run it with --lowtime-96);
- A40 8 x 12 with a 0.1 ms unit time, about 11,800 points (ours; lowtime with --lowtime-a40, about 200 s);
- `perseusctl status` against a running daemon (sim backend, 8 GPUs);
- the daemon's planning step, profiling done -> frontier solved, followed under the clock-switch latency
  and descended, on this tree and on `--planning-baseline` (a git ref, default `main`, exported and built
  in a temporary folder; or a built tree) in the same run: the demo's A100 8 x 12 at 0.2 ms, the H100
  4 x 16, A100 8 x 96 at 1 ms, with the worker's peak RSS and whether each limit's pick is the same or
  no worse (`planning_step.py`).

    python benchmarks/bench_solver.py [--repeat N] [--lowtime-repeat N] [--only-8x12]
                                      [--lowtime-96] [--lowtime-a40] [--only-planning]
                                      [--planning-baseline REF|TREE|none] [--planning-baseline-repeat N]
                                      [--planning-case PROFILE:S:M:UNIT_S:LATENCY_S:P_BLOCK_W ...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import planning_step  # noqa: E402  (needs the repository root on sys.path)

PARAMS = {"a100_sxm": (0.001, 83.64), "a40": (0.0001, 70.38)}
STAGE_TIME_SCALE = (1.00, 1.07, 0.96, 1.03, 1.11, 0.93, 1.05, 1.15)
STAGE_POWER_SCALE = (1.00, 0.97, 1.04, 1.02, 0.95, 1.06, 0.99, 1.03)
TARGETS = {
    "speedup_x_8x12_min": 50,
    "whole_s_8x96_max": 3.0,
    "whole_s_a40_max": 2.0,
    "peak_rss_mb_8x96_max": 1024,
    "status_s_max": 0.15,
}


def staged_profile(gpu: str, path: Path) -> None:
    """Write the bundled profile with every stage different: time and power scaled per stage."""
    from perseusd.planner.bundled import bundled_profile
    from perseusd.planner.profile import Measurement, Profile
    from perseusd.planner.profile_csv import write_profile

    base = bundled_profile(gpu)
    rows = [
        Measurement(
            m.stage,
            m.instruction,
            m.freq_mhz,
            m.time_s * STAGE_TIME_SCALE[m.stage],
            m.energy_j * STAGE_TIME_SCALE[m.stage] * STAGE_POWER_SCALE[m.stage],
        )
        for m in base.measurements
    ]
    write_profile(Profile.from_measurements(rows, f"{gpu}-staged"), path)


def lowtime_worker(profile_arg: str, gpu: str, microbatches: int) -> dict[str, Any]:
    """Solve one case with lowtime in this process (imports excluded from the time)."""
    from perseusd.planner.bundled import BUNDLED_PROFILES, bundled_profile
    from perseusd.planner.dag import build_dag
    from perseusd.planner.profile_csv import read_profile

    unit_time_s, p_block_w = PARAMS[gpu]
    profile = bundled_profile(profile_arg) if profile_arg in BUNDLED_PROFILES else read_profile(profile_arg)
    dag = build_dag("1f1b", 8, microbatches)
    warnings.simplefilter("ignore")
    import lowtime.solver  # noqa: F401

    from benchmarks.peers.lowtime_peer import lowtime_frontier

    start, start_cpu = time.perf_counter(), time.process_time()
    points = [(p.time_s, p.energy_j) for p in lowtime_frontier(dag, profile, unit_time_s, p_block_w)]
    cpu_s = time.process_time() - start_cpu
    return {"solve_s": time.perf_counter() - start, "cpu_s": cpu_s, "points": points}


def whole_command(profile_arg: str, gpu: str, microbatches: int, repeat: int) -> dict[str, Any]:
    """Time `perseusctl solve` end to end `repeat` times; the frontier of the last run."""
    unit_time_s, p_block_w = PARAMS[gpu]
    walls, cpus, rss = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(tmp) / "out"
        command = [
            *(sys.executable, "-m", "perseusd.ctl.main", "solve", "--profile", profile_arg),
            *("--stages", "8", "--microbatches", str(microbatches), "--unit-time", str(unit_time_s)),
            *("--p2p-power", str(p_block_w), "--out", str(out_dir), "--json"),
        ]
        info: dict[str, Any] = {}
        # One untimed run first: the first command after others (or after compiling) pays for cold caches,
        # which made the first case measured look slower than an identical amount of work.
        subprocess.run(command, check=True, capture_output=True)
        for _ in range(repeat):
            with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
                start = time.perf_counter()
                proc = subprocess.Popen(command, stdout=out, stderr=err)
                # wait4 (not wait) gives this child's own peak RSS.
                _, status, usage = os.wait4(proc.pid, 0)
                walls.append(time.perf_counter() - start)
                proc.returncode = os.waitstatus_to_exitcode(status)
                out.seek(0)
                err.seek(0)
                if proc.returncode != 0:
                    raise RuntimeError(f"perseusctl solve failed: {err.read()}")
                info = json.load(out)
            rss.append(usage.ru_maxrss / 1024)
            cpus.append(usage.ru_utime + usage.ru_stime)
        rows = (out_dir / "frontier.csv").read_text().split()[1:]
    points = [(float(t), float(e)) for t, e in (row.split(",") for row in rows)]
    return {
        "whole_s_median": round(statistics.median(walls), 4),
        "whole_s_runs": [round(w, 4) for w in walls],
        "whole_cpu_s_median": round(statistics.median(cpus), 4),
        "solve_s_in_process": round(float(info["solve_s"]), 4),
        "points": len(points),
        "peak_rss_mb": round(max(rss), 1),
        "frontier": points,
    }


def lowtime(profile_arg: str, gpu: str, microbatches: int, repeat: int) -> dict[str, Any]:
    """lowtime's solve time (median of `repeat` fresh processes) and its frontier."""
    runs = []
    for _ in range(repeat):
        out = subprocess.run(
            [sys.executable, __file__, "--lowtime-worker", profile_arg, gpu, str(microbatches)],
            check=True,
            capture_output=True,
            text=True,
        )
        runs.append(json.loads(out.stdout))
    solve = [float(r["solve_s"]) for r in runs]
    return {
        "solve_s_median": round(statistics.median(solve), 4),
        "solve_cpu_s_median": round(statistics.median(float(r["cpu_s"]) for r in runs), 4),
        "solve_s_runs": [round(s, 4) for s in solve],
        "points": len(runs[-1]["points"]),
        "frontier": [tuple(p) for p in runs[-1]["points"]],
    }


def _digest(points: list[tuple[float, float]]) -> str:
    return hashlib.sha256(",".join(repr(t) for t, _ in points).encode()).hexdigest()[:16]


def case(
    name: str, profile_arg: str, gpu: str, microbatches: int, args: argparse.Namespace, with_lowtime: bool
) -> dict[str, Any]:
    ours = whole_command(profile_arg, gpu, microbatches, args.repeat)
    result: dict[str, Any] = {"case": name, "ours": ours}
    if with_lowtime:
        peer = lowtime(profile_arg, gpu, microbatches, args.lowtime_repeat)
        mine, theirs = ours["frontier"], peer["frontier"]
        result["lowtime"] = peer
        result["identical_times"] = [t for t, _ in mine] == [t for t, _ in theirs]
        result["max_energy_rel_diff"] = (
            max((abs(a - b) / abs(b) for (_, a), (_, b) in zip(mine, theirs, strict=True)), default=0.0)
            if len(mine) == len(theirs)
            else None
        )
        result["speedup_x"] = round(peer["solve_s_median"] / ours["whole_s_median"], 1)
        # CPU time is less sensitive to other work on a shared machine than wall time.
        result["speedup_x_cpu"] = round(peer["solve_cpu_s_median"] / ours["whole_cpu_s_median"], 1)
        peer["times_digest"] = _digest(peer.pop("frontier"))
    ours["times_digest"] = _digest(ours.pop("frontier"))
    return result


def status_latency(repeat: int) -> dict[str, Any]:
    """`perseusctl status` against a running daemon with 8 sim GPUs, end to end."""
    from tests.support.perseusd_proc import DaemonDirs, daemon_processes

    with daemon_processes() as make:
        daemon = make(DaemonDirs.create(), gpus=8).start()
        command = [
            *(sys.executable, "-m", "perseusd.ctl.main", "--runtime-dir", str(daemon.dirs.runtime_dir)),
            "status",
        ]
        walls = []
        for _ in range(repeat):
            start = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True)
            walls.append(time.perf_counter() - start)
    return {
        "status_s_median": round(statistics.median(walls), 4),
        "status_s_runs": [round(w, 4) for w in walls],
    }


def compile_package() -> None:
    """Write the package's bytecode caches, as installing it does."""
    import compileall

    compileall.compile_dir(str(ROOT / "perseusd"), quiet=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--lowtime-worker", nargs=3, metavar=("PROFILE", "GPU", "M"), help=argparse.SUPPRESS)
    parser.add_argument("--repeat", type=int, default=5, help="runs of each of our commands (median)")
    parser.add_argument("--lowtime-repeat", type=int, default=3, help="lowtime runs per case (median)")
    parser.add_argument("--lowtime-96", action="store_true", help="also run lowtime on 8 x 96 (about 24 min)")
    parser.add_argument("--lowtime-a40", action="store_true", help="also run lowtime on A40 (about 200 s)")
    parser.add_argument("--only-8x12", action="store_true", help="only the two 8 x 12 cases against lowtime")
    parser.add_argument("--only-planning", action="store_true", help="only the daemon's planning step")
    parser.add_argument(
        "--planning-baseline",
        default="main",
        help="git ref or built tree to compare with ('none': no baseline)",
    )
    parser.add_argument("--planning-baseline-repeat", type=int, default=3, help="baseline runs per case")
    parser.add_argument(
        "--planning-case", action="append", default=[], type=planning_step.parse_case, help="an extra case"
    )
    args = parser.parse_args()
    if args.lowtime_worker:
        profile_arg, gpu, microbatches = args.lowtime_worker
        print(json.dumps(lowtime_worker(profile_arg, gpu, int(microbatches))))
        return
    compile_package()
    baseline = None if args.planning_baseline == "none" else args.planning_baseline
    planned = planning_step.planning(
        [*planning_step.CASES, *args.planning_case], baseline, args.repeat, args.planning_baseline_repeat
    )
    if args.only_planning:
        print(json.dumps(_report({"planning": planned}), indent=2))
        return
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "a100_sxm-staged.csv"
        staged_profile("a100_sxm", staged)
        cases = [
            case("a100_sxm gpt3-175b S=8 M=12 (bundled)", "a100_sxm", "a100_sxm", 12, args, True),
            case("a100_sxm every stage different S=8 M=12", str(staged), "a100_sxm", 12, args, True),
        ]
        if not args.only_8x12:
            cases.append(
                case("a100_sxm gpt3-175b S=8 M=96", "a100_sxm", "a100_sxm", 96, args, args.lowtime_96)
            )
            cases.append(case("a40 gpt3-175b S=8 M=12 unit 0.1 ms", "a40", "a40", 12, args, args.lowtime_a40))
    status = None if args.only_8x12 else status_latency(args.repeat)
    print(json.dumps(_report({"cases": cases, "status": status, "planning": planned}), indent=2))


def _report(parts: dict[str, Any]) -> dict[str, Any]:
    load = os.getloadavg()
    head = {"benchmark": "solver", "cpu_count": os.cpu_count(), "load_avg_1m_at_end": round(load[0], 2)}
    return head | {"targets": TARGETS} | parts


if __name__ == "__main__":
    main()
