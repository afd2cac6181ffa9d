"""perseusd under a real systemd: the shipped unit (unchanged), sysusers file and config, the sim backend.

Inside the machine `/opt/perseusd/bin/perseusd` (the unit's ExecStart= path) is a wrapper running the
bind-mounted source with the machine's Python; `/etc/perseusd/perseusd.toml` selects two simulated GPUs. A
lease is held by a real client (`perseus_client`) running as a transient unit in the machine.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import SOURCE_INSIDE
from nspawn_machine import Machine, MachineError, wait_until
from rootfs import REPO_ROOT

pytestmark = pytest.mark.systemd

UNIT = "perseusd.service"
RUNTIME_DIR = "/run/perseusd"
CONFIG = 'backend = "sim"\nsim_gpus = 2\nsim_model = "a100_sxm"\nlog_level = "DEBUG"\n'
PYTHONPATH = f"{SOURCE_INSIDE}:{SOURCE_INSIDE}/client_lib"
WRAPPER = f"""\
#!/bin/sh
export PYTHONPATH={PYTHONPATH} PYTHONDONTWRITEBYTECODE=1
exec /usr/bin/python3 -c 'import sys; from {{module}} import main; sys.exit(main())' "$@"
"""
LEASE_HOLDER = Path(__file__).with_name("lease_holder.py").read_text()
LEASED = "/run/lease-holder.uuid"
# Prints `[{uuid, locked}]` (the locked SM clock or null) from a status call; exits 2 when the daemon is down.
STATUS = """\
import json, sys
from perseus_client import PerseusClient, PerseusClientError
try:
    with PerseusClient("/run/perseusd", job="svc-status", timeout_s=5.0) as client:
        gpus = client.status().gpus
except PerseusClientError as exc:
    print(exc, file=sys.stderr)
    sys.exit(2)
print(json.dumps([{"uuid": g.uuid, "locked": g.locked_clock_mhz} for g in gpus]))
"""
# Reads a simulated GPU's locked clock straight from its shared-memory file (works with the daemon stopped).
SIM_LOCKED_CLOCK = """\
import sys
from pathlib import Path
from perseusd.gpu.sim_shared import StateMap, state_path
state = StateMap(state_path(Path("/run/perseusd/sim"), sys.argv[1]), writable=False)
print(state.read_control().locked_sm_clock_mhz or 0)
"""
LOCK_MHZ = 1200
START_TIMEOUT_S = 60.0


def _install(machine: Machine, dropin: str = "") -> None:
    for name, module in (("perseusd", "perseusd.daemon.main"), ("perseusctl", "perseusd.ctl.main")):
        machine.write_file(f"/opt/perseusd/bin/{name}", WRAPPER.format(module=module), mode=0o755)
    for name, text in (
        ("lease_holder.py", LEASE_HOLDER),
        ("status.py", STATUS),
        ("sim_clock.py", SIM_LOCKED_CLOCK),
    ):
        machine.write_file(f"/opt/perseus-test/{name}", text, mode=0o755)
    machine.write_file(f"/etc/systemd/system/{UNIT}", (REPO_ROOT / "systemd" / UNIT).read_text())
    sysusers = (REPO_ROOT / "packaging" / "sysusers.d" / "perseusd.conf").read_text()
    machine.write_file("/usr/lib/sysusers.d/perseusd.conf", sysusers)
    machine.write_file("/etc/perseusd/perseusd.toml", CONFIG)
    # The tests' own settings: no core files from the watchdog's SIGABRT, plus what each test adds.
    machine.write_file(f"/etc/systemd/system/{UNIT}.d/50-test.conf", f"[Service]\nLimitCORE=0\n{dropin}")
    machine.run(["systemd-sysusers"])
    machine.systemctl("daemon-reload")


def _python(machine: Machine, script: str, *args: str, check: bool = True) -> str:
    argv = ["/usr/bin/env", f"PYTHONPATH={PYTHONPATH}", "PYTHONDONTWRITEBYTECODE=1", "/usr/bin/python3"]
    return machine.run([*argv, f"/opt/perseus-test/{script}", *args], check=check).stdout


def _diagnose(machine: Machine) -> str:
    return f"journal:\n{machine.journal(UNIT)}\nlease holder:\n{machine.journal('lease-holder.service', 40)}"


def _start(machine: Machine) -> None:
    try:
        machine.systemctl("start", UNIT, timeout_s=START_TIMEOUT_S)
    except MachineError as exc:
        raise MachineError(f"{exc}\n{_diagnose(machine)}") from exc


def _gpus(machine: Machine) -> list[dict[str, object]]:
    gpus: list[dict[str, object]] = json.loads(_python(machine, "status.py"))
    return gpus


def _start_lease_holder(machine: Machine) -> None:
    argv = ["systemd-run", "--unit=lease-holder", f"--setenv=PYTHONPATH={PYTHONPATH}", "/usr/bin/python3"]
    machine.run([*argv, "/opt/perseus-test/lease_holder.py", str(LOCK_MHZ), LEASED, "svc-test"])


def _hold_lease(machine: Machine) -> str:
    """Start a client that leases GPU 0 and locks its clock; returns the GPU's UUID."""
    _start_lease_holder(machine)
    _eventually(machine, machine.path(LEASED).exists, "the lease holder to lock a clock", timeout_s=20)
    return machine.path(LEASED).read_text()


def _locked(machine: Machine, uuid: str) -> object:
    return next(gpu["locked"] for gpu in _gpus(machine) if gpu["uuid"] == uuid)


def _eventually(machine: Machine, check: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    try:
        wait_until(check, timeout_s, what)
    except MachineError as exc:
        raise MachineError(f"{exc}\n{_diagnose(machine)}") from exc


def test_start_is_active_only_after_ready(machine: Machine) -> None:
    _install(machine)
    _start(machine)
    # `systemctl start` of a Type=notify unit returns once READY=1 arrived: by then the GPUs are initialised
    # and the sockets bound.
    assert machine.show(UNIT, "ActiveState") == "active"
    assert machine.show(UNIT, "SubState") == "running"
    listing = machine.sh(f"ls {RUNTIME_DIR}")
    assert "control.sock" in listing.split()
    assert machine.show(UNIT, "StatusText"), "the daemon sent no STATUS= line"
    assert machine.sh(f"stat -c %a {RUNTIME_DIR}").strip() == "750"
    assert len(_gpus(machine)) == 2


def test_reload_keeps_the_daemon(machine: Machine) -> None:
    _install(machine)
    _start(machine)
    pid = machine.show(UNIT, "MainPID")
    machine.systemctl("reload", UNIT)
    _eventually(machine, lambda: "configuration reloaded" in machine.journal(UNIT), "the reload log line")
    assert machine.show(UNIT, "MainPID") == pid
    assert machine.show(UNIT, "ActiveState") == "active"


def test_kill_9_while_leased_restores_and_restarts(machine: Machine) -> None:
    _install(machine)
    _start(machine)
    uuid = _hold_lease(machine)
    assert _locked(machine, uuid) == LOCK_MHZ
    pid = machine.show(UNIT, "MainPID")
    assert int(pid) > 1
    machine.sh(f"kill -9 {shlex.quote(pid)}")

    def restarted() -> bool:
        return machine.show(UNIT, "NRestarts") == "1" and machine.show(UNIT, "ActiveState") == "active"

    _eventually(machine, restarted, "a restart after kill -9")
    assert machine.show(UNIT, "MainPID") != pid
    assert _locked(machine, uuid) is None
    # ExecStopPost= (`perseusd reset`) restored the leased GPU before the restart.
    assert "reset: restored 1 GPU(s)" in machine.journal(UNIT)


def test_hung_gpu_thread_trips_the_watchdog(machine: Machine) -> None:
    faults = json.dumps([{"gpu": 0, "op": "set_locked_sm_clock_mhz", "kind": "slow", "delay_s": 60}])
    dropin = (
        "WatchdogSec=3s\nEnvironment=PERSEUSD_GPU_CALL_TIMEOUT_S=1\n"
        f"Environment='PERSEUSD_SIM_FAULTS={faults}'\n"
    )
    _install(machine, dropin)
    _start(machine)
    pid = machine.show(UNIT, "MainPID")
    _start_lease_holder(machine)  # its set_clock call hangs in GPU 0's owner thread
    _eventually(machine, lambda: "Watchdog timeout" in machine.journal(UNIT), "the watchdog to trip")
    _eventually(machine, lambda: machine.show(UNIT, "NRestarts") == "1", "a restart after the watchdog")
    _eventually(machine, lambda: machine.show(UNIT, "ActiveState") == "active", "the restarted daemon")
    assert machine.show(UNIT, "MainPID") != pid


def test_stop_runs_the_reset(machine: Machine) -> None:
    # Keep the runtime directory after stop so the simulated GPU's state can be read.
    _install(machine, "RuntimeDirectoryPreserve=yes\n")
    _start(machine)
    uuid = _hold_lease(machine)
    assert _python(machine, "sim_clock.py", uuid).strip() == str(LOCK_MHZ)
    machine.systemctl("stop", UNIT)
    assert machine.show(UNIT, "ActiveState") == "inactive"
    stop_post = machine.show(UNIT, "ExecStopPost")
    assert "status=0" in stop_post, stop_post
    assert "reset: restored" in machine.journal(UNIT)
    assert _python(machine, "sim_clock.py", uuid).strip() == "0"
