"""The daemon runs its numeric work on one BLAS thread unless the operator says otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from perseusd.daemon import BLAS_THREAD_VARIABLES

# What a fresh daemon process sees: its package imported first (as `python -m perseusd.daemon.main` does),
# then numpy and scipy, whose BLAS read the thread count once, when loaded.
_PROBE = """
import json
import perseusd.daemon.main
import numpy, scipy.linalg, threadpoolctl
print(json.dumps([info["num_threads"] for info in threadpoolctl.threadpool_info()]))
"""


def _blas_threads(env: dict[str, str]) -> list[int]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True, timeout=60
    )
    threads: list[int] = json.loads(out.stdout)
    return threads


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in BLAS_THREAD_VARIABLES}


def test_daemon_process_uses_one_blas_thread() -> None:
    threads = _blas_threads(_clean_env())
    assert threads, "no BLAS library found loaded"
    assert threads == [1] * len(threads)


def test_operator_setting_is_kept() -> None:
    threads = _blas_threads(_clean_env() | {"OPENBLAS_NUM_THREADS": "2"})
    expected = min(2, os.cpu_count() or 1)  # OpenBLAS takes no more threads than the machine has cores
    assert threads == [expected] * len(threads)
