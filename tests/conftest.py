"""Shared test set-up: the repository root on sys.path (for `tests.support` and `benchmarks.peers`) and
the location of the shared real data (`../shared/data` beside the repository)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """`../shared/data`: real profiles and published frontiers (CI has it beside the repository)."""
    if not SHARED_DATA.is_dir():
        pytest.fail(f"shared data not found at {SHARED_DATA}: check out ../shared beside the repository")
    return SHARED_DATA
