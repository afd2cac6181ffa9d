"""Where perseusd is, and why it cannot be reached (stdlib only; shared by the client and perseusctl).

One environment variable says where the daemon's sockets are, for the client library, the framework
integrations and `perseusctl` alike: `PERSEUSD_RUNTIME_DIR` (default `/run/perseusd`, the systemd unit's
`RuntimeDirectory=`). An explicit argument (`PerseusClient(runtime_dir=...)`, `perseusctl --runtime-dir`)
wins over it.

When a connection fails, `diagnose` looks at the directory and the socket (a stat and one plain
`connect()`, never on the hot path) and names the cause in one of four ways, each saying what to do:

- `NoPermission`: the directory or the socket is closed to this user: which group to join, for which socket.
- `NotRunning`: the directory is there but no daemon listens on it (no socket, or a stale one).
- `WrongRuntimeDir`: nothing of perseusd's is where the caller looked.
- (version mismatch is told by the daemon's own reply: `perseus_client.version.unsupported_major`.)
"""

from __future__ import annotations

import errno
import grp
import os
import socket
import stat

RUNTIME_DIR_ENV = "PERSEUSD_RUNTIME_DIR"
"""The daemon's runtime directory, for every client-side tool (an explicit argument wins)."""
DEFAULT_RUNTIME_DIR = "/run/perseusd"
STRICT_ENV = "PERSEUSD_CLIENT_STRICT"
"""Set to 1 (true, yes): `PerseusClient` raises when the daemon is unreachable, instead of failing open."""
USER_GROUP = "perseus"
ADMIN_GROUP = "perseus-admin"
_SOCKETS = ("control.sock", "events.sock", "admin.sock")
_TRUE = frozenset(("1", "true", "yes", "on"))


def runtime_dir(given: str | os.PathLike[str] | None = None) -> str:
    """The runtime directory to use: `given`, else `$PERSEUSD_RUNTIME_DIR`, else `/run/perseusd`."""
    if given is not None and str(given):
        return os.fspath(given)
    return os.environ.get(RUNTIME_DIR_ENV) or DEFAULT_RUNTIME_DIR


def strict_from_env() -> bool:
    """Whether `$PERSEUSD_CLIENT_STRICT` asks for strict clients."""
    return os.environ.get(STRICT_ENV, "").strip().lower() in _TRUE


class Unreachable:
    """Why the daemon cannot be reached: a stable `code` (as `PerseusClientError.code`) and a message."""

    code = "UNREACHABLE"
    kind = ""

    def __init__(self, message: str) -> None:
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class NoPermission(Unreachable):
    code = "PERMISSION_DENIED"
    kind = "no permission"


class NotRunning(Unreachable):
    kind = "not running"


class WrongRuntimeDir(Unreachable):
    kind = "wrong runtime directory"


class NotAnswering(Unreachable):
    kind = "not answering"


def diagnose(directory: str, socket_name: str, group: str = USER_GROUP) -> Unreachable:
    """The cause of a failed connection to `directory/socket_name` (`group`: who may use that socket)."""
    path = os.path.join(directory, socket_name)
    try:
        info = os.stat(directory)
    except PermissionError:
        return _no_permission(_closed_parent(directory), path, group)
    except OSError:
        return _missing_directory(directory, socket_name)
    if not stat.S_ISDIR(info.st_mode):
        return WrongRuntimeDir(f"no {path}: {directory} is not a directory; {_where_hint(directory)}")
    if not os.access(directory, os.X_OK):
        return _no_permission(directory, path, group)
    return _probe_socket(directory, path, group)


def refused_by_daemon(path: str, group: str = USER_GROUP) -> NoPermission:
    """The daemon itself refused this user (its check of the caller's uid and groups at connect)."""
    return NoPermission(
        f"perseusd refused this user on {path}: join group {group} "
        f"(sudo usermod -aG {group} $USER, then log in again) or ask an admin"
    )


def _probe_socket(directory: str, path: str, group: str) -> Unreachable:
    try:
        info = os.stat(path)
    except PermissionError:
        return _no_permission(directory, path, group)
    except OSError:
        if directory != DEFAULT_RUNTIME_DIR and not _holds_perseusd_files(directory):
            return WrongRuntimeDir(
                f"no {path}: {directory} holds no perseusd socket; {_where_hint(directory)}"
            )
        return NotRunning(
            f"perseusd is not running: {path} does not exist "
            "(systemctl status perseusd; journalctl -u perseusd)"
        )
    if not stat.S_ISSOCK(info.st_mode):
        return WrongRuntimeDir(f"{path} is not a socket; {_where_hint(directory)}")
    if not os.access(path, os.R_OK | os.W_OK):
        return _no_permission(path, path, group)
    return _probe_connect(path, group)


def _probe_connect(path: str, group: str) -> Unreachable:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except PermissionError:
        return _no_permission(path, path, group)
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            return NotRunning(
                f"perseusd is not running: nothing listens on {path} (a socket left by a daemon that died; "
                "systemctl status perseusd; journalctl -u perseusd)"
            )
        return NotAnswering(f"cannot connect to {path}: {exc.strerror or exc}")
    finally:
        probe.close()
    return NotAnswering(
        f"perseusd does not answer on {path} (busy or stuck, or this user is over its connection limit: "
        "look for 'refused a connection' in journalctl -u perseusd)"
    )


def _missing_directory(directory: str, socket_name: str) -> Unreachable:
    if directory == DEFAULT_RUNTIME_DIR:  # systemd removes it when the service stops
        return NotRunning(
            f"perseusd is not running: {directory} does not exist (systemctl start perseusd; or, if it runs "
            f"elsewhere, set {RUNTIME_DIR_ENV} to its runtime directory)"
        )
    return WrongRuntimeDir(
        f"no {os.path.join(directory, socket_name)}: {directory} does not exist; {_where_hint(directory)}"
    )


def _where_hint(directory: str) -> str:
    """What to do about a runtime directory that is not the daemon's."""
    hint = (
        f"a wrong runtime directory? Set {RUNTIME_DIR_ENV} (or runtime_dir=, --runtime-dir) to perseusd's "
        f"runtime_dir (/etc/perseusd/perseusd.toml; default {DEFAULT_RUNTIME_DIR}"
    )
    if directory != DEFAULT_RUNTIME_DIR and _holds_perseusd_files(DEFAULT_RUNTIME_DIR):
        hint += ", where a daemon runs"
    return hint + ")"


def _holds_perseusd_files(directory: str) -> bool:
    try:
        names = os.listdir(directory)
    except PermissionError:
        return True  # closed to us: only perseusd's directory is (0750, group perseus)
    except OSError:
        return False
    return any(name in names for name in _SOCKETS)


def _closed_parent(directory: str) -> str:
    """The first directory on the way to `directory` this user cannot enter."""
    current = os.path.dirname(os.path.abspath(directory))
    parents = []
    while current and current != os.path.dirname(current):
        parents.append(current)
        current = os.path.dirname(current)
    for parent in reversed(parents):
        if not os.access(parent, os.X_OK):
            return parent
    return directory


def _no_permission(closed: str, path: str, group: str) -> NoPermission:
    """`closed` (the runtime directory or the socket) refuses this user: name its group."""
    owner_group = _group_of(closed) or group
    needed = group if owner_group in ("root", "") else owner_group
    also = f" (and {USER_GROUP}, to enter {os.path.dirname(path)})" if needed == ADMIN_GROUP else ""
    what = "open" if closed == path else "enter"
    return NoPermission(
        f"no permission to use {path}: this user may not {what} {closed}; join group {needed}{also} "
        f"(sudo usermod -aG {needed} $USER, then log in again) or ask an admin"
    )


def _group_of(path: str) -> str:
    try:
        return grp.getgrgid(os.stat(path).st_gid).gr_name
    except (OSError, KeyError):
        return ""
