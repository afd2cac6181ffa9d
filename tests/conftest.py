"""Shared test set-up: the repository root on sys.path (for `tests.support` and `benchmarks.peers`), the
measured reference data (`reference-data/`, see `tests/support/reference_data.py`), and the session-end
check that the suite left no process behind (see `tests/support/leftovers.py`)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.support import leftovers  # noqa: E402  (needs the repository root on sys.path)
from tests.support.reference_data import REFERENCE_DATA  # noqa: E402

_SESSION: dict[str, tuple[str, int]] = {}


@pytest.fixture(scope="session")
def reference_data() -> Path:
    """`reference-data/`: measured profiles, published frontiers, carbon traces, an H100's measurements."""
    return REFERENCE_DATA


def pytest_sessionstart(session: pytest.Session) -> None:  # noqa: ARG001 (hook signature)
    _SESSION["mark"] = leftovers.start_session()
    # A suite started in the background (`&` without job control) inherits SIGINT ignored and would pass
    # it on to every process it starts, which then never sees Ctrl-C: the tests that send SIGINT need the
    # disposition a terminal gives. A handler (unlike SIG_IGN) is reset to the default in a child.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:  # noqa: ARG001
    """Fail the run if any process the suite started is still alive (after a grace period); kill those."""
    if "mark" not in _SESSION or session.config.option.collectonly:
        return
    mark, since_ticks = _SESSION["mark"]
    leftovers.stop_own_helpers()
    left = leftovers.wait_for_none_left(mark, since_ticks)
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"  pid {p.pid} (parent {p.ppid}): {p.cmdline[:200]}" for p in left]
    message = "\n".join([f"the test session left {len(left)} process(es) behind (now killed):", *lines])
    if reporter is not None:
        reporter.write_line(message, red=True, bold=True)
    else:
        print(message, file=sys.stderr)
    leftovers.kill_all(left)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
