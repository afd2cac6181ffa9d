"""Does scraping the Prometheus metrics cost the event path anything? Prints JSON.

Same run, same machine, alternating rounds: a daemon with metrics off and no scraper (baseline) versus a
daemon serving metrics over HTTP with a scraper process hitting /metrics every `--scrape-period-s` (default
1 s, 15 times Prometheus' usual 15 s). Each round measures
- client event cost: median per-event time of `computation_begin`/`computation_end` on the calling thread;
- daemon ingest: events/s the daemon received from `CLIENTS` sender processes.
The scraper reads every GPU (through the owner threads) and every counter at each scrape. On a machine with
few cores the scraper process and the daemon's HTTP thread also take CPU from the senders: compare rounds.

    python benchmarks/bench_metrics.py [--scrape-period-s S] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perseus_client import PerseusClient

from benchmarks.bench_client import timed_batches
from benchmarks.bench_daemon import sender
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes

ROUNDS = 3
CLIENTS = 4
BATCH = 1000
BATCHES = 20


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _scraper(url: str, period_s: float, ready: Any, stop: Any, out: Any) -> None:
    scrapes, durations_s = 0, []
    while not stop.is_set():
        began = time.perf_counter()
        with urllib.request.urlopen(url, timeout=10) as response:
            response.read()
        durations_s.append(time.perf_counter() - began)
        scrapes += 1
        ready.set()
        stop.wait(period_s)
    out.put((scrapes, statistics.median(durations_s) if durations_s else 0.0))


def _event_cost_us(daemon: DaemonProcess) -> float:
    with PerseusClient(daemon.dirs.runtime_dir, job="bench-cost", strict=True) as client:
        gpu = client.daemon_info.gpus[CLIENTS].uuid  # type: ignore[union-attr]
        client.claim([gpu])
        return statistics.median(timed_batches(client, gpu, False, BATCHES, BATCH))


def _ingest_per_s(daemon: DaemonProcess) -> float:
    ctx = multiprocessing.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    runtime_dir = str(daemon.dirs.runtime_dir)
    procs = [ctx.Process(target=sender, args=(runtime_dir, i, go, out)) for i in range(CLIENTS)]
    for proc in procs:
        proc.start()
    # Polled through one client with a generous timeout: the machine may be loaded (no subprocess per poll).
    with PerseusClient(runtime_dir, job="bench-poll", timeout_s=30, strict=True) as poller:
        while poller.status().daemon.clients < CLIENTS + 1:
            time.sleep(0.05)
        start = poller.status().daemon.events_received
        go.set()
        samples: list[tuple[float, int]] = []
        while True:
            received = poller.status().daemon.events_received - start
            samples.append((time.monotonic(), received))
            if len(samples) > 3 and samples[-1][1] == samples[-3][1] and received > 0:
                break
            time.sleep(0.1)
    for _ in procs:
        out.get(timeout=30)
    for proc in procs:
        proc.join(timeout=10)
    first = next(t for t, n in samples if n > 0)
    last = next(t for t, n in samples if n == samples[-1][1])
    return samples[-1][1] / max(last - first, 1e-3)


def _round(make: Any, scraped: bool, period_s: float) -> dict[str, Any]:
    dirs = DaemonDirs.create()
    extra: tuple[str, ...] = ()
    port = _free_port()
    if scraped:
        config = dirs.base / "perseusd.toml"
        config.write_text(f"metrics_http_port = {port}\n")
        extra = ("--config", str(config))
    daemon = make(dirs, gpus=CLIENTS + 1, extra_args=extra).start()
    ctx = multiprocessing.get_context("spawn")
    ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    scraper = None
    if scraped:
        url = f"http://127.0.0.1:{port}/metrics"
        scraper = ctx.Process(target=_scraper, args=(url, period_s, ready, stop, out))
        scraper.start()
        # Measure once it scrapes, not while its interpreter starts (a CPU burst of its own).
        if not ready.wait(60):
            raise RuntimeError("the scraper did not scrape within 60 s")
    try:
        cost_us = _event_cost_us(daemon)
        ingest = _ingest_per_s(daemon)
    finally:
        stop.set()
    result: dict[str, Any] = {"event_cost_us": round(cost_us, 3), "ingest_events_per_s": round(ingest)}
    if scraper is not None:
        scrapes, median_s = out.get(timeout=30)
        scraper.join(timeout=10)
        result |= {"scrapes": scrapes, "scrape_median_ms": round(median_s * 1e3, 2)}
    daemon.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--scrape-period-s", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    rounds: dict[str, list[dict[str, Any]]] = {"baseline": [], "scraped": []}
    with daemon_processes() as make:
        for _ in range(args.rounds):
            rounds["baseline"].append(_round(make, scraped=False, period_s=args.scrape_period_s))
            rounds["scraped"].append(_round(make, scraped=True, period_s=args.scrape_period_s))

    def median(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in rounds[kind])

    result = {
        "benchmark": "metrics_scrape_cost",
        "cpu_count": os.cpu_count(),
        "scrape_period_s": args.scrape_period_s,
        "rounds": rounds,
        "event_cost_us": {
            "baseline": median("baseline", "event_cost_us"),
            "scraped": median("scraped", "event_cost_us"),
        },
        "ingest_events_per_s": {
            "baseline": median("baseline", "ingest_events_per_s"),
            "scraped": median("scraped", "ingest_events_per_s"),
        },
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
