"""Solver speed and memory against lowtime 0.3.0 on the same input, measured in the same run.

Each solve runs in a fresh process (imports done before the clock starts), which also gives its peak RSS.
Prints one JSON object. Cases: A100 SXM GPT-3, 8 stages, 12 microbatches (ours vs lowtime, frontiers must be
identical); 8 x 96 (ours; lowtime takes about 24 minutes there, run it with --lowtime-96); optionally the
A40 case with a 0.1 ms unit time (--a40).

    python benchmarks/bench_solver.py [--lowtime-96] [--a40]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARAMS = {"a100_sxm": (0.001, 83.64), "a40": (0.0001, 70.38)}


def worker(solver: str, gpu: str, microbatches: int) -> dict[str, object]:
    """Solve one case in this process and describe the result."""
    sys.path.insert(0, str(ROOT))
    from perseusd.planner.bundled import bundled_profile
    from perseusd.planner.dag import build_dag

    unit_time_s, p_block_w = PARAMS[gpu]
    profile = bundled_profile(gpu)
    dag = build_dag("1f1b", 8, microbatches)
    if solver == "ours":
        import scipy.optimize  # noqa: F401  (imports are not part of the solve time, as for lowtime)

        from perseusd.planner.solver import FrontierSolver, SolverParams

        start = time.perf_counter()
        points = [
            (p.time_s, p.model_energy_j)
            for p in FrontierSolver(dag, profile, SolverParams(unit_time_s, p_block_w)).points()
        ]
    else:
        warnings.simplefilter("ignore")
        import lowtime.solver  # noqa: F401

        from benchmarks.peers.lowtime_peer import lowtime_frontier

        start = time.perf_counter()
        points = [(p.time_s, p.energy_j) for p in lowtime_frontier(dag, profile, unit_time_s, p_block_w)]
    solve_s = time.perf_counter() - start
    times = ",".join(repr(t) for t, _ in points)
    return {
        "solve_s": round(solve_s, 4),
        "points": len(points),
        "times_digest": hashlib.sha256(times.encode()).hexdigest()[:16],
        "energies": [e for _, e in points],
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def run(solver: str, gpu: str, microbatches: int) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", solver, gpu, str(microbatches)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def compare(gpu: str, microbatches: int, with_lowtime: bool) -> dict[str, object]:
    ours = run("ours", gpu, microbatches)
    case: dict[str, object] = {"case": f"{gpu} gpt3-175b S=8 M={microbatches}", "ours": ours}
    if with_lowtime:
        peer = run("lowtime", gpu, microbatches)
        mine, theirs = ours["energies"], peer["energies"]
        assert isinstance(mine, list)
        assert isinstance(theirs, list)
        case["lowtime"] = peer
        case["identical_times"] = ours["times_digest"] == peer["times_digest"]
        case["max_energy_rel_diff"] = (
            max((abs(a - b) / abs(b) for a, b in zip(mine, theirs, strict=True)), default=0.0)
            if len(mine) == len(theirs)
            else None
        )
        case["speedup_x"] = round(float(peer["solve_s"]) / float(ours["solve_s"]), 1)  # type: ignore[arg-type]
        peer.pop("energies")
    ours.pop("energies")
    return case


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=3, metavar=("SOLVER", "GPU", "M"))
    parser.add_argument("--lowtime-96", action="store_true", help="also run lowtime on 8 x 96 (about 24 min)")
    parser.add_argument("--a40", action="store_true", help="also run the A40 case (0.1 ms unit time)")
    args = parser.parse_args()
    if args.worker:
        solver, gpu, microbatches = args.worker
        print(json.dumps(worker(solver, gpu, int(microbatches))))
        return
    cases = [compare("a100_sxm", 12, True), compare("a100_sxm", 96, args.lowtime_96)]
    if args.a40:
        cases.append(compare("a40", 12, True))
    targets = {"speedup_x_8x12_min": 20, "solve_s_8x96_max": 60, "peak_rss_mb_8x96_max": 1024}
    print(json.dumps({"benchmark": "solver", "targets": targets, "cases": cases}, indent=2))


if __name__ == "__main__":
    main()
