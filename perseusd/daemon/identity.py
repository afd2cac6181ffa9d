"""Who is calling: the kernel-attested peer credentials of a message, and process liveness checks."""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass


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
    fields = stat[stat.rfind(b")") + 2 :].split()
    if not fields or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def same_process_alive(pid: int, start_time: int) -> bool:
    """True when `pid` is alive and is still the process that started at `start_time` (no PID reuse)."""
    return process_start_time(pid) == start_time


def group_id(name: str) -> int | None:
    """The gid of a group, or None when the group does not exist."""
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
