"""`bench_pool_scale.py`'s side of one `pool_scale_worker.py` process: it starts the process (its agents'
nodes, lease TTL, polling interval and options), reads back the JSON lines it prints (each grant a node
applied, each straggler seen or announced, its start and its stats), sends it commands on stdin, reads its
CPU time, and closes it (quit, or SIGKILL after two minutes).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from benchmarks.processes import process_cpu_s

WORKER = Path(__file__).resolve().parent / "pool_scale_worker.py"
PREFIX, POOL = "/perseus/v1", "fleet"
"""The pool every worker's agents join: the agents' etcd prefix and the pool's name."""


class Worker:
    """One worker process and what it printed."""

    def __init__(
        self, endpoints: str, nodes: list[str], ttl_s: int, interval_s: float, extra: tuple[str, ...] = ()
    ) -> None:
        command = [sys.executable, str(WORKER), "--endpoints", endpoints, "--pool", POOL]
        command += ["--ttl", str(ttl_s), "--interval", str(interval_s), *extra, *nodes]
        self.nodes = nodes
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        self.events: list[tuple[str, float | None, float]] = []
        self.saw: dict[str, float] = {}
        self.announced: dict[str, float] = {}
        self.stats: dict[str, Any] | None = None
        self.started = threading.Event()
        self._stats_ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            record = json.loads(line)
            if "grant_w" in record:
                self.events.append((record["node"], record["grant_w"], record["t"]))
            elif "saw" in record:
                self.saw[record["saw"]] = record["t"]
            elif "announced" in record:
                self.announced[record["announced"]] = record["t"]
            elif "started" in record:
                self.started.set()
            elif "stats" in record:
                self.stats = record["stats"]
                self._stats_ready.set()

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(command + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def get_stats(self, timeout_s: float = 60.0) -> dict[str, Any]:
        self._stats_ready.clear()
        self.send("stats")
        self._stats_ready.wait(timeout_s)
        return self.stats or {}

    def cpu_s(self) -> float:
        return process_cpu_s(self.process.pid)

    def close(self) -> None:
        if self.process.poll() is None:
            self.send("quit")
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
