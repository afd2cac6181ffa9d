"""`energy_read`: any connected user reads the energy counters of chosen GPUs (no lease, no privileges).

The training process needs no NVML access to measure energy windows (`perseus_client.energy`): it asks the
daemon, which reads each counter through the GPU's owner thread with the CLOCK_MONOTONIC time of the read
and the GPU's instant power. Every user may read every GPU's energy (as `perseusctl status` already shows).
The reply waits for the owner threads without holding the main loop (`deferred`).
"""

from __future__ import annotations

from concurrent.futures import Future

from perseus_client.protocol import EnergyRead, EnergyReading, ErrorCode, GpuEnergy, ProtocolError

from perseusd.daemon.deferred import Deferred
from perseusd.gpu.reading import GpuReading
from perseusd.gpu.registry import GpuRegistry
from perseusd.leasing.identity import Caller

NVML_COUNTER_PERIOD_S = 0.1
"""NVML's energy counter advances every 20-100 ms: the worst case is assumed."""
MAX_GPUS = 256


class EnergyRequests:
    """Serves `energy_read` from the GPU registry."""

    def __init__(self, registry: GpuRegistry, counter_period_s: float, timeout_s: float = 5.0) -> None:
        self._registry = registry
        self._counter_period_s = counter_period_s
        self._timeout_s = timeout_s

    def read(self, _caller: Caller, message: EnergyRead) -> Deferred:
        if len(message.gpus) > MAX_GPUS:
            raise ProtocolError(ErrorCode.BAD_FIELD, f"energy_read.gpus: at most {MAX_GPUS} GPUs")
        if len(set(message.gpus)) != len(message.gpus):  # each would queue one more read
            twice = next(gpu for gpu in message.gpus if message.gpus.count(gpu) > 1)
            raise ProtocolError(ErrorCode.BAD_FIELD, f"energy_read.gpus: GPU {twice} named more than once")
        gpus = message.gpus or self._registry.uuids
        for gpu in gpus:
            if gpu not in self._registry:
                raise ProtocolError(ErrorCode.UNKNOWN_GPU, f"no GPU {gpu} on this node")
        energy = {gpu: self._registry.submit_read_energy(gpu) for gpu in gpus}
        reads = {gpu: self._registry.submit_read(gpu) for gpu in gpus}

        def finish() -> EnergyReading:
            return EnergyReading(gpus=tuple(self._gpu(gpu, energy[gpu], reads[gpu]) for gpu in gpus))

        return Deferred((*energy.values(), *reads.values()), finish, self._timeout_s)

    def _gpu(self, gpu: str, energy: Future[tuple[int, int]], read: Future[GpuReading]) -> GpuEnergy:
        power_w = self._registry.settled_reading(gpu, read).power_w
        error = "" if energy.done() else f"no answer within {self._timeout_s:g} s"
        if not error:
            try:
                read_ns, energy_mj = energy.result()
            except Exception as exc:  # a GPU without a counter or failing: its error, the others still read
                error = str(exc) or type(exc).__name__
            else:
                return GpuEnergy(gpu, energy_mj / 1000.0, read_ns, power_w, self._counter_period_s, "")
        return GpuEnergy(gpu, None, 0, power_w, self._counter_period_s, error)
