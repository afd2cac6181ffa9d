"""The Debian package under a real systemd: install, metrics exposures, upgrade while leased, purge.

The package is built once per session from this source tree by `packaging/build-deb.sh` (dpkg-deb; its
Python dependencies from PyPI or pip's cache); the upgrade installs the same payload repacked with a bumped
version. Inside the booted Debian 12 machine the daemon runs from the package (/opt/perseusd) on two simulated
GPUs (a drop-in sets the backend through the environment, so the package's conffile stays untouched); the
lease-holding client is the source tree's client library on the machine's own Python, as a training job's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import SOURCE_INSIDE
from nspawn_machine import Machine, MachineError, wait_until
from rootfs import REPO_ROOT

from perseusd.planner.profile_csv import profile_to_csv
from tests.support.synthetic import synthetic_profile

pytestmark = [pytest.mark.systemd, pytest.mark.timeout(600)]

UNIT = "perseusd.service"
UPGRADE_SUFFIX = "+upgrade1"
BUILD_TIMEOUT_S = 480
PYTHONPATH = f"{SOURCE_INSIDE}/client_lib"
TEST_DROPIN = f"/etc/systemd/system/{UNIT}.d/50-test.conf"
SIM_ENV = (
    "[Service]\nLimitCORE=0\nEnvironment=PERSEUSD_BACKEND=sim PERSEUSD_SIM_GPUS=2\n"
    # Keep the simulated GPUs' state across stop and start, as real GPUs keep theirs.
    "RuntimeDirectoryPreserve=yes\n"
)
LOCK_MHZ = 1200
LEASED = "/run/lease-holder.uuid"
LEASE_HOLDER = Path(__file__).with_name("lease_holder.py").read_text()
# A training job on the second GPU, as docs/pytorch.md's client does it: fail-open, the GPU by UUID (from the
# launcher's CUDA_VISIBLE_DEVICES), the profile imported, the stage registered; then it sends a 1-stage 1F1B
# job's events until stopped and counts its steps in a file. It must never stop because of the daemon.
TRAINER = """\
import sys, time
from perseus_client import PerseusClient
client = PerseusClient(job="deb-train", timeout_s=5.0)
gpu = client.gpu_uuid()
client.profile_import(open(sys.argv[1]).read(), p_block_w=80.0)
client.claim([gpu])
client.register(gpu, stage=0, num_stages=1, num_microbatches=2)
step = 0
while True:
    with client.step(gpu, step):
        for mb in range(2):
            for instruction in ("forward", "backward"):
                with client.computation(gpu, 0, instruction, mb):
                    time.sleep(0.005)
    step += 1
    with open(sys.argv[2] + ".tmp", "w") as out:
        out.write(str(step))
    __import__("os").rename(sys.argv[2] + ".tmp", sys.argv[2])
"""
TRAINER_STEPS = "/run/trainer.steps"
SCRAPE = """\
import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())
"""


@pytest.fixture(scope="session")
def debs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The package built from this tree, and the same payload repacked with a bumped version."""
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb is not installed (Debian package dpkg)")
    out = tmp_path_factory.mktemp("deb")
    proc = subprocess.run(
        [str(REPO_ROOT / "packaging" / "build-deb.sh"), "--out", str(out)],
        env={**_clean_env(), "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = Path(proc.stdout.strip().splitlines()[-1])
    tree = out / "tree"
    subprocess.run(["dpkg-deb", "-R", str(first), str(tree)], check=True, timeout=120)
    control = tree / "DEBIAN" / "control"
    version = _field(control.read_text(), "Version")
    control.write_text(
        control.read_text().replace(f"Version: {version}", f"Version: {version}{UPGRADE_SUFFIX}")
    )
    second = out / f"perseusd_{version}{UPGRADE_SUFFIX}.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "-b", str(tree), str(second)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    shutil.rmtree(tree)
    return first, second


def _clean_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "PERSEUSD_"))}


def _field(control: str, name: str) -> str:
    return next(line.split(":", 1)[1].strip() for line in control.splitlines() if line.startswith(f"{name}:"))


def _copy_in(machine: Machine, deb: Path) -> str:
    inside = f"/var/tmp/{deb.name}"
    shutil.copyfile(deb, machine.path(inside))
    return inside


def _dpkg(machine: Machine, *args: str) -> str:
    proc = machine.run(["env", "DEBIAN_FRONTEND=noninteractive", "dpkg", *args], timeout_s=300, check=False)
    if proc.returncode != 0:
        raise MachineError(
            f"dpkg {' '.join(args)}: {proc.returncode}\n{proc.stdout}\n{proc.stderr}\n{_journal(machine)}"
        )
    return proc.stdout + proc.stderr


def _journal(machine: Machine) -> str:
    return f"journal:\n{machine.journal(UNIT)}\nlease holder:\n{machine.journal('lease-holder.service', 40)}"


def _status(machine: Machine) -> list[dict[str, object]]:
    out = machine.run(["/usr/bin/perseusctl", "status", "--json"]).stdout
    gpus: list[dict[str, object]] = json.loads(out)["gpus"]
    return gpus


def _eventually(machine: Machine, check: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    try:
        wait_until(check, timeout_s, what)
    except MachineError as exc:
        raise MachineError(f"{exc}\n{_journal(machine)}") from exc


def _prepare(machine: Machine, dropin: str = "") -> None:
    machine.write_file(TEST_DROPIN, SIM_ENV + dropin)
    machine.write_file("/opt/perseus-test/lease_holder.py", LEASE_HOLDER, mode=0o755)
    machine.write_file("/opt/perseus-test/trainer.py", TRAINER, mode=0o755)
    profile = synthetic_profile(1, seed=3, clocks_mhz=tuple(range(1410, 885, -90)))
    machine.write_file("/opt/perseus-test/profile.csv", profile_to_csv(profile))
    machine.write_file("/opt/perseus-test/scrape.py", SCRAPE, mode=0o755)


def _active(machine: Machine) -> bool:
    return machine.show(UNIT, "ActiveState") == "active"


def _hold_lease(machine: Machine) -> str:
    argv = ["systemd-run", "--unit=lease-holder", f"--setenv=PYTHONPATH={PYTHONPATH}", "/usr/bin/python3"]
    machine.run([*argv, "/opt/perseus-test/lease_holder.py", str(LOCK_MHZ), LEASED, "deb-test"])
    _eventually(machine, machine.path(LEASED).exists, "the lease holder to lock a clock")
    return machine.path(LEASED).read_text()


def _train(machine: Machine) -> None:
    """The trainer on the second GPU (CUDA_VISIBLE_DEVICES=1, as a launcher gives it), its plan running."""
    argv = [
        "systemd-run",
        "--unit=trainer",
        f"--setenv=PYTHONPATH={PYTHONPATH}",
        "--setenv=CUDA_VISIBLE_DEVICES=1",
    ]
    machine.run(
        [
            *argv,
            "/usr/bin/python3",
            "/opt/perseus-test/trainer.py",
            "/opt/perseus-test/profile.csv",
            TRAINER_STEPS,
        ]
    )
    _eventually(machine, lambda: _job_state(machine) == "running", "the trainer's plan")


def _job_state(machine: Machine) -> object:
    proc = machine.run(["/usr/bin/perseusctl", "jobs", "--json"], check=False)
    if proc.returncode != 0:
        return None
    jobs = {job["job"]: job for job in json.loads(proc.stdout)["jobs"]}
    return jobs["deb-train"]["state"] if "deb-train" in jobs else None


def _trainer_steps(machine: Machine) -> int:
    path = machine.path(TRAINER_STEPS)
    return int(path.read_text()) if path.exists() else 0


def _lease_pid(machine: Machine, uuid: str) -> object:
    gpu = next(g for g in _status(machine) if g["uuid"] == uuid)
    lease = gpu["lease"]
    return lease["pid"] if isinstance(lease, dict) else None


def test_install_upgrade_while_leased_and_purge(machine: Machine, debs: tuple[Path, Path]) -> None:
    first, second = debs
    _prepare(machine)
    _dpkg(machine, "-i", _copy_in(machine, first))
    # Installed: groups, conffile, enabled and running, tools on the PATH.
    assert machine.run(["getent", "group", "perseus"], check=False).returncode == 0
    assert machine.run(["getent", "group", "perseus-admin"], check=False).returncode == 0
    conffiles = machine.run(["dpkg-query", "-W", "-f=${Conffiles}", "perseusd"]).stdout
    assert "/etc/perseusd/perseusd.toml" in conffiles
    assert machine.systemctl("is-enabled", UNIT).strip() == "enabled"
    _eventually(machine, lambda: _active(machine), "the packaged daemon to run")
    assert machine.show(UNIT, "ExecMainStatus") in ("0", "")
    assert len(_status(machine)) == 2

    uuid = _hold_lease(machine)
    _train(machine)
    holder_pid = _lease_pid(machine, uuid)
    assert isinstance(holder_pid, int)
    assert next(g for g in _status(machine) if g["uuid"] == uuid)["locked_clock_mhz"] == LOCK_MHZ
    old_pid = machine.show(UNIT, "MainPID")

    # Upgrade while the client holds its lease: the old daemon stops (restoring the GPU), the new one starts,
    # and the client re-claims its GPU on its own.
    _dpkg(machine, "-i", _copy_in(machine, second))
    version = machine.run(["dpkg-query", "-W", "-f=${Version}", "perseusd"]).stdout
    assert version.endswith(UPGRADE_SUFFIX)
    _eventually(machine, lambda: _active(machine), "the upgraded daemon to run")
    assert machine.show(UNIT, "MainPID") != old_pid
    _eventually(machine, lambda: _lease_pid(machine, uuid) == holder_pid, "the client to re-claim its GPU")
    gpu = next(g for g in _status(machine) if g["uuid"] == uuid)
    assert gpu["locked_clock_mhz"] is None  # restored at the upgrade; the client re-claimed, did not re-lock
    assert "shutdown: restored 2 GPU(s)" in machine.journal(UNIT)
    # The trainer never stopped: it trained on unmanaged, then its job came back from the daemon's cache,
    # running its plan again without profiling.
    steps = _trainer_steps(machine)
    _eventually(machine, lambda: _job_state(machine) == "running", "the trainer's plan back", 30)
    _eventually(machine, lambda: _trainer_steps(machine) > steps + 5, "the trainer to go on")
    assert machine.show("trainer.service", "ActiveState") == "active"
    jobs = {
        job["job"]: job
        for job in json.loads(machine.run(["/usr/bin/perseusctl", "jobs", "--json"]).stdout)["jobs"]
    }
    assert jobs["deb-train"]["cached"]
    assert jobs["deb-train"]["profiling"] is None
    machine.systemctl("stop", "trainer.service")

    # Purge: stopped (the re-claimed GPU restored again), disabled, files and state gone.
    _dpkg(machine, "--purge", "perseusd")
    assert machine.show(UNIT, "ActiveState") in ("inactive", "")
    assert machine.journal(UNIT).count("shutdown: restored 1 GPU(s)") >= 1  # the holder's, at the purge
    for path in (
        "/lib/systemd/system/perseusd.service",
        "/etc/perseusd",
        "/var/lib/perseusd",
        "/opt/perseusd",
    ):
        assert not machine.path(path).exists(), f"{path} left behind by the purge"
    assert machine.run(["dpkg", "-s", "perseusd"], check=False).returncode != 0


def test_packaged_metrics_under_the_hardened_unit(machine: Machine, debs: tuple[Path, Path]) -> None:
    """Both exposures through the shipped drop-ins: HTTP on localhost, and the node_exporter textfile."""
    textfile_dir = "/var/lib/prometheus/node-exporter"
    machine.sh(f"mkdir -p {textfile_dir}")
    env = f"Environment=PERSEUSD_METRICS_HTTP_PORT=9464 PERSEUSD_METRICS_TEXTFILE_DIR={textfile_dir}\n"
    _prepare(machine, env)
    for name in ("perseusd-metrics-http.conf", "perseusd-metrics-textfile.conf"):
        machine.sh(
            f"mkdir -p /etc/systemd/system/{UNIT}.d && "
            f"ln -s /usr/share/perseusd/systemd/{name} /etc/systemd/system/{UNIT}.d/{name}"
        )
    _dpkg(machine, "-i", _copy_in(machine, debs[0]))
    _eventually(machine, lambda: _active(machine), "the packaged daemon to run")
    text = machine.run(
        ["/usr/bin/python3", "/opt/perseus-test/scrape.py", "http://127.0.0.1:9464/metrics"]
    ).stdout
    assert "perseus_gpu_up{" in text
    assert text.count("perseus_gpu_power_watts{") == 2
    prom = machine.path(f"{textfile_dir}/perseusd.prom")
    assert prom.exists()
    assert prom.stat().st_mode & 0o777 == 0o644
    assert "perseus_events_received_total" in prom.read_text()
    assert machine.show(UNIT, "PrivateNetwork") == "no"
    assert machine.show(UNIT, "ProtectSystem") == "strict"
