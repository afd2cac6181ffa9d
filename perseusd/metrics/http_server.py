"""The metrics HTTP server, with bounded work whatever its clients do.

prometheus_client's own server starts a thread per connection and waits for a request forever, so a local
user holding half-open requests costs the daemon a thread and a descriptor each (at a descriptor or task
limit, the daemon's other work fails). Here:

- one accept thread and `WORKERS` worker threads, started once: no thread per connection;
- at most `QUEUED` accepted connections wait for a worker; more are closed at once (descriptors bounded);
- at most `PER_CLIENT` connections per client are served or queued (its address; once the address has
  `PER_CLIENT` in flight, its address and uid, read from /proc/net/tcp then: on loopback every user shares
  the address), so one user holds at most 2 x `PER_CLIENT` and never the workers another user's scraper
  needs;
- the request head must arrive within `HEAD_DEADLINE_S` and fit in `MAX_HEAD_BYTES`; the reply must be
  taken within `REPLY_DEADLINE_S`; every connection is closed after one reply;
- the metrics are collected at most once per `CACHE_S` (per format): scrapes in between get the same
  text, so scraping in a loop costs the daemon no more than one collection a second.

Only GET and HEAD of `/metrics` (and `/`) are answered; the collector runs on a worker, never on the main
loop.
"""

from __future__ import annotations

import ipaddress
import logging
import queue
import select
import socket
import threading
import time
from collections import Counter
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from perseusd.threads import NamedThread

logger = logging.getLogger(__name__)

WORKERS = 8
QUEUED = 32
PER_CLIENT = 2
HEAD_DEADLINE_S = 5.0
REPLY_DEADLINE_S = 10.0
MAX_HEAD_BYTES = 8192
CACHE_S = 1.0
PATHS = ("/metrics", "/")
_ClientKey = tuple[str, int | None]


class BoundedHttpServer:
    """Serves `registry` at http://address:port/metrics on fixed threads until `stop`."""

    def __init__(self, registry: CollectorRegistry, address: str, port: int) -> None:
        self._registry = registry
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._sock = socket.create_server((address, port), family=family, backlog=64)
        self.port = int(self._sock.getsockname()[1])
        self._wake_r, self._wake_w = socket.socketpair()
        self._queue: queue.Queue[tuple[socket.socket, _ClientKey] | None] = queue.Queue(QUEUED)
        self._lock = threading.Lock()
        self._clients: Counter[_ClientKey] = Counter()
        self._by_address: Counter[str] = Counter()
        self._cache: dict[str, tuple[float, bytes]] = {}  # content type -> (collected at, body)
        self._collect_lock = threading.Lock()
        self.refused = 0
        self._stopping = False
        self._threads = [NamedThread(target=self._accept_loop, name="perseusd-metrics-accept", daemon=True)]
        self._threads += [
            NamedThread(target=self._work, name=f"perseusd-metrics-{i}", daemon=True) for i in range(WORKERS)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake_w.send(b"x")
        for _ in range(WORKERS):
            self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout=REPLY_DEADLINE_S)
        for sock in (self._sock, self._wake_r, self._wake_w):
            sock.close()

    def _accept_loop(self) -> None:
        while not self._stopping:
            ready, _, _ = select.select([self._sock, self._wake_r], [], [])
            if self._sock not in ready or self._stopping:
                continue
            try:
                conn, peer = self._sock.accept()
            except OSError:
                continue  # the client went away, or no descriptor now: the next one may succeed
            self._admit(conn, peer)

    def _admit(self, conn: socket.socket, peer: tuple[str, int] | tuple[str, int, int, int]) -> None:
        address = peer[0]
        with self._lock:
            crowded = self._by_address[address] >= PER_CLIENT
        # Who the client is (its uid on loopback) is looked up only when its address is crowded: a
        # connection costs no /proc read otherwise.
        key = client_key(peer, self.port) if crowded else (address, None)
        with self._lock:
            admitted = self._clients[key] < PER_CLIENT
            if admitted:
                try:
                    self._queue.put_nowait((conn, key))
                    self._clients[key] += 1
                    self._by_address[address] += 1
                except queue.Full:
                    admitted = False
            if not admitted:
                self.refused += 1
        if not admitted:
            conn.close()

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            conn, key = item
            try:
                self._serve(conn)
            except Exception as exc:  # one bad client never stops a worker
                logger.debug("metrics: a request failed: %s", exc)
            finally:
                conn.close()
                with self._lock:
                    self._clients[key] -= 1
                    if not self._clients[key]:
                        del self._clients[key]
                    self._by_address[key[0]] -= 1
                    if not self._by_address[key[0]]:
                        del self._by_address[key[0]]

    def _serve(self, conn: socket.socket) -> None:
        head = read_head(conn, time.monotonic() + HEAD_DEADLINE_S)
        if head is None:
            return
        conn.settimeout(REPLY_DEADLINE_S)
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            conn.sendall(reply(400, b"bad request\n"))
            return
        method, target = parts[0], parts[1].split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            conn.sendall(reply(405, b"only GET and HEAD\n"))
            return
        if target not in PATHS:
            conn.sendall(reply(404, b"not found: see /metrics\n"))
            return
        accept = next((line.split(":", 1)[1] for line in lines[1:] if line.lower().startswith("accept:")), "")
        encoder, content_type = choose_encoder(accept.strip())
        with self._collect_lock:  # one collection at a time, and at most one per CACHE_S
            cached = self._cache.get(content_type)
            if cached is None or time.monotonic() - cached[0] >= CACHE_S:
                cached = self._cache[content_type] = (time.monotonic(), encoder(self._registry))
        conn.sendall(reply(200, cached[1], content_type, head_only=method == "HEAD"))


def read_head(conn: socket.socket, deadline_s: float) -> bytes | None:
    """The request head (through the blank line), or None when it is too large or late."""
    data = b""
    while b"\r\n\r\n" not in data:
        left_s = deadline_s - time.monotonic()
        if left_s <= 0 or len(data) > MAX_HEAD_BYTES:
            if len(data) > MAX_HEAD_BYTES:
                conn.settimeout(1.0)
                conn.sendall(reply(431, b"request head too large\n"))
            return None
        conn.settimeout(left_s)
        try:
            chunk = conn.recv(4096)
        except TimeoutError:
            return None
        if not chunk:
            return None
        data += chunk
    return data.split(b"\r\n\r\n", 1)[0]


REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 431: "Too Large"}


def reply(
    code: int, body: bytes, content_type: str = "text/plain; charset=utf-8", *, head_only: bool = False
) -> bytes:
    head = (
        f"HTTP/1.1 {code} {REASONS[code]}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + (b"" if head_only else body)


def client_key(peer: tuple[str, int] | tuple[str, int, int, int], port: int) -> _ClientKey:
    """Who a connection is from: its address and, on loopback (where every user shares the address), the
    uid that owns the client's socket."""
    address = peer[0]
    if not ipaddress.ip_address(address.split("%", 1)[0]).is_loopback and not address.startswith(
        "::ffff:127."
    ):
        return (address, None)
    return (address, socket_uid(address, peer[1], port))


def socket_uid(address: str, client_port: int, server_port: int) -> int | None:
    """The uid owning the TCP socket at (address, client_port) connected to `server_port`: the kernel's
    /proc/net/tcp{,6} (columns: local, remote, ..., uid); None when not found."""
    local = f":{client_port:04X}"
    remote = f":{server_port:04X}"
    for table in ("/proc/net/tcp6", "/proc/net/tcp") if ":" in address else ("/proc/net/tcp",):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            established = len(fields) > 7 and fields[3] == "01"
            if established and fields[1].endswith(local) and fields[2].endswith(remote):
                return int(fields[7])
    return None
