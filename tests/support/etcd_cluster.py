"""A real 3-member etcd cluster on loopback for tests: start, wait healthy, SIGKILL members, restart them.

Each member has its own data directory and log file under the given base directory and listens on free
loopback ports. Members are stopped with SIGKILL (a leader without peers takes seconds to exit on SIGTERM);
`close()` kills every member still running and is always safe to call. Elections are made faster than
etcd's defaults (heartbeat 50 ms, election timeout 500 ms) so fault tests take seconds.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.polling import wait_until
from tests.support.ports import free_ports

ETCD = shutil.which("etcd")
requires_etcd = pytest.mark.skipif(
    ETCD is None, reason="needs the etcd binary (Debian: apt-get install etcd-server; scripts/setup.sh --dev)"
)

HEARTBEAT_MS, ELECTION_MS = 50, 500


@dataclass
class Member:
    """One etcd member: its ports, directories and process (None when not running)."""

    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class EtcdCluster:
    """A loopback etcd cluster of `size` members (see module)."""

    def __init__(self, base_dir: Path, size: int = 3, flags: tuple[str, ...] = ()) -> None:
        """`flags`: more etcd flags for every member (e.g. `--max-txn-ops=16`)."""
        if ETCD is None:
            raise RuntimeError("etcd is not installed")
        ports = free_ports(2 * size)
        self.members = [
            Member(f"m{i}", ports[2 * i], ports[2 * i + 1], base_dir / f"m{i}.data", base_dir / f"m{i}.log")
            for i in range(size)
        ]
        self._initial_cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        self._token = f"perseus-test-{os.getpid()}-{ports[0]}"
        self._flags = flags

    @property
    def endpoints(self) -> tuple[str, ...]:
        """Every member's client URL, in member order."""
        return tuple(m.client_url for m in self.members)

    def start(self) -> None:
        """Launch every member and wait until the cluster is healthy."""
        for member in self.members:
            self._launch(member)
        self.wait_healthy()

    def _launch(self, member: Member) -> None:
        assert ETCD is not None
        args = [
            ETCD,
            f"--name={member.name}",
            f"--data-dir={member.data_dir}",
            f"--listen-client-urls={member.client_url}",
            f"--advertise-client-urls={member.client_url}",
            f"--listen-peer-urls={member.peer_url}",
            f"--initial-advertise-peer-urls={member.peer_url}",
            f"--initial-cluster={self._initial_cluster}",
            f"--initial-cluster-token={self._token}",
            "--initial-cluster-state=new",
            f"--heartbeat-interval={HEARTBEAT_MS}",
            f"--election-timeout={ELECTION_MS}",
            *self._flags,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
        with member.log_path.open("ab") as log:
            member.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)

    def request(self, member: Member, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """One gateway call to `member` (GET without a body, POST with one); its JSON answer."""
        data = None if body is None else json.dumps(body).encode()
        with urllib.request.urlopen(f"{member.client_url}{path}", data=data, timeout=2.0) as reply:
            answer: dict[str, Any] = json.load(reply)
        return answer

    def _healthy(self, member: Member) -> bool:
        try:
            return bool(self.request(member, "/health").get("health") == "true")
        except (OSError, ValueError):
            return False

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        """Wait until every running member reports healthy (which needs a leader)."""
        running = [m for m in self.members if m.running]

        def healthy() -> bool:
            for member in running:
                if member.process is not None and member.process.poll() is not None:
                    log = member.log_path.read_text(errors="replace")[-2000:]
                    pytest.fail(f"etcd member {member.name} exited: {log}")
            return all(self._healthy(m) for m in running)

        wait_until(healthy, timeout_s, "a healthy etcd cluster", poll_s=0.1)

    def leader(self) -> Member:
        """The current leader (waits for one to be elected)."""
        found: list[Member] = []

        def elected() -> bool:
            for member in (m for m in self.members if m.running):
                try:
                    status = self.request(member, "/v3/maintenance/status", {})
                except (OSError, ValueError):
                    continue
                if status.get("leader") and status["leader"] == status["header"]["member_id"]:
                    found.append(member)
                    return True
            return False

        wait_until(elected, 30.0, "an etcd leader", poll_s=0.1)
        return found[0]

    def kill(self, member: Member) -> None:
        """SIGKILL one member and reap it."""
        if member.process is not None and member.process.poll() is None:
            member.process.send_signal(signal.SIGKILL)
            member.process.wait(timeout=10)

    def kill_leader(self) -> Member:
        """SIGKILL the current leader; returns it."""
        leader = self.leader()
        self.kill(leader)
        return leader

    def kill_quorum(self) -> list[Member]:
        """SIGKILL two members (the leader among them): the survivor has no quorum."""
        leader = self.leader()
        victims = [leader, next(m for m in self.members if m is not leader)]
        for member in victims:
            self.kill(member)
        return victims

    def restart(self, members: list[Member] | None = None) -> None:
        """Start the given members again (default: every stopped one) with their data; wait healthy."""
        for member in members if members is not None else [m for m in self.members if not m.running]:
            if not member.running:
                self._launch(member)
        self.wait_healthy()

    def put_raw(self, key: str, value: bytes) -> None:
        """Write a key directly (no lease), e.g. a value another version of Perseus might write."""
        encode = base64.b64encode
        member = next(m for m in self.members if m.running)
        self.request(
            member, "/v3/kv/put", {"key": encode(key.encode()).decode(), "value": encode(value).decode()}
        )

    def lease_ttl_s(self, lease_id: int) -> int:
        """The remaining TTL of a lease (-1 once it is gone)."""
        member = next(m for m in self.members if m.running)
        return int(self.request(member, "/v3/kv/lease/timetolive", {"ID": lease_id}).get("TTL", -1))

    def close(self) -> None:
        """SIGKILL every member still running."""
        for member in self.members:
            try:
                self.kill(member)
            except (OSError, subprocess.TimeoutExpired):
                continue


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """The 3-member cluster, started once per module and closed after it (tests that kill members restart it
    themselves). A test folder's conftest imports it to share it."""
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
