"""Threads the operating system knows by name too (`top -H`, `ps -L`, /proc/PID/task/*/comm): Python before
3.14 names a thread for Python only, so every daemon thread showed as its interpreter's name.

Linux only (prctl PR_SET_NAME, at most 15 bytes); elsewhere, or if libc refuses, the thread runs unnamed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Callable
from functools import cache

_PR_SET_NAME = 15
OS_NAME_BYTES = 15
"""The kernel keeps a thread's name in 16 bytes, its terminating NUL included."""


class NamedThread(threading.Thread):
    """A `threading.Thread` that gives its Python name (cut to 15 bytes) to the OS thread it runs on."""

    def run(self) -> None:
        set_os_thread_name(self.name)
        super().run()


def set_os_thread_name(name: str) -> bool:
    """Name the calling OS thread `name` (its first 15 bytes); False where that is not possible."""
    prctl = _prctl()
    if prctl is None:
        return False
    raw = name.encode(errors="replace")[:OS_NAME_BYTES]
    return bool(prctl(_PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0) == 0)


@cache
def _prctl() -> Callable[..., int] | None:
    path = ctypes.util.find_library("c")
    if path is None:
        return None
    try:
        function: Callable[..., int] = ctypes.CDLL(path, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return function
