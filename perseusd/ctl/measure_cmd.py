"""`perseusctl measure [--gpu G ...] [--json] -- CMD [ARG ...]`: run a command, print its GPUs' energy.

No privileges needed: perseusd reads the energy counters (any member of group perseus may ask). The report
goes to stderr (like `time`), so the command's own output stays as it was; `--json` goes to stdout, one line
after the command's output; the exit code is the command's.
Energy counters advance every ~100 ms on NVIDIA GPUs: each GPU's energy is given with its uncertainty
(one counter period of power at each end of the run), which matters only for commands shorter than seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

from perseus_client.energy import Measurement, measurement
from perseus_client.protocol import EnergyRead, EnergyReading, GpuEnergy

from perseusd.ctl.arguments import add_json_option
from perseusd.ctl.daemon_link import DaemonRequestError, ask

HELP = "run a command and print the energy its GPUs used"
DESCRIPTION = (
    "Run CMD and print the time and the energy of the node's GPUs (or those given) from its start to its "
    "end, read by perseusd from the GPUs' energy counters."
)
EXIT_USAGE = 2
EXIT_NOT_FOUND = 127


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gpu",
        action="append",
        default=[],
        metavar="G",
        help="a GPU to measure, by index or UUID (repeat for more; default: every GPU of the node)",
    )
    add_json_option(parser, "print the measurement as one line of JSON on stdout, after the command's output")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARG ...]", help="the command")


def read(runtime_dir: Path, gpus: tuple[str, ...]) -> tuple[GpuEnergy, ...]:
    reading = ask(runtime_dir, EnergyRead(gpus=gpus), EnergyReading, admin=False).gpus
    for gpu in reading:
        if gpu.energy_j is None:
            raise DaemonRequestError("GPU_ERROR", f"energy of GPU {gpu.uuid} unavailable: {gpu.error}")
    return reading


def select(all_gpus: tuple[GpuEnergy, ...], wanted: list[str]) -> tuple[GpuEnergy, ...]:
    """The readings of the GPUs named by index or UUID (all of them when none is named)."""
    if not wanted:
        return all_gpus
    by_uuid = {gpu.uuid: gpu for gpu in all_gpus}
    chosen = []
    for name in wanted:
        if name.isdigit() and int(name) < len(all_gpus):
            chosen.append(all_gpus[int(name)])
        elif name in by_uuid:
            chosen.append(by_uuid[name])
        else:
            raise DaemonRequestError("UNKNOWN_GPU", f"no GPU {name!r} on this node ({len(all_gpus)} GPUs)")
    return tuple(chosen)


def render(m: Measurement, exit_code: int) -> str:
    lines = [f"perseusctl measure: {m.time_s:.3f} s, exit code {exit_code}"]
    for uuid, energy_j in m.energy_j.items():
        power_w = energy_j / m.time_s if m.time_s > 0 else 0.0
        lines.append(f"  {uuid}  {energy_j:12.1f} J ± {m.uncertainty_j[uuid]:.1f}  (mean {power_w:.1f} W)")
    total = f"  total {m.total_energy_j:.1f} J ± {m.total_uncertainty_j:.1f}"
    if m.relative_uncertainty > 0.1:
        total += f" (counters advance every {m.counter_period_s:g} s: run longer for a precise figure)"
    lines.append(total)
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        print("perseusctl measure: give a command after --", file=sys.stderr)
        return EXIT_USAGE
    runtime_dir = Path(args.runtime_dir)
    begin = select(read(runtime_dir, ()), args.gpu)
    began_ns = time.monotonic_ns()
    try:
        exit_code = subprocess.call(cmd)
    except OSError as exc:
        print(f"perseusctl measure: cannot run {cmd[0]}: {exc.strerror}", file=sys.stderr)
        return EXIT_NOT_FOUND
    time_s = (time.monotonic_ns() - began_ns) / 1e9
    end = read(runtime_dir, tuple(gpu.uuid for gpu in begin))
    m = measurement(" ".join(cmd), time_s, begin, end)
    if args.json:
        # On stdout, as every --json (one line, after the command's own output: its last line).
        print(json.dumps({**dataclasses.asdict(m), "exit_code": exit_code}), flush=True)
    else:
        print(render(m, exit_code), file=sys.stderr)
    return exit_code if exit_code >= 0 else 128 - exit_code  # killed by a signal: as a shell reports it
