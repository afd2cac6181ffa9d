"""The client library installs and works alone: a virtual environment holding only the `perseusd-client`
distribution and pyzmq (installed offline from wheels, tests/support/wheels.py) imports `perseus_client`
without the daemon's dependencies and reports a training job's events to a running daemon that shows them.

Its interpreter runs isolated (`-I`: no PYTHONPATH, no current directory on sys.path), so nothing of the
checkout can stand in for what the venv lacks."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.perseusd_proc import REPO_ROOT, DaemonDirs, DaemonProcess, daemon_processes, stop_process
from tests.support.polling import wait_until
from tests.support.wheels import build_client_wheel, offline_pip_env, repack_installed

pytestmark = pytest.mark.timeout(120)

NOT_INSTALLED = ("numpy", "scipy", "sklearn", "prometheus_client", "perseusd", "torch")
"""What a training environment with only the client must not have been given by it."""
OFFLINE = ("--no-index", "--no-deps")
STEPS = 3
MICROBATCHES = 2
TRAINER = """
import importlib.util, json, sys
STEPS, MICROBATCHES = int(sys.argv[3]), int(sys.argv[4])
absent = [name for name in sys.argv[2].split(",") if importlib.util.find_spec(name) is None]
import perseus_client
from perseus_client import PerseusClient
client = PerseusClient(sys.argv[1], job="alone", timeout_s=5.0, strict=True)
gpu = client.daemon_info.gpus[0].uuid
client.claim([gpu])
client.register(gpu, stage=0, num_stages=1, num_microbatches=MICROBATCHES)
for step in range(STEPS):
    with client.step(gpu, step):
        for microbatch in range(MICROBATCHES):
            for instruction in ("forward", "backward"):
                with client.computation(gpu, 0, instruction, microbatch):
                    pass
report = {"absent": absent, "client": perseus_client.__file__, "sent": client.events_sent}
print(json.dumps(report), flush=True)
sys.stdin.readline()  # stay registered until the test has looked at the daemon
client.close()
"""


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment of the base interpreter with no pip, no system site-packages, and only the
    client's wheel and pyzmq's installed into it (by this environment's pip, `--python`, no index)."""
    base = tmp_path_factory.mktemp("client-alone")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    wheels = [build_client_wheel(base), repack_installed("pyzmq", base)]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            *OFFLINE,
            *wheels,
        ],
        check=True,
        env=offline_pip_env(),
        timeout=120,
        capture_output=True,
    )
    return venv


@pytest.fixture
def daemon() -> Iterator[DaemonProcess]:
    with daemon_processes() as make:
        yield make(DaemonDirs.create(), gpus=1).start()


def installed(venv: Path) -> set[str]:
    """The names of the distributions installed in `venv`."""
    code = "import importlib.metadata as m; print(*(d.metadata['Name'] for d in m.distributions()))"
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-I", "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
        cwd=venv,
    )
    return set(out.stdout.split())


def events_received(daemon: DaemonProcess) -> int:
    received: int = daemon.status()["daemon"]["events_received"]
    return received


def test_the_venv_holds_the_client_and_pyzmq_only(client_venv: Path) -> None:
    assert installed(client_venv) == {"perseusd-client", "pyzmq"}


def test_a_venv_with_only_the_client_reports_events_to_a_daemon(
    client_venv: Path, daemon: DaemonProcess
) -> None:
    trainer = subprocess.Popen(
        [
            str(client_venv / "bin" / "python"),
            "-I",
            "-c",
            TRAINER,
            str(daemon.dirs.runtime_dir),
            ",".join(NOT_INSTALLED),
            str(STEPS),
            str(MICROBATCHES),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=client_venv,  # not the checkout: perseus_client must come from the venv
    )
    try:
        assert trainer.stdout is not None
        line = trainer.stdout.readline()
        assert line, trainer.stderr.read() if trainer.stderr else ""
        report = json.loads(line)
        assert report["absent"] == list(NOT_INSTALLED)
        assert Path(report["client"]).is_relative_to(client_venv)
        events = STEPS * 2 * (1 + MICROBATCHES * 2)  # a begin and an end per step and per computation
        assert report["sent"] == events
        wait_until(lambda: events_received(daemon) >= events, 10.0, "the daemon to count the job's events")
        status = daemon.status()
        assert status["daemon"]["events_received"] == events
        (job,) = status["jobs"]
        assert job["job"] == "alone"
        assert status["gpus"][0]["lease"]["job"] == "alone"
    finally:
        if trainer.poll() is None and trainer.stdin is not None:
            trainer.stdin.write("\n")
            trainer.stdin.flush()
            with contextlib.suppress(subprocess.TimeoutExpired):
                trainer.wait(timeout=10)
        stop_process(trainer)
    assert trainer.returncode == 0


def test_the_daemon_distribution_depends_on_the_client_of_this_repository() -> None:
    """perseusd requires perseusd-client at the version client_lib/ has, and ships no copy of it."""
    root = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    client = tomllib.loads((REPO_ROOT / "client_lib" / "pyproject.toml").read_text())
    pin = f"{client['project']['name']}=={client['project']['version']}"
    assert pin in root["project"]["dependencies"]
    assert pin in (importlib.metadata.requires("perseusd") or [])
    assert "perseus_client*" not in root["tool"]["setuptools"]["packages"]["find"]["include"]
    assert importlib.metadata.version("perseusd-client") == client["project"]["version"]
