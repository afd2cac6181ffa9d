"""A real pipeline stage: GPT-like layers run by PyTorch on a real GPU, between simulated neighbours.

The stage computes what a `torch.distributed.pipelining` stage of the same layers computes: the forward of a
microbatch keeps its output for the backward; the backward of a middle or first stage back-propagates the
gradient its next stage would send (a fixed random tensor of the output's shape), the last stage's backward
starts from a loss; parameter gradients accumulate over the iteration's microbatches and are dropped at its
end. A stage that is not the first keeps its input's gradient, as it would to send it to the previous stage.
Activations do not travel: the neighbours are simulated, so the stage's inputs are fixed random tensors, and
the emulator's messages tell it when a neighbour's computation would have delivered them.

While the stage waits for a neighbour, the GPU waits the way a NCCL receive does: a kernel spins on a flag in
pinned host memory until the host sets it when the message arrives (`FlagWait`), so the GPU draws its
blocking power (one busy multiprocessor, clocks up) rather than idle power, and the next computation starts
the moment the flag flips. The kernel is compiled by NVRTC through CuPy; where CuPy or the kernel is not
available the GPU simply idles while waiting (`HostWait`), and `wait_kind` says which one ran. Each
computation is timed to the GPU's end of it (the stage synchronises after launching it), so the client's
begin and end events bracket the GPU's work as NCCL-driven stages' events do.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from perseusd.emulate.real_stage import RealStageSpec
from perseusd.workload.sim_workload import RunRecord

logger = logging.getLogger(__name__)

HEAD_DIM = 128
SPIN_MAX_POLLS = 4_000_000
"""A spinning kernel gives up after this many polls of the flag (~4-8 s over PCIe): a host that never sets
it (a stage killed mid-wait) cannot hold the GPU for longer."""
SELF_TEST_TIMEOUT_S = 2.0

PROBE_WINDOW_NS = 40_000
"""How long the clock probe counts SM cycles against the GPU's global timer (~1 us granularity: 2.5 %)."""

_PROBE_SOURCE = r"""
extern "C" __global__ void perseus_clock_probe(unsigned long long out_address, long long window_ns) {
    unsigned long long* out = (unsigned long long*)out_address;
    unsigned long long t0, t1, c0, c1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(c0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
        asm volatile("mov.u64 %0, %%clock64;" : "=l"(c1));
    } while ((long long)(t1 - t0) < window_ns);
    out[0] = t1 - t0;
    out[1] = c1 - c0;
}
"""

_SPIN_SOURCE = r"""
extern "C" __global__ void perseus_spin(unsigned long long flag_address, int target, long long max_polls) {
    const volatile int* flag = (const volatile int*)flag_address;
    long long polls = 0;
    while (*flag < target && polls < max_polls) {
        ++polls;
    }
}
"""


class HostWait:
    """The GPU idles while the host waits (no flag kernel)."""

    kind = "idle"

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        yield


class _MappedKernel:
    """A one-thread CuPy kernel launched on the device's current stream whose first argument is the device
    address of a pinned host buffer (`host`): what it writes there the host reads, and the other way round."""

    def __init__(self, device: torch.device, host: torch.Tensor, source: str, name: str) -> None:
        cupy: Any = importlib.import_module("cupy")
        self._device = device
        self.host = host.pin_memory()
        try:
            self._address = int(cupy.cuda.runtime.hostGetDevicePointer(self.host.data_ptr(), 0))
        except AttributeError:  # an older CuPy: under unified addressing the host address is the device's
            self._address = self.host.data_ptr()
        self._kernel = cupy.RawKernel(source, name)
        self._cupy = cupy
        self.numpy: Any = importlib.import_module("numpy")

    def launch(self, *args: Any) -> None:
        stream = _cupy_stream(self._cupy, torch.cuda.current_stream(self._device).cuda_stream)
        with stream:
            self._kernel((1,), (1,), (self.numpy.uint64(self._address), *args))


class _StreamHandle:
    """A CUDA stream as the CUDA stream protocol presents it (`__cuda_stream__`: version 0, address)."""

    def __init__(self, address: int) -> None:
        self.address = address

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.address)


def _cupy_stream(cupy: Any, address: int) -> Any:
    """torch's stream as a CuPy stream: `Stream.from_external` (CuPy 14 deprecates `ExternalStream`), else
    `ExternalStream` (older CuPy)."""
    stream_type = cupy.cuda.Stream
    if hasattr(stream_type, "from_external"):
        return stream_type.from_external(_StreamHandle(address))
    return cupy.cuda.ExternalStream(address)


class FlagWait:
    """A kernel on the stage's stream spins on a pinned host flag until the host raises it (NCCL-like)."""

    kind = "flag"

    def __init__(self, device: torch.device) -> None:
        self._spin = _MappedKernel(device, torch.zeros(1, dtype=torch.int32), _SPIN_SOURCE, "perseus_spin")
        self._target = 0

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        self._target += 1
        np = self._spin.numpy
        self._spin.launch(np.int32(self._target), np.int64(SPIN_MAX_POLLS))
        try:
            yield
        finally:
            self._spin.host[0] = (
                self._target
            )  # the kernel sees it on its next poll; what follows runs at once

    def self_test(self) -> float:
        """Spin, raise the flag from the host 5 ms later, and return how long the kernel took after that (s);
        raises when it did not end in time."""
        done = torch.cuda.Event()  # type: ignore[no-untyped-call]
        with self.waiting():
            time.sleep(0.005)
            raised_s = time.monotonic()
        done.record()
        deadline_s = raised_s + SELF_TEST_TIMEOUT_S
        while not done.query():  # type: ignore[no-untyped-call]
            if time.monotonic() > deadline_s:
                raise RuntimeError("the spinning kernel did not see the host's flag")
            time.sleep(0.0001)
        return time.monotonic() - raised_s


class ClockProbe:
    """The SM clock the GPU runs at, read on the GPU itself: a kernel launched right before a computation
    counts SM cycles (`clock64`) over `PROBE_WINDOW_NS` of the GPU's global timer and writes both to pinned
    host memory, read once the computation has finished. NVML's reported clock lags the real one by ~100 ms
    (the probe of `benchmarks/nvml_probe.py` on an H100 and an H200), far longer than a computation."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        out = torch.zeros(2, dtype=torch.int64)
        self._probe = _MappedKernel(device, out, _PROBE_SOURCE, "perseus_clock_probe")

    def launch(self) -> None:
        self._probe.launch(self._probe.numpy.int64(PROBE_WINDOW_NS))

    def read_mhz(self) -> int:
        """The clock the last probe measured (MHz; 0 when it measured nothing). Call after synchronising."""
        elapsed_ns, cycles = (int(v) for v in self._probe.host.tolist())
        return round(cycles * 1000 / elapsed_ns) if elapsed_ns > 0 else 0

    def self_test(self) -> int:
        self.launch()
        torch.cuda.synchronize(self._device)
        clock_mhz = self.read_mhz()
        if not 100 <= clock_mhz <= 5000:
            raise RuntimeError(f"the clock probe read {clock_mhz} MHz")
        return clock_mhz


def _probe_for(device: torch.device) -> ClockProbe | None:
    if device.type != "cuda":
        return None
    try:
        probe = ClockProbe(device)
        clock_mhz = probe.self_test()
    except Exception as exc:  # no CuPy or NVRTC: computations carry no measured clock
        logger.warning("no clock probe (%s): the trace's clock_mhz stays 0", exc)
        return None
    logger.info("clock probe ready: the GPU runs at %d MHz", clock_mhz)
    return probe


def cuda_device_for(uuid: str) -> torch.device:
    """The CUDA device whose UUID is NVML's `uuid` ("GPU-..."); the only device when there is one."""
    wanted = uuid.lower().removeprefix("gpu-")
    count = torch.cuda.device_count()
    for index in range(count):
        own = str(getattr(torch.cuda.get_device_properties(index), "uuid", "")).lower().removeprefix("gpu-")
        if own == wanted:
            return torch.device("cuda", index)
    if count == 1:
        logger.warning("CUDA's device UUID does not match %s; using its only device", uuid)
        return torch.device("cuda", 0)
    raise RuntimeError(f"no CUDA device has UUID {uuid} (CUDA sees {count})")


def _wait_for(device: torch.device) -> HostWait | FlagWait:
    if device.type != "cuda":
        return HostWait()
    try:
        wait = FlagWait(device)
        latency_s = wait.self_test()
    except Exception as exc:  # no CuPy, no NVRTC, or a kernel that cannot see host memory: idle instead
        logger.warning("the GPU idles while waiting for neighbours (no flag kernel: %s)", exc)
        return HostWait()
    logger.info("flag kernel ready: it ends %.0f us after the host raises its flag", latency_s * 1e6)
    return wait


class TorchExecutor:
    """One pipeline stage's real layers; `run` executes a forward or backward to its end on the GPU."""

    def __init__(self, spec: RealStageSpec, gpu: str, *, first: bool, last: bool, microbatches: int) -> None:
        self._device = cuda_device_for(gpu) if spec.device == "cuda" else torch.device(spec.device)
        if self._device.type == "cuda":
            torch.cuda.set_device(self._device)
        dtype = torch.bfloat16
        torch.manual_seed(0)
        heads = max(1, spec.d_model // HEAD_DIM)
        self._module = nn.Sequential(
            *(
                nn.TransformerEncoderLayer(
                    spec.d_model, heads, 4 * spec.d_model, batch_first=True, norm_first=True, dtype=dtype
                )
                for _ in range(spec.layers)
            )
        ).to(self._device)
        shape = (1, spec.seq, spec.d_model)
        self._inputs = [
            torch.randn(shape, device=self._device, dtype=dtype).requires_grad_(not first)
            for _ in range(microbatches)
        ]
        self._grad_out = None if last else torch.randn(shape, device=self._device, dtype=dtype)
        self._outputs: dict[int, torch.Tensor] = {}
        self._wait = _wait_for(self._device)
        self._probe = _probe_for(self._device)

    @property
    def wait_kind(self) -> str:
        """How the GPU waits for neighbours: "flag" (a spinning kernel) or "idle"."""
        return self._wait.kind

    def run(
        self,
        profile_stage: int,
        instruction: str,
        microbatch: int,
        time_scale: float,  # noqa: ARG002 (real layers run at the GPU's pace: the run checks the scale is 1)
    ) -> RunRecord:
        start_s = time.monotonic()
        if self._probe is not None:
            self._probe.launch()  # the clock the computation begins at, measured on the GPU
        if instruction == "forward":
            self._outputs[microbatch] = self._module(self._inputs[microbatch])
        else:
            self._backward(microbatch)
        self._synchronize()
        duration_s = time.monotonic() - start_s
        clock_mhz = 0 if self._probe is None else self._probe.read_mhz()
        return RunRecord(profile_stage, instruction, clock_mhz, start_s, duration_s, 0.0)

    def _backward(self, microbatch: int) -> None:
        output = self._outputs.pop(microbatch)
        if self._grad_out is None:
            output.float().square().mean().backward()  # type: ignore[no-untyped-call]
        else:
            output.backward(self._grad_out)  # type: ignore[no-untyped-call]
        self._inputs[microbatch].grad = None

    def _synchronize(self) -> None:
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)

    def waiting(self) -> contextlib.AbstractContextManager[None]:
        return self._wait.waiting()

    def iteration_done(self) -> None:
        self._module.zero_grad(set_to_none=True)
        self._outputs.clear()

    def throttle(self, factor: float) -> None:
        """Real layers run at the GPU's pace: a straggler cannot be emulated on the real stage."""
        if factor != 1.0:
            raise ValueError("the real stage cannot be throttled (put the straggler on a simulated pipeline)")

    def describe(self) -> dict[str, str]:
        probe = "gpu" if self._probe is not None else "none"
        return {
            "executor": "torch",
            "device": str(self._device),
            "wait": self.wait_kind,
            "clock_probe": probe,
        }

    def close(self) -> None:
        self._outputs.clear()
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)
