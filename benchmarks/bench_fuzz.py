"""Fuzz a real daemon: N generated hostile frames (default 100,000) on its control, admin and event sockets,
pipelined in batches; every control and admin frame must get a decodable reply. Prints JSON: frames sent,
replies, undecodable replies, daemon deaths (it is restarted after one and the run goes on), GPUs left
leased or locked once the fuzzing client is gone, and a well-behaved client's verdict at the end.

`--surface protocol` mutates the first round's requests; `new` the requests added since (energy windows,
the node cap, the power pool, Slurm), with random protocol minors; `http` sends N hostile requests to the
metrics HTTP port (random bytes, mutated request lines and headers, half-open requests, huge heads).

    python benchmarks/bench_fuzz.py [--frames 100000] [--seed 14] [--surface protocol|new|http]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zmq
from perseus_client import PerseusClient
from perseus_client.protocol import ErrorReply, ProtocolError, decode_reply

from tests.support.frames import (
    RawPeer,
    V,
    assert_serves_and_nothing_locked,
    new_surface_bodies,
    random_frame,
    regression_frames,
    valid_bodies,
)
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes

BATCH = 200
REPLY_TIMEOUT_MS = 10_000


def _collect(sock: zmq.Socket[bytes], expected: int, tally: Counter[str]) -> int:
    """Read `expected` replies; returns how many came."""
    got = 0
    while got < expected and sock.poll(REPLY_TIMEOUT_MS):
        data = sock.recv()
        got += 1
        try:
            frame = decode_reply(data, 1 << 30)
        except ProtocolError:
            tally["undecodable"] += 1
            continue
        tally[frame.message.code if isinstance(frame.message, ErrorReply) else "ok"] += 1  # type: ignore[attr-defined]
    return got


def _session(peer: RawPeer, gpu: str) -> None:
    """Say hello and claim, so that lease-holder paths are fuzzed too."""
    peer.ask(V + b'"id":1,"type":"hello","job":"fuzz","client_version":"0"}')
    peer.ask(V + b'"id":2,"type":"claim","gpus":["%s"],"job":"fuzz"}' % gpu.encode())


def fuzz(daemon: DaemonProcess, frames: int, seed: int, surface: str = "protocol") -> dict[str, Any]:
    rng = random.Random(seed)
    runtime_dir = daemon.dirs.runtime_dir
    with PerseusClient(runtime_dir, job="probe", strict=True) as client:
        assert client.daemon_info is not None
        gpu = client.daemon_info.gpus[0].uuid
    tally: Counter[str] = Counter()
    sent = Counter[str]()
    deaths = 0
    missing = 0
    peer = RawPeer(runtime_dir)
    _session(peer, gpu)
    corpus = list(regression_frames(gpu).values()) if surface == "protocol" else []
    bodies = valid_bodies(gpu) + new_surface_bodies(gpu) if surface == "new" else None
    started_s = time.monotonic()
    done = 0
    while done < frames:
        control = admin = 0
        batch = min(BATCH, frames - done)
        for i in range(batch):
            data = corpus[done + i] if done + i < len(corpus) else random_frame(rng, gpu, bodies)
            where = rng.random()
            if where < 0.6:
                peer.control.send(data)
                control += 1
            elif where < 0.7:
                peer.admin.send(data)
                admin += 1
            else:
                peer.events.send(data)
                sent["events"] += 1
        done += batch
        sent["control"] += control
        sent["admin"] += admin
        missing += control - _collect(peer.control, control, tally)
        missing += admin - _collect(peer.admin, admin, tally)
        assert daemon.proc is not None
        if daemon.proc.poll() is not None:
            deaths += 1
            print(f"daemon died after {done} frames:\n{daemon.log()[-3000:]}", file=sys.stderr)
            peer.close()
            daemon.start()
            peer = RawPeer(runtime_dir)
        if done % 10_000 < BATCH:
            _session(peer, gpu)  # a release or admin reset among the frames ends the session's lease
    elapsed_s = time.monotonic() - started_s
    peer.ask(V + b'"id":9,"type":"release","gpus":[]}')  # this process lives on: release, not die
    peer.close()
    verdict = "ok"
    try:
        assert_serves_and_nothing_locked(runtime_dir, state_dir=daemon.dirs.state_dir)
    except AssertionError as exc:
        verdict = str(exc)
    health = daemon.status()["daemon"]
    return {
        "frames": done,
        "sent": dict(sent),
        "replies": dict(tally),
        "undecodable_replies": tally["undecodable"],
        "missing_replies": missing,
        "daemon_deaths": deaths,
        "well_behaved_client_after": verdict,
        "elapsed_s": round(elapsed_s, 1),
        "frames_per_s": round(done / elapsed_s),
        "daemon_errors_by_code": health["errors_by_code"],
        "traceback_in_log": "Traceback" in daemon.log(),
    }


def _http_request(rng: random.Random) -> bytes:
    """One hostile HTTP request for the metrics port."""
    kind = rng.randrange(10)
    if kind == 0:
        return rng.randbytes(rng.randrange(300))
    if kind == 1:
        return b"GET /metrics HTTP/1.1\r\nX: " + b"a" * rng.randrange(20_000)  # huge, unfinished head
    if kind == 2:
        return b"GET /metr"  # half-open
    method = rng.choice([b"GET", b"HEAD", b"POST", b"DELETE", b"", b"G\x00T", b"GET " * 50])
    path = rng.choice([b"/metrics", b"/", b"/../../etc/passwd", b"/metrics?x=1", b"*", b"/%00", b"/" * 5000])
    version = rng.choice([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/9", b"", b"FTP/1.0"])
    headers = b"".join(
        rng.choice([b"Accept: application/openmetrics-text\r\n", b"Accept: \xff\xfe\r\n",
                    b"Host: x\r\n", b"Content-Length: -1\r\n", b": :\r\n", b"\r\n"])
        for _ in range(rng.randrange(5))
    )  # fmt: skip
    return b" ".join(part for part in (method, path, version) if part) + b"\r\n" + headers + b"\r\n"


def fuzz_http(daemon: DaemonProcess, port: int, requests: int, seed: int) -> dict[str, Any]:
    import socket

    rng = random.Random(seed)
    tally: Counter[str] = Counter()
    deaths = 0
    started_s = time.monotonic()
    for _ in range(requests):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2.0) as conn:
                conn.sendall(_http_request(rng))
                if rng.random() < 0.5:
                    conn.shutdown(socket.SHUT_WR)
                    reply = conn.recv(12)
                    tally[reply[9:12].decode(errors="replace") or "closed"] += 1
                else:
                    tally["hung up"] += 1
        except OSError as exc:
            tally[type(exc).__name__] += 1
        assert daemon.proc is not None
        if daemon.proc.poll() is not None:
            deaths += 1
            print(f"daemon died:\n{daemon.log()[-3000:]}", file=sys.stderr)
            daemon.start()
    elapsed_s = time.monotonic() - started_s
    verdict = "ok"
    try:
        assert_serves_and_nothing_locked(daemon.dirs.runtime_dir, state_dir=daemon.dirs.state_dir)
    except AssertionError as exc:
        verdict = str(exc)
    return {
        "requests": requests,
        "replies": dict(tally),
        "daemon_deaths": deaths,
        "well_behaved_client_after": verdict,
        "elapsed_s": round(elapsed_s, 1),
        "requests_per_s": round(requests / elapsed_s),
        "traceback_in_log": "Traceback" in daemon.log(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--surface", choices=("protocol", "new", "http"), default="protocol")
    args = parser.parse_args()
    with daemon_processes() as make:
        if args.surface == "http":
            import socket

            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            env = {"PERSEUSD_METRICS_HTTP_PORT": str(port)}
            daemon = make(DaemonDirs.create(), gpus=2, env=env).start()
            print(json.dumps(fuzz_http(daemon, port, args.frames, args.seed), indent=2))
            return
        daemon = make(DaemonDirs.create(), gpus=2).start()
        print(json.dumps(fuzz(daemon, args.frames, args.seed, args.surface), indent=2))


if __name__ == "__main__":
    main()
