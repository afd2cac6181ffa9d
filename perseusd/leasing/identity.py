"""Who is calling: the kernel-attested peer credentials of a message, and process liveness checks."""

from __future__ import annotations

import errno
import grp
import os
import pwd
from dataclasses import dataclass

from perseusd.errors import LimitReachedError, NotRegisteredError


@dataclass(frozen=True)
class Caller:
    """A peer process as the kernel reported it (SO_PEERCRED); never taken from a request."""

    uid: int
    gid: int
    pid: int


def parse_peer_address(address: str) -> Caller | None:
    """Parse ZeroMQ's `Peer-Address` / ZAP `Address` of an ipc peer: ``localhost:uid:gid:pid``."""
    parts = address.split(":")
    if len(parts) != 4:
        return None
    try:
        uid, gid, pid = int(parts[1]), int(parts[2]), int(parts[3])
    except ValueError:
        return None
    if uid < 0 or gid < 0 or pid <= 0:
        return None
    return Caller(uid=uid, gid=gid, pid=pid)


def process_start_time(pid: int) -> int | None:
    """The start time of a live process (clock ticks since boot, /proc/<pid>/stat field 22).

    None when the process does not exist or is a zombie: used for the PID-reuse check.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    return _start_time_of(stat)


def _start_time_of(stat: bytes) -> int | None:
    fields = stat[stat.rfind(b")") + 2 :].split()
    if not fields or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


class DescriptorsExhaustedError(OSError):
    """The daemon is out of file descriptors (EMFILE/ENFILE): not a sign that a process is gone."""


def read_start_time(pid: int) -> int | None:
    """Like `process_start_time`, but raises `DescriptorsExhaustedError` when /proc cannot be opened for
    lack of descriptors (None still means: no such process, or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            raise DescriptorsExhaustedError(exc.errno, f"no descriptor to read /proc/{pid}") from None
        return None
    return _start_time_of(stat)


def out_of_descriptors(exc: OSError) -> LimitReachedError:
    """The error a client gets while the daemon has no file descriptor left (LIMIT: retry later)."""
    return LimitReachedError(f"perseusd is out of descriptors ({exc.strerror}); retry later")


def checked_start_time(pid: int) -> int:
    """The start time of a live process for registering it; raises `NotRegisteredError` when the
    process is gone, `LimitReachedError` when the daemon is out of descriptors."""
    try:
        start_time = read_start_time(pid)
    except DescriptorsExhaustedError as exc:
        raise out_of_descriptors(exc) from None
    if start_time is None:
        raise NotRegisteredError(f"process {pid} is gone")
    return start_time


def same_process_alive(pid: int, start_time: int) -> bool:
    """True when `pid` is alive and is still the process that started at `start_time` (no PID reuse)."""
    return process_start_time(pid) == start_time


def group_id(name: str) -> int | None:
    """The gid of a group, or None when the group does not exist. A number is taken as a gid (a container
    image, a DaemonSet's, may not name the node's groups)."""
    if name.isdigit():
        return int(name)
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def in_group(caller: Caller, gid: int | None) -> bool:
    """True when the caller's primary or supplementary groups include `gid`."""
    if gid is None:
        return False
    if caller.gid == gid:
        return True
    try:
        user = pwd.getpwuid(caller.uid).pw_name
    except KeyError:
        return False
    return gid in os.getgrouplist(user, caller.gid)
