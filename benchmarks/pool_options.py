"""The options both power-pool benchmarks take (`bench_power_pool.py`, `bench_pool_scale.py`): how many budget
changes, the agents' lease TTL and polling interval, the seed and the nodes' absent-node policy."""

from __future__ import annotations

import argparse


def add_pool_options(
    parser: argparse.ArgumentParser, *, changes: int, ttl: int, interval_s: float, absent_node_help: str
) -> None:
    """Add `--changes`, `--ttl` (s), `--interval` (s) with these defaults, `--seed` (default 1) and
    `--absent-node` (release or hold, default release: the nodes' `power_pool_absent_node`)."""
    numbers: tuple[tuple[str, type[int] | type[float], float], ...] = (
        ("--changes", int, changes),
        ("--ttl", int, ttl),
        ("--interval", float, interval_s),
        ("--seed", int, 1),
    )
    for option, kind, default in numbers:
        parser.add_argument(option, type=kind, default=default)
    parser.add_argument(
        "--absent-node", choices=("release", "hold"), default="release", help=absent_node_help
    )
