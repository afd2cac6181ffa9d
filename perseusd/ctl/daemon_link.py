"""How perseusctl talks to a running perseusd: one request, one reply, a timeout, typed errors; jobs and
the documents the daemon sends about them (loaded as strictly as files)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import zmq
from perseus_client.client import PerseusClientError, request_reply
from perseus_client.protocol import (
    ADMIN_SOCKET_NAME,
    CONTROL_SOCKET_NAME,
    DocumentReply,
    FrontierRequest,
    JobInfo,
    JobsReply,
    JobsRequest,
    Message,
    PlanRequest,
)

from perseusd.errors import PerseusError

if TYPE_CHECKING:
    from perseusd.planner.plan import Frontier, Plan

M = TypeVar("M", bound=Message)
D = TypeVar("D")

DOCUMENT_TIMEOUT_S = 10.0
"""Frontier documents of large jobs are megabytes: more time than a small request."""

EXIT_FAILED = 1
EXIT_UNREACHABLE = 2


class DaemonUnreachableError(PerseusError):
    """perseusd does not answer (not running, wrong --runtime-dir, or no permission on its sockets)."""

    exit_code = EXIT_UNREACHABLE


class DaemonRequestError(PerseusError):
    """perseusd answered with an error."""

    exit_code = EXIT_FAILED

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


def admin_socket_usable(runtime_dir: Path) -> bool:
    """True when this user may open the admin socket (root or group perseus-admin)."""
    return os.access(runtime_dir / ADMIN_SOCKET_NAME, os.W_OK)


def ask(runtime_dir: Path, request: Message, expected: type[M], *, admin: bool, timeout_s: float = 3.0) -> M:
    """Send `request` to the control (or admin) socket and return the typed reply."""
    name = ADMIN_SOCKET_NAME if admin else CONTROL_SOCKET_NAME
    path = runtime_dir / name
    if not path.exists():
        raise DaemonUnreachableError(f"{path} does not exist: is perseusd running (or pass --runtime-dir)?")
    if not os.access(path, os.W_OK):
        group = "perseus-admin" if admin else "perseus"
        raise DaemonUnreachableError(f"no permission on {path}: run as root or join group {group}")
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.connect(f"ipc://{path}")
        return request_reply(sock, request, expected, timeout_s=timeout_s, request_id=1)
    except PerseusClientError as exc:
        if exc.code in ("UNREACHABLE", "PERMISSION_DENIED"):
            raise DaemonUnreachableError(f"perseusd: {exc.message}") from None
        raise DaemonRequestError(exc.code, exc.message) from None
    finally:
        sock.close(linger=0)
        ctx.term()


def fetch_jobs(runtime_dir: Path) -> tuple[JobInfo, ...]:
    """Every job the daemon knows on this node."""
    return ask(runtime_dir, JobsRequest(), JobsReply, admin=False).jobs


def find_job(runtime_dir: Path, job: str) -> JobInfo | None:
    """The daemon's view of one job (None when it does not list it)."""
    return next((info for info in fetch_jobs(runtime_dir) if info.job == job), None)


def fetch_document(runtime_dir: Path, request: FrontierRequest | PlanRequest) -> str:
    """The JSON text of a job's frontier or deployed plan, as the daemon sent it."""
    return ask(runtime_dir, request, DocumentReply, admin=False, timeout_s=DOCUMENT_TIMEOUT_S).document


def load_frontier_text(text: str, job: str) -> Frontier:
    """Strictly load a `perseus-frontier` document received from the daemon."""
    from perseusd.planner.plan import parse_frontier

    return parse_frontier(text, f"the frontier of job {job}")


def load_plan_text(text: str, job: str) -> Plan:
    """Strictly load a `perseus-plan` document received from the daemon."""
    from perseusd.planner.plan import parse_plan

    return parse_plan(text, f"the plan of job {job}")
