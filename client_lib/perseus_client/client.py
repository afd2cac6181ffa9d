"""`PerseusClient`: what a training process uses to talk to perseusd (pyzmq and the protocol module only).

The client never harms training. By default it **fails open**: a daemon that is absent, stopped, restarting,
upgrading or refusing leaves the job running unmanaged, at the GPUs' own clocks:

- Events (computation and step begin/end) never block or raise: without a daemon session they are dropped
  and counted (`events_dropped`), at a fraction of a sent event's cost.
- Calls that change something (connect/hello, claim, release, set_clock, set_plan, clear_plan, register,
  set_policy, profile_import, announce/clear_straggler) log a warning and return None (claim: (), set_plan:
  0, clear_plan: False) when the daemon is out of reach or refuses; they are counted in `calls_skipped`.
  A client that cannot reach the daemon at start logs one warning naming the cause.
- Calls that ask for something (status, jobs, frontier, plan, profile_export, event_count) raise
  `PerseusClientError`: there is no answer to return.
- Arguments that are wrong whatever the daemon says (a negative pipeline, a straggler factor below 1) raise
  `ValueError` before anything is sent.

A monitor thread watches the connection: when the daemon (re)appears, the client says hello again and
replays what it asked, the calls skipped while the daemon was away included (claims, plans, registrations,
imported profiles, policies: `perseus_client.session`); a job the daemon finds in its cache runs its plan at
once, without profiling. `strict=True`, or `PERSEUSD_CLIENT_STRICT=1`, makes every control call raise
`PerseusClientError` instead (and the constructor too, when the daemon cannot be reached).

Events go to a daemon of protocol 6.10 or later as datagrams on its SOCK_SEQPACKET event socket: one
non-blocking send(2) from the training thread, no queue and no I/O thread (`perseus_client.seqpacket`); to an
older daemon, or where that socket cannot be opened, on ZeroMQ's event socket as before.

Send events from one thread per client (ZeroMQ sockets are not thread-safe); control calls are locked.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import zmq

from perseus_client import devices, reach, seqpacket
from perseus_client.carrying import Carrier
from perseus_client.closing import Closing
from perseus_client.event_frames import EventWriter
from perseus_client.link import PerseusClientError, monitor_event, request_reply, unreachable
from perseus_client.protocol import (
    CONTROL_SOCKET_NAME,
    EVENT_SOCKET_NAME,
    PROTOCOL_MINOR,
    AnnounceStraggler,
    AnnounceStragglerOk,
    Carry,
    CarryReady,
    Claim,
    ClaimOk,
    ClearPlan,
    ClearPlanOk,
    DocumentReply,
    EventCount,
    EventCountOk,
    EventsEnd,
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
from perseus_client.session import SessionMemory

__all__ = ["CLIENT_VERSION", "DEFAULT_RUNTIME_DIR", "PerseusClient", "PerseusClientError"]

logger = logging.getLogger(__name__)

CLIENT_VERSION = "0.1.0"
DEFAULT_RUNTIME_DIR = reach.DEFAULT_RUNTIME_DIR
EVENT_SNDHWM = 500
"""Events queued towards a slow daemon before new ones are dropped (and counted): a small queue keeps the
daemon's backlog, and so the time it spends on events of a lease already released, short."""
EVENT_SNDBUF_BYTES = 64 * 1024
"""The kernel's share of that queue (the socket buffer), kept small for the same reason."""
CLOSE_SETTLE_S = 30.0
CLOSE_STALL_S = 3.0
"""At close, the client waits until the daemon has read every event it sent, at most CLOSE_SETTLE_S and at
most CLOSE_STALL_S without progress; events still unread then are counted in `events_lost`."""
EVENTS_END_SINCE = EventsEnd.SINCE
"""The daemon's minor from which the client ends its event stream with a marker (`events_end`)."""
CARRY_SINCE = Carry.SINCE
"""The daemon's minor from which it may say which events wait for the next one (`perseus_client.carrying`)."""
CONNECT_PROBE_S = 0.05
"""At connect, how long the link may take before the client looks at why (a daemon that is up connects in
well under this; one that is not there fails at once instead of after the whole timeout)."""
RETRY_MIN_S = 0.25
RETRY_MAX_S = 5.0
"""Back-off of a new session's hello while the link is up but the daemon does not answer."""
M = TypeVar("M", bound=Message)
R = TypeVar("R")


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


class PerseusClient(Closing):
    """A connection to perseusd from one training process.

    Args:
        runtime_dir: the daemon's runtime directory (its sockets live there); default
            `$PERSEUSD_RUNTIME_DIR`, else `/run/perseusd`.
        job: a name for this job, shown in `perseusctl status`.
        timeout_s: the timeout of each control call.
        connect: connect and say hello now (otherwise call `connect()`).
        strict: raise `PerseusClientError` when the daemon is out of reach or refuses, instead of going on
            unmanaged; default `$PERSEUSD_CLIENT_STRICT` (1/true/yes), else False (fail open).

    Attributes:
        managed: whether the client has a session with the daemon now.
        calls_skipped: control calls that did nothing (fail-open: daemon away or refusing).
        events_sent, events_dropped, events_lost: see `close()`.
        reconnects: sessions the monitor opened by itself (the daemon came back, or came up late).
    """

    def __init__(
        self,
        runtime_dir: str | os.PathLike[str] | None = None,
        job: str = "",
        *,
        timeout_s: float = 2.0,
        connect: bool = True,
        strict: bool | None = None,
    ) -> None:
        self.runtime_dir = Path(reach.runtime_dir(runtime_dir))
        self.job = job or f"pid-{os.getpid()}"
        self.timeout_s = timeout_s
        self.strict = reach.strict_from_env() if strict is None else strict
        self.events_sent = 0
        self.events_dropped = 0
        self.events_lost = 0
        self.calls_skipped = 0
        self.reconnects = 0
        self._session_sent = 0  # events sent since the hello that opened this session with the daemon
        self.daemon_info: HelloOk | None = None
        self.protocol_minor = PROTOCOL_MINOR
        """The minor this client writes in: its own, or the daemon's when older (known from the hello)."""
        self.auth_failed = False
        self.managed = False
        self._memory = SessionMemory()
        self._frames = EventWriter()  # every event frame, written as the protocol writes it
        self._carrier = Carrier()  # the events the daemon lets wait for the next one, and those waiting
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._ctx: zmq.Context[Any] | None = None
        self._control: zmq.Socket[bytes] | None = None
        self._events: zmq.Socket[bytes] | None = None
        self._datagrams: seqpacket.EventSocket | None = None
        """The SOCK_SEQPACKET event connection of this session (None: events go to ZeroMQ's socket)."""
        self._monitor: threading.Thread | None = None
        self._closing = threading.Event()
        self._link_up = False
        self._wanted = False  # connect() was called: the monitor opens sessions by itself
        self._away_warned = False
        self._away = False  # known out of reach: calls fail at once instead of waiting for their timeout
        if connect:
            try:
                self.connect()
            except BaseException:
                self.close()
                raise

    # ------------------------------------------------------------------ connection

    def connect(self) -> HelloOk | None:
        """Open the sockets and say hello. Fail-open: None (and one warning) when the daemon cannot be
        reached; the client keeps trying in the background. Strict: raises `PerseusClientError`."""
        with self._lock:
            self._wanted = True
            if self._ctx is None:
                self._open_sockets()
            assert self._control is not None
            if not self.strict and not self._control.poll(int(CONNECT_PROBE_S * 1000), zmq.POLLOUT):
                cause = reach.diagnose(str(self.runtime_dir), CONTROL_SOCKET_NAME)
                if not isinstance(cause, reach.NotAnswering):  # absent, closed, elsewhere: fail at once
                    self._went_away(PerseusClientError(cause.code, cause.message, reached=False))
                    return None
            return self._act("hello", self._open)

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
        """Follow the link; open a session (hello and replay) whenever the link is up without one."""
        retry_at_s, backoff_s = 0.0, RETRY_MIN_S
        try:
            while not self._closing.is_set():
                if monitor.poll(100):
                    event = monitor_event(monitor.recv_multipart())
                    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                        self.auth_failed = True
                    elif event == zmq.EVENT_DISCONNECTED:
                        self._link_up = False
                        self._went_away(None)
                    elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                        self.auth_failed = False
                        self._link_up = True
                        retry_at_s, backoff_s = 0.0, RETRY_MIN_S
                if not (self._link_up and self._wanted and not self.managed):
                    continue
                if time.monotonic() >= retry_at_s and not self._reopen():
                    retry_at_s = time.monotonic() + backoff_s
                    backoff_s = min(RETRY_MAX_S, backoff_s * 2)
        except zmq.ZMQError:
            pass
        finally:
            monitor.close(linger=0)

    def _reopen(self) -> bool:
        """Hello again and replay what this client asked; False when the daemon is out of reach again."""
        with self._lock:
            if self._control is None or self.managed or self._closing.is_set():
                return True
            try:
                self._hello()
                summary = self._memory.replay(self._call, self.job)
            except PerseusClientError as exc:
                self.managed = False
                logger.debug("perseus: opening a session failed: %s", exc)
                return False
            self._opened()
            self.reconnects += 1  # after: a count seen means the session is open
            logger.info("perseus: connected to the daemon at %s: %s", self.runtime_dir, summary)
            return True

    def _went_away(self, exc: PerseusClientError | None) -> None:
        """The daemon is out of reach: go on unmanaged; warn once per absence."""
        self.managed = False
        self._away = True
        self.events_dropped += self._carrier.reset()
        if self._away_warned or self._closing.is_set() or self.strict:  # strict: the caller gets the error
            return
        self._away_warned = True
        cause = exc.message if exc is not None else f"lost the daemon at {self.runtime_dir}"
        logger.warning(
            "perseus: %s; training goes on unmanaged (events dropped and counted); the client reconnects "
            "when the daemon is back",
            cause,
        )

    def close(self) -> None:
        """Close the sockets (the daemon restores this process's GPUs when it exits anyway). Never raises
        because of the daemon.

        Events still queued get up to `CLOSE_SETTLE_S` to reach the daemon; those that did not are counted in
        `events_lost` (the daemon says how many it read), so `events_sent - events_lost` arrived.
        """
        self._closing.set()
        if self._monitor is not None:
            self._monitor.join(timeout=1.0)
        with self._lock:
            self._send_held()
            self._settle_events()
            if self._control is not None:
                self._control.close(linger=0)
            if self._events is not None:
                self._events.close(linger=0)
            self._use_datagrams(None)
            if self._ctx is not None:
                self._ctx.term()
            self._ctx = self._control = self._events = None
            self.managed = False

    def _settle_events(self) -> None:
        """Wait (bounded) until the daemon read every event sent in this session; count the rest as lost.

        A daemon of minor 9 or later is sent an end marker (`events_end`) behind the last event: once it has
        read the marker, its count is final and `events_lost` is exactly what it never read, as it counts too
        (docs/protocol.md). An older daemon's count is taken as it stands when it stops moving.
        """
        sent, self._session_sent = self._session_sent, 0
        if self._control is None or sent <= 0:
            return
        if not self.managed:  # the daemon that had them is gone
            self.events_lost += sent
            return
        marking = self.protocol_minor >= EVENTS_END_SINCE
        end = EventsEnd(sent=sent, dropped=self.events_dropped)
        marker = encode(end, minor=self.protocol_minor) if marking else b""
        started_s = progress_s = time.monotonic()
        received = 0
        while True:
            now_s = time.monotonic()
            if marker:
                marker = self._send_marker(marker)
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
            if (reply.ended_sent == sent) if marking else (received >= sent):
                break  # marked: the daemon read the marker, so every event it will ever read
            if now_s - progress_s > CLOSE_STALL_S or now_s - started_s > CLOSE_SETTLE_S:
                if marking:
                    logger.warning(
                        "perseus: closing before the daemon read %d of %d events; counted lost",
                        max(0, sent - received),
                        sent,
                    )
                break
            time.sleep(0.01)
        self.events_lost += max(0, sent - received)

    def _send_marker(self, marker: bytes) -> bytes:
        """Queue the end marker behind the events (b"" once queued; the queue may be full for a while)."""
        datagrams = self._datagrams
        if datagrams is not None and not datagrams.broken:  # on the events' connection: read after them
            return b"" if datagrams.send(marker) or datagrams.broken else marker
        try:
            self._events.send(marker, zmq.NOBLOCK)  # type: ignore[union-attr]
        except zmq.Again:
            return marker
        except zmq.ZMQError:
            pass  # the socket is gone: nothing more will be read; the settle ends on the count
        return b""

    def gpu_uuid(self, device: int | None = None) -> str | None:
        """The UUID of the CUDA device this process computes on (`device`: its CUDA index, default torch's
        current device, else `LOCAL_RANK`, else 0), right under any `CUDA_VISIBLE_DEVICES` remapping.

        torch's own view where this process has CUDA through torch (no daemon needed); otherwise NVML's
        view of `CUDA_VISIBLE_DEVICES` through the daemon's GPU list (`perseus_client.devices`; a whole UUID
        there needs no list). In a container, the daemon's list is of the container's GPUs in its own order
        (`HelloOk.visible_gpus`): device 0 is the first GPU it was given. Without either: None (fail-open) or
        `PerseusClientError` (strict). Raises
        `DeviceLookupError` when the device is not visible or not a whole GPU.
        """
        uuid = devices.cuda_uuid(device)
        if uuid is not None:
            return uuid
        info = self.daemon_info
        visible = os.environ.get(devices.VISIBLE_ENV)
        index = devices.default_device() if device is None else device
        if info is None:
            whole = devices.visible_full_uuid(index, visible)  # named by UUID: no list needed
            if whole is not None:
                return whole
            if self.strict:
                raise unreachable(self, None, "no daemon session: the GPU list is the daemon's")
            return None
        gpus = info.gpus
        if info.visible_gpus is not None:  # in a container: its own GPUs, in its order (docs/containers.md)
            by_uuid = {gpu.uuid: gpu for gpu in info.gpus}
            gpus = tuple(by_uuid[uuid] for uuid in info.visible_gpus if uuid in by_uuid)
        return devices.visible_uuid(
            index,
            [gpu.uuid for gpu in gpus],
            visible,
            node_names=[gpu.name for gpu in gpus],
            order=os.environ.get(devices.ORDER_ENV),
        )

    # ------------------------------------------------------------------ control calls that change something

    def hello(self) -> HelloOk | None:
        """Register this process; the reply says which GPUs the daemon has and the protocol it speaks (from
        then on this client writes the older of the two minors)."""
        return self._act("hello", self._open)

    def _open(self) -> HelloOk:
        """Hello, and the session is open."""
        reply = self._hello()
        self._opened()
        return reply

    def _opened(self) -> None:
        self.managed = True
        self._away = self._away_warned = False

    def _hello(self) -> HelloOk:
        self.protocol_minor = PROTOCOL_MINOR  # the daemon may have been replaced by another version
        self._session_sent = 0  # the daemon counts this session's events from its hello
        self._use_datagrams(None)  # a new session's events go on a new connection (or ZeroMQ's socket)
        self.events_dropped += self._carrier.reset()
        reply = self._call(Hello(job=self.job, client_version=CLIENT_VERSION), HelloOk)
        self.daemon_info = reply
        self.protocol_minor = min(PROTOCOL_MINOR, reply.protocol_minor)
        if reply.event_socket is not None:
            self._use_datagrams(seqpacket.connect(self.runtime_dir, reply.event_socket))
        if self._datagrams is not None and self.protocol_minor >= CARRY_SINCE:
            self._datagrams.send(encode(CarryReady(), minor=self.protocol_minor))
        return reply

    def _use_datagrams(self, events: seqpacket.EventSocket | None) -> None:
        old, self._datagrams = self._datagrams, events
        if old is not None:
            old.close()

    @property
    def events_carried(self) -> int:
        """Events carried: held, then passed on in one datagram with others (protocol 6.11); those of a
        datagram that could not be sent are in `events_dropped` too."""
        return self._carrier.carried

    @property
    def event_transport(self) -> str:
        """How this session's events travel: "seqpacket" (protocol 6.10) or "zmq"."""
        return "zmq" if self._datagrams is None else "seqpacket"

    def claim(self, gpus: Sequence[str]) -> tuple[str, ...]:
        """Lease GPUs (by UUID) for this process; all or nothing. Fail-open: () when not done now (claimed
        when the daemon is back, if it was out of reach)."""
        wanted = tuple(gpus)
        request = Claim(gpus=wanted, job=self.job)
        reply = self._act("claim", lambda: self._call(request, ClaimOk), lambda: self._memory.claim(wanted))
        return () if reply is None else reply.gpus

    def release(self, gpus: Sequence[str] = ()) -> ReleaseOk | None:
        """Release leases (all of them by default); the daemon restores the GPUs. Never claimed again."""
        self._memory.forget_gpus(gpus or list(self._memory.claimed))
        return self._act("release", lambda: self._call(Release(gpus=tuple(gpus)), ReleaseOk))

    def set_clock(self, gpu: str, sm_clock_mhz: int | None) -> int | None:
        """Lock the SM clock of a leased GPU (None unlocks); returns the clock applied (MHz)."""
        request = SetClock(gpu=gpu, sm_clock_mhz=sm_clock_mhz)
        reply = self._act("set_clock", lambda: self._call(request, SetClockOk))
        return None if reply is None else reply.applied_mhz

    def set_plan(self, gpu: str, plan: Sequence[PlanEntry | Mapping[str, Any]]) -> int:
        """Deploy a clock plan on a leased GPU: its computations in schedule order, each with `freq_mhz`.

        Entries are `PlanEntry` or mappings with instruction, microbatch, chunk and freq_mhz. From now on the
        daemon sets each computation's clock as the previous one ends. Returns the number of computations
        (0 when not done now).
        """
        entries = tuple(_plan_entry(entry) for entry in plan)
        plans = self._memory.plans
        request = SetPlan(gpu=gpu, plan=entries)
        reply = self._act(
            "set_plan", lambda: self._call(request, SetPlanOk), lambda: plans.update({gpu: entries})
        )
        return 0 if reply is None else reply.computations

    def clear_plan(self, gpu: str) -> bool:
        """Remove a GPU's plan (its clock stays as it is); returns whether there was one."""
        self._memory.plans.pop(gpu, None)
        reply = self._act("clear_plan", lambda: self._call(ClearPlan(gpu=gpu), ClearPlanOk))
        return reply is not None and reply.cleared

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
    ) -> RegisterOk | None:
        """Join job `job` (default: this client's job) with a GPU this process claimed.

        From now on the daemon profiles, plans and switches this GPU's clocks by itself; send step and
        computation events. `schedule` is "1f1b", "gpipe", "interleaved" (with `chunks` > 1) or "observed".
        `stage_gpus`: the GPUs that run this stage together (tensor x context parallel; each registers the
        same `pipeline` and `stage`). `run`: an id all processes of this run share (the launcher's job id),
        so that a job's stages on several nodes are told apart from another run of the same name.
        Fail-open: None when not done now (registered when the daemon is back, if it was out of reach).
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
        registrations = self._memory.registrations
        remember = lambda: registrations.update({gpu: request})  # noqa: E731
        return self._act("register", lambda: self._call(request, RegisterOk), remember)

    def set_policy(self, policy: str, target: float = 0.0, job: str | None = None) -> SetPolicyOk | None:
        """Choose the frontier point a job runs: fastest, slowdown (target fraction), time (s), min_energy."""
        request = SetPolicy(job=job or self.job, policy=policy, target=target)  # type: ignore[arg-type]
        remember = lambda: self._memory.policies.update({request.job: request})  # noqa: E731
        return self._act("set_policy", lambda: self._call(request, SetPolicyOk), remember)

    def profile_import(
        self, csv_text: str, *, source: str = "<memory>", p_block_w: float = 0.0, job: str | None = None
    ) -> ProfileImportOk | None:
        """Give a job its profile so it skips profiling (before it registers, or while it profiles). A new
        daemon that does not find the job in its cache is given it again."""
        request = ProfileImport(job=job or self.job, csv=csv_text, source=source, p_block_w=p_block_w)
        remember = lambda: self._memory.imports.update({request.job: request})  # noqa: E731
        return self._act("profile_import", lambda: self._call(request, ProfileImportOk), remember)

    def announce_straggler(
        self, pipeline: int, factor: float, job: str | None = None
    ) -> AnnounceStragglerOk | None:
        """Tell the daemon that data-parallel `pipeline` of a job is slow by `factor` (>= 1, e.g. 1.2).

        For what the daemon cannot see in time from the step events: a replica known to be slow from outside
        (thermal throttling or a degraded link reported by the cluster's health checks). Its iterations are
        taken to last `factor` times its plan's time, and the job's other pipelines move to the least-energy
        plan that is no slower; the reply's `shared` says whether the job's other nodes hear of it (etcd).
        The job's owner or an admin may announce; `job` defaults to this client's job.
        """
        _check_pipeline(pipeline)
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor >= 1.0:
            raise ValueError(f"straggler factor must be a number >= 1, e.g. 1.2 (got {factor!r})")
        if not math.isfinite(factor):
            raise ValueError(f"straggler factor must be finite (got {factor!r})")
        request = AnnounceStraggler(job=job or self.job, pipeline=pipeline, factor=float(factor), clear=False)
        return self._act("announce_straggler", lambda: self._call(request, AnnounceStragglerOk))

    def clear_straggler(self, pipeline: int, job: str | None = None) -> AnnounceStragglerOk | None:
        """Withdraw an announced straggler: the job's other pipelines go back to their own policy's plan."""
        _check_pipeline(pipeline)
        request = AnnounceStraggler(job=job or self.job, pipeline=pipeline, factor=1.0, clear=True)
        return self._act("clear_straggler", lambda: self._call(request, AnnounceStragglerOk))

    def _act(self, what: str, call: Callable[[], R], remember: Callable[[], None] | None = None) -> R | None:
        """Run a call that changes something. Done: remembered for a new daemon. Out of reach: remembered too
        (fail-open: None). Refused: not remembered (fail-open: a warning and None). Strict: raises."""
        try:
            result = call()
        except PerseusClientError as exc:
            if exc.lost_link:
                self._went_away(exc)
                if remember is not None:
                    remember()
            if self.strict:
                raise
            self.calls_skipped += 1
            if not exc.lost_link:
                logger.warning("perseus: the daemon refused %s: %s; training goes on", what, exc)
            return None
        if remember is not None:
            remember()
        return result

    # ------------------------------------------------------------------ calls that ask (raise unanswered)

    def status(self) -> StatusReply:
        return self._call(StatusRequest(), StatusReply)

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

    def event_count(self) -> EventCountOk:
        """How many of this process's events the daemon has read, and how many of those it dropped."""
        return self._call(EventCount(), EventCountOk)

    def _call(self, request: Message, expected: type[M]) -> M:
        with self._lock:
            if self._control is None:
                raise PerseusClientError("NOT_CONNECTED", "call connect() first", reached=False)
            if self._away and not (self.strict or self._control.poll(0, zmq.POLLOUT)):
                raise unreachable(self, None, "the daemon is out of reach")  # fail-open: never wait
            try:
                return request_reply(
                    self._control,
                    request,
                    expected,
                    timeout_s=self.timeout_s,
                    request_id=next(self._ids),
                    client=self,
                )
            except PerseusClientError as exc:
                if exc.lost_link:
                    self.managed = False
                raise

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
        if self._datagrams is not None and self.protocol_minor >= CARRY_SINCE:
            self._read_carries()
        self._send_step(b"step_begin", gpu, step)

    def step_end(self, gpu: str, step: int) -> None:
        self._send_step(b"step_end", gpu, step)

    def _send_computation(
        self, kind: bytes, gpu: str, stage: int, instruction: str, microbatch: int, chunk: int
    ) -> None:
        if not self.managed:  # no session: dropped at once, nothing formatted
            self.events_dropped += 1
            return
        try:
            now_ns = time.monotonic_ns()
            frame = self._frames.computation(kind, gpu, stage, instruction, microbatch, chunk, now_ns)
            if not self._carrier.hold(
                kind == b"comp_begin", gpu, (instruction, microbatch, chunk), frame, now_ns
            ):
                self._send_event(frame)
        except Exception:  # never raise into training
            self.events_dropped += 1

    def _send_step(self, kind: bytes, gpu: str, step: int) -> None:
        if not self.managed:
            self.events_dropped += 1
            return
        try:
            self._send_event(self._frames.step(kind, gpu, step, time.monotonic_ns()))
        except Exception:  # never raise into training
            self.events_dropped += 1

    def _send_event(self, data: bytes) -> None:
        """Send one event frame, with the frames held before it, without waiting: counted sent, or dropped
        where the connection is full or gone; ZeroMQ's errors are the caller's to count."""
        datagrams, count = self._datagrams, 1
        if self._carrier.holding:
            data, count = self._carrier.join(data)
        if datagrams is None:
            self._events.send(data, zmq.NOBLOCK)  # type: ignore[union-attr]
        elif not datagrams.send(data):
            self._datagrams_failed(datagrams, count)
            return
        self.events_sent += count
        self._session_sent += count

    def _send_held(self) -> None:
        """Send the frames held (closing: the end marker must follow every event)."""
        data, count = self._carrier.join()
        if not count:
            return
        datagrams = self._datagrams
        if datagrams is None or not datagrams.send(data):
            self.events_dropped += count
            return
        self.events_sent += count
        self._session_sent += count

    def _read_carries(self) -> None:
        """What the daemon said of carried events since the last step (a step's begin asks: one ioctl)."""
        datagrams = self._datagrams
        try:
            while datagrams is not None and (data := datagrams.receive()) is not None:
                message = decode_reply(data).message
                if isinstance(message, Carry):
                    self._carrier.update(message)
        except Exception as exc:  # never raise into training: a frame not understood is passed over
            logger.debug("perseus: a frame from the daemon not understood: %s", exc)

    def _datagrams_failed(self, datagrams: seqpacket.EventSocket, count: int = 1) -> None:
        """Events not sent on the SOCK_SEQPACKET connection: dropped and counted. A connection the daemon
        closed (it went away, or refused it) is given up: the session's further events go to ZeroMQ's socket
        (which drops them while the daemon is away, and carries none); the next session opens a new one."""
        self.events_dropped += count
        if datagrams.broken and self._datagrams is datagrams:
            self._datagrams = None
            datagrams.close()
            self.events_dropped += self._carrier.reset()


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
