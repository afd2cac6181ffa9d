"""`perseusctl status` and `reset`: rendering (golden), JSON shape, exit codes against a real daemon."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from perseus_client.protocol import (
    PROTOCOL_MAJOR,
    PROTOCOL_MINOR,
    DaemonHealth,
    GpuStatus,
    LeaseInfo,
    StatusReply,
)

from perseusd.ctl.status_cmd import render_table, status_json
from perseusd.ctl.terminal import safe_output
from perseusd.planner.bundled import bundled_profile
from perseusd.workload.sim_workload import SimGpuHandle
from tests.support.ctl import run_ctl as _ctl
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes

pytestmark = pytest.mark.timeout(60)

REPLY = StatusReply(
    daemon=DaemonHealth("0.1.0", 1, 42, 3725.0, 1, 100, 2, {}, 3, 0, 0.0004, 0, backend="sim"),
    gpus=(
        GpuStatus(
            "GPU-a",
            "A100",
            1200,
            1200,
            250.25,
            400.0,
            12.5,
            LeaseInfo(7, 0, "train"),
            None,
            {"read": 0.02},
            index=0,
            pci_bus_id="00000000:17:00.0",
        ),
        GpuStatus("GPU-b", "A100", 1410, None, None, 400.0, None, None, None, {}),
        GpuStatus("GPU-d", "H100", 1710, 1980, 690.0, 700.0, 9.5, None, None, {}, power_capped=True),
        GpuStatus("GPU-c", "A100", None, None, None, None, None, None, "GPU is lost", {}),
    ),
)

GOLDEN = """\
perseusd 0.1.0 (protocol 1.0), pid 42, up 1h02m05s, 1 client(s), SIMULATED GPUs
events: 100 received, 2 dropped, 0 lost; restores: 3 (0 failed); refused connections: 0
GPU call mean ms (worst GPU): read 0.020
users: uid 0 1 GPU

GPU  UUID   PCI BUS ID        NAME  SM MHZ       LOCKED  POWER W  LIMIT W  ENERGY J  LEASE
0    GPU-a  00000000:17:00.0  A100  1200         1200    250.2    400      12.5      pid 7 uid 0 train
-    GPU-b  -                 A100  1410         -       -        400      -         -
-    GPU-d  -                 H100  1710 capped  1980    690.0    700      9.5       -
-    GPU-c  -                 A100  ERROR: GPU is lost"""


def test_table_golden() -> None:
    assert render_table(REPLY) == GOLDEN


def test_json_shape() -> None:
    body = status_json(REPLY)
    assert {"version", "protocol", "uptime_s", "clients", "events_received", "events_dropped"} <= set(
        body["daemon"]
    )
    gpu = body["gpus"][1]
    assert gpu["locked_clock_mhz"] is None
    assert gpu["lease"] is None
    assert body["gpus"][0]["lease"] == {"pid": 7, "uid": 0, "job": "train", "slurm_job": None}
    json.dumps(body)


def test_unreachable_exits_2_with_one_line(tmp_path: Path) -> None:
    out = _ctl(tmp_path, "status")
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1
    assert "Traceback" not in out.stderr


@pytest.fixture
def daemon() -> Iterator[DaemonProcess]:
    with daemon_processes() as make:
        yield make(DaemonDirs.create(), gpus=2).start()


def test_status_and_reset_against_real_daemon(daemon: DaemonProcess) -> None:
    out = _ctl(daemon.dirs.runtime_dir, "status", "--json")
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert body["daemon"]["protocol"] == PROTOCOL_MAJOR
    assert body["daemon"]["protocol_minor"] == PROTOCOL_MINOR
    assert len(body["gpus"]) == 2
    assert body["gpus"][0]["locked_clock_mhz"] is None
    table = _ctl(daemon.dirs.runtime_dir, "status")
    assert table.returncode == 0
    assert body["gpus"][0]["uuid"] in table.stdout
    reset = _ctl(daemon.dirs.runtime_dir, "reset")
    assert reset.returncode == 0, reset.stderr
    assert reset.stdout.count("reset GPU-") == 2
    assert body["gpus"][0]["power_capped"] is False
    bad = _ctl(daemon.dirs.runtime_dir, "reset", "GPU-nope")
    assert bad.returncode == 1
    assert "UNKNOWN_GPU" in bad.stderr


def test_status_shows_the_clock_a_power_capped_h100_runs_at() -> None:
    """A dense stage on the simulated H100 (unlocked) runs at the power-capped clock; status says so."""
    with daemon_processes() as make:
        daemon = make(DaemonDirs.create(), gpus=1, extra_args=("--sim-model", "h100_sxm")).start()
        runtime_dir = daemon.dirs.runtime_dir
        uuid = json.loads(_ctl(runtime_dir, "status", "--json").stdout)["gpus"][0]["uuid"]
        with SimGpuHandle.open(runtime_dir / "sim", uuid, bundled_profile("h100_sxm")) as gpu:
            record = gpu.run(0, "backward")
        out = _ctl(runtime_dir, "status", "--json")
        assert out.returncode == 0, out.stderr
        row = json.loads(out.stdout)["gpus"][0]
        assert record.capped
        assert (row["sm_clock_mhz"], row["power_capped"]) == (record.ran_mhz, True)
        assert f"{record.ran_mhz} capped" in _ctl(runtime_dir, "status").stdout


STATUS_NEVER_LOADS = (
    "numpy",
    "scipy",
    "matplotlib",
    "asyncio",
    "perseusd.planner",
    "perseus_client.client",
    "perseus_client.connection",
    "perseus_client.control_calls",
    "perseus_client.event_sending",
)
"""What `perseusctl status` has no use for: the solver's stack, asyncio (pyzmq's monitor helpers would load
it) and the training client (it asks over the client library's control link, `perseus_client.link`)."""


def test_status_imports_only_what_it_needs(daemon: DaemonProcess, tmp_path: Path) -> None:
    """The modules a real `perseusctl status` run loaded, from a fresh interpreter (not from its source)."""
    loaded_path = tmp_path / "modules.json"
    code = (
        "import json, sys; from perseusd.ctl.main import main; "
        f"code = main(['--runtime-dir', {str(daemon.dirs.runtime_dir)!r}, 'status']); "
        f"open({str(loaded_path)!r}, 'w').write(json.dumps(sorted(sys.modules))); sys.exit(code)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "GPU-" in out.stdout
    loaded = json.loads(loaded_path.read_text())
    assert {"perseus_client.status_messages", "zmq"} <= set(loaded)
    unwanted = [m for m in loaded if any(m == n or m.startswith(f"{n}.") for n in STATUS_NEVER_LOADS)]
    assert not unwanted
    assert "perseusd.ctl.jobs_cmd" not in loaded  # the jobs' rendering only when there are jobs


def test_the_runtime_directory_comes_from_the_environment(daemon: DaemonProcess) -> None:
    """`PERSEUSD_RUNTIME_DIR` (what the client library reads too) instead of `--runtime-dir`."""
    env = {**os.environ, "PERSEUSD_RUNTIME_DIR": str(daemon.dirs.runtime_dir)}
    command = [sys.executable, "-m", "perseusd.ctl.main", "status", "--json"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False, env=env)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["gpus"]) == 2
    wrong = [*command[:3], "--runtime-dir", str(daemon.dirs.base / "elsewhere"), *command[3:]]
    out = subprocess.run(wrong, capture_output=True, text=True, timeout=30, check=False, env=env)
    assert out.returncode == 2  # the option wins
    assert "wrong runtime directory" in out.stderr


def test_perseusctl_and_the_client_read_the_same_variable() -> None:
    from perseus_client import reach

    from perseusd.ctl import main as ctl_main

    assert (ctl_main.RUNTIME_DIR_ENV, ctl_main.DEFAULT_RUNTIME_DIR) == (
        reach.RUNTIME_DIR_ENV,
        reach.DEFAULT_RUNTIME_DIR,
    )


def test_hostile_job_name_reaches_the_terminal_as_visible_escapes(capsys: pytest.CaptureFixture[str]) -> None:
    """A job name from a reply (a fake daemon owning the socket, a state file of an older version) with an
    OSC title escape, a bell and a lone surrogate: printed as visible escapes, and nothing crashes."""
    hostile = "evil\x1b]0;owned\x07\x9b2J\u202e\ud800"
    row = dataclasses.replace(REPLY.gpus[0], lease=LeaseInfo(7, 0, hostile))
    with safe_output():
        print(render_table(dataclasses.replace(REPLY, gpus=(row,))))
        print(f"perseusctl: error: job {hostile}", file=sys.stderr)
    captured = capsys.readouterr()
    for text in (captured.out, captured.err):
        assert not any(char in text for char in "\x1b\x07\x9b\u202e\ud800")
        assert "evil\\x1b]0;owned\\x07\\x9b2J\\u202e\\ud800" in text


def test_status_shows_who_uses_what() -> None:
    """Per uid: GPUs leased and jobs by state, in the table and in `--json`."""
    leases = [
        dataclasses.replace(REPLY.gpus[i], lease=LeaseInfo(7 + i, uid, "j"))
        for i, uid in ((0, 0), (1, 1000), (2, 1000))
    ]
    reply = dataclasses.replace(REPLY, gpus=(*leases, REPLY.gpus[3]))
    assert "users: uid 1000 2 GPUs; uid 0 1 GPU" in render_table(reply)
    assert status_json(reply)["users"] == [
        {"uid": 1000, "gpus_leased": 2, "jobs": {}},
        {"uid": 0, "gpus_leased": 1, "jobs": {}},
    ]


def test_top_level_help_describes_the_tool() -> None:
    out = _ctl(Path("/nonexistent"), "--help")
    assert out.returncode == 0
    assert "The command line of Perseus" in out.stdout
    assert "entry point" not in out.stdout  # the tool, not the module
    assert "Exit codes: 0 ok" in out.stdout
