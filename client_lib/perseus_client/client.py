"""`PerseusClient`: what a training process uses to talk to perseusd (pyzmq and the protocol module only).

Events (computation and step begin/end) go to the daemon's event socket without ever blocking or raising:
when the daemon is down or slow they are dropped and counted (`events_dropped`). Control calls (hello, claim,
release, set_clock, set_plan, clear_plan, status, the job calls) have timeouts and raise `PerseusClientError`;
arguments the daemon would refuse anyway (a negative pipeline, a straggler factor below 1) raise `ValueError`
before anything is sent. A small
monitor thread notices when the daemon comes back and registers again (hello, re-claim of the GPUs this
client held, and their plans).

Send events from one thread per client (ZeroMQ sockets are not thread-safe); control calls are locked.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import zmq

from perseus_client.envelope import MINOR_REFUSED
from perseus_client.protocol import (
    CONTROL_SOCKET_NAME,
    DEFAULT_MAX_FRAME_BYTES,
    EVENT_SOCKET_NAME,
    PROTOCOL_MAJOR,
    PROTOCOL_MINOR,
    AnnounceStraggler,
    AnnounceStragglerOk,
    Claim,
    ClaimOk,
    ClearPlan,
    ClearPlanOk,
    DocumentReply,
    ErrorReply,
    EventCount,
    EventCountOk,
    FrontierRequest,
    Hello,
    HelloOk,
    JobsReply,
    JobsRequest,
    Message,
    PlanEntry,
    PlanRequest,
    ProfileExport,
    ProfileImport,
    ProfileImportOk,
    ProfileReply,
    ProtocolError,
    Register,
    RegisterOk,
    Release,
    ReleaseOk,
    SetClock,
    SetClockOk,
    SetPlan,
    SetPlanOk,
    SetPolicy,
    SetPolicyOk,
    StatusReply,
    StatusRequest,
    decode_reply,
    encode,
)

logger = logging.getLogger(__name__)

CLIENT_VERSION = "0.1.0"
DEFAULT_RUNTIME_DIR = "/run/perseusd"
EVENT_SNDHWM = 500
"""Events queued towards a slow daemon before new ones are dropped (and counted): a small queue keeps the
daemon's backlog, and so the time it spends on events of a lease already released, short."""
EVENT_SNDBUF_BYTES = 64 * 1024
"""The kernel's share of that queue (the socket buffer), kept small for the same reason."""
CLOSE_SETTLE_S = 30.0
CLOSE_STALL_S = 3.0
"""At close, the client waits until the daemon has read every event it sent, at most CLOSE_SETTLE_S and at
most CLOSE_STALL_S without progress; events still unread then are counted in `events_lost`."""
_INSTRUCTIONS = frozenset(("forward", "backward"))
M = TypeVar("M", bound=Message)
# Events are written in minor 0 (no "m"): every daemon of the major reads them, and they stay short.
_COMPUTATION_FORMAT = (
    b'{"v":%d,"id":0,' % PROTOCOL_MAJOR
    + b'"type":"%s","gpu":%s,"stage":%d,"instruction":"%s","microbatch":%d,"chunk":%d,"timestamp_ns":%d}'
)
_STEP_FORMAT = b'{"v":%d,"id":0,' % PROTOCOL_MAJOR + b'"type":"%s","gpu":%s,"step":%d,"timestamp_ns":%d}'


class PerseusClientError(Exception):
    """A control call failed. `code` is the daemon's stable error code, or UNREACHABLE / TIMEOUT."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class _Computation:
    """Context manager sending a computation's begin and end events (never raises)."""

    __slots__ = ("_args", "_client")

    def __init__(self, client: PerseusClient, args: tuple[str, int, str, int, int]) -> None:
        self._client = client
        self._args = args

    def __enter__(self) -> None:
        self._client.computation_begin(*self._args)

    def __exit__(self, *_exc: object) -> None:
        self._client.computation_end(*self._args)


class _Step:
    __slots__ = ("_client", "_gpu", "_step")

    def __init__(self, client: PerseusClient, gpu: str, step: int) -> None:
        self._client = client
        self._gpu = gpu
        self._step = step

    def __enter__(self) -> None:
        self._client.step_begin(self._gpu, self._step)

    def __exit__(self, *_exc: object) -> None:
        self._client.step_end(self._gpu, self._step)


class PerseusClient:
    """A connection to perseusd from one training process.

    Args:
        runtime_dir: the daemon's runtime directory (its sockets live there).
        job: a name for this job, shown in `perseusctl status`.
        timeout_s: the timeout of each control call.
        connect: connect and say hello now (otherwise call `connect()`).
    """

    def __init__(
        self,
        runtime_dir: str | Path = DEFAULT_RUNTIME_DIR,
        job: str = "",
        *,
        timeout_s: float = 2.0,
        connect: bool = True,
    ) -> None:
        self.runtime_dir = Path(runtime_dir)
        self.job = job or f"pid-{os.getpid()}"
        self.timeout_s = timeout_s
        self.events_sent = 0
        self.events_dropped = 0
        self.events_lost = 0
        self._session_sent = 0  # events sent since the hello that opened this session with the daemon
        self.reconnects = 0
        self.daemon_info: HelloOk | None = None
        self.protocol_minor = PROTOCOL_MINOR
        """The minor this client writes in: its own, or the daemon's when older (known from the hello)."""
        self._claimed: list[str] = []
        self._plans: dict[str, tuple[PlanEntry, ...]] = {}
        self._registrations: dict[str, Register] = {}
        self._json_cache: dict[str, bytes] = {}
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._ctx: zmq.Context[Any] | None = None
        self._control: zmq.Socket[bytes] | None = None
        self._events: zmq.Socket[bytes] | None = None
        self._auth_failed = False
        self._monitor: threading.Thread | None = None
        self._closing = threading.Event()
        if connect:
            self.connect()

    # ------------------------------------------------------------------ connection

    def connect(self) -> HelloOk:
        """Open the sockets and say hello; raises `PerseusClientError` when the daemon does not answer."""
        with self._lock:
            if self._ctx is None:
                self._open_sockets()
            return self.hello()

    def _open_sockets(self) -> None:
        self._ctx = zmq.Context()
        control = self._ctx.socket(zmq.DEALER)
        control.setsockopt(zmq.LINGER, 0)
        control.setsockopt(zmq.IMMEDIATE, 1)
        monitor = control.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_DISCONNECTED
        )
        control.connect(f"ipc://{self.runtime_dir / CONTROL_SOCKET_NAME}")
        events = self._ctx.socket(zmq.PUSH)
        events.setsockopt(zmq.LINGER, 0)
        events.setsockopt(zmq.SNDHWM, EVENT_SNDHWM)
        events.setsockopt(zmq.SNDBUF, EVENT_SNDBUF_BYTES)
        events.setsockopt(zmq.IMMEDIATE, 1)
        events.connect(f"ipc://{self.runtime_dir / EVENT_SOCKET_NAME}")
        self._control, self._events = control, events
        self._monitor = threading.Thread(
            target=self._watch_connection, args=(monitor,), name="perseus-client-monitor", daemon=True
        )
        self._monitor.start()

    def _watch_connection(self, monitor: zmq.Socket[bytes]) -> None:
        """Re-register after the daemon comes back (a handshake after a disconnect)."""
        disconnected = False
        try:
            while not self._closing.is_set():
                if not monitor.poll(100):
                    continue
                event = monitor_event(monitor.recv_multipart())
                if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                    self._auth_failed = True
                elif event == zmq.EVENT_DISCONNECTED:
                    disconnected = True
                elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    self._auth_failed = False
                    if disconnected:
                        disconnected = False
                        self._reregister()
        except zmq.ZMQError:
            pass
        finally:
            monitor.close(linger=0)

    def _reregister(self) -> None:
        try:
            with self._lock:
                if self._control is None:
                    return
                self._session_sent = 0  # a new daemon: it counts from its hello
                self.hello()
                if self._claimed:
                    self.claim(self._claimed)
                for gpu, plan in list(self._plans.items()):
                    self._call(SetPlan(gpu=gpu, plan=plan), SetPlanOk)
                for registration in list(self._registrations.values()):
                    self._call(registration, RegisterOk)
                self.reconnects += 1
        except PerseusClientError as exc:
            logger.warning("perseus: re-registering with the daemon failed: %s", exc)

    def close(self) -> None:
        """Close the sockets (the daemon restores this process's GPUs when it exits anyway).

        Events still queued get up to `CLOSE_SETTLE_S` to reach the daemon; those that did not are counted in
        `events_lost` (the daemon says how many it read), so `events_sent - events_lost` arrived.
        """
        self._closing.set()
        if self._monitor is not None:
            self._monitor.join(timeout=1.0)
        with self._lock:
            self._settle_events()
            if self._control is not None:
                self._control.close(linger=0)
            if self._events is not None:
                self._events.close(linger=0)
            if self._ctx is not None:
                self._ctx.term()
            self._ctx = self._control = self._events = None

    def _settle_events(self) -> None:
        """Wait (bounded) until the daemon read every event sent in this session; count the rest as lost."""
        if self._control is None or self._session_sent <= 0:
            return
        started_s = progress_s = time.monotonic()
        received = 0
        while True:
            now_s = time.monotonic()
            try:
                reply = request_reply(
                    self._control,
                    EventCount(),
                    EventCountOk,
                    timeout_s=max(0.05, min(self.timeout_s, CLOSE_STALL_S)),
                    request_id=next(self._ids),
                    client=self,
                )
            except PerseusClientError:
                break  # the daemon is gone or does not count: what it did not confirm is lost
            if reply.received > received:
                received, progress_s = reply.received, now_s
            if received >= self._session_sent:
                break
            if now_s - progress_s > CLOSE_STALL_S or now_s - started_s > CLOSE_SETTLE_S:
                break
            time.sleep(0.01)
        self.events_lost += max(0, self._session_sent - received)
        self._session_sent = 0

    def __enter__(self) -> PerseusClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ control calls

    def hello(self) -> HelloOk:
        """Register this process; the reply says which GPUs the daemon has and the protocol it speaks (from
        then on this client writes the older of the two minors)."""
        self.protocol_minor = PROTOCOL_MINOR  # the daemon may have been replaced by another version
        reply = self._call(Hello(job=self.job, client_version=CLIENT_VERSION), HelloOk)
        self.daemon_info = reply
        self.protocol_minor = min(PROTOCOL_MINOR, reply.protocol_minor)
        return reply

    def claim(self, gpus: Sequence[str]) -> tuple[str, ...]:
        """Lease GPUs (by UUID) for this process; all or nothing."""
        reply = self._call(Claim(gpus=tuple(gpus), job=self.job), ClaimOk)
        for gpu in reply.gpus:
            if gpu not in self._claimed:
                self._claimed.append(gpu)
        return reply.gpus

    def release(self, gpus: Sequence[str] = ()) -> ReleaseOk:
        """Release leases (all of them by default); the daemon restores the GPUs."""
        reply = self._call(Release(gpus=tuple(gpus)), ReleaseOk)
        released = set(gpus) if gpus else set(self._claimed)
        self._claimed = [gpu for gpu in self._claimed if gpu not in released]
        for gpu in released:
            self._plans.pop(gpu, None)
            self._registrations.pop(gpu, None)
        return reply

    def set_clock(self, gpu: str, sm_clock_mhz: int | None) -> int | None:
        """Lock the SM clock of a leased GPU (None unlocks); returns the clock applied (MHz)."""
        return self._call(SetClock(gpu=gpu, sm_clock_mhz=sm_clock_mhz), SetClockOk).applied_mhz

    def set_plan(self, gpu: str, plan: Sequence[PlanEntry | Mapping[str, Any]]) -> int:
        """Deploy a clock plan on a leased GPU: its computations in schedule order, each with `freq_mhz`.

        Entries are `PlanEntry` or mappings with instruction, microbatch, chunk and freq_mhz. From now on the
        daemon sets each computation's clock as the previous one ends. Returns the number of computations.
        """
        entries = tuple(_plan_entry(entry) for entry in plan)
        reply = self._call(SetPlan(gpu=gpu, plan=entries), SetPlanOk)
        self._plans[gpu] = entries
        return reply.computations

    def clear_plan(self, gpu: str) -> bool:
        """Remove a GPU's plan (its clock stays as it is); returns whether there was one."""
        self._plans.pop(gpu, None)
        return self._call(ClearPlan(gpu=gpu), ClearPlanOk).cleared

    def status(self) -> StatusReply:
        return self._call(StatusRequest(), StatusReply)

    # ------------------------------------------------------------------ jobs

    def register(
        self,
        gpu: str,
        *,
        stage: int,
        num_stages: int,
        num_microbatches: int,
        schedule: str = "1f1b",
        pipeline: int = 0,
        chunks: int = 1,
        job: str | None = None,
        stage_gpus: int = 1,
        run: str = "",
    ) -> RegisterOk:
        """Join job `job` (default: this client's job) with a GPU this process claimed.

        From now on the daemon profiles, plans and switches this GPU's clocks by itself; send step and
        computation events. `schedule` is "1f1b", "gpipe", "interleaved" (with `chunks` > 1) or "observed".
        `stage_gpus`: the GPUs that run this stage together (tensor x context parallel; each registers the
        same `pipeline` and `stage`). `run`: an id all processes of this run share (the launcher's job id),
        so that a job's stages on several nodes are told apart from another run of the same name.
        """
        request = Register(
            gpu=gpu,
            job=job or self.job,
            pipeline=pipeline,
            stage=stage,
            num_stages=num_stages,
            num_microbatches=num_microbatches,
            schedule=schedule,  # type: ignore[arg-type]  # checked by the daemon
            chunks=chunks,
            stage_gpus=stage_gpus,
            run=run,
        )
        reply = self._call(request, RegisterOk)
        self._registrations[gpu] = request
        return reply

    def set_policy(self, policy: str, target: float = 0.0, job: str | None = None) -> SetPolicyOk:
        """Choose the frontier point a job runs: fastest, slowdown (target fraction), time (s), min_energy."""
        request = SetPolicy(job=job or self.job, policy=policy, target=target)  # type: ignore[arg-type]
        return self._call(request, SetPolicyOk)

    def announce_straggler(self, pipeline: int, factor: float, job: str | None = None) -> AnnounceStragglerOk:
        """Tell the daemon that data-parallel `pipeline` of a job is slow by `factor` (>= 1, e.g. 1.2).

        For what the daemon cannot see in time from the step events: a replica known to be slow from outside
        (thermal throttling or a degraded link reported by the cluster's health checks). Its iterations are
        taken to last `factor` times its plan's time, and the job's other pipelines move to the least-energy
        plan that is no slower; the reply's `shared` says whether the job's other nodes hear of it (etcd).
        The job's owner or an admin may announce; `job` defaults to this client's job.
        """
        _check_pipeline(pipeline)
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not factor >= 1.0:
            raise ValueError(f"straggler factor must be a number >= 1, e.g. 1.2 (got {factor!r})")
        if not math.isfinite(factor):
            raise ValueError(f"straggler factor must be finite (got {factor!r})")
        request = AnnounceStraggler(job=job or self.job, pipeline=pipeline, factor=float(factor), clear=False)
        return self._call(request, AnnounceStragglerOk)

    def clear_straggler(self, pipeline: int, job: str | None = None) -> AnnounceStragglerOk:
        """Withdraw an announced straggler: the job's other pipelines go back to their own policy's plan."""
        _check_pipeline(pipeline)
        request = AnnounceStraggler(job=job or self.job, pipeline=pipeline, factor=1.0, clear=True)
        return self._call(request, AnnounceStragglerOk)

    def jobs(self) -> JobsReply:
        return self._call(JobsRequest(), JobsReply)

    def frontier(self, job: str | None = None) -> dict[str, Any]:
        """The job's frontier as a `perseus-frontier` document (parsed JSON)."""
        reply = self._call(FrontierRequest(job=job or self.job), DocumentReply)
        return dict(json.loads(reply.document))

    def plan(self, job: str | None = None) -> dict[str, Any]:
        """The job's deployed plan as a `perseus-plan` document (parsed JSON)."""
        reply = self._call(PlanRequest(job=job or self.job), DocumentReply)
        return dict(json.loads(reply.document))

    def profile_export(self, job: str | None = None) -> ProfileReply:
        """The job's measured profile as CSV text, and its blocking power."""
        return self._call(ProfileExport(job=job or self.job), ProfileReply)

    def profile_import(
        self, csv_text: str, *, source: str = "<memory>", p_block_w: float = 0.0, job: str | None = None
    ) -> ProfileImportOk:
        """Give a job its profile so it skips profiling (before it registers, or while it profiles)."""
        request = ProfileImport(job=job or self.job, csv=csv_text, source=source, p_block_w=p_block_w)
        return self._call(request, ProfileImportOk)

    def event_count(self) -> EventCountOk:
        """How many of this process's events the daemon has read, and how many of those it dropped."""
        return self._call(EventCount(), EventCountOk)

    def _call(self, request: Message, expected: type[M]) -> M:
        with self._lock:
            if self._control is None:
                raise PerseusClientError("NOT_CONNECTED", "call connect() first")
            return request_reply(
                self._control,
                request,
                expected,
                timeout_s=self.timeout_s,
                request_id=next(self._ids),
                client=self,
            )

    # ------------------------------------------------------------------ events (never block, never raise)

    def computation(
        self, gpu: str, stage: int, instruction: str, microbatch: int, chunk: int = 0
    ) -> _Computation:
        """``with client.computation(gpu, stage, "forward", microbatch): ...`` sends begin and end."""
        return _Computation(self, (gpu, stage, instruction, microbatch, chunk))

    def step(self, gpu: str, step: int) -> _Step:
        return _Step(self, gpu, step)

    def computation_begin(
        self, gpu: str, stage: int, instruction: str, microbatch: int, chunk: int = 0
    ) -> None:
        self._send_computation(b"comp_begin", gpu, stage, instruction, microbatch, chunk)

    def computation_end(
        self, gpu: str, stage: int, instruction: str, microbatch: int, chunk: int = 0
    ) -> None:
        self._send_computation(b"comp_end", gpu, stage, instruction, microbatch, chunk)

    def step_begin(self, gpu: str, step: int) -> None:
        self._send_step(b"step_begin", gpu, step)

    def step_end(self, gpu: str, step: int) -> None:
        self._send_step(b"step_end", gpu, step)

    def _send_computation(
        self, kind: bytes, gpu: str, stage: int, instruction: str, microbatch: int, chunk: int
    ) -> None:
        try:
            if instruction not in _INSTRUCTIONS:
                raise ValueError(instruction)
            data = _COMPUTATION_FORMAT % (
                kind,
                self._json_str(gpu),
                stage,
                instruction.encode(),
                microbatch,
                chunk,
                time.monotonic_ns(),
            )
            self._events.send(data, zmq.NOBLOCK)  # type: ignore[union-attr]
            self.events_sent += 1
            self._session_sent += 1
        except Exception:  # never raise into training
            self.events_dropped += 1

    def _send_step(self, kind: bytes, gpu: str, step: int) -> None:
        try:
            data = _STEP_FORMAT % (
                kind,
                self._json_str(gpu),
                step,
                time.monotonic_ns(),
            )
            self._events.send(data, zmq.NOBLOCK)  # type: ignore[union-attr]
            self.events_sent += 1
            self._session_sent += 1
        except Exception:  # never raise into training
            self.events_dropped += 1

    def _json_str(self, text: str) -> bytes:
        """A JSON string literal, cached (GPU UUIDs repeat on every event)."""
        encoded = self._json_cache.get(text)
        if encoded is None:
            if len(self._json_cache) > 1024:
                self._json_cache.clear()
            encoded = self._json_cache[text] = json.dumps(text).encode()
        return encoded


def _check_pipeline(pipeline: int) -> None:
    """Pipelines are numbered from 0 (the `pipeline` given to `register`)."""
    if isinstance(pipeline, bool) or not isinstance(pipeline, int) or pipeline < 0:
        raise ValueError(f"pipeline must be an integer >= 0, as given to register() (got {pipeline!r})")


def _plan_entry(entry: PlanEntry | Mapping[str, Any]) -> PlanEntry:
    if isinstance(entry, PlanEntry):
        return entry
    try:
        return PlanEntry(
            instruction=entry["instruction"],
            microbatch=entry["microbatch"],
            chunk=entry.get("chunk", 0),
            freq_mhz=entry["freq_mhz"],
        )
    except (KeyError, TypeError) as exc:
        raise PerseusClientError("BAD_FIELD", f"bad plan entry {entry!r}: {exc}") from None


def request_reply(
    sock: zmq.Socket[bytes],
    request: Message,
    expected: type[M],
    *,
    timeout_s: float,
    request_id: int,
    client: PerseusClient | None = None,
) -> M:
    """Send one request on a DEALER socket and wait for its reply; raises `PerseusClientError`.

    The request is written in the client's minor (`PerseusClient.protocol_minor`, else the newest). A daemon
    of protocol 6 as first released refuses the minor field "m" itself: the request is then sent again in
    minor 0, and the client keeps to it.
    """
    deadline_s = time.monotonic() + timeout_s
    minor = client.protocol_minor if client is not None else PROTOCOL_MINOR
    try:
        return _exchange(sock, request, expected, deadline_s, timeout_s, request_id, client, minor)
    except PerseusClientError as exc:
        if minor == 0 or exc.code != "BAD_FIELD" or not exc.message.endswith(MINOR_REFUSED):
            raise
    if client is not None:
        client.protocol_minor = 0
    return _exchange(sock, request, expected, deadline_s, timeout_s, request_id, client, 0)


def _exchange(
    sock: zmq.Socket[bytes],
    request: Message,
    expected: type[M],
    deadline_s: float,
    timeout_s: float,
    request_id: int,
    client: PerseusClient | None,
    minor: int,
) -> M:
    if not sock.poll(max(0, int((deadline_s - time.monotonic()) * 1000)), zmq.POLLOUT):
        raise _unreachable(client, f"the daemon is not reachable at {_endpoint(sock)}")
    sock.send(encode(request, request_id, minor, keep_newer_values=True), zmq.NOBLOCK)
    while True:
        left_ms = int((deadline_s - time.monotonic()) * 1000)
        if left_ms <= 0 or not sock.poll(left_ms, zmq.POLLIN):
            raise _unreachable(
                client, f"no reply to {request.TYPE} within {timeout_s:g} s from {_endpoint(sock)}"
            )
        try:
            frame = decode_reply(sock.recv(zmq.NOBLOCK), 64 * DEFAULT_MAX_FRAME_BYTES)
        except ProtocolError as exc:
            raise PerseusClientError(exc.code, f"bad reply from the daemon: {exc.message}") from None
        if frame.request_id != request_id:
            continue  # a late reply to an earlier, timed-out request
        if isinstance(frame.message, ErrorReply):
            raise PerseusClientError(frame.message.code, frame.message.message)
        if not isinstance(frame.message, expected):
            raise PerseusClientError("BAD_FRAME", f"unexpected reply {frame.message.TYPE}")
        return frame.message


def _endpoint(sock: zmq.Socket[bytes]) -> str:
    """The socket path a client socket connects to (for error messages)."""
    try:
        endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    except zmq.ZMQError:
        endpoint = ""
    return endpoint.removeprefix("ipc://") or "the daemon's control socket"


def _unreachable(client: PerseusClient | None, message: str) -> PerseusClientError:
    if client is not None and client._auth_failed:
        return PerseusClientError(
            "PERMISSION_DENIED", "the daemon refused this user; ask an admin to add you to group perseus"
        )
    return PerseusClientError("UNREACHABLE", message)


def monitor_event(frames: list[bytes]) -> int:
    """The event number of a ZeroMQ socket-monitor message (first frame: uint16 event, uint32 value).

    Parsed here rather than with `zmq.utils.monitor`, which imports asyncio: that costs every short-lived
    caller (perseusctl), and a process that dropped privileges may no longer be able to import it.
    """
    event: int = struct.unpack_from("=H", frames[0])[0]
    return event
