"""Reporting computation and step boundaries to perseusd from PyTorch training, in order, without stalling it.

On CPU a boundary is reached when Python reaches it, so `DirectReporter` sends the event at once from the
calling thread. On a GPU, Python only enqueues kernels: the computation really begins and ends later, when
the stream gets there. `CudaEventReporter` therefore records a CUDA event on the current stream at each
boundary (cheap and asynchronous: the training thread never waits) and a helper thread waits for those
events one at a time, in the order they were recorded, and sends each as soon as it completes.

Timestamps: the client stamps each event with `time.monotonic_ns()` when it is sent, so on a GPU the timestamp
is the moment the helper thread sees the event complete. We chose this over deriving the time from
`Event.elapsed_time` against a reference event because the daemon acts on events in real time (it switches
the clock for the next computation when it receives `comp_end`): an event sent when the GPU reaches the
boundary makes the switch happen at the right moment, while a precisely back-dated event sent late would
not. It also needs no timing-enabled events and suffers no GPU-vs-host clock drift. The events are created
with `blocking=True`, so the helper sleeps in `cudaEventSynchronize` instead of spinning on a CPU core; its
wake-up delay (tens of microseconds) is small next to a pipeline computation (milliseconds).

Only the helper thread sends events in the CUDA path (a ZeroMQ socket has one owner thread), so training
code must not send events on the same client from elsewhere while a `CudaEventReporter` is open.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from perseus_client.closing import Closing

if TYPE_CHECKING:
    import torch

    from perseus_client.client import PerseusClient

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 10.0


class CompletionEvent(Protocol):
    """What the helper thread needs of a recorded event (a `torch.cuda.Event` is one)."""

    def synchronize(self) -> None: ...


class Reporter(Protocol):
    """Sends one GPU's boundary events to the daemon in the order they are reported."""

    def computation_begin(self, stage: int, instruction: str, microbatch: int, chunk: int) -> None: ...

    def computation_end(self, stage: int, instruction: str, microbatch: int, chunk: int) -> None: ...

    def step_begin(self, step: int) -> None: ...

    def step_end(self, step: int) -> None: ...

    def close(self) -> None: ...


class DirectReporter:
    """CPU training: the boundary is now, so send from the calling thread."""

    def __init__(self, client: PerseusClient, gpu: str) -> None:
        self._client = client
        self._gpu = gpu

    def computation_begin(self, stage: int, instruction: str, microbatch: int, chunk: int) -> None:
        self._client.computation_begin(self._gpu, stage, instruction, microbatch, chunk)

    def computation_end(self, stage: int, instruction: str, microbatch: int, chunk: int) -> None:
        self._client.computation_end(self._gpu, stage, instruction, microbatch, chunk)

    def step_begin(self, step: int) -> None:
        self._client.step_begin(self._gpu, step)

    def step_end(self, step: int) -> None:
        self._client.step_end(self._gpu, step)

    def close(self) -> None:
        """Nothing is pending: every event was sent when it was reported."""


_Pending = tuple[CompletionEvent, Callable[[], None]]


class CudaEventReporter:
    """GPU training: record an event per boundary now, send it from a helper thread once the GPU reaches it.

    Args:
        client: the client whose events socket the helper thread alone uses from now on.
        gpu: the GPU's UUID.
        record: records a completion event on the stream doing the work and returns it (see
            `cuda_event_recorder`); tests pass fakes.
    """

    def __init__(self, client: PerseusClient, gpu: str, record: Callable[[], CompletionEvent]) -> None:
        self._client = client
        self._gpu = gpu
        self._record = record
        self._pending: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()  # None: stop
        self.failures = 0
        self._thread = threading.Thread(target=self._run, name="perseus-cuda-events", daemon=True)
        self._thread.start()

    def computation_begin(self, stage: int, instruction: str, microbatch: int, chunk: int) -> None:
        send = self._client.computation_begin
        self._submit(functools.partial(send, self._gpu, stage, instruction, microbatch, chunk))

    def computation_end(self, stage: int, instruction: str, microbatch: int, chunk: int) -> None:
        send = self._client.computation_end
        self._submit(functools.partial(send, self._gpu, stage, instruction, microbatch, chunk))

    def step_begin(self, step: int) -> None:
        self._submit(functools.partial(self._client.step_begin, self._gpu, step))

    def step_end(self, step: int) -> None:
        self._submit(functools.partial(self._client.step_end, self._gpu, step))

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Send what is still pending (waiting for the GPU at most `timeout_s`), then stop the helper."""
        self._pending.put(None)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            logger.warning("perseus: CUDA events still pending after %.1f s; not waiting longer", timeout_s)

    def _submit(self, send: Callable[[], None]) -> None:
        """Record the boundary on the GPU stream and queue its send; never raises into training."""
        try:
            self._pending.put((self._record(), send))
        except Exception as exc:
            self.failures += 1
            logger.debug("perseus: recording a CUDA event failed: %s", exc)

    def _run(self) -> None:
        """Wait for the events strictly in recording order, so begin precedes end and steps bracket them."""
        while (item := self._pending.get()) is not None:
            event, send = item
            try:
                event.synchronize()
            except Exception as exc:  # a failed GPU: the event never completes; drop it, keep order
                self.failures += 1
                logger.debug("perseus: waiting for a CUDA event failed: %s", exc)
                continue
            send()


def gpu_of(client: PerseusClient, gpu: str | None, device: torch.device | None = None) -> str:
    """The GPU a rank reports on: `gpu` when given, else the UUID of the CUDA device it computes on
    (`device`, else torch's current device; `PerseusClient.gpu_uuid`: right under any remapping)."""
    if gpu is not None:
        return gpu
    cuda = device is not None and device.type == "cuda"
    found = client.gpu_uuid(device.index if cuda and device is not None else None)
    if found is None:  # fail-open, no CUDA and no daemon to list the node's GPUs
        logger.warning("perseus: no GPU known for this rank yet (no CUDA device, no daemon): not managed")
        return ""
    return found


def cuda_event_recorder(device: torch.device) -> Callable[[], CompletionEvent]:
    """A recorder of blocking CUDA events on `device`'s current stream (where the stage's kernels run)."""
    import torch

    def record() -> CompletionEvent:
        event = torch.cuda.Event(blocking=True)  # type: ignore[no-untyped-call]  # torch: __new__ unannotated
        event.record(torch.cuda.current_stream(device))
        return event

    return record


def reporter_for(client: PerseusClient, gpu: str, device: torch.device | None) -> Reporter:
    """CUDA events on a CUDA device (no device-wide synchronise per computation), direct sends otherwise."""
    if device is not None and device.type == "cuda":
        return CudaEventReporter(client, gpu, cuda_event_recorder(device))
    return DirectReporter(client, gpu)


class Instrumentation(Closing):
    """What every framework integration's wrappers share: this rank's stage, the step counter, a training
    step between its begin and end events, and `close()` (or leaving a `with`). Each integration brackets its
    computations itself, inline: that is the hot path (an extra call there costs ~0.1 us per computation).

    Attributes:
        position: this rank's pipeline stage (the `stage` of its events).
        next_step: the step number the next training step reports.
    """

    def __init__(self, reporter: Reporter, position: int, first_step: int) -> None:
        self.position = position
        self.next_step = first_step
        self._reporter = reporter
        self._in_step = False

    def close(self) -> None:
        """Send any events still pending (CUDA events)."""
        self._reporter.close()

    def _run_step(self, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """`original(*args, **kwargs)` as the next training step, between its begin and end events."""
        number = self.next_step
        self.next_step += 1
        self._in_step = True
        self._reporter.step_begin(number)
        try:
            return original(*args, **kwargs)
        finally:
            self._in_step = False
            self._reporter.step_end(number)
