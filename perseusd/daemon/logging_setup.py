"""The daemon's log handler: straight to the journal under systemd (where systemd-python is installed, see
`sdnotify.journal_handler`), else stderr. Only the entry point (`main.main`) installs it; every module logs
through `logging.getLogger(__name__)`.
"""

from __future__ import annotations

import logging
import sys

from perseusd.daemon import sdnotify


def configure_logging(level: str) -> None:
    handler = sdnotify.journal_handler() or logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
