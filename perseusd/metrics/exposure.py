"""The two ways perseusd exposes its metrics, both off unless configured.

- HTTP: prometheus_client's server on its own thread, bound to `metrics_http_address:metrics_http_port`
  (127.0.0.1 by default). Each scrape runs the collector on that thread, never on the main loop.
- Textfile: a thread writes `perseusd.prom` into node_exporter's textfile directory every interval, through a
  temporary file in the same directory renamed over the old one (readers never see half a file). The file is
  made world-readable (node_exporter runs unprivileged; the service's umask is 0077) and removed at shutdown,
  so a stopped daemon leaves no stale GPU state behind.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from pathlib import Path
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

TEXTFILE_NAME = "perseusd.prom"
TEXTFILE_MODE = 0o644


def metrics_registry(collector: Collector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


class HttpExposure:
    """Serves /metrics over HTTP until `stop`."""

    def __init__(self, registry: CollectorRegistry, address: str, port: int) -> None:
        self._server: WSGIServer
        self._server, self._thread = start_http_server(port, addr=address, registry=registry)
        self.port = int(self._server.server_address[1])
        logger.info("metrics: serving http://%s:%d/metrics", address, self.port)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)


class TextfileExposure:
    """Rewrites `<directory>/perseusd.prom` every `interval_s` on its own thread until `stop`."""

    def __init__(self, registry: CollectorRegistry, directory: Path, interval_s: float) -> None:
        self._registry = registry
        self.path = directory / TEXTFILE_NAME
        self._interval_s = interval_s
        self._stop = threading.Event()
        self.write()  # a bad directory fails the start, not later
        self._thread = threading.Thread(target=self._run, name="perseusd-metrics-textfile", daemon=True)
        self._thread.start()
        logger.info("metrics: writing %s every %g s", self.path, interval_s)

    def write(self) -> None:
        """Write the metrics atomically (temporary file in the same directory, then rename)."""
        data = generate_latest(self._registry)
        fd, tmp = tempfile.mkstemp(prefix=f".{TEXTFILE_NAME}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                os.fchmod(handle.fileno(), TEXTFILE_MODE)
                handle.write(data)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.write()
            except Exception as exc:  # a full disk must not stop the daemon
                logger.error("metrics: writing %s failed: %s", self.path, exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        self.path.unlink(missing_ok=True)
