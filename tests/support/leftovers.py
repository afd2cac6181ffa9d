"""Finding processes a test session left behind (read from /proc; Linux only).

A process belongs to the session when it descends from the pytest process, when it carries the session's
mark in its environment (every child inherits it, orphans included), or when it is an orphan (parent: init)
started during the session whose command line is one of ours (multiprocessing forkserver or resource
tracker, perseusd, perseus-emulate, etcd) and names this checkout's interpreter or repository.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SESSION_MARK = "PERSEUS_TEST_SESSION"


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    ppid: int
    state: str
    start_ticks: int
    cmdline: str
    marked: bool


def _read_process(pid: int, mark: str) -> ProcessInfo | None:
    base = Path("/proc") / str(pid)
    try:
        stat = (base / "stat").read_text()
        cmdline = (base / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        try:
            marked = f"{SESSION_MARK}={mark}".encode() in (base / "environ").read_bytes().split(b"\0")
        except PermissionError:
            marked = False
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
    return ProcessInfo(pid, int(fields[1]), fields[0], int(fields[19]), cmdline, marked)


def _processes(mark: str) -> dict[int, ProcessInfo]:
    found: dict[int, ProcessInfo] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = _read_process(int(entry), mark)
            if info is not None:
                found[info.pid] = info
    return found


def now_ticks() -> int:
    """The current time in /proc start-time units (clock ticks since boot)."""
    uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    return int(uptime_s * os.sysconf("SC_CLK_TCK"))


def start_session() -> tuple[str, int]:
    """Mark this process's environment (children inherit it); returns (mark, start ticks)."""
    mark = f"{os.getpid()}-{time.time_ns()}"
    os.environ[SESSION_MARK] = mark
    return mark, now_ticks()


OURS = re.compile(r"multiprocessing|forkserver|resource_tracker|perseusd|perseus[-_]emulate|etcd")
"""What the command line of an orphan of ours names (`left_behind`)."""


def left_behind(mark: str, since_ticks: int) -> list[ProcessInfo]:
    """Live (not zombie) processes of this session other than the pytest process itself."""
    me = os.getpid()
    table = _processes(mark)
    ours_text = (sys.executable, sys.prefix, str(Path(__file__).resolve().parents[2]))

    def descends(info: ProcessInfo) -> bool:
        seen = set()
        while info.ppid not in (0, 1) and info.pid not in seen:
            seen.add(info.pid)
            if info.ppid == me:
                return True
            parent = table.get(info.ppid)
            if parent is None:
                return False
            info = parent
        return False

    def orphan_of_ours(info: ProcessInfo) -> bool:
        return (
            info.ppid == 1
            and info.start_ticks >= since_ticks
            and OURS.search(info.cmdline) is not None
            and any(text in info.cmdline for text in ours_text)
        )

    def ours(info: ProcessInfo) -> bool:
        return info.marked or descends(info) or orphan_of_ours(info)

    live = (info for info in table.values() if info.pid != me and info.state != "Z")
    return sorted((info for info in live if ours(info)), key=lambda info: info.pid)


def stop_own_helpers() -> None:
    """Stop the forkserver and resource tracker this pytest process itself started (tests of the core
    run the solve worker in-process); they would otherwise live until the interpreter exits."""
    from multiprocessing import forkserver, resource_tracker

    forkserver._forkserver._stop()  # type: ignore[attr-defined]
    resource_tracker._resource_tracker._stop()  # type: ignore[attr-defined]


GRACE_S = 15.0
"""How long `wait_for_none_left` gives processes asked to stop to exit, by default."""


def wait_for_none_left(mark: str, since_ticks: int, grace_s: float = GRACE_S) -> list[ProcessInfo]:
    """What is still alive after `grace_s` (processes asked to stop get time to exit)."""
    deadline_s = time.monotonic() + grace_s
    while True:
        left = left_behind(mark, since_ticks)
        if not left or time.monotonic() > deadline_s:
            return left
        time.sleep(0.2)


def kill_all(processes: list[ProcessInfo]) -> None:
    for info in processes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(info.pid, signal.SIGKILL)
