"""`perseusctl` run as a user runs it: a subprocess against a daemon's runtime directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CTL_TIMEOUT_S = 30.0


def run_ctl(
    runtime_dir: Path, *args: str, timeout_s: float = CTL_TIMEOUT_S, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """`perseusctl --runtime-dir RUNTIME_DIR ARGS...` in a fresh interpreter; output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "perseusd.ctl.main", "--runtime-dir", str(runtime_dir), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=check,
    )
