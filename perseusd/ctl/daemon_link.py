"""How perseusctl talks to a running perseusd: one request, one reply, a timeout, typed errors; jobs and
the documents the daemon sends about them (loaded as strictly as files).

The request goes over a pyzmq DEALER socket, exchanged by the client library's own control link
(`perseus_client.link.request_reply`: the reply's id, the minor fallback, tolerant decoding). Before it, a
socket monitor follows the ZeroMQ handshake, so that a daemon that refuses this user (its ZAP handler), a peer
that is not a daemon and a socket nobody listens on are each told at once rather than after the timeout.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, TypeVar

import zmq
from perseus_client import reach
from perseus_client.envelope import ADMIN_SOCKET_NAME, CONTROL_SOCKET_NAME, DEFAULT_MAX_FRAME_BYTES
from perseus_client.link import PerseusClientError, monitor_event, request_reply
from perseus_client.message import Message

from perseusd.errors import PerseusError

if TYPE_CHECKING:
    from os import PathLike
    from typing import TypeAlias

    from perseus_client.job_info import JobInfo
    from perseus_client.job_messages import FrontierRequest, PlanRequest

    from perseusd.planner.plan import Frontier, Plan

    StrPath: TypeAlias = str | PathLike[str]
    """A runtime directory as a string or a path."""

M = TypeVar("M", bound=Message)

DOCUMENT_TIMEOUT_S = 10.0
"""Frontier documents of large jobs are megabytes: more time than a small request."""
MAX_REPLY_BYTES = 64 * DEFAULT_MAX_FRAME_BYTES
"""A frontier document of a large job is megabytes; a reply frame far beyond is not a reply (libzmq drops
the connection at this size, `zmq.MAXMSGSIZE`, as the daemon does for its requests)."""
LINK_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_CONNECT_RETRIED
)
"""What the monitor reports: the link is up, or why it is not, or that it went down."""

EXIT_FAILED = 1
EXIT_UNREACHABLE = 2


class DaemonUnreachableError(PerseusError):
    """perseusd does not answer (not running, wrong --runtime-dir, or no permission on its sockets); the
    message says which (`perseus_client.reach.diagnose`)."""

    exit_code = EXIT_UNREACHABLE


class DaemonRequestError(PerseusError):
    """perseusd answered with an error."""

    exit_code = EXIT_FAILED

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class _HandshakeRefusedError(Exception):
    """The daemon's handshake refused this caller (its ZAP handler: not in the allowed groups)."""


class _NoLinkError(Exception):
    """The socket does not answer as a ZeroMQ peer (nothing listens, not ZeroMQ, or a timeout)."""


def admin_socket_usable(runtime_dir: StrPath) -> bool:
    """True when this user may open the admin socket (root or group perseus-admin)."""
    return os.access(os.path.join(runtime_dir, ADMIN_SOCKET_NAME), os.W_OK)


def ask(
    runtime_dir: StrPath, request: Message, expected: type[M], *, admin: bool, timeout_s: float = 3.0
) -> M:
    """Send `request` to the control (or admin) socket and return the typed reply."""
    name = ADMIN_SOCKET_NAME if admin else CONTROL_SOCKET_NAME
    path = os.path.join(runtime_dir, name)
    group = reach.ADMIN_GROUP if admin else reach.USER_GROUP
    if not os.access(path, os.W_OK):  # absent, closed to this user, or elsewhere: say which
        raise DaemonUnreachableError(_diagnosis(path, group))
    _check_owner(path)
    try:
        with _Link(path, timeout_s) as link:
            return link.exchange(request, expected)
    except _HandshakeRefusedError:
        raise DaemonUnreachableError(reach.refused_by_daemon(path, group).message) from None
    except _NoLinkError as exc:
        raise DaemonUnreachableError(_diagnosis(path, group, f"perseusd: {exc}")) from None
    except PerseusClientError as exc:
        if not exc.reached:
            raise DaemonUnreachableError(_diagnosis(path, group, f"perseusd: {exc.message}")) from None
        raise DaemonRequestError(exc.code, exc.message) from None


def _check_owner(path: str) -> None:
    """Talk only to a socket of root, of this user, or of the user owning its directory (a daemon run as its
    own user makes both): libzmq holds a multipart reply whole before perseusctl sees its first frame, so a
    reply's total size cannot be capped here, and another user's process that owns the socket path in a
    directory it does not own (a shared one) could stream one without end into this process's memory."""
    try:
        owner = os.stat(path).st_uid
        directory_owner = os.stat(os.path.dirname(path) or ".").st_uid
    except OSError as exc:
        raise DaemonUnreachableError(f"cannot stat {path}: {exc}") from None
    if owner not in (0, os.geteuid(), directory_owner):
        raise DaemonUnreachableError(
            f"{path} belongs to uid {owner}, neither root, you, nor its directory's owner (uid "
            f"{directory_owner}): perseusctl does not talk to it (check --runtime-dir, PERSEUSD_RUNTIME_DIR)"
        )


def _diagnosis(path: str, group: str, answering: str | None = None) -> str:
    """Why `path` cannot be used (`reach.diagnose`); `answering` when something does listen there."""
    cause = reach.diagnose(os.path.dirname(path), os.path.basename(path), group)
    return answering if answering is not None and isinstance(cause, reach.NotAnswering) else cause.message


class _Link:
    """A DEALER socket connected to one of the daemon's sockets, and its monitor; closed on exit."""

    def __init__(self, path: str, timeout_s: float) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self.deadline_s = time.monotonic() + timeout_s
        self._context: zmq.Context[Any] = zmq.Context()
        try:
            self._sock = self._context.socket(zmq.DEALER)
            self._sock.setsockopt(zmq.LINGER, 0)
            self._sock.setsockopt(zmq.IMMEDIATE, 1)
            self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_REPLY_BYTES)
            self._monitor = self._sock.get_monitor_socket(LINK_EVENTS)
            self._sock.connect(f"ipc://{path}")
        except zmq.ZMQError as exc:  # a path longer than a socket address holds, say
            self._context.destroy(linger=0)
            raise _NoLinkError(f"cannot connect to {path}: {exc}") from None

    def __enter__(self) -> _Link:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._sock.disable_monitor()
        self._context.destroy(linger=0)  # closes the socket and its monitor

    def exchange(self, request: Message, expected: type[M]) -> M:
        """The reply to `request` once the handshake succeeded (`request_reply`'s errors, `_NoLinkError`)."""
        self._await_handshake()
        left_s = max(0.0, self.deadline_s - time.monotonic())
        try:
            return request_reply(self._sock, request, expected, timeout_s=left_s, request_id=1)
        except PerseusClientError as exc:
            if exc.reached:
                raise
        if self._dropped():
            raise _NoLinkError(
                f"the connection to {self.path} was lost before a reply came (the daemon stopped, or its "
                f"reply was over {MAX_REPLY_BYTES >> 20} MiB)"
            )
        raise _NoLinkError(f"no reply to {request.TYPE} within {self.timeout_s:g} s from {self.path}")

    def _await_handshake(self) -> None:
        """Return once the handshake succeeded; raise the first reason it did not, or at the deadline."""
        while True:
            left_ms = int((self.deadline_s - time.monotonic()) * 1000)
            if left_ms <= 0 or not self._monitor.poll(left_ms):
                raise _NoLinkError(f"the daemon is not reachable at {self.path} (no reply in time)")
            event = monitor_event(self._monitor.recv_multipart())
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                return
            if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                raise _HandshakeRefusedError
            if event == zmq.EVENT_CONNECT_RETRIED:
                raise _NoLinkError(f"nothing accepts connections at {self.path}")
            raise _NoLinkError(
                f"{self.path} closed the connection during the ZeroMQ handshake (not perseusd, or one that "
                "is stopping)"
            )

    def _dropped(self) -> bool:
        """Whether the connection went down after the handshake."""
        while self._monitor.poll(0):
            if monitor_event(self._monitor.recv_multipart()) == zmq.EVENT_DISCONNECTED:
                return True
        return False


def fetch_jobs(runtime_dir: StrPath) -> tuple[JobInfo, ...]:
    """Every job the daemon knows on this node."""
    from perseus_client.job_messages import JobsReply, JobsRequest

    return ask(runtime_dir, JobsRequest(), JobsReply, admin=False).jobs


def find_job(runtime_dir: StrPath, job: str) -> JobInfo | None:
    """The daemon's view of one job (None when it does not list it)."""
    return next((info for info in fetch_jobs(runtime_dir) if info.job == job), None)


def fetch_document(runtime_dir: StrPath, request: FrontierRequest | PlanRequest) -> str:
    """The JSON text of a job's frontier or deployed plan, as the daemon sent it."""
    from perseus_client.job_messages import DocumentReply

    return ask(runtime_dir, request, DocumentReply, admin=False, timeout_s=DOCUMENT_TIMEOUT_S).document


def load_frontier_text(text: str, job: str) -> Frontier:
    """Strictly load a `perseus-frontier` document received from the daemon."""
    from perseusd.planner.plan_read import parse_frontier

    return parse_frontier(text, f"the frontier of job {job}")


def load_plan_text(text: str, job: str) -> Plan:
    """Strictly load a `perseus-plan` document received from the daemon."""
    from perseusd.planner.plan_read import parse_plan

    return parse_plan(text, f"the plan of job {job}")
