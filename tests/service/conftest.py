"""Fixtures of the service tests: a cached Debian rootfs and a machine booted on it with a real systemd.

Tests marked `systemd` need root, systemd-nspawn (Debian package systemd-container), debootstrap and nsenter;
without them they are skipped with the reason. The rootfs is built once (about a minute, needs the Debian
mirror) and cached under .cache/; each test boots its own machine (well under a second with an overlay).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from nspawn_machine import Machine, booted_machine
from rootfs import REPO_ROOT, build_tarball, unpack

from tests.support.requirements import skip_unless_met

SOURCE_INSIDE = "/opt/perseus-src"
REQUIRED_TOOLS = {
    "systemd-nspawn": "systemd-container",
    "debootstrap": "debootstrap",
    "nsenter": "util-linux",
}


def _missing_requirement() -> str | None:
    if os.geteuid() != 0:
        return "needs root (boots a container with systemd-nspawn)"
    for tool, package in REQUIRED_TOOLS.items():
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian package {package}; scripts/setup.sh --dev installs it)"
    return None


@pytest.fixture(scope="session")
def nspawn_rootfs() -> Iterator[Path]:
    """An unpacked copy of the cached rootfs, shared by every machine (they boot it with an overlay)."""
    skip_unless_met(_missing_requirement())
    tarball = build_tarball()
    workdir = Path(tempfile.mkdtemp(prefix="perseus-rootfs-", dir="/var/tmp"))
    try:
        yield unpack(tarball, workdir / "rootfs")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def machine(nspawn_rootfs: Path, tmp_path: Path) -> Iterator[Machine]:
    """A freshly booted container with the project source read-only at /opt/perseus-src."""
    with booted_machine(nspawn_rootfs, tmp_path, {REPO_ROOT: SOURCE_INSIDE}) as booted:
        yield booted
