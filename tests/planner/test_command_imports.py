"""Each `perseusctl` command imports what it uses: checked in a fresh interpreter, from sys.modules."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from perseusd.ctl.main import COMMANDS, command_in
from perseusd.planner.profile_csv import write_profile
from tests.planner.periphery_profiles import shaped_profile

HEAVY = (
    *(
        "numpy",
        "scipy",
        "matplotlib",
        "zmq",
        "perseus_client",
        "perseus_client.client",
        "perseus_client.connection",
        "perseus_client.control_calls",
        "perseus_client.event_sending",
        "perseus_client.protocol",
    ),
    *("lowtime", "networkx", "asyncio"),
)

# Runs perseusctl in this interpreter, then prints which of HEAVY it loaded and the exit code.
RUNNER = (
    "import json, sys\n"
    "from perseusd.ctl.main import main\n"
    "try:\n"
    "    code = main(sys.argv[1:])\n"
    "except SystemExit as exc:\n"
    "    code = exc.code\n"
    f"print(json.dumps({{'code': code, 'loaded': sorted(m for m in {HEAVY!r} if m in sys.modules)}}))\n"
)


def loaded_by(*argv: str) -> tuple[object, set[str]]:
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, *argv], capture_output=True, text=True, timeout=120, check=True
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["code"], set(result["loaded"])


def test_solve_loads_numpy_and_the_protocols_names_only_not_the_client_zmq_or_scipy(tmp_path: Path) -> None:
    profile = tmp_path / "shaped.csv"
    write_profile(shaped_profile([1.0, 1.2, 0.9]), profile)
    code, loaded = loaded_by(
        *("solve", "--profile", str(profile), "--stages", "3", "--microbatches", "3"),
        *("--out", str(tmp_path / "out"), "--json"),
    )
    assert code == 0
    assert (tmp_path / "out" / "frontier.json").exists()
    # the fit's numpy; not scipy; the instructions and schedules are the protocol's names
    # (`perseus_client.message`), not its messages or the client
    assert loaded == {"numpy", "perseus_client"}, loaded


def test_status_does_not_load_numpy_scipy_or_matplotlib(tmp_path: Path) -> None:
    code, loaded = loaded_by("--runtime-dir", str(tmp_path), "status")
    assert code == 2  # no daemon there: the command ran as far as connecting
    assert {"perseus_client", "zmq"} <= loaded  # the client library's control link
    assert loaded.isdisjoint({"numpy", "scipy", "matplotlib", "asyncio"}), loaded


@pytest.mark.parametrize("command", ["jobs", "reset", "plan", "frontier", "profile", "straggler"])
def test_daemon_commands_do_not_load_the_solver_stack(command: str) -> None:
    code, loaded = loaded_by(command, "--help")
    assert code == 0
    assert loaded.isdisjoint({"numpy", "scipy", "matplotlib"}), loaded


def test_help_still_lists_every_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "perseusd.ctl.main", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    for command in COMMANDS:
        assert command in done.stdout


def test_command_in_skips_global_options() -> None:
    assert command_in(["--runtime-dir", "solve", "status"]) == "status"
    assert command_in(["--runtime-dir=/x", "--debug", "solve", "--out", "o"]) == "solve"
    assert command_in(["--help"]) is None
    assert command_in(["nonsense", "solve"]) is None
