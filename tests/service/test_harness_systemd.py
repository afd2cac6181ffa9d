"""The container harness itself, checked with a tiny Type=notify service of our own (stdlib Python).

It proves what the perseusd tests rely on: `systemctl start` returns only after READY=1, a missed watchdog
restarts the service with result "watchdog", and `kill -9` of the main process restarts it.
"""

from __future__ import annotations

import pytest
from nspawn_machine import Machine, wait_until

UNIT = "notifyd.service"
SERVICE_SCRIPT = """\
import os, socket, sys, time

def notify(message):
    name = os.environ["NOTIFY_SOCKET"]
    address = "\\0" + name[1:] if name.startswith("@") else name
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(message.encode(), address)

time.sleep(1.0)  # slow start: `systemctl start` must wait for READY=1
open("/run/notifyd/ready-sent", "w").close()
notify("READY=1\\nSTATUS=serving")
interval_s = int(os.environ["WATCHDOG_USEC"]) / 1e6 / 4
while True:
    if not os.path.exists("/run/notifyd/hang"):
        notify("WATCHDOG=1")
    time.sleep(interval_s)
"""
UNIT_TEXT = """\
[Service]
Type=notify
NotifyAccess=main
ExecStart=/usr/bin/python3 /opt/notifyd/notifyd.py
RuntimeDirectory=notifyd
RuntimeDirectoryPreserve=yes
WatchdogSec=2s
Restart=on-failure
RestartSec=200ms
"""

pytestmark = pytest.mark.systemd


@pytest.fixture
def notifyd(machine: Machine) -> Machine:
    machine.write_file("/opt/notifyd/notifyd.py", SERVICE_SCRIPT, mode=0o755)
    machine.write_file(f"/etc/systemd/system/{UNIT}", UNIT_TEXT)
    machine.systemctl("daemon-reload")
    machine.systemctl("start", UNIT, timeout_s=30)
    return machine


def _restarted(machine: Machine, restarts: int) -> bool:
    return machine.show(UNIT, "NRestarts") == str(restarts) and machine.show(UNIT, "ActiveState") == "active"


def test_start_returns_after_ready(notifyd: Machine) -> None:
    assert notifyd.show(UNIT, "ActiveState") == "active"
    assert notifyd.path("/run/notifyd/ready-sent").exists()
    assert notifyd.show(UNIT, "StatusText") == "serving"


def test_missed_watchdog_restarts(notifyd: Machine) -> None:
    notifyd.sh("touch /run/notifyd/hang")
    wait_until(lambda: notifyd.show(UNIT, "NRestarts") == "1", 20, "a watchdog restart")
    assert "watchdog" in notifyd.journal(UNIT)


def test_kill_9_restarts(notifyd: Machine) -> None:
    pid = notifyd.show(UNIT, "MainPID")
    assert int(pid) > 1
    notifyd.sh(f"kill -9 {pid}")
    wait_until(lambda: _restarted(notifyd, 1), 20, "a restart after kill -9")
    assert notifyd.show(UNIT, "MainPID") != pid
