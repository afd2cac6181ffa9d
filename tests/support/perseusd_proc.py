"""Real perseusd processes for end-to-end tests: start, wait ready, kill; plus helpers around them."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perseus_client.client import PerseusClient, PerseusClientError

if TYPE_CHECKING:
    from perseusd.gpu.sim_shared import ControlState

READY_TIMEOUT_S = 15.0
DAEMON_PYTHON_ENV = "PERSEUSD_TEST_DAEMON_PYTHON"
"""The interpreter that runs the daemon and perseusctl in end-to-end tests (default: this one). The client's
tests run on every supported Python (scripts/test_client_pythons.sh) against a daemon on Python 3.11+."""
REPO_ROOT = Path(__file__).resolve().parents[2]
NOBODY_UID = 65534
NOBODY_GID = 65534


@dataclass
class DaemonDirs:
    """A world-traversable base with the runtime and state directories inside."""

    base: Path
    runtime_dir: Path
    state_dir: Path

    @classmethod
    def create(cls) -> DaemonDirs:
        """Removed when the test process exits (a failing test's daemon log is in its assertion message)."""
        base = Path(tempfile.mkdtemp(prefix="perseusd-test-", dir="/tmp"))
        base.chmod(0o755)
        atexit.register(shutil.rmtree, base, ignore_errors=True)
        return cls(base, base / "run", base / "state")

    def private_tmp(self) -> Path:
        """The daemon's TMPDIR (sticky, like /tmp): what a daemon killed by a test leaves there (its solver
        worker's `pymp-*` folder) goes with the base, not into /tmp."""
        tmp = self.base / "tmp"
        tmp.mkdir(exist_ok=True)
        tmp.chmod(0o1777)
        return tmp


@dataclass
class DaemonProcess:
    """One `python -m perseusd.daemon.main` process with the sim backend."""

    dirs: DaemonDirs
    gpus: int = 2
    env: Mapping[str, str] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    proc: subprocess.Popen[str] | None = None
    log_path: Path | None = None

    def command(self) -> list[str]:
        return [
            daemon_python(),
            "-m",
            "perseusd.daemon.main",
            "--backend",
            "sim",
            "--sim-gpus",
            str(self.gpus),
            "--runtime-dir",
            str(self.dirs.runtime_dir),
            "--state-dir",
            str(self.dirs.state_dir),
            "--log-level",
            "INFO",
            *self.extra_args,
        ]

    def start(self, *, wait: bool = True) -> DaemonProcess:
        env = {**os.environ, "TMPDIR": str(self.dirs.private_tmp()), **self.env}
        env.pop("NOTIFY_SOCKET", None)
        self.log_path = self.dirs.base / f"daemon-{time.monotonic_ns()}.log"
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, text=True
            )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self) -> None:
        deadline_s = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline_s:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"perseusd exited with {self.proc.returncode}:\n{self.log()}")
            if (self.dirs.runtime_dir / "control.sock").exists():
                with contextlib.suppress(PerseusClientError):
                    self.status()
                    return
            time.sleep(0.05)
        raise AssertionError(f"perseusd not ready after {READY_TIMEOUT_S} s:\n{self.log()}")

    def status(self) -> dict[str, Any]:
        """`perseusctl status --json` as a dict (through the admin view, we are root)."""
        out = subprocess.run(
            [
                daemon_python(),
                "-m",
                "perseusd.ctl.main",
                "--runtime-dir",
                str(self.dirs.runtime_dir),
                "status",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
        )
        if out.returncode != 0:
            raise PerseusClientError("UNREACHABLE", out.stderr.strip())
        result: dict[str, Any] = json.loads(out.stdout)
        return result

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path and self.log_path.exists() else ""

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def wait(self, timeout_s: float = 15.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout_s)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM (the daemon restores GPUs and stops its solver worker), SIGKILL if it does not exit."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        self.kill()


@contextlib.contextmanager
def daemon_processes() -> Iterator[Callable[..., DaemonProcess]]:
    """A factory of daemon processes; every started one is stopped at the end (SIGTERM, then SIGKILL), so
    none leaves its solver worker behind."""
    started: list[DaemonProcess] = []

    def make(dirs: DaemonDirs, **kwargs: Any) -> DaemonProcess:
        daemon = DaemonProcess(dirs, **kwargs)
        started.append(daemon)
        return daemon

    try:
        yield make
    finally:
        for daemon in started:
            daemon.stop()
        for base in {daemon.dirs.base for daemon in started}:
            shutil.rmtree(base, ignore_errors=True)


def daemon_python() -> str:
    return os.environ.get(DAEMON_PYTHON_ENV) or sys.executable


def daemon_side(code: str, *args: str) -> str:
    """The output of `code` run by the daemon's interpreter in the repository (for tests whose own
    interpreter has only the client library: simulated GPUs' UUIDs, synthetic profiles)."""
    out = subprocess.run(
        [daemon_python(), "-c", code, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if out.returncode != 0:
        raise AssertionError(f"daemon-side code failed: {out.stderr[-2000:]}")
    return out.stdout


def sim_gpu_uuids(count: int, model: str = "a100_sxm") -> list[str]:
    """The UUIDs the simulated GPUs of `perseusd --backend sim` will have, known before any daemon runs."""
    code = (
        "import sys; from perseusd.gpu.sim import sim_uuid; "
        "print(*(sim_uuid(sys.argv[1], i) for i in range(int(sys.argv[2]))))"
    )
    return daemon_side(code, model, str(count)).split()


def sim_control(runtime_dir: Path, uuid: str) -> ControlState:
    """What the simulated GPU was last told, read straight from its shared-memory file."""
    from perseusd.gpu.sim_shared import StateMap, state_path

    state = StateMap(state_path(runtime_dir / "sim", uuid), writable=False)
    try:
        return state.read_control()
    finally:
        state.close()


CLIENT_SCRIPT = """
import sys, time
from perseus_client import PerseusClient
runtime_dir, clock, count, first = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
client = PerseusClient(runtime_dir, job="e2e-holder", strict=True)
gpus = [g.uuid for g in client.daemon_info.gpus][first : first + count]
client.claim(gpus)
for gpu in gpus:
    client.set_clock(gpu, clock)
print("ready", flush=True)
time.sleep(120)
"""


def start_lease_holder(
    runtime_dir: Path, clock_mhz: int, gpus: int = 1, first: int = 0
) -> subprocess.Popen[str]:
    """A client process that claims `gpus` GPUs from the `first`, locks their clocks, says "ready" and
    sleeps."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CLIENT_SCRIPT, str(runtime_dir), str(clock_mhz), str(gpus), str(first)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise AssertionError(f"lease holder failed: {line!r} {err}")
    return proc


@contextlib.contextmanager
def lease_holder(runtime_dir: Path, clock_mhz: int, gpus: int = 1) -> Iterator[subprocess.Popen[str]]:
    """`start_lease_holder`, stopped (`stop_process`) when the block ends, whatever happened in it."""
    holder = start_lease_holder(runtime_dir, clock_mhz, gpus)
    try:
        yield holder
    finally:
        stop_process(holder)


def stop_process(proc: subprocess.Popen[str]) -> None:
    """SIGKILL (if still running), reap, and close the pipes."""
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=10)


def run_as_user(
    fn: Callable[[], Any], uid: int = NOBODY_UID, gid: int = NOBODY_GID, timeout_s: float = 20
) -> Any:
    """Run `fn` in a forked child that dropped to `uid`/`gid`; returns its result (or raises its error).

    A fork rather than `subprocess(user=...)`: the interpreter may live where `nobody` cannot execute it.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop privileges, run, report, never return into pytest
        os.close(read_fd)
        signal.alarm(int(timeout_s))  # a hung child dies, which ends the parent's read
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            payload = ("ok", fn())
        except BaseException as exc:
            payload = ("error", f"{type(exc).__name__}: {exc}")
        with os.fdopen(write_fd, "wb") as out:
            pickle.dump(payload, out)
        os._exit(0)
    os.close(write_fd)
    deadline_s = time.monotonic() + timeout_s
    with os.fdopen(read_fd, "rb") as inp:
        data = inp.read()
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline_s:
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    kind, value = pickle.loads(data)
    if kind == "error":
        raise AssertionError(f"child as uid {uid} failed: {value}")
    return value


def client_outcome(runtime_dir: Path, action: Callable[[PerseusClient], Any]) -> tuple[str, Any]:
    """("ok", result) or (error code, message) of running `action` on a fresh client."""
    try:
        with PerseusClient(runtime_dir, job="probe", timeout_s=10.0, strict=True) as client:
            return "ok", action(client)
    except PerseusClientError as exc:
        return exc.code, exc.message


def flood_as_nobody(path: str, count: int, kind: int = socket.SOCK_STREAM) -> tuple[int, int]:
    """Fork a child that drops to nobody and opens up to `count` Unix connections of `kind` to `path`,
    holding them for 60 s; (its pid, the read end of a pipe on which it writes how many it holds)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        signal.alarm(60)
        try:
            os.setgroups([])
            os.setgid(NOBODY_GID)
            os.setuid(NOBODY_UID)
            held = []
            for _ in range(count):
                conn = socket.socket(socket.AF_UNIX, kind)
                try:
                    conn.connect(path)
                except OSError:
                    conn.close()
                    continue
                held.append(conn)
            os.write(write_fd, f"{len(held)}\n".encode())
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(write_fd)
    return pid, read_fd
