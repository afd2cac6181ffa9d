"""A fake Electricity Maps API v3 on loopback (a real HTTP server): `/carbon-intensity/{history,latest}`."""

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


class FakeApi(BaseHTTPRequestHandler):
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
            self._reply(401, {"error": "bad token"})
        elif FakeApi.status != 200:
            self._reply(FakeApi.status, {"error": "down"})
        elif url.path == "/v3/carbon-intensity/history":
            self._reply(200, FakeApi.history)
        elif url.path == "/v3/carbon-intensity/latest":
            self._reply(200, {"zone": zone, "carbonIntensity": 321, "datetime": FakeApi.latest_at})
        else:
            self._reply(404, {"error": "no such endpoint"})

    def _reply(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: object) -> None:
        pass


@contextmanager
def fake_api(history_path: Path) -> Iterator[str]:
    """Serve `history_path` as the history; yields the API's base URL (ending in /v3)."""
    FakeApi.history = json.loads(history_path.read_text())
    last_s = max(p.at_s for p in parse_history(FakeApi.history))
    FakeApi.latest_at = datetime.fromtimestamp(last_s + 3600, UTC).isoformat()
    FakeApi.status, FakeApi.seen = 200, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v3"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
