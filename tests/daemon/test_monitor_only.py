"""Monitor-only (`perseusd --monitor-only`, zeusd's gpu-read): an unprivileged daemon that reads energy and
status for every user and never writes a clock or a limit."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from perseus_client import PerseusClient
from perseus_client.client import PerseusClientError
from perseus_client.energy import EnergyMonitor
from perseus_client.protocol import AdminSetPowerLimit, PowerLimitOk

from perseusd.ctl.daemon_link import DaemonRequestError, ask
from perseusd.daemon.config_loading import load_config
from perseusd.errors import ConfigError
from perseusd.gpu.errors import GpuPermissionError
from perseusd.gpu.readonly import ReadOnlyDevice
from perseusd.gpu.sim import SimBackend
from tests.containers.namespaces import unprivileged_command
from tests.support.perseusd_proc import NOBODY_GID, NOBODY_UID, DaemonDirs, DaemonProcess, sim_control

pytestmark = pytest.mark.timeout(120)


class UnprivilegedDaemon(DaemonProcess):
    """The daemon as nobody with no capability (setpriv), in a mount namespace that keeps the interpreter
    reachable for nobody."""

    def command(self) -> list[str]:
        return unprivileged_command(super().command(), NOBODY_UID, NOBODY_GID, self.dirs.base)


@pytest.fixture
def monitor() -> Iterator[DaemonProcess]:
    if os.geteuid() != 0:
        pytest.skip("needs root to start the daemon as nobody")
    dirs = DaemonDirs.create()
    os.chown(dirs.base, NOBODY_UID, NOBODY_GID)
    daemon = UnprivilegedDaemon(dirs, gpus=2, extra_args=("--monitor-only",))
    try:
        yield daemon.start()
    finally:
        daemon.stop()
        subprocess.run(["rm", "-rf", str(dirs.base)], check=False)


def _proc_status(pid: int) -> dict[str, str]:
    rows = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (row.partition(":") for row in rows)}


def test_an_unprivileged_monitor_reads_energy_and_status_and_refuses_every_write(
    monitor: DaemonProcess,
) -> None:
    assert monitor.proc is not None
    status = _proc_status(monitor.proc.pid)
    assert status["Uid"].split()[0] == str(NOBODY_UID)
    assert int(status["CapEff"], 16) == 0
    report = monitor.status()
    assert report["daemon"]["monitor_only"] is True
    uuids = [row["uuid"] for row in report["gpus"]]
    assert all(row["energy_j"] is not None for row in report["gpus"])
    runtime_dir = monitor.dirs.runtime_dir
    with PerseusClient(runtime_dir, job="watcher", strict=True) as client:
        energy = EnergyMonitor(client)
        energy.begin_window("w")
        time.sleep(0.25)
        measured = energy.end_window("w")
        assert measured.total_energy_j > 0
        for call in (lambda: client.claim([uuids[0]]), lambda: client.set_clock(uuids[0], 1005)):
            with pytest.raises(PerseusClientError) as refused:
                call()
            assert refused.value.code == "PERMISSION_DENIED"
            assert "monitor-only" in refused.value.message
    with pytest.raises(DaemonRequestError, match="monitor-only"):
        ask(runtime_dir, AdminSetPowerLimit(gpu=uuids[0], power_limit_w=200.0), PowerLimitOk, admin=True)
    for uuid in uuids:
        control = sim_control(runtime_dir, uuid)
        assert control.locked_sm_clock_mhz is None
    assert monitor.status()["daemon"]["monitor_only"] is True  # still serving


def test_a_read_only_device_never_reaches_the_gpu(tmp_path: Path) -> None:
    backend = SimBackend(gpus=1, sim_dir=tmp_path)
    try:
        (raw,) = backend.devices()
        device = ReadOnlyDevice(raw)
        before = raw.state()
        for write in (
            lambda: device.set_locked_sm_clock_mhz(1005),
            device.reset_locked_sm_clock,
            lambda: device.set_power_limit_w(200.0),
        ):
            with pytest.raises(GpuPermissionError, match="monitor-only"):
                write()
        assert device.refused_writes == 3
        assert raw.state() == before
        assert device.energy_mj() >= 0
        assert device.power_limit_w() == before.power_limit_w
    finally:
        backend.close()


def test_monitor_only_excludes_a_power_pool() -> None:
    with pytest.raises(ConfigError, match="exclude each other"):
        load_config(
            environ={
                "PERSEUSD_MONITOR_ONLY": "true",
                "PERSEUSD_POWER_POOL": "pool-a",
                "PERSEUSD_ETCD_ENDPOINTS": "http://127.0.0.1:2379",
            }
        )
