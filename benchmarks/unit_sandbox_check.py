"""The hardened unit's restrictions on a real GPU, where no systemd runs (a container, a VM without one).

    sudo setpriv --bounding-set -all,+sys_admin,+chown --no-new-privs \\
        python benchmarks/unit_sandbox_check.py [--gpu 0]

Prints JSON:

- `devices`: the character-device groups of `/proc/devices` that the NVIDIA driver registered, each with
  whether `systemd/perseusd.service`'s `DeviceAllow=char-...` patterns (globs, as systemd matches them) allow
  it, and every `/dev/nvidia*` node with its major and group: what `DevicePolicy=closed` would leave the
  daemon (the driver names major 195 `nvidia-frontend` on some versions and `nvidia` on others);
- `process`: the capabilities this process holds (run it under the `setpriv` above: the unit's
  `CapabilityBoundingSet=` and `NoNewPrivileges=`), and whether `MemoryDenyWriteExecute=` could be applied
  (the kernel's `PR_SET_MDWE`, which systemd uses where the kernel has it) before NVML was loaded;
- `nvml`: under those restrictions, the daemon's own NVML backend locking a clock and restoring it, and
  lowering the power limit and restoring it, with what the GPU reported.

What it cannot show without a systemd: the unit's system-call filter and namespaces (the service tests boot a
real systemd in a container for those, with simulated GPUs).
"""

from __future__ import annotations

import argparse
import ctypes
import fnmatch
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

UNIT = Path(__file__).resolve().parents[1] / "systemd" / "perseusd.service"
PR_SET_MDWE = 65
PR_MDWE_REFUSE_EXEC_GAIN = 1
CAP_NAMES = {0: "chown", 21: "sys_admin"}


def device_allow_patterns(unit_text: str) -> list[str]:
    """The `char-` group patterns of the unit's `DeviceAllow=` lines."""
    return re.findall(r"^DeviceAllow=char-(\S+)", unit_text, flags=re.MULTILINE)


def char_groups(proc_devices: str) -> dict[int, list[str]]:
    """Major -> names of the character devices in `/proc/devices` text (a driver may register a major
    under several names: the H200's 580 driver lists 195 as `nvidia` and `nvidiactl`)."""
    groups: dict[int, list[str]] = {}
    in_char = False
    for line in proc_devices.splitlines():
        if line.startswith("Character devices"):
            in_char = True
        elif line.startswith("Block devices"):
            in_char = False
        elif in_char and line.strip():
            major, name = line.split(None, 1)
            groups.setdefault(int(major), []).append(name.strip())
    return groups


def allowed(names: list[str], patterns: list[str]) -> bool:
    """systemd allows a major when any of its names matches a `char-` pattern (a glob)."""
    return any(fnmatch.fnmatchcase(name, pattern) for name in names for pattern in patterns)


def device_nodes(dev: Path = Path("/dev")) -> list[tuple[str, int]]:
    """(path, major) of the NVIDIA character-device nodes under `dev`."""
    nodes = []
    for node in sorted([*dev.glob("nvidia*"), *dev.glob("nvidia-caps/*")]):
        try:
            if node.is_char_device():
                nodes.append((str(node), os.major(node.stat().st_rdev)))
        except OSError:
            continue
    return nodes


def devices_report(unit_text: str, proc_devices: str, nodes: list[tuple[str, int]]) -> dict[str, Any]:
    """Which device groups and nodes the unit's `DeviceAllow=` lets the daemon open."""
    patterns = device_allow_patterns(unit_text)
    groups = char_groups(proc_devices)
    nvidia = {name for names in groups.values() for name in names if name.startswith("nvidia")}
    rows = [
        {
            "node": path,
            "major": major,
            "groups": groups.get(major, []),
            "allowed": allowed(groups.get(major, []), patterns),
        }
        for path, major in nodes
    ]
    return {
        "patterns": patterns,
        "nvidia_groups": {name: allowed([name], patterns) for name in sorted(nvidia)},
        "nodes": rows,
        "all_allowed": bool(rows) and all(row["allowed"] for row in rows),
    }


def process_report() -> dict[str, Any]:
    status = Path("/proc/self/status").read_text()
    caps = dict(re.findall(r"^(Cap\w+):\s+(\w+)", status, flags=re.MULTILINE))
    effective = int(caps.get("CapEff", "0"), 16)
    held = sorted(CAP_NAMES.get(bit, str(bit)) for bit in range(64) if effective >> bit & 1)
    no_new_privs = re.search(r"^NoNewPrivs:\s+(\d)", status, flags=re.MULTILINE)
    libc = ctypes.CDLL(None, use_errno=True)
    mdwe = libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) == 0
    return {
        "uid": os.geteuid(),
        "capabilities": held,
        "no_new_privs": bool(no_new_privs and no_new_privs.group(1) == "1"),
        "memory_deny_write_execute": mdwe,
        "mdwe_error": None if mdwe else os.strerror(ctypes.get_errno()),
    }


def nvml_report(gpu: int) -> dict[str, Any]:
    import numpy  # noqa: F401  (the daemon's own imports, under the same restrictions)
    import zmq  # noqa: F401

    from perseusd.gpu.nvml import NvmlBackend

    backend = NvmlBackend()
    try:
        device = backend.devices()[gpu]
        clocks = device.info.supported_sm_clocks_mhz
        result: dict[str, Any] = {"gpu": device.info.name}
        middle = clocks[len(clocks) // 2]
        result["lock_applied_mhz"] = device.set_locked_sm_clock_mhz(middle)
        result["locked_reads_mhz"] = device.locked_sm_clock_mhz()
        device.reset_locked_sm_clock()
        result["unlocked"] = device.locked_sm_clock_mhz() is None
        original_w = device.power_limit_w()
        lowered_w = max(device.info.power_limit_min_w, original_w - 100.0)
        result["power_limit_set_returned_w"] = device.set_power_limit_w(lowered_w)
        result["power_limit_enforced_w"] = _settled(device.power_limit_w, lowered_w)
        device.set_power_limit_w(original_w)
        result["power_limit_restored_w"] = _settled(device.power_limit_w, original_w)
        lowered = abs(result["power_limit_enforced_w"] - lowered_w) < 1
        result["ok"] = result["lock_applied_mhz"] == middle and lowered
        return result
    except Exception as exc:  # under the restrictions a failure is the finding
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        backend.close()


def _settled(read: Any, wanted_w: float, timeout_s: float = 1.0) -> float:
    """The enforced limit once it reads `wanted_w` (a limit acts 13-38 ms after its call), or after 1 s."""
    deadline_s = time.monotonic() + timeout_s
    value_w = float(read())
    while abs(value_w - wanted_w) >= 1 and time.monotonic() < deadline_s:
        time.sleep(0.005)
        value_w = float(read())
    return value_w


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--gpu", type=int, default=0)
    args = parser.parse_args()
    report: dict[str, Any] = {
        "devices": devices_report(UNIT.read_text(), Path("/proc/devices").read_text(), device_nodes()),
        "process": process_report(),  # MDWE applied here, before NVML and numpy load
    }
    report["nvml"] = nvml_report(args.gpu)
    print(json.dumps(report, indent=2))
    return 0 if report["nvml"].get("ok") and report["devices"]["all_allowed"] else 1


if __name__ == "__main__":
    sys.exit(main())
