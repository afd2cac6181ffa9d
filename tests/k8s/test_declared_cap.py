"""A node budget declared from Kubernetes: a ConfigMap volume (laid out as the kubelet lays it out, and
swapped as it swaps it) followed by a real perseusd on simulated GPUs."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from perseus_client.protocol import AdminCapStatus, CapStatusReply

from perseusd.ctl.daemon_link import ask
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes

pytestmark = pytest.mark.timeout(120)

NODE = "gpu-node-7"
WAIT_S = 30.0


class ConfigMapVolume:
    """A directory the way the kubelet writes a ConfigMap volume: `..<timestamp>/` holds the keys, `..data`
    points at it, each key is a symlink through `..data`; an update writes a new timestamped directory and
    renames a new `..data` link over the old one (atomic for readers)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir()
        self._version = 0

    def publish(self, data: Mapping[str, str]) -> None:
        self._version += 1
        version = self.path / f"..2026_{self._version:04d}"
        version.mkdir()
        for key, value in data.items():
            (version / key).write_text(value)
        tmp = self.path / "..data_tmp"
        tmp.symlink_to(version.name)
        os.replace(tmp, self.path / "..data")
        for entry in self.path.iterdir():
            if not entry.name.startswith("..") and entry.name not in data:
                entry.unlink()
        for key in data:
            link = self.path / key
            if not link.is_symlink():
                link.symlink_to(f"..data/{key}")


@pytest.fixture
def declared() -> Iterator[tuple[DaemonProcess, ConfigMapVolume]]:
    with daemon_processes() as make:
        dirs = DaemonDirs.create()
        volume = ConfigMapVolume(dirs.base / "caps")
        volume.publish({"default": "900"})
        env = {
            "NODE_NAME": NODE,
            "PERSEUSD_POWER_CAP_DIR": str(volume.path),
            "PERSEUSD_POWER_CAP_DIR_INTERVAL_S": "0.2",
        }
        yield make(dirs, gpus=4, env=env).start(), volume


def _budget(daemon: DaemonProcess) -> tuple[float | None, list[float | None]]:
    reply = ask(daemon.dirs.runtime_dir, AdminCapStatus(), CapStatusReply, admin=True)
    return reply.budget_w, [gpu.limit_w for gpu in reply.gpus]


def _wait_budget(daemon: DaemonProcess, budget_w: float | None) -> list[float | None]:
    deadline_s = time.monotonic() + WAIT_S
    while True:
        held_w, limits_w = _budget(daemon)
        if held_w == budget_w:
            return limits_w
        assert time.monotonic() < deadline_s, f"budget {held_w} W, expected {budget_w}:\n{daemon.log()}"
        time.sleep(0.1)


def test_the_node_follows_its_declared_budget(declared: tuple[DaemonProcess, ConfigMapVolume]) -> None:
    daemon, volume = declared
    limits_w = _wait_budget(daemon, 900.0)  # the default for every node
    assert sum(w for w in limits_w if w is not None) <= 900.0 + 1e-6
    volume.publish({"default": "900", NODE: "1200"})  # this node's own entry wins
    _wait_budget(daemon, 1200.0)
    volume.publish({"default": "900", NODE: "watts"})  # refused, logged, the budget in force stays
    time.sleep(1.0)
    assert _budget(daemon)[0] == 1200.0
    assert "not a budget in watts" in daemon.log()
    volume.publish({NODE: "0"})  # no budget declared for this node: the declared one is cleared
    limits_w = _wait_budget(daemon, None)
    assert all(w is None for w in limits_w)
