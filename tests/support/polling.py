"""Waiting in a test for what another thread or process does: poll a condition, fail after a bound."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.05) -> float:
    """Poll `predicate` until it holds; returns the seconds it took. Fails the test after `timeout_s`."""
    start_s = time.monotonic()
    while not predicate():
        if time.monotonic() - start_s > timeout_s:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)
    return time.monotonic() - start_s
