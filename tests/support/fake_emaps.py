"""A fake Electricity Maps API v3 on loopback (a real HTTP server): `/carbon-intensity/{history,latest}`.

`JsonHandler` and `LoopbackHttp` are what any such fake is made of (`benchmarks/carbon_measured.py`'s
replayed trace too): JSON replies, nothing logged, a server thread on a free loopback port.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlparse

from perseusd.carbon.traces import parse_history

TOKEN = "test-token-123"


class JsonHandler(BaseHTTPRequestHandler):
    """A request handler whose replies are JSON documents and which logs nothing (the test's output stays
    the test's)."""

    def reply_json(self, status: int, body: object) -> None:
        """Answer `status` with `body` as JSON."""
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: object) -> None:
        pass


class LoopbackHttp:
    """`handler` served on a free loopback port by a thread of its own, until `close()`."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def api_url(self) -> str:
        """The Electricity Maps API's base URL on this server (ending in /v3)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}/v3"

    def close(self) -> None:
        """Stop serving, close the socket and wait for the thread."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class FakeApi(JsonHandler):
    """`/v3/carbon-intensity/{history,latest}?zone=...`, answering only the right token."""

    history: ClassVar[dict[str, Any]] = {}
    latest_at: ClassVar[str] = ""
    """The latest reply's time: an hour after the history's last entry (its value is always 321)."""
    status: ClassVar[int] = 200
    seen: ClassVar[list[tuple[str, str, str]]] = []

    def do_GET(self) -> None:
        url = urlparse(self.path)
        zone = parse_qs(url.query).get("zone", [""])[0]
        FakeApi.seen.append((url.path, zone, self.headers.get("auth-token", "")))
        if self.headers.get("auth-token") != TOKEN:
            self.reply_json(401, {"error": "bad token"})
        elif FakeApi.status != 200:
            self.reply_json(FakeApi.status, {"error": "down"})
        elif url.path == "/v3/carbon-intensity/history":
            self.reply_json(200, FakeApi.history)
        elif url.path == "/v3/carbon-intensity/latest":
            self.reply_json(200, {"zone": zone, "carbonIntensity": 321, "datetime": FakeApi.latest_at})
        else:
            self.reply_json(404, {"error": "no such endpoint"})


@contextmanager
def fake_api(history_path: Path) -> Iterator[str]:
    """Serve `history_path` as the history; yields the API's base URL (ending in /v3)."""
    FakeApi.history = json.loads(history_path.read_text())
    last_s = max(p.at_s for p in parse_history(FakeApi.history))
    FakeApi.latest_at = datetime.fromtimestamp(last_s + 3600, UTC).isoformat()
    FakeApi.status, FakeApi.seen = 200, []
    server = LoopbackHttp(FakeApi)
    try:
        yield server.api_url
    finally:
        server.close()
