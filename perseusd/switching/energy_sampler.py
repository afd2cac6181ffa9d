"""Energy-counter sampling for online profiling: a thread reads the counters of the GPUs being profiled.

The counter of a real GPU changes only every 20-100 ms, so the sampler reads it often (every `period_s`) and
keeps the first sample of each new value with the CLOCK_MONOTONIC time of the read (`CounterTrace`). Reads go
through each GPU's owner thread, like every other GPU call; a GPU that does not answer in time is skipped
for that round. Nothing here is on the event path: the job manager only copies samples out.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError

from perseusd.profiling.trace import CounterSample, CounterTrace
from perseusd.threads import NamedThread

logger = logging.getLogger(__name__)

ReadEnergy = Callable[[str], "Future[tuple[int, int]]"]
DEFAULT_PERIOD_S = 0.01
READ_TIMEOUT_S = 0.5


class EnergySampler:
    """Samples the energy counters of watched GPUs on a background thread."""

    def __init__(self, read_energy: ReadEnergy, period_s: float = DEFAULT_PERIOD_S) -> None:
        self._read_energy = read_energy
        self._period_s = period_s
        self._traces: dict[str, CounterTrace] = {}
        self._every: dict[str, int] = {}  # sample a GPU every n-th round
        self._round = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.read_errors = 0

    def start(self) -> None:
        self._thread = NamedThread(target=self._run, name="perseusd-energy", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def watch(self, gpu: str, period_s: float | None = None) -> None:
        """Start sampling `gpu` (a fresh trace), every `period_s` (rounded to whole sampler periods; None:
        every period). A long period keeps the reads off a running job's GPUs (a mean power over seconds
        needs no more)."""
        every = 1 if period_s is None else max(1, round(period_s / self._period_s))
        with self._lock:
            self._traces[gpu] = CounterTrace()
            self._every[gpu] = every
        self._wake.set()

    def unwatch(self, gpu: str) -> None:
        with self._lock:
            self._traces.pop(gpu, None)
            self._every.pop(gpu, None)

    def samples(self, gpu: str, since_ns: int = 0) -> list[CounterSample]:
        """A copy of the kept samples of `gpu` from `since_ns` on (empty when not watched)."""
        with self._lock:
            trace = self._traces.get(gpu)
            return trace.samples(since_ns) if trace is not None else []

    def sample_once(self) -> None:
        """Read every watched GPU once (in parallel through their owner threads) and keep the changes."""
        with self._lock:
            self._round += 1
            gpus = [gpu for gpu in self._traces if self._round % self._every.get(gpu, 1) == 0]
        futures = [(gpu, self._read_energy(gpu)) for gpu in gpus]
        for gpu, future in futures:
            try:
                t_ns, energy_mj = future.result(timeout=READ_TIMEOUT_S)
            except (FutureTimeoutError, Exception) as exc:  # a failing GPU never stops the others
                self.read_errors += 1
                logger.debug("energy read of GPU %s failed: %s", gpu, exc)
                continue
            with self._lock:
                trace = self._traces.get(gpu)
                if trace is not None:
                    trace.add(t_ns, energy_mj)

    def rounds_until_due(self) -> int:
        """Rounds from the current one to the next in which some watched GPU is read (at least 1)."""
        with self._lock:
            everies = set(self._every.values()) or {1}
            return min(every - self._round % every for every in everies)

    def _run(self) -> None:
        """Sleep until the next round that reads a GPU: a running job's GPUs, read once a second, cost one
        wake-up a second instead of one every period (on a host whose cores training saturates, each wake-up
        takes the core from a training process)."""
        while not self._stop.is_set():
            with self._lock:
                idle = not self._traces
            if idle:
                self._wake.wait()
                self._wake.clear()
                continue
            self.sample_once()
            rounds = self.rounds_until_due()
            if self._wake.wait(self._period_s * rounds):  # a new watch (or stop): read at once
                self._wake.clear()
                continue
            with self._lock:
                self._round += rounds - 1  # the rounds slept through, as if read
