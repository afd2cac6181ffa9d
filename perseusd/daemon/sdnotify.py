"""The daemon's side of systemd's service protocol: readiness and watchdog notifications, journal logging.

Uses systemd-python (`systemd.daemon`, `systemd.journal`) where it is installed and falls back to plain
stdlib code otherwise, so the daemon runs the same with or without it. Outside systemd (no
`$NOTIFY_SOCKET`) every call is a cheap no-op.

The notify protocol is one datagram of `KEY=VALUE` lines sent to the AF_UNIX socket named in
`$NOTIFY_SOCKET`; a name starting with `@` is in the abstract namespace. See sd_notify(3).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

NOTIFY_SOCKET_ENV = "NOTIFY_SOCKET"
WATCHDOG_USEC_ENV = "WATCHDOG_USEC"
WATCHDOG_PID_ENV = "WATCHDOG_PID"
_SEND_TIMEOUT_S = 1.0

logger = logging.getLogger(__name__)


def _socket_address(name: str) -> str | bytes | None:
    """The address to send to for a `$NOTIFY_SOCKET` value, or None when it is not a unix socket name."""
    if name.startswith("@"):
        return b"\0" + name[1:].encode()
    if name.startswith("/"):
        return name
    return None


def _notify_stdlib(message: str, name: str) -> bool:
    address = _socket_address(name)
    if address is None:
        logger.warning(
            "ignoring %s=%r: not an absolute path or abstract socket name", NOTIFY_SOCKET_ENV, name
        )
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(_SEND_TIMEOUT_S)
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError as exc:
        logger.warning("sd_notify to %s failed: %s", name, exc)
        return False
    return True


def _notify_systemd_python(message: str) -> bool | None:
    """Send through systemd-python; None when it is not installed."""
    try:
        import systemd.daemon
    except ImportError:
        return None
    try:
        return bool(systemd.daemon.notify(message))
    except OSError as exc:
        logger.warning("sd_notify failed: %s", exc)
        return False


def notify(message: str) -> bool:
    """Send `message` (e.g. "READY=1", "WATCHDOG=1", "STATUS=...") to systemd.

    Returns True when it was sent, False when not running under systemd (no `$NOTIFY_SOCKET`) or the send
    failed. Never raises for a missing or unreachable socket.
    """
    name = os.environ.get(NOTIFY_SOCKET_ENV)
    if not name:
        return False
    sent = _notify_systemd_python(message)
    if sent is None:
        sent = _notify_stdlib(message, name)
    return sent


def watchdog_interval_s(environ: Mapping[str, str] | None = None) -> float | None:
    """The watchdog timeout systemd set for this process (`WatchdogSec=`), in seconds, or None.

    None when no watchdog is configured, the value is malformed, or `$WATCHDOG_PID` names another process.
    Send "WATCHDOG=1" at least every half of this interval.
    """
    env = os.environ if environ is None else environ
    usec = env.get(WATCHDOG_USEC_ENV)
    if not usec:
        return None
    pid = env.get(WATCHDOG_PID_ENV)
    if pid and pid.strip() != str(os.getpid()):
        return None
    try:
        value_us = int(usec)
    except ValueError:
        logger.warning("ignoring malformed %s=%r", WATCHDOG_USEC_ENV, usec)
        return None
    return value_us / 1e6 if value_us > 0 else None


def _under_systemd(environ: Mapping[str, str]) -> bool:
    return bool(environ.get("JOURNAL_STREAM") or environ.get("INVOCATION_ID"))


def journal_handler(environ: Mapping[str, str] | None = None) -> logging.Handler | None:
    """A logging handler writing straight to the journal, or None.

    Returned only when systemd-python is installed and the process runs under systemd (`$JOURNAL_STREAM`
    or `$INVOCATION_ID` set); otherwise the caller keeps logging to stderr, which systemd also collects.
    """
    env = os.environ if environ is None else environ
    if not _under_systemd(env):
        return None
    try:
        from systemd.journal import JournalHandler
    except ImportError:
        return None
    handler: logging.Handler = JournalHandler(SYSLOG_IDENTIFIER="perseusd")
    return handler
