"""The Debian maintainer scripts, run for real against temporary directories standing in for the system's:
they honour policy-rc.d (service changes through deb-systemd-invoke where it exists), purge removes only
what perseusd writes, and a removal on a node with no state file asks no GPU anything."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEBIAN = REPO_ROOT / "packaging" / "debian"


def _script(name: str, tmp_path: Path) -> Path:
    """The script with /var/lib/perseusd, /opt/perseusd and /run/systemd/system under `tmp_path`."""
    text = (DEBIAN / name).read_text()
    for path in ("/var/lib/perseusd", "/opt/perseusd", "/etc/perseusd", "/run/systemd/system"):
        text = text.replace(path, f"{tmp_path}{path}")
    script = tmp_path / name
    script.write_text(text)
    script.chmod(0o755)
    return script


def _run(script: Path, *args: str, path: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path}
    return subprocess.run(
        [str(script), *args], capture_output=True, text=True, env=env, timeout=30, check=False
    )


def test_purge_removes_only_what_perseusd_writes(tmp_path: Path) -> None:
    state = tmp_path / "var/lib/perseusd"
    (state / "jobs").mkdir(parents=True)
    (state / "jobs" / "abc.json").write_text("{}")
    written = ("state.json", "power-cap.json", "pool-limits.json", "state.json.unreadable-1-2", ".x.9.tmp")
    for name in (*written, "jobs-ended", "jobs-ended.unreadable-3"):
        (state / name).write_text("{}")
    (state / "site-records.json").write_text("kept")  # not perseusd's
    assert _run(_script("postrm", tmp_path), "purge", path=os.environ["PATH"]).returncode == 0
    assert [p.name for p in state.iterdir()] == ["site-records.json"]
    (state / "site-records.json").unlink()
    assert _run(_script("postrm", tmp_path), "purge", path=os.environ["PATH"]).returncode == 0
    assert not state.exists()  # only perseusd's files: the directory goes too


def _fake_tools(tmp_path: Path, *names: str) -> str:
    """A PATH where each of `names` records its arguments in calls.log (and the system's tools after it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in names:
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\necho "{name} $*" >> {tmp_path}/calls.log\n')
        tool.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def test_service_changes_go_through_deb_systemd_invoke(tmp_path: Path) -> None:
    (tmp_path / "run/systemd/system").mkdir(parents=True)
    path = _fake_tools(tmp_path, "systemctl", "deb-systemd-helper", "deb-systemd-invoke", "systemd-sysusers",
                       "systemd-tmpfiles")  # fmt: skip
    assert _run(_script("postinst", tmp_path), "configure", path=path).returncode == 0
    assert _run(_script("prerm", tmp_path), "remove", path=path).returncode == 0
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert "deb-systemd-invoke restart perseusd.service" in calls
    assert "deb-systemd-invoke stop perseusd.service" in calls
    assert "deb-systemd-helper enable perseusd.service" in calls
    assert not any(
        call.startswith(("systemctl restart", "systemctl stop", "systemctl start")) for call in calls
    )


def test_removal_without_a_state_file_asks_no_gpu(tmp_path: Path) -> None:
    perseusd = tmp_path / "opt/perseusd/bin/perseusd"
    perseusd.parent.mkdir(parents=True)
    perseusd.write_text(f'#!/bin/sh\necho "perseusd $*" >> {tmp_path}/calls.log\n')
    perseusd.chmod(0o755)
    assert _run(_script("prerm", tmp_path), "remove", path=os.environ["PATH"]).returncode == 0
    assert not (
        tmp_path / "calls.log"
    ).exists()  # no state file: no reset, no NVML error on a driverless node
    (tmp_path / "var/lib/perseusd").mkdir(parents=True)
    (tmp_path / "var/lib/perseusd/state.json").write_text("{}")
    assert _run(_script("prerm", tmp_path), "remove", path=os.environ["PATH"]).returncode == 0
    assert (tmp_path / "calls.log").read_text() == "perseusd reset\n"
