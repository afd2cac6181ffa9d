"""Job series in the metrics name no job and no owner unless `metrics_job_names` is on: the metrics are
readable by every local user (the HTTP port, the 0644 textfile), the control socket shows a job only to its
owner and admins."""

from __future__ import annotations

from pathlib import Path

from perseus_client.protocol import Register
from prometheus_client import generate_latest

from perseusd.metrics.collector import PerseusCollector
from perseusd.metrics.exposure import metrics_registry
from tests.support.callers import ME
from tests.support.daemon_core import claim, sim_core


def test_job_names_and_uids_are_hidden_unless_enabled(tmp_path: Path) -> None:
    with sim_core(tmp_path, gpus=1) as core:
        gpu = core.registry.uuids[0]
        claim(core, ME, (gpu,), "secret-project")
        core.handle(ME, Register(gpu, "secret-project", 0, 0, 1, 4, "1f1b", 1))  # type: ignore[arg-type]
        hidden = PerseusCollector(core)
        text = generate_latest(metrics_registry(hidden)).decode()
        pseudonym = hidden.pseudonym("secret-project", ME.uid)
        assert "secret-project" not in text
        assert f'perseus_job_state{{job_name="{pseudonym}",state="profiling",uid="-1"}} 1.0' in text
        assert pseudonym == hidden.pseudonym("secret-project", ME.uid)  # stable: one series per job
        assert pseudonym != PerseusCollector(core).pseudonym("secret-project", ME.uid)  # not guessable
        named = generate_latest(metrics_registry(PerseusCollector(core, job_names=True))).decode()
        assert f'perseus_job_state{{job_name="secret-project",state="profiling",uid="{ME.uid}"}} 1.0' in named
