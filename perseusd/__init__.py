"""Perseus: the per-node GPU energy daemon and its planner."""

from __future__ import annotations

__version__ = "0.1.0"
