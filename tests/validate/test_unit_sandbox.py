"""The unit's device rules against the NVIDIA device groups of real drivers (`unit_sandbox_check`)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.unit_sandbox_check import char_groups, device_allow_patterns, devices_report

UNIT = (Path(__file__).resolve().parents[2] / "systemd" / "perseusd.service").read_text()
# /proc/devices of the H200 machine this project measured on (driver 580.159.04): 195 has two names.
H200_PROC_DEVICES = """Character devices:
  1 mem
195 nvidia
195 nvidiactl
238 nvidia-uvm
239 nvidia-nvswitch
240 nvidia-nvlink
241 nvidia-caps
242 nvidia-caps-imex-channels

Block devices:
  8 sd
"""
H200_NODES = [
    ("/dev/nvidia-uvm", 238),
    ("/dev/nvidia-uvm-tools", 238),
    ("/dev/nvidia0", 195),
    ("/dev/nvidiactl", 195),
    ("/dev/nvidia-caps/nvidia-cap1", 241),
    ("/dev/nvidia-caps/nvidia-cap2", 241),
]


def test_every_nvidia_node_of_the_h200_driver_is_allowed_by_the_unit() -> None:
    report = devices_report(UNIT, H200_PROC_DEVICES, H200_NODES)
    assert report["all_allowed"], report["nodes"]
    assert char_groups(H200_PROC_DEVICES)[195] == ["nvidia", "nvidiactl"]


def test_a_driver_that_names_the_gpus_nvidia_frontend_is_allowed_too() -> None:
    frontend = H200_PROC_DEVICES.replace("195 nvidia\n195 nvidiactl\n", "195 nvidia-frontend\n")
    assert devices_report(UNIT, frontend, H200_NODES)["all_allowed"]
    only_nvidia = H200_PROC_DEVICES.replace("195 nvidia\n195 nvidiactl\n", "195 nvidia\n")
    assert devices_report(UNIT, only_nvidia, H200_NODES)["all_allowed"]


def test_a_rule_set_without_the_gpu_group_is_caught() -> None:
    narrow = "\n".join(line for line in UNIT.splitlines() if "char-nvidia" not in line or "uvm" in line)
    report = devices_report(narrow, H200_PROC_DEVICES, H200_NODES)
    assert not report["all_allowed"]
    assert "nvidia-uvm" in device_allow_patterns(narrow)
