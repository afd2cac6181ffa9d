"""A real one-node Slurm cluster for tests: Debian's munged, slurmctld and slurmd, started by the test as root
with a configuration of its own (ports, state, logs and a munge key in a temporary directory), and stopped
at the end.

The node declares 4 GPUs as generic resources (gres.conf `File=` names device nodes 195:0-3 the test makes;
no driver is behind them, they are never opened), so `srun --gres=gpu:N` jobs get CUDA_VISIBLE_DEVICES and
their prolog SLURM_JOB_GPUS as on a GPU node. Where the host mounts the cgroup v1 hierarchies, jobs run in
Slurm's cgroups (proctrack/cgroup, task/cgroup with ConstrainDevices), and perseusd reads the job id from
the job's cgroup path; elsewhere (cgroup v2 without systemd) jobs are tracked by process (proctrack/linuxproc)
and the job id comes from the job's environment.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.support.ports import free_ports

REQUIRED = {"munged": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd", "srun": "slurm-client"}
GPUS = 4
READY_TIMEOUT_S = 60.0
CGROUP_V1 = Path("/sys/fs/cgroup/freezer")


def missing_requirement() -> str | None:
    if os.geteuid() != 0:
        return "needs root (starts munged, slurmctld and slurmd)"
    for tool, package in REQUIRED.items():
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            return f"{tool} is not installed (Debian package {package}; scripts/setup.sh --dev installs it)"
    return None


def _tool(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


@dataclass
class SlurmCluster:
    base: Path
    env: dict[str, str]
    cgroups: bool
    """Jobs run in Slurm's cgroups (cgroup v1): the daemon reads their job id from the cgroup path."""

    def run(self, *argv: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout_s, env=self.env, check=False
        )

    def popen(self, *argv: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env
        )

    def log(self) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log", "prolog.log", "epilog.log"):
            path = self.base / "log" / name
            if path.exists():
                parts.append(f"== {name}\n{path.read_text()[-4000:]}")
        return "\n".join(parts)


def _config(base: Path, host: str, cgroups: bool, prolog: Path, epilog: Path) -> str:
    tracking = (
        ["ProctrackType=proctrack/cgroup", "TaskPlugin=task/cgroup"]
        if cgroups
        else ["ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none"]
    )
    ctld_port, slurmd_port = free_ports(2)
    return "\n".join(
        [
            "ClusterName=perseustest",
            f"SlurmctldHost={host}(127.0.0.1)",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={base / 'munge.sock'}",
            "MpiDefault=none",
            *tracking,
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "GresTypes=gpu",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            f"StateSaveLocation={base / 'state'}",
            f"SlurmdSpoolDir={base / 'spool'}",
            f"SlurmctldPidFile={base / 'slurmctld.pid'}",
            f"SlurmdPidFile={base / 'slurmd.pid'}",
            f"SlurmctldLogFile={base / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={base / 'log' / 'slurmd.log'}",
            "ReturnToService=2",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            f"Prolog={prolog}",
            f"Epilog={epilog}",
            "PrologFlags=Alloc",
            "KillWait=2",
            f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} Gres=gpu:{GPUS} State=UNKNOWN",
            "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


def _hook(base: Path, kind: str, runtime_dir: Path, extra: str = "") -> Path:
    """The prolog or epilog slurmd runs: perseusctl slurm prolog|epilog (its output to a log)."""
    script = base / f"{kind}.sh"
    log = base / "log" / f"{kind}.log"
    script.write_text(
        "#!/bin/sh\n"
        f"exec {sys.executable} -m perseusd.ctl.main --runtime-dir {runtime_dir} slurm {kind} {extra}"
        f" >>{log} 2>&1\n"
    )
    script.chmod(0o755)
    return script


def _start(argv: list[str], log: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=dict(env))


def _wait_idle(cluster: SlurmCluster, daemons: list[subprocess.Popen[bytes]]) -> None:
    deadline_s = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline_s:
        for proc in daemons:
            if proc.poll() is not None:
                raise AssertionError(f"{proc.args[0]} exited with {proc.returncode}:\n{cluster.log()}")
        state = cluster.run("sinfo", "--noheader", "--format=%T", timeout_s=10).stdout.strip()
        if state == "idle":
            return
        time.sleep(0.2)
    raise AssertionError(f"the Slurm node is not idle after {READY_TIMEOUT_S} s:\n{cluster.log()}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextlib.contextmanager
def slurm_cluster(base: Path, runtime_dir: Path, record: Path) -> Iterator[SlurmCluster]:
    """munged, slurmctld and slurmd on this host, its prolog and epilog talking to the daemon at
    `runtime_dir` (the epilog appends each job's record to `record`); all stopped at the end."""
    for sub in ("state", "spool", "log", "dev"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    for minor in range(GPUS):
        os.mknod(base / "dev" / f"nvidia{minor}", 0o666 | 0o020000, os.makedev(195, minor))
    key = base / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    cgroups = CGROUP_V1.is_dir()
    host = socket.gethostname().split(".")[0]
    conf = base / "slurm.conf"
    conf.write_text(
        _config(
            base,
            host,
            cgroups,
            _hook(base, "prolog", runtime_dir),
            _hook(base, "epilog", runtime_dir, f"--record {record}"),
        )
    )
    (base / "gres.conf").write_text(f"AutoDetect=off\nName=gpu File={base / 'dev'}/nvidia[0-{GPUS - 1}]\n")
    (base / "cgroup.conf").write_text(
        "CgroupPlugin=cgroup/v1\nConstrainDevices=yes\nConstrainCores=no\nConstrainRAMSpace=no\n"
        if cgroups
        else "CgroupPlugin=autodetect\n"
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    munged = _start(
        [
            _tool("munged"),
            "--foreground",
            "--force",
            f"--key-file={key}",
            f"--socket={base / 'munge.sock'}",
            f"--pid-file={base / 'munged.pid'}",
            f"--log-file={base / 'log' / 'munged.log'}",
            f"--seed-file={base / 'munge.seed'}",
        ],
        base / "log" / "munged.out",
        env,
    )
    started = [munged]
    try:
        deadline_s = time.monotonic() + READY_TIMEOUT_S
        while not (base / "munge.sock").exists():
            assert munged.poll() is None, (base / "log" / "munged.out").read_text()
            assert time.monotonic() < deadline_s, "munged did not start"
            time.sleep(0.05)
        started.append(
            _start([_tool("slurmctld"), "-D", "-i", "-f", str(conf)], base / "log" / "ctld.out", env)
        )
        started.append(_start([_tool("slurmd"), "-D", "-f", str(conf)], base / "log" / "slurmd.out", env))
        cluster = SlurmCluster(base, env, cgroups)
        _wait_idle(cluster, started[1:])
        try:
            yield cluster
        finally:
            cluster.run("scancel", "--partition=test", timeout_s=30)
    finally:
        for proc in reversed(started):
            _stop(proc)
