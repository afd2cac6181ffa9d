"""The two ways perseusd exposes its metrics, both off unless configured.

- HTTP: a server of fixed threads with bounded work per client (`perseusd.metrics.http_server`), bound to
  `metrics_http_address:metrics_http_port` (127.0.0.1 by default). Each scrape runs the collector on one of
  its workers, never on the main loop.
- Textfile: a thread writes `perseusd.prom` into node_exporter's textfile directory every interval, through a
  temporary file in the same directory renamed over the old one (readers never see half a file). The file is
  made world-readable (node_exporter runs unprivileged; the service's umask is 0077) and removed at shutdown,
  so a stopped daemon leaves no stale GPU state behind.
"""

from __future__ import annotations

import errno
import logging
import os
import tempfile
import threading
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from perseusd.metrics.http_server import BoundedHttpServer
from perseusd.threads import NamedThread

logger = logging.getLogger(__name__)

TEXTFILE_NAME = "perseusd.prom"
TEXTFILE_MODE = 0o644
BIND_RETRY_S = 5.0


def metrics_registry(collector: Collector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


class HttpExposure:
    """Serves /metrics over HTTP until `stop`.

    A port another process holds (a local user can bind an unprivileged port first) never stops the daemon:
    the error is logged and the bind retried every `BIND_RETRY_S` until it succeeds. Prefer a port below
    1024, which only root can bind (docs/metrics.md).
    """

    def __init__(self, registry: CollectorRegistry, address: str, port: int) -> None:
        self._registry = registry
        self._address = address
        self.port = port
        self._server: BoundedHttpServer | None = None
        self._stop = threading.Event()
        self._retry: threading.Thread | None = None
        self.problem: str | None = None
        if not self._bind():
            self._retry = NamedThread(target=self._retry_bind, name="perseusd-metrics-bind", daemon=True)
            self._retry.start()

    def _bind(self) -> bool:
        try:
            self._server = BoundedHttpServer(self._registry, self._address, self.port)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            if self.problem is None:
                logger.error(
                    "metrics: %s:%d is taken by another process (%s): serving without HTTP metrics, "
                    "retrying every %g s",
                    self._address,
                    self.port,
                    exc.strerror,
                    BIND_RETRY_S,
                )
            self.problem = f"port {self.port} taken by another process"
            return False
        self.port = self._server.port
        self.problem = None
        logger.info("metrics: serving http://%s:%d/metrics", self._address, self.port)
        return True

    def _retry_bind(self) -> None:
        while not self._stop.wait(BIND_RETRY_S):
            try:
                if self._bind():
                    return
            except OSError as exc:
                logger.error("metrics: cannot bind %s:%d: %s", self._address, self.port, exc)

    def stop(self) -> None:
        self._stop.set()
        if self._retry is not None:
            self._retry.join(timeout=5.0)
        if self._server is not None:
            self._server.stop()


class TextfileExposure:
    """Rewrites `<directory>/perseusd.prom` every `interval_s` on its own thread until `stop`."""

    def __init__(self, registry: CollectorRegistry, directory: Path, interval_s: float) -> None:
        self._registry = registry
        self.path = directory / TEXTFILE_NAME
        self._interval_s = interval_s
        self._stop = threading.Event()
        self.write()  # a bad directory fails the start, not later
        self._thread = NamedThread(target=self._run, name="perseusd-metrics-textfile", daemon=True)
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
