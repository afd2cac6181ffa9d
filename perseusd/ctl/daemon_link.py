"""How perseusctl talks to a running perseusd: one request, one reply, a timeout, typed errors; jobs and
the documents the daemon sends about them (loaded as strictly as files).

Light on purpose (`perseusctl status` runs in well under 150 ms): the request goes over a standard-library
ZeroMQ link (`perseusd.ctl.zmtp`, no pyzmq), and the reply is decoded with only the message types asked for,
not the whole protocol's registry (each message class costs its import time).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, TypeVar

from perseus_client import reach
from perseus_client.codes import ProtocolError
from perseus_client.envelope import (
    ADMIN_SOCKET_NAME,
    CONTROL_SOCKET_NAME,
    DEFAULT_MAX_FRAME_BYTES,
    MINOR_REFUSED,
    decode_frame,
    encode_frame,
)
from perseus_client.message import ErrorReply, Message
from perseus_client.validation import Schema
from perseus_client.version import PROTOCOL_MINOR

from perseusd.ctl import zmtp
from perseusd.errors import PerseusError

if TYPE_CHECKING:  # pathlib is not imported at run time: `perseusctl status` pays for every import
    from os import PathLike
    from typing import TypeAlias

    from perseus_client.job_info import JobInfo
    from perseus_client.job_messages import FrontierRequest, PlanRequest

    from perseusd.planner.plan import Frontier, Plan

    StrPath: TypeAlias = str | PathLike[str]
    """A runtime directory as a string or a path."""

M = TypeVar("M", bound=Message)
D = TypeVar("D")

DOCUMENT_TIMEOUT_S = 10.0
"""Frontier documents of large jobs are megabytes: more time than a small request."""

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
        raise DaemonUnreachableError(reach.diagnose(os.fspath(runtime_dir), name, group).message)
    reply = _exchange(path, request, expected, timeout_s, PROTOCOL_MINOR, group)
    if _predates_minors(reply):  # a daemon of protocol 6.0 as first released: ask again in minor 0
        reply = _exchange(path, request, expected, timeout_s, 0, group)
    if isinstance(reply, ErrorReply):
        raise DaemonRequestError(reply.code, reply.message)
    if not isinstance(reply, expected):
        raise DaemonRequestError("BAD_FRAME", f"unexpected reply {reply.TYPE} to {request.TYPE}")
    return reply


_REPLY_SCHEMA = Schema(strict=False, minor=PROTOCOL_MINOR)


def _exchange(
    path: str, request: Message, expected: type[Message], timeout_s: float, minor: int, group: str
) -> Message:
    """The reply (an `ErrorReply` included), decoded as the client library decodes replies, tolerantly."""
    try:
        data = zmtp.request(path, encode_frame(request, 1, minor, keep_newer_values=True), timeout_s)
    except zmtp.ZmtpRefusedError:
        raise DaemonUnreachableError(reach.refused_by_daemon(path, group).message) from None
    except zmtp.ZmtpUnreachableError as exc:
        cause = reach.diagnose(os.path.dirname(path), os.path.basename(path), group)
        message = f"perseusd: {exc}" if isinstance(cause, reach.NotAnswering) else cause.message
        raise DaemonUnreachableError(message) from None
    types = {expected.TYPE: expected, ErrorReply.TYPE: ErrorReply}
    try:
        frame = decode_frame(
            data,
            64 * DEFAULT_MAX_FRAME_BYTES,
            types,
            schema=_REPLY_SCHEMA,
            peer="perseusd",
            we_are="perseusctl",
        )
    except ProtocolError as exc:
        raise DaemonRequestError(exc.code, f"bad reply from the daemon: {exc.message}") from None
    return frame.message


def _predates_minors(reply: Message) -> bool:
    """How a daemon that predates minors refuses a frame's "m" (see `perseus_client.client`)."""
    return (
        isinstance(reply, ErrorReply) and reply.code == "BAD_FIELD" and reply.message.endswith(MINOR_REFUSED)
    )


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
