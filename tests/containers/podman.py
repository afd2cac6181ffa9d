"""Debian's podman running training processes against the host's perseusd, from a local image.

No registry: the image is imported from the Debian root filesystem the service tests build and cache
(tests/service/rootfs.py), into a podman storage of the test's own (vfs, removed afterwards). Containers run
with a user namespace (root inside is host uid `PODMAN_UID_BASE`; group 65534 inside is the host's nogroup,
the daemon's socket group here), their own pid, mount, network (none) and cgroup namespaces. The host
interpreter, its virtual environment and this repository are bind-mounted read-only at their own paths, the
runtime directory at /run/perseusd, and each GPU given as its device node at /dev/nvidia<N>; where the host
runs the cgroup v1 devices controller the test allows those nodes in the container's cgroup before it starts,
as NVIDIA's container hook does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.service.rootfs import REPO_ROOT, build_tarball

PODMAN_UID_BASE = 200_000
SOCKET_GID = 65_534
IMAGE = "localhost/perseus-test-rootfs:latest"
COMMAND_TIMEOUT_S = 300
DEVICES_V1 = Path("/sys/fs/cgroup/devices")


def missing_requirement() -> str | None:
    if os.geteuid() != 0:
        return "needs root (podman with a user namespace mapping)"
    if shutil.which("podman") is None:
        return "podman is not installed (Debian package podman; scripts/setup.sh --dev installs it)"
    if shutil.which("debootstrap") is None:
        return "debootstrap is not installed (builds the image's root filesystem)"
    return None


@dataclass
class Podman:
    """One private podman storage with the test image imported."""

    base: Path

    def argv(self, *args: str) -> list[str]:
        runtime = ["--runtime", "runc"] if shutil.which("runc") else []
        return [
            "podman",
            "--root", str(self.base / "root"),
            "--runroot", str(self.base / "runroot"),
            "--tmpdir", str(self.base / "tmp"),
            "--storage-driver", "vfs",
            "--cgroup-manager", "cgroupfs",
            "--events-backend", "file",
            *runtime,
            *args,
        ]  # fmt: skip

    def run(self, *args: str, timeout_s: float = COMMAND_TIMEOUT_S) -> str:
        out = subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout_s, check=False)
        if out.returncode != 0:
            raise AssertionError(
                f"podman {' '.join(args[:2])} failed ({out.returncode}): {out.stderr[-3000:]}"
            )
        return out.stdout

    def create(
        self,
        command: Sequence[str],
        runtime_dir: Path,
        device_nodes: Mapping[int, Path],
        env: Mapping[str, str] | None = None,
    ) -> str:
        """Create (not start) a container running `command`; returns its id."""
        mounts: list[str] = []
        prefix = str(Path(sys.base_prefix).resolve())
        for path in sorted({prefix, str(REPO_ROOT)}):
            mounts += ["-v", f"{path}:{path}:ro"]
        mounts += ["-v", f"{runtime_dir}:/run/perseusd"]
        for minor, node in sorted(device_nodes.items()):
            mounts += ["-v", f"{node}:/dev/nvidia{minor}"]
        environment: list[str] = []
        for key, value in {"PATH": "/usr/bin:/bin", **(env or {})}.items():
            environment += ["-e", f"{key}={value}"]
        return self.run(
            "create",
            "--interactive",  # stdin stays open: the client holds its lease until told to go
            "--network", "none",
            "--cgroupns", "private",
            "--uidmap", f"0:{PODMAN_UID_BASE}:65534",
            "--gidmap", f"0:{PODMAN_UID_BASE}:65534",
            "--gidmap", f"{SOCKET_GID}:{SOCKET_GID}:1",
            "--user", f"0:{SOCKET_GID}",
            "--ulimit", "nofile=4096:4096",
            "--ulimit", "nproc=4096:4096",
            "--workdir", str(REPO_ROOT),
            *environment,
            *mounts,
            IMAGE,
            *command,
        ).strip()  # fmt: skip

    def pid(self, container: str) -> int:
        return int(self.run("inspect", "--format", "{{.State.Pid}}", container).strip())

    def allow_devices(self, container: str, minors: Sequence[int]) -> None:
        """Allow the GPU nodes in the container's cgroup v1 devices controller (nothing on cgroup v2)."""
        if not DEVICES_V1.is_dir():
            return
        for line in Path(f"/proc/{self.pid(container)}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "devices" in controllers.split(","):
                allow = DEVICES_V1 / path.lstrip("/") / "devices.allow"
                for minor in minors:
                    allow.write_text(f"c 195:{minor} rw\n")

    def start(
        self, command: Sequence[str], runtime_dir: Path, device_nodes: Mapping[int, Path], **kw: object
    ) -> tuple[str, subprocess.Popen[str]]:
        """Create, prepare (devices) and start a container attached: (its id, the attached podman)."""
        env = kw.get("env")
        container = self.create(command, runtime_dir, device_nodes, env)  # type: ignore[arg-type]
        self.run("init", container)
        self.allow_devices(container, list(device_nodes))
        attached = subprocess.Popen(
            self.argv("start", "--attach", "--interactive", container),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        return container, attached

    def remove(self, container: str) -> None:
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            self.run("rm", "--force", "--time", "0", container, timeout_s=60)


@contextlib.contextmanager
def podman_storage() -> Iterator[Podman]:
    """A private podman storage with the test image imported; removed with every container at the end."""
    tarball = build_tarball()
    base = Path(tempfile.mkdtemp(prefix="perseus-podman-", dir="/var/tmp"))
    podman = Podman(base)
    try:
        podman.run("import", str(tarball), IMAGE)
        yield podman
    finally:
        with contextlib.suppress(Exception):
            ids = podman.run("ps", "--all", "--quiet", timeout_s=60).split()
            for container in ids:
                podman.remove(container)
        shutil.rmtree(base, ignore_errors=True)


def device_nodes(directory: Path, minors: Sequence[int]) -> dict[int, Path]:
    """Char device nodes 195:N (no driver behind them: they are only named, never opened)."""
    directory.mkdir(parents=True, exist_ok=True)
    nodes = {}
    for minor in minors:
        node = directory / f"nvidia{minor}"
        if not node.exists():
            os.mknod(node, 0o666 | 0o020000, os.makedev(195, minor))
        nodes[minor] = node
    return nodes
