"""The IPC layer talks to the core through its port only: no counter written, no lease book read."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from perseusd.daemon.core import DaemonCore

DAEMON_DIR = Path(__file__).resolve().parents[2] / "perseusd" / "daemon"
IPC_SOURCES = tuple(DAEMON_DIR / name for name in ("ipc.py", "request_server.py", "event_intake.py"))
"""The IPC layer's modules that hold the core: the server, its requests and its event intake."""

PORT = {
    "accepts_events_from",
    "count_received",
    "deliver_event",
    "count_dropped",
    "end_events",
    "carry_ready",
    "carry_waiting",
    "take_carries",
    "count_rejected",
    "count_auth_rejected",
    "connections_from",
    "advertise_event_socket",
    "session_count",
    "client_pidfds",
    "pidfd_readable",
    "handle",
}
"""What the IPC layer may use of the core (`tick` and `shutdown` belong to the service loop)."""


def core_uses(tree: ast.AST) -> list[tuple[int, str, bool]]:
    """(line, attribute, written) for every `core.X` / `self._core.X` in the tree."""
    uses = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        is_core = (isinstance(base, ast.Name) and base.id == "core") or (
            isinstance(base, ast.Attribute) and base.attr == "_core"
        )
        if is_core:
            uses.append((node.lineno, node.attr, isinstance(node.ctx, ast.Store | ast.Del)))
    return uses


@pytest.mark.parametrize("source", IPC_SOURCES, ids=lambda path: path.name)
def test_the_ipc_layer_uses_only_the_port(source: Path) -> None:
    tree = ast.parse(source.read_text())
    uses = core_uses(tree)
    assert uses, f"the check found no use of the core at all: it no longer reads {source.name} as written"
    outside = [f"{source.name}:{line}: core.{name}" for line, name, _ in uses if name not in PORT]
    assert not outside, f"the IPC layer reaches past the core's port: {outside}"
    written = [f"{source.name}:{line}: core.{name}" for line, name, store in uses if store]
    assert not written, f"the IPC layer writes the core's attributes: {written}"
    augmented = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.AugAssign) and "core" in ast.unparse(node.target)
    ]
    assert not augmented, f"the IPC layer counts into the core itself at lines {augmented} of {source.name}"


def test_the_port_exists_on_the_core() -> None:
    missing = sorted(name for name in PORT if not hasattr(DaemonCore, name))
    assert not missing, missing


def test_the_check_sees_a_reach_into_the_lease_book() -> None:
    source = "def f(self, core):\n    core.tracker.received += 1\n    self._core.leases.holds_lease(1)\n"
    assert sorted(name for _, name, _ in core_uses(ast.parse(source))) == ["leases", "tracker"]
