"""A container made of real namespaces with unshare(1), setpriv(1) and nsenter(1), for end-to-end tests.

`container_command` wraps a command so that it runs the way a rootless container runtime runs it:

- a mount namespace (set up by root, as a container runtime does) with its own `/dev` holding only the GPU
  device nodes it is given (char 195:N, the host GPU's minor) and /dev/null, its own `/run` with the host's
  runtime directory bind-mounted at `/run/perseusd`, and the host interpreter reachable;
- a user namespace in which it is uid 0, mapped to an unprivileged host uid (`CONTAINER_UID`) whose group is
  the daemon's socket group (nogroup in the tests);
- its own pid namespace (it is pid 1 there) with its own /proc, and its own cgroup namespace.

`enter_command` runs a second command inside the same namespaces (nsenter), like `podman exec`.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

CONTAINER_UID = 100_000
"""The unprivileged host uid the container's root is mapped to."""
SOCKET_GID = 65_534
"""nogroup: the daemon's socket group in these tests."""
RUNTIME_INSIDE = "/run/perseusd"
REQUIRED_TOOLS = ("unshare", "setpriv", "nsenter", "mknod")


def missing_requirement() -> str | None:
    """Why the namespace tests cannot run here (None: they can)."""
    if os.geteuid() != 0:
        return "needs root (sets up mount namespaces and device nodes like a container runtime)"
    for tool in REQUIRED_TOOLS:
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True, check=False).returncode:
            return f"{tool} is not installed (util-linux)"
    return None


def _hidden_prefix() -> Path | None:
    """The top directory above the interpreter that an unprivileged user cannot enter (/root for pyenv)."""
    prefix = Path(sys.base_prefix).resolve()
    for parent in reversed(prefix.parents):
        if parent != Path("/") and not os.stat(parent).st_mode & 0o001:
            return parent
    return None


def _setup_script(runtime_dir: Path, minors: Sequence[int], stash: Path) -> str:
    """The root half: what a container runtime prepares before it drops into the user namespace."""
    q = shlex.quote
    lines = [
        "set -e",
        f"mkdir -p {q(str(stash))}",
        f"mount --bind {q(str(runtime_dir))} {q(str(stash))}",
        "mount -t tmpfs -o mode=0755 perseus-run /run",
        f"mkdir -p {RUNTIME_INSIDE}",
        f"mount --bind {q(str(stash))} {RUNTIME_INSIDE}",
        "mount -t tmpfs -o mode=0755 perseus-dev /dev",
        "mknod -m 666 /dev/null c 1 3",
        "mknod -m 666 /dev/urandom c 1 9",
        "mkdir -m 1777 /dev/shm",
        "mount -t tmpfs -o mode=1777 perseus-shm /dev/shm",
    ]
    lines += [f"mknod -m 666 /dev/nvidia{minor} c 195 {minor}" for minor in minors]
    return "\n".join([*lines, *_interpreter_mounts(stash)])


def _interpreter_mounts(stash: Path) -> list[str]:
    """Where the interpreter lives under a 0700 directory (pyenv under /root): shell lines that hide that
    directory behind a tmpfs and bind the interpreter's prefix alone back at its own path."""
    hidden = _hidden_prefix()
    if hidden is None:
        return []
    q = shlex.quote
    prefix = Path(sys.base_prefix).resolve()
    keep = stash.with_name(stash.name + "-python")
    return [
        f"mkdir -p {q(str(keep))}",
        f"mount --bind {q(str(prefix))} {q(str(keep))}",
        f"mount -t tmpfs -o mode=0755 perseus-hide {q(str(hidden))}",
        f"mkdir -p {q(str(prefix))}",
        f"mount --bind {q(str(keep))} {q(str(prefix))}",
    ]


def unprivileged_command(command: Sequence[str], uid: int, gid: int, scratch: Path) -> list[str]:
    """`command` as `uid`:`gid` with no capability and no way to gain one (the interpreter kept reachable)."""
    drop = [
        "setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
        "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--", *command,
    ]  # fmt: skip
    script = "\n".join(["set -e", *_interpreter_mounts(scratch / "stash"), "exec " + shlex.join(drop)])
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script]


def container_command(
    command: Sequence[str], runtime_dir: Path, minors: Sequence[int], scratch: Path, *, time_offset_s: int = 0
) -> list[str]:
    """`command` run in a fresh container of real namespaces holding GPU device nodes `minors`."""
    inner = [
        "setpriv",
        f"--reuid={CONTAINER_UID}",
        f"--regid={SOCKET_GID}",
        "--clear-groups",
        "unshare",
        "--user",
        "--map-root-user",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount",
        "--mount-proc",
        "--cgroup",
    ]
    if time_offset_s:
        inner += ["--time", f"--monotonic={time_offset_s}", f"--boottime={time_offset_s}"]
    inner += ["--", *command]
    script = _setup_script(runtime_dir, minors, scratch / "stash") + "\nexec " + shlex.join(inner)
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script]


def container_pid(launcher: subprocess.Popen[str], timeout_s: float = 10.0) -> int:
    """The host pid of the container's pid 1 (the child that `unshare --fork` made)."""
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:
        children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children")
        try:
            pids = children.read_text().split()
        except OSError:
            pids = []
        if pids:
            return int(pids[0])
        if launcher.poll() is not None:
            raise AssertionError(f"the container exited with {launcher.returncode}")
        time.sleep(0.02)
    raise AssertionError("the container's first process did not start")


def enter_command(pid: int, command: Sequence[str]) -> list[str]:
    """`command` run inside the namespaces of container process `pid` as its root (like `podman exec`)."""
    return [
        "nsenter",
        f"--target={pid}",
        "--user",
        "--mount",
        "--pid",
        "--cgroup",
        "--setuid=0",
        "--setgid=0",
        f"--wd={os.getcwd()}",
        "--",
        *command,
    ]
