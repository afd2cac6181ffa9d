"""Adversarial end to end: hostile frames (the regression cases of issue 14 by name, and hypothesis-generated
ones) on every socket of a real daemon. After each case the daemon still serves a well-behaved client, no GPU
is left leased or locked, and every reply decodes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from perseus_client import PerseusClient
from perseus_client.client import PerseusClientError
from perseus_client.protocol import ErrorReply

from tests.support.frames import (
    RawPeer,
    V,
    assert_error_or_reply,
    assert_serves_and_nothing_locked,
    frames,
    regression_frames,
)
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes

pytestmark = pytest.mark.timeout(240)

GPU = "GPU-fuzz-placeholder"
EXPECTED_CODES = {
    "deep_lists": "BAD_FRAME",
    "deep_objects": "BAD_FRAME",
    "deep_valid_json": "BAD_FRAME",
    "nan_target": "BAD_FRAME",
    "inf_target": "BAD_FIELD",
    "nan_p_block_w": "BAD_FRAME",
    "huge_stage_profile": "BAD_FIELD",
    "pipeline_2_70": "BAD_FIELD",
    "huge_id": "BAD_FRAME",
    "huge_int_text": "BAD_FRAME",
    "not_utf8": "BAD_FRAME",
    "empty": "BAD_FRAME",
}


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    with daemon_processes() as make:
        yield make(DaemonDirs.create(), gpus=2).start()


@pytest.fixture(scope="module")
def gpu(daemon: DaemonProcess) -> str:
    with PerseusClient(daemon.dirs.runtime_dir, job="probe") as client:
        assert client.daemon_info is not None
        return client.daemon_info.gpus[0].uuid


@pytest.fixture
def peer(daemon: DaemonProcess) -> Iterator[RawPeer]:
    raw = RawPeer(daemon.dirs.runtime_dir)
    try:
        yield raw
    finally:
        raw.close()


@pytest.mark.parametrize("name", sorted(regression_frames(GPU)))
def test_regression_frame_on_every_socket(daemon: DaemonProcess, gpu: str, peer: RawPeer, name: str) -> None:
    data = regression_frames(gpu)[name]
    peer.ask(V + b'"id":1,"type":"hello","job":"hostile","client_version":"0"}')
    peer.ask(V + b'"id":2,"type":"claim","gpus":["%s"],"job":"hostile"}' % gpu.encode())
    reply = peer.ask(data)
    assert_error_or_reply(reply)
    if name in EXPECTED_CODES:
        assert isinstance(reply.message, ErrorReply), reply
        assert reply.message.code == EXPECTED_CODES[name], reply.message
    if name == "deep_after_id":
        assert reply.request_id == 41  # the error is addressed to the request, parsed once
    assert_error_or_reply(peer.ask(data, admin=True))
    peer.event(data)
    peer.ask(V + b'"id":3,"type":"release","gpus":[]}')
    assert daemon.proc is not None
    assert daemon.proc.poll() is None, daemon.log()
    assert_serves_and_nothing_locked(daemon.dirs.runtime_dir, state_dir=daemon.dirs.state_dir)


def test_register_failure_leaves_no_job(gpu: str, peer: RawPeer) -> None:
    peer.ask(V + b'"id":1,"type":"hello","job":"half","client_version":"0"}')
    peer.ask(V + b'"id":2,"type":"claim","gpus":["%s"],"job":"half"}' % gpu.encode())
    bad = (
        V + b'"id":3,"type":"register","gpu":"%s","job":"half-created","pipeline":1000001,"stage":0,'
        b'"num_stages":1,"num_microbatches":1,"schedule":"1f1b","chunks":1}' % gpu.encode()
    )
    reply = peer.ask(bad)
    assert isinstance(reply.message, ErrorReply)
    assert reply.message.code == "BAD_FIELD"
    jobs = peer.ask(V + b'"id":4,"type":"jobs"}')
    assert "half-created" not in [job.job for job in jobs.message.jobs]  # type: ignore[attr-defined]
    peer.ask(V + b'"id":5,"type":"release","gpus":[]}')


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_frames_get_decodable_replies(daemon: DaemonProcess, gpu: str, data: st.DataObject) -> None:
    frame = data.draw(frames(gpu))
    peer = RawPeer(daemon.dirs.runtime_dir)
    try:
        peer.ask(V + b'"id":1,"type":"hello","job":"fuzz","client_version":"0"}')
        peer.ask(V + b'"id":2,"type":"claim","gpus":["%s"],"job":"fuzz"}' % gpu.encode())
        assert_error_or_reply(peer.ask(frame))
        assert_error_or_reply(peer.ask(frame, admin=True))
        peer.event(frame)
        peer.ask(V + b'"id":7,"type":"release","gpus":[]}')
    finally:
        peer.close()


def test_daemon_serves_after_fuzzing(daemon: DaemonProcess) -> None:
    """Runs after the fuzzing above (same module daemon): alive, serving, nothing locked."""
    assert daemon.proc is not None
    assert daemon.proc.poll() is None, daemon.log()
    with PerseusClient(daemon.dirs.runtime_dir, job="admin") as client:
        assert client.daemon_info is not None
    assert_serves_and_nothing_locked(daemon.dirs.runtime_dir, state_dir=daemon.dirs.state_dir)
    assert "Traceback" not in daemon.log()


@pytest.mark.parametrize("command", [["status"], ["status", "--json"], ["jobs"]])
def test_perseusctl_into_a_closed_pipe_prints_no_traceback(daemon: DaemonProcess, command: list[str]) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "perseusd.ctl.main", "--runtime-dir", str(daemon.dirs.runtime_dir), *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    proc.stdout.close()  # like `| head` that has read enough: every write now fails with EPIPE
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=60) in (0, 141)
    assert "Traceback" not in err
    assert "BrokenPipe" not in err


def test_unreachable_names_the_socket(tmp_path: Path) -> None:
    with pytest.raises(PerseusClientError) as unreachable:
        PerseusClient(tmp_path, job="nobody-home", timeout_s=0.2, strict=True)
    assert unreachable.value.code == "UNREACHABLE"
    assert str(tmp_path / "control.sock") in unreachable.value.message


def test_short_flood_accounts_for_every_event() -> None:
    """benchmarks/bench_flood.py on a small scale: the sums close exactly and the daemon survives; no timing
    is asserted (the machine may be slow)."""
    from benchmarks.bench_flood import run

    report = run(clients=3, duration_s=2.0)
    accounting = report["accounting"]
    assert accounting["accounted"], report
    assert accounting["received_by_daemon"] > 0
    # Whatever the daemon read from a client after its release, it dropped unread.
    assert report["released_lease"]["all_after_release_unread"], report
    assert report["daemon_alive"]
