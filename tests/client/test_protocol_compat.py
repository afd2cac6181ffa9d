"""Protocol evolution against real daemons: a client of an older minor (the frozen 6.0 peer) with today's
daemon, today's client with a daemon one minor older (and with one that predates minors), and majors that
differ. No version number is written here: each comes from `perseus_client.version` or the frozen schema."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from perseus_client.client import PerseusClient
from perseus_client.protocol import (
    ADMIN_TYPES,
    PROTOCOL_MAJOR,
    PROTOCOL_MINOR,
    REQUEST_TYPES,
    EnergyRead,
    EnergyReading,
    ErrorReply,
    decode_reply,
)

from tests.client.compat import frozen_6_0 as frozen
from tests.support.frames import RawPeer, register_body
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes
from tests.support.stub_daemon import StubDaemon

pytestmark = pytest.mark.timeout(120)


class CompatPeer(RawPeer):
    """A raw peer that also asks as the frozen 6.0 client."""

    reply_timeout_ms = 10_000

    def __init__(self, runtime_dir: Path) -> None:
        super().__init__(runtime_dir)
        self._ids = iter(range(1, 1 << 30))

    def frozen(
        self, msg_type: str, fields: dict[str, Any], *, admin: bool = False
    ) -> tuple[str, dict[str, Any]]:
        """Ask as the frozen 6.0 client: its encoder out, its strict decoder on the reply."""
        request_id = next(self._ids)
        reply_id, reply_type, body = frozen.decode(
            self.send(frozen.encode(msg_type, fields, request_id), admin=admin)
        )
        assert reply_id == request_id
        return reply_type, body


@pytest.fixture
def dirs() -> DaemonDirs:
    return DaemonDirs.create()


def _started(dirs: DaemonDirs, **env: str) -> Iterator[DaemonProcess]:
    with daemon_processes() as make:
        yield make(dirs, gpus=1, env=env).start()


@pytest.fixture
def daemon(dirs: DaemonDirs) -> Iterator[DaemonProcess]:
    yield from _started(dirs)


@pytest.fixture
def older_daemon(dirs: DaemonDirs) -> Iterator[DaemonProcess]:
    """Today's daemon speaking the minor before the newest (as a daemon not yet upgraded would)."""
    yield from _started(dirs, PERSEUSD_PROTOCOL_MINOR=str(PROTOCOL_MINOR - 1))


def test_the_frozen_peer_is_of_this_major_and_an_older_minor() -> None:
    assert frozen.MAJOR == PROTOCOL_MAJOR
    assert frozen.MINOR < PROTOCOL_MINOR


def _older_requests(gpu: str, clock_mhz: int, now_ns: int) -> list[tuple[str, dict[str, Any], set[str]]]:
    """Every request of 6.0 on the control socket, in an order that makes each meaningful, with the reply
    types that count as working (an error where the daemon has nothing to show yet, e.g. no frontier)."""
    computation = {"gpu": gpu, "stage": 0, "instruction": "forward", "microbatch": 0, "chunk": 0}
    csv = "stage,instruction,frequency,time,energy\n"
    return [
        ("claim", {"gpus": [gpu], "job": "old"}, {"claim_ok"}),
        ("set_clock", {"gpu": gpu, "sm_clock_mhz": clock_mhz}, {"set_clock_ok"}),
        (
            "set_plan",
            {
                "gpu": gpu,
                "plan": [{"instruction": "forward", "microbatch": 0, "chunk": 0, "freq_mhz": clock_mhz}],
            },
            {"set_plan_ok"},
        ),
        ("clear_plan", {"gpu": gpu}, {"clear_plan_ok"}),
        ("step_begin", {"gpu": gpu, "step": 0, "timestamp_ns": now_ns}, {"event_ack"}),
        ("comp_begin", {**computation, "timestamp_ns": now_ns + 1}, {"event_ack"}),
        ("comp_end", {**computation, "timestamp_ns": now_ns + 2}, {"event_ack"}),
        ("step_end", {"gpu": gpu, "step": 0, "timestamp_ns": now_ns + 3}, {"event_ack"}),
        ("register", register_body(gpu, "old"), {"register_ok"}),
        ("set_policy", {"job": "old", "policy": "fastest", "target": 0.0}, {"set_policy_ok"}),
        ("jobs", {}, {"jobs_ok"}),
        ("status", {}, {"status_ok"}),
        ("frontier", {"job": "old"}, {"document", "error"}),
        ("plan", {"job": "old"}, {"document", "error"}),
        ("profile_export", {"job": "old"}, {"profile", "error"}),
        (
            "profile_import",
            {"job": "other", "csv": csv, "source": "x.csv", "p_block_w": 0.0},
            {"profile_import_ok", "error"},
        ),
        (
            "announce_straggler",
            {"job": "old", "pipeline": 0, "factor": 1.0, "clear": True},
            {"announce_straggler_ok", "error"},
        ),
        ("energy_read", {"gpus": []}, {"energy_reading"}),
        ("event_count", {}, {"event_count_ok"}),
        ("release", {"gpus": []}, {"release_ok"}),
    ]


def test_a_client_of_an_older_minor_works_with_todays_daemon(daemon: DaemonProcess) -> None:
    """Every request of 6.0 gets a reply that 6.0's strict decoder reads (no field it does not know)."""
    peer = CompatPeer(daemon.dirs.runtime_dir)
    try:
        reply_type, hello = peer.frozen("hello", {"job": "old", "client_version": "frozen-6.0"})
        assert reply_type == "hello_ok"
        gpu = hello["gpus"][0]["uuid"]
        clock_mhz = hello["gpus"][0]["supported_sm_clocks_mhz"][0]
        sent = {"hello"}
        for msg_type, fields, working in _older_requests(gpu, clock_mhz, time.monotonic_ns()):
            reply_type, body = peer.frozen(msg_type, fields)
            assert reply_type in working, (msg_type, reply_type, body)
            sent.add(msg_type)
            if msg_type == "jobs":
                assert [job["job"] for job in body["jobs"]] == ["old"]  # nested job rows checked too
            if msg_type == "event_count":
                assert body["received"] >= 4
        reply_type, error = peer.frozen("claim", {"gpus": ["GPU-none"], "job": "old"})
        assert (reply_type, error["code"]) == ("error", "UNKNOWN_GPU")  # errors read by 6.0 too
        admin_requests = [
            ("status", {}, "status_ok"),
            ("admin_set_power_limit", {"gpu": gpu, "power_limit_w": 300.0}, "power_limit_ok"),
            ("admin_reset", {"gpus": []}, "admin_reset_ok"),
        ]
        for msg_type, fields, expected in admin_requests:
            assert peer.frozen(msg_type, fields, admin=True)[0] == expected
            sent.add(msg_type)
        older = {cls.TYPE for cls in (*REQUEST_TYPES, *ADMIN_TYPES) if cls.SINCE <= frozen.MINOR}
        assert sent == older  # every request of the older minor was tried
    finally:
        peer.close()


def test_todays_client_with_a_daemon_one_minor_older(older_daemon: DaemonProcess) -> None:
    """Every message of the older minor works; messages and fields newer than it are refused cleanly."""
    older = PROTOCOL_MINOR - 1
    with PerseusClient(older_daemon.dirs.runtime_dir, job="new") as client:
        assert client.daemon_info is not None
        assert client.daemon_info.protocol_minor == older
        assert client.protocol_minor == older
        gpu = client.daemon_info.gpus[0].uuid
        clock_mhz = client.daemon_info.gpus[0].supported_sm_clocks_mhz[0]
        assert client.claim([gpu]) == (gpu,)
        assert client.set_clock(gpu, clock_mhz) == clock_mhz
        assert client.set_plan(gpu, [{"instruction": "forward", "microbatch": 0, "freq_mhz": clock_mhz}]) == 1
        assert client.clear_plan(gpu)
        with client.step(gpu, 0), client.computation(gpu, 0, "forward", 0):
            pass
        assert client.register(gpu, stage=0, num_stages=1, num_microbatches=1).job == "new"
        assert client.set_policy("fastest").policy == "fastest"
        assert [job.job for job in client.jobs().jobs] == ["new"]
        status = client.status()
        assert status.daemon.protocol_minor == older
        assert [row.uuid for row in status.gpus] == [gpu]
        reading = client._call(EnergyRead(gpus=(gpu,)), EnergyReading)
        assert [row.uuid for row in reading.gpus] == [gpu]
        assert client.release().gpus == (gpu,)
        _newer_requests_refused(older_daemon.dirs.runtime_dir, older)
        assert client.status().daemon.clients >= 1  # the daemon kept serving
    assert client.events_lost == 0
    assert client.events_dropped == 0


def _newer_requests_refused(runtime_dir: Path, older: int) -> None:
    """Types and request fields newer than the daemon's minor, and a type of a minor it never heard of."""
    peer = CompatPeer(runtime_dir)
    try:
        newer_types = [cls.TYPE for cls in REQUEST_TYPES if older < cls.SINCE]
        for request_id, msg_type in enumerate([*newer_types, "from_a_newer_minor"], start=100):
            body = {"v": PROTOCOL_MAJOR, "id": request_id, "m": PROTOCOL_MINOR + 1, "type": msg_type}
            error = _error_of(peer.send(json.dumps(body).encode()))
            assert error.code == "UNKNOWN_TYPE"
            assert "upgrade perseusd" in error.message
        for cls in REQUEST_TYPES:
            newer_fields = [
                f for f in cls.__dataclass_fields__.values() if f.metadata.get("since", 0) > older
            ]
            for f in newer_fields:
                body = {
                    "v": PROTOCOL_MAJOR,
                    "id": 7,
                    "m": PROTOCOL_MINOR,
                    "type": cls.TYPE,
                    f.name: f.default,
                }
                assert _error_of(peer.send(json.dumps(body).encode())).code == "BAD_FIELD"
    finally:
        peer.close()


def _error_of(data: bytes) -> ErrorReply:
    reply = decode_reply(data).message
    assert isinstance(reply, ErrorReply)
    return reply


@pytest.mark.parametrize(("offset", "upgrade"), [(1, "upgrade perseusd"), (-1, "upgrade the client")])
def test_another_major_is_refused_in_a_reply_its_sender_reads(
    daemon: DaemonProcess, offset: int, upgrade: str
) -> None:
    """The error comes back in the sender's major, with the 6.0-and-later error shape, naming who upgrades."""
    peer = CompatPeer(daemon.dirs.runtime_dir)
    try:
        major = PROTOCOL_MAJOR + offset
        data = peer.send(json.dumps({"v": major, "id": 9, "type": "status"}).encode())
        body = json.loads(data)
        assert body == {
            "v": major,
            "id": 9,
            "type": "error",
            "code": "VERSION_MISMATCH",
            "message": body["message"],
        }
        assert upgrade in body["message"]
        assert f"{PROTOCOL_MAJOR}.0-{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}" in body["message"]
    finally:
        peer.close()


def _frozen_daemon(request: bytes) -> bytes:
    """A daemon that predates minors, as far as the wire goes: 6.0's strict decoder, answering hello and
    status in 6.0's shape and any refusal with 6.0's error text."""
    try:
        request_id, msg_type, _ = frozen.decode(request)
        reply_type, body = _frozen_answer(msg_type)
    except frozen.FrozenError as exc:
        request_id = json.loads(request).get("id", 0)
        reply_type, body = "error", {"code": exc.code, "message": exc.message}
    return frozen.encode(reply_type, body, request_id)


def _frozen_answer(msg_type: str) -> tuple[str, dict[str, Any]]:
    if msg_type == "hello":
        return "hello_ok", {"daemon_version": "frozen", "protocol": frozen.MAJOR, "gpus": []}
    if msg_type == "status":
        health = dict.fromkeys(frozen.SCHEMA["objects"]["DaemonHealth"], 0)
        health.update(version="frozen", errors_by_code={}, last_restore_s=None, persistence_error=None)
        return "status_ok", {"daemon": health, "gpus": [], "jobs": []}
    return "error", {"code": "UNKNOWN_TYPE", "message": f"unknown message type {msg_type!r}"}


def test_todays_client_with_a_daemon_that_predates_minors(tmp_path: Path) -> None:
    """6.0 refuses the minor field itself: the client says hello again in minor 0 and keeps to it."""
    stub = StubDaemon(tmp_path / "control.sock", _frozen_daemon)
    try:
        with PerseusClient(tmp_path, job="new", timeout_s=5.0) as client:
            assert client.protocol_minor == 0
            assert client.daemon_info is not None
            assert client.daemon_info.protocol_minor == 0
            assert client.status().daemon.version == "frozen"
        minors = [json.loads(frame).get("m", 0) for frame in stub.seen]
        assert minors[0] == PROTOCOL_MINOR  # the first hello said what the client speaks
        assert minors[1:] == [0] * (len(minors) - 1)
    finally:
        stub.close()
