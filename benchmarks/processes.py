"""The benchmarks' processes: what /proc says of one (its CPU time, user + system, each of its threads', its
resident memory), and stopping one."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TICKS_S = os.sysconf("SC_CLK_TCK")


def stat_cpu_s(stat: str) -> float:
    """CPU seconds (utime + stime) in the text of a `/proc/.../stat` file."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_S


def stat_name(stat: str) -> str:
    """The OS name of the process or thread (`comm`) in the text of a `/proc/.../stat` file."""
    return stat[stat.index("(") + 1 : stat.rindex(")")]


def process_cpu_s(pid: int) -> float:
    """CPU seconds used so far by process `pid`, all its threads (0 once it is gone)."""
    try:
        return stat_cpu_s(Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        return 0.0


def cpu_s_by_thread_name(pid: int, names: Mapping[int, str]) -> dict[str, float]:
    """CPU seconds used so far by each live thread of process `pid`, by name (threads of one name summed):
    the name `names` gives its thread id, else its OS name."""
    totals: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # the thread ended
        name = names.get(int(task.name)) or stat_name(stat)
        totals[name] = totals.get(name, 0.0) + stat_cpu_s(stat)
    return totals


def terminate(process: subprocess.Popen[Any], grace_s: float) -> None:
    """SIGTERM `process` (a daemon restores its GPUs), SIGKILL it after `grace_s`; reaped either way."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def rss_mb(pid: int) -> float:
    """The resident memory of process `pid` (MiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0
