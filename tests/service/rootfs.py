"""A minimal Debian 12 root filesystem for booting a real systemd in a container, built once and cached.

`debootstrap --variant=minbase` takes about a minute and a half; the result is cached as a tarball under
`<repo>/.cache/systemd-rootfs/` (git-ignored), named for its suite and package list, so a changed list
builds a new one. Unpacking the tarball takes a couple of seconds.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO_ROOT / ".cache" / "systemd-rootfs"
SUITE = "bookworm"
MIRROR_ENV = "PERSEUS_TEST_DEBIAN_MIRROR"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# What perseusd needs at run time (numpy, pyzmq, systemd-python; the sim backend reads CSV profiles with
# numpy; scipy is only for the planner) plus a booting systemd.
PACKAGES: tuple[str, ...] = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "python3",
    "python3-numpy",
    "python3-zmq",
    # debootstrap does not resolve virtual packages: python3-zmq needs python3-cffi-backend-api-*.
    "python3-cffi-backend",
    "python3-systemd",
    # /bin/kill for the unit's ExecReload= (minbase has none).
    "procps",
)
DEBOOTSTRAP_TIMEOUT_S = 900
TAR_TIMEOUT_S = 300
# Bulky files nothing in the tests reads.
PRUNE_DIRS = (
    "usr/share/doc",
    "usr/share/man",
    "usr/share/locale",
    "usr/share/info",
    "var/cache/apt/archives",
)


class RootfsError(RuntimeError):
    """The root filesystem could not be built or unpacked."""


def tarball_path() -> Path:
    """Where the cached tarball for the current suite and package list lives."""
    digest = hashlib.sha256(" ".join((SUITE, *PACKAGES)).encode()).hexdigest()[:12]
    return CACHE_DIR / f"debian-{SUITE}-{digest}.tar"


@contextmanager
def _build_lock() -> Iterator[None]:
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with (CACHE_DIR / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(argv: list[str], timeout_s: float) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout)[-3000:]
        raise RootfsError(f"{argv[0]} failed with exit code {proc.returncode}:\n{tail}")


def _debootstrap(target: Path) -> None:
    mirror = os.environ.get(MIRROR_ENV, DEFAULT_MIRROR)
    argv = ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(target), mirror]
    try:
        _run(argv, DEBOOTSTRAP_TIMEOUT_S)
    except RootfsError as exc:
        log = target / "debootstrap" / "debootstrap.log"
        kept = CACHE_DIR / "debootstrap-failed.log"
        if log.exists():
            shutil.copyfile(log, kept)
        raise RootfsError(
            f"{exc}\n(log kept in {kept}; is the Debian mirror {mirror} reachable?"
            f" set {MIRROR_ENV} to use another)"
        ) from exc
    for rel in PRUNE_DIRS:
        shutil.rmtree(target / rel, ignore_errors=True)
    # A fresh machine id at every boot, as on a newly installed image.
    (target / "etc" / "machine-id").write_text("")


def build_tarball() -> Path:
    """Return the cached rootfs tarball, building it with debootstrap first if it is missing."""
    tarball = tarball_path()
    with _build_lock():
        if tarball.exists():
            return tarball
        with tempfile.TemporaryDirectory(dir=CACHE_DIR, prefix="build-") as tmp:
            target = Path(tmp) / "rootfs"
            _debootstrap(target)
            partial = Path(tmp) / "rootfs.tar"
            _run(
                ["tar", "--numeric-owner", "--xattrs", "-C", str(target), "-cf", str(partial), "."],
                TAR_TIMEOUT_S,
            )
            partial.rename(tarball)
    return tarball


def unpack(tarball: Path, dest: Path) -> Path:
    """Unpack `tarball` into `dest` (created) and return it."""
    dest.mkdir(parents=True)
    _run(["tar", "--numeric-owner", "--xattrs", "-C", str(dest), "-xf", str(tarball)], TAR_TIMEOUT_S)
    return dest


if __name__ == "__main__":
    print(build_tarball())
