"""The Perseus daemon: configuration, the core, the requests that take a caller (jobs, energy), IPC and the
composition root."""

from __future__ import annotations
