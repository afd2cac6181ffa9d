"""Events of a process that holds no lease (the backlog of a released lease) are dropped unread and counted:
the accounting still closes (read = accepted + dropped, nothing lost), and they cost no decoding."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import zmq
from perseus_client import PerseusClient

from tests.support.frames import V
from tests.support.perseusd_proc import DaemonDirs, daemon_processes
from tests.support.polling import wait_until
from tests.support.sockets import connected, zmq_context

pytestmark = pytest.mark.timeout(120)
WAIT_S = 60.0  # a bound on waiting for the daemon to read, not a timing assertion


def wait_for(what: Callable[[], bool]) -> None:
    wait_until(what, WAIT_S, "the daemon to read the events", poll_s=0.02)


def send_pairs(client: PerseusClient, gpu: str, microbatches: range) -> None:
    for microbatch in microbatches:
        client.computation_begin(gpu, 0, "forward", microbatch)
        client.computation_end(gpu, 0, "forward", microbatch)


def test_events_after_release_are_dropped_unread_and_counted() -> None:
    with daemon_processes() as make:
        daemon = make(DaemonDirs.create(), gpus=1).start()
        runtime_dir = daemon.dirs.runtime_dir
        with zmq_context() as ctx:
            with PerseusClient(runtime_dir, job="released", timeout_s=10) as client:
                assert client.daemon_info is not None
                gpu = client.daemon_info.gpus[0].uuid
                client.claim([gpu])
                send_pairs(client, gpu, range(10))
                wait_for(lambda: client.event_count().received == 20)
                assert client.event_count().dropped == 0
                not_leased_before = client.status().daemon.errors_by_code.get("NOT_LEASED", 0)
                client.release()
                send_pairs(client, gpu, range(10, 20))
                # Frames that would not even decode, from this same process: dropped unread as well, so
                # counted as NOT_LEASED (the sender holds no lease), not as BAD_FRAME.
                push = connected(ctx, zmq.PUSH, runtime_dir / "events.sock")
                for junk in (b"junk", V + b'"id":0,"type":"status"}', b"[" * 100_000):
                    push.send(junk)
                wait_for(lambda: client.event_count().received == 43)
                assert client.event_count().dropped == 23
                health = client.status().daemon
                assert health.errors_by_code.get("NOT_LEASED", 0) - not_leased_before == 23
                # A new lease is served as before.
                client.claim([gpu])
                send_pairs(client, gpu, range(20, 25))
                wait_for(lambda: client.event_count().received == 53)
                assert client.event_count().dropped == 23
                client.release()
            assert client.events_sent == 50
            assert client.events_lost == 0
            assert client.events_dropped == 0
