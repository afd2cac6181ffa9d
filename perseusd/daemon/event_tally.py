"""A session's events, reconciled at its end marker (no transport here).

A closing client sends `events_end` ("I sent S events since my hello, and dropped D before sending") as the
last frame of its event stream. The daemon reads it after every event before it, so the session's figures
are final then: of the S events sent, R were read (used, or dropped for a reason: `NOT_LEASED` for the
backlog of a released lease, `OUT_OF_ORDER`, ...) and S - R never reached the daemon (lost in transit: the
link broke, or the process was killed with events still queued). The client reads the same figures back
(`event_count_ok`'s `ended_sent`), so both sides count every event once and agree: sent = used + dropped +
lost.
"""

from __future__ import annotations

from dataclasses import dataclass

from perseus_client.protocol import EventsEnd

from perseusd.leasing.leases import Session


@dataclass(frozen=True)
class Reconciled:
    """One session's events at its end marker."""

    pid: int
    job: str
    sent: int
    """Events the client sent since its hello (the marker's `sent`)."""
    read: int
    """Events the daemon read of them (used or dropped)."""
    dropped: int
    """Of those read, the ones dropped (by reason in `dropped_by_code`)."""
    dropped_by_code: dict[str, int]
    lost: int
    """Sent and never read: `sent - read` (0 when the client claims fewer than were read)."""
    client_dropped: int
    """Events the client dropped before sending (its queue was full, or it had no session)."""
    new_lost: int
    """Of `lost`, those not counted at an earlier marker of the same session."""

    @property
    def used(self) -> int:
        return self.read - self.dropped

    @property
    def closes(self) -> bool:
        """Whether the figures close: every event sent was read or lost, and no more were read than sent."""
        return self.read <= self.sent

    def describe(self) -> str:
        """The session's log line."""
        reasons = ", ".join(f"{code} {count}" for code, count in sorted(self.dropped_by_code.items()))
        surplus = "" if self.closes else f"; read {self.read - self.sent} more than the client says it sent"
        return (
            f"events of process {self.pid} (job {self.job!r}): sent {self.sent}, read {self.read} "
            f"(used {self.used}, dropped {self.dropped}{': ' + reasons if reasons else ''}), "
            f"lost in transit {self.lost}; the client dropped {self.client_dropped} before sending{surplus}"
        )


def reconcile(session: Session, marker: EventsEnd) -> Reconciled:
    """Close `session`'s figures at `marker` and remember that it was read (the client asks for it)."""
    read = session.events_received
    lost = max(0, marker.sent - read)
    new_lost = max(0, lost - session.lost_counted)
    session.lost_counted = max(session.lost_counted, lost)
    session.ended_sent = marker.sent
    return Reconciled(
        pid=session.caller.pid,
        job=session.job,
        sent=marker.sent,
        read=read,
        dropped=session.events_dropped,
        dropped_by_code=dict(session.dropped_by_code),
        lost=lost,
        client_dropped=marker.dropped,
        new_lost=new_lost,
    )
