"""A cap priority belongs to a job's identity (its owner and name), never to the name alone: another user's
job of the same name never gets an admin's tier, and a name no job has is refused, not silently kept."""

from __future__ import annotations

from pathlib import Path

import pytest
from perseus_client.protocol import AdminSetJobPriority, JobPriorityOk, ProtocolError, Register

from perseusd.cap.node_cap import priority_key
from tests.support.callers import ME
from tests.support.daemon_core import claim, sim_core


def test_a_priority_is_bound_to_the_jobs_owner_and_unknown_names_are_refused(tmp_path: Path) -> None:
    with sim_core(tmp_path, gpus=1) as core:
        assert core.power_cap is not None
        with pytest.raises(ProtocolError, match="no job prod on this node"):
            core.handle(ME, AdminSetJobPriority(job="prod", priority=2), admin_socket=True)
        assert core.power_cap.priorities == {}
        gpu = core.registry.uuids[0]
        claim(core, ME, (gpu,), "prod")
        core.handle(ME, Register(gpu, "prod", 0, 0, 1, 4, "1f1b", 1))  # type: ignore[arg-type]
        assert isinstance(
            core.handle(ME, AdminSetJobPriority(job="prod", priority=2), admin_socket=True), JobPriorityOk
        )
        assert core.power_cap.priorities == {priority_key("prod", ME.uid): 2}
        assert priority_key("prod", ME.uid + 1) not in core.power_cap.priorities  # another user's "prod"
