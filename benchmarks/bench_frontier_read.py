"""How long reading a cached frontier takes, and what of it the daemon's main loop pays; prints JSON.

A job registering with a cached frontier used to have its `frontier.json` read and checked on the daemon's
main loop, which serves no event or request meanwhile: every other job's clock changes on the node wait.
For each shape this solves the frontier as the daemon does (every point followed under a 12 ms clock-set
latency, so the document carries what a cache file carries), writes it to a job cache and measures, median
of `--repeat` runs:

- `parse_s`: `parse_frontier` of the document as it reads well-formed clock fields at once;
- `walk_s`: the same document read field by field, the strict walk every field took before (the baseline,
  measured in the same run; both must give the same frontier);
- `registration_s`: what registration reads on the main loop (`JobCache.load`): the profile, and the
  frontier only when it is at most `INLINE_FRONTIER_BYTES`; a larger one is left to the solver worker.

    python benchmarks/bench_frontier_read.py [--shapes h100_sxm:4:16,a100_sxm:8:32] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from perseusd.jobs import cache as cache_module
from perseusd.jobs.cache import JobCache
from perseusd.jobs.shape import JobShape
from perseusd.jobs.solving import SolveInput, auto_unit_time_s, solve
from perseusd.planner import plan_read
from perseusd.planner.bundled import bundled_profile
from perseusd.planner.plan import frontier_to_document
from perseusd.planner.profile_csv import profile_to_csv
from perseusd.planner.switching import SwitchModel

SIGNATURE = "0123456789abcdef"
LATENCY_S = 0.012


def _median_s(run: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started_s = time.perf_counter()
        run()
        times.append(time.perf_counter() - started_s)
    return statistics.median(times)


def _walk(text: str) -> object:
    """`parse_frontier` with every clock field read field by field (the fast readers declined)."""
    whole, changed = plan_read._whole_rows, plan_read._changed_rows
    plan_read._whole_rows = lambda *_args: None  # type: ignore[assignment]
    plan_read._changed_rows = lambda *_args: None  # type: ignore[assignment]
    try:
        return plan_read.parse_frontier(text, "walk")
    finally:
        plan_read._whole_rows, plan_read._changed_rows = whole, changed


def one_shape(spec: str, repeat: int, root: Path) -> dict[str, Any]:
    """Solve, cache and read one `PROFILE:STAGES:MICROBATCHES` shape."""
    name, stages, microbatches = spec.split(":")
    profile = bundled_profile(name)
    shape = JobShape("1f1b", int(stages), int(microbatches), 1)
    p_block_w = 80.0
    switch = SwitchModel(LATENCY_S, LATENCY_S + 0.002, min_run_s=3 * (LATENCY_S + 0.002))
    task = SolveInput(
        spec,
        shape,
        shape.named_orders() or (),
        profile_to_csv(profile),
        name,
        p_block_w,
        auto_unit_time_s(profile),
        switch,
    )
    solve_started_s = time.perf_counter()
    frontier = solve(task).frontier
    solve_s = time.perf_counter() - solve_started_s
    cache = JobCache(root / spec.replace(":", "_"))
    cache.store_profile(SIGNATURE, profile, p_block_w, {"job": spec})
    text = json.dumps(frontier_to_document(frontier)) + "\n"
    cache.frontier_path(SIGNATURE).write_text(text, encoding="utf-8")
    if plan_read.parse_frontier(text, "fast") != _walk(text):
        raise SystemExit(f"{spec}: the fast reading and the walk disagree")
    inline = len(text.encode()) <= cache_module.INLINE_FRONTIER_BYTES
    return {
        "shape": spec,
        "points": len(frontier.points),
        "document_mb": round(len(text.encode()) / 1e6, 2),
        "solve_s": round(solve_s, 2),
        "parse_s": round(_median_s(lambda: plan_read.parse_frontier(text, "fast"), repeat), 3),
        "walk_s": round(_median_s(lambda: _walk(text), repeat), 3),
        "registration_s": round(_median_s(lambda: cache.load(SIGNATURE, shape), repeat), 3),
        "read_at_registration": inline,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="h100_sxm:4:16,a100_sxm:8:32")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="perseus-frontier-read-") as folder:
        shapes = [one_shape(spec, args.repeat, Path(folder)) for spec in args.shapes.split(",")]
    result = {
        "benchmark": "frontier_read",
        "inline_frontier_bytes": cache_module.INLINE_FRONTIER_BYTES,
        "repeat": args.repeat,
        "cpus": os.cpu_count(),
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "shapes": shapes,
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
