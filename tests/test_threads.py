"""`perseusd.threads`: a daemon thread's name reaches the operating system (`top -H`, /proc/PID/task/*/comm),
cut to the kernel's 15 bytes; the daemon's threads are all made so."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

from perseusd.threads import OS_NAME_BYTES, NamedThread

REPO_ROOT = Path(__file__).resolve().parents[1]


def _os_name_of(name: str) -> str:
    seen: list[str] = []

    def read() -> None:
        seen.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip())

    thread = NamedThread(target=read, name=name, daemon=True)
    thread.start()
    thread.join(timeout=30)
    return seen[0]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
def test_the_os_knows_a_named_thread_by_its_name_cut_to_15_bytes() -> None:
    assert _os_name_of("gpu-3") == "gpu-3"
    assert _os_name_of("perseusd-metrics-accept") == "perseusd-metrics-accept"[:OS_NAME_BYTES]
    plain: list[str] = []
    thread = threading.Thread(
        target=lambda: plain.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text())
    )
    thread.start()
    thread.join(timeout=30)
    assert plain[0].strip() != "gpu-3"  # a plain thread keeps the process's name


def test_every_daemon_thread_is_a_named_thread() -> None:
    plain = [
        f"{path.relative_to(REPO_ROOT)}:{number}"
        for path in sorted((REPO_ROOT / "perseusd").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if re.search(r"\bthreading\.Thread\(", line)
    ]
    assert plain == []
