"""Wheels made without a package index, for tests that install into a fresh virtual environment offline: the
client library built from this checkout, and an installed distribution (pyzmq) packed back into the wheel it
was installed from (the files its RECORD lists, byte for byte)."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CLIENT_LIB = REPO_ROOT / "client_lib"
INSTALLER_FILES = {"INSTALLER", "REQUESTED", "RECORD", "direct_url.json"}
"""dist-info files an installer writes (not part of the wheel; RECORD is written anew)."""


def offline_pip_env() -> dict[str, str]:
    """The environment for a pip that reads no configuration (no index, no find-links, no constraints) and
    sees no PYTHONPATH (a checkout on it would pass for an installed distribution)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PIP_", "PYTHON"))}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def build_client_wheel(out_dir: Path) -> Path:
    """The `perseusd-client` wheel of this checkout, built by this environment's setuptools (no index, no
    build isolation) from a copy of client_lib/, so that the checkout gets no build outputs."""
    source = out_dir / "client-src"
    shutil.copytree(CLIENT_LIB, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    offline = ("--no-deps", "--no-index", "--no-build-isolation")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", *offline, "--wheel-dir", str(out_dir), str(source)],
        check=True,
        env=offline_pip_env(),
        timeout=120,
        capture_output=True,
    )
    shutil.rmtree(source)
    (wheel,) = out_dir.glob("perseusd_client-*.whl")
    return wheel


def repack_installed(name: str, out_dir: Path) -> Path:
    """Distribution `name` as installed here, packed back into a wheel: the files its RECORD lists inside
    site-packages (no compiled caches, no scripts), a new RECORD, the tag its WHEEL file names first."""
    dist = importlib.metadata.distribution(name)
    if dist.files is None:
        raise RuntimeError(f"{name} has no RECORD: installed from a wheel?")
    wheel_text = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in wheel_text.splitlines() if line.startswith("Tag:")]
    if not tags:
        raise RuntimeError(f"{name}'s WHEEL file names no tag")
    files = [
        path
        for path in dist.files
        if not str(path).startswith("..")
        and "__pycache__" not in path.parts
        and not (path.parent.name.endswith(".dist-info") and path.name in INSTALLER_FILES)
    ]
    dist_info = next(path.parent for path in files if path.name == "METADATA")
    project = dist.metadata["Name"].replace("-", "_")
    wheel = out_dir / f"{project}-{dist.version}-{tags[0]}.whl"
    record = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            data = Path(str(dist.locate_file(path))).read_bytes()
            archive.writestr(str(path), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{path},sha256={digest},{len(data)}")
        record.append(f"{dist_info}/RECORD,,")
        archive.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return wheel
