"""Event accounting closes exactly on both sides (protocol 6.9's end marker, `events_end`).

Client processes send paced events from real processes while the daemon reads them; each ends its stream
with the marker, so the daemon reconciles the session (read, used, dropped by reason, lost in transit) and the
client's `events_lost` is exactly what the daemon never read. Both sides' figures are compared per process.
The assertions are equalities of counts: how fast the machine is changes the figures, never whether they
close.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import zmq
from perseus_client import PerseusClient
from perseus_client.event_sending import CLOSE_SETTLE_S
from perseus_client.protocol import PROTOCOL_MAJOR, EventsEnd, encode

from perseusd.daemon.event_tally import reconcile
from perseusd.leasing.identity import Caller
from perseusd.leasing.leases import LeaseBook, Session
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes
from tests.support.polling import wait_until
from tests.support.sockets import connected, zmq_context

pytestmark = pytest.mark.timeout(180)

CLIENTS = 8
RATE_HZ = 2000
SECONDS = 2.0
SENDER = r"""
import json, sys, time
from perseus_client import PerseusClient

runtime_dir, index, rate_hz, seconds, release = sys.argv[1:6]
client = PerseusClient(runtime_dir, job=f"acct-{index}", timeout_s=10, strict=True)
gpu = client.daemon_info.gpus[int(index)].uuid
client.claim([gpu])
started_s = time.monotonic()
microbatch = 0
while (now_s := time.monotonic()) < started_s + float(seconds):
    if 2 * microbatch >= (now_s - started_s) * float(rate_hz):
        time.sleep(0.001)
        continue
    client.computation_begin(gpu, 0, "forward", microbatch)
    client.computation_end(gpu, 0, "forward", microbatch)
    microbatch += 1
transport = client.event_transport
if release == "1":
    client.release()  # the backlog is then read unread: counted dropped (NOT_LEASED) in the session
client.close()
print(json.dumps({"sent": client.events_sent, "dropped": client.events_dropped, "lost": client.events_lost,
                  "attempted": 2 * microbatch, "transport": transport}))
"""
LINE = re.compile(
    r"events of process (\d+) \(job '([^']*)'\): sent (\d+), read (\d+) \(used (\d+), dropped (\d+)[^)]*\), "
    r"lost in transit (\d+)"
)


def _tallies(daemon: DaemonProcess) -> dict[str, dict[str, int]]:
    """The daemon's per-session log lines, by job."""
    out = {}
    for match in LINE.finditer(daemon.log()):
        _pid, job, sent, read, used, dropped, lost = match.groups()
        out[job] = {"sent": int(sent), "read": int(read), "used": int(used), "dropped": int(dropped)}
        out[job]["lost"] = int(lost)
    return out


@pytest.mark.parametrize("transport", ["seqpacket", "zmq"])
def test_a_flood_of_eight_processes_closes_exactly_on_both_sides(transport: str) -> None:
    """Over the SOCK_SEQPACKET event socket (protocol 6.10), and over ZeroMQ's where the daemon serves no
    other (`seqpacket_events = false`, as a daemon of 6.9 does)."""
    env = {} if transport == "seqpacket" else {"PERSEUSD_SEQPACKET_EVENTS": "false"}
    with daemon_processes() as make:
        daemon = make(DaemonDirs.create(), gpus=CLIENTS, env=env).start()
        runtime_dir = str(daemon.dirs.runtime_dir)
        before = daemon.status()["daemon"]
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", SENDER, runtime_dir, str(i), str(RATE_HZ), str(SECONDS), str(i % 2)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(CLIENTS)
        ]
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=SECONDS + CLOSE_SETTLE_S + 60)
            assert proc.returncode == 0
            results.append(json.loads(out))
        after = daemon.status()["daemon"]
        tallies = _tallies(daemon)
        for index, client in enumerate(results):
            daemon_side = tallies[f"acct-{index}"]
            assert client["transport"] == transport
            assert client["sent"] + client["dropped"] == client["attempted"]
            assert daemon_side["sent"] == client["sent"]
            assert daemon_side["lost"] == client["lost"]
            assert daemon_side["read"] + daemon_side["lost"] == client["sent"]
            assert daemon_side["used"] + daemon_side["dropped"] == daemon_side["read"]
            if index % 2 == 0:  # closed holding its lease: every event read was used, but for an end
                # whose begin the client dropped (its buffer full on a starved machine): refused as
                # OUT_OF_ORDER, never more than the client dropped
                assert daemon_side["dropped"] <= client["dropped"]
        read = sum(client["sent"] - client["lost"] for client in results)
        assert after["events_received"] - before["events_received"] == read  # the markers are not events
        assert after["events_lost"] - before["events_lost"] == sum(client["lost"] for client in results)
        dropped = sum(t["dropped"] for t in tallies.values())
        assert after["events_dropped"] - before["events_dropped"] == dropped
        codes = {
            code: after["errors_by_code"].get(code, 0) - before["errors_by_code"].get(code, 0)
            for code in ("NOT_LEASED", "OUT_OF_ORDER")
        }
        assert codes["NOT_LEASED"] + codes["OUT_OF_ORDER"] == dropped
        assert codes["OUT_OF_ORDER"] <= sum(client["dropped"] for client in results)


def _claim_and_send(client: PerseusClient, microbatches: int) -> None:
    """Claim the daemon's first GPU and send a forward's begin and end for each of `microbatches`."""
    gpu = client.daemon_info.gpus[0].uuid  # type: ignore[union-attr]
    client.claim([gpu])
    for microbatch in range(microbatches):
        client.computation_begin(gpu, 0, "forward", microbatch)
        client.computation_end(gpu, 0, "forward", microbatch)


def test_a_client_that_predates_the_marker_settles_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """A newer daemon with an older client: no marker, the count is taken when it reaches what was sent."""
    monkeypatch.setattr("perseus_client.event_sending.EVENTS_END_SINCE", 10**6)
    with daemon_processes() as make:
        daemon = make(DaemonDirs.create(), gpus=1).start()
        with PerseusClient(daemon.dirs.runtime_dir, job="old", timeout_s=10) as client:
            _claim_and_send(client, microbatches=100)  # 200 events: within any kernel's socket buffer
        assert (client.events_sent, client.events_lost) == (200, 0)
        health = daemon.status()["daemon"]
        assert health["events_received"] == 200
        assert "events of process" not in daemon.log()


def _push_marker(ctx: zmq.Context[zmq.Socket[bytes]], runtime_dir: Path) -> zmq.Socket[bytes]:
    """Send an end marker ("5 sent") on the daemon's event socket from this process (no session)."""
    push = connected(ctx, zmq.PUSH, runtime_dir / "events.sock")
    push.send(encode(EventsEnd(sent=5, dropped=0)))
    return push  # the caller holds it while the daemon reads (linger 0 drops what is unsent at close)


def test_an_older_daemon_is_sent_no_marker_and_refuses_one_cleanly() -> None:
    """A daemon speaking 6.8: the client sends no marker (its count settles as before); a marker sent anyway
    is refused as an unknown type, counted as a dropped frame, and the daemon keeps serving."""
    with daemon_processes() as make:
        daemon = make(
            DaemonDirs.create(), gpus=1, env={"PERSEUSD_PROTOCOL_MINOR": str(EventsEnd.SINCE - 1)}
        ).start()
        runtime_dir = daemon.dirs.runtime_dir
        with PerseusClient(runtime_dir, job="new", timeout_s=10) as client:
            assert client.protocol_minor == EventsEnd.SINCE - 1
            _claim_and_send(client, microbatches=100)
        assert (client.events_sent, client.events_lost) == (200, 0)
        health = daemon.status()["daemon"]
        assert health["events_received"] == 200
        assert health["errors_by_code"].get("UNKNOWN_TYPE", 0) == 0
        with zmq_context() as ctx, _push_marker(ctx, runtime_dir):
            refused = lambda: daemon.status()["daemon"]["errors_by_code"].get("UNKNOWN_TYPE", 0) == 1  # noqa: E731
            wait_until(refused, 60, "the marker refused as an unknown type")
        health = daemon.status()["daemon"]
        assert (health["events_received"], health["events_dropped"]) == (201, 1)


def test_a_marker_from_a_process_without_a_session_is_ignored_and_not_counted() -> None:
    with daemon_processes() as make:
        daemon = make(DaemonDirs.create(), gpus=1).start()
        with zmq_context() as ctx, _push_marker(ctx, daemon.dirs.runtime_dir):
            wait_until(lambda: "which has no session" in daemon.log(), 60, "the marker ignored")
        health = daemon.status()["daemon"]
        assert (health["events_received"], health["events_dropped"], health["events_lost"]) == (0, 0, 0)


def test_reconcile_counts_what_was_never_read_once() -> None:
    session = Session(caller=Caller(pid=7, uid=1000, gid=1000), start_time=1, pidfd=-1, job="j")
    session.events_received, session.events_dropped = 90, 4
    session.dropped_by_code = {"NOT_LEASED": 3, "OUT_OF_ORDER": 1}
    first = reconcile(session, EventsEnd(sent=100, dropped=2))
    assert (first.read, first.used, first.dropped, first.lost, first.new_lost) == (90, 86, 4, 10, 10)
    assert session.ended_sent == 100
    assert "sent 100, read 90 (used 86, dropped 4: NOT_LEASED 3, OUT_OF_ORDER 1), lost in transit 10" in (
        first.describe()
    )
    again = reconcile(session, EventsEnd(sent=100, dropped=2))  # a second close: nothing newly lost
    assert (again.lost, again.new_lost) == (10, 0)
    surplus = reconcile(session, EventsEnd(sent=80, dropped=0))
    assert (surplus.lost, surplus.closes) == (0, False)
    assert "read 10 more than the client says it sent" in surplus.describe()


def test_frames_are_written_as_the_daemon_reads_them() -> None:
    """The marker starts as every frame of a newer minor does: the daemon decodes it even without a lease."""
    head = b'{"v":%d,"id":0,"m":' % PROTOCOL_MAJOR
    assert encode(EventsEnd(sent=1, dropped=0)).startswith(head)


def test_events_read_after_the_process_exited_count_in_its_session() -> None:
    """A session dropped (its process gone) keeps counting the backlog read after it, until its end marker
    reconciles it; a new process of the same pid starts from zero."""
    leases = LeaseBook()
    caller = Caller(uid=os.getuid(), gid=os.getgid(), pid=os.getpid())
    leases.register(caller, "gone")
    leases.count_event(caller.pid, dropped=False)
    assert leases.drop_session(caller.pid) == []
    leases.count_event(caller.pid, dropped=True, code="NOT_LEASED")
    ended = leases.event_session(caller.pid)
    assert ended is not None
    assert (ended.events_received, ended.events_dropped, ended.dropped_by_code) == (2, 1, {"NOT_LEASED": 1})
    assert reconcile(ended, EventsEnd(sent=3, dropped=0)).lost == 1
    fresh = leases.register(caller, "again")
    assert leases.event_session(caller.pid) is fresh
    assert (fresh.events_received, fresh.ended_sent) == (0, None)
    leases.count_event(caller.pid, dropped=False)
    assert leases.register(caller, "again") is fresh  # a hello again: the count restarts, as the client's
    assert fresh.events_received == 0
    leases.drop_session(caller.pid)
