"""Tests that need something this machine may lack (root, podman, Slurm, systemd-nspawn) skip, saying what."""

from __future__ import annotations

import pytest


def skip_unless_met(missing: str | None) -> None:
    """Skip the test (or the fixture's tests) when a requirement is `missing`: the reason says which."""
    if missing:
        pytest.skip(missing)
