"""Probe a real NVIDIA GPU through Perseus's NVML backend and print the results as JSON.

Needs root (or CAP_SYS_ADMIN) for the clock measurements. Run on a GPU machine:

    python benchmarks/nvml_probe.py [--gpu INDEX] [--counter-s 3] [--switches 5]

It reports: the GPU's facts; whether locking and resetting the SM clock works; the energy counter's update
period (polled every 1 ms); the clock-switch latency between the highest and a middle supported clock. The GPU
is reset to unlocked clocks at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from typing import Any

from perseusd.errors import GpuError
from perseusd.gpu.backend import GpuDevice
from perseusd.gpu.nvml import NvmlBackend
from perseusd.gpu.probe import clock_switch_latency, energy_counter_period


def _set_reset(device: GpuDevice) -> dict[str, Any]:
    clocks = device.info.supported_sm_clocks_mhz
    target_mhz = clocks[len(clocks) // 2]
    try:
        applied_mhz = device.set_locked_sm_clock_mhz(target_mhz - 1)
        device.reset_locked_sm_clock()
    except GpuError as error:
        return {"ok": False, "error": str(error)}
    return {"ok": True, "requested_mhz": target_mhz - 1, "applied_mhz": applied_mhz}


def _switches(device: GpuDevice, count: int) -> list[dict[str, Any]]:
    clocks = device.info.supported_sm_clocks_mhz
    targets = [clocks[len(clocks) // 2], clocks[0]]
    results = []
    try:
        for i in range(count * 2):
            results.append(dataclasses.asdict(clock_switch_latency(device, targets[i % 2])))
    except GpuError as error:
        results.append({"error": str(error)})
    finally:
        device.reset_locked_sm_clock()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--counter-s", type=float, default=3.0)
    parser.add_argument("--switches", type=int, default=5)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    backend = NvmlBackend()
    try:
        device = backend.devices()[args.gpu]
        report = {
            "info": dataclasses.asdict(device.info),
            "set_reset": _set_reset(device),
            "energy_counter": dataclasses.asdict(energy_counter_period(device, args.counter_s)),
            "clock_switch": _switches(device, args.switches),
        }
    finally:
        backend.close()
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
