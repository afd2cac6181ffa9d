"""What the transport alone costs per event: ZeroMQ PUSH/PULL (what perseusd uses) against a Unix
SOCK_SEQPACKET socket read directly by the receiver's poll loop, with the same frames, the same pacing and the
same receiver loop (a `zmq.Poller` wake-up per event, every ready frame read, nothing done with it).

Each frame is one event in the client library's exact form, sent one per `--gap-ms` (one per wake-up, as a
training process sends them). Reported per transport (median of `--rounds` runs, alternated): the receiver's
CPU per event and the sender's (its whole process: the sending thread and, for ZeroMQ, its I/O thread), from
the kernel's per-process CPU clock. This is the floor under the daemon's CPU per event
(benchmarks/bench_event_cost.py) that no work on the daemon's own Python can remove: ZeroMQ wakes an I/O
thread in the sender and one in the receiver for every event, besides the receiver's loop; a socket the loop
reads itself wakes the loop only. Peer credentials (SO_PEERCRED) are read once per connection in both.

Run timing-sensitive: `flock /tmp/perseus-bench.lock python benchmarks/bench_event_transport.py`; the load is
printed beside the numbers. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

FRAME = (
    b'{"v":6,"id":0,"type":"comp_end","gpu":"GPU-00000000-0000-0000-0000-000000000000","stage":0,'
    b'"instruction":"forward","microbatch":3,"chunk":0,"timestamp_ns":123456789012345}'
)
TRANSPORTS = ("zeromq", "seqpacket")


def _cpu_s() -> float:
    """This process's CPU seconds, every thread (ZeroMQ's I/O thread included), at nanosecond resolution."""
    return time.process_time()


def receive(transport: str, path: Path, events: int) -> dict[str, Any]:
    """The receiver (a child process): binds, reads `events` frames, reports its CPU per event."""
    poller = zmq.Poller()
    ctx = zmq.Context()
    listener: socket.socket | None = None
    if transport == "zeromq":
        pull = ctx.socket(zmq.PULL)
        pull.bind(f"ipc://{path}")
        poller.register(pull, zmq.POLLIN)
    else:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(str(path))
        listener.listen(16)
    print("ready", flush=True)
    conn: socket.socket | None = None
    if listener is not None:
        conn, _ = listener.accept()
        struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))  # once per peer
        conn.setblocking(False)
        poller.register(conn.fileno(), zmq.POLLIN)
    read = wakeups = 0
    started_s: float | None = None
    while read < events:
        ready = poller.poll(1000)
        if not ready:
            continue
        wakeups += 1
        while True:
            try:
                data = conn.recv(4096) if conn is not None else pull.recv(zmq.NOBLOCK)
            except (zmq.Again, BlockingIOError):
                break
            if not data:
                raise SystemExit("the sender went away")
            read += 1
            if started_s is None:  # measured from the first frame on: connection set-up apart
                started_s = _cpu_s()
                read, wakeups = 0, 0
    assert started_s is not None
    used_s = _cpu_s() - started_s
    ctx.destroy(linger=0)
    return {
        "receiver_us_per_event": round(used_s / read * 1e6, 1),
        "frames_per_wakeup": round(read / wakeups, 2),
    }


def send(transport: str, path: Path, events: int, gap_s: float) -> float:
    """Send `events` + 1 frames (the first connects), one per `gap_s`; this process's CPU per event (us)."""
    ctx = zmq.Context()
    if transport == "zeromq":
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 2000)
        push.connect(f"ipc://{path}")
        push.send(FRAME)
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.connect(str(path))
        sock.setblocking(False)
        sock.send(FRAME)
    time.sleep(0.2)
    started_s = _cpu_s()
    for _ in range(events):
        if transport == "zeromq":
            push.send(FRAME, zmq.NOBLOCK)
        else:
            sock.send(FRAME)
        time.sleep(gap_s)
    used_s = _cpu_s() - started_s - events * _sleep_cpu_s()
    ctx.destroy(linger=2000)
    return used_s / events * 1e6


_SLEEP_CPU_S: list[float] = []


def _sleep_cpu_s() -> float:
    """CPU of one `time.sleep` call alone (measured once), taken off the sender's figure: the pacing is not
    the transport's."""
    if not _SLEEP_CPU_S:
        started_s = _cpu_s()
        for _ in range(500):
            time.sleep(0.0005)
        _SLEEP_CPU_S.append((_cpu_s() - started_s) / 500)
    return _SLEEP_CPU_S[0]


def one_run(transport: str, events: int, gap_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="perseus-transport-") as tmp:
        path = Path(tmp) / "events.sock"
        command = [sys.executable, str(Path(__file__).resolve()), "--receiver", transport, str(path)]
        command += ["--events", str(events)]
        receiver = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        try:
            assert receiver.stdout is not None
            if receiver.stdout.readline().strip() != "ready":
                raise RuntimeError("the receiver did not start")
            _sleep_cpu_s()
            sender_us = send(transport, path, events, gap_s)
            out, _ = receiver.communicate(timeout=120)
        finally:
            if receiver.poll() is None:
                receiver.kill()
                receiver.wait()
        result: dict[str, Any] = json.loads(out)
        return {"transport": transport, "sender_us_per_event": round(sender_us, 1), **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=4000)
    parser.add_argument("--gap-ms", type=float, default=1.0, help="pause after each frame (one per wake-up)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--receiver", nargs=2, metavar=("TRANSPORT", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.receiver:
        print(json.dumps(receive(args.receiver[0], Path(args.receiver[1]), args.events)))
        return
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {t: [] for t in TRANSPORTS}
    for round_index in range(args.rounds):
        order = TRANSPORTS if round_index % 2 == 0 else TRANSPORTS[::-1]
        for transport in order:
            runs[transport].append(one_run(transport, args.events, args.gap_ms / 1e3))
    summary = {
        transport: {
            "receiver_us_per_event_median": statistics.median(r["receiver_us_per_event"] for r in results),
            "sender_us_per_event_median": statistics.median(r["sender_us_per_event"] for r in results),
            "runs": results,
        }
        for transport, results in runs.items()
    }
    print(
        json.dumps(
            {
                "load_avg_before": [round(x, 2) for x in load_before],
                "load_avg_after": [round(x, 2) for x in os.getloadavg()],
                "cpus": os.cpu_count(),
                "events": args.events,
                "gap_ms": args.gap_ms,
                "results": summary,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
