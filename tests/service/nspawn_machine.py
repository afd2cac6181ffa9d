"""Boot a real systemd in a container with systemd-nspawn and drive it with nsenter.

The host need not run systemd: `machinectl` and `systemctl -M` are not used. Each machine boots the shared
rootfs with `--volatile=overlay` (writes go to a tmpfs; the rootfs stays untouched, so one unpacked copy
serves every test) and `--private-network`, with the project source bind-mounted read-only. systemd-nspawn
runs in a cgroup of its own; `Machine.destroy()` powers the machine off, kills what is left and removes the
cgroups and nspawn's runtime files.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

CGROUP_ROOT = Path("/sys/fs/cgroup")
NSPAWN_RUNTIME = Path("/run/systemd/nspawn")
BOOT_TIMEOUT_S = 60.0
POWEROFF_TIMEOUT_S = 20.0
COMMAND_TIMEOUT_S = 60.0
POLL_INTERVAL_S = 0.05


class MachineError(RuntimeError):
    """The container did not boot, or a command in it failed."""


def cgroup_hierarchies() -> list[Path]:
    """The cgroup hierarchies systemd-nspawn places itself in: the unified one and/or name=systemd."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return [CGROUP_ROOT]
    return [p for p in (CGROUP_ROOT / "unified", CGROUP_ROOT / "systemd") if (p / "cgroup.procs").exists()]


def _cgroup_pids(cgroup: Path) -> list[int]:
    pids: list[int] = []
    for procs in cgroup.rglob("cgroup.procs"):
        with contextlib.suppress(OSError):
            pids.extend(int(line) for line in procs.read_text().split())
    return pids


def _remove_cgroup_tree(cgroup: Path) -> None:
    """rmdir `cgroup` and its children, deepest first (a cgroup directory is removed with rmdir)."""
    if not cgroup.exists():
        return
    for sub in sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            sub.rmdir()
    with contextlib.suppress(OSError):
        cgroup.rmdir()


def _kill_pids(pids: Sequence[int]) -> None:
    for pid in pids:
        if pid > 1:  # never 0 (the caller's process group) or -1 (everything)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _ns_pids(pid: int) -> list[int]:
    """The NSpid line of /proc/PID/status: its pid in each nested pid namespace, outermost first."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    except OSError:
        pass
    return []


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll `predicate` until it is true; MachineError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise MachineError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(POLL_INTERVAL_S)


@dataclass
class Machine:
    """A booted container. Create it with `boot()`; always `destroy()` it."""

    name: str
    rootfs: Path
    log_path: Path
    cgroups: list[Path]
    process: subprocess.Popen[bytes] | None = None
    leader: int = 0
    _log: IO[bytes] | None = field(default=None, repr=False)

    # ---- commands inside the machine

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float = COMMAND_TIMEOUT_S,
        check: bool = True,
        input_text: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` inside the machine (all its namespaces, as root).

        Raises MachineError when it exits non-zero and `check` is set.
        """
        if self.leader <= 1:
            raise MachineError("the machine is not running")
        cmd = ["nsenter", "-t", str(self.leader), "-a", "--", *argv]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, check=False, input=input_text
        )
        if check and proc.returncode != 0:
            raise MachineError(
                f"{' '.join(argv)} exited with {proc.returncode}\n"
                f"stdout: {proc.stdout}\nstderr: {proc.stderr}"
            )
        return proc

    def sh(self, script: str, *, timeout_s: float = COMMAND_TIMEOUT_S, check: bool = True) -> str:
        """Run a shell script inside the machine and return its stdout."""
        return self.run(["/bin/sh", "-c", script], timeout_s=timeout_s, check=check).stdout

    def systemctl(self, *args: str, timeout_s: float = COMMAND_TIMEOUT_S, check: bool = True) -> str:
        return self.run(["systemctl", *args], timeout_s=timeout_s, check=check).stdout

    def show(self, unit: str, prop: str) -> str:
        """One property of a unit (`systemctl show -p PROP --value UNIT`)."""
        return self.systemctl("show", "-p", prop, "--value", unit).strip()

    def journal(self, unit: str, lines: int = 200) -> str:
        return self.run(
            ["journalctl", "--no-pager", "-o", "short-monotonic", "-n", str(lines), "-u", unit], check=False
        ).stdout

    # ---- files inside the machine (written from the host through /proc/LEADER/root)

    def path(self, inside: str) -> Path:
        return Path(f"/proc/{self.leader}/root") / inside.lstrip("/")

    def write_file(self, inside: str, text: str, mode: int = 0o644) -> None:
        target = self.path(inside)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(mode)

    # ---- life cycle

    def start(self, binds_ro: dict[Path, str]) -> None:
        """Start systemd-nspawn in its own cgroup and wait until the container's systemd finished booting."""
        for cgroup in self.cgroups:
            cgroup.mkdir()
        argv = [
            "systemd-nspawn",
            "--quiet",
            f"--directory={self.rootfs}",
            f"--machine={self.name}",
            "--boot",
            "--volatile=overlay",
            "--private-network",
            "--register=no",
            "--keep-unit",  # no bus on the host: stay in the cgroup we made instead of a new scope
            *(f"--bind-ro={host}:{inside}" for host, inside in binds_ro.items()),
        ]
        log = self.log_path.open("wb")
        self._log = log
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=self._enter_cgroups,  # noqa: PLW1509 (runs before exec, nothing else is threaded here)
            start_new_session=True,
        )
        self.leader = self._wait_for_leader()
        self._wait_for_boot()

    def _enter_cgroups(self) -> None:
        for cgroup in self.cgroups:
            (cgroup / "cgroup.procs").write_text("0")

    def _find_leader(self) -> int:
        for pid in _cgroup_pids(self.cgroups[0]):
            ns_pids = _ns_pids(pid)
            if len(ns_pids) > 1 and ns_pids[-1] == 1:
                return pid
        return 0

    def _wait_for_leader(self) -> int:
        found: list[int] = []

        def leader_known() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise MachineError(
                    f"systemd-nspawn exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            pid = self._find_leader()
            if pid:
                found.append(pid)
            return bool(pid)

        wait_until(leader_known, BOOT_TIMEOUT_S, "the container's init process")
        return found[0]

    def _wait_for_boot(self) -> None:
        # `is-system-running --wait` blocks until boot finished; it fails while the bus is not up yet.
        def booted() -> bool:
            proc = self.run(
                ["systemctl", "is-system-running", "--wait"], check=False, timeout_s=BOOT_TIMEOUT_S
            )
            return proc.stdout.strip() in {"running", "degraded"}

        wait_until(booted, BOOT_TIMEOUT_S, "the container to boot")

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def destroy(self) -> None:
        """Power off (bounded), then kill whatever is left and remove cgroups and nspawn's runtime files."""
        try:
            self._poweroff()
        finally:
            self._kill_everything()
            for cgroup in self.cgroups:
                _remove_cgroup_tree(cgroup)
            shutil.rmtree(NSPAWN_RUNTIME / "propagate" / self.name, ignore_errors=True)
            shutil.rmtree(NSPAWN_RUNTIME / "unix-export" / self.name, ignore_errors=True)
            for leftover in (
                *(NSPAWN_RUNTIME / sub for sub in ("propagate", "unix-export", "locks")),
                NSPAWN_RUNTIME,
            ):
                with contextlib.suppress(OSError):
                    leftover.rmdir()  # only when empty: another machine may still use it
            if self._log is not None:
                self._log.close()

    def _poweroff(self) -> None:
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        if self.leader > 1:
            # SIGRTMIN+4 asks systemd (PID 1) to power off, without needing a working bus.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.leader, signal.SIGRTMIN + 4)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=POWEROFF_TIMEOUT_S)

    def _kill_everything(self) -> None:
        proc = self.process
        if proc is not None and proc.poll() is None:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=POWEROFF_TIMEOUT_S)
        for _ in range(10):
            pids = [pid for cgroup in self.cgroups for pid in _cgroup_pids(cgroup)]
            if not pids:
                return
            _kill_pids(pids)
            time.sleep(0.1)


@contextlib.contextmanager
def booted_machine(rootfs: Path, workdir: Path, binds_ro: dict[Path, str]) -> Iterator[Machine]:
    """Boot a machine on `rootfs` and destroy it on exit, whatever happens."""
    name = f"perseus-test-{uuid.uuid4().hex[:8]}"
    cgroups = [hierarchy / name for hierarchy in cgroup_hierarchies()]
    if not cgroups:
        raise MachineError(f"no usable cgroup hierarchy under {CGROUP_ROOT}")
    machine = Machine(name=name, rootfs=rootfs, log_path=workdir / f"{name}.log", cgroups=cgroups)
    try:
        machine.start(binds_ro)
        yield machine
    finally:
        machine.destroy()
