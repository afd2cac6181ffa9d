"""End to end: identity from the kernel, other users kept out, hostile frames answered and survived."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq
from perseus_client import PerseusClient
from perseus_client.protocol import PROTOCOL_VERSION, ErrorReply, StatusReply, StatusRequest, decode_reply

from perseusd.ctl.daemon_link import DaemonUnreachableError, ask
from tests.support.frames import V
from tests.support.perseusd_proc import (
    NOBODY_UID,
    DaemonDirs,
    DaemonProcess,
    client_outcome,
    run_as_user,
)
from tests.support.sockets import connected

pytestmark = pytest.mark.timeout(60)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching to uid nobody needs root")


@needs_root
def test_process_of_another_uid_rejected(make_daemon: Callable[..., DaemonProcess], dirs: DaemonDirs) -> None:
    daemon = make_daemon(dirs, gpus=1, env={"PERSEUSD_SOCKET_GROUP": "perseus-test-missing"}).start()
    # Open the file-system layer on purpose, so that only the ZAP check by kernel uid stands in the way.
    dirs.runtime_dir.chmod(0o755)
    for sock in dirs.runtime_dir.glob("*.sock"):
        sock.chmod(0o666)
    runtime_dir = dirs.runtime_dir
    code, message = run_as_user(lambda: client_outcome(runtime_dir, lambda c: c.hello()))
    assert code == "PERMISSION_DENIED", message
    for admin in (False, True):  # perseusctl's own ZeroMQ link meets the same handshake
        ctl_message = run_as_user(lambda admin=admin: _ctl_outcome(runtime_dir, admin=admin))
        assert "refused this user" in ctl_message, ctl_message
    health = daemon.status()["daemon"]
    assert health["auth_rejected"] >= 1  # type: ignore[index]
    assert health["clients"] == 0  # type: ignore[index]


@needs_root
def test_lease_of_another_users_gpu_rejected(
    make_daemon: Callable[..., DaemonProcess], dirs: DaemonDirs
) -> None:
    daemon = make_daemon(dirs, gpus=2, env={"PERSEUSD_SOCKET_GROUP": "nogroup"}).start()
    uuids = [str(row["uuid"]) for row in daemon.status()["gpus"]]  # type: ignore[union-attr]
    runtime_dir = dirs.runtime_dir
    with PerseusClient(runtime_dir, job="root-job") as owner:
        owner.claim([uuids[0]])

        def as_nobody() -> dict[str, tuple[str, object]]:
            return {
                "claim_taken": client_outcome(runtime_dir, lambda c: c.claim([uuids[0]])),
                "set_clock_taken": client_outcome(runtime_dir, lambda c: c.set_clock(uuids[0], 1000)),
                "release_taken": client_outcome(runtime_dir, lambda c: c.release([uuids[0]])),
                "claim_free": client_outcome(runtime_dir, lambda c: c.claim([uuids[1]])),
            }

        results = run_as_user(as_nobody)
        assert results["claim_taken"][0] == "PERMISSION_DENIED"
        assert results["set_clock_taken"][0] == "PERMISSION_DENIED"
        assert results["release_taken"][0] == "PERMISSION_DENIED"
        assert results["claim_free"] == ("ok", (uuids[1],))
        row = daemon.status()["gpus"][0]  # type: ignore[index]
        assert row["lease"]["uid"] == 0  # still ours
        assert owner.set_clock(uuids[0], 1005) is not None


def _ctl_outcome(runtime_dir: Path, *, admin: bool) -> str:
    """What perseusctl's link to the daemon says when asking for the status."""
    try:
        ask(runtime_dir, StatusRequest(), StatusReply, admin=admin)
    except DaemonUnreachableError as exc:
        return str(exc)
    return "ok"


def _raw_request(sock: zmq.Socket[bytes], frames: list[bytes]) -> ErrorReply:
    sock.send_multipart(frames)
    assert sock.poll(5000), "no reply to a bad frame"
    reply = decode_reply(sock.recv(), 1 << 24).message
    assert isinstance(reply, ErrorReply)
    return reply


def test_garbage_truncated_and_huge_frames_get_errors(
    make_daemon: Callable[..., DaemonProcess], dirs: DaemonDirs
) -> None:
    daemon = make_daemon(dirs, gpus=1).start()
    good = PerseusClient(dirs.runtime_dir, job="bystander")
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    raw = connected(ctx, zmq.DEALER, dirs.runtime_dir / "control.sock")
    try:
        uuid = good.daemon_info.gpus[0].uuid  # type: ignore[union-attr]
        good.claim([uuid])
        cases = {
            "BAD_FRAME": [b"\x00\xffgarbage"],
            "BAD_FRAME ": [V + b'"id":7,"type":"cla'],  # truncated
            "TOO_LARGE": [V + b'"id":8,"type":"status","x":"' + b"a" * (1 << 20) + b'"}'],
            "UNKNOWN_TYPE": [V + b'"id":9,"type":"format_disk"}'],
            "VERSION_MISMATCH": [b'{"v":99,"id":10,"type":"status"}'],
            "BAD_FIELD": [V + b'"id":11,"type":"claim","gpus":"all","job":"x"}'],
            "BAD_FRAME  ": [b"{}", b"two frames"],
            "PERMISSION_DENIED": [V + b'"id":13,"type":"admin_reset","gpus":[]}'],
        }
        for expected, frames in cases.items():
            reply = _raw_request(raw, frames)
            assert reply.code == expected.strip(), (expected, reply)
            assert good.status().daemon.clients >= 1  # the other client keeps working in between
        # Out of order: an end without its begin, sent on the control socket to see the answer (the raw socket
        # lives in this process, which holds the GPU through `good`: identity is per process).
        raw.send(
            json.dumps(
                {"v": PROTOCOL_VERSION, "id": 14, "type": "hello", "job": "raw", "client_version": "x"}
            ).encode()
        )
        assert raw.poll(5000)
        raw.recv()
        end = {
            "gpu": uuid,
            "stage": 0,
            "instruction": "forward",
            "microbatch": 0,
            "chunk": 0,
            "timestamp_ns": 1,
        }
        reply = _raw_request(
            raw, [json.dumps({"v": PROTOCOL_VERSION, "id": 15, "type": "comp_end", **end}).encode()]
        )
        assert reply.code == "OUT_OF_ORDER"
        good.computation_end(uuid, 0, "forward", 0)  # out of order on the event socket: dropped and counted
        # Garbage on the event socket: dropped and counted, never a crash.
        push = connected(ctx, zmq.PUSH, dirs.runtime_dir / "events.sock")
        for junk in (b"junk", V + b'"id":0,"type":"status"}', b"x" * 200_000):
            push.send(junk)
        with good.computation(uuid, 0, "forward", 1):
            pass
        deadline_s = time.monotonic() + 5
        while (health := good.status().daemon).events_dropped < 4:
            assert time.monotonic() < deadline_s, f"bad events not counted: {health}"
            time.sleep(0.02)
        assert health.errors_by_code.get("OUT_OF_ORDER", 0) >= 1
        assert good.set_clock(uuid, 1100) is not None
        assert daemon.proc is not None
        assert daemon.proc.poll() is None
    finally:
        good.close()
        ctx.destroy(linger=0)


def test_status_for_other_uid_hides_foreign_job(
    make_daemon: Callable[..., DaemonProcess], dirs: DaemonDirs
) -> None:
    if os.geteuid() != 0:
        pytest.skip("switching to uid nobody needs root")
    daemon = make_daemon(dirs, gpus=1, env={"PERSEUSD_SOCKET_GROUP": "nogroup"}).start()
    runtime_dir: Path = dirs.runtime_dir
    with PerseusClient(runtime_dir, job="secret-job") as owner:
        owner.claim([str(daemon.status()["gpus"][0]["uuid"])])  # type: ignore[index]
        code, lease = run_as_user(lambda: client_outcome(runtime_dir, lambda c: c.status().gpus[0].lease))
    assert code == "ok"
    assert lease.uid == 0
    assert lease.job == ""
    assert NOBODY_UID != 0
