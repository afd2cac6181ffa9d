"""The core's side of the event stream (hot path): events from lease holders applied to the order checks,
the plans and the jobs, every frame counted, each session's end marker reconciled, and the carried events
told back to the processes that carry (protocol 6.11).

`core.DaemonCore` extends `EventDelivery` with requests, restore and status; the IPC layer's event intake
(`event_intake.py`) calls these methods through the core's port (`tests/daemon/test_ipc_port.py`). Nothing
here logs per event.
"""

from __future__ import annotations

import logging

from perseus_client.protocol import (
    Carry,
    ComputationBegin,
    ComputationEnd,
    ErrorCode,
    EventsEnd,
    Message,
    ProtocolError,
)

from perseusd.daemon.event_tally import reconcile
from perseusd.daemon.events import EventTracker
from perseusd.daemon.wire_errors import protocol_error
from perseusd.errors import PerseusError
from perseusd.gpu.registry import GpuRegistry
from perseusd.jobs.manager import JobManager
from perseusd.leasing.identity import Caller
from perseusd.leasing.leases import Lease, LeaseBook
from perseusd.switching.plans import PlanBook

logger = logging.getLogger(__name__)


class EventDelivery:
    """Events in from the processes that hold leases, counted; carried events out to them."""

    def __init__(
        self,
        registry: GpuRegistry,
        leases: LeaseBook,
        tracker: EventTracker,
        plans: PlanBook,
        jobs: JobManager | None,
    ) -> None:
        self.registry = registry
        self.leases = leases
        self.tracker = tracker
        self.plans = plans
        self.jobs = jobs

    def on_event(self, caller: Caller, message: Message) -> None:
        """Apply one begin/end event; raises `ProtocolError` or a domain error (the caller counts and drops
        it)."""
        lease = self.leases.holder(message.gpu)  # type: ignore[attr-defined]
        if lease is None or lease.pid != caller.pid:
            self._reject_event_sender(caller, message.gpu, lease)  # type: ignore[attr-defined]
        self.tracker.apply(message)
        if isinstance(message, ComputationEnd):
            key = (message.instruction, message.microbatch, message.chunk)
            self.plans.on_end(message.gpu, key, self.plans.now_ns(), message.timestamp_ns)
        elif isinstance(message, ComputationBegin):
            key = (message.instruction, message.microbatch, message.chunk)
            self.plans.on_begin(message.gpu, key, self.plans.now_ns(), message.timestamp_ns)
        if self.jobs is not None:
            self.jobs.on_event(message)

    def accepts_events_from(self, pid: int) -> bool:
        """Whether process `pid` holds a lease: the event path's first, cheapest check (others' events are
        dropped unread with `count_dropped(pid, ErrorCode.NOT_LEASED)`)."""
        return self.leases.holds_lease(pid)

    def count_received(self) -> None:
        """An event frame arrived (counted before it is decoded: a bad frame is received, then dropped)."""
        self.tracker.received += 1

    def deliver_event(self, caller: Caller, message: Message) -> None:
        """Apply an event (`on_event`) and count it for the sender's session; raises `ProtocolError`,
        uncounted: the transport then calls `count_dropped`."""
        try:
            self.on_event(caller, message)
        except PerseusError as exc:  # a domain error reads as it does for a request (`handle`)
            mapped = protocol_error(exc)
            if mapped is None:
                raise
            raise mapped from None
        self.leases.count_event(caller.pid, dropped=False)

    def count_dropped(self, pid: int | None, code: ErrorCode | None = None) -> None:
        """An event dropped: counted, under `code` when given (else the request's error reply counts it),
        and for the sender's session when the sender is known."""
        tracker = self.tracker
        tracker.dropped += 1
        if code is not None:
            tracker.reject(code)
        if pid is not None:
            self.leases.count_event(pid, dropped=True, code=code)

    def end_events(self, caller: Caller, marker: EventsEnd) -> None:
        """A client's end marker, read in stream order after every event before it: reconcile its session
        (`event_tally`), count what never arrived in `events_lost` and log the session's figures. The
        transport counted the frame as received; a marker is not an event, so it is taken back out."""
        self.tracker.received -= 1
        session = self.leases.event_session(caller.pid)
        if session is None or session.caller.uid != caller.uid:
            logger.warning("end of events from process %d, which has no session: ignored", caller.pid)
            return
        tally = reconcile(session, marker)
        self.tracker.lost += tally.new_lost
        log = logger.info if tally.closes else logger.warning
        log("%s", tally.describe())

    def carry_waiting(self) -> bool:
        """Whether a GPU's carried events changed since `take_carries` (one dict's truth: the loop asks after
        every wake-up)."""
        return bool(self.plans.carry_changes)

    def take_carries(self) -> list[tuple[int, Carry]]:
        """What to tell which process of its GPUs' carried events (protocol 6.11): (pid, message), for the
        lease holders that said they carry (`carry_ready`); forgets the changes."""
        told: list[tuple[int, Carry]] = []
        for gpu, computations in self.plans.take_carry_changes().items():
            lease = self.leases.holder(gpu)
            if lease is not None and self._carries(lease.pid):
                told.append((lease.pid, Carry(gpu=gpu, computations=computations)))
        return told

    def carry_ready(self, caller: Caller) -> list[Carry]:
        """A client's `carry_ready` (the first frame of its event connection): it carries from now on; what
        it may carry of its GPUs' events now. A stream frame, not an event: taken back out of the count."""
        self.tracker.received -= 1
        session = self.leases.event_session(caller.pid)
        if session is None or session.caller.uid != caller.uid:
            return []
        session.carries = True
        return [Carry(gpu=gpu, computations=self.plans.carried(gpu)) for gpu in sorted(session.gpus)]

    def _carries(self, pid: int) -> bool:
        session = self.leases.session(pid)
        return session is not None and session.carries

    def _reject_event_sender(self, caller: Caller, gpu: str, lease: Lease | None) -> None:
        if lease is None:
            code = ErrorCode.UNKNOWN_GPU if gpu not in self.registry else ErrorCode.NOT_LEASED
            raise ProtocolError(code, f"GPU {gpu} is not leased by this process")
        self.leases.check_claim(caller, gpu)
        raise ProtocolError(ErrorCode.GPU_BUSY, f"GPU {gpu} is leased by another process")
