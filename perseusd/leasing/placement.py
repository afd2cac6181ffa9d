"""Where a calling process runs, read from /proc by the host pid the kernel reported (SO_PEERCRED).

A process in a container (its own mount, pid, user and cgroup namespaces) is seen by the daemon through its
host pid. From that pid the daemon reads what the kernel says about it, never what the process says:

- its mount namespace, compared with the daemon's own and the host's (init's): another one means a
  container;
- the NVIDIA GPU device nodes (char major 195) under its root's `/dev`: the GPUs its container holds;
- its cgroup (`/proc/<pid>/cgroup`) and, where the host runs the cgroup v1 devices controller, the devices
  its cgroup may open (`devices.list`);
- its time namespace's clock offsets (`/proc/<pid>/timens_offsets`);
- its pid inside its own pid namespace (`NSpid` in `/proc/<pid>/status`), for the logs;
- the Slurm job it belongs to: from its cgroup path (`.../job_<id>/step_<n>/...`, written by slurmd, which
  the process cannot leave), else from the `SLURM_JOB_ID` its environment started with (a hint the process
  could have set itself: the source is kept beside the id).

Reading another user's `/proc/<pid>/root` and environment takes ptrace read access (the daemon runs as root
with CAP_SYS_PTRACE); what cannot be read is None (unknown), never a guess.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from perseusd.gpu.backend import NVIDIA_MAJOR

logger = logging.getLogger(__name__)

PROC = Path("/proc")
CGROUP_V1_DEVICES = Path("/sys/fs/cgroup/devices")
_NVIDIA_NODE = re.compile(r"nvidia\d+")
_SLURM_JOB = re.compile(r"/job_(\d+)(?:/|$)")
CTL_MINOR = 255
"""/dev/nvidiactl (195:255) and the modeset node (195:254) are not GPUs."""
ENVIRONMENT_KEYS = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID", "SLURM_STEP_ID")
MAX_ENVIRON_BYTES = 1 << 20


@dataclass(frozen=True)
class DeviceRule:
    """One line of a cgroup v1 `devices.list`: `c 195:3 rw`, with None for `*`."""

    kind: str
    """"a" (all), "c" (char) or "b" (block)."""
    major: int | None
    minor: int | None
    access: str

    def allows_gpu(self, minor: int) -> bool:
        """Whether this rule lets the cgroup read and write GPU device node 195:`minor`."""
        if self.kind not in ("a", "c"):
            return False
        if self.major not in (None, NVIDIA_MAJOR) or self.minor not in (None, minor):
            return False
        return "r" in self.access and "w" in self.access


@dataclass(frozen=True)
class Placement:
    """What the kernel says about where a process runs. None: could not be read (unknown)."""

    pid: int
    """The host pid (the kernel's)."""
    containerized: bool | None
    """In another mount namespace than the daemon's (a container); None: unknown."""
    ns_pid: int | None
    """Its pid in its own pid namespace (equal to `pid` on the host)."""
    cgroup: str | None
    """Its cgroup path: the unified hierarchy's, else the first controller's."""
    device_minors: frozenset[int] | None
    """Minors of the GPU device nodes (`/dev/nvidia<N>`, char 195:N) under its root; None: a host process
    (same mount namespace as the daemon) or unreadable."""
    device_rules: tuple[DeviceRule, ...] | None
    """Its cgroup v1 devices controller's rules; None: no such controller, or unreadable."""
    monotonic_offset_ns: int
    """Its time namespace's CLOCK_MONOTONIC and CLOCK_BOOTTIME offsets, the larger in magnitude (0: none)."""
    environment: dict[str, str] | None
    """`ENVIRONMENT_KEYS` of its initial environment (set by the container runtime or Slurm, or by the
    process itself: a hint, never a permission); None: unreadable."""
    slurm_job: int | None = None
    """The Slurm job it runs in (None: none found)."""
    slurm_job_source: str = ""
    """Where `slurm_job` was read: "cgroup" (slurmd's, authoritative) or "environment" (a hint)."""

    def gpu_allowed(self, minor: int) -> bool | None:
        """Whether its container and cgroup let it use GPU device 195:`minor` (None: nothing restricts it
        that the daemon can see)."""
        verdict: bool | None = None
        if self.device_minors is not None:
            verdict = minor in self.device_minors
        if self.device_rules is not None and not any(r.allows_gpu(minor) for r in self.device_rules):
            verdict = False
        return verdict


def read_placement(pid: int, *, proc: Path = PROC, devices_root: Path = CGROUP_V1_DEVICES) -> Placement:
    """Read where process `pid` (a host pid) runs; never raises (unknown parts are None)."""
    base = proc / str(pid)
    containerized = _other_mount_namespace(base, proc)
    cgroups = _cgroups(base)
    environment = _environment(base)
    slurm_job, slurm_source = slurm_job_of(cgroups, environment)
    return Placement(
        pid=pid,
        containerized=containerized,
        ns_pid=_ns_pid(base),
        cgroup=_main_cgroup(cgroups),
        device_minors=_device_minors(base) if containerized else None,
        device_rules=_device_rules(cgroups, devices_root),
        monotonic_offset_ns=_time_offset_ns(base),
        environment=environment,
        slurm_job=slurm_job,
        slurm_job_source=slurm_source,
    )


def slurm_job_of(
    cgroups: dict[str, str] | None, environment: dict[str, str] | None
) -> tuple[int | None, str]:
    """(job id, "cgroup" | "environment") of a Slurm job, or (None, "")."""
    for path in (cgroups or {}).values():
        if "slurm" in path:
            match = _SLURM_JOB.search(path)
            if match:
                return int(match.group(1)), "cgroup"
    value = (environment or {}).get("SLURM_JOB_ID", "")
    if value.isdigit():
        return int(value), "environment"
    return None, ""


def _other_mount_namespace(base: Path, proc: Path) -> bool | None:
    """Whether the process's mount namespace is neither the daemon's nor the host's (init's): a systemd unit
    with PrivateMounts= runs the daemon in a mount namespace of its own, and host processes are no
    containers."""
    try:
        theirs = os.stat(base / "ns" / "mnt").st_ino
        host = {os.stat(proc / "self" / "ns" / "mnt").st_ino}
    except OSError:
        return None
    # init's may not be readable (the daemon in a container without hostPID): its own counts then
    with contextlib.suppress(OSError):
        host.add(os.stat(proc / "1" / "ns" / "mnt").st_ino)
    return theirs not in host


def _ns_pid(base: Path) -> int | None:
    try:
        text = (base / "status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            fields = line.split()[1:]
            return int(fields[-1]) if fields else None
    return None


def _cgroups(base: Path) -> dict[str, str] | None:
    """controller -> path ("" for the unified hierarchy) from /proc/<pid>/cgroup."""
    try:
        text = (base / "cgroup").read_text()
    except OSError:
        return None
    found: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                found.setdefault(controller, parts[2])
    return found


def _main_cgroup(cgroups: dict[str, str] | None) -> str | None:
    if not cgroups:
        return None
    unified = cgroups.get("")
    if unified not in (None, "/"):
        return unified
    return cgroups.get("devices") or cgroups.get("name=systemd") or unified


def _device_minors(base: Path) -> frozenset[int] | None:
    dev = base / "root" / "dev"
    try:
        names = os.listdir(dev)
    except OSError:
        return None
    minors = set()
    for name in names:
        if not _NVIDIA_NODE.fullmatch(name):
            continue
        try:
            info = os.stat(dev / name)
        except OSError:
            continue
        if stat.S_ISCHR(info.st_mode) and os.major(info.st_rdev) == NVIDIA_MAJOR:
            minor = os.minor(info.st_rdev)
            if minor < CTL_MINOR - 1:
                minors.add(minor)
    return frozenset(minors)


def parse_device_rules(text: str) -> tuple[DeviceRule, ...]:
    """Parse a cgroup v1 `devices.list` ("a *:* rwm", "c 195:0 rw", ...); malformed lines are skipped."""
    rules = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 3 or parts[0] not in ("a", "b", "c") or ":" not in parts[1]:
            continue
        major_text, minor_text = parts[1].split(":", 1)
        try:
            major = None if major_text == "*" else int(major_text)
            minor = None if minor_text == "*" else int(minor_text)
        except ValueError:
            continue
        rules.append(DeviceRule(parts[0], major, minor, parts[2]))
    return tuple(rules)


def _device_rules(cgroups: dict[str, str] | None, devices_root: Path) -> tuple[DeviceRule, ...] | None:
    if not cgroups or "devices" not in cgroups:
        return None
    try:
        text = (devices_root / cgroups["devices"].lstrip("/") / "devices.list").read_text()
    except OSError:
        return None
    return parse_device_rules(text)


def _time_offset_ns(base: Path) -> int:
    try:
        text = (base / "timens_offsets").read_text()
    except OSError:
        return 0
    largest = 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] in ("monotonic", "boottime", "1", "7"):
            try:
                offset_ns = int(parts[1]) * 1_000_000_000 + int(parts[2])
            except ValueError:
                continue
            if abs(offset_ns) > abs(largest):
                largest = offset_ns
    return largest


def _environment(base: Path) -> dict[str, str] | None:
    try:
        with (base / "environ").open("rb") as handle:
            raw = handle.read(MAX_ENVIRON_BYTES)
    except OSError:
        return None
    found = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        name = key.decode(errors="replace")
        if sep and name in ENVIRONMENT_KEYS:
            found[name] = value.decode(errors="replace")
    return found
