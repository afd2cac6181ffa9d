"""The Perseus daemon: core (leases, GPU registry, restore), state file, IPC and the composition root."""

from __future__ import annotations
