"""Why a registered job waits: said in its `error` (`perseusctl jobs` shows it as WAITING), cleared when it
moves on; a real error is never overwritten."""

from __future__ import annotations

from perseusd.jobs.job import Job

WAITING = "waiting for "


def set_waiting(job: Job, text: str) -> None:
    """Say why a registered job waits (`text` starts with `WAITING`; "" clears it), keeping a real error."""
    if not job.error or job.error.startswith(WAITING):
        job.error = text


def waiting_alone(job: Job) -> str:
    """Why a job without a complete pipeline here waits, on a node without a cluster plane."""
    have = ", ".join(f"pipeline {p}: {len(slots)} GPU(s)" for p, slots in job.pipelines().items())
    needed = job.shape.num_stages * job.shape.stage_gpus
    return (
        f"waiting for every stage of a pipeline ({have}; {needed} per pipeline); a pipeline whose stages run "
        "on several nodes needs the cluster plane (etcd_endpoints, docs/cluster.md)"
    )
