"""The `perseusd` command line: its parser, and the configuration it loads (file, environment, flags), the
same way at start and on SIGHUP. `main.main`, the entry point, parses with it and hands the configuration
to the composition root.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from perseusd import __version__
from perseusd.daemon.config import BACKENDS, LOG_LEVELS, SIM_MODELS, DaemonConfig
from perseusd.daemon.config_loading import load_config
from perseusd.gpu.select import MIXED_REAL_KINDS

RESET_DESCRIPTION = (
    "Restore every GPU the state file records (clocks and power limits as they were before perseusd wrote "
    "them; the defaults when the state file cannot be read) and unlock the clocks of all GPUs, then exit. "
    "Run while the daemon is stopped (the service's ExecStopPost=); exit 0 when every GPU was restored."
)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of `perseusd` (`command` "reset": of `perseusd reset`, whose --help describes it)."""
    if command == "reset":
        parser = argparse.ArgumentParser(prog="perseusd reset", description=RESET_DESCRIPTION)
        parser.add_argument("command", choices=["reset"], help=argparse.SUPPRESS)
    else:
        parser = argparse.ArgumentParser(
            prog="perseusd",
            description="Perseus per-node GPU energy daemon: leases GPUs to training processes, profiles "
            "and plans their clocks, restores every GPU it touched. `perseusd reset --help`: the offline "
            "restore.",
        )
        parser.add_argument("command", nargs="?", choices=["reset"], help="reset: restore every GPU and exit")
    parser.add_argument("--version", action="version", version=f"perseusd {__version__}")
    parser.add_argument(
        "--config", type=Path, help="configuration file (default: /etc/perseusd/perseusd.toml)"
    )
    parser.add_argument("--backend", choices=BACKENDS, help="GPU backend: NVML, simulated GPUs, or auto")
    parser.add_argument("--sim-gpus", type=int, help="with --backend sim: how many simulated GPUs")
    parser.add_argument(
        "--mixed-real",
        choices=MIXED_REAL_KINDS,
        help="with --backend mixed: the real GPU is NVML's (nvml) or a simulated stand-in (sim)",
    )
    parser.add_argument("--sim-model", choices=SIM_MODELS, help="with --backend sim: the simulated board")
    parser.add_argument("--runtime-dir", type=Path, help="sockets and lock (default: /run/perseusd)")
    parser.add_argument(
        "--state-dir", type=Path, help="state file and job cache (default: /var/lib/perseusd)"
    )
    parser.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, help="log level (default: INFO)")
    parser.add_argument(
        "--monitor-only",
        action="store_const",
        const=True,
        help="read energy and status only, never write a clock or a limit (no privileges needed)",
    )
    parser.add_argument(
        "--check-config", action="store_true", help="print the effective configuration and exit"
    )
    return parser


def config_loader(args: argparse.Namespace) -> Callable[[], DaemonConfig]:
    """Build the configuration the same way at start and on SIGHUP: file, environment, flags."""
    overrides = {**flag_overrides(args), "log_level": args.log_level}
    return lambda: load_config(args.config, os.environ, overrides)


def flag_overrides(args: argparse.Namespace) -> dict[str, object]:
    """The settings given as flags (None where not given), over the file and the environment."""
    return {
        "backend": args.backend,
        "sim_gpus": args.sim_gpus,
        "mixed_real": args.mixed_real,
        "sim_model": args.sim_model,
        "runtime_dir": args.runtime_dir.absolute() if args.runtime_dir else None,
        "state_dir": args.state_dir.absolute() if args.state_dir else None,
        "monitor_only": args.monitor_only,
    }
