"""A node budget declared in files: a Kubernetes ConfigMap mounted as a volume (docs/kubernetes.md).

The directory holds one file per node, named for the node, whose text is the node's budget in watts, and
optionally `default` for nodes without a file of their own; an empty file, "0" or "none" means no budget.
The kubelet swaps a ConfigMap volume's files atomically when the ConfigMap changes; the daemon re-reads the
directory every `interval_s` and sets (or clears) the node budget the way `perseusctl cap` does, at the
least slowdown (docs/power-caps.md). A budget set by hand (`perseusctl cap`) stays until the declaration
changes; a declaration that cannot be parsed is logged and ignored (the budget in force stays).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from perseusd.cap.node_cap import NodeCap

logger = logging.getLogger(__name__)

DEFAULT_NAME = "default"
MAX_BUDGET_W = 1e7
NO_BUDGET = ("", "0", "none")


@dataclass(eq=False)
class DeclaredCap:
    """Follows `<directory>/<node>` (else `<directory>/default`) into the node cap."""

    directory: Path
    node: str
    cap: NodeCap
    interval_s: float = 5.0
    clock_s: Callable[[], float] = time.monotonic
    _next_s: float = field(default=0.0, init=False)
    _last: str | None = field(default=None, init=False)
    """The declaration last applied (its text and where it came from)."""

    @property
    def who(self) -> str:
        return f"declared in {self.directory}"

    def poll(self) -> None:
        """Apply the declaration when it changed (at most every `interval_s`)."""
        now_s = self.clock_s()
        if now_s < self._next_s:
            return
        self._next_s = now_s + self.interval_s
        source, text = self._read()
        key = f"{source}={text}"
        if key == self._last:
            return
        budget_w = self._parse(source, text)
        if budget_w is False:
            self._last = key  # logged once; the budget in force stays
            return
        self._last = key
        if budget_w is None and (self.cap.budget_w is None or self.cap.set_by != self.who):
            return  # nothing declared, and nothing of ours to clear
        logger.warning(
            "power cap: node budget %s (%s for node %s)",
            "cleared" if budget_w is None else f"{budget_w:.1f} W",
            source or "no file",
            self.node,
        )
        self.cap.set_budget_w(budget_w, self.who)

    def _read(self) -> tuple[str, str]:
        for name in (self.node, DEFAULT_NAME):
            path = self.directory / name
            try:
                return name, path.read_text().strip()
            except FileNotFoundError:
                continue
            except OSError as exc:
                return name, f"<unreadable: {exc.strerror}>"
        return "", ""

    def _parse(self, source: str, text: str) -> float | bool | None:
        """The budget (W), None for none, False for a declaration that cannot be used."""
        if text.lower() in NO_BUDGET:
            return None
        try:
            budget_w = float(text)
        except ValueError:
            budget_w = math.nan
        if not (math.isfinite(budget_w) and 0 < budget_w <= MAX_BUDGET_W):
            logger.error(
                "power cap: %s/%s holds %r, not a budget in watts (0 < W <= %g); ignored",
                self.directory,
                source,
                text[:80],
                MAX_BUDGET_W,
            )
            return False
        return budget_w
