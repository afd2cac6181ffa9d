"""The metrics HTTP server's work is bounded whatever its clients do: half-open requests cost no thread and
no descriptor beyond a fixed few, one user cannot starve a scraper of another user, slow or huge request
heads are cut off, and only /metrics is served."""

from __future__ import annotations

import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Gauge

from perseusd.metrics import http_server
from perseusd.metrics.exposure import HttpExposure
from tests.support.perseusd_proc import run_as_user

pytestmark = pytest.mark.timeout(60)
HALF_OPEN = 100


@pytest.fixture
def exposure() -> Iterator[HttpExposure]:
    registry = CollectorRegistry()
    Gauge("perseus_test_up", "test gauge", registry=registry).set(1)
    served = HttpExposure(registry, "127.0.0.1", 0)
    yield served
    served.stop()


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text: str = response.read().decode()
        return text


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_half_open_requests_cost_no_thread_and_do_not_starve_another_user(exposure: HttpExposure) -> None:
    threads_before, fds_before = threading.active_count(), _open_fds()
    held = []
    try:
        for _ in range(HALF_OPEN):
            conn = socket.create_connection(("127.0.0.1", exposure.port))
            conn.sendall(b"GET /metr")  # never finished
            held.append(conn)
        time.sleep(0.5)
        assert threading.active_count() - threads_before <= 0
        # Our HALF_OPEN client sockets, plus the few the server keeps for us: PER_CLIENT while the address is
        # not crowded, PER_CLIENT more for our uid once it is (looked up then).
        assert _open_fds() - fds_before - HALF_OPEN <= 2 * http_server.PER_CLIENT
        started_s = time.monotonic()
        text = run_as_user(lambda: _scrape(exposure.port))  # a scraper of another uid gets through at once
        assert "perseus_test_up 1.0" in text
        assert time.monotonic() - started_s < 3.0
    finally:
        for conn in held:
            conn.close()


def test_slow_and_huge_request_heads_are_cut_off(
    exposure: HttpExposure, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http_server, "HEAD_DEADLINE_S", 0.5)
    with socket.create_connection(("127.0.0.1", exposure.port)) as slow:
        slow.sendall(b"GET /metrics HTTP/1.1\r\n")
        slow.settimeout(5.0)
        started_s = time.monotonic()
        assert slow.recv(100) == b""  # closed by the server
        assert time.monotonic() - started_s < 3.0
    with socket.create_connection(("127.0.0.1", exposure.port)) as huge:
        huge.settimeout(5.0)
        huge.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n")
        assert huge.recv(100).startswith(b"HTTP/1.1 431")


@pytest.mark.parametrize(
    ("request_line", "status"),
    [("GET /../../etc/passwd HTTP/1.1", 404), ("POST /metrics HTTP/1.1", 405), ("junk", 400)],
)
def test_only_metrics_is_served(exposure: HttpExposure, request_line: str, status: int) -> None:
    with socket.create_connection(("127.0.0.1", exposure.port)) as conn:
        conn.settimeout(5.0)
        conn.sendall(request_line.encode() + b"\r\n\r\n")
        assert conn.recv(100).startswith(f"HTTP/1.1 {status}".encode())
    assert "perseus_test_up" in _scrape(exposure.port)
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"http://127.0.0.1:{exposure.port}/nope", timeout=5)


def test_scraping_in_a_loop_collects_once_a_second() -> None:
    registry = CollectorRegistry()
    collected = []

    class Counting:
        def collect(self) -> list[object]:
            collected.append(time.monotonic())
            return []

    registry.register(Counting())  # type: ignore[arg-type]
    served = HttpExposure(registry, "127.0.0.1", 0)
    started_s = time.monotonic()
    try:
        for _ in range(20):
            _scrape(served.port)
    finally:
        served.stop()
    elapsed_s = time.monotonic() - started_s
    assert 1 <= len(collected) <= elapsed_s / http_server.CACHE_S + 1  # whatever the machine's speed
