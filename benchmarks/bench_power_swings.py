"""Power swings of a training fleet: all-max clocks vs perseusd's plans vs a uniform power limit.

Per-computation clock plans move a GPU's power at the pace of its computations; a data-parallel fleet's
synchronised iterations add up those moves. This benchmark builds the power of one node (one pipeline of
`--stages` GPUs, A100 SXM measured profile, 1F1B, `--microbatches`) and of a fleet of `--pipelines` such
nodes whose iterations start together after each gradient all-reduce (`--sync-s` at blocking power, with a
seeded start jitter per pipeline and iteration), at 10 ms resolution over `--seconds`, for three arms:

- `all_max`: every computation at its highest clock (what runs without perseusd);
- `plans`: the deployed plan, perseusd's no-slowdown point (the frontier's fastest point, the least energy
  at the all-max iteration time), every computation at its planned clock;
- `uniform_limit`: one power limit on every GPU (what a facility cap does without perseusd), each
  computation at the highest clock whose power is under it, the limit chosen so that the fleet's mean power
  equals the plans' (same energy budget);
- `plans_ramp_bounded`: the deployed plan under the node ramp bound `ramp_bound_w_per_s` (daemon key; one
  arm per `--ramp-bound-w-per-s`), as the daemon applies it (`perseusd.planner.ramp_bound.bound_gpu_ramps`,
  each of the node's GPUs held to bound / GPUs): clocks raised until the plan's steps between computations
  hold the bound.

Reported per arm, for the node and the fleet: mean, peak and minimum power; the largest ramp between two
10 ms samples (W/s) and over one second (|P(t + 1 s) - P(t)|); the spectrum of the fleet's power in the
0.1-20 Hz band (its RMS, the frequency and amplitude of its strongest line); iteration time; the energy
saving against all-max (per iteration, the frontier's energy). And what the ramp bound bounds, the node's
*held power* (each GPU at its current computation's power through the waits after it: only the plan's
steps move it): its largest change between two 10 ms samples, and for a bounded arm the samples where it
exceeds the bound (`violations`, which must be 0) and the saving it costs against `plans` (points). Pure
computation on the measured profile (no daemon, no GPU): the numbers do not depend on machine speed.

    python benchmarks/bench_power_swings.py [--pipelines 16] [--seconds 60] [--plot swings.png]
        [--ramp-bound-w-per-s 100000 60000 20000 10000]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from perseusd.planner.bundled import bundled_profile  # noqa: E402
from perseusd.planner.dag import ComputationDag, build_dag  # noqa: E402
from perseusd.planner.evaluate import all_max_clocks, evaluate_clocks, measurements_for  # noqa: E402
from perseusd.planner.profile import Profile  # noqa: E402
from perseusd.planner.ramp_bound import bound_gpu_ramps, plan_ramp_w_per_s, power_w  # noqa: E402
from perseusd.planner.solver import SolverParams, solve_frontier  # noqa: E402

SAMPLE_S = 0.01
P_BLOCK_W, UNIT_S = 83.64, 0.001
BAND_HZ = (0.1, 20.0)


def schedule(dag: ComputationDag, times_s: list[float]) -> list[float]:
    """Each computation's start (s), as soon as its predecessors finish."""
    start, finish = [0.0] * dag.num_computations, [0.0] * dag.num_computations
    for node in dag.topological_order:
        start[node] = max((finish[p] for p in dag.predecessors[node]), default=0.0)
        finish[node] = start[node] + times_s[node]
    return start


def iteration_segments(
    dag: ComputationDag, profile: Profile, clocks: list[int]
) -> tuple[float, list[tuple[float, float, float]]]:
    """(iteration time, [(start, end, power above blocking, W)]) for the whole pipeline (one node)."""
    rows = measurements_for(dag, profile, clocks)
    times = [m.time_s for m in rows]
    starts = schedule(dag, times)
    segments = [
        (s, s + m.time_s, m.energy_j / m.time_s - P_BLOCK_W) for s, m in zip(starts, rows, strict=True)
    ]
    return max(s + t for s, t in zip(starts, times, strict=True)), segments


def node_power(
    period_s: float,
    segments: list[tuple[float, float, float]],
    offset_s: float,
    stages: int,
    grid: np.ndarray,
) -> np.ndarray:
    """Average power of one node in each 10 ms bin of `grid` (exact integration of the segments)."""
    energy = np.full(grid.size, stages * P_BLOCK_W * SAMPLE_S)
    horizon = grid[-1] + SAMPLE_S
    start_s = offset_s - period_s  # the iteration running at t = 0 too
    while start_s < horizon:
        for seg_start, seg_end, extra_w in segments:
            a, b = start_s + seg_start, start_s + seg_end
            if b <= 0 or a >= horizon:
                continue
            first, last = int(max(a, 0) / SAMPLE_S), min(int(b / SAMPLE_S), grid.size - 1)
            for i in range(first, last + 1):
                lo, hi = max(a, i * SAMPLE_S), min(b, (i + 1) * SAMPLE_S)
                if hi > lo:
                    energy[i] += extra_w * (hi - lo)
        start_s += period_s
    return energy / SAMPLE_S


def held_segments(
    dag: ComputationDag, profile: Profile, clocks: list[int], period_s: float
) -> list[tuple[float, float, float]]:
    """The held power's segments (start, end, power above blocking W): each GPU at its computation's power
    from its start to the next computation's on the GPU (the last one's: to the first's, an iteration on)."""
    rows = measurements_for(dag, profile, clocks)
    starts = schedule(dag, [m.time_s for m in rows])
    segments = []
    for nodes in dag.stage_orders:
        for i, node in enumerate(nodes):
            end = starts[nodes[i + 1]] if i + 1 < len(nodes) else starts[nodes[0]] + period_s
            segments.append((starts[node], end, power_w(rows[node]) - P_BLOCK_W))
    return segments


def fleet_power(
    args: argparse.Namespace, iteration_s: float, segments: list[tuple[float, float, float]], grid: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(one node's power, the fleet's) for pipelines that start each iteration together, with jitter."""
    rng = random.Random(args.seed)
    period_s = iteration_s + args.sync_s
    fleet = np.zeros(grid.size)
    node = None
    for _ in range(args.pipelines):
        # One start offset per pipeline: the all-reduce resynchronises every iteration, the jitter is the
        # misalignment it leaves between pipelines.
        offset = rng.gauss(0.0, args.jitter_s)
        power = node_power(period_s, segments, offset, args.stages, grid)
        fleet += power
        if node is None:
            node = power
    assert node is not None
    return node, fleet


def swing_stats(series: np.ndarray) -> dict[str, Any]:
    per_second = round(1.0 / SAMPLE_S)
    steps = np.abs(np.diff(series)) / SAMPLE_S
    over_1s = np.abs(series[per_second:] - series[:-per_second])
    return {
        "mean_w": round(float(series.mean()), 1),
        "peak_w": round(float(series.max()), 1),
        "min_w": round(float(series.min()), 1),
        "max_ramp_10ms_w_per_s": round(float(steps.max()), 0),
        "max_change_over_1s_w": round(float(over_1s.max()), 1),
    }


def band_stats(series: np.ndarray) -> dict[str, Any]:
    centred = series - series.mean()
    spectrum = np.fft.rfft(centred) / series.size
    freqs = np.fft.rfftfreq(series.size, SAMPLE_S)
    amplitude = 2 * np.abs(spectrum)  # one-sided amplitude of each line (W)
    band = (freqs >= BAND_HZ[0]) & (freqs <= BAND_HZ[1])
    strongest = int(np.argmax(np.where(band, amplitude, 0.0)))
    return {
        "band_rms_w": round(float(np.sqrt(np.sum((amplitude[band] ** 2) / 2))), 1),
        "strongest_hz": round(float(freqs[strongest]), 3),
        "strongest_amplitude_w": round(float(amplitude[strongest]), 1),
    }


def uniform_limit_clocks(dag: ComputationDag, profile: Profile, limit_w: float) -> list[int]:
    """Each computation at the highest clock whose power is at most `limit_w` (else its lowest clock)."""
    clocks = []
    for node, comp in enumerate(dag.computations):
        stage = dag.virtual_stage(node)
        rows = [m for m in profile.measurements if m.stage == stage and m.instruction == comp.instruction]
        under = [m.freq_mhz for m in rows if m.energy_j / m.time_s <= limit_w]
        clocks.append(max(under) if under else min(m.freq_mhz for m in rows))
    return clocks


def arm(
    args: argparse.Namespace, dag: ComputationDag, profile: Profile, clocks: list[int], grid: np.ndarray
) -> tuple[dict[str, Any], np.ndarray]:
    iteration_s, segments = iteration_segments(dag, profile, clocks)
    node, fleet = fleet_power(args, iteration_s, segments, grid)
    return {
        "iteration_s": round(iteration_s, 4),
        "node": swing_stats(node),
        "fleet": swing_stats(fleet) | band_stats(fleet),
    }, fleet


def held_ramps(
    args: argparse.Namespace, dag: ComputationDag, profile: Profile, clocks: list[int], grid: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Every 10 ms change of the held power (W/s), one node's and the fleet's."""
    iteration_s, _ = iteration_segments(dag, profile, clocks)
    segments = held_segments(dag, profile, clocks, iteration_s + args.sync_s)
    node, fleet = fleet_power(args, iteration_s, segments, grid)
    return np.abs(np.diff(node)) / SAMPLE_S, np.abs(np.diff(fleet)) / SAMPLE_S


def saving_pct(dag: ComputationDag, profile: Profile, clocks: list[int], all_max_j: float) -> float:
    """The energy saved per iteration against all-max clocks (%)."""
    return 100.0 * (1.0 - evaluate_clocks(dag, profile, clocks, P_BLOCK_W).energy_j / all_max_j)


def ramp_bounded_arms(
    args: argparse.Namespace,
    dag: ComputationDag,
    profile: Profile,
    plan: list[int],
    grid: np.ndarray,
    results: dict[str, Any],
) -> list[dict[str, Any]]:
    """One `plans_ramp_bounded` arm per bound; the held power's ramps added to every other arm."""
    all_max = all_max_clocks(dag, profile)
    all_max_j = evaluate_clocks(dag, profile, all_max, P_BLOCK_W).energy_j
    for name, clocks in (("all_max", all_max), ("plans", plan)):
        node_steps, fleet_steps = held_ramps(args, dag, profile, clocks, grid)
        results[name]["node"]["held_max_ramp_10ms_w_per_s"] = round(float(node_steps.max()), 0)
        results[name]["fleet"]["held_max_ramp_10ms_w_per_s"] = round(float(fleet_steps.max()), 0)
        results[name]["saving_pct"] = round(saving_pct(dag, profile, clocks, all_max_j), 2)
    arms = []
    for bound in args.ramp_bound_w_per_s:
        bounded = bound_gpu_ramps(dag, profile, plan, bound / args.stages)
        clocks = list(bounded.clocks_mhz)
        stats, _ = arm(args, dag, profile, clocks, grid)
        node_steps, fleet_steps = held_ramps(args, dag, profile, clocks, grid)
        saving = saving_pct(dag, profile, clocks, all_max_j)
        stats["node"]["held_max_ramp_10ms_w_per_s"] = round(float(node_steps.max()), 0)
        stats["fleet"]["held_max_ramp_10ms_w_per_s"] = round(float(fleet_steps.max()), 0)
        arms.append(
            {
                "ramp_bound_w_per_s": bound,
                "met": bounded.met,
                "bounded_ramp_w_per_s": round(plan_ramp_w_per_s(dag, profile, clocks), 0),
                "violations": int(np.sum(node_steps > bound * (1 + 1e-9))),
                "samples": int(node_steps.size),
                "computations_raised": bounded.raised,
                "saving_pct": round(saving, 2),
                "saving_cost_pts": round(results["plans"]["saving_pct"] - saving, 2),
            }
            | stats
        )
    return arms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pipelines", type=int, default=16)
    parser.add_argument("--stages", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--sync-s", type=float, default=0.05, help="all-reduce between iterations (s)")
    parser.add_argument("--jitter-s", type=float, default=0.003, help="start jitter between pipelines (s)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--plot", help="PNG: 3 s of fleet power and the 0.1-20 Hz spectrum per arm")
    parser.add_argument(
        "--ramp-bound-w-per-s",
        type=float,
        nargs="*",
        default=[100_000.0, 60_000.0, 20_000.0, 10_000.0],
        help="node ramp bounds (W/s), one plans_ramp_bounded arm each",
    )
    args = parser.parse_args()
    profile = bundled_profile("a100_sxm")
    dag = build_dag("1f1b", args.stages, args.microbatches)
    grid = np.arange(0.0, args.seconds, SAMPLE_S)
    all_max = all_max_clocks(dag, profile)
    points = list(solve_frontier(dag, profile, SolverParams(UNIT_S, P_BLOCK_W)))
    plan = min(points, key=lambda p: (p.quant_time, p.refined_energy_j))  # the no-slowdown point
    results: dict[str, Any] = {}
    series: dict[str, np.ndarray] = {}
    results["all_max"], series["all_max"] = arm(args, dag, profile, all_max, grid)
    results["plans"], series["plans"] = arm(args, dag, profile, list(plan.clocks_mhz), grid)
    target_w = results["plans"]["fleet"]["mean_w"]
    lo, hi = 50.0, 500.0
    for _ in range(30):  # the limit whose fleet mean power is the plans'
        mid = (lo + hi) / 2
        mean_w = arm(args, dag, profile, uniform_limit_clocks(dag, profile, mid), grid[:2000])[0]["fleet"][
            "mean_w"
        ]
        lo, hi = (mid, hi) if mean_w < target_w else (lo, mid)
    limit_w = round(lo, 1)
    results["uniform_limit"], series["uniform_limit"] = arm(
        args, dag, profile, uniform_limit_clocks(dag, profile, limit_w), grid
    )
    results["uniform_limit"]["limit_w_per_gpu"] = limit_w
    results["plans_ramp_bounded"] = ramp_bounded_arms(
        args, dag, profile, list(plan.clocks_mhz), grid, results
    )
    out = {
        "settings": vars(args) | {"profile": "a100_sxm", "schedule": "1f1b", "sample_s": SAMPLE_S},
        "arms": results,
    }
    if args.plot:
        plot(series, args.plot)
        out["plot"] = args.plot
    print(json.dumps(out, indent=2))


def plot(series: dict[str, np.ndarray], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7))
    window = int(3.0 / SAMPLE_S)
    for name, values in series.items():
        top.plot(np.arange(window) * SAMPLE_S, values[:window] / 1000, label=name, linewidth=0.9)
        centred = values - values.mean()
        amplitude = 2 * np.abs(np.fft.rfft(centred) / values.size)
        freqs = np.fft.rfftfreq(values.size, SAMPLE_S)
        band = (freqs >= BAND_HZ[0]) & (freqs <= BAND_HZ[1])
        bottom.semilogy(freqs[band], np.maximum(amplitude[band], 1e-3), label=name, linewidth=0.8)
    top.set_xlabel("time (s)")
    top.set_ylabel("fleet power (kW), 10 ms samples")
    top.legend()
    bottom.set_xlabel("frequency (Hz)")
    bottom.set_ylabel("amplitude (W)")
    bottom.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)


if __name__ == "__main__":
    main()
